"""Recovery: expired leases back to waiting (or dead, unknown, cancelled), and waiting jobs
past their deadline to dead."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from .. import faults
from .. import validate as v
from ..clock import iso, now_us
from ..store import schedule_statements as schedule_sql
from .common import Context, as_bool, end_waiting
from .fencing import end_running


def reap(ctx: Context, *, limit: int = 1000) -> dict[str, Any]:
    """Turn expired leases into `waiting` (or `dead` when attempts or the deadline are
    used up, `unknown` when an external effect had started, `cancelled` when asked), and
    waiting jobs past their deadline into `dead`. Safe from any number of processes: each
    change is a compare-and-set on (status, epoch)."""
    limit = v.whole(limit, "limit", 1, 100_000)

    def _do(conn: Connection) -> dict[str, Any]:
        faults.point("reap.start")  # a test makes every reap fail here
        counts = {"expired": 0, "waiting": 0, "dead": 0, "unknown": 0, "cancelled": 0,
                  "deadline_dead": 0}
        jobs: list[dict[str, Any]] = []
        # Candidates are chosen with a first reading; the decisions and event times use a
        # second one, taken once their rows are locked (PostgreSQL) -- later, so every
        # chosen lease is still expired, and no event is older than one it waited for.
        expired = ctx.db.expired_leases(conn, now_us(), limit)
        now = now_us()
        for row in expired:
            to_status = expire(ctx, conn, row, now)
            if to_status is None:
                continue  # a value written by hand (SQLite keeps it): `check` names it
            counts["expired"] += 1
            counts[to_status] += 1
            jobs.append({"job_id": row[0], "epoch": row[1], "to": to_status})
        overdue = ctx.db.overdue_waiting(conn, now, limit)
        now = max(now, now_us())
        for job_id, epoch in overdue:
            # A scheduled job's deadline is the end of its slot's window: say so.
            fire = ctx.db.run(conn, schedule_sql.FIRE_OF_JOB, {"job_id": job_id}).first()
            reason, detail = "deadline_passed", None
            error = "deadline passed before the job could run"
            if fire is not None and fire[2] is not None:
                reason = "window_missed"
                error = (f"the window of schedule {fire[0]}'s slot {iso(fire[1])} closed at "
                         f"{iso(fire[1] + fire[2])} before the job could run")
                detail = {"schedule": fire[0], "slot": iso(fire[1])}
            if not end_waiting(ctx, conn, job_id, epoch, now, "dead", reason, error=error,
                               detail=detail):
                continue  # claimed meanwhile: no transition, so no event
            counts["deadline_dead"] += 1
            jobs.append({"job_id": job_id, "epoch": epoch, "to": "dead"})
        return {**counts, "jobs": jobs, "at": now}

    return ctx.db.write(_do, "reap")


def expire(ctx: Context, conn: Connection, row: Any, now: int) -> str | None:
    """End one expired lease, held by this transaction (a row of EXPIRED_LEASES: job, epoch,
    worker, expiry, effect started, attempts, max attempts, deadline, cancel asked): back
    to `waiting`, or `dead`, `unknown`, `cancelled`. The status it went to, or None for a
    row holding a value written by hand, left as it is."""
    (job_id, epoch, worker, expires, effect, attempts, max_attempts, deadline, cancel) = row
    if type(expires) is not int or type(attempts) is not int or type(worker) is not str:
        return None
    if as_bool(cancel):
        to_status, why = "cancelled", "cancelled while running"
    elif as_bool(effect):
        to_status, why = "unknown", "an external effect had started"
    elif attempts >= max_attempts:
        to_status, why = "dead", f"all {max_attempts} attempts used"
    elif deadline is not None and deadline <= now:
        to_status, why = "dead", "deadline passed"
    else:
        to_status, why = "waiting", None
    error = (f"lease expired at {iso(expires)} (worker {worker}, epoch {epoch})"
             if to_status != "cancelled" else None)
    detail = {"expired_at": iso(expires), "attempt": attempts}
    if why:
        detail["because"] = why
    end_running(ctx, conn, job_id, epoch, now, to_status, "lease_expired", worker,
                error=error, detail=detail)
    return to_status
