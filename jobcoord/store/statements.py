"""The statements both stores run, built from the Core tables of `schema.py` (so every column
list comes from the one definition of the schema), compiled by SQLAlchemy once per dialect
into the driver's own parameter style (`compiled.SQL`), and the claim's candidate select per
shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    CheckConstraint,
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    table,
    text,
    union_all,
    update,
)
from sqlalchemy.sql import ClauseElement

from ..schema import (
    TENANT_ROLE,
    TENANTED,
    checkpoints,
    claim_refusals,
    job_events,
    jobs,
    leases,
    limits,
    metadata,
    workers,
)

# The compiling lives in its own module; `SQL`, `Source` and `const` are re-exported here,
# where every statement module and caller has always imported them from.
from .compiled import SQL, const
from .compiled import Source as Source

P = bindparam
ZERO, ONE = const(0), const(1)
J, L, E, W, C = jobs.c, leases.c, job_events.c, workers.c, checkpoints.c
WAITING = J.status == const("waiting")

#: A new job's values: the caller's parameters, a new job's fixed starting state.
_NEW_JOB = {
    "tenant": P("tenant"), "kind": P("kind"), "required_role": P("role"),
    "priority": P("priority"), "payload_json": P("payload"), "status": const("waiting"),
    "created_at": P("now"), "updated_at": P("now"), "run_after": P("run_after"),
    "deadline_at": P("deadline"), "attempts": ZERO, "max_attempts": P("max_attempts"),
    "epoch": ZERO, "effect_started": P("f"), "cancel_requested": P("f"),
    "needs_json": P("needs"),
}

INSERT_JOB = SQL(
    lambda insert: insert(jobs).values(**_NEW_JOB, idempotency_key=P("key"))
    # Two submissions with one key at once (PostgreSQL: neither sees the other's row yet):
    # the later insert waits for the earlier, then inserts nothing instead of failing.
    .on_conflict_do_nothing(index_elements=[J.tenant, J.idempotency_key])
    .returning(J.job_id)
)
# A batch without idempotency keys: ids computed inside the write transaction, so the rows go
# in with one executemany instead of one round trip (and one RETURNING) per job.
# Every value a new job of the batch does not choose is written into the text: SQLite binds
# each parameter of each row one by one, so fewer parameters is less work per job.
INSERT_JOB_AT = SQL(insert(jobs).values(
    **{**_NEW_JOB, "effect_started": false(), "cancel_requested": false()},
    job_id=P("job_id"), idempotency_key=null()))
LAST_JOB_ID = SQL(select(func.coalesce(func.max(J.job_id), ZERO)))
# Inline: the insert returns nothing, not even the new event's id (which PostgreSQL's
# compiler would otherwise ask back).
INSERT_EVENT = SQL(insert(job_events).inline().values(
    job_id=P("job_id"), at=P("now"), from_status=P("from_status"), to_status=P("to_status"),
    reason=P("reason"), worker_id=P("worker"), epoch=P("epoch"), detail=P("detail")))
#: A batch's `enqueued` events: only the job, the time and the detail vary.
INSERT_ENQUEUED = SQL(insert(job_events).inline().values(
    job_id=P("job_id"), at=P("now"), from_status=null(), to_status=const("waiting"),
    reason=const("enqueued"), worker_id=null(), epoch=null(), detail=P("detail")))
#: The same events for a batch whose jobs all share one detail and whose ids are exactly the
#: rows between `first` and `last` (a store that can say so, see `insert_enqueued`): one
#: statement, where a row per job bound and sent cost a tenth of the batch.
INSERT_ENQUEUED_RANGE = SQL(insert(job_events).inline().from_select(
    ["job_id", "at", "from_status", "to_status", "reason", "worker_id", "epoch", "detail"],
    select(J.job_id, P("now", type_=Integer), null(), const("waiting"), const("enqueued"),
           null(), null(), P("detail", type_=String))
    .where(J.job_id.between(P("first"), P("last"))).order_by(J.job_id)))
JOB_BY_KEY = SQL(
    select(J.job_id, J.kind, J.payload_json, J.priority, J.required_role, J.max_attempts,
           J.needs_json)
    .where(J.tenant == P("tenant"), J.idempotency_key == P("key")))
# The max_attempts a keyed job was submitted with: releases and operator retries raise the
# stored one later, so the key is compared with what the `enqueued` event recorded.
SUBMITTED_DETAIL = SQL(
    select(E.detail).where(E.job_id == P("job_id"), E.reason == const("enqueued"))
    .order_by(E.event_id).limit(ONE))
RELEASES = SQL(select(func.count()).select_from(job_events).where(
    E.job_id == P("job_id"), E.reason == const("worker_shutdown")))
#: A claim's first read: the worker's row, and whether any limit exists or any waiting job
#: declares needs (two index probes), so a claim without either never reads more.
WORKER = SQL(
    select(W.roles_json, W.kinds_json, W.heartbeat_at, W.memory_used_pct, W.temperature_c,
           W.on_battery, W.user_idle_s,
           exists(select(ONE).select_from(limits)).label("limited"),
           exists(select(ONE).where(WAITING, J.needs_json.is_not(None))
                  # Without statistics SQLite would walk every waiting job by status.
                  .with_hint(jobs, "INDEXED BY ix_jobs_waiting_needs", "sqlite"))
           .label("needy"),
           W.last_refusal.is_not(None).label("refused"))
    .where(W.worker_id == P("worker")))
ALL_WORKERS = SQL(
    select(W.worker_id, W.roles_json, W.kinds_json, W.heartbeat_at, W.memory_used_pct,
           W.temperature_c, W.on_battery, W.user_idle_s, W.last_refusal,
           W.last_refusal_detail, W.last_refusal_at, W.heartbeat_raw).order_by(W.worker_id))


def _upsert(insert: Callable[..., Any], table: Any, values: dict[str, Any],
            key: Sequence[str], keep: Sequence[str]) -> ClauseElement:
    """Insert a row or, when its key exists, overwrite every column but `keep` (and the key)
    with the new row's."""
    stmt = insert(table).values(**values)
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=[table.c[k] for k in key],
        set_={name: stmt.excluded[name] for name in values if name not in (*key, *keep)})


