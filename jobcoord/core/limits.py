"""Concurrency limits and resource fit: the operator's limits, and the check a claim runs on
each candidate when a limit exists or a waiting job declares needs.

A limit is counted, never kept: the live leases of its kind (running, lease not expired at
the claim's own time) are read inside the claim's write transaction, so a crashed worker's
slot is free the moment its lease expires, and nothing can drift. A limited or unfitting job
is skipped, never failed: the claim takes the next eligible one.

`check` is pure (candidate, limit, live holders, worker capacity, taken so far): a claim of
many jobs calls it per job with the jobs it already took in that batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.engine import Connection

from .. import faults
from .. import validate as v
from ..clock import iso, now_us
from ..errors import Refused
from ..store import limit_statements as sql
from ..store.base import Taken
from .common import Context, lease_end

MAX_CONCURRENCY = 100_000
#: Candidates a claim that must check each one reads at first (most take one of these), then
#: in each further read while none it read could be taken.
FIRST_READ, PAGE = 8, 2048
#: Groups of held jobs (a kind, a text of needs) a claim's further reads leave out in SQL,
#: at most this many of each (one statement per count is compiled and kept); past them the
#: jobs are read and judged one by one, as any.
MAX_SKIPPED = 16
#: The resource matched against one GPU's free memory (a job does not span GPUs).
GPU_MEMORY = v.GPU_MEMORY
#: The resource matched against the worker's `memory_available_mb` reading.
RAM = v.RAM


@dataclass(frozen=True)
class Limit:
    kind: str
    concurrency: int
    key_field: str | None = None


def stored_limit(row: Any) -> Limit:
    """A limit as stored (kind, concurrency, key field). A count that is not a whole number
    (text written by hand on SQLite, which keeps it) counts as 1: never more than any real
    limit allows (every limit allows at least 1), and the queue goes on; `check` names the
    column (value_of_wrong_type)."""
    n = row[1]
    return Limit(row[0], n if type(n) is int and n >= 1 else 1, row[2])


@dataclass(frozen=True)
class Candidate:
    """A job a claim considers (or has taken, or a live lease's job)."""

    job_id: int
    kind: str
    payload: Mapping[str, Any]
    needs: Mapping[str, int]
    worker_id: str | None = None
    expires_at: int | None = None
    #: A live lease's tenant (None: one of this claim's own jobs).
    tenant: str | None = None


def visible(holder: Candidate, viewer: str | None, own: str | None = None) -> bool:
    """Whether a caller bound to tenant `viewer` (None: every tenant) may be told which job
    and worker hold a slot: another tenant's are counted, never named. `own`: the worker of
    a caller that sees its own leases only (a worker token through the server); another
    worker's are counted, never named (None: a trusted caller, told every worker's)."""
    return ((viewer is None or holder.tenant is None or holder.tenant == viewer)
            and (own is None or holder.worker_id is None or holder.worker_id == own))


@dataclass(frozen=True)
class Capacity:
    """What a worker reported free: each GPU's free memory (None: not reported), and named
    amounts (`ram_mb` from memory_available_mb, anything from `capacity`)."""

    gpus: tuple[int | None, ...] = ()
    named: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Why a candidate may not be taken: `concurrency_limit` or `resource_short`."""

    code: str
    detail: str
    holders: tuple[Candidate, ...] = ()


def key_of(payload: Mapping[str, Any], key_field: str | None) -> str | None:
    """The value a keyed limit counts by: the payload field as JSON text (1 and "1" differ);
    jobs without the field share the value None."""
    if key_field is None or key_field not in payload:
        return None
    return json.dumps(payload[key_field], sort_keys=True, separators=(",", ":"))


def _shown_key(limit: Limit, key: str | None) -> str:
    if limit.key_field is None:
        return ""
    return f" with {limit.key_field}={key if key is not None else '(absent)'}"


def check(candidate: Candidate, limit: Limit | None, holders: Sequence[Candidate],
          capacity: Capacity | None, held: Sequence[Candidate],
          taken: Sequence[Candidate] = (), viewer: str | None = None,
          own: str | None = None) -> Verdict | None:
    """None when `candidate` may be taken, else why not. `holders`: live leases of the
    candidate's kind (any worker); `capacity`: what this worker reported free (None: no
    needs to match); `held`: this worker's running jobs that declared needs; `taken`: jobs
    taken earlier in the same batch by this worker (they hold slots and resources too);
    `viewer`: the caller's tenant, whose holders alone the detail names; `own`: the
    caller's worker, when it sees its own leases only (`visible`)."""
    if limit is not None:
        key = key_of(candidate.payload, limit.key_field)
        same = [h for h in (*holders, *(t for t in taken if t.kind == candidate.kind))
                if limit.key_field is None or key_of(h.payload, limit.key_field) == key]
        if len(same) >= limit.concurrency:
            named = [h for h in same if visible(h, viewer, own)]
            hidden = len(same) - len(named)
            who = ", ".join(f"job {h.job_id}" + (f" on {h.worker_id}" if h.worker_id else "")
                            for h in named[:10]) + (" ..." if len(named) > 10 else "")
            if hidden:
                whose = ("another worker" if hidden == 1 else "other workers"
                         ) if own is not None else "another tenant"
                who += (", " if named else "") + (
                    f"{hidden} job{'s' if hidden > 1 else ''} of {whose}")
            return Verdict("concurrency_limit",
                           f"kind {candidate.kind}{_shown_key(limit, key)} allows "
                           f"{limit.concurrency} at once; held by {who}", tuple(same))
    if candidate.needs:
        short = short_resource(candidate.needs, capacity or Capacity(), (*held, *taken))
        if short is not None:
            return Verdict("resource_short", short)
    return None


