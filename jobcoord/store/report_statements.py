"""The read-only reports' statements -- `check`'s invariants, `/metrics`, the dashboard's
pages, the server's health and wake-up reads, `restore`'s and `transfer`'s counts -- built
from `schema.py`'s tables like the core's (kept apart so a plain claim or complete never
builds them)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import bindparam, exists, func, select, text, update

from ..schema import (
    ENTERED_DEAD_OR_UNKNOWN,
    artifacts,
    checkpoints,
    claim_refusals,
    job_counts,
    job_events,
    jobs,
    leases,
    metric_folds,
    schedules,
    workers,
)
from ..states import FINAL_STATUSES
from .schedule_statements import SCHEDULE_COLUMNS
from .statements import MAX_EPOCH, SQL, const

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
    # Prune counts a finished job's age from its finished_at: one without it stays forever.
    ("finished_without_finish_time",
     select(J.job_id).where(J.status.in_([const(s) for s in FINAL_STATUSES]),
                            J.finished_at.is_(None))),
    ("attempts_out_of_range",
     select(J.job_id).where(J.attempts > J.max_attempts, J.status != const("waiting"))),
    # Fencing: every claim gives an epoch above the job's, so the job's epoch is never below
    # one a `claimed` event shows. Set back by hand, the next claim hands out a (job, epoch)
    # a second time. Refusal events carry their caller's epoch, any number: not looked at.
    ("epoch_behind_claims",
     select(J.job_id).where(exists(select(ONE).select_from(job_events).where(
         E.job_id == J.job_id, E.reason == const("claimed"), E.epoch > J.epoch)))),
    # Past what PostgreSQL's column keeps (SQLite keeps any integer), or at it on a waiting
    # job, whose next claim cannot add one: the claim sets such a job aside as dead.
    ("epoch_out_of_range",
     select(J.job_id).where((J.epoch > const(MAX_EPOCH))
                            | ((J.epoch >= const(MAX_EPOCH)) & (J.status == const("waiting"))))),
))



@functools.cache
def job_json_rows(columns: tuple[str, ...]) -> SQL:
    """Every job's id and its stored JSON `columns` (those its revision has), for `check`."""
    return SQL(select(J.job_id, *(J[c] for c in columns)).order_by(J.job_id))


#: A job's stored JSON kept in other tables (checkpoints' data, events' details), for
#: `check`.
CHECKPOINT_JSON_ROWS = SQL(select(checkpoints.c.job_id, checkpoints.c.data_json)
                           .order_by(checkpoints.c.job_id))
EVENT_DETAIL_ROWS = SQL(select(E.job_id, E.detail).where(E.detail.is_not(None))
                        .order_by(E.event_id))
#: Every worker's stored JSON columns, for `check`.
WORKER_JSON_ROWS = SQL(select(W.worker_id, W.roles_json, W.kinds_json, W.heartbeat_raw)
                       .order_by(W.worker_id))


# --- counts ---------------------------------------------------------------------------------

JOBS_BY_STATUS = SQL(select(J.status, func.count()).group_by(J.status))
#: Jobs by the key of job_counts, counted from the table itself (for `check`).
JOBS_BY_COUNT_KEY = SQL(select(J.tenant, J.status, J.kind, J.attempts, func.count())
                        .group_by(J.tenant, J.status, J.kind, J.attempts))
#: Leases still live at :now: how many, and the latest expiry.
LIVE_LEASES = SQL(select(func.count(), func.max(L.expires_at)).where(L.expires_at > P("now")))

# --- the server -----------------------------------------------------------------------------

ALIVE = SQL(select(ONE))
#: Is any waiting job due at :now? (a hint that wakes long-polls)
DUE_JOB = SQL(select(ONE).where(J.status == const("waiting"), J.run_after <= P("now"))
              .limit(ONE))

# --- counts kept by the database (core revision c0004) --------------------------------------

JC, CR, MF = job_counts.c, claim_refusals.c, metric_folds.c

#: What `check` reads of every schedule to see that its stored row can still be used.
SCHEDULE_ROWS = SQL(select(*SCHEDULE_COLUMNS).order_by(schedules.c.name))

#: Jobs by (tenant, status, kind, attempts): the sum over the shards of each key.
JOB_COUNTS = SQL(
    select(JC.tenant, JC.status, JC.kind, JC.attempts, func.sum(JC.n))
    .group_by(JC.tenant, JC.status, JC.kind, JC.attempts))
#: The columns of JOB_COUNTS's rows but the last (a sum), by name.
JOB_COUNT_KEY = ("tenant", "status", "kind", "attempts")


