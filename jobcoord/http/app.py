"""The FastAPI application: authentication, routes, error mapping, the long-poll claim and
the reaper timer. Every route is `async`; every Coordinator call (blocking, one short
transaction) runs in one bounded thread pool, so 200 idle long-polls hold 200 small
coroutines, not 200 threads."""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at run
# time, and the Annotated aliases below are local to create_app.
import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__, faults, tokens
from .. import validate as v
from ..errors import InvalidInput, JobcoordError, Refused
from ..store import report_statements as rs
from ..tokens import Identity
from .dashboard import mount as mount_dashboard
from .errors import BodyTooLarge, Forbidden, Unauthorized, headers_of, status_of

T = TypeVar("T")

#: Longest long-poll a claim may ask for.
MAX_WAIT_S = 30.0
#: Room for the JSON around a payload or result at its size limit.
ENVELOPE_BYTES = 64 * 1024
JOB_ID_MAX = 2**62


# --- request bodies (unknown fields are refused; NaN and Infinity too) --------------------


#: Claim refusals a long-poll waits through: nothing for this worker yet.
NOT_YET = ("no_waiting_jobs", "no_matching_role", "concurrency_limit", "resource_short")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SubmitBody(_Body):
    kind: str
    payload: dict[str, Any] | None = None
    priority: int | str | None = None
    role: str | None = None
    max_attempts: int | None = None
    deadline_s: float | None = None
    delay_s: float = 0.0
    #: Declared resource needs {"NAME": INT}, checked by the coordinator like `--needs`.
    needs: dict[str, Any] | None = None


class HeartbeatBody(_Body):
    roles: list[str] = Field(default_factory=list, max_length=64)
    kinds: list[str] | None = Field(default=None, max_length=1024)
    readings: dict[str, Any] | None = None


class ClaimBody(_Body):
    lease_s: float | None = None
    kinds: list[str] | None = Field(default=None, max_length=1024)
    wait: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)


class EpochBody(_Body):
    epoch: int


class RenewBody(EpochBody):
    lease_s: float | None = None


class CompleteBody(EpochBody):
    result: Any = None
    provenance: dict[str, Any] | None = None


class FailBody(EpochBody):
    error: str
    permanent: bool = False
    reason: str = "failed"


class CheckpointBody(EpochBody):
    name: str
    data: Any = None


class ReconcileBody(_Body):
    as_status: Literal["succeeded", "waiting", "dead"] = Field(alias="as")
    reason: str
    result: Any = None


class PruneBody(_Body):
    older_than: str | float
    statuses: list[str] | None = Field(default=None, max_length=8)
    dry_run: bool = False


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in (
        (400, "invalid input; nothing was changed"),
        (401, "no token, or an unknown or revoked one"),
        (403, "this token's role may not do that"),
        (404, "not found, or not visible to this token"),
        (409, "refused by a coordinator rule"),
        (413, "request body too large"),
        (500, "internal error"),
        (503, "database busy or unavailable; see Retry-After"),
    )}


# --- state shared by the routes ------------------------------------------------------------


class Wakeup:
    """Wakes long-polls waiting for work, oldest first. Used only from the event loop thread.

    A submission wakes one waiter (waking all of them would start as many claims racing for
    one job); a waiter that then finds nothing passes the turn on to the next. Everything
    else that may free work for several (the poller, the reaper, retries) wakes all."""

    def __init__(self) -> None:
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Single wake-ups that found nobody waiting (every long-poll was busy claiming): the
        #: next waiter takes one at once, so a job committed during a claim is not left for
        #: the poller.
        self._pending = 0

    @property
    def waiters(self) -> int:
        return len(self._waiting)

    def notify(self, n: int | None = None) -> None:
        """Wake `n` waiters (None: all)."""
        while self._waiting and (n is None or n > 0):
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                if n is not None:
                    n -= 1
        if n:
            self._pending = min(self._pending + n, 1024)

    async def wait(self, timeout: float) -> bool:
        """True when woken, False when the timeout passed."""
        if self._pending:
            self._pending -= 1
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove(future)