def short_resource(needs: Mapping[str, int], capacity: Capacity,
                   running: Sequence[Candidate]) -> str | None:
    """Which of `needs` does not fit what the worker reported free minus what its running
    jobs declared, in words; None when all fit."""
    # The running jobs' GPU memory is placed first-fit in claim order, as the worker would
    # have placed them; the candidate then needs one GPU with enough left. A running job
    # that fits no GPU (its GPU now reports less free than it declared) is still counted,
    # on the GPU with the most left, which goes below zero: less memory reported must never
    # leave room for more work.
    gpus = [g or 0 for g in capacity.gpus]
    used: dict[str, int] = {}
    for job in running:
        for name, amount in job.needs.items():
            if name == GPU_MEMORY:
                if gpus:
                    i = next((i for i, left in enumerate(gpus) if left >= amount),
                             gpus.index(max(gpus)))
                    gpus[i] -= amount
            else:
                used[name] = used.get(name, 0) + amount
    for name, amount in needs.items():
        if name == GPU_MEMORY:
            if not capacity.gpus:
                return f"{GPU_MEMORY}: needs {amount} on one GPU; the worker reports no GPU"
            if max(gpus) < amount:
                return (f"{GPU_MEMORY}: needs {amount} on one GPU; the most any GPU has free "
                        f"is {max(gpus)} (after its running jobs' declared needs)")
            continue
        have = capacity.named.get(name)
        if have is None:
            what = "memory_available_mb" if name == RAM else f"capacity {name}"
            return f"{name}: needs {amount}; the worker reports no {what}"
        left = have - used.get(name, 0)
        if left < amount:
            return (f"{name}: needs {amount}; {left} left of {have} after its running jobs' "
                    "declared needs")
    return None


def capacity_of(raw: str | None) -> Capacity:
    """A worker's capacity from its last heartbeat as received (validated on receipt)."""
    if not raw:
        return Capacity()
    # A damaged row never gets here: a claim refuses such a worker first
    # (`workers.claiming_row`) and explain lists it stale.
    readings = v.loads(raw)
    gpus = tuple(None if not isinstance(g.get("memory_free_mb"), int | float)
                 else int(g["memory_free_mb"]) for g in readings.get("gpus") or ())
    named: dict[str, int] = {}
    if isinstance(readings.get("memory_available_mb"), int):
        named[RAM] = readings["memory_available_mb"]
    for name, amount in (readings.get("capacity") or {}).items():
        # A heartbeat stored before such names were refused may still carry one: the
        # reading it would override is the only source of that amount.
        if name not in v.MATCHED_ELSEWHERE:
            named[name] = int(amount)
    return Capacity(gpus, named)


def _needs(text: str | None, job_id: int) -> dict[str, int]:
    return v.stored_json(text, job_id, "needs_json") or {}


