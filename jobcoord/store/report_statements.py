"""The read-only reports' statements -- `check`'s invariants, `/metrics`, the dashboard's
pages, the server's health and wake-up reads, `restore`'s and `transfer`'s counts -- built
from `schema.py`'s tables like the core's (kept apart so a plain claim or complete never
builds them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, exists, func, select

from ..schema import artifacts, job_events, jobs, leases, workers
from .statements import SQL, const

P = bindparam
J, L, E, W, A = jobs.c, leases.c, job_events.c, workers.c, artifacts.c
ONE = const(1)

# --- check: the application invariants -----------------------------------------------------

_E2 = job_events.alias("e2")
_LATEST_EVENT = (select(func.max(_E2.c.event_id)).where(_E2.c.job_id == J.job_id)
                 .correlate(jobs).scalar_subquery())
#: Each invariant is a query returning (at most 20 of) the offending job ids: zero rows when
#: it holds.
INVARIANTS: tuple[tuple[str, SQL], ...] = tuple((name, SQL(stmt.limit(const(20))))
                                                for name, stmt in (
    ("running_without_lease",
     select(J.job_id).select_from(jobs.outerjoin(leases, L.job_id == J.job_id))
     .where(J.status == const("running"), L.job_id.is_(None))),
    ("lease_on_job_not_running",
     select(L.job_id).select_from(leases.join(jobs, J.job_id == L.job_id))
     .where(J.status != const("running"))),
    ("lease_epoch_differs_from_job",
     select(L.job_id).select_from(leases.join(jobs, J.job_id == L.job_id))
     .where(L.epoch != J.epoch)),
    ("succeeded_without_result",
     select(J.job_id).where(J.status == const("succeeded"), J.result_json.is_(None))),
    ("latest_event_differs_from_status",
     select(J.job_id).select_from(jobs.join(job_events, E.event_id == _LATEST_EVENT))
     .where(E.to_status != J.status)),
    ("job_without_events",
     select(J.job_id).where(~exists(select(ONE).select_from(job_events)
                                    .where(E.job_id == J.job_id)))),
    ("attempts_out_of_range",
     select(J.job_id).where(J.attempts > J.max_attempts, J.status != const("waiting"))),
))

# --- counts ---------------------------------------------------------------------------------

JOBS_BY_STATUS = SQL(select(J.status, func.count()).group_by(J.status))
#: Leases still live at :now: how many, and the latest expiry.
LIVE_LEASES = SQL(select(func.count(), func.max(L.expires_at)).where(L.expires_at > P("now")))

# --- the server -----------------------------------------------------------------------------

ALIVE = SQL(select(ONE))
#: Is any waiting job due at :now? (a hint that wakes long-polls)
DUE_JOB = SQL(select(ONE).where(J.status == const("waiting"), J.run_after <= P("now"))
              .limit(ONE))

# --- /metrics -------------------------------------------------------------------------------

_COMPLETED = E.reason == const("completed")
COMPLETED_AFTER = SQL(select(func.count()).where(E.event_id > P("cursor"), _COMPLETED))
COMPLETED_PAGE = SQL(
    select(E.event_id, E.at, J.provenance_json)
    .select_from(job_events.join(jobs, J.job_id == E.job_id))
    .where(_COMPLETED, E.event_id > P("cursor")).order_by(E.event_id).limit(P("n")))
JOBS_BY_STATUS_KIND_ATTEMPTS = SQL(
    select(J.status, J.kind, J.attempts, func.count()).group_by(J.status, J.kind, J.attempts))
OLDEST_WAITING_BY_KIND = SQL(select(J.kind, func.min(J.created_at))
                             .where(J.status == const("waiting")).group_by(J.kind))
EXPIRED_AND_COMPLETED = SQL(
    select(E.reason, E.to_status, func.count())
    .where(E.reason.in_([const("lease_expired"), const("completed")]))
    .group_by(E.reason, E.to_status))
WORKER_STATES = SQL(select(W.worker_id, W.heartbeat_at, W.last_refusal).order_by(W.worker_id))
LEASES_BY_WORKER = SQL(select(L.worker_id, func.count()).group_by(L.worker_id))
ARTIFACTS_BY_STATE = SQL(select(A.state, func.count(), func.coalesce(func.sum(A.size), const(0)))
                         .group_by(A.state))

# --- the dashboard (each with and without a tenant :tenant) ---------------------------------


def _scoped(build: Any) -> tuple[SQL, SQL]:
    """(for every tenant, for the tenant :tenant)."""
    return SQL(build(())), SQL(build((J.tenant == P("tenant"),)))


OVERVIEW_COUNTS = _scoped(lambda w: select(J.status, J.kind, func.count()).where(*w)
                          .group_by(J.status, J.kind))
OVERVIEW_OLDEST = _scoped(lambda w: select(J.kind, func.min(J.created_at), func.count())
                          .where(J.status == const("waiting"), *w).group_by(J.kind))
OVERVIEW_RECENT = _scoped(lambda w: select(J.status, func.count())
                          .where(J.finished_at >= P("since"), *w).group_by(J.status))
LEASE_LIST = _scoped(lambda w: select(L.worker_id, L.job_id, L.epoch, L.expires_at, J.kind)
                     .select_from(leases.join(jobs, J.job_id == L.job_id)).where(*w)
                     .order_by(L.job_id))
_ATTENTION_COLUMNS = (J.job_id, J.tenant, J.kind, J.attempts, J.last_error, J.updated_at)
UNKNOWN_JOBS = _scoped(lambda w: select(*_ATTENTION_COLUMNS)
                       .where(J.status == const("unknown"), *w)
                       .order_by(J.job_id.desc()).limit(const(200)))
DEAD_JOBS = _scoped(lambda w: select(*_ATTENTION_COLUMNS).where(J.status == const("dead"), *w)
                    .order_by(J.job_id.desc()).limit(const(200)))

#: The jobs page's filters: (column, parameter) in the order they are written.
JOB_FILTERS = (("status", "status"), ("kind", "kind"), ("tenant", "tenant"),
               ("priority", "priority"), ("idempotency_key", "key"))
_JOB_PAGES: dict[tuple[tuple[str, ...], bool], tuple[SQL, SQL]] = {}


def job_page(filters: tuple[str, ...], before: bool) -> tuple[SQL, SQL]:
    """The jobs page for these filters (parameter names of JOB_FILTERS): one page newest
    first by keyset (:before, :limit), and the matches counted no further than :cap; one
    pair per shape."""
    shape = (filters, before)
    pair = _JOB_PAGES.get(shape)
    if pair is None:
        columns = dict((param, col) for col, param in JOB_FILTERS)
        where = [jobs.c[columns[name]] == P(name) for name in filters]
        page_where = [*where, J.job_id < P("before")] if before else where
        page = SQL(select(J.job_id, J.tenant, J.kind, J.priority, J.status, J.attempts,
                          J.max_attempts, J.created_at, J.updated_at).where(*page_where)
                   .order_by(J.job_id.desc()).limit(P("limit")))
        capped = select(ONE).select_from(jobs).where(*where).limit(P("cap")).subquery("capped")
        count = SQL(select(func.count()).select_from(capped))
        pair = _JOB_PAGES[shape] = (page, count)
    return pair
