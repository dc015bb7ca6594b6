"""The remote coordinator: what a worker on another machine uses in place of a Coordinator.

Same method names, arguments, return shapes and exceptions as jobcoord.service.Coordinator
for everything the worker runtime calls (heartbeat, claim, renew, complete,
complete_and_claim, fail, mark_effect, checkpoint, put_artifact, reap, `.policy`), over HTTP
with one reused connection pool, timeouts, and retries with backoff for network errors.

The worker id and tenant are the token's and never sent: a `worker_id` or `tenant` argument
naming the token's own (or no tenant) is taken, one naming another is refused as invalid
input, as the CLI refuses a `--worker` or `--tenant` the token is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import socket
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from .. import leftovers
from .. import validate as v
from ..artifacts.names import media_type_of, validate_name
from ..core.items import (
    COMPLETE_FIELDS,
    DEFAULT_TENANT,
    MAX_BATCH,
    NO_KINDS,
    REQUIRED,
    batch_items,
    checked_item,
    checkpoint_text,
    completion_texts,
    earlier_in_batch,
    failure_texts,
    job_and_epoch,
    payload_text,
    readings_value,
)
from ..errors import DatabaseBusy, InvalidInput, JobcoordError, StorageUnavailable
from ..policy import Policy
from ..text import is_header_text
from .errors import ERROR_CLASS_HEADER, error_from_response, lasting

#: How long a call keeps retrying network errors before it says the server is unreachable;
#: the worker runtime then retries on its own schedule while the lease may still be its own.
DEFAULT_RETRY_S = 10.0
#: An upload from a stream is spooled to a temporary file named so (it may be sent twice).
SPOOL_PREFIX = "jobcoord-upload-"
#: How the remote coordinator names itself to the server.
USER_AGENT = "jobcoord-remote"
#: Longest long-poll a claim may ask for (the server's bound; the client's too).
MAX_WAIT_S = 30.0
#: How long a completion of an attempt with uploaded artifacts waits for its answer: the
#: server checks them first (a validator may take up to 300 s), keeping the lease meanwhile.
CHECKS_TIMEOUT_S = 900.0


def server_base(server: Any) -> str:
    """`--server URL` checked as a server's base address (scheme, host, optional port and
    path prefix) and without its trailing slash; the API's paths are appended to it, so a
    query, a fragment or a trailing /v1 would make every call go astray (InvalidInput)."""
    from urllib.parse import urlsplit

    if not isinstance(server, str) or not server.lower().startswith(("http://", "https://")):
        raise InvalidInput("invalid_input", f"--server must be an http:// or https:// URL, "
                           f"got {server!r}")
    if not server.isprintable():
        # (urlsplit drops a tab or a newline silently; httpx refused them on the first call)
        raise InvalidInput("invalid_input", f"--server {server!r}: a URL holds no control "
                           "or other unprintable characters")
    try:
        parts = urlsplit(server)
        port = parts.port
    except ValueError as e:  # an unclosed IPv6 bracket, a port out of range or not a number
        raise InvalidInput("invalid_input", f"--server {server!r}: not a valid URL "
                           f"({e})") from None
    if parts.query or parts.fragment or "?" in server or "#" in server:
        raise InvalidInput("invalid_input", f"--server {server!r}: the server's address "
                           "takes no query (?) or fragment (#)")
    if port == 0:
        raise InvalidInput("invalid_input", f"--server {server!r}: not a valid port (0)")
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise InvalidInput("invalid_input", f"--server {server!r}: name the server's host "
                           "(and no user or password: the token says who you are)")
    base = server.rstrip("/")
    if base.endswith("/v1"):
        raise InvalidInput("invalid_input", f"--server {server!r}: give the server's base "
                           f"address, without /v1 ({base[:-3]!r})")
    return base


class RemoteCoordinator:
    #: The worker runtime completes and claims the next job in one request when it would
    #: claim next anyway (one round trip and one commit per job instead of two).
    chained_claims = True

    def __init__(self, server: str, token: str, *, claim_wait: float = 20.0,
                 timeout: float = 10.0, retry_s: float = DEFAULT_RETRY_S,
                 verify: Any = True):
        server = server_base(server)
        if not isinstance(token, str):
            raise InvalidInput("invalid_input", "the token is text (the secret `token create` "
                               f"printed), not {type(token).__name__}")
        claim_wait = v.finite_seconds(claim_wait, "claim_wait", 0, MAX_WAIT_S)
        timeout = v.finite_seconds(timeout, "timeout", 0, 3600, lo_inclusive=False)
        retry_s = v.finite_seconds(retry_s, "retry_s", 0, 86400)
        token = token.strip()
        if not token:
            raise InvalidInput("invalid_input", "the token file is empty")
        if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            # A header cannot carry it (httpx would raise, or split the request).
            raise InvalidInput("invalid_input", "the token holds characters no token has "
                               "(only printable ASCII without spaces)")
        self.server = server
        self.claim_wait = claim_wait
        self.timeout = timeout
        self.retry_s = retry_s

        def connections() -> _Connections:
            return _Connections(server, token, timeout, verify)

        self._client = connections()
        # Claims (long-polls) go over a connection of their own, whose socket is kept (from
        # httpcore's connect trace) so a stopping worker can cut a poll short (`interrupt`)
        # without touching the renewals and completions it still has to send.
        self._polls = connections()
        self._poll_conns = _Cuttable()
        # Completions waiting for the server's artifact checks go over connections of
        # their own too, which `stop_checks` cuts (a stopping worker's grace bounds them).
        self._checked = connections()
        self._checked_conns = _Cuttable()
        self._policy: Policy | None = None
        self._identity: dict[str, Any] | None = None
        self._lock = threading.Lock()
        #: The attempts (job, epoch) this client uploaded artifacts for: their completion
        #: waits for the server's checks of them (`CHECKS_TIMEOUT_S`).
        self._uploaded: set[tuple[int, int]] = set()

    # -- plumbing --

    def close(self) -> None:
        pools = (self._client, self._polls, self._checked)
        for pool in pools:
            pool.is_closed = True  # every call from now on, and every one cut below, refused
        # A claim long-polling, or a completion waiting for its checks, on another thread is
        # cut (before its socket is closed under it, which would not wake it): it ended only
        # with its wait, and a poll still waiting at the server could be handed a job nobody
        # would hear of.
        self._poll_conns.cut()
        self._checked_conns.cut()
        for pool in pools:
            pool.close()

    def stop_checks(self) -> None:
        """A stopping worker's grace is over: a completion waiting for the server's checks
        of its artifacts stops waiting, and one sent now is not sent; each is refused
        StorageUnavailable `server_stopping` (undecided here: the worker releases the job,
        and the server, once its checks end, finds the lease gone and accepts nothing).
        Safe from another thread (shutdown(2) of the completions' sockets)."""
        self._checked_conns.cut()

    def resume_checks(self) -> None:
        """Send completions with artifacts again after `stop_checks` (a worker run inside a
        program has stopped; the program goes on with this client)."""
        self._checked_conns.stopped = False

    def interrupt(self) -> None:
        """Cut a claim's long-poll in flight short and answer every later claim with nothing:
        the worker is stopping (SIGTERM) and must not sit out a poll of up to `claim_wait`
        seconds. Safe from a signal handler (one shutdown(2) of the poll's socket). The
        server, seeing the poll's client gone, hands it no job; one it had just claimed for
        it is nobody's until its lease ends and the reaper offers it again, as after any lost
        claim answer."""
        self._poll_conns.cut()

    def _poll(self, body: dict[str, Any], wait: float) -> Any:
        """One claim request over the poll connection; None when interrupted."""
        if self._polls.is_closed:  # (interrupted or not: closed is the answer)
            raise _closed()
        if self._poll_conns.stopped:
            return None
        try:
            return self._call("POST", "/v1/claims", body, retry=False,
                              timeout=self.timeout + wait, client=self._polls,
                              extensions={"trace": self._poll_conns.trace})
        except StorageUnavailable:
            if self._poll_conns.stopped:
                return None
            raise

    def __enter__(self) -> RemoteCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, json: Any = None, retry: bool = True,
                 resend: bool = True, timeout: float | None = None,
                 headers: dict[str, str] | None = None,
                 params: dict[str, Any] | None = None,
                 content: Callable[[], Iterator[bytes]] | None = None,
                 client: _Connections | None = None,
                 extensions: dict[str, Any] | None = None) -> httpx.Response:
        """One call; network errors (and 503) are retried with backoff for up to retry_s.
        `content` makes a fresh body stream for each try. `resend` False: after a network
        error once the request may have reached the server, it is not sent again (a
        submission without an idempotency key would make a second job)."""
        end = time.monotonic() + self.retry_s
        delay = 0.05
        http = client or self._client
        body: bytes | None = None
        if json is not None:
            try:
                # The Coordinator's own serialisation: what it cannot store (NaN, a set,
                # keys mixing text and numbers, nesting past the encoder) is refused as it
                # refuses it, nothing sent.
                body = v.dumps(json).encode("utf-8")
            except (TypeError, ValueError, RecursionError) as e:
                raise InvalidInput("invalid_input", f"the request cannot be sent as JSON: "
                                   f"{type(e).__name__}: {e}") from None
            headers = {**(headers or {}), "Content-Type": "application/json"}
        while True:
            if http.is_closed:
                raise _closed()
            try:
                resp = http.send(method, path, headers=headers, params=params,
                                 content=body if content is None else content(),
                                 timeout=timeout, extensions=extensions)
            except RuntimeError:
                # A refusal to send on closed connections (closed by another thread
                # meanwhile): the caller catches JobcoordError, as from a Coordinator.
                if http.is_closed:
                    raise _closed() from None
                raise
            except httpx.TransportError as e:
                if http.is_closed:  # closed by another thread under this call
                    raise _closed() from None
                if http is self._checked and self._checked_conns.stopped:
                    raise _checks_ended() from None
                # A claim whose answer was lost may have leased a job we never heard of: it is
                # not sent again (the lease expires and the job is offered again). Everything
                # else is safe to repeat: fenced by epoch, or answered as already accepted.
                if not resend and not isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
                    raise StorageUnavailable(
                        "server_unreachable", f"the answer from {self.server} was lost "
                        f"({type(e).__name__}: {e}): the job may have been created; submit "
                        "with an idempotency key to make sending it again safe") from None
                if not retry or time.monotonic() + delay >= end:
                    raise StorageUnavailable(
                        "server_unreachable", f"cannot reach {self.server}: "
                        f"{type(e).__name__}: {e}") from None
            else:
                if (resp.status_code != 503 or not retry or time.monotonic() + delay >= end
                        or lasting(resp.headers.get(ERROR_CLASS_HEADER))):
                    return resp  # (a damaged database or a schema mismatch: no retry heals)
                retry_after = resp.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    delay = max(delay, min(float(retry_after), 5.0))
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)

    def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        resp = self._request(method, path, json=body, **kw)
        if resp.status_code == 204:
            return None
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code >= 400:
            raise error_from_response(resp.status_code, data,
                                      resp.headers.get(ERROR_CLASS_HEADER))
        return data

    # -- identity and policy --

    def whoami(self) -> dict[str, Any]:
        with self._lock:
            if self._identity is None:
                self._identity = self._call("GET", "/v1/whoami")
            return self._identity

    @property
    def policy(self) -> Policy:
        if self._policy is None:
            self._policy = Policy.from_mapping(self.whoami()["policy"], source=self.server)
        return self._policy

    # -- what the worker runtime calls --

    def heartbeat(self, worker_id: str, *, roles: Any = None, readings: Any = None,
                  kinds: Any = None) -> dict[str, Any]:
        self._acts_as(worker_id)
        if isinstance(readings, str):  # JSON text, as the Coordinator takes it
            readings = readings_value(readings)[0]
        with self._too_large_as_core(
                lambda _: None if readings is None else readings_value(readings)):
            return self._call("POST", "/v1/heartbeat", {
                "roles": [] if roles is None else v.names(roles, "role"),
                "kinds": _kinds(kinds), "readings": readings})

    def _acts_as(self, worker_id: Any, tenant: Any = None) -> None:
        """The server acts as the token's worker and tenant: a call naming another worker, or
        a tenant-bound token's call naming another tenant, is refused, never sent as the
        token's (`renew(job, "w2", ...)` renewed w1's lease). A token bound to no tenant acts
        on every tenant's jobs: the tenant a fenced call names (the runtime names its job's)
        is not checked by the server."""
        worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
        who = self.whoami()  # the token's, fixed while it lives
        own = who["worker_id"]
        if own is not None and worker_id != own:  # (not a worker token: the server's 403)
            raise InvalidInput("invalid_input", f"worker {worker_id!r}: this token acts as "
                               f"worker {own!r}", field="worker_id")
        if tenant is not None and who["tenant"] is not None:
            self._claims_for(tenant)

    def _claims_for(self, tenant: str | None) -> None:
        """A claim's tenant is the token's: one naming another is refused, never dropped
        (a worker told to claim one tenant's jobs would run every tenant's)."""
        if tenant is None:
            return
        tenant = v.name(tenant, "tenant")  # a name before it is shown (10**5000 cannot be)
        own = self.whoami()["tenant"]  # the token's, fixed while it lives
        if tenant != own:
            raise InvalidInput("invalid_input", f"tenant {tenant!r}: this token claims "
                               + ("every tenant's jobs" if own is None
                                  else f"tenant {own!r}'s jobs"), field="tenant")

    def claim(self, worker_id: str, *, lease_s: float | None = None, kinds: Any = None,
              wait: float | None = None, tenant: str | None = None) -> dict[str, Any]:
        self._acts_as(worker_id)
        self._claims_for(tenant)
        wait = self.claim_wait if wait is None else v.finite_seconds(wait, "wait", 0,
                                                                      MAX_WAIT_S)
        got = self._poll({
            "lease_s": _lease(lease_s), "kinds": _kinds(kinds), "wait": wait},
            wait)
        if got is None:  # 204: nothing within the wait (or the poll was interrupted)
            return {"job": None, "reason": "no_waiting_jobs",
                    "detail": f"nothing eligible when the poll (of up to {wait:g}s) ended"}
        return got

    def claim_many(self, worker_id: str, n: int, *, lease_s: float | None = None,
                   kinds: Any = None, wait: float | None = None, tenant: str | None = None
                   ) -> dict[str, Any]:
        """Up to `n` jobs in one request and one transaction, long-polling like `claim`:
        {"claimed": [claim answers], "reason", "detail"}, like the Coordinator's."""
        self._acts_as(worker_id)
        self._claims_for(tenant)
        # (The server reads no `n` as one claim, whose answer has another shape.)
        n = v.whole(n, "n", 1, MAX_BATCH)
        wait = self.claim_wait if wait is None else v.finite_seconds(wait, "wait", 0,
                                                                      MAX_WAIT_S)
        got = self._poll({
            "n": n, "lease_s": _lease(lease_s), "kinds": _kinds(kinds),
            "wait": wait}, wait)
        if got is None:  # 204: nothing within the wait (or the poll was interrupted)
            return {"claimed": [], "reason": "no_waiting_jobs",
                    "detail": f"nothing eligible when the poll (of up to {wait:g}s) ended"}
        return got

    def complete_many(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Many completions in one request and one transaction, each fenced by its epoch:
        {"results": [...], "accepted", "refused"}, like the Coordinator's. The worker id and
        tenant are the token's (the items' own are not sent). Sent again after a lost
        answer, an accepted item is `already_accepted`. A group over the server's body limit
        is sent in parts (one item alone is within it, as a single completion is), after
        every item was checked as the core checks it: a group holding one bad item is
        refused whole, as the core refuses it, and nothing is sent."""
        checked = batch_items(items, COMPLETE_FIELDS, REQUIRED)
        body = []
        for i, it in enumerate(checked):
            checked_item(i, lambda it=it: self._acts_as(it["worker_id"], it.get("tenant")))
            job_id, epoch = checked_item(i, lambda it=it: job_and_epoch(it["job_id"],
                                                                        it["epoch"]))
            body.append({"job_id": job_id, "epoch": epoch, "result": it.get("result"),
                         "provenance": _object(it.get("provenance"))})
        with self._completion_call([(it["job_id"], it["epoch"]) for it in body]) as checked:
            try:
                got = self._call("POST", "/v1/completions", {"items": body}, **checked)
            except JobcoordError as e:
                if e.code != "body_too_large":
                    raise
                limit = self.policy.max_result_bytes
                for i, it in enumerate(body):
                    checked_item(i, lambda it=it: completion_texts(
                        it["result"], it["provenance"], limit))
                if len(body) < 2:
                    raise
                got = _one_group(body, self._completions(body, checked))
        # An item refused `artifact_changed` is sent again and checked again: its attempt
        # stays one whose completion waits for the checks (as a single completion's does).
        changed = {(it["job_id"], it["epoch"]) for it, one in zip(body, got["results"],
                                                                  strict=True)
                   if one.get("error", {}).get("code") == "artifact_changed"}
        if changed:
            with self._lock:
                self._uploaded |= changed
        return got

    def _completions(self, body: list[dict[str, Any]], checked: dict[str, Any]
                     ) -> dict[str, Any]:
        try:
            return self._call("POST", "/v1/completions", {"items": body}, **checked)
        except JobcoordError as e:
            if e.code != "body_too_large" or len(body) < 2:
                raise
        half = len(body) // 2
        first = self._completions(body[:half], checked)
        second = self._completions(body[half:], checked)
        results = first["results"] + second["results"]
        accepted = first["accepted"] + second["accepted"]
        return {"results": results, "accepted": accepted, "refused": len(results) - accepted}

    def renew(self, job_id: int, worker_id: str, epoch: int, *, lease_s: float | None = None,
              tenant: str | None = None) -> dict[str, Any]:
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        return self._call("POST", f"/v1/jobs/{job_id}/renew",
                          {"epoch": epoch, "lease_s": _lease(lease_s)})

    def complete(self, job_id: int, worker_id: str, epoch: int, result: Any = None, *,
                 provenance: Any = None, tenant: str | None = None) -> dict[str, Any]:
        # Sent again after a lost answer, the server says `already_accepted` when this very
        # epoch's result was the one it kept: never a false failure.
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        with self._completion_call([(job_id, epoch)]) as checked, self._too_large_as_core(
                lambda p: completion_texts(result, provenance, p.max_result_bytes)):
            return self._call("POST", f"/v1/jobs/{job_id}/complete",
                              {"epoch": epoch, "result": result,
                               "provenance": _object(provenance)},
                              **checked)

    def complete_and_claim(self, job_id: int, worker_id: str, epoch: int, result: Any = None,
                           *, provenance: Any = None, tenant: str | None = None,
                           lease_s: float | None = None, kinds: Any = None
                           ) -> dict[str, Any]:
        """Complete and claim the next job in one request and one transaction (`claim_next`):
        {"completed": <complete's answer>, "next": <claim's answer>}, like the Coordinator's.
        The next job is of the token's tenant and the kinds of this worker's heartbeat
        (`kinds` is not sent). Sent again after a lost answer, the completion is
        `already_accepted` and `next` is the job the lost answer claimed (same epoch and
        lease) while nothing touched it since; else a refusal: the worker claims the usual
        way."""
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        with self._completion_call([(job_id, epoch)]) as checked, self._too_large_as_core(
                lambda p: completion_texts(result, provenance, p.max_result_bytes)):
            got = self._call("POST", f"/v1/jobs/{job_id}/complete",
                             {"epoch": epoch, "result": result, "claim_next": True,
                              "lease_s": _lease(lease_s),
                              "provenance": _object(provenance)},
                             **checked)
        nxt = got.pop("next", None)
        if nxt is None:
            nxt = {"job": None, "reason": "already_accepted",
                   "detail": "the completion was accepted earlier; nothing more was claimed"}
        return {"completed": got, "next": nxt}

    def fail(self, job_id: int, worker_id: str, epoch: int, error: str, *,
             permanent: bool = False, reason: str = "failed", tenant: str | None = None,
             effect_not_applied: bool = False) -> dict[str, Any]:
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        with self._too_large_as_core(lambda _: failure_texts(error, reason)):
            return self._call("POST", f"/v1/jobs/{job_id}/fail",
                              {"epoch": epoch, "error": error, "permanent": permanent,
                               "reason": reason, "effect_not_applied": effect_not_applied})

    def mark_effect(self, job_id: int, worker_id: str, epoch: int, *,
                    tenant: str | None = None) -> dict[str, Any]:
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        return self._call("POST", f"/v1/jobs/{job_id}/effect", {"epoch": epoch})

    def checkpoint(self, job_id: int, worker_id: str, epoch: int, name: str, data: Any = None,
                   *, tenant: str | None = None) -> dict[str, Any]:
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        with self._too_large_as_core(
                lambda p: checkpoint_text(name, data, p.max_payload_bytes)):
            return self._call("POST", f"/v1/jobs/{job_id}/checkpoint",
                              {"epoch": epoch, "name": name, "data": data})

    def put_artifact(self, job_id: int, worker_id: str, epoch: int, name: str, source: Any,
                     media_type: str | None = None, *, tenant: str | None = None
                     ) -> dict[str, Any]:
        """Upload an artifact of this attempt (a path, bytes or a binary file object): hashed
        here first, streamed to the server, which hashes it again and stores nothing unless
        the digests agree. Sent again, like every fenced call, after a network error.

        The media type is decided here as a local stage decides it (declared, else guessed
        from the name) and sent as `media_type`: the body's Content-Type only labels bytes."""
        job_id, epoch = job_and_epoch(job_id, epoch)
        self._acts_as(worker_id, tenant)
        name = validate_name(name)
        params: dict[str, Any] = {"epoch": epoch, "media_type": media_type_of(media_type, name)}
        with _spooled(source) as (chunks, digest, size):
            path = (f"/v1/jobs/{job_id}/artifacts/"
                    f"{urllib.parse.quote(name, safe='')}")
            resp = self._request("PUT", path, params=params, content=chunks, headers={
                "X-Content-Digest": digest, "Content-Type": "application/octet-stream",
                "Content-Length": str(size)}, timeout=max(self.timeout, 60.0))
        data = resp.json() if resp.headers.get("content-type", "").startswith(
            "application/json") else None
        if resp.status_code >= 400:
            raise error_from_response(resp.status_code, data,
                                      resp.headers.get(ERROR_CLASS_HEADER))
        with self._lock:
            if len(self._uploaded) >= 10_000:  # attempts that never completed (leases lost)
                self._uploaded.clear()
            self._uploaded.add(job_and_epoch(job_id, epoch))
        return dict(data or {})

    @contextlib.contextmanager
    def _completion_call(self, attempts: list[tuple[int, int]]) -> Iterator[dict[str, Any]]:
        """A completion's call options, for the block that sends it: the server re-hashes
        the artifacts an attempt uploaded and runs its kind's validator before answering
        (keeping the lease meanwhile), which may take far longer than a call; waited for,
        not timed out and sent again (each try would check them all again), over the
        connections `stop_checks` can cut. Empty: the client's own timeout and connections.
        The attempts are forgotten once the server answered; a completion it could not take
        (unreachable, busy) is sent again and waits again."""
        keys = set(attempts)  # (checked by the callers: job_and_epoch)
        with self._lock:
            found = not keys.isdisjoint(self._uploaded)
        if found and self._checked_conns.stopped:
            raise _checks_ended()
        try:
            yield ({"timeout": max(self.timeout, CHECKS_TIMEOUT_S), "client": self._checked,
                    "extensions": {"trace": self._checked_conns.trace}} if found else {})
        except (StorageUnavailable, DatabaseBusy):
            raise
        except JobcoordError as e:
            # `artifact_changed`: the attempt staged again during the checks; its completion
            # is sent again and checked again.
            if e.code != "artifact_changed":
                self._forget(keys)
            raise
        except BaseException:
            self._forget(keys)
            raise
        self._forget(keys)

    @contextlib.contextmanager
    def _too_large_as_core(self, check: Callable[[Policy], object]) -> Iterator[None]:
        """A body over the server's limit is refused `body_too_large`, whatever made it so:
        the Coordinator's own refusal of the field at fault (`result_too_large`,
        `checkpoint_too_large`, ...) instead, by its own checks, run here only then."""
        try:
            yield
        except InvalidInput as e:
            if e.code == "body_too_large":
                check(self.policy)
            raise

    def _forget(self, keys: set[tuple[int, int]]) -> None:
        with self._lock:
            self._uploaded -= keys

    def reap(self, *, limit: int = 1000) -> dict[str, Any]:
        """Reaping is the server's job (it runs the reaper on a timer): nothing to do here."""
        return {"expired": 0, "waiting": 0, "dead": 0, "unknown": 0, "cancelled": 0,
                "deadline_dead": 0, "jobs": []}

    def tick_schedules(self, *, limit: int = 100) -> dict[str, Any]:
        """Schedules tick on the server's timer too: nothing to do here."""
        return {"fired": 0, "missed": 0, "skipped": 0, "queued": 0, "missed_exact": True,
                "schedules": []}

    # -- submitting (for scripts and benchmarks) --

    def enqueue(self, kind: str, payload: Any = None, *, priority: int | str | None = None,
                role: str | None = None, tenant: str | None = None, key: str | None = None,
                max_attempts: int | None = None, deadline_s: float | None = None,
                delay_s: float = 0.0, needs: Mapping[str, int] | str | None = None
                ) -> dict[str, Any]:
        """The Coordinator's `enqueue`, its arguments read as it reads them (digits, JSON
        text, NAME=INT needs); the job goes to the token's tenant (`tenant`, if given, must
        be that one)."""
        if tenant is not None:
            tenant = v.name(tenant, "tenant")  # a name before it is shown
            own = self.whoami()["tenant"] or DEFAULT_TENANT
            if tenant != own:
                raise InvalidInput("invalid_input", f"tenant {tenant!r}: this token submits "
                                   f"to tenant {own!r}", field="tenant")
        if key is not None and not (isinstance(key, str) and is_header_text(key)
                                    and key == key.strip()):
            raise InvalidInput("invalid_input", "key: over HTTP an idempotency key is "
                               "printable ASCII text without spaces at either end (an HTTP "
                               "header carries no other)", field="key")
        if isinstance(payload, str | bytes):  # JSON text
            payload = v.json_value(payload, "payload", max_bytes=self.policy.max_payload_bytes,
                                   require_object=True)[0]
        body: dict[str, Any] = {
            "kind": kind, "payload": payload, "priority": priority, "role": role,
            "max_attempts": _digits(max_attempts, lambda x: v.whole(x, "max_attempts",
                                                                    -(2**62), 2**62)),
            "deadline_s": _digits(deadline_s, lambda x: v.finite_seconds(x, "deadline", -_INF,
                                                                         _INF)),
            "delay_s": _digits(delay_s, lambda x: v.finite_seconds(x, "delay", -_INF, _INF)),
            "needs": v.resources(needs, "needs") if isinstance(needs, str) else needs}
        headers = {"Idempotency-Key": key} if key is not None else None
        # Sent again after a lost answer only with a key: the server then answers with the
        # job the first sending made; without one, a second job.
        with self._too_large_as_core(lambda p: payload_text(payload, p.max_payload_bytes)):
            return self._call("POST", "/v1/jobs", body, headers=headers,
                              resend=key is not None)

    def show(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{_job(job_id)}")


class _Connections:
    """One pool of kept-alive connections to the server and what every request over it
    carries (the token, the timeout). Requests go straight to httpx's transport, the layer
    that owns the connections, timeouts and TLS: httpx.Client's layers above it (merging
    each path with a base URL, authentication flows, redirects, cookies) did nothing for
    these calls and cost the worker more CPU per request than the rest of the call (0.67-0.83
    ms before, 0.47-0.52 ms after per chained completion, docs/serve.md). As with a client given its
    own transport, proxies named in the environment are not used: the coordinator is
    reached directly."""

    def __init__(self, server: str, token: str, timeout: float, verify: Any):
        self.server = server
        self.transport = httpx.HTTPTransport(
            verify=verify, limits=httpx.Limits(max_connections=16, max_keepalive_connections=8))
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT}
        self.timeout = httpx.Timeout(timeout).as_dict()
        self.is_closed = False

    def send(self, method: str, path: str, *, headers: Mapping[str, str] | None,
             params: Mapping[str, Any] | None, content: Any, timeout: float | None,
             extensions: Mapping[str, Any] | None) -> httpx.Response:
        """One request; its whole answer read (a network error reading it is raised as
        httpx's TransportError, as one sending it)."""
        if self.is_closed:
            raise RuntimeError("the connections were closed")
        request = httpx.Request(
            method, self.server + path, params=params, content=content,
            headers={**self.headers, **headers} if headers else self.headers,
            extensions={**(extensions or {}), "timeout": (
                self.timeout if timeout is None else httpx.Timeout(timeout).as_dict())})
        response = self.transport.handle_request(request)
        response.request = request
        try:
            response.read()  # (and the connection handed back to the pool)
        except BaseException:
            response.close()
            raise
        return response

    def close(self) -> None:
        self.is_closed = True
        self.transport.close()