UPSERT_WORKER = SQL(lambda insert: _upsert(insert, workers, {
    "worker_id": P("worker"), "roles_json": P("roles"), "kinds_json": P("kinds"),
    "heartbeat_raw": P("raw"), "heartbeat_at": P("now"), "memory_used_pct": P("mem"),
    "temperature_c": P("temp"), "on_battery": P("battery"), "user_idle_s": P("idle"),
    "created_at": P("now")}, key=("worker_id",), keep=("created_at",)))
# The same refusal again within a few seconds (:fresh) writes nothing: an idle worker polling a
# quiet queue commits no change, so it neither wakes itself nor other waiting workers (their
# change hint on SQLite is any commit to the file).
#: A claim that took a job ends the worker's standing refusal (run only when it has one):
#: `workers` and jobcoord_workers_refusing say why a worker holds work back now.
CLEAR_REFUSAL = SQL(update(workers).where(W.worker_id == P("worker")).values(
    last_refusal=null(), last_refusal_detail=null(), last_refusal_at=null()))

RECORD_REFUSAL = SQL(update(workers).where(
    W.worker_id == P("worker"),
    or_(W.last_refusal_at.is_(None), W.last_refusal != P("code"),
        W.last_refusal_detail != P("detail"), W.last_refusal_at <= P("fresh"))
).values(last_refusal=P("code"), last_refusal_detail=P("detail"), last_refusal_at=P("now")))
#: One more refused claim of this worker for this reason (the claim_refusals counter).
COUNT_REFUSAL = SQL(lambda insert: (
    insert(claim_refusals).values(worker_id=P("worker"), reason=P("code"), n=ONE,
                                  last_at=P("now"))
    .on_conflict_do_update(index_elements=[claim_refusals.c.worker_id,
                                           claim_refusals.c.reason],
                           set_={"n": claim_refusals.c.n + ONE, "last_at": P("now")})))
