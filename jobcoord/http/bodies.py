"""The API's request bodies (unknown fields are refused; NaN and Infinity too; a fence's
epoch, a lease's length, a claim's wait and the worker's flags take their own JSON type
only), its error body, the limits the routes share, and the route class that answers a body
Python cannot read as JSON with the JSON error."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, ClassVar, Literal

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator
from starlette.exceptions import HTTPException

from ..core.items import MAX_BATCH, MAX_PROVENANCE_BYTES
from .client import MAX_WAIT_S

#: Room for what comes with a payload or result at its size limit: a completion's
#: provenance at its own limit, and the JSON around both.
ENVELOPE_BYTES = MAX_PROVENANCE_BYTES + 64 * 1024
JOB_ID_MAX = 2**62


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    #: How many levels down the body holds its JSON values (a payload, a result, a
    #: provenance, checkpoint data, readings), 0 if it holds none: the body may nest that
    #: many levels more than a value may (validate.MAX_JSON_DEPTH), and no more.
    VALUES_AT: ClassVar[int] = 0


#: A number of seconds: a JSON number, never a string ("30") or a boolean (true would be a
#: one-second lease).
Seconds = Annotated[float, Strict()]
#: A fencing epoch: a JSON integer, never true (epoch 1) or "1".
Epoch = Annotated[int, Strict()]
#: A flag: true or false, never "yes", 1 or "false".
Flag = Annotated[bool, Strict()]
#: A whole number: a JSON integer, never "3", true or 2.5.
Whole = Annotated[int, Strict()]


class SubmitBody(_Body):
    VALUES_AT: ClassVar[int] = 1  # payload and needs
    kind: str
    payload: dict[str, Any] | None = None
    priority: Whole | Annotated[str, Strict()] | None = None
    role: str | None = None
    max_attempts: Whole | None = None
    deadline_s: Seconds | None = None
    delay_s: Seconds = 0.0
    #: Declared resource needs {"NAME": INT}, checked by the coordinator like `--needs`.
    needs: dict[str, Any] | None = None


class HeartbeatBody(_Body):
    VALUES_AT: ClassVar[int] = 1  # readings
    roles: list[str] = Field(default_factory=list, max_length=64)
    kinds: list[str] | None = Field(default=None, max_length=1024)
    readings: dict[str, Any] | None = None


class ClaimBody(_Body):
    lease_s: Seconds | None = None
    kinds: list[str] | None = Field(default=None, max_length=1024)
    wait: Seconds = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)
    n: Whole | None = Field(default=None, ge=1, le=MAX_BATCH, description=(
        "claim up to n jobs in one transaction (claim_many): the answer is "
        "{claimed: [claim answers], reason, detail}; without n, one job (claim's answer)"))


class EpochBody(_Body):
    epoch: Epoch


class RenewBody(EpochBody):
    lease_s: Seconds | None = None


class CompleteBody(EpochBody):
    VALUES_AT: ClassVar[int] = 1  # result and provenance
    result: Any = None
    provenance: dict[str, Any] | None = None
    claim_next: Flag = Field(default=False, description=(
        "also claim this worker's next job in the completion's transaction (the token's "
        "tenant, the kinds of the worker's heartbeat); the answer's `next` is that claim's "
        "answer"))
    lease_s: Seconds | None = Field(default=None, description=(
        "the next job's lease length (with `claim_next` only)"))

    @model_validator(mode="after")
    def _lease_needs_claim(self) -> CompleteBody:
        if self.lease_s is not None and not self.claim_next:
            raise ValueError("lease_s is the next job's lease: it needs claim_next")
        return self


class CompletionItem(EpochBody):
    job_id: Whole = Field(ge=1, le=JOB_ID_MAX)
    result: Any = None
    provenance: dict[str, Any] | None = None


class CompletionsBody(_Body):
    VALUES_AT: ClassVar[int] = 3  # items[i].result and items[i].provenance
    items: list[CompletionItem] = Field(min_length=1, max_length=MAX_BATCH)


class FailBody(EpochBody):
    error: str
    permanent: Flag = False
    reason: str = "failed"
    #: The attempt had marked its effect, and says the effect did not happen after all: the
    #: normal retry path is taken (docs/guarantees.md, effects).
    effect_not_applied: Flag = False


class CheckpointBody(EpochBody):
    VALUES_AT: ClassVar[int] = 1  # data
    name: str
    data: Any = None


class ReconcileBody(_Body):
    VALUES_AT: ClassVar[int] = 1  # result
    as_status: Literal["succeeded", "waiting", "dead"] = Field(alias="as")
    reason: str
    result: Any = None


class NoFields(_Body):
    """The body of an action that takes no fields (cancel, retry): none, or `{}`. Anything
    else is refused as every body is, so a mistaken request changes nothing."""


class PruneBody(_Body):
    older_than: Annotated[str, Strict()] | Seconds
    statuses: list[str] | None = Field(default=None, max_length=8)
    dry_run: Flag = False


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_responses(*pairs: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries answered with the JSON error body."""
    return {status: {"model": ErrorBody, "description": text} for status, text in pairs}


