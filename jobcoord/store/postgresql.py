"""The PostgreSQL store: the engine and its bounded pool, the clock-skew check, SQLSTATE
mapping, snapshot reads, and the core's operations with row locks (FOR UPDATE, SKIP LOCKED)
and folded statements (one round trip per transition).
"""

from __future__ import annotations

import contextlib
import os
import select as io_select
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Text, cast, create_engine, event, false, func, insert, select, true
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

from .. import faults
from ..errors import DatabaseBusy, JobcoordError, SchemaMismatch, StorageUnavailable
from ..schema import job_events, jobs, leases, metadata
from ..validate import dumps
from . import limit_statements as ls
from . import statements as s
from .base import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_RETRIES,
    ChangeWaiter,
    ConnectionSource,
    Database,
    Taken,
    Target,
)
from .base import classify as classify

PG_STATES: dict[str, tuple[type[JobcoordError], str, str]] = {
    "40001": (DatabaseBusy, "database_locked", "serialization failure"),
    "40P01": (DatabaseBusy, "database_locked", "deadlock detected"),
    "55P03": (DatabaseBusy, "database_locked", "lock not available"),
    "53100": (StorageUnavailable, "database_full", "the database server's disk is full"),
    "25006": (StorageUnavailable, "database_readonly", "the database is read-only"),
    "42P01": (SchemaMismatch, "not_migrated", "a table is missing"),
}


# --- time on PostgreSQL --------------------------------------------------------------------
#
# One clock judges every lease on both databases: the coordinator's own clock (clock.py),
# read by the process making the call and bound into SQL as a parameter, never SQL's now().
# On PostgreSQL that process may run on any of several hosts, so the server's clock is used as
# the reference they must all agree with: every new connection measures this host's offset
# from clock_timestamp() and refuses to work when it exceeds MAX_CLOCK_SKEW_S (exit 6,
# clock_skew). Why not let the server's clock judge instead: the same statements and the same
# rules then run on both databases, freezegun controls time in the PostgreSQL half of the
# suite exactly as in the SQLite half, and safety never depended on clocks anyway (fencing
# epochs and compare-and-set updates do); a clock only decides *when* a lease counts as
# expired, and the check bounds how far two hosts can disagree about that.

#: Largest tolerated distance between this host's clock and the server's, in seconds; a
#: fraction of the shortest sensible lease. Override with JOBCOORD_MAX_CLOCK_SKEW.
MAX_CLOCK_SKEW_S = 1.0


def clock_skew_refusal(offset_s: float, uncertainty_s: float, limit_s: float
                       ) -> JobcoordError | None:
    """The refusal when the measured offset is certainly beyond the limit, else None."""
    if abs(offset_s) - uncertainty_s <= limit_s:
        return None
    side = "ahead of" if offset_s < 0 else "behind"
    return StorageUnavailable(
        "clock_skew",
        f"this host's clock is {abs(offset_s):.3f}s {side} the database server's (the limit "
        f"is {limit_s:g}s); leases would expire at different times on different hosts. Sync "
        "the clocks (NTP) or raise JOBCOORD_MAX_CLOCK_SKEW",
        offset_s=round(offset_s, 6),
    )


def _max_clock_skew() -> float:
    raw = os.environ.get("JOBCOORD_MAX_CLOCK_SKEW")
    if raw is None:
        return MAX_CLOCK_SKEW_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        from ..errors import InvalidInput

        raise InvalidInput("invalid_input", "JOBCOORD_MAX_CLOCK_SKEW must be seconds in 0..3600")
    return value


#: How often a connection's clock offset is measured again, seconds. A host whose clock steps
#: after connecting is noticed within this long on its next transaction.
SKEW_RECHECK_S = 30.0
#: PostgreSQL connections kept open per process, and how many more may be opened under load.
PG_POOL_SIZE = 5
PG_POOL_OVERFLOW = 15


def _host_time() -> float:
    """This host's wall clock for the skew check: the system clock itself, not
    datetime.now(), so a test's frozen clock does not trip it (tests replace this function
    to simulate a host whose clock stepped)."""
    return time.clock_gettime(time.CLOCK_REALTIME)


def _measure_clock(dbapi_conn: Any, info: dict[str, Any], limit: float) -> None:
    """Measure this host's clock against the server's on one connection (outside any
    transaction) and refuse to use it when they differ by more than `limit` seconds."""
    before = _host_time()
    with dbapi_conn.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        server = float(cur.fetchone()[0])
    after = _host_time()
    dbapi_conn.rollback()
    offset = server - (before + after) / 2
    info["clock_offset_s"] = offset
    info["clock_measured_at"] = time.monotonic()
    refusal = clock_skew_refusal(offset, (after - before) / 2, limit)
    if refusal is not None:
        # Measure again on the next use: a refused connection must never count as checked.
        info["clock_measured_at"] = float("-inf")
        raise refusal


