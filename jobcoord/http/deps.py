"""Who is calling and what they may see: the bearer token looked up on every request, role
checks, the strict JSON body check, and the tenant scope of each role. Shared by every
route module."""

# No `from __future__ import annotations`: FastAPI reads these signatures at run time.
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .. import tokens
from .. import validate as v
from ..tokens import Identity
from .bodies import JOB_ID_MAX
from .errors import Forbidden, Unauthorized
from .state import Server

bearer = HTTPBearer(auto_error=False, description="A token from `jobcoord token create`.")


async def server(request: Request) -> Server:
    # async on purpose: FastAPI runs a plain `def` dependency on a worker thread of its
    # own, a thread hop per request (and up to 40 more threads in the server).
    srv: Server = request.app.state.server
    return srv


Srv = Annotated[Server, Depends(server)]


async def identity(srv: Srv, creds: Annotated[HTTPAuthorizationCredentials | None,
                                              Depends(bearer)]) -> Identity:
    if creds is None:
        raise Unauthorized("unauthorized", "missing token: send Authorization: Bearer <token>")
    # Looked up on every request: a revoked token fails on its very next request.
    who = await srv.call(tokens.authenticate, srv.c.db, creds.credentials)
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


async def strict_json(request: Request, srv: Srv) -> None:
    """Parse the raw body strictly (NaN, Infinity, duplicate keys, deep nesting are refused),
    the same checks the Coordinator applies to payloads."""
    raw = await request.body()
    if raw:
        v.json_value(raw, "body", max_bytes=srv.max_body, require_object=True,
                     too_large_code="body_too_large")


Anyone = Annotated[Identity, Depends(identity)]
Reader = Annotated[Identity, role("submitter", "viewer", "operator")]
Submitter = Annotated[Identity, role("submitter", "operator")]
WorkerId = Annotated[Identity, role("worker")]
Operator = Annotated[Identity, role("operator")]
JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX)]
strict = [Depends(strict_json)]


def scope(who: Identity) -> str | None:
    """The tenant a token sees: its own; a submitter or viewer without one sees the default
    tenant; an operator without one sees all."""
    from ..core.common import DEFAULT_TENANT

    if who.tenant is not None:
        return who.tenant
    return None if who.role == "operator" else DEFAULT_TENANT


def worker_of(who: Identity) -> str:
    assert who.worker_id is not None  # the schema's check: worker tokens name one
    return who.worker_id