# --- inside a claim -------------------------------------------------------------------------


class ClaimView:
    """What one claim's checks read, each at most once per transaction: the limits, each
    limited kind's live holders (read after its limits row is held), the worker's capacity
    and its running jobs' needs."""

    def __init__(self, ctx: Context, conn: Connection, worker_id: str, now: int,
                 limited: bool, tenant: str | None = None, *, locking: bool = True,
                 worker_view: bool = False) -> None:
        self.ctx, self.conn, self.worker_id, self.now = ctx, conn, worker_id, now
        self.tenant = tenant
        #: The worker whose holders alone a refusal names (`visible`), or None: every one.
        self.own = worker_id if worker_view else None
        #: False for a look that takes nothing (`fits_any`): no row is held, the holders
        #: are read as they stand.
        self.locking = locking
        self.limits: dict[str, Limit] = {}
        if limited:
            self.limits = {r[0]: stored_limit(r)
                           for r in ctx.db.run(conn, sql.ALL_LIMITS).fetchall()}
            faults.point("limits.read")  # a test changes a limit here
        self._holders: dict[str, list[Candidate]] = {}
        self._held = False
        self._capacity: Capacity | None = None
        self._running: list[Candidate] = []

    def hold(self, kind: str) -> bool:
        """Serialise the decisions on a limited kind until commit. Only the first hold of a
        claim waits; a further one is skipped when another claim holds it, so two claims
        never wait for each other's kinds (no deadlock)."""
        if kind in self._holders:
            return True
        if self.locking:
            held, row = self.ctx.db.hold_limit(self.conn, kind, wait=not self._held)
            if not held:
                return False
            self._held = True
            if row is not None:
                # Changed since this claim read the limits (PostgreSQL): judged as it
                # stands, or a lowered limit let this claim take a slot it no longer has.
                self.limits[kind] = stored_limit(row)
            # The hold may have waited for other claims: the time the holders' leases are
            # judged live at is read after it, never before.
            self.now = max(self.now, now_us())
        # Read after the hold: on PostgreSQL this statement sees every lease committed by
        # the claims that held the kind before, and every end committed so far.
        leases = [
            Candidate(r[0], kind, v.stored_json(r[3], r[0], "payload_json"), {}, r[1], r[2],
                      r[4])
            for r in self.ctx.db.run(self.conn, sql.KIND_LEASES, {"kind": kind}).fetchall()]
        ended = self._end_expired(kind, leases) if self.locking else set()
        self._holders[kind] = [c for c in leases if c.job_id not in ended and (
            type(c.expires_at) is not int or c.expires_at > self.now)]
        # A lease's grant is timed after that read: a holder that ended unseen by it
        # (committed later) recorded its end before this grant, so the history never shows
        # more holders at once than the count allowed.
        self.now = max(self.now, now_us())
        return True

    def _end_expired(self, kind: str, leases: Sequence[Candidate]) -> set[int]:
        """End the expired leases among `leases` (as the reaper would) before their slots
        count as free: left as they were, a clock stepping back made one live again, and
        its worker renewed and completed it beside the job given its slot. One another
        transaction holds (PostgreSQL: a reaper, a completion) is counted as a holder."""
        if all(type(c.expires_at) is int and c.expires_at > self.now for c in leases):
            return set()
        from .recovery import expire

        ended: set[int] = set()
        for row in self.ctx.db.run(self.conn, sql.EXPIRED_OF_KIND,
                                   {"kind": kind, "now": self.now}).fetchall():
            if expire(self.ctx, self.conn, row, self.now) is not None:
                ended.add(row[0])
        return ended

    def holders(self, kind: str) -> list[Candidate]:
        return self._holders.get(kind, [])

    def capacity(self) -> tuple[Capacity, list[Candidate]]:
        if self._capacity is None:
            raw = self.ctx.db.run(self.conn, sql.WORKER_RAW, {"worker": self.worker_id}
                                  ).fetchone()
            self._capacity = capacity_of(None if raw is None else raw[0])
            self._running = [
                Candidate(r[0], "", {}, _needs(r[1], r[0]), self.worker_id)
                for r in self.ctx.db.run(self.conn, sql.WORKER_HELD_NEEDS,
                                         {"worker": self.worker_id, "now": self.now}
                                         ).fetchall()]
        return self._capacity, self._running

    def holds_back_kind(self, kind: str) -> bool:
        """After a `concurrency_limit` verdict on a job of `kind`: whether it holds back
        every job of the kind in this claim (a limit without a key, or one whose decisions
        another claim holds), not only those sharing the job's key value."""
        limit = self.limits.get(kind)
        return limit is not None and (limit.key_field is None or kind not in self._holders)

    def judge(self, cand: Candidate, taken: Sequence[Candidate] = ()) -> Verdict | None:
        """`check` for this candidate with what this claim has read."""
        if cand.kind in self.limits and not self.hold(cand.kind):
            return Verdict("concurrency_limit", f"kind {cand.kind} is limited and another "
                           "claim is deciding on it right now")
        limit = self.limits.get(cand.kind)  # as held (`hold` reads it again)
        capacity, running = self.capacity() if cand.needs else (None, [])
        return check(cand, limit, self.holders(cand.kind), capacity, running, taken,
                     viewer=self.tenant, own=self.own)


