"""The HTTP side of the one exception hierarchy (jobcoord/errors.py, which holds the status
map): an error's status and headers, and the error back from an answer (the client side).

Every error answer has the CLI's JSON shape {"error": {"code", "message"}} (plus "details"
when the exception carries some)."""

from __future__ import annotations

from typing import Any

from ..errors import (  # noqa: F401 -- importable from here as before
    BUSY_CODES,
    HTTP_NOT_FOUND_CODES,
    HTTP_RETRY_AFTER_S,
    HTTP_STATUS_BY_CLASS,
    HTTP_TOO_LARGE_CODES,
    HTTP_UNPROCESSABLE_CODES,
    BodyTooLarge,
    DatabaseBusy,
    DatabaseCorrupt,
    Forbidden,
    InvalidInput,
    JobcoordError,
    Refused,
    SchemaMismatch,
    StorageUnavailable,
    Unauthorized,
)

#: The header naming the class of a 503 that no retry heals (a damaged database, a schema
#: this server's code does not match): an operator must act. Without it a client takes a
#: 503 for a busy or unavailable database, and retries.
ERROR_CLASS_HEADER = "Jobcoord-Error-Class"
_LASTING: dict[str, type[JobcoordError]] = {
    "DatabaseCorrupt": DatabaseCorrupt, "SchemaMismatch": SchemaMismatch}

# The tables under their former names, for code written against them.
STATUS_BY_CLASS = HTTP_STATUS_BY_CLASS
NOT_FOUND_CODES = HTTP_NOT_FOUND_CODES
UNPROCESSABLE_CODES = HTTP_UNPROCESSABLE_CODES
RETRY_AFTER_S = HTTP_RETRY_AFTER_S


def status_of(err: JobcoordError) -> int:
    """The HTTP status of an error answer (the map is HTTP_STATUS_BY_CLASS in errors.py)."""
    if err.code in HTTP_NOT_FOUND_CODES:
        return 404
    if err.code in HTTP_UNPROCESSABLE_CODES and isinstance(err, InvalidInput):
        # An upload's bytes; a completion its artifact checks refused is a rule's 409.
        return 422
    if err.code in HTTP_TOO_LARGE_CODES:
        return 413
    for cls, status in HTTP_STATUS_BY_CLASS:
        if isinstance(err, cls):
            return status
    return 500


def headers_of(err: JobcoordError) -> dict[str, str]:
    headers: dict[str, str] = {}
    for cls, seconds in HTTP_RETRY_AFTER_S.items():
        if isinstance(err, cls):
            headers["Retry-After"] = str(seconds)
    if isinstance(err, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    for name, cls in _LASTING.items():
        if isinstance(err, cls):
            headers[ERROR_CLASS_HEADER] = name
    return headers


def lasting(error_class: str | None) -> type[JobcoordError] | None:
    """The class a 503's ERROR_CLASS_HEADER names, when it is one no retry heals."""
    return _LASTING.get(error_class or "")


def error_from_response(status: int, body: Any, error_class: str | None = None
                        ) -> JobcoordError:
    """The client side: turn an error answer back into the exception the Coordinator would
    have raised, so the worker runtime handles a remote coordinator exactly like a local one
    (`error_class`: the answer's ERROR_CLASS_HEADER)."""
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
    elif status == 401:
        cls = Unauthorized  # a Refused: the worker stops using that lease or claim loop
    elif status == 403:
        cls = Forbidden
    elif status in (404, 405) and code not in HTTP_NOT_FOUND_CODES:
        # No such route (the server's `not_found`, or another program's 404 page): the
        # server URL is wrong, not a job missing. Bad usage, as a malformed URL is.
        cls = InvalidInput
        message = (f"the server has no such jobcoord route (HTTP {status}: {message}); "
                   "check the server URL")
    elif status in (404, 409, 422):
        cls = Refused
    elif status == 503:
        cls = lasting(error_class) or (DatabaseBusy if code in BUSY_CODES
                                       else StorageUnavailable)
    else:
        cls = JobcoordError
    # Details are keyword arguments of the exception; keep only plain names.
    safe = {k: val for k, val in details.items() if isinstance(k, str) and k.isidentifier()
            and k not in ("code", "message")}
    return cls(code, message, **safe)