class _Cuttable:
    """Connections of one client whose calls another thread, or a signal handler, can end at
    once: `cut` shuts down their sockets (kept from httpcore's connect trace) and those of
    every connection opened after it, until `stopped` is set False again."""

    def __init__(self) -> None:
        self.stopped = False
        self._streams: list[Any] = []
        # Between the threads opening connections; `cut` takes no lock (a signal handler
        # calls it, maybe on a thread holding this one).
        self._lock = threading.Lock()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        # Over TLS the socket to shut is TLS's: the one `connect_tcp` returned is closed
        # under it (shutting that did nothing, and a poll sat out its whole wait).
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        with self._lock:
            # Only open ones are kept: the pool closes and opens connections as it goes.
            self._streams = [s for s in self._streams if _is_open(s)] + [stream]
        # Looked at after the stream is kept: a `cut` running meanwhile either finds it or
        # was called before this look. (A connection opening as `cut` ran was left open, and
        # its call sat out a whole long-poll, or a completion's whole checks.)
        if self.stopped:
            _cut([stream])

    def cut(self) -> None:
        self.stopped = True
        _cut(self._streams)


def _is_open(stream: Any) -> bool:
    sock = stream.get_extra_info("socket")
    return sock is not None and sock.fileno() != -1


def _cut(streams: list[Any]) -> None:
    """Shut down the sockets of these connections: a call waiting on one ends at once."""
    for stream in streams:
        sock = stream.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


