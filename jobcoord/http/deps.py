"""Who is calling and what they may see: the bearer token looked up on every request (in
the route's own pool call where the route takes a Caller), role checks, the strict JSON body
check, and the tenant scope of each role. Shared by every route module."""

# No `from __future__ import annotations`: FastAPI reads these signatures at run time.
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BeforeValidator

from .. import tokens
from .. import validate as v
from ..errors import InvalidInput
from ..tokens import Identity
from .bodies import JOB_ID_MAX, _Body
from .errors import Forbidden, Unauthorized
from .state import Server

bearer = HTTPBearer(auto_error=False, description="A token from `jobcoord token create`.")


async def server(request: Request) -> Server:
    # async on purpose: FastAPI runs a plain `def` dependency on a worker thread of its
    # own, a thread hop per request (and up to 40 more threads in the server).
    srv: Server = request.app.state.server
    return srv


Srv = Annotated[Server, Depends(server)]


#: The roles each kind of route allows: every check of a role names one of these.
EVERYONE = tokens.ROLES
READERS = ("submitter", "viewer", "operator")
SUBMITTERS = ("submitter", "operator")
WORKERS = ("worker",)
OPERATORS = ("operator",)

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


@dataclass(frozen=True)
class Caller:
    """The bearer token a request presents and the roles its route allows, not yet looked
    up. `identify` looks it up on a thread of the server's pool, in the same call as the
    route's own work (`Server.call_as`): one thread hop per request, not two."""

    token: str
    allowed: tuple[str, ...]

    def identify(self, db: Any) -> Identity:
        """The token's identity, or 401 (unknown or revoked) or 403 (a role this route does
        not allow). Looked up on every request: a revoked token fails on its very next
        request."""
        who = tokens.authenticate(db, self.token)
        if who is None:
            raise Unauthorized("unauthorized", "unknown or revoked token")
        return self.allow(who)

    def allow(self, who: Identity) -> Identity:
        """`who`, or 403 for a role this route does not allow."""
        if who.role not in self.allowed:
            raise Forbidden("forbidden", f"{tokens.article(who.role)} {who.role} token may "
                            f"not do this (needs {' or '.join(self.allowed)})")
        return who


def _caller(creds: HTTPAuthorizationCredentials | None, allowed: tuple[str, ...]) -> Caller:
    if creds is None:
        raise Unauthorized("unauthorized", "missing token: send Authorization: Bearer <token>")
    return Caller(creds.credentials, allowed)


def caller(*allowed: str) -> Any:
    """The route's Caller, without a database read: a missing or malformed Authorization
    header is 401 at once. The route looks the token up in its own pool call
    (`Server.call_as`); an invalid request looks it up before its 400 (app.py), so 401 and
    403 still come first."""
    async def get(creds: Credentials) -> Caller:
        return _caller(creds, allowed)
    get.allowed_roles = allowed  # type: ignore[attr-defined]  # see refusal_first
    return Depends(get)


def role(*allowed: str) -> Any:
    """The token's Identity, looked up in a pool call of its own before the route runs."""
    async def check(srv: Srv, creds: Credentials) -> Identity:
        return await srv.call(_caller(creds, allowed).identify, srv.c.db)
    check.allowed_roles = allowed  # type: ignore[attr-defined]  # see refusal_first
    return Depends(check)


def _route_roles(route: Any) -> tuple[str, ...] | None:
    """The roles a route's token check allows (from its `caller` or `role` dependency), or
    None for a route that checks no token."""
    dependant = getattr(route, "dependant", None)
    stack = list(dependant.dependencies) if dependant is not None else []
    while stack:
        d = stack.pop()
        roles = getattr(d.call, "allowed_roles", None)
        if roles is not None:
            return tuple(roles)
        stack.extend(d.dependencies)
    return None


async def refusal_first(request: Request, srv: Server) -> Unauthorized | Forbidden | None:
    """For a request about to be refused as invalid input (a body that is not JSON, that the
    strict check refuses, or that fails validation): the 401 or 403 its token gets, when its
    route checks one, so who calls is always said before what is wrong with the request."""
    roles = _route_roles(request.scope.get("route"))
    if roles is None:
        return None
    creds = await bearer(request)
    try:
        await srv.call(_caller(creds, roles).identify, srv.c.db)
    except (Unauthorized, Forbidden) as e:
        return e
    return None


def strict(body: type[_Body]) -> list[Any]:
    """A route's check of its raw body, parsed strictly (NaN, Infinity, duplicate keys, deep
    nesting are refused), the same checks the Coordinator applies to payloads: the body may
    nest `body.VALUES_AT` levels more than a value, so every value the Coordinator takes
    passes, and one level more is refused here as there."""
    envelope = body.VALUES_AT

    async def strict_json(request: Request, srv: Srv) -> None:
        raw = await request.body()
        if raw:
            try:
                v.json_value(raw, "body", max_bytes=srv.max_body, require_object=True,
                             too_large_code="body_too_large", envelope=envelope)
            except InvalidInput:
                refused = await refusal_first(request, srv)
                if refused is not None:
                    raise refused from None
                raise

    strict_json.strict_body = body  # type: ignore[attr-defined]  # see direct.plan
    return [Depends(strict_json)]


Anyone = Annotated[Identity, role(*EVERYONE)]
Reader = Annotated[Identity, role(*READERS)]
Submitter = Annotated[Identity, role(*SUBMITTERS)]
WorkerId = Annotated[Identity, role(*WORKERS)]
Operator = Annotated[Identity, role(*OPERATORS)]
#: The same, as a Caller: the route looks the token up itself (`Server.call_as`).
SubmitterCaller = Annotated[Caller, caller(*SUBMITTERS)]
WorkerCaller = Annotated[Caller, caller(*WORKERS)]
def _digits(value: Any) -> Any:
    """A number in a path or a query as sent: plain ASCII digits. The number reader alone
    took `1.0`, ` 1`, `+1` and `1_0` (10) as numbers."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("a whole number in decimal digits (0-9) is expected")
    return value


#: A path's or query's whole number: plain ASCII digits, then the route's own bounds.
Digits = BeforeValidator(_digits)
JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX), Digits]


def scope(who: Identity) -> str | None:
    """The tenant a token sees: its own; a submitter or viewer without one sees the default
    tenant; an operator without one sees all."""
    from ..core.common import DEFAULT_TENANT

    if who.tenant is not None:
        return who.tenant
    return None if who.role == "operator" else DEFAULT_TENANT


def bearer_token(request: Request) -> str:
    """The bearer token of a request whose token a route's dependency has already read."""
    _scheme, secret = get_authorization_scheme_param(request.headers.get("authorization"))
    return secret


def worker_of(who: Identity) -> str:
    assert who.worker_id is not None  # the schema's check: worker tokens name one
    return who.worker_id
