"""Pure ASGI middleware: the request body limits, and the last answer to a bug.

A JSON body may be at most the payload (or result) limit plus an envelope, counted from
Content-Length and again as the bytes arrive. An artifact upload has its own limit, which its
route counts while it streams the body into the store. An unexpected exception is answered
500 `internal_error` here and goes no further: left to Starlette, the answer was sent, then
the exception re-raised to uvicorn, which printed its traceback and reset the connection, so
a client's next request on that kept-alive connection failed too."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from ..errors import InvalidInput, JobcoordError, StorageUnavailable
from .errors import BodyTooLarge, headers_of, status_of
from .state import DEFAULT_UPLOAD_IDLE_S

#: The path of an artifact (upload and download): its body is bytes, not JSON.
ARTIFACT_PATH = re.compile(r"/v1/jobs/[^/]+/artifacts/")
#: How often a request waiting for the rest of its body looks whether the server is stopping.
STOP_LOOK_S = 0.25


class BodyLimit:
    def __init__(self, app: Any, limit: int, artifact_limit: int,
                 stopping: threading.Event | None = None,
                 idle_s: float = DEFAULT_UPLOAD_IDLE_S):
        self.app = app
        self.limit = limit
        self.artifact_limit = artifact_limit
        #: A body that sends nothing for this long is refused (`serve --upload-idle`).
        self.idle_s = idle_s
        #: Set as the server begins to stop (Server.stopping).
        self.stopping = stopping or threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        artifact = ARTIFACT_PATH.match(scope["path"]) is not None
        limit = self.artifact_limit if artifact else self.limit
        if scope["method"] in ("POST", "PUT") and scope["path"].startswith("/v1/") \
                and not artifact:
            # Bodies are JSON whatever the client says: `curl -d '{...}'` labels its body
            # form-encoded. The JSON is parsed strictly all the same. Two labels are left
            # as they are, for the route to refuse (a header given twice, 400).
            headers = scope.get("headers", ())
            if sum(n == b"content-type" for n, _ in headers) <= 1:
                scope = dict(scope)
                scope["headers"] = [(n, val) for n, val in headers if n != b"content-type"]
                scope["headers"].append((b"content-type", b"application/json"))
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > limit:
                    # The connection stays open for the rest of the body, which the
                    # protocol drops (for `--upload-idle` s in all): closed at once with
                    # it unread, a client that sends its whole body before reading (Python's
                    # http.client) met a reset, never this answer.
                    what = "an artifact" if artifact else "a request body"
                    await send_error(send, BodyTooLarge(
                        "artifact_too_large" if artifact else "body_too_large",
                        f"{what} must be at most {limit} bytes"
                        + ("" if artifact else " (keep large data as an artifact)")),
                        close=False)
                    return
        if artifact:
            # The upload route counts the bytes itself as it stores them.
            await self.app(scope, receive, send)
            return
        seen = 0
        tracked = TrackedSend(send)
        # The body's last part has arrived (a GET has none to wait for): from then on a
        # receive is the app listening for a disconnect, passed through untouched, so a
        # response under way (a download) keeps its grace when the server stops.
        whole = scope["method"] not in ("POST", "PUT", "PATCH")

        async def arriving() -> dict[str, Any] | JobcoordError:
            """The body's next part, or the error to answer instead: `server_stopping` when
            the server begins to stop first (a slow client's body was cut after the stop's
            grace, a plain-text 500 and a traceback), `body_incomplete` when nothing came
            for `idle_s` (a body that stopped sending held its request, and its connection,
            for as long as the client kept it open).

            Waited for in slices of at most STOP_LOOK_S, each a timeout on this request's
            own task: a task of its own per part cost the server more than reading the
            JSON. A slice that ends cancels the wait inside uvicorn's `receive`, which has
            taken nothing yet at that point (it waits for the part to be there, then hands
            it over without waiting again), so no part is lost: it is taken on the next
            slice."""
            loop = asyncio.get_running_loop()
            give_up = loop.time() + self.idle_s
            while True:
                try:
                    async with asyncio.timeout(min(STOP_LOOK_S,
                                                   max(0.0, give_up - loop.time()))):
                        return await receive()
                except TimeoutError:
                    pass
                if self.stopping.is_set():
                    return StorageUnavailable(
                        "server_stopping", "the server is stopping before this "
                        "request's body arrived; nothing was done: send it again")
                if loop.time() >= give_up:
                    return InvalidInput(
                        "body_incomplete", f"the request's body sent nothing for "
                        f"{self.idle_s:g} s before its end; nothing was done")

        async def limited() -> dict[str, Any]:
            nonlocal seen, whole
            if tracked.closed:
                return {"type": "http.disconnect"}
            if whole:  # a disconnect the app listens for: nothing to wait out
                return await receive()
            message = await arriving()
            if isinstance(message, JobcoordError):
                # Answered here (closing the connection) and the app told the client left,
                # as for a body over the limit below.
                if not tracked.started:
                    await send_error(send, message)
                tracked.closed = True
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                whole = not message.get("more_body", False)
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Answered here, and the app is told the client left: raising instead
                    # reached FastAPI's body reader, which answers any error 400.
                    if not tracked.started:  # the rest is dropped, as above
                        await send_error(send, BodyTooLarge(
                            "body_too_large",
                            f"a request body must be at most {self.limit} bytes (keep large "
                            "data as an artifact)"), close=False)
                    tracked.closed = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, limited, tracked)


class TrackedSend:
    """The ASGI `send`, remembering whether the response has started: once it has, an error
    can no longer be answered, only logged."""

    def __init__(self, send: Any):
        self.send = send
        self.started = False
        #: The answer was sent past the app (a body over the limit): what the app sends
        #: after it goes nowhere.
        self.closed = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


async def send_error(send: Any, err: JobcoordError, *, status: int | None = None,
                     headers: Sequence[tuple[bytes, bytes]] = (), close: bool = True) -> None:
    """`err` in the JSON error shape, on the raw ASGI channel (below FastAPI's handlers):
    its mapped status unless `status` says otherwise; closing the connection by default,
    as a request refused before its body was read leaves that body unread."""
    body = error_bytes(err)
    await send({"type": "http.response.start", "status": status or status_of(err),
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *([(b"connection", b"close")] if close else []), *headers]})
    await send({"type": "http.response.body", "body": body})


def error_bytes(err: JobcoordError) -> bytes:
    """`err`'s JSON body rendered as every other answer is (Starlette's JSONResponse): one
    form for clients that compare or log the bytes."""
    return json.dumps(err.to_json(), ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


def error_response(err: JobcoordError) -> JSONResponse:
    return JSONResponse(err.to_json(), status_code=status_of(err), headers=headers_of(err))


class CatchBugs:
    """Outermost of jobcoord's middleware: whatever escaped every handler is a bug."""

    def __init__(self, app: Any, emit: Callable[[dict[str, Any]], None]):
        self.app = app
        self.emit = emit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            # The client went away before its body was read: nobody to answer, nothing
            # recorded, and no bug (an operator alerting on internal_error was woken).
            return
        except Exception as exc:
            # The class and message only: no traceback, no request data (a header could
            # carry a token).
            self.emit({"event": "internal_error", "message": f"{type(exc).__name__}: {exc}"})
            if not tracked.started:
                await send_error(send, JobcoordError("internal_error",
                                                     "unexpected server error"))
