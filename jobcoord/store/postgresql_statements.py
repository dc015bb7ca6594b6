"""The statements only PostgreSQL runs: each hot-path transition folded into one statement,
the row-locking variants of the shared selects, id allocation, the migration lock, sequence
continuation and the "jobs became claimable" notification."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ARRAY, BigInteger, Text, any_, cast, false, func, insert, select, true
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..schema import job_events, jobs, leases, metadata
from . import statements as s

# --- one statement per transition ---------------------------------------------------------
#
# Each statement is a round trip to the server, and a claim and a completion were six each:
# candidate, take, lease and event become one data-modifying WITH statement, and so do finish,
# drop lease and event. They are the same statements, guards and rows as the separate ones
# SQLite runs (TAKE_JOB + INSERT_LEASE + INSERT_EVENT; FINISH + DROP_LEASE + INSERT_EVENT), in
# the same transaction. A data-modifying CTE runs exactly once whether or not anything reads
# it, and the lease and the event are written only for the row the compare-and-set actually
# changed. Both are built from the very statements SQLite runs (TAKE_JOB_UPDATE, FINISH_UPDATE,
# DROP_LEASE_DELETE) as Core CTEs.
#
# The claim: the candidate probes read the first :heads rows of each (role, kind) slice WITHOUT
# locks; `pick` then locks only the one row it returns, the first candidate in claim order that
# no concurrent claimer holds (FOR UPDATE SKIP LOCKED; a row another claim took meanwhile fails
# the status recheck). Locking in every probe would hold the head of every slice until commit,
# and a concurrent claimer could be told nothing waits while jobs it could take were untaken.
# Then the take, the lease and the `claimed` event. The event's detail is v.dumps({"attempt":
# n, "expires_at": iso}) spelled in SQL: sorted keys, no spaces; :expires_json is the JSON
# string of the expiry. Always one row: how many candidates the probes found, the picked id
# (NULL when every candidate was held by other claimers), then the taken job (NULLs when the
# compare-and-set took nothing). The data-modifying CTEs nothing selects from are added with
# add_cte: PostgreSQL runs each exactly once whether or not anything reads it.

#: Heads read per slice by a PostgreSQL claim; the next size is tried only when every
#: candidate was held by concurrent claimers.
CLAIM_HEADS = (4, 64, 1024)
#: The same for a step of claim_many.
BATCH_CLAIM_HEADS = (64, 1024)


#: What these statements take: a claimable job that declares no needs. They run only when
#: the claim read that no waiting job declares needs; under READ COMMITTED one committed
#: since then is skipped (the next claim checks it against the worker's resources) instead
#: of being taken unchecked.
UNCHECKED = (*s.CLAIMABLE, jobs.c.needs_json.is_(None))


def _claim_statement(n_roles: int, n_kinds: int | None, tenant: bool) -> Any:
    J = jobs.c
    cand = s.union_of(s.probes(n_roles, n_kinds, due_only=True, locked=False,
                               limit=s.P("heads"), tenant=tenant)
                      ).cte("cand").prefix_with("MATERIALIZED")
    pick = (select(J.job_id).where(J.job_id.in_(select(cand.c.job_id)), *UNCHECKED)
            .order_by(*s.CLAIM_ORDER).limit(s.ONE).with_for_update(skip_locked=True)
            .cte("pick").prefix_with("MATERIALIZED"))
    taken = s.TAKE_JOB_UPDATE.where(J.job_id == select(pick.c.job_id).scalar_subquery()
                                    ).cte("taken")
    leased, claimed = _lease_and_event(taken)
    one = select(s.ONE).subquery("one")
    return (select(select(func.count()).select_from(cand).scalar_subquery(), pick.c.job_id,
                   *(taken.c[c.name] for c in s.TAKEN_COLUMNS))
            .select_from(one.outerjoin(pick, true()).outerjoin(taken, true()))
            .add_cte(leased, claimed))


def _lease_and_event(taken: Any) -> tuple[Any, Any]:
    """The lease and the `claimed` event of each job a claim statement takes (`taken`, a
    CTE of the updated job rows), as two CTEs of that same statement."""
    leased = s.replacing_stray_lease(pg_insert(leases).from_select(
        ["job_id", "worker_id", "epoch", "granted_at", "expires_at"],
        select(taken.c.job_id, s.P("worker"), taken.c.epoch, s.P("now"), s.P("expires"))
    )).cte("leased")
    detail = (s.const('{"attempt":') + cast(taken.c.attempts, Text)
              + s.const(',"expires_at":') + s.P("expires_json") + s.const("}"))
    claimed = insert(job_events).from_select(
        ["job_id", "at", "from_status", "to_status", "reason", "worker_id", "epoch", "detail"],
        select(taken.c.job_id, s.P("now"), s.const("waiting"), s.const("running"),
               s.const("claimed"), s.P("worker"), taken.c.epoch, detail)
    ).cte("claimed")
    return leased, claimed


def _id_array(cte: Any) -> Any:
    """The job ids of a CTE as one array value (an expression, so `= ANY` takes it as an
    array, not as a subquery)."""
    return cast(select(func.array_agg(cte.c.job_id)).scalar_subquery(), ARRAY(BigInteger))


def _take_many_statement(n_roles: int, n_kinds: int | None, tenant: bool) -> Any:
    """A batch claim in one short statement, as River and Oban take theirs: the probes read
    the first :heads rows of each slice without locks, `pick` locks the first :n of them in
    claim order that no concurrent claimer holds (FOR UPDATE SKIP LOCKED), the take moves
    them to running, and each taken job gets its lease and its `claimed` event. Returns the
    taken jobs (the single claim's columns and the creation time), in no order."""
    J = jobs.c
    cand = s.union_of(s.probes(n_roles, n_kinds, due_only=True, locked=False,
                               limit=s.P("heads"), tenant=tenant)
                      ).cte("cand").prefix_with("MATERIALIZED")
    # Rows are found by key from an array of the ids (`= ANY`): with `IN (SELECT ...)` the
    # planner may hash every job row of a small table instead of looking up a few dozen.
    pick = (select(J.job_id)
            .where(J.job_id == any_(_id_array(cand)), *UNCHECKED)
            .order_by(*s.CLAIM_ORDER).limit(s.P("n"))
            .with_for_update(skip_locked=True)
            .cte("pick").prefix_with("MATERIALIZED"))
    taken = s.TAKE_MANY_UPDATE.where(
J.job_id == any_(_id_array(pick))).cte("taken")
    leased, claimed = _lease_and_event(taken)
    return (select(*(taken.c[c.name] for c in (*s.TAKEN_COLUMNS, J.created_at)))
            .add_cte(leased, claimed))


#: Batch claim statements by shape (roles, kinds, tenant-bound), built once each.
_TAKE_MANY_STATEMENTS: dict[tuple[int, int | None, bool], s.SQL] = {}


def take_many_folded(roles: Sequence[str], kinds: Sequence[str] | None,
                     tenant: bool = False) -> s.SQL:
    """The batch claim's probes, pick, take, leases and events as one statement, built
    once per shape."""
    shape = (len(roles), None if kinds is None else len(kinds), tenant)
    stmt = _TAKE_MANY_STATEMENTS.get(shape)
    if stmt is None:
        stmt = _TAKE_MANY_STATEMENTS[shape] = s.SQL(_take_many_statement(*shape))
    return stmt


def _end_statement() -> Any:
    # A running job's end: FINISH's compare-and-set, the lease dropped, the event recorded
    # only for the row it changed. Returns how many rows the compare-and-set changed.
    finished = s.FINISH_UPDATE.returning(jobs.c.job_id).cte("finished")
    dropped = s.DROP_LEASE_DELETE.cte("dropped")
    ended = insert(job_events).from_select(
        ["job_id", "at", "from_status", "to_status", "reason", "worker_id", "epoch", "detail"],
        select(finished.c.job_id, s.P("now"), s.const("running"), s.P("to_status"),
               s.P("reason"), s.P("worker"), s.P("epoch"), s.P("detail"))
    ).cte("ended")
    return select(func.count()).select_from(finished).add_cte(dropped, ended)


_END_FOLDED = s.SQL(_end_statement())

#: Claim statements by shape (roles, kinds, tenant-bound), built once each.
_CLAIM_STATEMENTS: dict[tuple[int, int | None, bool], s.SQL] = {}


def _claim_folded(roles: Sequence[str], kinds: Sequence[str] | None, tenant: bool = False
                  ) -> s.SQL:
    """The claim's candidate probes, take, lease and event as one statement, built once per
    shape like the candidate query."""
    shape = (len(roles), None if kinds is None else len(kinds), tenant)
    stmt = _CLAIM_STATEMENTS.get(shape)
    if stmt is None:
        stmt = _CLAIM_STATEMENTS[shape] = s.SQL(_claim_statement(*shape))
    return stmt


def claim_sql(roles: Sequence[str], kinds: Sequence[str] | None, tenant: str | None = None
              ) -> tuple[str, dict[str, Any]]:
    """The one-statement claim for this shape, with `:name` parameters, and the role, kind
    and tenant parameters (for reading its plan)."""
    return (_claim_folded(roles, kinds, tenant is not None).named("postgresql"),
            s.role_kind_params(roles, kinds, tenant))


# PostgreSQL runs several reapers, completers and operators at once under READ COMMITTED:
# each takes the row locks of what it is about to change, and a reaper skips rows another
# transaction holds instead of failing its compare-and-set after waiting for them.
_EXPIRED_LEASES_LOCKED = s.SQL(
    s.EXPIRED_LEASES_SELECT.with_for_update(of=[leases, jobs], skip_locked=True))
_OVERDUE_WAITING_LOCKED = s.SQL(s.OVERDUE_WAITING_SELECT.with_for_update(skip_locked=True))
# The fence read takes the job row's lock itself: a concurrent reaper, completer or operator
# holding it is waited for, and the row read is the version it committed. The lease columns
# come from the statement's snapshot; the only change to a lease that leaves its job row alone
# is a renewal, which no lock of the job row would wait for anyway.
_OWNED_LOCKED = s.SQL(s.OWNED_SELECT.with_for_update(of=jobs))
_OWNED_MANY_LOCKED: dict[int, s.SQL] = {}


def owned_many_locked(n: int) -> s.SQL:
    """The fence read of :j0..:j<n-1> at once, each job row locked like `_OWNED_LOCKED`'s,
    in job id order (two batches over the same jobs lock them in one order: no deadlock)."""
    stmt = _OWNED_MANY_LOCKED.get(n)
    if stmt is None:
        stmt = _OWNED_MANY_LOCKED[n] = s.SQL(
            s.owned_many_select(n).with_for_update(of=jobs))
    return stmt


_LOCK_JOB = s.SQL(select(jobs.c.job_id).where(jobs.c.job_id == s.P("job_id")).with_for_update())
_NEXT_JOB_IDS = s.SQL(
    select(func.nextval(func.pg_get_serial_sequence(s.const("jobs"), s.const("job_id"))))
    .select_from(func.generate_series(s.ONE, s.P("n"))))
#: Every migration takes this transaction-scoped lock first: a concurrent one waits for it.
MIGRATION_LOCK_KEY = 7270201
_MIGRATION_LOCK = s.SQL(select(func.pg_advisory_xact_lock(s.const(MIGRATION_LOCK_KEY))))
#: Tables whose integer key comes from a sequence.
SEQUENCES = {"jobs": "job_id", "job_events": "event_id", "artifacts": "artifact_id",
             "tokens": "token_id", "schedules": "schedule_id", "schedule_fires": "fire_id"}


def _continue_sequence(table: str, column: str) -> s.SQL:
    """setval(seq, max+1, false): the next nextval() returns max+1 (1 on an empty table)."""
    key = metadata.tables[table].c[column]
    return s.SQL(select(func.setval(
        func.pg_get_serial_sequence(s.const(table), s.const(column)),
        func.coalesce(select(func.max(key)).scalar_subquery(), s.ZERO) + s.ONE, false())))


_CONTINUE = {table: _continue_sequence(table, column) for table, column in SEQUENCES.items()}


#: The channel of the "jobs became claimable" hint.
JOBS_CHANNEL = "jobcoord_jobs"
# NOTIFY inside the transaction: PostgreSQL delivers it only when (and if) the transaction
# commits, and folds repeats within one transaction into one.
_ANNOUNCE = s.SQL(select(func.pg_notify(s.const(JOBS_CHANNEL), s.const(""))))