#: What a claim returns of the job it took, in this order.
TAKEN_COLUMNS = (J.job_id, J.kind, J.priority, J.payload_json, J.attempts, J.max_attempts,
                 J.epoch, J.tenant)
#: The largest epoch both databases keep (PostgreSQL's integer column). Only a job written
#: outside jobcoord gets near it: each claim adds one.
MAX_EPOCH = 2**31 - 1
#: A lease row on a waiting job is damage (a crash of an older version, a hand edit): the
#: job's status says nobody holds it. The claim that takes the job replaces the row (the
#: lease inserts below) and gives an epoch above the row's too, so a process holding the row's
#: epoch is fenced out even where the job's own epoch was set back. How far the row's epoch,
#: as a whole number (SQLite keeps any value), is above the job's; 0 without a row, for an
#: epoch not above the job's, and for one no claim can give (MAX_EPOCH and past it).
_stray_epoch = cast(L.epoch, Integer)
_PAST_STRAY_LEASE = (
    select(case((and_(_stray_epoch > J.epoch, _stray_epoch < const(MAX_EPOCH)),
                 _stray_epoch - J.epoch), else_=ZERO))
    .where(L.job_id == J.job_id).scalar_subquery())
#: A claim's take of a waiting job (without which job: the stores say).
_TAKE_VALUES = {"status": const("running"),
                "epoch": J.epoch + ONE + func.coalesce(_PAST_STRAY_LEASE, ZERO),
                "attempts": J.attempts + ONE, "effect_started": P("f"), "updated_at": P("now")}
TAKE_JOB_UPDATE = update(jobs).where(WAITING).values(**_TAKE_VALUES).returning(*TAKEN_COLUMNS)
#: A batch claim's take of several waiting jobs: the claim's columns and the creation time,
#: by which the caller puts them in claim order (RETURNING keeps none).
TAKE_MANY_UPDATE = (update(jobs).where(WAITING).values(**_TAKE_VALUES)
                    .returning(*TAKEN_COLUMNS, J.created_at))
TAKE_JOB = SQL(TAKE_JOB_UPDATE.where(J.job_id == P("job_id")))


def replacing_stray_lease(stmt: Any) -> Any:
    """A claim's insert of leases (`stmt`, made with the dialect's own `insert`) that
    replaces a lease row the job already has: a claim takes only a waiting job, whose row
    can only be damage (see _PAST_STRAY_LEASE), and it must not fail every claim."""
    return stmt.on_conflict_do_update(
        index_elements=[L.job_id],
        set_={c: stmt.excluded[c] for c in ("worker_id", "epoch", "granted_at",
                                            "expires_at")})


INSERT_LEASE = SQL(lambda insert: replacing_stray_lease(insert(leases).values(
    job_id=P("job_id"), worker_id=P("worker"), epoch=P("epoch"), granted_at=P("now"),
    expires_at=P("expires"))))
CHECKPOINTS = SQL(
    select(C.name, C.data_json, C.epoch, C.worker_id, C.updated_at)
    .where(C.job_id == P("job_id")).order_by(C.name))
OWNED_SELECT = (
    select(J.status, J.epoch, J.tenant, J.cancel_requested, J.effect_started, J.attempts,
           J.max_attempts, J.deadline_at, J.result_json, L.worker_id, L.epoch, L.expires_at)
    .select_from(jobs.outerjoin(leases, L.job_id == J.job_id))
    .where(J.job_id == P("job_id")))
OWNED = SQL(OWNED_SELECT)
RUNNING_AT_EPOCH = (J.job_id == P("job_id"), J.status == const("running"),
                    J.epoch == P("epoch"))
FINISH_UPDATE = update(jobs).where(*RUNNING_AT_EPOCH).values(
    status=P("to_status"), result_json=P("result"), provenance_json=P("provenance"),
    last_error=P("error"), finished_at=P("finished"), run_after=P("run_after"),
    updated_at=P("now"))
FINISH = SQL(FINISH_UPDATE)
GRANT_ATTEMPT = SQL(update(jobs).where(J.job_id == P("job_id"))
                    .values(max_attempts=P("max_attempts")))