def _pg_engine(url: str, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> Engine:
    limit = _max_clock_skew()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise StorageUnavailable(
            "driver_missing",
            "the PostgreSQL driver is not installed; install jobcoord with its postgresql "
            "extra: pip install 'jobcoord[postgresql]'",
        ) from None
    # A bounded pool: each transaction checks a connection out and gives it back, so any
    # number of threads share at most PG_POOL_SIZE + PG_POOL_OVERFLOW connections; recycled
    # hourly.
    engine = create_engine(url, poolclass=QueuePool, pool_size=PG_POOL_SIZE,
                           max_overflow=PG_POOL_OVERFLOW, pool_timeout=30, pool_pre_ping=False,
                           pool_recycle=3600, connect_args={
                               "application_name": "jobcoord",
                               # A statement waiting for another transaction's row lock gives
                               # up after the busy timeout (SQLSTATE 55P03, DatabaseBusy: the
                               # bounded retry, then exit 5), as a locked SQLite file does;
                               # 0 would wait for ever.
                               "options": f"-c lock_timeout={max(1, round(busy_timeout * 1000))}",
                           })

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        _measure_clock(dbapi_conn, record.info, limit)

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # The offset is measured again on a timer, so a clock that steps after the
        # connection opened is caught within SKEW_RECHECK_S, before this connection judges
        # (or reaps) another host's leases with it.
        measured = record.info.get("clock_measured_at", float("-inf"))
        if time.monotonic() - measured >= SKEW_RECHECK_S:
            _measure_clock(dbapi_conn, record.info, limit)

    return engine

class PooledConnections(ConnectionSource):
    """A connection per transaction straight from the engine's own bounded pool
    (PostgreSQL: a network round trip costs far more than the checkout)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def take(self) -> Connection:
        return self.engine.connect()

    def give(self, conn: Connection, healthy: bool) -> None:
        if not healthy:
            with contextlib.suppress(Exception):
                conn.invalidate()
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        pass


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


def _claim_statement(n_roles: int, n_kinds: int | None, tenant: bool) -> Any:
    J = jobs.c
    cand = s.union_of(s.probes(n_roles, n_kinds, due_only=True, locked=False,
                               limit=s.P("heads"), tenant=tenant)
                      ).cte("cand").prefix_with("MATERIALIZED")
    pick = (select(J.job_id).where(J.job_id.in_(select(cand.c.job_id)), *s.CLAIMABLE)
            .order_by(*s.CLAIM_ORDER).limit(s.ONE).with_for_update(skip_locked=True)
            .cte("pick").prefix_with("MATERIALIZED"))
    taken = s.TAKE_JOB_UPDATE.where(J.job_id == select(pick.c.job_id).scalar_subquery()
                                    ).cte("taken")
    leased = insert(leases).from_select(
        ["job_id", "worker_id", "epoch", "granted_at", "expires_at"],
        select(taken.c.job_id, s.P("worker"), taken.c.epoch, s.P("now"), s.P("expires"))
    ).cte("leased")
    detail = (s.const('{"attempt":') + cast(taken.c.attempts, Text)
              + s.const(',"expires_at":') + s.P("expires_json") + s.const("}"))
    claimed = insert(job_events).from_select(
        ["job_id", "at", "from_status", "to_status", "reason", "worker_id", "epoch", "detail"],
        select(taken.c.job_id, s.P("now"), s.const("waiting"), s.const("running"),
               s.const("claimed"), s.P("worker"), taken.c.epoch, detail)
    ).cte("claimed")
    one = select(s.ONE).subquery("one")
    return (select(select(func.count()).select_from(cand).scalar_subquery(), pick.c.job_id,
                   *(taken.c[c.name] for c in s.TAKEN_COLUMNS))
            .select_from(one.outerjoin(pick, true()).outerjoin(taken, true()))
            .add_cte(leased, claimed))


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
#: Longest an idle worker's LISTEN wait goes without looking at its interrupt.
LISTEN_SLICE_S = 0.1
#: After the listening connection failed, poll this long before trying LISTEN again.
LISTEN_RETRY_S = 30.0


class ListenWaiter(ChangeWaiter):
    """Wakes on NOTIFY jobcoord_jobs, sent by every transaction that makes a job
    claimable, on a connection of its own. Where LISTEN is unavailable (a pooler in
    transaction mode, a dropped connection) it falls back to the poll and tries again later."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Any = None
        self._retry_at = 0.0
        self.mode = "poll"
        self._connect()

    def _connect(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        self._retry_at = time.monotonic() + LISTEN_RETRY_S
        conninfo = make_url(self._url).set(drivername="postgresql").render_as_string(
            hide_password=False)
        try:
            conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5,
                                   application_name="jobcoord-listen")
            conn.execute(f"LISTEN {JOBS_CHANNEL}")
        except psycopg.Error:
            return
        self._conn, self.mode = conn, "listen"

    def wait(self, timeout: float, interrupt: threading.Event) -> bool:
        import psycopg

        if self._conn is None and time.monotonic() >= self._retry_at:
            self._connect()
        if self._conn is None:
            return interrupt.wait(timeout)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                # Blocks in select() on the connection's socket (no CPU while idle); the
                # driver reads the notification only once something arrived.
                ready, _, _ = io_select.select([self._conn.fileno()], [], [],
                                            min(LISTEN_SLICE_S, left))
                if ready:
                    for _ in self._conn.notifies(timeout=0.05, stop_after=1):
                        return True
            except (psycopg.Error, OSError, ValueError):
                self.close()
                return interrupt.wait(max(0.0, end - time.monotonic()))
            if interrupt.is_set():
                return True

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn, self.mode = None, "poll"


class PostgresDatabase(Database):
    """A PostgreSQL server: a bounded pool, REPEATABLE READ snapshots for reads, row locks
    for decisions, one statement per transition."""

    dialect = "postgresql"
    folds_transitions = True
    # Measured (benchmarks/batch.py, 4 workers x 8): a claim_many's FOR UPDATE keeps the
    # rows whose recheck failed locked until its longer transaction ends, and completions
    # of those jobs wait for it; single claims with grouped completions are faster.
    batch_claims = False

    def __init__(self, target: Target, engine: Engine, **kw: Any) -> None:
        import psycopg

        super().__init__(target, engine, **kw)
        self._driver_errors = (DBAPIError, PoolTimeout, psycopg.Error)
        self.write_engine = engine
        # One snapshot for every statement of a read (READ COMMITTED would give each
        # statement its own): `explain` must never see a running job without its lease.
        self.read_engine = engine.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True)
        self._writers = PooledConnections(self.write_engine)
        self._readers = PooledConnections(self.read_engine)

    @classmethod
    def open_server(cls, target: Target, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                    busy_retries: int = DEFAULT_RETRIES) -> PostgresDatabase:
        return cls(target, _pg_engine(target.url, busy_timeout), busy_retries=busy_retries,
                   busy_timeout=busy_timeout)

    # -- the core's operations --

    def binary_collation(self) -> str:
        return "C"

    def lock_for_decision(self, conn: Connection, job_id: int) -> None:
        self.run(conn, _LOCK_JOB, {"job_id": job_id})

    def read_owned(self, conn: Connection, job_id: int) -> Any:
        return self.run(conn, _OWNED_LOCKED, {"job_id": job_id}).fetchone()

    def candidate_sql(self, roles: Sequence[str], kinds: Sequence[str] | None, *,
                      due_only: bool, locked: bool = True, tenant: str | None = None
                      ) -> tuple[s.SQL, dict[str, Any]]:
        # Locks the candidate row and lets concurrent claimers skip it instead of waiting.
        return s.candidate_sql(roles, kinds, due_only=due_only, locked=locked, tenant=tenant)

    def take_next(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None, batch: int = 1) -> Taken:
        stmt = _claim_folded(roles, kinds, tenant is not None)
        params = s.role_kind_params(roles, kinds, tenant)
        # The statement spells the event's detail around the expiry's JSON string.
        params.update(now=now, maxp=max_priority, f=False, worker=worker, expires=expires,
                      expires_json=dumps(expires_iso))
        # Concurrent batches each hold up to `batch` rows until they commit, all of them
        # near the head of the queue: a batch starts further down than a single claim.
        for heads in (CLAIM_HEADS if batch == 1 else BATCH_CLAIM_HEADS):
            params["heads"] = heads
            found = self.run(conn, stmt, params).fetchone()
            # Every candidate held by other claimers, and a slice may hold more: look
            # further down the slices before saying they are all being claimed.
            if found[1] is not None or found[0] < heads:
                break
        if found[1] is None:
            return Taken(found[0], False, None)
        if found[2] is None:  # the compare-and-set took nothing: defence in depth
            return Taken(found[0], True, None)
        # All three happened in that one statement; a fault here still sits inside the
        # open transaction, before its commit.
        faults.point("claim.after_take")
        faults.point("claim.after_lease")
        faults.point("claim.after_event")
        return Taken(found[0], True, tuple(found[2:]))

    def hold_worker(self, conn: Connection, worker_id: str) -> None:
        self.run(conn, ls.HOLD_WORKER, {"worker": worker_id})

    def hold_limit(self, conn: Connection, kind: str, *, wait: bool) -> bool:
        row = self.run(conn, ls.HOLD_LIMIT if wait else ls.TRY_HOLD_LIMIT,
                       {"kind": kind}).fetchone()
        # Waited for: held, or the limit was removed meanwhile (the claim still applies the
        # one it read, the cautious side). Not waited for: held only if the row came back.
        return wait or row is not None

    def take_job(self, conn: Connection, job_id: int, *, worker: str, now: int, expires: int,
                 expires_iso: str) -> tuple[Any, ...] | None:
        # Skip a job a concurrent claim holds instead of waiting to find it taken.
        if self.run(conn, ls.HOLD_WAITING, {"job_id": job_id}).fetchone() is None:
            return None
        job = self.run(conn, s.TAKE_JOB, {"job_id": job_id, "now": now, "f": False}
                       ).fetchone()
        if job is None:
            return None
        epoch, attempts = job[6], job[4]
        self.run(conn, s.INSERT_LEASE, {"job_id": job_id, "worker": worker, "epoch": epoch,
                                        "now": now, "expires": expires})
        self.run(conn, s.INSERT_EVENT, {
            "job_id": job_id, "now": now, "from_status": "waiting", "to_status": "running",
            "reason": "claimed", "worker": worker, "epoch": epoch,
            "detail": dumps({"expires_at": expires_iso, "attempt": attempts})})
        return tuple(job)

    def end_running(self, conn: Connection, params: Mapping[str, Any], *, reason: str,
                    worker: str | None, detail: str | None) -> int:
        updated: int = self.run(conn, _END_FOLDED, {
            **params, "reason": reason, "worker": worker, "detail": detail}).fetchone()[0]
        if updated == 1:
            # All three follow the one statement, inside the open transaction.
            faults.point(f"{reason}.after_update")
            faults.point(f"{reason}.after_drop_lease")
            faults.point(f"{reason}.after_event")
        return updated

    def allocate_job_ids(self, conn: Connection, n: int) -> Sequence[int]:
        return sorted(r[0] for r in self.run(conn, _NEXT_JOB_IDS, {"n": n}))

    def expired_leases(self, conn: Connection, now: int, limit: int) -> list[Any]:
        return self.run(conn, _EXPIRED_LEASES_LOCKED, {"now": now, "limit": limit}).all()

    def overdue_waiting(self, conn: Connection, now: int, limit: int) -> list[Any]:
        return self.run(conn, _OVERDUE_WAITING_LOCKED, {"now": now, "limit": limit}).all()

    def pick_for_delete(self, conn: Connection, select: s.SQL, params: Mapping[str, Any]
                        ) -> list[Any]:
        # The select says FOR UPDATE SKIP LOCKED: another prune's batch is skipped.
        return self.run(conn, select, params).all()

    def announce_jobs(self, conn: Connection) -> None:
        self.run(conn, _ANNOUNCE, {})

    def change_waiter(self) -> ChangeWaiter:
        return ListenWaiter(self.target.url)

    # -- the tools' operations --

    @contextlib.contextmanager
    def migration_transaction(self, conn: Connection) -> Iterator[None]:
        with conn.begin():
            self.run(conn, _MIGRATION_LOCK)
            yield

    def lock_exclusive(self, conn: Connection, tables: Sequence[str]) -> None:
        """Hold `tables` against every other writer until commit (readers go on)."""
        conn.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN EXCLUSIVE MODE")

    def continue_sequences(self, conn: Connection, tables: Sequence[str]) -> dict[str, int]:
        """Make new ids continue after the rows copied with explicit ids (which never
        advance a sequence): the next id of each table that has a sequence."""
        return {t: int(self.run(conn, _CONTINUE[t]).scalar_one()) for t in SEQUENCES
                if t in tables}

    def storage_facts(self, conn: Connection) -> dict[str, Any]:
        # Measured when the connection opened: this host against the server.
        offset = conn.info.get("clock_offset_s")
        return {"dialect": self.dialect,
                "clock_offset_s": None if offset is None else round(offset, 6)}