class Server:
    def __init__(self, coordinator: Any, *, pool_size: int, poll_s: float, reap_every: float,
                 emit: Callable[[dict[str, Any]], None] | None):
        self.c = coordinator
        self.pool = concurrent.futures.ThreadPoolExecutor(pool_size, "jobcoord-http-db")
        self.poll_s = poll_s
        self.reap_every = reap_every
        self.emit = emit or (lambda _event: None)
        self.wakeup: Wakeup | None = None
        limit = max(coordinator.policy.max_payload_bytes, coordinator.policy.max_result_bytes)
        self.max_body = limit + ENVELOPE_BYTES

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def notify(self, n: int | None = None) -> None:
        if self.wakeup is not None:
            self.wakeup.notify(n)

    def due_job_exists(self) -> bool:
        """A cheap read: is any waiting job due? Only a hint to wake the long-polls; the claim
        itself decides what is eligible."""
        from ..clock import now_us

        db = self.c.db
        return db.read(lambda conn: db.run(conn, rs.DUE_JOB, {"now": now_us()}).first()
                       is not None, "poll")

    async def poller(self) -> None:
        """Jobs committed by other processes (the CLI, another server): looked for once per
        poll interval while someone waits."""
        assert self.wakeup is not None
        while True:
            await asyncio.sleep(self.poll_s)
            if not self.wakeup.waiters:
                continue
            try:
                if await self.call(self.due_job_exists):
                    self.notify()
            except JobcoordError:
                pass  # the database is away: the waiters' own claims will say so

    async def reaper(self) -> None:
        """Reap on a timer. The errors a loop survives are runtime.py's (a busy or
        restarting database): the pass is skipped and the timer backs off. A fatal one
        (schema, corruption) is said, and the timer keeps trying at the longest backoff, so
        the server answers again once an operator has repaired or migrated the database."""
        from ..runtime import Backoff, describe, is_fatal

        backoff = Backoff(self.reap_every)
        wait = self.reap_every
        while True:
            await asyncio.sleep(wait)
            wait = self.reap_every
            try:
                got = await self.call(self.c.reap, limit=1000)
            except Exception as e:
                code, message = describe(e)
                wait = backoff.next()
                self.emit({"event": "reap_error" if is_fatal(e) else "reap_skipped",
                           "code": code, "message": message, "retry_in_s": wait})
                continue
            backoff.reset()
            if got["expired"] or got["deadline_dead"]:
                self.emit({"event": "reaped", **got})
                if got["waiting"]:
                    self.notify()


# --- the body size limit (pure ASGI: counts bytes as they arrive) ----------------------------


class BodyLimit:
    def __init__(self, app: Any, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] in ("POST", "PUT") and scope["path"].startswith("/v1/"):
            # Bodies are JSON whatever the client says: `curl -d '{...}'` labels its body
            # form-encoded. The JSON is parsed strictly all the same.
            scope = dict(scope)
            scope["headers"] = [(n, val) for n, val in scope.get("headers", ())
                                if n != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.limit:
                    await _send_error(send, BodyTooLarge(
                        "body_too_large", f"request body must be at most {self.limit} bytes "
                        "(keep large data as an artifact)"))
                    return
        seen = 0

        async def limited() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, tracking_send)
        except _TooLarge:
            if not started:
                await _send_error(send, BodyTooLarge(
                    "body_too_large", f"request body must be at most {self.limit} bytes"))


class _TooLarge(Exception):
    pass