DROP_LEASE_DELETE = delete(leases).where(L.job_id == P("job_id"), L.epoch == P("epoch"))
DROP_LEASE = SQL(DROP_LEASE_DELETE)
#: Any lease row of a job, whatever its epoch: a waiting job's stray row (left by a crash of
#: an older version, or written by hand) goes when the job ends, never to be claimed again.
DROP_ANY_LEASE = SQL(delete(leases).where(L.job_id == P("job_id")))
RENEW = SQL(update(leases).where(
    L.job_id == P("job_id"), L.epoch == P("epoch"), L.worker_id == P("worker"),
    L.expires_at > P("now")).values(expires_at=P("expires")))
#: The detail of :worker's `completed` event of :job_id at :epoch (a chained completion's
#: names the `claimed` event of the job it claimed next).
_CLAIMED = job_events.alias("claimed")
# One statement: the `claimed` event's id is read where the note is written, so a chained
# completion pays one round trip for it (a read then a write cost it 12 % of its time).
# No such event: the detail stays NULL, which `claimed_next` reads as no next claim.
NOTE_COMPLETED = SQL(update(job_events).where(
    E.job_id == P("job_id"), E.reason == const("completed"), E.epoch == P("epoch"),
    E.worker_id == P("worker")).values(detail=const('{"next_claim": ') + cast(
        select(_CLAIMED.c.event_id).where(
            _CLAIMED.c.job_id == P("next_job"), _CLAIMED.c.reason == const("claimed"),
            _CLAIMED.c.epoch == P("next_epoch"), _CLAIMED.c.worker_id == P("worker"))
        .limit(ONE).scalar_subquery(), String) + const("}")))
MARK_EFFECT = SQL(update(jobs).where(*RUNNING_AT_EPOCH)
                  .values(effect_started=P("t"), updated_at=P("now")))
UPSERT_CHECKPOINT = SQL(lambda insert: _upsert(insert, checkpoints, {
    "job_id": P("job_id"), "name": P("name"), "data_json": P("data"), "epoch": P("epoch"),
    "worker_id": P("worker"), "created_at": P("now"), "updated_at": P("now")},
    key=("job_id", "name"), keep=("created_at",)))
EXPIRED_LEASES_SELECT = (
    select(L.job_id, L.epoch, L.worker_id, L.expires_at, J.effect_started, J.attempts,
           J.max_attempts, J.deadline_at, J.cancel_requested)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    # Only a lease that is its running job's live one: a lease row written by hand (on a
    # waiting job, at another epoch) is `check`'s to name, never the reaper's to end.
    .where(L.expires_at <= P("now"), J.status == const("running"), J.epoch == L.epoch)
    .order_by(L.expires_at).limit(P("limit")))
EXPIRED_LEASES = SQL(EXPIRED_LEASES_SELECT)
OVERDUE_WAITING_SELECT = (
    select(J.job_id, J.epoch).where(WAITING, J.deadline_at <= P("now"))
    .order_by(J.deadline_at).limit(P("limit")))
OVERDUE_WAITING = SQL(OVERDUE_WAITING_SELECT)
REQUEST_CANCEL = SQL(update(jobs).where(J.job_id == P("job_id"))
                     .values(cancel_requested=P("t"), updated_at=P("now")))
BACK_TO_WAITING = SQL(update(jobs).where(J.job_id == P("job_id"), J.status == P("status"))
                      .values(status=const("waiting"), run_after=P("now"), updated_at=P("now"),
                              finished_at=null(), effect_started=P("f"),
                              cancel_requested=P("f"), max_attempts=P("max_attempts"),
                              deadline_at=P("deadline")))
SETTLE_UNKNOWN = SQL(
    update(jobs).where(J.job_id == P("job_id"), J.status == const("unknown"))
    .values(status=P("to_status"), result_json=func.coalesce(P("result"), J.result_json),
            finished_at=P("now"), updated_at=P("now")))
JOB_STATUS = SQL(select(J.status).where(J.job_id == P("job_id")))
#: A job's JSON columns as stored, with its status and epoch (a damaged job set aside).
JOB_JSON = SQL(select(J.status, J.epoch, J.payload_json, J.needs_json)
               .where(J.job_id == P("job_id")))