def _oldest_waiting(scoped: bool) -> SQL:
    """(tenant, kind, oldest created_at, waiting) per (tenant, kind) that has waiting jobs:
    the keys come from the counts, each oldest time from one seek of ix_jobs_waiting_age."""
    where = [JC.status == const("waiting")]
    if scoped:
        where.append(JC.tenant == P("tenant"))
    keys = (select(JC.tenant, JC.kind, func.sum(JC.n).label("waiting")).where(*where)
            .group_by(JC.tenant, JC.kind).having(func.sum(JC.n) > const(0)).subquery("keys"))
    j = jobs.alias("j")
    oldest = (select(func.min(j.c.created_at))
              .where(j.c.status == const("waiting"), j.c.tenant == keys.c.tenant,
                     j.c.kind == keys.c.kind).scalar_subquery())
    return SQL(select(keys.c.tenant, keys.c.kind, oldest, keys.c.waiting))


#: The queue age per (tenant, kind): of every tenant, of the tenant :tenant.
OLDEST_WAITING = _oldest_waiting(False)
OLDEST_WAITING_OF = _oldest_waiting(True)
#: The statuses a job has a finished_at in.
_ENDED = [const(s) for s in ("cancelled", "dead", "succeeded", "unknown")]
#: Jobs finished since :since, by status (one range of ix_jobs_finished_at per status, no
#: job row read); and of the tenant :tenant.
FINISHED_SINCE = SQL(select(J.status, func.count())
                     .where(J.status.in_(_ENDED), J.finished_at >= P("since"))
                     .group_by(J.status))
FINISHED_SINCE_OF = SQL(select(J.status, func.count())
                        .where(J.status.in_(_ENDED), J.finished_at >= P("since"),
                               J.tenant == P("tenant"))
                        .group_by(J.status))

# --- /metrics -------------------------------------------------------------------------------

#: Leases reaped, by where the job went (the partial index ix_job_events_lease_expired).
LEASE_EXPIRIES = SQL(select(E.to_status, func.count())
                     .where(E.reason == const("lease_expired")).group_by(E.to_status))
#: Transitions into dead or unknown, by status (the partial ix_job_events_dead_unknown,
#: whose predicate the statement repeats word for word so SQLite matches it).
ENTERED = SQL(select(E.to_status, func.count()).where(text(ENTERED_DEAD_OR_UNKNOWN))
              .group_by(E.to_status))
CLAIM_REFUSALS = SQL(select(CR.reason, func.sum(CR.n)).group_by(CR.reason))
WORKER_STATES = SQL(select(W.worker_id, W.heartbeat_at, W.last_refusal).order_by(W.worker_id))
LEASES_BY_WORKER = SQL(select(L.worker_id, func.count()).group_by(L.worker_id))
ARTIFACTS_BY_STATE = SQL(select(A.state, func.count(), func.coalesce(func.sum(A.size), const(0)))
                         .group_by(A.state))
#: A durable fold of the events (metric_folds) by name.
FOLD = SQL(select(MF.last_event_id, MF.state_json).where(MF.name == P("name")))
#: Completed events after :cursor, oldest first (a range of the primary key), 5000 at a
#: time, with their job's provenance read by primary key per event: a join would let the
#: planner choose to read every job.
COMPLETED_ROWS = SQL(
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

# --- the dashboard (each with and without a tenant :tenant) ---------------------------------


def _scoped(build: Any) -> tuple[SQL, SQL]:
    """(for every tenant, for the tenant :tenant)."""
    return SQL(build(())), SQL(build((J.tenant == P("tenant"),)))


LEASE_LIST = _scoped(lambda w: select(L.worker_id, L.job_id, L.epoch, L.expires_at, J.kind)
                     .select_from(leases.join(jobs, J.job_id == L.job_id)).where(*w)
                     .order_by(L.job_id))
_ATTENTION_COLUMNS = (J.job_id, J.tenant, J.kind, J.attempts, J.last_error, J.updated_at)
#: The needs-attention page's unknown and dead jobs: the newest this many of each. One more
#: is read, so the page can say when there are more (and link to the jobs page for all).
ATTENTION_SHOWN = 200
UNKNOWN_JOBS = _scoped(lambda w: select(*_ATTENTION_COLUMNS)
                       .where(J.status == const("unknown"), *w)
                       .order_by(J.job_id.desc()).limit(const(ATTENTION_SHOWN + 1)))
DEAD_JOBS = _scoped(lambda w: select(*_ATTENTION_COLUMNS).where(J.status == const("dead"), *w)
                    .order_by(J.job_id.desc()).limit(const(ATTENTION_SHOWN + 1)))

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
