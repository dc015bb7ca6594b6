"""A worker's routes: heartbeat, the long-poll claim, and the fenced calls (renew, complete,
fail, effect, checkpoint). The worker id and tenant are the token's, looked up in the
route's own pool call (`Server.call_as`)."""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response

from .. import faults
from ..artifacts.rules import ChecksElsewhere, checks_elsewhere, leases_kept
from ..core.handover import Claimant
from ..errors import Refused
from ..tokens import Identity, hash_secret
from .bodies import (
    CheckpointBody,
    ClaimBody,
    CompleteBody,
    CompletionsBody,
    EpochBody,
    FailBody,
    HeartbeatBody,
    JSONRoute,
    RenewBody,
)
from .deps import Caller, JobId, Srv, WorkerCaller, strict, worker_of
from .state import Handover, Server

T = TypeVar("T")
router = APIRouter(route_class=JSONRoute)


async def fenced(srv: Server, fn: Callable[..., T], job_id: int, who: Caller | Identity,
                 epoch: int, *args: Any, **kwargs: Any) -> T:
    """A worker's fenced call `fn(job_id, worker, epoch, *args, tenant=...)` as the token's
    worker id, fenced by the token's tenant (None: an unbound worker token serves every
    tenant); a Caller is looked up in the same pool call. A worker token sees its own leases
    only: see `_as_absent`."""
    run = fenced_step(srv, fn, job_id, epoch, *args, **kwargs)
    if isinstance(who, Caller):
        return await srv.call_as(who, run)
    return await srv.call(run, who)


def fenced_step(srv: Server, fn: Callable[..., T], job_id: int, epoch: int, *args: Any,
                **kwargs: Any) -> Callable[[Identity], T]:
    """What `fenced` runs on a thread, given the caller's identity."""
    def run(identity: Identity) -> T:
        worker = worker_of(identity)
        try:
            return fn(job_id, worker, epoch, *args, tenant=identity.tenant, **kwargs)
        except Refused as e:
            if _as_absent(srv.c, e.code, job_id, epoch, worker, identity.tenant):
                raise Refused("job_not_found", f"job {job_id} not found",
                              job_id=job_id) from None
            if e.code == "stale_epoch":
                raise _stale(job_id, epoch) from None
            raise
    return run


def _stale(job_id: int, epoch: int) -> Refused:
    """A lease this worker lost, the job claimed again since: said without the job's
    current epoch, which may be another worker's lease."""
    return Refused("stale_epoch", f"epoch {epoch} of job {job_id} is stale: the job has "
                   "been claimed again since", job_id=job_id)


def _as_absent(coordinator: Any, code: str, job_id: int, epoch: int, worker: str,
               tenant: str | None) -> bool:
    """Is this refusal answered as a missing job? A job of another tenant already is; a
    live lease of another worker is; and any refusal about a (job, epoch) this worker never
    claimed (a wrong epoch, a waiting job, one another worker finished), whose details would
    tell it another worker's epoch or the job's status. A lease it held is answered as it
    is: the worker must learn that it lost it, or that its result was the one accepted.
    (Its claim is read only on a refusal: one indexed read, not the job's history.)"""
    if code == "job_not_found":
        return False
    return code == "not_owner" or not coordinator.claimed_by(job_id, worker, epoch,
                                                             tenant=tenant)


@router.post("/v1/heartbeat", dependencies=strict(HeartbeatBody))
async def heartbeat(body: HeartbeatBody, caller: WorkerCaller, srv: Srv) -> dict[str, Any]:
    return await srv.call_as(caller, lambda who: srv.c.heartbeat(
        worker_of(who), roles=body.roles, readings=body.readings, kinds=body.kinds))


#: Claim answers that mean "nothing for you yet" (a limit's slot or the worker's capacity may
#: free up meanwhile): a long-poll keeps waiting on these only.
_KEEP_WAITING = ("no_waiting_jobs", "no_matching_role", "concurrency_limit", "resource_short")


@router.post("/v1/claims", dependencies=strict(ClaimBody),
             responses={204: {"description": "nothing eligible within `wait` seconds"}})