ANY_WAITING = SQL(select(ONE).where(WAITING).limit(ONE))
#: The jobs table's CHECK constraints, by name, each as the condition a row breaking it meets
#: (SQLite keeps such a row when it was written with its checks ignored).
JOB_CHECKS = tuple((ck.name, literal_column(f"NOT ({ck.sqltext})")) for ck in sorted(
    (c for c in jobs.constraints if isinstance(c, CheckConstraint)), key=lambda c: c.name))
#: Waiting jobs that break a CHECK constraint (at most :n): the job, its epoch, and per
#: constraint of JOB_CHECKS whether it breaks it. A claim's update of such a row fails.
WAITING_BREAKING_CHECKS = SQL(
    select(J.job_id, J.epoch, *(broken for _, broken in JOB_CHECKS))
    .where(WAITING, or_(*(broken for _, broken in JOB_CHECKS))).limit(P("n")))
#: Waiting jobs whose epoch cannot grow (at most :n): the job and its epoch.
WAITING_AT_MAX_EPOCH = SQL(
    select(J.job_id, J.epoch).where(WAITING, J.epoch >= P("max_epoch")).limit(P("n")))
#: Is any job of tenant :tenant waiting? (A tenant-bound claim's "nothing waits".)
ANY_WAITING_OF_TENANT = SQL(select(ONE).where(WAITING, J.tenant == P("tenant")).limit(ONE))
SET_STATUS = SQL(
    update(jobs).where(J.job_id == P("job_id"), J.status == P("from_status"),
                       J.epoch == P("epoch"))
    .values(status=P("to_status"), updated_at=P("now"), finished_at=P("finished"),
            last_error=func.coalesce(P("error"), J.last_error)))


_ALEMBIC = table("alembic_version", column("version_num"))
#: The revisions Alembic recorded (checked before every command).
ALEMBIC_VERSIONS = SQL(select(_ALEMBIC.c.version_num))


class PruneStatements:
    """The statements of one prune, for `n_statuses` statuses (:s0, :s1, ...), one tenant
    (:tenant) or all, and the tables whose rows go with a job.

    The guard is part of every statement, so a job retried or reconciled meanwhile is never
    deleted; finished_at is set by every transition into a finished status. The newest job
    always stays: SQLite gives a new row the largest id plus one, so deleting the largest
    would hand its id (and epoch 1) to the next job, and a late report for the old job could
    then pass the new one's fence."""

    def __init__(self, n_statuses: int, *, by_tenant: bool, related: Sequence[str]) -> None:
        newest = select(func.max(J.job_id)).correlate(None).scalar_subquery()
        self.guard = [J.status.in_([P(f"s{i}") for i in range(n_statuses)]),
                      J.finished_at < P("cutoff"), J.job_id < newest]
        if by_tenant:
            self.guard.append(J.tenant == P("tenant"))
        self._tables = {name: metadata.tables[name] for name in related}
        picked = select(J.job_id).where(*self.guard)
        #: How many jobs, and keys, the prune would delete (dry run).
        self.count_jobs = SQL(select(func.count(), func.count(J.idempotency_key))
                              .where(*self.guard))
        #: How many rows of each related table go with them (dry run).
        self.count_related = {
            name: SQL(select(func.count()).select_from(table)
                      .where(table.c.job_id.in_(picked)))
            for name, table in self._tables.items()}
        #: The next batch (:limit) of jobs to delete, oldest id first, held until commit
        #: (PostgreSQL: rows another prune holds are skipped; SQLite's compiler writes no
        #: lock, BEGIN IMMEDIATE holds the only write lock).
        self.pick = SQL(select(J.job_id, J.idempotency_key).where(*self.guard)
                        .order_by(J.job_id).limit(P("limit"))
                        .with_for_update(skip_locked=True))
        self._by_size: dict[tuple[str, int], SQL] = {}

    @staticmethod
    def _ids(n: int) -> list[Any]:
        return [P(f"j{i}") for i in range(n)]

    def count_related_of(self, table: str, n: int) -> SQL:
        """Rows of `table` that go with the batch's jobs :j0..."""
        stmt = self._by_size.get((table, n))
        if stmt is None:
            t = self._tables[table]
            stmt = self._by_size[table, n] = SQL(
                select(func.count()).select_from(t).where(t.c.job_id.in_(self._ids(n))))
        return stmt

    def delete_of(self, n: int) -> SQL:
        """Delete the batch's jobs :j0..., the guard checked again."""
        stmt = self._by_size.get(("", n))
        if stmt is None:
            stmt = self._by_size["", n] = SQL(
                delete(jobs).where(J.job_id.in_(self._ids(n)), *self.guard))
        return stmt


