"""Operator actions: cancel, retry, reconcile, and prune (retention of finished jobs)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from .. import interrupts
from .. import validate as v
from ..clock import iso, now_us, seconds_to_us
from ..errors import DatabaseCorrupt, Interrupted, InvalidInput, JobcoordError, Refused
from ..states import FINAL_STATUSES
from ..store import query_statements as qs
from ..store import statements as sql
from .common import Context, as_bool, end_waiting, record_event


def load_job(ctx: Context, conn: Connection, job_id: int, tenant: str | None
             ) -> dict[str, Any] | JobcoordError:
    """The job's row as a mapping of its columns, or job_not_found (outside `tenant`)."""
    row = ctx.db.run(conn, qs.JOB_ROW, {"job_id": job_id}).first()
    job = None if row is None else dict(zip(qs.JOB_COLUMNS, row, strict=True))
    if job is None or (tenant is not None and job["tenant"] != tenant):
        return Refused("job_not_found", f"job {job_id} not found", job_id=job_id)
    return job


def operator(ctx: Context, op: str, job_id: Any, tenant: str | None, fn: Any
             ) -> dict[str, Any]:
    """An operator's action on one job: the job locked, read and handed to `fn` at the time
    of the decision, in one write transaction."""
    job_id = v.whole(job_id, "job_id", 1, 2**62)
    tenant = v.optional_name(tenant, "tenant")

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        ctx.db.lock_for_decision(conn, job_id)
        now = now_us()  # after the row lock: see fencing.check_owner
        job = load_job(ctx, conn, job_id, tenant)
        if isinstance(job, JobcoordError):
            return job
        return fn(conn, job, now)

    return ctx.db.write(_do, op)


