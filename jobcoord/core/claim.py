"""The claim: the worker's heartbeat and gates, the first eligible job taken under a new
lease and epoch, and why nothing was claimed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import MICROS, iso, now_us
from ..errors import DatabaseCorrupt
from ..policy import GateDecision, Readings, evaluate
from ..states import FINAL_STATUSES
from ..store import statements as sql
from . import limits as limit_rules
from .common import Context, as_bool, lease_end, lease_us, record_event
from .items import MAX_BATCH, NO_KINDS
from .workers import claiming_row, unreadable_detail

T = TypeVar("T")


def claim(ctx: Context, worker_id: str, *, lease_s: float | None = None,
          kinds: Sequence[str] | None = None, tenant: str | None = None,
          worker_view: bool = False) -> dict[str, Any]:
    """Give this worker the first eligible waiting job, under a new lease and epoch. With a
    `tenant`, only that tenant's jobs are eligible (a tenant-bound worker never sees another
    tenant's job, nor the default tenant's); without one, every tenant's. `worker_view`: a
    refusal names the holders of this worker's leases only, never another worker's (what a
    worker token is told through the server; a trusted local caller is told every one).

    Returns {"job": {...}, "lease": {...}}, or {"job": None, "reason": CODE, "detail"}
    when nothing can be claimed (the refusal is also recorded on the worker)."""
    worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
    lease = lease_us(ctx, lease_s)
    kind_filter = None if kinds is None else v.names(kinds, "kind", empty=NO_KINDS)
    tenant = v.optional_name(tenant, "tenant")
    worker_view = v.flag(worker_view, "worker_view")
    return past_damaged(ctx, lambda: ctx.db.write(
        lambda conn: claim_in(ctx, conn, worker_id, lease, kind_filter, now_us(), tenant,
                              worker_view),
        "claim"))


#: How many damaged waiting jobs one claim call sets aside before it gives up and reports
#: the next one (each is its own short transaction; more than a few means a broken restore
#: that `jobcoord check` should look at first).
MAX_SET_ASIDE = 16


def past_damaged(ctx: Context, attempt: Callable[[], T]) -> T:
    """Run a claim (`attempt`: one whole write transaction); when it met a waiting job whose
    stored JSON does not parse, set that job aside as dead and run the claim again. One job
    written outside jobcoord must not stop every worker's claim: without this, the damaged
    job stays first in claim order and every claim fails on it until someone repairs it."""
    for _ in range(MAX_SET_ASIDE):
        try:
            return attempt()
        except DatabaseCorrupt as exc:
            if exc.code == "row_breaks_check":
                if not set_aside_breaking(ctx):
                    raise
            elif exc.code == "value_out_of_range":
                if not set_aside_at_max_epoch(ctx):
                    raise
            elif exc.code != "job_unreadable" or not set_aside(ctx, exc.details):
                raise
    return attempt()


#: The damaged columns a claim reads of a waiting job: such a job is set aside. A damaged
#: checkpoint too: it records what an earlier attempt did (a paid call), and the job must
#: never be handed out without it.
SET_ASIDE_COLUMNS = ("payload_json", "needs_json", v.CHECKPOINT_DATA)


def set_aside(ctx: Context, where: dict[str, Any]) -> bool:
    """End a waiting job whose stored JSON column does not parse as `dead`, with a
    `job_unreadable` event naming the column, in its own transaction. The answer: should
    the claim run again? Yes when this ended the job, when another claim already had (claims
    race over the same damaged job; only one ends it), and when it was repaired meanwhile
    (it stays waiting, claimable again). No for a job still held (running: a lease a limit
    reads, not ours to end) or a wrong reference: the claim reports the damage it saw."""
    job_id, column = where.get("job_id"), where.get("column")
    if not isinstance(job_id, int) or column not in SET_ASIDE_COLUMNS:
        return False

    def _do(conn: Connection) -> bool:
        row = ctx.db.run(conn, sql.JOB_JSON, {"job_id": job_id}).fetchone()
        if row is None or row[0] in FINAL_STATUSES:
            return True  # gone or ended: the claim no longer meets it
        if row[0] != "waiting":
            return False
        texts = ([r[1] for r in ctx.db.run(conn, sql.CHECKPOINTS, {"job_id": job_id})]
                 if column == v.CHECKPOINT_DATA
                 else [row[2] if column == "payload_json" else row[3]])
        try:
            for text in texts:
                v.stored_json(text, job_id, column)
            return True  # repaired since the claim read it
        except DatabaseCorrupt:
            pass
        now = now_us()
        error = (f"its stored {column} is not valid JSON, or not what jobcoord writes there "
                 "(written outside jobcoord); set aside by a claim so the jobs behind it can "
                 "run")
        swept = ctx.db.run(conn, sql.SET_STATUS, {
            "job_id": job_id, "epoch": row[1], "from_status": "waiting",
            "to_status": "dead", "now": now, "finished": now, "error": error}).rowcount
        if swept != 1:
            return True  # another claim ended it between our read and our update
        record_event(ctx, conn, job_id, now, "waiting", "dead", "job_unreadable",
                     detail={"column": column})
        return True

    return ctx.db.write(_do, "set aside")


def set_aside_breaking(ctx: Context) -> int:
    """End as `dead` the waiting jobs whose stored values break a CHECK constraint of the
    jobs table (SQLite keeps such a row when it is written with its checks ignored; the
    claim's update of it then fails), each with a `job_unreadable` event naming the
    constraint. The answer: how many it ended (none: the claim's failure was not this
    damage, and is reported)."""

    def why(broken: Sequence[Any]) -> tuple[str, dict[str, Any]]:
        check = next((name for (name, _), b in zip(sql.JOB_CHECKS, broken, strict=True)
                      if b), None)
        return f"break the CHECK constraint {check}", {"check": check}

    return _set_aside_all(ctx, sql.WAITING_BREAKING_CHECKS, {}, why)


def set_aside_at_max_epoch(ctx: Context) -> int:
    """End as `dead` the waiting jobs whose epoch cannot grow (at sql.MAX_EPOCH, the
    schema's largest on both databases), each with a `job_unreadable` event naming the
    column: a claim's epoch + 1 fails on PostgreSQL, and on SQLite is refused by the claim
    (past 2**63 - 1 it would become a float). The answer: how many it ended."""
    return _set_aside_all(ctx, sql.WAITING_AT_MAX_EPOCH, {"max_epoch": sql.MAX_EPOCH},
                          lambda _: ("hold an epoch that cannot grow", {"column": "epoch"}))


def _set_aside_all(ctx: Context, find: Any, params: dict[str, Any],
                   why: Callable[[Sequence[Any]], tuple[str, dict[str, Any]]]) -> int:
    """End the waiting jobs `find` returns (job, epoch, then what `why` reads) as `dead`,
    in one transaction: the statement that finds them is the judge, so a job repaired or
    claimed meanwhile is not touched."""

    def _do(conn: Connection) -> int:
        now = now_us()
        ended = 0
        for job_id, epoch, *rest in ctx.db.run(conn, find,
                                               {**params, "n": MAX_SET_ASIDE}).all():
            what, detail = why(rest)
            error = (f"its stored values {what} (written outside jobcoord); set aside by a "
                     "claim so the jobs behind it can run")
            if ctx.db.run(conn, sql.SET_STATUS, {
                    "job_id": job_id, "epoch": epoch, "from_status": "waiting",
                    "to_status": "dead", "now": now, "finished": now,
                    "error": error}).rowcount != 1:
                continue
            ended += 1
            record_event(ctx, conn, job_id, now, "waiting", "dead", "job_unreadable",
                         detail=detail)
        return ended

    return ctx.db.write(_do, "set aside")


#: A worker's repeated identical refusal is recorded again (its time refreshed) at most
#: this often: `workers` shows when it was last refused, to within these 5 seconds. Each
#: such write wakes every idle worker on the file, so not more often.
REFUSAL_REFRESH_US = 5 * MICROS


def refuse(ctx: Context, conn: Connection, worker_id: str, now: int, code: str, detail: str,
           known_worker: bool = True) -> dict[str, Any]:
    """Nothing to claim: the answer, also recorded on the worker (if it is known) and
    counted under its reason in the same transaction (a counter every process shares, which
    survives restarts). Unknown workers are not counted: any string could be one."""
    if known_worker:
        params = {"worker": worker_id, "code": code, "detail": detail, "now": now,
                  "fresh": now - REFUSAL_REFRESH_US}
        ctx.db.run(conn, sql.RECORD_REFUSAL, params)
        ctx.db.run(conn, sql.COUNT_REFUSAL, params)
    return {"job": None, "reason": code, "detail": detail}


def claim_in(ctx: Context, conn: Connection, worker_id: str, lease_us: int,
             kinds: Sequence[str] | None, now: int, tenant: str | None = None,
             worker_view: bool = False) -> dict[str, Any]:
    """The claim inside an open write transaction (also the second half of
    complete_and_claim)."""
    admitted = admit(ctx, conn, worker_id, kinds, now)
    if isinstance(admitted, dict):
        return admitted
    roles, kinds, gates, flags = admitted
    got, verdict = take_one(ctx, conn, worker_id, roles, kinds, gates, lease_us, now, [],
                            tenant=tenant, flags=flags, worker_view=worker_view)
    if got is None:
        code, detail = ((verdict.code, verdict.detail) if verdict is not None
                        else why_nothing(ctx, conn, roles, kinds, gates, now, tenant))
        return refuse(ctx, conn, worker_id, now, code, detail)
    if flags[2]:
        ctx.db.run(conn, sql.CLEAR_REFUSAL, {"worker": worker_id})
    return got


def claim_many(ctx: Context, worker_id: str, n: Any, *, lease_s: float | None = None,
               kinds: Sequence[str] | None = None, tenant: str | None = None,
               worker_view: bool = False) -> dict[str, Any]:
    """Give this worker up to `n` eligible waiting jobs in one write transaction, in claim
    order, each under its own lease, epoch and `claimed` event. With a `tenant`, only that
    tenant's jobs are eligible, and `worker_view` names holders, as for `claim`.

    Returns {"claimed": [<claim's answer>, ...], "reason": None, "detail": None}; when
    nothing could be taken, "claimed" is empty and reason/detail say why, as `claim` does
    (the refusal is recorded on the worker)."""
    worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
    count = v.whole(n, "n", 1, MAX_BATCH)
    lease = lease_us(ctx, lease_s)
    kind_filter = None if kinds is None else v.names(kinds, "kind", empty=NO_KINDS)
    tenant = v.optional_name(tenant, "tenant")
    worker_view = v.flag(worker_view, "worker_view")
    return past_damaged(ctx, lambda: ctx.db.write(
        lambda conn: claim_many_in(ctx, conn, worker_id, count, lease, kind_filter, now_us(),
                                   tenant, worker_view),
        "claim_many"))




def claim_many_in(ctx: Context, conn: Connection, worker_id: str, n: int, lease_us: int,
                  kinds: Sequence[str] | None, now: int, tenant: str | None = None,
                  worker_view: bool = False) -> dict[str, Any]:
    """claim_many inside an open write transaction: the worker is admitted once (heartbeat,
    gates). Without limits and without waiting jobs that declare needs, the store takes the
    first `n` eligible jobs as one set (`take_many`); otherwise the single claim's
    per-candidate step runs until `n` jobs are taken or a step takes none, every step
    counting the jobs already taken in this batch."""
    admitted = admit(ctx, conn, worker_id, kinds, now)
    if isinstance(admitted, dict):
        return {"claimed": [], "reason": admitted["reason"], "detail": admitted["detail"]}
    roles, kinds, gates, flags = admitted
    taken: list[dict[str, Any]] = []
    verdict = None
    if not (flags[0] or flags[1]):
        expires = lease_end(now, lease_us)
        taken = [answer(ctx, conn, worker_id, job, expires) for job in ctx.db.take_many(
            conn, roles, kinds, n=n, worker=worker_id, now=now, expires=expires,
            max_priority=gates.max_priority, expires_iso=iso(expires), tenant=tenant)]
    else:
        while len(taken) < n:
            got, verdict = take_one(ctx, conn, worker_id, roles, kinds, gates, lease_us, now,
                                    taken, n, tenant=tenant, flags=flags,
                                    worker_view=worker_view)
            if got is None:  # a step that takes nothing (or a rule that refuses) ends it
                break
            taken.append(got)
    if not taken:
        code, detail = ((verdict.code, verdict.detail) if verdict is not None
                        else why_nothing(ctx, conn, roles, kinds, gates, now, tenant))
        refuse(ctx, conn, worker_id, now, code, detail)
        return {"claimed": [], "reason": code, "detail": detail}
    if flags[2]:
        ctx.db.run(conn, sql.CLEAR_REFUSAL, {"worker": worker_id})
    return {"claimed": taken, "reason": None, "detail": None}


def admit(ctx: Context, conn: Connection, worker_id: str, kinds: Sequence[str] | None,
          now: int) -> dict[str, Any] | tuple[Any, ...]:
    """The worker's side of a claim: its row, its heartbeat's age and the gates. Returns
    the refusal (already recorded) or the worker's roles, kinds, gate decision and flags
    (limits exist, waiting jobs declare needs, a refusal stands on its row)."""
    row = ctx.db.run(conn, sql.WORKER, {"worker": worker_id}).fetchone()
    if row is None:
        return refuse(ctx, conn, worker_id, now, "heartbeat_missing",
                      f"worker {worker_id} has never sent a heartbeat", False)
    damaged, (roles, stored_kinds, *_) = claiming_row(ctx, conn, worker_id, row,
                                                      kinds is not None)
    if damaged is not None:
        # Written outside jobcoord: this worker claims nothing, as if it had no heartbeat,
        # until its next heartbeat rewrites the row (never an internal error).
        return refuse(ctx, conn, worker_id, now, "heartbeat_stale",
                      unreadable_detail(worker_id, damaged))
    if kinds is None:
        kinds = stored_kinds
    if kinds is not None and not kinds:
        # Heartbeats refuse an empty list; a row holding one claims nothing, clearly,
        # instead of building a statement with no probe.
        return refuse(ctx, conn, worker_id, now, "no_matching_role",
                      f"worker {worker_id} handles no kinds (its heartbeat listed "
                      "none)")
    age_s = (now - row[2]) / MICROS if row[2] is not None else None
    if age_s is None or age_s > ctx.policy.heartbeat_max_age_s:
        return refuse(ctx, conn, worker_id, now, "heartbeat_stale",
                      f"last heartbeat {age_s:.0f}s ago; the limit is "
                      f"{ctx.policy.heartbeat_max_age_s:g}s")
    gates = evaluate(ctx.policy, Readings(row[3], row[4], as_bool(row[5]), row[6]))
    if gates.blocks_all:
        code, detail = gates.refusal or ("gated", "the gates refuse every priority")
        return refuse(ctx, conn, worker_id, now, code, detail)
    return roles, kinds, gates, (bool(row[7]), bool(row[8]), bool(row[9]))


def take_one(ctx: Context, conn: Connection, worker_id: str, roles: Sequence[str],
             kinds: Sequence[str] | None, gates: GateDecision, lease_us: int, now: int,
             taken: Sequence[dict[str, Any]], batch: int = 1, *, tenant: str | None = None,
             flags: tuple[bool, bool] = (False, False), worker_view: bool = False
             ) -> tuple[dict[str, Any] | None, Any]:
    """The per-candidate step every claim runs: the first eligible job taken under a new
    lease and epoch, or None when none can be taken (with the limit's verdict when a limit
    or a resource refused). `flags`: whether limits exist and whether waiting jobs declare
    needs (from the worker's row). `taken` holds this transaction's
    earlier answers (a batch's), for rules that count what a worker already holds; `batch`
    is how many the transaction means to take; with a `tenant`, only its jobs;
    `worker_view`: a limit's refusal names this worker's holders only."""
    expires = lease_end(now, lease_us)
    verdict = None
    if flags[0] or flags[1]:
        # A limit exists or a waiting job declares needs: each candidate is checked in
        # claim order (core.limits); the leases this batch took are already in the
        # transaction, so the limits count them. Otherwise the store's one-step take.
        got, verdict, now = limit_rules.take_checked(
            ctx, conn, worker_id, roles, kinds, now=now, lease_us=lease_us,
            max_priority=gates.max_priority, limited=flags[0], tenant=tenant,
            worker_view=worker_view)
        expires = lease_end(now, lease_us)
    else:
        got = ctx.db.take_next(conn, roles, kinds, worker=worker_id, now=now,
                               expires=expires, max_priority=gates.max_priority,
                               expires_iso=iso(expires), tenant=tenant, batch=batch)
    if got.job is None:  # nothing picked, or the compare-and-set lost, or a limit refused
        return None, verdict
    return answer(ctx, conn, worker_id, got.job, expires), None


def answer(ctx: Context, conn: Connection, worker_id: str, job: Sequence[Any], expires: int
           ) -> dict[str, Any]:
    """A claim's answer for a job it took (`Taken.job`), with the checkpoints earlier
    attempts left."""
    job_id, kind, priority, payload, attempts, max_attempts, epoch, job_tenant = job
    if type(epoch) is not int or epoch > sql.MAX_EPOCH:
        # SQLite counts on past PostgreSQL's column (and past 2**63 - 1 into a float): refused
        # as PostgreSQL refuses it, so the claim sets the job aside on both databases.
        raise DatabaseCorrupt("value_out_of_range", f"job {job_id}: its epoch cannot grow "
                              f"past {sql.MAX_EPOCH} (written outside jobcoord)",
                              job_id=job_id, column="epoch")
    # Checkpoints are written under a lease, so a job's first epoch has none to read.
    checkpoints = [] if epoch == 1 else [
        {"name": r[0], "data": v.stored_json(r[1], job_id, v.CHECKPOINT_DATA), "epoch": r[2],
         "worker_id": r[3],
         "updated_at": r[4]}
        for r in ctx.db.run(conn, sql.CHECKPOINTS, {"job_id": job_id})
    ]
    return {
        "job": {"job_id": job_id, "kind": kind, "priority": priority, "tenant": job_tenant,
                "payload": v.stored_json(payload, job_id, "payload_json"), "attempt": attempts,
                "max_attempts": max_attempts, "checkpoints": checkpoints},
        "lease": {"worker_id": worker_id, "epoch": epoch, "expires_at": expires,
                  "expires_at_us": expires},
    }


def claimable(ctx: Context, worker_id: str, kinds: Sequence[str] | None = None, *,
              tenant: str | None = None) -> bool:
    """Whether a claim by this worker could take a job now, read without writing anything
    (no refusal recorded or counted): what an idle worker asks when a commit woke it, so
    commits that made nothing claimable for it do not turn into refused claims. With a
    `tenant`, only that tenant's jobs count, as in a claim bound to it."""
    worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
    kind_filter = None if kinds is None else v.names(kinds, "kind", empty=NO_KINDS)
    tenant = v.optional_name(tenant, "tenant")

    def _look(conn: Connection) -> bool:
        now = now_us()
        row = ctx.db.run(conn, sql.WORKER, {"worker": worker_id}).fetchone()
        if row is None:
            return False
        damaged, (roles, stored_kinds, *_) = claiming_row(ctx, conn, worker_id, row,
                                                          kind_filter is not None)
        if damaged is not None:
            return False  # a damaged row claims nothing (`admit`)
        wanted = kind_filter if kind_filter is not None else stored_kinds
        if wanted is not None and not wanted:
            return False
        gates = evaluate(ctx.policy, Readings(row[3], row[4], as_bool(row[5]), row[6]))
        if gates.blocks_all:
            return False
        if row[7] or row[8]:
            # A limit exists or a waiting job declares needs: a waiting job may be one the
            # claim would refuse, so walk the candidates as the claim does.
            return limit_rules.fits_any(ctx, conn, worker_id, roles, wanted, now=now,
                                        max_priority=gates.max_priority,
                                        limited=bool(row[7]), tenant=tenant)
        stmt, params = ctx.db.candidate_sql(roles, wanted, due_only=True, locked=False,
                                            tenant=tenant)
        params.update(now=now, maxp=gates.max_priority)
        return ctx.db.run(conn, stmt, params).first() is not None

    return ctx.db.read(_look, "claimable")


def why_nothing(ctx: Context, conn: Connection, roles: Sequence[str],
                kinds: Sequence[str] | None, gates: GateDecision, now: int,
                tenant: str | None = None) -> tuple[str, str]:
    """The reason code and detail of a claim that found nothing to take. A tenant-bound
    claim is told only about its tenant's jobs: another tenant's are as if absent."""

    def none_waiting() -> bool:
        if tenant is None:
            return ctx.db.run(conn, sql.ANY_WAITING).first() is None
        return ctx.db.run(conn, sql.ANY_WAITING_OF_TENANT, {"tenant": tenant}).first() is None

    nothing = "no job is waiting" if tenant is None else f"no job of tenant {tenant} is waiting"
    if none_waiting():
        return "no_waiting_jobs", nothing
    stmt, params = ctx.db.candidate_sql(roles, kinds, due_only=True, locked=False,
                                        tenant=tenant)
    params.update(now=now, maxp=gates.max_priority)
    if ctx.db.run(conn, stmt, params).first() is not None:
        # Only on PostgreSQL: the claim skipped rows that concurrent claims hold locked.
        return ("no_waiting_jobs",
                "every job this worker could run is being claimed by another worker")
    stmt, params = ctx.db.candidate_sql(roles, kinds, due_only=True, locked=False,
                                        tenant=tenant)
    params.update(now=now, maxp=3)
    if gates.refusal and ctx.db.run(conn, stmt, params).first() is not None:
        return gates.refusal
    stmt, params = ctx.db.candidate_sql(roles, kinds, due_only=False, locked=False,
                                        tenant=tenant)
    params.update(maxp=3)
    if ctx.db.run(conn, stmt, params).first() is not None:
        return ("no_waiting_jobs",
                "the waiting jobs this worker could run are scheduled for later or past "
                "their deadline")
    # Each statement above may see a newer snapshot on PostgreSQL: the jobs seen waiting
    # at first may have been claimed since. Ask again before blaming the role.
    if none_waiting():
        return "no_waiting_jobs", nothing
    serves = f"roles {list(roles)}" if roles else "no role"
    if kinds is not None:
        serves += f" and kinds {list(kinds)}"
    return "no_matching_role", f"jobs are waiting, but none for a worker with {serves}"