# --- the claim's candidate select -----------------------------------------------------------

#: Candidate statements by shape (roles, kinds, due only, locked, tenant-bound).
_CANDIDATES: dict[tuple[int, int | None, bool, bool, bool], SQL] = {}


def role_kind_params(roles: Sequence[str], kinds: Sequence[str] | None,
                     tenant: str | None = None) -> dict[str, Any]:
    """The parameters naming a worker's roles (:r1..), kinds (:k0..) and tenant (:tenant,
    only for a tenant-bound claim) in a candidate select."""
    params: dict[str, Any] = {f"r{i}": role for i, role in enumerate(roles, 1)}
    if kinds is not None:
        params.update((f"k{j}", kind) for j, kind in enumerate(kinds))
    if tenant is not None:
        params["tenant"] = tenant
    return params


#: Claim order: priority, then age.
CLAIM_ORDER = (J.priority, J.created_at, J.job_id)
#: A waiting job a claim may take now (:maxp, :now).
CLAIMABLE = (WAITING, J.priority <= P("maxp"), J.run_after <= P("now"),
             or_(J.deadline_at.is_(None), J.deadline_at > P("now")))


def probes(n_roles: int, n_kinds: int | None, *, due_only: bool, locked: bool,
           limit: Any = ONE, tenant: bool = False, extra: Sequence[Any] = ()) -> list[CTE]:
    """One index probe per (role, kind), each a MATERIALIZED CTE (c<i>_<j>) reading only the
    first `limit` rows of its slice of the partial claim index, however many jobs wait for
    other roles and kinds; role 0 is "no role". `locked` takes each row read with FOR UPDATE
    SKIP LOCKED (only PostgreSQL's compiler writes it). `tenant` keeps only jobs of tenant
    :tenant, read from the tenant claim indexes (c0007), whose slice starts at that tenant.
    `extra`: further conditions on the rows every probe keeps."""
    out = []
    for i in range(n_roles + 1):
        for j in range(1 if n_kinds is None else n_kinds):
            role = const("") if i == 0 else P(f"r{i}")
            by_role = J.required_role.is_(None) if i == 0 else J.required_role == role
            rest: list[Any] = [J.priority <= P("maxp"), *extra]
            if n_kinds is not None:
                rest.append(J.kind == P(f"k{j}"))
            if due_only:
                rest.extend(CLAIMABLE[2:])
            if not tenant:
                slices = {"": [by_role]}
            else:
                slices = {
                    # The tenant claim indexes' key and predicate, spelled as they spell
                    # them: the walk starts at this tenant's first job in claim order and
                    # reads no other tenant's.
                    "": [J.tenant == P("tenant"), text(TENANTED),
                         TENANT_ROLE == role],  # noqa: SIM300 (the key first)
                    # The default tenant's jobs are not in them: its claim walks the role's
                    # claim index, the tenant a filter on the rows read (spelled `tenant ||
                    # ''` so no planner trades that walk for the (tenant, job_id) index and
                    # a sort). For any other tenant the first term is false, and neither
                    # planner reads a row of it.
                    "d": [P("tenant") == const("default"), by_role,
                          J.tenant.concat(const("")) == P("tenant")],
                }
            for suffix, where in slices.items():
                probe = (select(J.job_id, J.priority, J.created_at)
                         .where(WAITING, *where, *rest).order_by(*CLAIM_ORDER).limit(limit))
                if locked:
                    probe = probe.with_for_update(skip_locked=True)
                out.append(probe.cte(f"c{i}_{j}{suffix}").prefix_with("MATERIALIZED"))
    return out