#: Every route may answer these.
ERRORS = error_responses(
    (400, "invalid input; nothing was changed"),
    (401, "no token, or an unknown or revoked one"),
    (403, "this token's role may not do that"),
    (404, "not found, or not visible to this token"),
    (408, "request_timeout: the request line and headers did not arrive within "
          "`serve --upload-idle` seconds; the connection is closed"),
    (409, "refused by a coordinator rule"),
    (413, "request body too large"),
    (500, "internal error"),
    (503, "database busy or unavailable; see Retry-After"),
)


#: Headers a request may give once: of two, the framework reads the first, and which one a
#: client meant (which token; which idempotency key; which digest) is nobody's guess.
SINGLE_HEADERS = ("authorization", "idempotency-key", "x-content-digest", "content-type")
_SINGLE = frozenset(name.encode() for name in SINGLE_HEADERS)


def given_once(request: Request) -> None:
    """InvalidInput unless each query parameter, and each header of SINGLE_HEADERS, is given
    at most once: of `?limit=1&limit=500` the framework would take the last, of two
    Authorization headers the first, and which one a client meant is nobody's guess."""
    from ..errors import InvalidInput

    if request.scope.get("query_string"):
        keys = [key for key, _ in request.query_params.multi_items()]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice is not None:
            raise InvalidInput("invalid_input", f"query parameter {twice[:80]!r} is given "
                               "more than once")
    # One pass over the raw headers (an ASGI server gives their names in lower case): this
    # runs on every request.
    given = [name for name, _ in request.scope.get("headers", ()) if name in _SINGLE]
    if len(given) != len(set(given)):
        twice = next(name for name in given if given.count(name) > 1).decode()
        shown = "-".join(part.capitalize() for part in twice.split("-"))
        raise InvalidInput("invalid_input", f"header {shown} is given more than once")


def _query_names(dependant: Any) -> set[str]:
    """The query parameters a route and its dependencies declare."""
    names = {f.alias for f in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


class JSONRoute(APIRoute):
    """A route whose body Python's JSON reader refuses with something other than a syntax
    error (an integer of more than 4300 digits, nesting past the recursion limit) answers
    400 `invalid_input` with the JSON error, as every other bad body does, instead of
    FastAPI's bare "There was an error parsing the body". The strict reader
    (validate.json_value, the routes' `strict` check) names the fault; it runs only on that
    path."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        known = _query_names(self.dependant)

        async def route(request: Request) -> Response:
            given_once(request)
            if request.scope.get("query_string"):
                unknown = sorted(set(request.query_params) - known)
                if unknown:
                    # Ignored, `?tenant=x` on the job list answered every tenant's jobs.
                    from ..errors import InvalidInput
                    from .deps import refusal_first

                    # Who calls is said first (401, 403), as for every invalid request.
                    refused = await refusal_first(request, request.app.state.server)
                    if refused is not None:
                        raise refused
                    raise InvalidInput("invalid_input", f"unknown query parameter "
                                       f"{unknown[0][:80]!r}; this route takes "
                                       f"{', '.join(sorted(known)) or 'none'}")
            try:
                return await handler(request)
            except HTTPException as e:
                if e.status_code != 400 or not isinstance(e.__cause__,
                                                          (ValueError, RecursionError)):
                    raise
                from .. import validate as v
                from ..errors import InvalidInput

                srv = request.app.state.server
                v.json_value(await request.body(), "body", max_bytes=srv.max_body,
                             require_object=False, too_large_code="body_too_large")
                raise InvalidInput("invalid_input", f"body: is not valid JSON ({e.__cause__})"
                                   ) from None

        return route