async def claim(request: Request, caller: WorkerCaller, srv: Srv,
                body: ClaimBody | None = None) -> Any:
    body = body or ClaimBody()
    end = time.monotonic() + body.wait
    # The token's lookup and the poll's first claim: one pool call. The identity holds for
    # the rest of the long-poll.
    looked = srv.wakeup.clock if srv.wakeup is not None else 0
    who, got = await srv.call_as(caller, _first_claim, srv, body)
    worker = worker_of(who)
    woken: int | Handover = 0
    # The claim this poll makes, which a submission may make for it in its own transaction
    # while it waits (see routes_jobs.submit).
    claimant = Claimant(worker, body.lease_s, body.kinds, who.tenant,
                        token_hash=hash_secret(caller.token))
    gone: asyncio.Future[Any] | None = None
    made: dict[str, Any] | None = got
    try:
        while True:
            answer = await _claim_round(request, srv, caller, worker, body, who, claimant,
                                        end, woken, gone, made, looked)
            made = None
            if isinstance(answer, tuple):
                woken, gone = answer
                continue
            return answer
    finally:
        if gone is not None:
            gone.cancel()


def _first_claim(who: Identity, srv: Server, body: ClaimBody
                 ) -> tuple[Identity, dict[str, Any]]:
    return who, _take(srv, worker_of(who), body, who.tenant)


def _take(srv: Server, worker: str, body: ClaimBody, tenant: str | None
          ) -> dict[str, Any]:
    """One claim of a poll: claim's answer, or with `n` claim_many's (of at most the
    server's `max_claim_batch`). A worker token sees its own leases only: a refusal names
    no other worker's (`worker_view`)."""
    if body.n is None:
        return srv.c.claim(worker, lease_s=body.lease_s, kinds=body.kinds, tenant=tenant,
                           worker_view=True)
    return srv.c.claim_many(worker, min(body.n, srv.max_claim_batch), lease_s=body.lease_s,
                            kinds=body.kinds, tenant=tenant, worker_view=True)


def _could_take(coordinator: Any, worker: str, body: ClaimBody, tenant: str | None) -> bool:
    """Could this poll's claim take a job now? A read that records nothing."""
    return bool(coordinator.claimable(worker, kinds=body.kinds, tenant=tenant))


def _took(got: dict[str, Any]) -> bool:
    return bool(got["claimed"]) if "claimed" in got else got["job"] is not None


async def _claim_round(request: Request, srv: Server, caller: Caller, worker: str,
                       body: ClaimBody, who: Identity, claimant: Claimant, end: float,
                       woken: int | Handover, gone: asyncio.Future[Any] | None,
                       made: dict[str, Any] | None = None, looked: int = 0) -> Any:
    """One claim of a long-poll (`made`: the first, already made with the token's lookup,
    which began at wake-up number `looked`) and, if it took nothing, one wait: the answer,
    or (woken, gone) to go round again."""
    if isinstance(woken, Handover):
        handed = await woken.answer
        if handed is not None:
            # A submission's own transaction claimed one job for this poll.
            return handed if body.n is None else {"claimed": [handed], "reason": None,
                                                  "detail": None}
        woken = woken.wake  # the submission's claim took nothing: claim as a woken poll
    if made is None and srv.wakeup is not None:
        looked = srv.wakeup.clock  # this round's look sees every commit woken before it
    if (made is None and end - time.monotonic() > 0
            and not await srv.call(_could_take, srv.c, worker, body, who.tenant)
            and end - time.monotonic() > 0):
        # Woken (or its own look is due) with nothing it may take: a read said so, where a
        # claim would have been a refusal to record, a write, for every idle poll each
        # round. Its first and its last claims are real: they say a gate or a stale
        # heartbeat.
        got: dict[str, Any] = {"reason": "no_waiting_jobs"}
    else:
        # Each later claim judges the token again (401 once revoked; `Server.as_caller`): a
        # poll waiting since before a revocation must not take a job its worker can never
        # report on.
        got = made if made is not None else await srv.call_as(
            caller, lambda again: _take(srv, worker_of(again), body, again.tenant))
        if _took(got):
            return got
    if woken:
        srv.pass_on(woken)  # the job was not for this worker (or taken): pass the turn on
    left = end - time.monotonic()
    # Keep waiting only while the answer is "nothing for you yet": a gate or a stale
    # heartbeat is said at once, the worker must act on it.
    if left <= 0 or srv.stopping.is_set() or got["reason"] not in _KEEP_WAITING:
        if body.wait > 0 and got["reason"] in _KEEP_WAITING:
            return Response(status_code=204)
        return got
    assert srv.wakeup is not None
    if gone is None:
        # Done when the client goes away: a poll nobody listens to any more is not
        # handed a job (nobody would hear of it; it would sit leased until reaped).
        gone = asyncio.ensure_future(_disconnected(request))
    woken = await srv.wakeup.wait(min(left, srv.poll_s * 2), claimant, gone, looked)
    if not isinstance(woken, Handover) and (
            srv.stopping.is_set() or gone.done() or await request.is_disconnected()):
        return Response(status_code=204)
    return woken, gone