def take_checked(ctx: Context, conn: Connection, worker_id: str, roles: Sequence[str],
                 kinds: Sequence[str] | None, *, now: int, lease_us: int, max_priority: int,
                 limited: bool, tenant: str | None = None, worker_view: bool = False
                 ) -> tuple[Taken, Verdict | None, int]:
    """The claim's take when candidates must be checked one by one: the first eligible job
    in claim order that `check` lets this worker take. Returns what was taken; when nothing
    was, the first refusal seen (None: there was no candidate at all); and the time of the
    decision (later than `now` when holding a limit waited for other claims).
    `worker_view`: the refusal names this worker's holders only (`visible`)."""
    view = ClaimView(ctx, conn, worker_id, now, limited, tenant, worker_view=worker_view)
    # This worker's row first, always before any limits row: two claims of one worker never
    # both fit a job into the same free capacity, and the locks are always taken in one
    # order (worker, then one kind waited for, further kinds only if free), so no deadlock.
    ctx.db.hold_worker(conn, worker_id)
    view.now = max(view.now, now_us())

    def take(job_id: int) -> tuple[Any, ...] | None:
        # A test may pause here: between the decision and the take is where two claims
        # deciding at once would both fit into the same slot or capacity.
        faults.point("checked.before_take")
        expires = lease_end(view.now, lease_us)
        return ctx.db.take_job(conn, job_id, worker=worker_id, now=view.now,
                               expires=expires, expires_iso=iso(expires))

    taken, first = _first_fit(view, roles, kinds, max_priority, take)
    return taken, first, view.now


def fits_any(ctx: Context, conn: Connection, worker_id: str, roles: Sequence[str],
             kinds: Sequence[str] | None, *, now: int, max_priority: int, limited: bool,
             tenant: str | None = None) -> bool:
    """Whether a claim that checks each candidate would find one to take now: the same
    walk as `take_checked`, reading only (no row held, nothing taken). What an idle
    worker's look asks when limits or needs may hold every waiting job: a plain "is a job
    waiting" would say yes, and each idle worker's refused claim, a commit, would wake the
    others into refusing in turn."""
    view = ClaimView(ctx, conn, worker_id, now, limited, tenant, locking=False)
    taken, _ = _first_fit(view, roles, kinds, max_priority, lambda job_id: (job_id,))
    return taken.job is not None


