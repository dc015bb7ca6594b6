"""The statements of concurrency limits and resource fit (core.limits): the limits rows,
the live leases that hold a kind's slots, a worker's capacity and its running jobs' needs,
the claim's window of candidates, and the holds that serialise the decisions. Built from
`schema.py`'s tables like the core's; kept apart so a plain claim never builds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, delete, or_, select, tuple_

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
HOLD_LIMIT = SQL(select(LM.kind, LM.concurrency, LM.key_field).where(LM.kind == P("kind"))
                 .with_for_update())
#: ...or skipping it when another transaction holds it.
TRY_HOLD_LIMIT = SQL(select(LM.kind, LM.concurrency, LM.key_field).where(LM.kind == P("kind"))
                     .with_for_update(skip_locked=True))
#: Live leases of a kind (running, not expired at :now), oldest grant first: who holds the
#: limit's slots.
LIVE_HOLDERS = SQL(
    select(L.job_id, L.worker_id, L.expires_at, J.payload_json, J.tenant)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(J.kind == P("kind"), J.status == const("running"), L.expires_at > P("now"))
    .order_by(L.granted_at, L.job_id))
#: Every running lease of a kind with its job's facts, oldest grant first: the live ones
#: hold the limit's slots; an expired one's slot is free only once the claim has ended it.
KIND_LEASES = SQL(
    select(L.job_id, L.worker_id, L.expires_at, J.payload_json, J.tenant)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(J.kind == P("kind"), J.status == const("running"))
    .order_by(L.granted_at, L.job_id))
#: The expired leases of a kind, held to be ended (as the reaper's, with the same facts);
#: one another transaction holds (a reaper, a completion) is skipped and still counted.
EXPIRED_OF_KIND = SQL(
    select(L.job_id, L.epoch, L.worker_id, L.expires_at, J.effect_started, J.attempts,
           J.max_attempts, J.deadline_at, J.cancel_requested)
    .select_from(leases.join(jobs, J.job_id == L.job_id))
    .where(J.kind == P("kind"), L.expires_at <= P("now"), J.status == const("running"),
           J.epoch == L.epoch)
    .order_by(L.expires_at).with_for_update(of=[leases, jobs], skip_locked=True))
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

_WINDOWS: dict[tuple[Any, ...], SQL] = {}


def candidate_window(roles: Sequence[str], kinds: Sequence[str] | None,
                     tenant: str | None = None, *, after: bool = False, skip_kinds: int = 0,
                     skip_needs: int = 0) -> tuple[SQL, dict[str, Any]]:
    """The first :heads eligible jobs in claim order (:maxp, :now, :r1.., :k0.., and :tenant
    for a tenant-bound claim) with what a limit and a fit check read of them: job_id, kind,
    payload_json, needs_json, and the claim order's priority and created_at. Reads only; the
    claim holds the one it takes separately.

    A claim reading on past held jobs narrows the next read: `after`, only the jobs after
    (:ap, :ac, :aj) in claim order (the last row read; each probe seeks there in its index);
    `skip_kinds`, none of the kinds :sk0..; `skip_needs`, none whose needs are the text
    :sn0.. (jobs without needs stay)."""
    shape = (len(roles), None if kinds is None else len(kinds), tenant is not None, after,
             skip_kinds, skip_needs)
    stmt = _WINDOWS.get(shape)
    if stmt is None:
        extra: list[Any] = []
        if after:
            extra.append(tuple_(J.priority, J.created_at, J.job_id)
                         > tuple_(P("ap"), P("ac"), P("aj")))
        if skip_kinds:
            extra.append(J.kind.not_in([P(f"sk{i}") for i in range(skip_kinds)]))
        if skip_needs:
            extra.append(or_(J.needs_json.is_(None),
                             J.needs_json.not_in([P(f"sn{i}") for i in range(skip_needs)])))
        heads = union_of(probes(shape[0], shape[1], due_only=True, locked=False,
                                limit=P("heads"), tenant=shape[2], extra=extra)
                         ).subquery("candidates")
        stmt = _WINDOWS[shape] = SQL(
            select(J.job_id, J.kind, J.payload_json, J.needs_json, heads.c.priority,
                   heads.c.created_at)
            .select_from(heads.join(jobs, J.job_id == heads.c.job_id))
            .order_by(heads.c.priority, heads.c.created_at, heads.c.job_id)
            .limit(P("heads")))
    return stmt, role_kind_params(roles, kinds, tenant)
