"""Reads: jobs, show, workers, explain and status, as plain rows and numbers (present.py
gives them their JSON shapes)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import now_us
from ..errors import InvalidInput, JobcoordError
from ..states import STATUSES
from ..store import statements as sql
from . import limits as limit_rules
from .admin import load_job
from .common import Context
from .workers import worker_gate, worker_rows


@functools.cache
def _tables() -> tuple[Any, Any, Any, Any, Any]:
    """The jobs, leases, job_events, artifacts and workers tables (Core: no ORM to import)."""
    from .. import schema

    return schema.jobs, schema.leases, schema.job_events, schema.artifacts, schema.workers


def jobs(ctx: Context, *, status: str | None = None, kind: str | None = None,
         tenant: str | None = None, limit: int = 100) -> list[Any]:
    """Jobs, newest first: their summary columns."""
    J, _, _, _, _ = _tables()
    if status is not None and status not in STATUSES:
        raise InvalidInput("invalid_input", f"status must be one of {', '.join(STATUSES)}")
    kind = v.optional_name(kind, "kind")
    tenant = v.optional_name(tenant, "tenant")
    limit = v.whole(limit, "limit", 1, 10_000)
    query = select(J.c.job_id, J.c.tenant, J.c.kind, J.c.required_role, J.c.priority,
                   J.c.status, J.c.attempts, J.c.max_attempts, J.c.epoch, J.c.created_at,
                   J.c.updated_at, J.c.run_after)
    for col, val in ((J.c.status, status), (J.c.kind, kind), (J.c.tenant, tenant)):
        if val is not None:
            query = query.where(col == val)
    query = query.order_by(J.c.job_id.desc()).limit(limit)
    return ctx.db.read(lambda conn: [r._mapping for r in conn.execute(query)], "jobs")


def show(ctx: Context, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
    """A job's row with its lease, every event, checkpoints and artifact rows."""
    _, L, E, A, _ = _tables()
    job_id = v.whole(job_id, "job_id", 1, 2**62)
    tenant = v.optional_name(tenant, "tenant")

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        job = load_job(ctx, conn, job_id, tenant)
        if isinstance(job, JobcoordError):
            return job
        lease = conn.execute(select(L.c.worker_id, L.c.epoch, L.c.granted_at, L.c.expires_at)
                             .where(L.c.job_id == job_id)).first()
        events = conn.execute(select(E.c.event_id, E.c.at, E.c.from_status, E.c.to_status,
                                     E.c.reason, E.c.worker_id, E.c.epoch, E.c.detail)
                              .where(E.c.job_id == job_id).order_by(E.c.event_id)).all()
        checkpoints = ctx.db.run(conn, sql.CHECKPOINTS, {"job_id": job_id}).all()
        artifacts: list[Any] = []
        if "artifacts" in ctx.features:
            artifacts = conn.execute(select(A.c.name, A.c.location, A.c.digest, A.c.size,
                                            A.c.media_type, A.c.state, A.c.epoch)
                                     .where(A.c.job_id == job_id)
                                     .order_by(A.c.name, A.c.epoch)).all()
        return {"job": job, "lease": lease, "events": events, "checkpoints": checkpoints,
                "artifacts": artifacts}

    return ctx.db.read(_do, "show")


def workers(ctx: Context) -> list[tuple[dict[str, Any], Any, float | None]]:
    """Every worker's row, with its gate decision now and its heartbeat's age."""
    now = now_us()
    rows = ctx.db.read(lambda conn: worker_rows(ctx, conn), "workers")
    return [(w, *worker_gate(ctx, w, now)) for w in rows]


def explain(ctx: Context, job_id: int, *, tenant: str | None = None
            ) -> tuple[dict[str, Any], int | None, Any, list[dict[str, Any]], int]:
    """What a diagnosis of the job needs, read in one snapshot: the job, how many jobs are
    ahead of it in the claim order (when waiting), its lease, every worker, and the time."""
    J, L, _, _, _ = _tables()
    job_id = v.whole(job_id, "job_id", 1, 2**62)
    tenant = v.optional_name(tenant, "tenant")
    now = now_us()

    def _do(conn: Connection) -> Any:
        job = load_job(ctx, conn, job_id, tenant)
        if isinstance(job, JobcoordError):
            return job
        ahead = None
        if job["status"] == "waiting":
            role = job["required_role"]
            p, c = job["priority"], job["created_at"]
            query = select(func.count()).select_from(J).where(
                J.c.status == "waiting",
                J.c.required_role.is_(None) if role is None else J.c.required_role == role,
                (J.c.priority < p) | ((J.c.priority == p) & (
                    (J.c.created_at < c) | ((J.c.created_at == c) & (J.c.job_id < job_id)))))
            if tenant is not None:
                # A tenant-scoped caller is told about its own tenant's queue only.
                query = query.where(J.c.tenant == tenant)
            ahead = conn.execute(query).scalar_one()
            job["constraints"] = limit_rules.diagnose(ctx, conn, job, now)
        lease = conn.execute(select(L.c.worker_id, L.c.epoch, L.c.expires_at)
                             .where(L.c.job_id == job_id)).first()
        return job, ahead, lease, worker_rows(ctx, conn)

    job, ahead, lease, rows = ctx.db.read(_do, "explain")
    return job, ahead, lease, rows, now


def status(ctx: Context, *, tenant: str | None = None) -> dict[str, Any]:
    """Counts by status, workers, active leases, schema and storage facts. With a tenant,
    the job and lease counts are that tenant's only."""
    J, L, _, _, W = _tables()
    from ..migrate import current_revisions

    tenant = v.optional_name(tenant, "tenant")

    def _do(conn: Connection) -> dict[str, Any]:
        counts = dict.fromkeys(STATUSES, 0)
        by_status = select(J.c.status, func.count()).group_by(J.c.status)
        held = select(func.count()).select_from(L.join(J, J.c.job_id == L.c.job_id))
        if tenant is not None:
            by_status = by_status.where(J.c.tenant == tenant)
            held = held.where(J.c.tenant == tenant)
        for st, n in conn.execute(by_status).all():
            counts[st] = n
        out: dict[str, Any] = {
            "workers": conn.execute(select(func.count()).select_from(W)).scalar_one(),
            "active_leases": conn.execute(held).scalar_one(), "jobs": counts,
            "tenant": tenant, "revisions": sorted(current_revisions(ctx.db, conn)),
            "features": sorted(ctx.features)}
        out.update(ctx.db.storage_facts(conn))  # the database's name first, then its facts
        return out

    out = ctx.db.read(_do, "status")
    out.update(ctx.db.file_facts())
    return out
