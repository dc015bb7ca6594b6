"""Reads: jobs, show, an attempt's event, workers, explain and status, as plain rows and
numbers (present.py gives them their JSON shapes)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from .. import schema, stored
from .. import validate as v
from ..clock import now_us
from ..errors import InvalidInput, JobcoordError
from ..states import STATUSES
from ..store import query_statements as qs
from ..store import statements as sql
from . import limits as limit_rules
from .admin import load_job
from .common import Context, fenced_args
from .fencing import failure_parts, recorded_failure
from .workers import worker_gate, worker_rows


def jobs(ctx: Context, *, status: str | None = None, kind: str | None = None,
         tenant: str | None = None, limit: int = 100) -> list[Any]:
    """Jobs, newest first: their summary columns."""
    if status is not None and status not in STATUSES:
        raise InvalidInput("invalid_input", f"status must be one of {', '.join(STATUSES)}")
    kind = v.optional_name(kind, "kind")
    tenant = v.optional_name(tenant, "tenant")
    limit = v.whole(limit, "limit", 1, 10_000)
    stmt = qs.job_list(status is not None, kind is not None, tenant is not None)
    params = {"status": status, "kind": kind, "tenant": tenant, "limit": limit}

    found = ctx.db.read(lambda conn: [dict(zip(qs.JOB_SUMMARY_NAMES, r, strict=True))
                                      for r in ctx.db.run(conn, stmt, params)], "jobs")
    for job in found:  # judged after the read transaction ended: no work inside it
        stored.row(schema.jobs, job, f"job {job['job_id']}")
    return found


def show(ctx: Context, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
    """A job's row with its lease, every event, checkpoints and artifact rows."""
    job_id = v.whole(job_id, "job_id", 1, 2**62)
    tenant = v.optional_name(tenant, "tenant")

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        job = load_job(ctx, conn, job_id, tenant)
        if isinstance(job, JobcoordError):
            return job
        stored.row(schema.jobs, job, f"job {job_id}")  # rendered and compared below
        of_job = {"job_id": job_id}
        lease = ctx.db.run(conn, qs.LEASE_OF, of_job).first()
        _judge_lease(lease, ("worker_id", "epoch", "granted_at", "expires_at"), job_id)
        events = ctx.db.run(conn, qs.EVENTS_OF, of_job).all()
        checkpoints = ctx.db.run(conn, sql.CHECKPOINTS, of_job).all()
        artifacts: list[Any] = []
        if "artifacts" in ctx.features:
            artifacts = ctx.db.run(conn, qs.ARTIFACTS_OF, of_job).all()
        return {"job": job, "lease": lease, "events": events, "checkpoints": checkpoints,
                "artifacts": artifacts}

    return ctx.db.read(_do, "show")


