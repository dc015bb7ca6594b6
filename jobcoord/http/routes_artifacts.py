"""Artifact routes: a worker uploads the files of its live attempt (streamed into the store,
the digest it names verified by the server), readers of the job's tenant list and download
accepted ones (copied out of the store verified first: a corrupt object is never served).
Every rule is jobcoord.artifacts.rules': names, fencing, limits, verification."""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import asyncio
import concurrent.futures
import hashlib
import io
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.requests import ClientDisconnect

from .. import leftovers
from ..artifacts.objects import parse_digest, validate_name
from ..errors import InvalidInput, Refused, StorageUnavailable
from ..tokens import Identity
from .bodies import JSONRoute, error_responses
from .deps import Digits, JobId, Reader, Srv, WorkerId, bearer_token, scope, worker_of
from .limits import send_error
from .routes_worker import fenced_step
from .state import Server

router = APIRouter(route_class=JSONRoute)


class AnyNameConvertor(PathConvertor):
    """The rest of the path, newlines too: Starlette's `path` (`.*`) stops at one, and
    a name holding `%0A` was 404 instead of the name rule's 400."""

    regex = r"[\s\S]*"


register_url_convertor("artifact_name", AnyNameConvertor())

#: A download is cut when its reader took nothing for this many times --upload-idle. Only
#: a whole send that waits counts as nothing taken, and the kernel wakes a sender only
#: once about a third of its socket's buffer (up to some 4 MB) has drained: a steady
#: reader slower than about 1.4 MB per limit looks idle. Four times the upload's limit
#: (2 min by default) cuts only readers slower than about 12 KB/s.
DOWNLOAD_IDLE_FACTOR = 4
#: Downloads' verified copies: a directory each in the temporary directory.
DOWNLOAD_PREFIX = "jobcoord-download-"
_COPY = re.compile(rf"{DOWNLOAD_PREFIX}(?P<dir>){leftovers.RANDOM}")


def sweep_download_copies() -> int:
    """Remove the downloads' copies a server killed outright left (up to twice
    --max-artifact-bytes each time): those no live server holds. How many."""
    return leftovers.sweep(tempfile.gettempdir(), _COPY)


#: How often an upload waiting for bytes looks whether the server is stopping.
STOP_LOOK_S = 0.25
#: Media types that say nothing about an upload's bytes (curl's default label for a body).
_UNLABELLED = ("application/x-www-form-urlencoded", "multipart/form-data")


class BodyStream(io.RawIOBase):
    """A blocking, binary file object over the request's body as it arrives, for the store's
    put running on the server's thread pool: each read waits for the next chunk on the event
    loop. Counts the bytes against the upload limit as they come."""

    def __init__(self, chunks: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop,
                 limit: int, idle_s: float, stopping: threading.Event):
        super().__init__()
        self._chunks = chunks
        self._loop = loop
        self._limit = limit
        self._idle_s = idle_s
        self._stopping = stopping
        self._pending = memoryview(b"")
        self._done = False
        self.seen = 0
        self.name = "the upload"

    async def _next(self) -> bytes | None:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        except ClientDisconnect:
            raise InvalidInput("upload_incomplete", "the client went away before the "
                               "upload's last byte; nothing was stored") from None

    def readable(self) -> bool:
        return True

    def _wait_for_chunk(self) -> bytes | None:
        """The next chunk, waited for at most the idle time, and given up at once when the
        server begins to stop (its answer then comes before the grace runs out)."""
        waiting = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
        give_up = time.monotonic() + self._idle_s
        while True:
            try:
                return waiting.result(timeout=min(STOP_LOOK_S, self._idle_s))
            except concurrent.futures.TimeoutError:
                if self._stopping.is_set():
                    waiting.cancel()
                    raise StorageUnavailable("server_stopping", "the server is stopping; "
                                             "nothing was stored, send it again") from None
                if time.monotonic() >= give_up:
                    waiting.cancel()
                    raise InvalidInput("upload_incomplete", f"the upload sent nothing for "
                                       f"{self._idle_s:g} s; nothing was stored") from None

    def readinto(self, buf: Any) -> int:
        while not self._pending:
            if self._done:
                return 0
            chunk = self._wait_for_chunk()
            if chunk is None:
                self._done = True
                return 0
            self.seen += len(chunk)
            if self.seen > self._limit:
                raise InvalidInput("artifact_too_large", f"an upload may be at most "
                                   f"{self._limit} bytes; nothing was stored")
            self._pending = memoryview(chunk)
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def utf8_name(request: Request, name: str) -> str:
    """The name from the path, refused when its percent-escapes are not UTF-8: the server
    decodes them with U+FFFD for each bad byte, so `a%FFb` and `a%FEb` would both be stored
    as one name `a\ufffdb`."""
    from urllib.parse import unquote_to_bytes

    raw = request.scope.get("raw_path")
    if raw is not None:
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("invalid_artifact_name", "invalid artifact name: its "
                               "percent-escapes are not UTF-8") from None
    return name