def _closed() -> InvalidInput:
    return InvalidInput("coordinator_closed", "this RemoteCoordinator was closed; open another")


def _checks_ended() -> StorageUnavailable:
    return StorageUnavailable("server_stopping", "this worker is stopping: the completion's "
                              "artifact checks were left undecided (the job is released)")


def _lease(lease_s: Any) -> Any:
    """A lease length as sent: digits read as the Coordinator reads them; the server judges
    the rest (its policy's bounds)."""
    if isinstance(lease_s, str):
        return v.finite_seconds(lease_s, "lease", 0, float("inf"), lo_inclusive=False)
    return lease_s


_INF = float("inf")


def _digits(value: Any, read: Callable[[Any], Any]) -> Any:
    """An option given as text (digits), read as the Coordinator reads it; the server judges
    the rest (its bounds)."""
    return read(value) if isinstance(value, str) else value


def _job(job_id: Any) -> int:
    """A job id for a path, checked as the Coordinator checks it."""
    return v.whole(job_id, "job_id", 1, 2**62)


def _kinds(kinds: Any) -> list[str] | None:
    """The kinds a claim takes, checked as the Coordinator checks them (a bare string is
    one kind, never its letters)."""
    return None if kinds is None else v.names(kinds, "kind", empty=NO_KINDS)


