"""The one mapping from jobcoord's exception classes to HTTP statuses, and back.

Every error answer has the CLI's JSON shape {"error": {"code", "message"}} (plus "details"
when the exception carries some)."""

from __future__ import annotations

from typing import Any

from ..errors import (
    DatabaseBusy,
    DatabaseCorrupt,
    InvalidInput,
    JobcoordError,
    Refused,
    SchemaMismatch,
    StorageUnavailable,
)


class Unauthorized(JobcoordError):
    """No token, or an unknown or revoked one."""

    exit_code = 2
    default_code = "unauthorized"


class Forbidden(JobcoordError):
    """This token's role may not do that."""

    exit_code = 4
    default_code = "forbidden"


class BodyTooLarge(InvalidInput):
    """The request body is larger than the server accepts."""

    default_code = "body_too_large"


#: Exception class -> HTTP status; the first class in this order that matches wins.
STATUS_BY_CLASS: tuple[tuple[type[JobcoordError], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (BodyTooLarge, 413),
    (InvalidInput, 400),
    (Refused, 409),
    (DatabaseBusy, 503),
    (StorageUnavailable, 503),
    # The server is up but cannot serve this database: not a bug of the request or the
    # server; an operator has to act (check / migrate), so nothing to retry soon.
    (DatabaseCorrupt, 503),
    (SchemaMismatch, 503),
    (JobcoordError, 500),
)
#: Refusals that mean "no such job for you": answered 404, exactly like a missing job.
NOT_FOUND_CODES = frozenset({"job_not_found", "token_not_found", "artifact_not_found"})
#: A digest mismatch on an artifact upload (the issue's contract).
UNPROCESSABLE_CODES = frozenset({"artifact_invalid"})
#: An artifact over its limit (the server's upload limit or its kind's): the body was too big.
TOO_LARGE_CODES = frozenset({"artifact_too_large"})
RETRY_AFTER_S = {DatabaseBusy: 1, StorageUnavailable: 5}


def status_of(err: JobcoordError) -> int:
    if err.code in NOT_FOUND_CODES:
        return 404
    if err.code in UNPROCESSABLE_CODES:
        return 422
    if err.code in TOO_LARGE_CODES:
        return 413
    for cls, status in STATUS_BY_CLASS:
        if isinstance(err, cls):
            return status
    return 500


def headers_of(err: JobcoordError) -> dict[str, str]:
    headers: dict[str, str] = {}
    for cls, seconds in RETRY_AFTER_S.items():
        if isinstance(err, cls):
            headers["Retry-After"] = str(seconds)
    if isinstance(err, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return headers


#: Codes a 503 answer carries that mean "busy" (retry soon) rather than "unavailable".
BUSY_CODES = frozenset({"database_locked", "connections_exhausted", "database_busy"})


def error_from_response(status: int, body: Any) -> JobcoordError:
    """The client side: turn an error answer back into the exception the Coordinator would
    have raised, so the worker runtime handles a remote coordinator exactly like a local one.
    """
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    details = err.get("details") if isinstance(err, dict) else None
    details = details if isinstance(details, dict) else {}
    code = code if isinstance(code, str) else f"http_{status}"
    message = message if isinstance(message, str) else f"the server answered HTTP {status}"
    cls: type[JobcoordError]
    if status in (400, 413):
        cls = InvalidInput
    elif status in (401, 403, 404, 409, 422):
        # A revoked token or a role refusal must stop the worker's use of that lease or
        # claim loop, like any rule's refusal.
        cls = Refused
    elif status == 503:
        cls = DatabaseBusy if code in BUSY_CODES else StorageUnavailable
    else:
        cls = JobcoordError
    # Details are keyword arguments of the exception; keep only plain names.
    safe = {k: val for k, val in details.items() if isinstance(k, str) and k.isidentifier()
            and k not in ("code", "message")}
    return cls(code, message, **safe)