async def _disconnected(request: Request) -> None:
    """Return once the client has gone away (the body is read: what the server receives
    next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.post("/v1/jobs/{job_id}/renew", dependencies=strict(RenewBody))
async def renew(job_id: JobId, body: RenewBody, caller: WorkerCaller, srv: Srv
                ) -> dict[str, Any]:
    return await fenced(srv, srv.c.renew, job_id, caller, body.epoch, lease_s=body.lease_s)


def _complete(coordinator: Any, job_id: int, worker: str, body: CompleteBody,
              tenant: str | None) -> dict[str, Any]:
    """The completion, and with `claim_next` the next claim in the same transaction (the
    core's complete_and_claim: the claim's rules are the claim's, bound to the same tenant,
    with the kinds of the worker's heartbeat). The answer is complete's, plus `next`."""
    try:
        if body.claim_next:
            both = coordinator.complete_and_claim(
                job_id, worker, body.epoch, body.result, provenance=body.provenance,
                tenant=tenant, lease_s=body.lease_s, worker_view=True)
            got = {**both["completed"], "next": both["next"]}
        else:
            got = coordinator.complete(job_id, worker, body.epoch, body.result,
                                       provenance=body.provenance, tenant=tenant)
    except Refused as e:
        if e.details.get("same_as_accepted"):
            # The same completion sent again (its answer was lost): it was accepted. The
            # next job the lost answer claimed is handed back while nothing touched it
            # since (same job, epoch and lease); else `next` is null and this answer
            # claims none (a lease that ran out is the reaper's).
            again: dict[str, Any] = {"job_id": job_id, "status": "succeeded",
                                     "epoch": body.epoch, "already_accepted": True}
            if body.claim_next:
                again["next"] = coordinator.claimed_next(job_id, worker, body.epoch,
                                                         tenant=tenant)
            return again
        raise
    # A test makes the answer to a committed completion get lost here.
    faults.point("http.complete.after_commit")
    return got


@router.post("/v1/jobs/{job_id}/complete", dependencies=strict(CompleteBody))
async def complete(job_id: JobId, body: CompleteBody, caller: WorkerCaller, srv: Srv
                   ) -> dict[str, Any]:
    """Accept this attempt's result (`epoch` fences it). With `claim_next: true` the same
    transaction then claims this worker's next job, as `POST /v1/claims` without a wait
    would (the token's tenant, the kinds of the worker's last heartbeat, `lease_s`): the
    answer adds `next`, a claim's answer (`job` and `lease`, or `job: null` with the
    `reason`). A refused completion claims nothing; a completion sent again after its answer
    was lost is `already_accepted`, its `next` the job the lost answer claimed while nothing
    touched it since, else null."""
    step = fenced_step(srv, lambda j, w, _, b, tenant: _complete(srv.c, j, w, b, tenant),
                       job_id, body.epoch, body)
    return await uploaded_first(srv, caller, step)


@router.post("/v1/completions", dependencies=strict(CompletionsBody))
async def completions(body: CompletionsBody, caller: WorkerCaller, srv: Srv
                      ) -> dict[str, Any]:
    """Accept many results in one transaction (complete_many), each fenced by its own
    `epoch` exactly as `POST /v1/jobs/{id}/complete`: one refused item never refuses the
    others. Answers 200 with {results: [per item, in order: complete's answer or {job_id,
    error}], accepted, refused}. An item for a job of another tenant or another worker's
    lease is refused as `job_not_found`, as if absent; an item sent again after its answer
    was lost is `already_accepted`."""
    def run(who: Identity) -> dict[str, Any]:
        worker = worker_of(who)
        got = srv.c.complete_many([
            {"job_id": it.job_id, "worker_id": worker, "epoch": it.epoch,
             "result": it.result, "provenance": it.provenance, "tenant": who.tenant}
            for it in body.items])
        results = got["results"]
        for i, (it, one) in enumerate(zip(body.items, results, strict=True)):
            error = one.get("error")
            if error is None:
                continue
            code, details = error["code"], error.get("details") or {}
            if _as_absent(srv.c, code, it.job_id, it.epoch, worker, who.tenant):
                results[i] = {"job_id": it.job_id, "error": {
                    "code": "job_not_found", "message": f"job {it.job_id} not found",
                    "details": {"job_id": it.job_id}}}
            elif code == "stale_epoch":
                results[i] = {"job_id": it.job_id, "error": _stale(it.job_id, it.epoch)
                              .to_json()["error"]}
            elif details.get("same_as_accepted"):
                # Sent again after its answer was lost: it was accepted (as `complete`; a
                # second such item of the job too; one after an item this group accepted
                # is the core's refusal, never this).
                results[i] = {"job_id": it.job_id, "status": "succeeded",
                              "epoch": it.epoch, "already_accepted": True}
        if got["accepted"]:
            # A test makes the answer to a group that committed results get lost here.
            faults.point("http.completions.after_commit")
        accepted = sum("error" not in one for one in results)
        return {"results": results, "accepted": accepted, "refused": len(results) - accepted}

    return await uploaded_first(srv, caller, run)


async def uploaded_first(srv: Server, caller: Caller, run: Callable[[Identity], T]) -> T:
    """A completion's `run`, on the database threads unless one of its attempts staged
    artifacts: its completion re-hashes the bytes and runs the kind's validator before its
    transaction, which takes as long as they take (on a database thread, every other call
    would wait behind it). The core finds the staged rows (one read) and hands such a
    completion back before any check; it runs again on the transfer threads, queued for
    one when every one is taken (its own lease is kept while its checks run). The database
    decides, not the server's memory: an upload before a restart counts too."""
    def first(who: Identity) -> T:
        with checks_elsewhere():
            return run(who)

    try:
        return await srv.call_as(caller, first)
    except ChecksElsewhere as moved:
        # Kept while it waits for a transfer thread too: every one may be checking other
        # completions' artifacts for minutes. (Its checks keep them again once they begin.)
        keeping = leases_kept(srv.c, moved.attempts, moved.left_s)
        keeping.__enter__()
        try:
            return await srv.transfer_as(caller, run)
        finally:
            # Off the event loop: it waits for a renewal in flight (a busy database).
            await asyncio.get_running_loop().run_in_executor(
                None, keeping.__exit__, None, None, None)