def _object(value: Any) -> Any:
    """A mapping as a JSON object; anything else as it is, for the server to judge (a
    provenance that is not an object is its `invalid_input`, as the Coordinator's)."""
    return dict(value) if isinstance(value, Mapping) else value


CHUNK = 1 << 20


@contextlib.contextmanager
def _spooled(source: Any) -> Iterator[tuple[Callable[[], Iterator[bytes]], str, int]]:
    """A re-readable body for an upload, its digest and size: a file as it is on disk, bytes
    as they are, a stream copied to a temporary file first (an upload may be sent twice)."""
    def hashed(path: str) -> tuple[str, int]:
        h, size = hashlib.sha256(), 0
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
                size += len(block)
        return "sha256:" + h.hexdigest(), size

    def from_file(path: str) -> Callable[[], Iterator[bytes]]:
        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    yield block
        return chunks

    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        yield (lambda: iter([data])), "sha256:" + hashlib.sha256(data).hexdigest(), len(data)
        return
    if isinstance(source, str | os.PathLike):
        path = os.fsdecode(source)
        try:
            digest, size = hashed(path)
        except OSError as exc:
            raise InvalidInput("invalid_input", f"source {path!r} cannot be read: "
                               f"{exc.strerror or exc}", source=path) from None
        yield from_file(path), digest, size
        return
    if not hasattr(source, "read"):
        raise InvalidInput("invalid_input", f"cannot upload a {type(source).__name__}: give a "
                           "path, bytes or a binary file object")
    # Named by this process (as a command's files are): a killed worker's is swept by the
    # next worker's start at once, not only once it is a minute old.
    fd, path = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
    # Held while it lives: a process killed mid-upload leaves it, and the next worker's
    # start removes it (worker.handlers.sweep_orphans); never a live one's.
    held = [h] if (h := leftovers.hold(path)) is not None else []
    try:
        with os.fdopen(fd, "wb") as out:
            while block := _read(source):
                if not isinstance(block, bytes | bytearray | memoryview):
                    raise InvalidInput("invalid_input", f"source gave {type(block).__name__}"
                                       ", not bytes: open the file in binary mode ('rb')")
                out.write(block)
        digest, size = hashed(path)
        yield from_file(path), digest, size
    finally:
        os.unlink(path)
        leftovers.release(held)