@router.put(
    "/v1/jobs/{job_id}/artifacts/{name:artifact_name}",
    responses={**error_responses(
        (413, "larger than the server's upload limit or the kind's artifact limit"),
        (422, "artifact_invalid: the bytes do not hash to the expected digest; nothing was "
              "stored")),
        200: {"description": "staged under the attempt's lease; linked to the result by its "
                             "accepted completion"}},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def upload(request: Request, job_id: JobId, name: str, who: WorkerId, srv: Srv,
                 epoch: Annotated[int, Query(ge=0, le=2**31 - 1), Digits],
                 digest: Annotated[str | None, Query(max_length=100)] = None,
                 media_type: Annotated[str | None, Query(max_length=201)] = None,
                 x_content_digest: Annotated[str | None, Header(max_length=100)] = None,
                 content_type: Annotated[str | None, Header(max_length=201)] = None
                 ) -> dict[str, Any]:
    """Upload an artifact of this worker's live attempt at `epoch`, streamed. The expected
    digest (`sha256:<hex>`) is the `X-Content-Digest` header or the `digest` query
    parameter; the server hashes the bytes as they arrive and stores nothing on a
    mismatch. The media type is `media_type`, else Content-Type, else guessed from the
    name."""
    validate_name(utf8_name(request, name))  # before any byte is read: the CLI's own rule
    if digest is not None and x_content_digest is not None and digest != x_content_digest:
        raise InvalidInput("invalid_digest", "the X-Content-Digest header and the digest "
                           "parameter disagree")
    expected = x_content_digest or digest
    if expected is None:
        raise InvalidInput("digest_required", "name the expected digest: X-Content-Digest: "
                           "sha256:<hex> (or ?digest=)")
    parse_digest(expected)
    if "artifacts" not in srv.c.features and not await srv.call(srv.c.has_feature,
                                                                  "artifacts"):
        raise Refused("feature_missing", "artifact storage is not installed in this "
                      "database: run `jobcoord migrate --with artifacts`")
    if media_type is None and content_type and not content_type.startswith(_UNLABELLED):
        media_type = content_type.split(";")[0].strip()
    body = BodyStream(request.stream(), asyncio.get_running_loop(), srv.max_artifact_bytes,
                      srv.upload_idle_s, srv.stopping)
    with srv.upload_slot(worker_of(who)):  # on the event loop: no lock needed
        # The token, read before the first byte, is judged again where the row is
        # recorded: an upload streaming when it was revoked records nothing (401).
        staged = await srv.transfer(srv.judged, bearer_token(request), who, fenced_step(
            srv, srv.c.put_artifact, job_id, epoch, name, body, media_type,
            expected_digest=expected, max_bytes=srv.max_artifact_bytes))
    return staged


@router.get("/v1/jobs/{job_id}/artifacts")
async def list_artifacts(job_id: JobId, who: Reader, srv: Srv) -> dict[str, Any]:
    """The job's accepted artifacts."""
    return await _accepted(srv, job_id, who)


async def _accepted(srv: Server, job_id: int, who: Identity) -> dict[str, Any]:
    if "artifacts" not in srv.c.features and not await srv.call(srv.c.has_feature,
                                                                  "artifacts"):
        # Without the feature no job has artifacts: a visible job's list is empty.
        await srv.call(srv.c.show, job_id, tenant=scope(who))
        return {"artifacts": []}
    return await srv.call(srv.c.artifacts, job_id, tenant=scope(who))


@router.get(
    "/v1/jobs/{job_id}/artifacts/{name:artifact_name}", response_class=FileResponse,
    responses={200: {"description": "the artifact's bytes, verified against its digest "
                                    "(X-Content-Digest) before the first byte is sent",
                     "content": {"application/octet-stream": {
                         "schema": {"type": "string", "format": "binary"}}}},
               206: {"description": "the parts of the artifact a Range asked for (its "
                                    "whole was verified first); several parts as "
                                    "multipart/byteranges",
                     "content": {"application/octet-stream": {
                         "schema": {"type": "string", "format": "binary"}},
                                 "multipart/byteranges": {
                         "schema": {"type": "string", "format": "binary"}}}},
               **error_responses((416, "range_not_satisfiable: every range asked for lies "
                                       "past the artifact's end (Content-Range: bytes */SIZE)"))})
async def download(request: Request, job_id: JobId, name: str, who: Reader, srv: Srv
                   ) -> FileResponse:
    """Download an accepted artifact of a job this token may see."""
    name = validate_name(utf8_name(request, name))
    listed = await _accepted(srv, job_id, who)
    found = next((a for a in listed["artifacts"] if a["name"] == name), None)
    if found is None:
        raise Refused("artifact_not_found", f"job {job_id} has no accepted artifact "
                      f"{name!r}", job_id=job_id, name=name)
    return await artifact_file(srv, job_id, found)


#: A Range as HTTP writes it (RFC 9110 14.1.1): bytes=, then first-last, first- or -suffix,
#: in ASCII digits, separated by commas.
_RANGE = re.compile(r"bytes=(?:[0-9]+-[0-9]*|-[0-9]+)(?:[ \t]*,[ \t]*(?:[0-9]+-[0-9]*|-[0-9]+))*")


def _starts_inside(part: str, size: int) -> bool:
    """Whether one range of a Range header (`first-last`, `first-`, `-suffix`) starts inside
    `size` bytes. Digits past 30 are past any file (and int() refuses past 4300)."""
    first, _, last = part.partition("-")
    if not first:
        return size > 0 and (len(last) > 30 or int(last) > 0)
    return len(first) <= 30 and int(first) < size


class StagedFile(FileResponse):
    """A download's verified copy sent as the answer, and removed (its room in the staging
    budget given back) once the sending ends, however it ends: sent, the client gone, a
    reader that took nothing for `idle_s` seconds cut (two stalled readers held the whole
    budget, and every other large download was 503, for as long as they stayed), or a
    reader cut by the server's stop. A cut ends the answer quietly, not as a traceback."""

    def __init__(self, path: str, discard: Callable[[], None], idle_s: float,
                 **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._discard = discard
        self._idle_s = idle_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope = await self._ranged(scope, send)
        if scope is None:
            self._discard()
            return
        moved = time.monotonic()

        async def sent(message: Any) -> None:
            nonlocal moved
            await send(message)  # waits while the reader's window is full
            moved = time.monotonic()

        sending = asyncio.ensure_future(super().__call__(scope, receive, sent))
        try:
            while not sending.done():
                await asyncio.wait({sending}, timeout=max(STOP_LOOK_S, self._idle_s / 4))
                if not sending.done() and time.monotonic() - moved > self._idle_s:
                    sending.cancel()  # the reader took nothing for the idle limit
                    break
            if sending.done() and not sending.cancelled():
                sending.result()
        except asyncio.CancelledError:
            sending.cancel()  # the server's stop
        finally:
            self._discard()


    async def _ranged(self, scope: Any, send: Any) -> Any:
        """The request's Range as this API answers it: a malformed one is ignored (HTTP
        allows it: 200, the whole artifact), one past the end is 416 in the JSON error
        shape (None: answered). Starlette answered both in plain text."""
        from starlette.datastructures import Headers
        from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable

        headers = Headers(scope=scope)
        wanted = headers.get("range")
        if wanted is None:
            return scope
        found = os.stat(self.path)
        self.set_stat_headers(found)  # Last-Modified beside the ETag, as If-Range compares
        if_range = headers.get("if-range")
        if if_range is not None and not self._should_use_range(if_range):
            return scope  # the copy changed since: the whole of it (200), as HTTP says
        size = found.st_size
        unranged = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                         if k.lower() != b"range"]}
        if not _RANGE.fullmatch(wanted):
            return unranged  # `+1`, `1_0`, spaces: Python's int() took them
        parts = [p.strip() for p in wanted[len("bytes="):].split(",")]
        inside = [p for p in parts if _starts_inside(p, size)]
        if inside and len(inside) < len(parts):
            # A set of ranges is satisfiable when any of them is (RFC 9110 14.1.1): the
            # parts past the end are dropped, not the whole request refused.
            wanted = "bytes=" + ",".join(inside)
            scope = {**unranged, "headers": [*unranged["headers"],
                                             (b"range", wanted.encode())]}
        try:
            if not inside:  # every part starts past the end (digits past int()'s too)
                raise RangeNotSatisfiable(size)
            self._parse_range_header(wanted, size)
        except MalformedRangeHeader:
            return unranged
        except RangeNotSatisfiable:
            err = Refused("range_not_satisfiable", f"the range {wanted[:80]!r} lies past "
                          f"the artifact's end ({size} bytes)", size=size)
            await send_error(send, err, status=416, close=False,
                             headers=[(b"content-range", f"bytes */{size}".encode())])
            return None
        return scope