def _fail(coordinator: Any, job_id: int, worker: str, body: FailBody, tenant: str | None
          ) -> dict[str, Any]:
    """The failure report; sent again after its answer was lost, it is answered as accepted
    (`already_accepted`, with the status it took the job to) when this worker's report of
    that epoch (its reason, error and `permanent`) was the failure recorded."""
    try:
        return coordinator.fail(job_id, worker, body.epoch, body.error,
                                permanent=body.permanent, reason=body.reason, tenant=tenant,
                                effect_not_applied=body.effect_not_applied)
    except Refused as e:
        if e.code == "job_not_found":
            raise
        recorded = coordinator.failed_by(job_id, worker, body.epoch, reason=body.reason,
                                         error=body.error, permanent=body.permanent,
                                         tenant=tenant)
        if recorded is None:
            raise
        return {"job_id": job_id, "status": recorded["status"], "epoch": body.epoch,
                "attempt": recorded["attempt"], "already_accepted": True}


@router.post("/v1/jobs/{job_id}/fail", dependencies=strict(FailBody))
async def fail(job_id: JobId, body: FailBody, caller: WorkerCaller, srv: Srv
               ) -> dict[str, Any]:
    """Report this attempt's failure (`epoch` fences it); a report sent again after its
    answer was lost is `already_accepted`."""
    got = await fenced(srv, lambda j, w, _, b, tenant: _fail(srv.c, j, w, b, tenant),
                       job_id, caller, body.epoch, body)
    if got.get("already_accepted"):
        return got
    if got["status"] == "waiting":
        srv.notify()
    return got


@router.post("/v1/jobs/{job_id}/effect", dependencies=strict(EpochBody))
async def effect(job_id: JobId, body: EpochBody, caller: WorkerCaller, srv: Srv
                 ) -> dict[str, Any]:
    return await fenced(srv, srv.c.mark_effect, job_id, caller, body.epoch)


@router.post("/v1/jobs/{job_id}/checkpoint", dependencies=strict(CheckpointBody))
async def checkpoint(job_id: JobId, body: CheckpointBody, caller: WorkerCaller, srv: Srv
                     ) -> dict[str, Any]:
    return await fenced(srv, srv.c.checkpoint, job_id, caller, body.epoch, body.name,
                        body.data)