async def _send_error(send: Any, err: JobcoordError) -> None:
    body = json.dumps(err.to_json()).encode()
    await send({"type": "http.response.start", "status": status_of(err),
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _error_response(err: JobcoordError) -> JSONResponse:
    return JSONResponse(err.to_json(), status_code=status_of(err), headers=headers_of(err))


# --- the application -------------------------------------------------------------------------


def create_app(coordinator: Any, *, pool_size: int = 8, poll_s: float = 0.5,
               reap_every: float = 5.0,
               emit: Callable[[dict[str, Any]], None] | None = None) -> FastAPI:
    """The API over `coordinator`. `reap_every` 0 turns the reaper timer off."""
    srv = Server(coordinator, pool_size=pool_size, poll_s=poll_s, reap_every=reap_every,
                 emit=emit)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        srv.wakeup = Wakeup()
        tasks = [asyncio.create_task(srv.poller())]
        if reap_every > 0:
            tasks.append(asyncio.create_task(srv.reaper()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            srv.notify()
            srv.pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="jobcoord", version=__version__, lifespan=lifespan,
                  responses=_ERRORS,
                  description="A durable job coordinator. Every /v1 route needs "
                              "`Authorization: Bearer <token>`.")
    app.state.server = srv
    bearer = HTTPBearer(auto_error=False, description="A token from `jobcoord token create`.")

    # -- errors: one JSON shape for all of them --

    @app.exception_handler(JobcoordError)
    async def _jobcoord_error(_request: Request, exc: JobcoordError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError
                                ) -> JSONResponse:
        # 400, not FastAPI's 422: invalid input is 400 everywhere in this API (the CLI's
        # exit 2); 422 is kept for an artifact whose digest does not match.
        parts = []
        for e in exc.errors()[:5]:
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{where or 'body'}: {e.get('msg', 'invalid')}")
        return _error_response(InvalidInput("invalid_input", "; ".join(parts) or "invalid"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code,
                                                                  f"http_{exc.status_code}")
        return JSONResponse({"error": {"code": code, "message": str(exc.detail)}},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        emit_ = srv.emit
        emit_({"event": "internal_error", "message": f"{type(exc).__name__}: {exc}"})
        return _error_response(JobcoordError("internal_error", "unexpected server error"))

    # -- identity --

    async def identity(creds: Annotated[HTTPAuthorizationCredentials | None,
                                        Depends(bearer)]) -> Identity:
        if creds is None:
            raise Unauthorized("unauthorized", "missing token: send Authorization: Bearer "
                               "<token>")
        # Looked up on every request: a revoked token fails on its very next request.
        who = await srv.call(tokens.authenticate, coordinator.db, creds.credentials)
        if who is None:
            raise Unauthorized("unauthorized", "unknown or revoked token")
        return who

    def role(*allowed: str) -> Any:
        async def check(who: Annotated[Identity, Depends(identity)]) -> Identity:
            if who.role not in allowed:
                raise Forbidden("forbidden", f"a {who.role} token may not do this (needs "
                                f"{' or '.join(allowed)})")
            return who
        return Depends(check)

    async def strict_json(request: Request) -> None:
        """Parse the raw body strictly (NaN, Infinity, duplicate keys, deep nesting are
        refused), the same checks the Coordinator applies to payloads."""
        raw = await request.body()
        if raw:
            v.json_value(raw, "body", max_bytes=srv.max_body, require_object=True,
                         too_large_code="body_too_large")

    Reader = Annotated[Identity, role("submitter", "viewer", "operator")]
    WorkerId = Annotated[Identity, role("worker")]
    Operator = Annotated[Identity, role("operator")]
    JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX)]
    strict = [Depends(strict_json)]

    def scope(who: Identity) -> str | None:
        """The tenant a token sees: its own; a submitter or viewer without one sees the
        default tenant; an operator without one sees all."""
        from ..core.common import DEFAULT_TENANT

        if who.tenant is not None:
            return who.tenant
        return None if who.role == "operator" else DEFAULT_TENANT

    def worker_of(who: Identity) -> str:
        assert who.worker_id is not None  # the schema's check: worker tokens name one
        return who.worker_id

    # -- unauthenticated --

    @app.get("/healthz", responses={200: {"description": "serving"}})
    async def healthz() -> dict[str, Any]:
        db = coordinator.db
        await srv.call(lambda: db.read(lambda conn: db.run(conn, rs.ALIVE).scalar(),
                                       "healthz"))
        return {"ok": True, "version": __version__}

    # -- anyone with a token --

    @app.get("/v1/whoami")
    async def whoami(who: Annotated[Identity, Depends(identity)]) -> dict[str, Any]:
        import dataclasses

        return {"name": who.name, "role": who.role, "tenant": who.tenant,
                "worker_id": who.worker_id,
                "policy": dataclasses.asdict(coordinator.policy)}

    # -- submitters (and operators) --

    @app.post("/v1/jobs", status_code=201, dependencies=strict,
              responses={200: {"description": "the same Idempotency-Key and payload: the "
                                              "existing job"}})
    async def submit(body: SubmitBody, response: Response,
                     who: Annotated[Identity, role("submitter", "operator")],
                     idempotency_key: Annotated[str | None, Header(max_length=200)] = None
                     ) -> dict[str, Any]:
        from ..core.common import DEFAULT_TENANT

        got = await srv.call(coordinator.enqueue, body.kind, body.payload or {},
                             priority=body.priority, role=body.role,
                             tenant=who.tenant or DEFAULT_TENANT, key=idempotency_key,
                             max_attempts=body.max_attempts, deadline_s=body.deadline_s,
                             delay_s=body.delay_s, needs=body.needs)
        # Answered only now, after the commit; a waiting long-poll hears of it at once.
        srv.notify(1)
        if not got["created"]:
            response.status_code = 200
        response.headers["Location"] = f"/v1/jobs/{got['job_id']}"
        return got

    @app.get("/v1/jobs")
    async def list_jobs(who: Reader, status: str | None = None, kind: str | None = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = 100
                        ) -> dict[str, Any]:
        return await srv.call(coordinator.jobs, status=status, kind=kind, tenant=scope(who),
                              limit=limit)

    @app.get("/v1/jobs/{job_id}")
    async def show(job_id: JobId, who: Reader) -> dict[str, Any]:
        return await srv.call(coordinator.show, job_id, tenant=scope(who))

    @app.get("/v1/jobs/{job_id}/explain")
    async def explain(job_id: JobId, who: Reader) -> dict[str, Any]:
        return await srv.call(coordinator.explain, job_id, tenant=scope(who))

    # -- workers: the worker id is the token's --

    @app.post("/v1/heartbeat", dependencies=strict)
    async def heartbeat(body: HeartbeatBody, who: WorkerId) -> dict[str, Any]:
        return await srv.call(coordinator.heartbeat, worker_of(who), roles=body.roles,
                              readings=body.readings, kinds=body.kinds)

    @app.post("/v1/claims", dependencies=strict,
              responses={204: {"description": "nothing eligible within `wait` seconds"}})
    async def claim(request: Request, who: WorkerId, body: ClaimBody | None = None) -> Any:
        body = body or ClaimBody()
        worker = worker_of(who)
        end = time.monotonic() + body.wait
        woken = False
        while True:
            got = await srv.call(coordinator.claim, worker, lease_s=body.lease_s,
                                 kinds=body.kinds)
            if got["job"] is not None:
                return got
            if woken:
                srv.notify(1)  # the job was not for this worker (or taken): pass the turn on
            left = end - time.monotonic()
            # Keep waiting only while the answer is "nothing for you yet" (a limit's slot or
            # the worker's capacity may free up meanwhile): a gate or a stale heartbeat is
            # said at once, the worker must act on it.
            if left <= 0 or got["reason"] not in NOT_YET:
                if body.wait > 0 and got["reason"] in NOT_YET:
                    return Response(status_code=204)
                return got
            assert srv.wakeup is not None
            woken = await srv.wakeup.wait(min(left, srv.poll_s * 2))
            if await request.is_disconnected():
                # Nobody would hear of a job claimed now: it would sit leased until reaped.
                return Response(status_code=204)

    @app.post("/v1/jobs/{job_id}/renew", dependencies=strict)
    async def renew(job_id: JobId, body: RenewBody, who: WorkerId) -> dict[str, Any]:
        return await srv.call(coordinator.renew, job_id, worker_of(who), body.epoch,
                              lease_s=body.lease_s)

    def _complete(job_id: int, worker: str, body: CompleteBody) -> dict[str, Any]:
        try:
            got = coordinator.complete(job_id, worker, body.epoch, body.result,
                                       provenance=body.provenance)
        except Refused as e:
            if (e.code == "job_finished" and e.details.get("status") == "succeeded"
                    and e.details.get("accepted_epoch") == body.epoch
                    and _completed_by(coordinator, job_id, body.epoch, worker)):
                # The same completion sent again (its answer was lost): it was accepted.
                return {"job_id": job_id, "status": "succeeded", "epoch": body.epoch,
                        "already_accepted": True}
            raise
        # A test makes the answer to a committed completion get lost here.
        faults.point("http.complete.after_commit")
        return got

    @app.post("/v1/jobs/{job_id}/complete", dependencies=strict)
    async def complete(job_id: JobId, body: CompleteBody, who: WorkerId) -> dict[str, Any]:
        return await srv.call(_complete, job_id, worker_of(who), body)

    @app.post("/v1/jobs/{job_id}/fail", dependencies=strict)
    async def fail(job_id: JobId, body: FailBody, who: WorkerId) -> dict[str, Any]:
        got = await srv.call(coordinator.fail, job_id, worker_of(who), body.epoch, body.error,
                             permanent=body.permanent, reason=body.reason)
        if got["status"] == "waiting":
            srv.notify()
        return got

    @app.post("/v1/jobs/{job_id}/effect", dependencies=strict)
    async def effect(job_id: JobId, body: EpochBody, who: WorkerId) -> dict[str, Any]:
        return await srv.call(coordinator.mark_effect, job_id, worker_of(who), body.epoch)

    @app.post("/v1/jobs/{job_id}/checkpoint", dependencies=strict)
    async def checkpoint(job_id: JobId, body: CheckpointBody, who: WorkerId
                         ) -> dict[str, Any]:
        return await srv.call(coordinator.checkpoint, job_id, worker_of(who), body.epoch,
                              body.name, body.data)

    # -- operators --

    @app.post("/v1/jobs/{job_id}/cancel")
    async def cancel(job_id: JobId, who: Operator) -> dict[str, Any]:
        return await srv.call(coordinator.cancel, job_id, tenant=scope(who))

    @app.post("/v1/jobs/{job_id}/retry")
    async def retry(job_id: JobId, who: Operator) -> dict[str, Any]:
        got = await srv.call(coordinator.retry, job_id, tenant=scope(who))
        srv.notify()
        return got

    @app.post("/v1/jobs/{job_id}/reconcile", dependencies=strict)
    async def reconcile(job_id: JobId, body: ReconcileBody, who: Operator) -> dict[str, Any]:
        got = await srv.call(coordinator.reconcile, job_id, body.as_status, body.reason,
                             result=body.result, tenant=scope(who))
        srv.notify()
        return got

    @app.post("/v1/prune", dependencies=strict)
    async def prune(body: PruneBody, who: Operator) -> dict[str, Any]:
        return await srv.call(coordinator.prune, body.older_than, statuses=body.statuses,
                              tenant=scope(who), dry_run=body.dry_run)

    @app.get("/v1/workers")
    async def workers(who: Operator) -> dict[str, Any]:
        return await srv.call(coordinator.workers)

    def openapi() -> dict[str, Any]:
        # Invalid input is answered 400 with the JSON error (see _validation_error): drop the
        # 422 FastAPI documents by default, so the document says what the server does.
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version,
                              description=app.description, routes=app.routes)
            for item in doc.get("paths", {}).values():
                for operation in item.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    mount_dashboard(app)  # /metrics and the web dashboard (dashboard.py)
    app.add_middleware(BodyLimit, limit=srv.max_body)
    return app


def _completed_by(coordinator: Any, job_id: int, epoch: int, worker: str) -> bool:
    """Was the accepted completion of `job_id` at `epoch` this worker's?"""
    events = coordinator.show(job_id)["events"]
    return any(e["reason"] == "completed" and e["epoch"] == epoch and e["worker_id"] == worker
               for e in events)
