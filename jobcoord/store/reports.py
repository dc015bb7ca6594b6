"""The read-only reports' statements (the dashboard's pages, /metrics), built from the Core
tables like `statements.py`, and the counters a refused claim and a metrics fold write.

Each one is cheap at any size: the counts come from `job_counts` (kept by triggers, revision
c0004), the queue age from one index seek per (tenant, kind), the last hour from a range of
`ix_jobs_finished_at`, a jobs page from an index in job id order and a count that stops at
a cap. tests/test_report_plans.py checks the plans on both databases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select, text, update

from ..schema import (
    ENTERED_DEAD_OR_UNKNOWN,
    artifacts,
    claim_refusals,
    job_counts,
    job_events,
    jobs,
    leases,
    metric_folds,
    tokens,
    workers,
)
from .statements import ONE, SQL, ZERO, P, const

J, E, L = jobs.c, job_events.c, leases.c
JC, CR, MF, T = job_counts.c, claim_refusals.c, metric_folds.c, tokens.c

# --- counts ---------------------------------------------------------------------------------

#: Jobs by (tenant, status, kind, attempts): the sum over the shards of each key.
JOB_COUNTS = SQL(
    select(JC.tenant, JC.status, JC.kind, JC.attempts, func.sum(JC.n))
    .group_by(JC.tenant, JC.status, JC.kind, JC.attempts))


def _oldest_waiting(scoped: bool) -> SQL:
    """(tenant, kind, oldest created_at, waiting) per (tenant, kind) that has waiting jobs:
    the keys come from the counts, each oldest time from one seek of ix_jobs_waiting_age."""
    where = [JC.status == const("waiting")]
    if scoped:
        where.append(JC.tenant == P("tenant"))
    keys = (select(JC.tenant, JC.kind, func.sum(JC.n).label("waiting")).where(*where)
            .group_by(JC.tenant, JC.kind).having(func.sum(JC.n) > ZERO).subquery("keys"))
    j = jobs.alias("j")
    oldest = (select(func.min(j.c.created_at))
              .where(j.c.status == const("waiting"), j.c.tenant == keys.c.tenant,
                     j.c.kind == keys.c.kind).scalar_subquery())
    return SQL(select(keys.c.tenant, keys.c.kind, oldest, keys.c.waiting))


OLDEST_WAITING = _oldest_waiting(False)
OLDEST_WAITING_OF = _oldest_waiting(True)
#: The statuses a job has a finished_at in.
ENDED = [const(s) for s in ("cancelled", "dead", "succeeded", "unknown")]
#: Jobs finished since :since, by status (one range of ix_jobs_finished_at per status, no
#: job row read).
FINISHED_SINCE = SQL(select(J.status, func.count())
                     .where(J.status.in_(ENDED), J.finished_at >= P("since"))
                     .group_by(J.status))
FINISHED_SINCE_OF = SQL(select(J.status, func.count())
                        .where(J.status.in_(ENDED), J.finished_at >= P("since"),
                               J.tenant == P("tenant"))
                        .group_by(J.status))
#: Leases reaped, by where the job went (the partial index ix_job_events_lease_expired).
LEASE_EXPIRIES = SQL(select(E.to_status, func.count())
                     .where(E.reason == const("lease_expired")).group_by(E.to_status))
#: Transitions into dead or unknown, by status (the partial ix_job_events_dead_unknown,
#: whose predicate the statement repeats word for word so SQLite matches it).
ENTERED = SQL(select(E.to_status, func.count()).where(text(ENTERED_DEAD_OR_UNKNOWN))
              .group_by(E.to_status))
CLAIM_REFUSALS = SQL(select(CR.reason, func.sum(CR.n)).group_by(CR.reason))
LEASES_BY_WORKER = SQL(select(L.worker_id, func.count()).group_by(L.worker_id))
WORKER_BEATS = SQL(select(workers.c.worker_id, workers.c.heartbeat_at, workers.c.last_refusal)
                   .order_by(workers.c.worker_id))
#: Artifact rows and bytes by state (the optional artifacts tables).
ARTIFACTS_BY_STATE = SQL(
    select(artifacts.c.state, func.count(), func.coalesce(func.sum(artifacts.c.size), ZERO))
    .group_by(artifacts.c.state))

# --- durable folds of the events (metrics) ------------------------------------------------

FOLD = SQL(select(MF.last_event_id, MF.state_json).where(MF.name == P("name")))
#: Completed events after :cursor, oldest first (a range of the primary key), with their
#: job's provenance read by primary key per event: a join would let the planner choose to
#: read every job.
COMPLETED_AFTER = SQL(
    select(E.event_id, E.at,
           select(J.provenance_json).where(J.job_id == E.job_id).scalar_subquery())
    .where(E.reason == const("completed"), E.event_id > P("cursor"))
    .order_by(E.event_id).limit(const(5000)))
ADVANCE_FOLD = SQL(
    update(metric_folds).where(MF.name == P("name"), MF.last_event_id == P("old"))
    .values(last_event_id=P("cursor"), state_json=P("state"), updated_at=P("now")))
START_FOLD = SQL(lambda insert: (
    insert(metric_folds).values(name=P("name"), last_event_id=P("cursor"),
                                state_json=P("state"), updated_at=P("now"))
    .on_conflict_do_nothing(index_elements=[MF.name])))

# --- the dashboard's pages ------------------------------------------------------------------

TOKEN_BY_HASH = SQL(select(T.name, T.role, T.tenant, T.revoked_at, T.token_hash)
                    .where(T.token_hash == P("hash")))
#: Rows of one jobs page.
PAGE_COLUMNS = (J.job_id, J.tenant, J.kind, J.priority, J.status, J.attempts,
                J.max_attempts, J.created_at, J.updated_at)
#: The jobs page's filters: (column, parameter name).
FILTERS = (("status", "status"), ("kind", "kind"), ("tenant", "tenant"),
           ("priority", "priority"), ("idempotency_key", "key"))
_PAGES: dict[tuple[Any, ...], tuple[SQL, SQL]] = {}


def jobs_page(f: Mapping[str, Any], limit: int, cap: int) -> tuple[SQL, SQL]:
    """The page select (newest first, keyset `job_id < :before`, no OFFSET) and the capped
    count for the filters set in `f`, built once per combination of filters."""
    shape = (tuple(f[name] is not None for _col, name in FILTERS), f["before"] is not None,
             limit, cap)
    got = _PAGES.get(shape)
    if got is None:
        where = [J[col] == P(name) for col, name in FILTERS if f[name] is not None]
        page_where = [*where, J.job_id < P("before")] if f["before"] is not None else where
        page = SQL(select(*PAGE_COLUMNS).where(*page_where)
                   .order_by(J.job_id.desc()).limit(const(limit)))
        capped = (select(ONE).select_from(jobs).where(*where).limit(const(cap))
                  .subquery("capped"))
        count = SQL(select(func.count()).select_from(capped))
        got = _PAGES[shape] = (page, count)
    return got


def _by_status(status: str, scoped: bool) -> SQL:
    where = [J.status == const(status)]
    if scoped:
        where.append(J.tenant == P("tenant"))
    return SQL(select(J.job_id, J.tenant, J.kind, J.attempts, J.last_error, J.updated_at)
               .where(*where).order_by(J.job_id.desc()).limit(const(200)))


#: The newest 200 jobs in `unknown` / `dead` (the needs-attention page), all or of :tenant.
ATTENTION = {(status, scoped): _by_status(status, scoped)
             for status in ("unknown", "dead") for scoped in (False, True)}
LEASES = {scoped: SQL(
    select(L.worker_id, L.job_id, L.epoch, L.expires_at, J.kind)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(*([J.tenant == P("tenant")] if scoped else [])).order_by(L.job_id))
    for scoped in (False, True)}