def event_by(ctx: Context, job_id: int, worker_id: str, epoch: int, reason: str, *,
             tenant: str | None = None) -> bool:
    """Whether `worker_id`'s event `reason` ("claimed", "completed", ...) at `epoch` is among
    the events of `job_id` (a job of `tenant` only, when given): one read of that job's
    events through their index, none of them handed back. No such job has none."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch, tenant)
    reason = v.name(reason, "reason")
    stmt = qs.event_by(tenant is not None)
    params = {"job_id": job_id, "worker": worker_id, "epoch": epoch, "reason": reason,
              "tenant": tenant}
    return ctx.db.read(lambda conn: ctx.db.run(conn, stmt, params).first() is not None,
                       "event_by")


def failure_by(ctx: Context, job_id: int, worker_id: str, epoch: int, reason: str,
               error: str, *, permanent: bool = False, tenant: str | None = None
               ) -> dict[str, Any] | None:
    """The failure `worker_id` reported for `job_id` at `epoch` (with `reason`, `error` and
    `permanent`), when it was the one recorded (a job of `tenant` only, when given):
    {"status": where it took the job, "attempt"}; else None (`fencing.recorded_failure`)."""
    f = failure_parts(job_id, worker_id, epoch, error, permanent=permanent, reason=reason,
                      tenant=tenant)
    return ctx.db.read(lambda conn: recorded_failure(ctx, conn, f), "failure_by")


def workers(ctx: Context) -> list[tuple[dict[str, Any], Any, float | None]]:
    """Every worker's row, with its gate decision now and its heartbeat's age."""
    now = now_us()
    rows = ctx.db.read(lambda conn: worker_rows(ctx, conn), "workers")
    return [(w, *worker_gate(ctx, w, now)) for w in rows]


def explain(ctx: Context, job_id: int, *, tenant: str | None = None
            ) -> tuple[dict[str, Any], int | None, Any, list[dict[str, Any]], int]:
    """What a diagnosis of the job needs, read in one snapshot: the job, how many jobs are
    ahead of it in the claim order (when waiting), its lease, every worker, and the time."""
    job_id = v.whole(job_id, "job_id", 1, 2**62)
    tenant = v.optional_name(tenant, "tenant")
    now = now_us()

    def _do(conn: Connection) -> Any:
        job = load_job(ctx, conn, job_id, tenant)
        if isinstance(job, JobcoordError):
            return job
        stored.row(schema.jobs, job, f"job {job_id}")  # rendered and compared below
        ahead = None
        if job["status"] == "waiting":
            role = job["required_role"]
            # A tenant-scoped caller is told about its own tenant's queue only.
            stmt = qs.jobs_ahead(role is not None, tenant is not None)
            ahead = ctx.db.run(conn, stmt, {
                "role": role, "p": job["priority"], "c": job["created_at"], "job_id": job_id,
                "tenant": tenant}).scalar_one()
            job["constraints"] = limit_rules.diagnose(ctx, conn, job, now, tenant)
        lease = ctx.db.run(conn, qs.LEASE_EXPIRY_OF, {"job_id": job_id}).first()
        _judge_lease(lease, ("worker_id", "epoch", "expires_at"), job_id)
        return job, ahead, lease, worker_rows(ctx, conn)

    job, ahead, lease, rows = ctx.db.read(_do, "explain")
    return job, ahead, lease, rows, now


def status(ctx: Context, *, tenant: str | None = None) -> dict[str, Any]:
    """Counts by status, workers, active leases, schema and storage facts. With a tenant,
    the job and lease counts are that tenant's only."""
    from ..migrate import current_revisions

    tenant = v.optional_name(tenant, "tenant")

    def _do(conn: Connection) -> dict[str, Any]:
        counts = dict.fromkeys(STATUSES, 0)
        by_status, held = qs.status_counts(tenant is not None)
        scope = {"tenant": tenant}
        for st, n in ctx.db.run(conn, by_status, scope).all():
            counts[st] = n
        leased, expired = ctx.db.run(conn, held, {**scope, "now": now_us()}).one()
        out: dict[str, Any] = {
            "workers": ctx.db.run(conn, qs.WORKER_COUNT).scalar_one(),
            # Expired ones are counted too: a lease is held until the reaper ends it.
            "active_leases": leased, "expired_leases": int(expired), "jobs": counts,
            "tenant": tenant, "revisions": sorted(current_revisions(ctx.db, conn)),
            "features": sorted(ctx.features)}
        out.update(ctx.db.storage_facts(conn))  # the database's name first, then its facts
        return out

    out = ctx.db.read(_do, "status")
    out.update(ctx.db.file_facts())
    return out


def _judge_lease(lease: Any, names: tuple[str, ...], job_id: int) -> None:
    """A job's lease row (its columns `names`, or None) through the typed read boundary: a
    value written by hand is exit 7 naming it, before it is rendered."""
    if lease is not None:
        stored.row(schema.leases, zip(names, lease, strict=True), f"job {job_id}'s lease")