def _first_fit(view: ClaimView, roles: Sequence[str], kinds: Sequence[str] | None,
               max_priority: int, take: Callable[[int], tuple[Any, ...] | None]
               ) -> tuple[Taken, Verdict | None]:
    """Walk the candidates in claim order and `take` the first that `check` lets this
    worker have (a take answering None: another claim had it, walk on).

    Every eligible job is considered, however many held ones come first: a claim says
    `concurrency_limit` or `resource_short` only when no eligible job fits. It reads the
    candidates in pages, each after the last row of the one before (an index seek, never
    a re-read), and leaves out of the next pages in SQL the groups it found held as a whole:
    a kind whose unkeyed limit is full (or whose decisions another claim holds), and jobs
    declaring the same needs text as one that did not fit. So the jobs it judges one by one
    are those of other groups (per-key limits, needs all different); the rows of a held
    group are skipped in the database's own scan of the claim index."""
    ctx, conn = view.ctx, view.conn
    # The groups found held as a whole, and the first of them, which the next reads leave out.
    held_kinds: set[str] = set()
    short_needs: set[str] = set()
    skip_kinds: list[str] = []
    skip_needs: list[str] = []
    # Values of a keyed limit found full: judged once each.
    held_keys: set[tuple[str, str | None]] = set()
    judged = 0
    first: Verdict | None = None
    after: tuple[int, int, int] | None = None
    heads = FIRST_READ
    while True:
        # A worker that names its kinds reads one index slice per kind: a held kind's slice
        # is not read again at all.
        wanted = None if kinds is None else [k for k in kinds if k not in held_kinds]
        if wanted is not None and not wanted:
            break
        skipped = skip_kinds if wanted is None else []
        stmt, params = sql.candidate_window(roles, wanted, view.tenant,
                                            after=after is not None,
                                            skip_kinds=len(skipped),
                                            skip_needs=len(skip_needs))
        # Due and within its deadline at the time of the decision, not before the holds.
        params.update(now=view.now, maxp=max_priority, heads=heads)
        if after is not None:
            params.update(ap=after[0], ac=after[1], aj=after[2])
        params.update((f"sk{i}", k) for i, k in enumerate(skipped))
        params.update((f"sn{i}", n) for i, n in enumerate(skip_needs))
        rows = ctx.db.run(conn, stmt, params).fetchall()
        for job_id, kind, payload, needs, _, _ in rows:
            if kind in held_kinds or needs in short_needs:
                continue
            cand = Candidate(job_id, kind, v.stored_json(payload, job_id, "payload_json"),
                             _needs(needs, job_id))
            limit = view.limits.get(kind)
            key = None if limit is None else (kind, key_of(cand.payload, limit.key_field))
            if key is not None and key in held_keys:
                continue
            judged += 1
            verdict = view.judge(cand)
            if verdict is not None:
                first = first or verdict
                limit = view.limits.get(kind)  # as held: it may have changed since
                key = None if limit is None else (kind, key_of(cand.payload, limit.key_field))
                if verdict.code == "resource_short":
                    # Needs are judged against this worker alone, whatever the job's kind:
                    # every job declaring the same needs falls short the same way.
                    short_needs.add(needs)
                    if len(skip_needs) < MAX_SKIPPED:
                        skip_needs.append(needs)
                elif view.holds_back_kind(kind):
                    held_kinds.add(kind)
                    if len(skip_kinds) < MAX_SKIPPED:
                        skip_kinds.append(kind)
                elif key is not None:
                    held_keys.add(key)
                continue
            job = take(job_id)
            if job is not None:
                return Taken(judged, True, job), None
        if len(rows) < heads:
            break
        last = rows[-1]
        after, heads = (last[4], last[5], last[0]), PAGE
    return Taken(judged, first is not None or judged > 0, None), first


# --- the operator's limits --------------------------------------------------------------------


def set_limit(ctx: Context, kind: str, concurrency: Any, key: str | None = None
              ) -> dict[str, Any]:
    """At most `concurrency` live leases of `kind` at once (per value of payload field `key`
    when given). Replaces the kind's limit if it had one."""
    kind = v.name(kind, "kind")
    n = v.whole(concurrency, "concurrency", 1, MAX_CONCURRENCY)
    key_field = None if key is None else v.payload_field(key, "key")

    def _do(conn: Connection) -> dict[str, Any]:
        now = now_us()
        ctx.db.run(conn, sql.UPSERT_LIMIT, {"kind": kind, "concurrency": n,
                                            "key_field": key_field, "now": now})
        return {"kind": kind, "concurrency": n, "key": key_field, "updated_at": iso(now)}

    return ctx.db.write(_do, "limit set")


def list_limits(ctx: Context) -> dict[str, Any]:
    """Every limit with its live holders now."""

    def _do(conn: Connection) -> list[dict[str, Any]]:
        now = now_us()
        out = []
        for kind, concurrency, key_field in ctx.db.run(conn, sql.ALL_LIMITS).all():
            held = ctx.db.run(conn, sql.LIVE_HOLDERS, {"kind": kind, "now": now}).all()
            out.append({"kind": kind, "concurrency": concurrency, "key": key_field,
                        "running": len(held),
                        "holders": [holder_json(r[0], r[1], r[2],
                                                v.stored_json(r[3], r[0], "payload_json"),
                                                key_field) for r in held]})
        return out

    return {"limits": ctx.db.read(_do, "limit ls")}


