"""An operator's routes: cancel, retry, reconcile, prune, and the workers' view. An operator
token bound to a tenant acts on that tenant only."""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
from typing import Any

from fastapi import APIRouter

from .bodies import JSONRoute, NoFields, PruneBody, ReconcileBody
from .deps import JobId, Operator, Srv, scope, strict

router = APIRouter(route_class=JSONRoute)


@router.post("/v1/jobs/{job_id}/cancel", dependencies=strict(NoFields))
async def cancel(job_id: JobId, who: Operator, srv: Srv, _body: NoFields | None = None
                 ) -> dict[str, Any]:
    return await srv.call(srv.c.cancel, job_id, tenant=scope(who))


@router.post("/v1/jobs/{job_id}/retry", dependencies=strict(NoFields))
async def retry(job_id: JobId, who: Operator, srv: Srv, _body: NoFields | None = None
                ) -> dict[str, Any]:
    got = await srv.call(srv.c.retry, job_id, tenant=scope(who))
    srv.notify()
    return got


@router.post("/v1/jobs/{job_id}/reconcile", dependencies=strict(ReconcileBody))
async def reconcile(job_id: JobId, body: ReconcileBody, who: Operator, srv: Srv
                    ) -> dict[str, Any]:
    got = await srv.call(srv.c.reconcile, job_id, body.as_status, body.reason,
                         result=body.result, tenant=scope(who))
    srv.notify()
    return got


@router.post("/v1/prune", dependencies=strict(PruneBody))
async def prune(body: PruneBody, who: Operator, srv: Srv) -> dict[str, Any]:
    return await srv.call(srv.c.prune, body.older_than, statuses=body.statuses,
                          tenant=scope(who), dry_run=body.dry_run)


@router.get("/v1/workers")
async def workers(who: Operator, srv: Srv) -> dict[str, Any]:
    return await srv.call(srv.c.workers, tenant=scope(who))
