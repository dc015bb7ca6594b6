"""The statements of the core's reads -- jobs, show, explain, status, a job's whole row, and
whether one attempt's event was recorded -- built from `schema.py`'s tables like every other,
one per shape of filters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import case, func, select, text

from ..schema import TENANT_ROLE, TENANTED, artifacts, job_events, jobs, leases, workers
from .statements import ONE, SQL, WAITING, P, const

J, L, E, A = jobs.c, leases.c, job_events.c, artifacts.c

#: A job's whole row (:job_id), and the names of its columns in that order.
JOB_ROW = SQL(select(jobs).where(J.job_id == P("job_id")))
JOB_COLUMNS = tuple(jobs.columns.keys())

#: The columns `jobs` lists, in this order.
JOB_SUMMARY_COLUMNS = (J.job_id, J.tenant, J.kind, J.required_role, J.priority, J.status,
                       J.attempts, J.max_attempts, J.epoch, J.created_at, J.updated_at,
                       J.run_after)
JOB_SUMMARY_NAMES = tuple(c.name for c in JOB_SUMMARY_COLUMNS)

LEASE_OF = SQL(select(L.worker_id, L.epoch, L.granted_at, L.expires_at)
               .where(L.job_id == P("job_id")))
LEASE_EXPIRY_OF = SQL(select(L.worker_id, L.epoch, L.expires_at).where(L.job_id == P("job_id")))
EVENTS_OF = SQL(select(E.event_id, E.at, E.from_status, E.to_status, E.reason, E.worker_id,
                       E.epoch, E.detail).where(E.job_id == P("job_id")).order_by(E.event_id))
#: One event (:event_id): its job, time, reason, worker, epoch and detail.
EVENT_ROW = SQL(select(E.job_id, E.at, E.reason, E.worker_id, E.epoch, E.detail)
                .where(E.event_id == P("event_id")))
#: A row when job :job_id has an event recorded after :event_id.
EVENT_AFTER = SQL(select(E.event_id).where(E.job_id == P("job_id"), E.event_id > P("event_id"))
                  .limit(ONE))
#: What a claim's answer says of job :job_id (`core.claim.answer`'s columns), then its status.
CLAIM_ANSWER_ROW = SQL(select(J.job_id, J.kind, J.priority, J.payload_json, J.attempts,
                              J.max_attempts, J.epoch, J.tenant, J.status)
                       .where(J.job_id == P("job_id")))
ARTIFACTS_OF = SQL(select(A.name, A.location, A.digest, A.size, A.media_type, A.state, A.epoch)
                   .where(A.job_id == P("job_id")).order_by(A.name, A.epoch))
WORKER_COUNT = SQL(select(func.count()).select_from(workers))

_SHAPES: dict[tuple[Any, ...], SQL] = {}


def _shaped(key: tuple[Any, ...], build: Callable[[], Any]) -> SQL:
    stmt = _SHAPES.get(key)
    if stmt is None:
        stmt = _SHAPES[key] = SQL(build())
    return stmt


def job_list(by_status: bool, by_kind: bool, by_tenant: bool) -> SQL:
    """Jobs newest first, at most :limit, of :status, :kind, :tenant when asked."""
    def build() -> Any:
        where = [col == P(name) for col, name, on in (
            (J.status, "status", by_status), (J.kind, "kind", by_kind),
            (J.tenant, "tenant", by_tenant)) if on]
        return (select(*JOB_SUMMARY_COLUMNS).where(*where).order_by(J.job_id.desc())
                .limit(P("limit")))
    return _shaped(("list", by_status, by_kind, by_tenant), build)


def jobs_ahead(role: bool, by_tenant: bool) -> SQL:
    """How many waiting jobs come before (:p, :c, :job_id) in claim order, of the role :role
    (or of no role), of :tenant when asked: then counted from the tenant's slice of a tenant
    claim index, spelled as it spells its key and predicate, not past every other tenant's
    jobs; the default tenant's jobs, not in those indexes, from the role's claim index (a
    count that for any other tenant does not run)."""
    def build() -> Any:
        by_role = J.required_role == P("role") if role else J.required_role.is_(None)
        ahead = [WAITING, (J.priority < P("p")) | ((J.priority == P("p")) & (
            (J.created_at < P("c")) | ((J.created_at == P("c")) & (J.job_id < P("job_id")))))]
        if not by_tenant:
            return select(func.count()).select_from(jobs).where(by_role, *ahead)
        tenanted = select(func.count()).select_from(jobs).where(
            J.tenant == P("tenant"), text(TENANTED),
            TENANT_ROLE == (P("role") if role else const("")),  # noqa: SIM300
            *ahead).scalar_subquery()
        default = select(func.count()).select_from(jobs).where(
            P("tenant") == const("default"), by_role,
            J.tenant.concat(const("")) == P("tenant"), *ahead).scalar_subquery()
        return select(tenanted + default)
    return _shaped(("ahead", role, by_tenant), build)


def status_counts(by_tenant: bool) -> tuple[SQL, SQL]:
    """(jobs by status, (leases held, of them expired at :now)), of :tenant when asked."""
    def by_status() -> Any:
        query = select(J.status, func.count()).group_by(J.status)
        return query.where(J.tenant == P("tenant")) if by_tenant else query

    def held() -> Any:
        expired = func.coalesce(func.sum(case((L.expires_at <= P("now"), const(1)),
                                              else_=const(0))), const(0))
        query = select(func.count(), expired).select_from(
            leases.join(jobs, J.job_id == L.job_id))
        return query.where(J.tenant == P("tenant")) if by_tenant else query
    return (_shaped(("by_status", by_tenant), by_status), _shaped(("held", by_tenant), held))


def event_by(by_tenant: bool) -> SQL:
    """A row when the event :reason of :worker at :epoch was recorded on job :job_id (of
    :tenant when asked), else none: found among that job's events through
    ix_job_events_job_id_event_id, none of them handed back."""
    def build() -> Any:
        query = select(E.event_id).where(
            E.job_id == P("job_id"), E.reason == P("reason"), E.epoch == P("epoch"),
            E.worker_id == P("worker"))
        if by_tenant:
            query = query.join_from(job_events, jobs, J.job_id == E.job_id).where(
                J.tenant == P("tenant"))
        return query.limit(ONE)
    return _shaped(("event_by", by_tenant), build)


def ends_by(by_tenant: bool) -> SQL:
    """The status and detail of each end of job :job_id's running attempt at :epoch that
    :worker recorded with the event :reason (of :tenant when asked): read through
    ix_job_events_job_id_event_id, in the order recorded."""
    def build() -> Any:
        query = select(E.to_status, E.detail).where(
            E.job_id == P("job_id"), E.reason == P("reason"), E.epoch == P("epoch"),
            E.worker_id == P("worker"), E.from_status == const("running"))
        if by_tenant:
            query = query.join_from(job_events, jobs, J.job_id == E.job_id).where(
                J.tenant == P("tenant"))
        return query.order_by(E.event_id)
    return _shaped(("ends_by", by_tenant), build)
