"""Routes for everyone with a token and for submitters and readers: whoami, submit, list,
show, explain; and the unauthenticated /healthz."""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query, Response

from .. import __version__
from ..errors import InvalidInput
from ..text import is_header_text
from ..tokens import Identity
from .bodies import JSONRoute, SubmitBody
from .deps import Anyone, Digits, JobId, Reader, Srv, SubmitterCaller, scope, strict

T = TypeVar("T")
router = APIRouter(route_class=JSONRoute)


@router.get("/healthz", responses={200: {"description": "serving"}})
async def healthz(srv: Srv) -> dict[str, Any]:
    from ..store import report_statements as rs

    db = srv.c.db
    await srv.call(lambda: db.read(lambda conn: db.run(conn, rs.ALIVE).scalar(), "healthz"))
    return {"ok": True, "version": __version__}


@router.get("/v1/whoami")
async def whoami(who: Anyone, srv: Srv) -> dict[str, Any]:
    import dataclasses

    return {"name": who.name, "role": who.role, "tenant": who.tenant,
            "worker_id": who.worker_id, "policy": dataclasses.asdict(srv.c.policy)}


@router.post("/v1/jobs", status_code=201, dependencies=strict(SubmitBody),
             responses={200: {"description": "the same Idempotency-Key and payload: the "
                                             "existing job"}})
async def submit(body: SubmitBody, response: Response, caller: SubmitterCaller, srv: Srv,
                 idempotency_key: Annotated[str | None, Header(max_length=200)] = None
                 ) -> dict[str, Any]:
    from ..core.common import DEFAULT_TENANT
    from ..core.handover import enqueue_and_claim
    from ..present import claimed_json

    fields = {"priority": body.priority, "role": body.role, "key": idempotency_key,
              "max_attempts": body.max_attempts, "deadline_s": body.deadline_s,
              "delay_s": body.delay_s, "needs": body.needs}

    def enqueue(who: Identity, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # In the pool call that looks the token up: the job goes to the token's tenant.
        if idempotency_key is not None and not is_header_text(idempotency_key):
            # The framework reads a header's bytes as Latin-1: a UTF-8 key would be stored
            # as another key, and the same key sent through the CLI would make a second job.
            raise InvalidInput("invalid_input", "Idempotency-Key: must be printable ASCII "
                               "(an HTTP header carries no other text)", field="key")
        return fn(*args, tenant=who.tenant or DEFAULT_TENANT, **fields, **kwargs)

    taken = None
    if not body.delay_s and srv.wakeup is not None and srv.wakeup.waiters:
        # The token first (401, 403): a refused request never takes a waiting poll, which
        # would then claim on its own (a write) for a request that changes nothing.
        await srv.call(caller.identify, srv.c.db)
        taken = srv.take_waiter()
    if taken is None:
        got = await srv.call_as(caller, enqueue, srv.c.enqueue, body.kind, body.payload or {})
        # Answered only now, after the commit; a waiting long-poll hears of it at once.
        srv.notify(1)
    else:
        # A long-poll waits: its claim is made in this submission's transaction (one commit
        # instead of two), and answers it. A claim that takes nothing leaves the poll to
        # claim on its own, as a woken poll does (so does a token revoked between the two
        # lookups: it is looked up again in the same call).
        claimant, handover = taken
        try:
            got = await srv.call_as(caller, enqueue, enqueue_and_claim, srv.c, body.kind,
                                    body.payload or {}, claimant=claimant)
            claimed = got.pop("claimed")
            handover.give(None if claimed is None else claimed_json(claimed))
            if claimed is not None and claimed["job"]["job_id"] != got["job_id"]:
                srv.notify(1)  # it took an earlier job: this one is for the next poll
        finally:
            handover.give(None)
    if not got["created"]:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{got['job_id']}"
    return got


@router.get("/v1/jobs")
async def list_jobs(who: Reader, srv: Srv, status: str | None = None,
                    kind: str | None = None,
                    limit: Annotated[int, Query(ge=1, le=10_000), Digits] = 100) -> dict[str, Any]:
    return await srv.call(srv.c.jobs, status=status, kind=kind, tenant=scope(who),
                          limit=limit)


@router.get("/v1/jobs/{job_id}")
async def show(job_id: JobId, who: Reader, srv: Srv) -> dict[str, Any]:
    return await srv.call(srv.c.show, job_id, tenant=scope(who))


@router.get("/v1/jobs/{job_id}/explain")
async def explain(job_id: JobId, who: Reader, srv: Srv) -> dict[str, Any]:
    return await srv.call(srv.c.explain, job_id, tenant=scope(who))