def union_of(ctes: Sequence[CTE]) -> Any:
    """Every probe's rows, one after the other."""
    return union_all(*(select(cte) for cte in ctes))


def candidate(n_roles: int, n_kinds: int | None, *, due_only: bool, locked: bool,
              tenant: bool = False) -> SQL:
    """The first of the probes' heads in claim order (:maxp, :now, :r1.., :k0.., :tenant);
    built and compiled once per shape, not per claim."""
    shape = (n_roles, n_kinds, due_only, locked, tenant)
    stmt = _CANDIDATES.get(shape)
    if stmt is None:
        heads = union_of(probes(n_roles, n_kinds, due_only=due_only, locked=locked,
                                tenant=tenant)).subquery("candidates")
        stmt = _CANDIDATES[shape] = SQL(
            select(heads.c.job_id).order_by(heads.c.priority, heads.c.created_at,
                                            heads.c.job_id).limit(ONE))
    return stmt


def candidate_sql(roles: Sequence[str], kinds: Sequence[str] | None, *, due_only: bool,
                  locked: bool, tenant: str | None = None) -> tuple[SQL, dict[str, Any]]:
    """The candidate select for this worker's roles, kinds and tenant (None: every tenant),
    and their parameters."""
    return (candidate(len(roles), None if kinds is None else len(kinds), due_only=due_only,
                      locked=locked, tenant=tenant is not None),
            role_kind_params(roles, kinds, tenant))


def candidate_text(roles: Sequence[str], kinds: Sequence[str] | None, due_only: bool,
                   lock: str = "") -> str:
    """The candidate select as SQLite runs it, `:name` parameters (for the benchmarks)."""
    return candidate_sql(roles, kinds, due_only=due_only, locked=bool(lock))[0].sqlite


# --- the batch claim's take -----------------------------------------------------------------

#: Batch take statements by shape (roles, kinds, tenant-bound).
_TAKE_MANY: dict[tuple[int, int | None, bool], SQL] = {}


def take_many_sql(roles: Sequence[str], kinds: Sequence[str] | None,
                  tenant: str | None = None) -> tuple[SQL, dict[str, Any]]:
    """One statement taking the first :n claimable jobs in claim order, the same probes
    (one per (role, kind), each reading the first :n rows of its slice of the claim index)
    and the same take as a single claim's; built once per shape. The store runs it under
    its write lock (SQLite): no row lock is written."""
    shape = (len(roles), None if kinds is None else len(kinds), tenant is not None)
    stmt = _TAKE_MANY.get(shape)
    if stmt is None:
        heads = union_of(probes(shape[0], shape[1], due_only=True, locked=False,
                                limit=P("n"), tenant=shape[2])).subquery("candidates")
        first = (select(heads.c.job_id)
                 .order_by(heads.c.priority, heads.c.created_at, heads.c.job_id)
                 .limit(P("n")))
        stmt = _TAKE_MANY[shape] = SQL(TAKE_MANY_UPDATE.where(J.job_id.in_(first)))
    return stmt, role_kind_params(roles, kinds, tenant)


def owned_many(n: int) -> SQL:
    """The fence read (OWNED) of :j0..:j<n-1> at once, in job id order; built once per
    size (callers round sizes up, repeating an id)."""
    stmt = _OWNED_MANY.get(n)
    if stmt is None:
        stmt = _OWNED_MANY[n] = SQL(owned_many_select(n))
    return stmt


def owned_many_select(n: int) -> Any:
    """OWNED_SELECT's columns and the job id, for the jobs :j0..:j<n-1>, in job id order."""
    return (select(J.job_id, *OWNED_SELECT.selected_columns)
            .select_from(jobs.outerjoin(leases, L.job_id == J.job_id))
            .where(J.job_id.in_([P(f"j{i}") for i in range(n)])).order_by(J.job_id))


_OWNED_MANY: dict[int, SQL] = {}
