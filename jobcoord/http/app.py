"""The FastAPI application: the routes of each family (routes_*.py), one JSON error shape,
the body limits, the long-poll wake-ups and the reaper timer. Every route is `async`; every
Coordinator call (blocking, one short transaction) runs in one bounded thread pool
(state.py), so 200 idle long-polls hold 200 small coroutines, not 200 threads."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import InvalidInput, JobcoordError
from . import routes_artifacts, routes_jobs, routes_operator, routes_worker
from .bodies import ERRORS
from .dashboard import mount as mount_dashboard
from .deps import refusal_first
from .direct import DirectLane
from .errors import status_of
from .limits import BodyLimit, CatchBugs, error_response
from .state import DEFAULT_MAX_ARTIFACT_BYTES, DEFAULT_UPLOAD_IDLE_S, Server, Wakeup


def create_app(coordinator: Any, *, pool_size: int = 8, poll_s: float = 0.5,
               reap_every: float = 5.0,
               emit: Callable[[dict[str, Any]], None] | None = None,
               max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
               upload_idle_s: float = DEFAULT_UPLOAD_IDLE_S, direct: bool = True) -> FastAPI:
    """The API over `coordinator`. `reap_every` 0 turns the reaper timer off. `direct`
    False sends every request the framework's way (direct.py; a test compares the two)."""
    srv = Server(coordinator, pool_size=pool_size, poll_s=poll_s, reap_every=reap_every,
                 emit=emit, max_artifact_bytes=max_artifact_bytes,
                 upload_idle_s=upload_idle_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        srv.wakeup = Wakeup()
        tasks = [asyncio.create_task(srv.poller())]
        if reap_every > 0:
            tasks.append(asyncio.create_task(srv.reaper()))
        stop = threading.Event()
        watcher = threading.Thread(target=srv.watch_commits,
                                   args=(stop, asyncio.get_running_loop()),
                                   name="jobcoord-http-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            srv.notify()
            srv.pool.shutdown(wait=False, cancel_futures=True)
            srv.transfers.shutdown(wait=False, cancel_futures=True)
            watcher.join(1.0)

    # The framework's OpenTelemetry hooks off: serve reports through /metrics and its event
    # lines, and the hooks looked up three global providers on every request (about 3 % of
    # the server's time per worker request) to find them unconfigured.
    # No redirect for a trailing slash (the router's default): it answered a path the API
    # does not have with a 307 to a Location built from the client's Host header. Such a
    # path is an unknown one, 404 in the JSON error shape.
    app = FastAPI(title="jobcoord", version=__version__, lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False,
                             "operation_spans": False},
                  responses=ERRORS, redirect_slashes=False,
                  description="A durable job coordinator. Every /v1 route needs "
                              "`Authorization: Bearer <token>`.")
    app.state.server = srv

    # -- errors: one JSON shape for all of them --

    def refused(exc: JobcoordError) -> JSONResponse:
        srv.lost(exc)
        if status_of(exc) == 500:
            # As a bug caught outermost is (CatchBugs): one answered here was not logged,
            # and an operator alerting on internal_error never heard of it.
            srv.emit({"event": "internal_error", "code": exc.code, "message": exc.message})
        return error_response(exc)

    @app.exception_handler(JobcoordError)
    async def _jobcoord_error(_request: Request, exc: JobcoordError) -> JSONResponse:
        return refused(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError
                                ) -> JSONResponse:
        # Who calls comes first: a body that is not JSON is refused before any dependency
        # ran, and a route that takes a Caller (deps.caller) has not looked its token up yet,
        # so an unknown or revoked token (401) or a role the route does not allow (403) is
        # said before the invalid input.
        refused = await refusal_first(request, srv)
        if refused is not None:
            srv.lost(refused)
            return error_response(refused)
        # 400, not FastAPI's 422: invalid input is 400 everywhere in this API (the CLI's
        # exit 2); 422 is kept for an artifact whose digest does not match.
        parts = []
        for e in exc.errors()[:5]:
            if e.get("type") == "json_invalid":  # its loc is the character it stopped at
                at = e.get("loc", ())[-1:]
                why = (e.get("ctx") or {}).get("error", "")
                parts.append(f"body: is not valid JSON ({why or 'cannot be read'}"
                             f"{f' at character {at[0]}' if at else ''})")
                continue
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{where or 'body'}: {e.get('msg', 'invalid')}")
        return error_response(InvalidInput("invalid_input", "; ".join(parts) or "invalid"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code,
                                                                  f"http_{exc.status_code}")
        return JSONResponse({"error": {"code": code, "message": str(exc.detail)}},
                            status_code=exc.status_code, headers=exc.headers)

    # The worker routes first: the router tries the routes in order, and theirs are the
    # requests a busy server answers most.
    for module in (routes_worker, routes_jobs, routes_artifacts, routes_operator):
        app.include_router(module.router)

    def openapi() -> dict[str, Any]:
        # Invalid input is answered 400 with the JSON error (see _validation_error): drop the
        # 422 FastAPI documents by default, so the document says what the server does. The
        # artifact upload keeps its own 422 (a digest mismatch), declared on its route.
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version,
                              description=app.description, routes=app.routes)
            for item in doc.get("paths", {}).values():
                for operation in item.values():
                    responses = operation.get("responses", {})
                    if responses.get("422", {}).get("description") == "Validation Error":
                        responses.pop("422")
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    mount_dashboard(app)  # /metrics and the web dashboard (dashboard.py)
    if direct:
        # Innermost: a worker's well-formed request to a hot route is answered directly.
        app.add_middleware(DirectLane, routes=routes_worker.router.routes, on_error=refused)
    app.add_middleware(BodyLimit, limit=srv.max_body, artifact_limit=max_artifact_bytes,
                       stopping=srv.stopping, idle_s=upload_idle_s)
    app.add_middleware(CatchBugs, emit=srv.emit)  # outside BodyLimit: sees what it lets by
    return app