def holder_json(job_id: int, worker_id: str | None, expires_at: int | None,
                payload: Mapping[str, Any], key_field: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"job_id": job_id, "worker_id": worker_id,
                           "expires_at": None if expires_at is None else iso(expires_at)}
    if key_field is not None:
        out["key"] = key_of(payload, key_field)
    return out


def remove_limit(ctx: Context, kind: str) -> dict[str, Any]:
    """Drop a kind's limit; refused (job_not_found's family: limit_not_found) if none."""
    kind = v.name(kind, "kind")

    def _do(conn: Connection) -> dict[str, Any] | Refused:
        if ctx.db.run(conn, sql.DELETE_LIMIT, {"kind": kind}).rowcount == 0:
            return Refused("limit_not_found", f"kind {kind} has no limit")
        return {"kind": kind, "removed": True}

    return ctx.db.write(_do, "limit rm")


# --- explain --------------------------------------------------------------------------------


def diagnose(ctx: Context, conn: Connection, job: Mapping[str, Any], now: int,
             tenant: str | None = None) -> dict[str, Any]:
    """What `explain` needs to say whether a limit or a resource holds a waiting job back,
    read in explain's snapshot: the kind's limit and live holders, the job's needs, and every
    worker's running jobs' declared needs. `tenant`: the caller's, whose holders alone are
    named."""
    out: dict[str, Any] = {"limit": None, "holders": [],
                           "needs": _needs(job["needs_json"], job["job_id"]),
                           "running_needs": {}, "viewer": tenant}
    row = ctx.db.run(conn, sql.LIMIT_OF, {"kind": job["kind"]}).first()
    if row is not None:
        out["limit"] = stored_limit(row)
        out["holders"] = [Candidate(r[0], row[0], v.stored_json(r[3], r[0], "payload_json"), {},
                                    r[1], r[2], r[4])
                          for r in ctx.db.run(conn, sql.LIVE_HOLDERS,
                                              {"kind": row[0], "now": now})]
    if out["needs"]:
        for worker, job_id, needs in ctx.db.run(conn, sql.LIVE_NEEDS, {"now": now}):
            out["running_needs"].setdefault(worker, []).append(
                Candidate(job_id, "", {}, _needs(needs, job_id), worker))
    return out


def explain_reasons(job: Mapping[str, Any], diag: Mapping[str, Any],
                    ready: Sequence[Mapping[str, Any]]
                    ) -> tuple[list[str], list[tuple[str, str]], dict[str, Any] | None]:
    """Of the workers the gates let claim the job, those a limit and their capacity let take
    it; the reasons for the others; the limit as shown (with its holders), if any."""
    cand = Candidate(job["job_id"], job["kind"],
                     v.stored_json(job["payload_json"], job["job_id"], "payload_json"),
                     diag["needs"])
    limit: Limit | None = diag["limit"]
    shown = None
    viewer = diag.get("viewer")
    if limit is not None:
        named = [h for h in diag["holders"] if visible(h, viewer)]
        shown = {"kind": limit.kind, "concurrency": limit.concurrency, "key": limit.key_field,
                 "holders": [holder_json(h.job_id, h.worker_id, h.expires_at, h.payload,
                                         limit.key_field) for h in named]}
        if viewer is not None:
            shown["other_tenants_holding"] = len(diag["holders"]) - len(named)
    # The limit holds it back on every worker; needs are matched per worker below.
    verdict = check(replace(cand, needs={}), limit, diag["holders"], None, (), viewer=viewer)
    if verdict is not None:
        return [], [(verdict.code, verdict.detail)], shown
    fit, reasons = [], []
    for w in ready:
        if cand.needs:
            short = short_resource(cand.needs, capacity_of(w["heartbeat_raw"]),
                                   diag["running_needs"].get(w["worker_id"], []))
            if short is not None:
                who = f"worker {w['worker_id']}" if viewer is None else "a worker"
                reasons.append(("resource_short", f"{who}: {short}"))
                continue
        fit.append(w["worker_id"])
    return fit, reasons, shown