def cancel(ctx: Context, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
    """waiting -> cancelled at once; running -> the owner's next renew, complete, fail or
    checkpoint is told `job_cancelled` and the job ends `cancelled` (or the reaper ends it
    when the lease runs out)."""

    def _do(conn: Connection, job: dict[str, Any], now: int) -> Any:
        status, epoch = job["status"], job["epoch"]
        if status == "waiting":
            end_waiting(ctx, conn, job["job_id"], epoch, now, "cancelled", "cancelled")
            return {"job_id": job["job_id"], "status": "cancelled"}
        if status == "running":
            if not as_bool(job["cancel_requested"]):
                ctx.db.run(conn, sql.REQUEST_CANCEL,
                           {"t": True, "now": now, "job_id": job["job_id"]})
                record_event(ctx, conn, job["job_id"], now, "running", "running",
                             "cancel_requested", epoch=epoch)
            return {"job_id": job["job_id"], "status": "running", "cancel_requested": True}
        if status in FINAL_STATUSES:
            return Refused("job_finished", f"job {job['job_id']} is already {status}",
                           job_id=job["job_id"], status=status)
        return Refused("illegal_transition", f"job {job['job_id']} is {status}; resolve it "
                       "with `jobcoord reconcile`", job_id=job["job_id"], status=status)

    return operator(ctx, "cancel", job_id, tenant, _do)


def back_to_waiting(ctx: Context, conn: Connection, job: dict[str, Any], now: int,
                    reason: str, detail: dict[str, Any]) -> None:
    # Give at least one more attempt, keep every attempt counted (attempts never shrinks).
    attempts = job["attempts"]
    if type(attempts) is not int or attempts >= sql.MAX_EPOCH:
        # Only a value written outside jobcoord: one more attempt does not fit the column.
        raise DatabaseCorrupt("value_out_of_range", f"job {job['job_id']}: its stored "
                              f"attempts {str(attempts)[:40]} leave no room for another "
                              "(written outside jobcoord)", job_id=job["job_id"],
                              column="attempts")
    max_attempts = max(job["max_attempts"], attempts + 1)
    deadline = job["deadline_at"]
    if deadline is not None and deadline <= now:
        deadline = None
        detail["deadline_cleared"] = True
    ctx.db.run(conn, sql.BACK_TO_WAITING, {
        "now": now, "f": False, "max_attempts": max_attempts, "deadline": deadline,
        "job_id": job["job_id"], "status": job["status"]})
    record_event(ctx, conn, job["job_id"], now, job["status"], "waiting", reason,
                 epoch=job["epoch"], detail=detail)
    ctx.db.announce_jobs(conn)


def retry(ctx: Context, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
    """Operator: dead or unknown -> waiting, with at least one attempt left."""

    def _do(conn: Connection, job: dict[str, Any], now: int) -> Any:
        if job["status"] not in ("dead", "unknown"):
            return Refused("illegal_transition", f"only dead or unknown jobs can be retried;"
                           f" job {job['job_id']} is {job['status']}", job_id=job["job_id"],
                           status=job["status"])
        back_to_waiting(ctx, conn, job, now, "operator_retry", {})
        return {"job_id": job["job_id"], "status": "waiting"}

    return operator(ctx, "retry", job_id, tenant, _do)


def reconcile(ctx: Context, job_id: int, as_status: str, reason: str, *, result: Any = None,
              tenant: str | None = None) -> dict[str, Any]:
    """Operator: settle an `unknown` job as succeeded (with its result), waiting or dead,
    with the reason recorded."""
    as_status = v.exact_text(as_status)
    if as_status not in ("succeeded", "waiting", "dead"):
        raise InvalidInput("invalid_input", "--as must be succeeded, waiting or dead")
    reason = v.utf8_text(reason, "reason", max_len=4096)
    if as_status == "succeeded" and result is None:
        raise InvalidInput("invalid_input", "reconciling as succeeded needs a result (the "
                           "job's outcome: --result, or `result` over HTTP)")
    if as_status == "waiting" and result is not None:
        # Dropped without a word, it was: the job runs again, its next attempt's result
        # is the one kept.
        raise InvalidInput("invalid_input", "a job reconciled as waiting runs again and "
                           "takes no result; give none, or reconcile as succeeded")
    result_text = None
    if result is not None:
        result_text = v.json_value(result, "result", str_is_text=False,
                                   max_bytes=ctx.policy.max_result_bytes,
                                   require_object=False, too_large_code="result_too_large")[1]

    def _do(conn: Connection, job: dict[str, Any], now: int) -> Any:
        if job["status"] != "unknown":
            return Refused("illegal_transition", f"only unknown jobs are reconciled; job "
                           f"{job['job_id']} is {job['status']}", job_id=job["job_id"],
                           status=job["status"])
        detail = {"reason": reason}
        if as_status == "waiting":
            back_to_waiting(ctx, conn, job, now, "reconciled", detail)
        else:
            ctx.db.run(conn, sql.SETTLE_UNKNOWN, {
                "to_status": as_status, "result": result_text, "now": now,
                 "job_id": job["job_id"]})
            record_event(ctx, conn, job["job_id"], now, "unknown", as_status, "reconciled",
                         epoch=job["epoch"], detail=detail)
        return {"job_id": job["job_id"], "status": as_status}

    return operator(ctx, "reconcile", job_id, tenant, _do)


def prune(ctx: Context, older_than: Any, *, statuses: Sequence[str] | None = None,
          tenant: str | None = None, batch: Any = 500, dry_run: bool = False,
          pause_s: Any = None) -> dict[str, Any]:
    """Delete finished jobs (succeeded, dead, cancelled; `statuses` narrows it) that
    finished more than `older_than` ago (seconds, or "7d", "12h", ...), with their events,
    checkpoints and artifact rows, in write transactions of at most `batch` jobs each,
    resting `pause_s` between them (by default as long as the batch held the write lock),
    so claims never wait long behind a large prune.

    Waiting, running and unknown jobs are never deleted: an unknown job must be settled
    with `reconcile` first. The newest job is kept whatever its age, so no job id is ever
    handed out twice. A pruned job's idempotency key is forgotten (the same key makes a
    new job), and the files its artifact rows named are left where they are."""
    older_s = v.safe_duration(older_than, "older_than", 0, 100 * 365 * 24 * 3600)
    dry_run = v.flag(dry_run, "dry_run")
    chosen = sorted(FINAL_STATUSES) if statuses is None else v.names(statuses, "status")
    for status in chosen:
        if status == "unknown":
            raise InvalidInput("invalid_input", "status: unknown jobs are never pruned; "
                               "settle them with `jobcoord reconcile` first",
                               field="status")
        if status not in FINAL_STATUSES:
            raise InvalidInput("invalid_input", "status: only finished jobs can be pruned "
                               f"({', '.join(FINAL_STATUSES)}), not {status!r}",
                               field="status")
    if not chosen:
        raise InvalidInput("invalid_input", "status: name at least one status",
                           field="status")
    tenant = v.optional_name(tenant, "tenant")
    batch = v.whole(batch, "batch", 1, 10_000)
    if pause_s is not None:
        pause_s = v.finite_seconds(pause_s, "pause", 0, 60)
    now = now_us()
    cutoff = now - seconds_to_us(older_s)
    params: dict[str, Any] = {f"s{i}": st for i, st in enumerate(chosen)}
    params.update(cutoff=cutoff, tenant=tenant, limit=batch)
    related = [("events", "job_events"), ("checkpoints", "checkpoints")]
    if "artifacts" in ctx.features:
        related.append(("artifacts", "artifacts"))
    stmts = sql.PruneStatements(len(chosen), by_tenant=tenant is not None,
                                related=[table for _, table in related])
    out: dict[str, Any] = {
        "dry_run": dry_run, "cutoff": cutoff, "statuses": chosen, "tenant": tenant,
        "jobs": 0, "events": 0, "checkpoints": 0, "artifacts": 0, "keys_released": 0,
        "batches": 0,
    }

    if dry_run:
        def _count(conn: Connection) -> None:
            row = ctx.db.run(conn, stmts.count_jobs, params).one()
            out["jobs"], out["keys_released"] = row[0], row[1]
            for key, table in related:
                out[key] = ctx.db.run(conn, stmts.count_related[table], params).scalar()

        ctx.db.read(_count, "prune")
        return out

    held_since = [0.0]

    def _one_batch(conn: Connection) -> dict[str, int]:
        held_since[0] = time.monotonic()  # the write lock is ours from here to the commit
        rows = ctx.db.pick_for_delete(conn, stmts.pick, params)
        if not rows:
            return {"jobs": 0}
        ids = {f"j{i}": r[0] for i, r in enumerate(rows)}
        both = {**params, **ids}
        counts = {key: ctx.db.run(conn, stmts.count_related_of(table, len(ids)),
                                       both).scalar()
                  for key, table in related}
        # Events, checkpoints, artifact rows (and any lease) go by ON DELETE CASCADE.
        deleted = ctx.db.run(conn, stmts.delete_of(len(ids)), both).rowcount
        if deleted != len(rows):  # the rows are locked or under the write lock
            raise JobcoordError("internal_error", "a job changed while it was pruned")
        counts.update(jobs=deleted, batches=1,
                      keys_released=sum(1 for r in rows if r[1] is not None))
        return counts

    try:
        while True:
            # Counted only once a batch has committed (a busy retry runs it again).
            done = ctx.db.write(_one_batch, "prune")
            for key, n in done.items():
                out[key] += n
            if done["jobs"] < batch:
                return out
            interrupts.accounted()  # a Ctrl-C since the commit stops it now, not after the rest
            # SQLite hands its write lock to whoever asks first, and a waiting worker's busy
            # handler sleeps between tries (up to 100 ms): back to back, the batches would
            # take the lock again and again before it woke. Resting as long as the batch
            # held the lock leaves it free at least half the time.
            time.sleep(time.monotonic() - held_since[0] if pause_s is None else pause_s)
    except KeyboardInterrupt:
        # Ctrl-C: a batch under way was rolled back; those before it stay deleted, and
        # whoever stopped the prune is told how many.
        raise Interrupted("interrupted", f"interrupted: {out['batches']} whole batches had "
                          f"deleted {out['jobs']} jobs; a batch under way was rolled back",
                          # The cutoff as ISO text, as the answer of a whole prune says it.
                          pruned={**out, "cutoff": iso(out["cutoff"])}) from None