#: An artifact is a worker's bytes under a media type the worker chose (text/html, an SVG
#: with a script): never sniffed into something else, and were a browser to render one
#: despite the attachment, in a sandbox with nothing allowed.
DOWNLOAD_GUARDS = {"X-Content-Type-Options": "nosniff",
                   "Content-Security-Policy": "default-src 'none'; sandbox"}


async def artifact_file(srv: Server, job_id: int, found: dict[str, Any]) -> FileResponse:
    """The accepted artifact `found` (an entry of the job's artifact list) as the answer of a
    download; the API's route and the dashboard's both answer with it.

    Copied out verified (size and digest) first, then streamed from the copy and removed:
    a corrupt or missing object is a 503 before any byte, never served. The copy is made in
    a directory of its own that only this process's user may enter (the object's bytes are
    the tenant's)."""
    release = srv.reserve_staging(found["size"])
    try:
        directory = tempfile.mkdtemp(prefix=DOWNLOAD_PREFIX)
    except BaseException:
        release()
        raise
    # Held while it lives: a server starting beside this one (the same temporary
    # directory) leaves it; one killed outright has its copy removed by the next start.
    held = [fd] if (fd := leftovers.hold(directory)) is not None else []
    path = os.path.join(directory, "artifact")

    def discard() -> None:
        shutil.rmtree(directory, ignore_errors=True)
        leftovers.release(held)
        release()

    try:
        await srv.transfer(srv.c.get_artifact, job_id, found["name"], path)
    except BaseException:
        discard()
        raise
    etag = hashlib.sha256(found["digest"].encode()).hexdigest()[:32]
    return StagedFile(path, discard, DOWNLOAD_IDLE_FACTOR * srv.upload_idle_s,
                      media_type=found["media_type"] or "application/octet-stream",
                      filename=found["name"],
                      headers={"X-Content-Digest": found["digest"], "ETag": f'"{etag}"',
                               **DOWNLOAD_GUARDS})
