"""The statements of concurrency limits and resource fit (core.limits): the limits rows,
the live leases that hold a kind's slots, a worker's capacity and its running jobs' needs,
the claim's window of candidates, and the holds that serialise the decisions. Built from
`schema.py`'s tables like the core's; kept apart so a plain claim never builds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, delete, select

from ..schema import jobs, leases, limits, workers
from .statements import SQL, WAITING, _upsert, const, probes, role_kind_params, union_of

P = bindparam
J, L, W = jobs.c, leases.c, workers.c

LM = limits.c
ALL_LIMITS = SQL(select(LM.kind, LM.concurrency, LM.key_field).order_by(LM.kind))
LIMIT_OF = SQL(select(LM.kind, LM.concurrency, LM.key_field).where(LM.kind == P("kind")))
UPSERT_LIMIT = SQL(lambda insert: _upsert(insert, limits, {
    "kind": P("kind"), "concurrency": P("concurrency"), "key_field": P("key_field"),
    "created_at": P("now"), "updated_at": P("now")}, key=("kind",), keep=("created_at",)))
DELETE_LIMIT = SQL(delete(limits).where(LM.kind == P("kind")))
#: The limits row of a kind held until commit (PostgreSQL; SQLite's compiler writes no lock:
#: BEGIN IMMEDIATE already holds the only write lock), waiting for another holder...
HOLD_LIMIT = SQL(select(LM.kind).where(LM.kind == P("kind")).with_for_update())
#: ...or skipping it when another transaction holds it.
TRY_HOLD_LIMIT = SQL(select(LM.kind).where(LM.kind == P("kind"))
                     .with_for_update(skip_locked=True))
#: Live leases of a kind (running, not expired at :now), oldest grant first: who holds the
#: limit's slots.
LIVE_HOLDERS = SQL(
    select(L.job_id, L.worker_id, L.expires_at, J.payload_json, J.tenant)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(J.kind == P("kind"), J.status == const("running"), L.expires_at > P("now"))
    .order_by(L.granted_at, L.job_id))
#: What the jobs this worker runs under live leases declared they need.
WORKER_HELD_NEEDS = SQL(
    select(L.job_id, J.needs_json)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(L.worker_id == P("worker"), J.status == const("running"),
           L.expires_at > P("now"), J.needs_json.is_not(None))
    .order_by(L.granted_at, L.job_id))
LIVE_NEEDS = SQL(
    select(L.worker_id, L.job_id, J.needs_json)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(J.status == const("running"), L.expires_at > P("now"), J.needs_json.is_not(None))
    .order_by(L.granted_at, L.job_id))
HOLD_WORKER = SQL(select(W.worker_id).where(W.worker_id == P("worker")).with_for_update())
WORKER_RAW = SQL(select(W.heartbeat_raw).where(W.worker_id == P("worker")))
#: The hold a claim takes on a waiting job it chose by itself (PostgreSQL: skipped when a
#: concurrent claim holds it).
HOLD_WAITING = SQL(select(J.job_id).where(J.job_id == P("job_id"), WAITING)
                   .with_for_update(skip_locked=True))

_WINDOWS: dict[tuple[int, int | None, bool], SQL] = {}


def candidate_window(roles: Sequence[str], kinds: Sequence[str] | None,
                     tenant: str | None = None) -> tuple[SQL, dict[str, Any]]:
    """The first :heads eligible jobs in claim order (:maxp, :now, :r1.., :k0.., and :tenant
    for a tenant-bound claim) with what a limit and a fit check read of them: job_id, kind,
    payload_json, needs_json. Reads only; the claim holds the one it takes separately."""
    shape = (len(roles), None if kinds is None else len(kinds), tenant is not None)
    stmt = _WINDOWS.get(shape)
    if stmt is None:
        heads = union_of(probes(shape[0], shape[1], due_only=True, locked=False,
                                limit=P("heads"), tenant=shape[2])).subquery("candidates")
        stmt = _WINDOWS[shape] = SQL(
            select(J.job_id, J.kind, J.payload_json, J.needs_json)
            .select_from(heads.join(jobs, J.job_id == heads.c.job_id))
            .order_by(heads.c.priority, heads.c.created_at, heads.c.job_id)
            .limit(P("heads")))
    return stmt, role_kind_params(roles, kinds, tenant)