def _read(source: Any) -> Any:
    """A block of an upload's stream; one that cannot be read (closed, not readable) is
    InvalidInput, as an unreadable path is."""
    try:
        return source.read(CHUNK)
    except (OSError, ValueError) as exc:
        raise InvalidInput("invalid_input", f"source cannot be read: {exc}") from None


def _one_group(body: list[dict[str, Any]], got: dict[str, Any]) -> dict[str, Any]:
    """The answers of a group sent in parts, as one group would have them: a later item of
    a job accepted earlier in the group was answered by the server as a report on a
    finished job (`already_accepted` when its result was the same, its part coming after
    the first was committed; else `job_finished`); in one group it is the refusal of a
    second report of the job."""
    accepted: dict[int, dict[str, Any]] = {}
    results = got["results"]
    for i, (it, one) in enumerate(zip(body, results, strict=True)):
        earlier = accepted.get(it["job_id"])
        if earlier is not None:
            results[i] = {"job_id": it["job_id"], **earlier_in_batch(
                it["job_id"], "complete", earlier["status"], job_id=it["job_id"],
                status=earlier["status"], accepted_epoch=earlier["epoch"]).to_json()}
        elif "error" not in one and not one.get("already_accepted"):
            # Only this group's own acceptance: one an earlier request made, sent again,
            # leaves a later item of its job the server's answer (the same, when the same).
            accepted.setdefault(it["job_id"], one)
    ok = sum("error" not in one for one in results)
    return {"results": results, "accepted": ok, "refused": len(results) - ok}
