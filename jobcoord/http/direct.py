"""The direct way through a worker's hot routes (claim, heartbeat, renew, complete, fail,
...): a request that is well formed in every way the route checks is answered without the
framework's per-request dependency solving, which cost more of the server's time than the
database work of a completion. What it runs is what the route declares: the same strict body
check, the same body model, the same token check in the route's own pool call, the same
endpoint, the same response serializer. Anything else about a request (no token, a body the
strict check or the model refuses, an unknown query parameter, a path number out of range, a
body that is not declared as JSON) goes the framework's way, which answers it as it always
did: the direct way only ever answers a request that way would have accepted."""

# No `from __future__ import annotations`: the route signatures are compared at run time.
import inspect
import re
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.routing import APIRoute, serialize_response
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError

from .. import validate as v
from ..errors import InvalidInput, JobcoordError
from .bodies import JOB_ID_MAX, _Body, given_once
from .deps import Caller, JobId, Srv, WorkerCaller

Answer = Callable[[Request, dict[str, str]], Awaitable[Response | None]]

_ID_DIGITS = len(str(JOB_ID_MAX))


@dataclass(frozen=True)
class _Plan:
    body: type[_Body]
    body_optional: bool
    roles: tuple[str, ...]
    takes_job_id: bool
    takes_request: bool


def _roles(annotation: Any) -> tuple[str, ...]:
    depends = typing.get_args(annotation)[1]
    return tuple(depends.dependency.allowed_roles)


def _body_model(annotation: Any) -> tuple[type[_Body] | None, bool]:
    """The body model a parameter takes, and whether it may be left out (`X | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, _Body):
        return annotation, False
    args = typing.get_args(annotation)
    models = [a for a in args if isinstance(a, type) and issubclass(a, _Body)]
    if len(args) == 2 and type(None) in args and len(models) == 1:
        return models[0], True
    return None, False


def plan(route: APIRoute) -> _Plan | None:
    """How the direct way answers this route, or None when it does not: every parameter of
    the endpoint must be one it makes (the server, a Caller, the job id in the path, the
    request, a body model) and the route's only other check the strict body check of that
    model (deps.strict)."""
    if not isinstance(route.response_class, DefaultPlaceholder) or route.response_field is None:
        return None
    if route.status_code not in (None, 200):
        return None
    body: type[_Body] | None = None
    optional = False
    roles: tuple[str, ...] | None = None
    takes_job_id = takes_request = False
    for name, p in inspect.signature(route.endpoint).parameters.items():
        if p.annotation is Srv and name == "srv":
            continue
        if p.annotation is WorkerCaller and name == "caller":
            # A worker's Caller: its token is looked up in the route's own pool call
            # (`Server.call_as`), as on the framework's way.
            roles = _roles(p.annotation)
        elif p.annotation is JobId and name == "job_id":
            takes_job_id = True
        elif p.annotation is Request and name == "request":
            takes_request = True
        elif name == "body":
            body, optional = _body_model(p.annotation)
            if body is None or (optional and p.default is not None):
                return None
        else:
            return None
    if roles is None or body is None:
        return None
    checks = [getattr(d.dependency, "strict_body", None) for d in route.dependencies]
    if checks != [body]:
        return None
    return _Plan(body, optional, roles, takes_job_id, takes_request)


def _json_declared(content_type: str | None) -> bool:
    """Is the body declared as JSON the way the framework reads one (`application/json` or
    `application/...+json`)? A body without a Content-Type it does not read as JSON."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


def answer(route: APIRoute) -> Answer | None:
    """The direct answer of `route` (None when it has none): a coroutine that answers a
    well-formed request, or returns None to hand it to the framework's way."""
    p = plan(route)
    if p is None:
        return None
    endpoint = route.endpoint
    field = route.response_field
    model = p.body
    envelope = model.VALUES_AT

    async def direct(request: Request, path_params: dict[str, str]) -> Response | None:
        if request.scope.get("query_string"):
            return None
        headers = request.headers
        scheme, token = get_authorization_scheme_param(headers.get("authorization"))
        if not token or scheme.lower() != "bearer":
            return None
        kwargs: dict[str, Any] = {}
        if p.takes_job_id:
            given = path_params.get("job_id", "")
            if not (given.isascii() and given.isdigit() and len(given) <= _ID_DIGITS):
                return None
            job_id = int(given)
            if not 1 <= job_id <= JOB_ID_MAX:
                return None
            kwargs["job_id"] = job_id
        raw = await request.body()
        srv = request.app.state.server
        if raw:
            if not _json_declared(headers.get("content-type")):
                return None
            try:
                value, _ = v.json_value(raw, "body", max_bytes=srv.max_body,
                                        require_object=True, too_large_code="body_too_large",
                                        envelope=envelope)
                kwargs["body"] = model.model_validate(value)
            except (InvalidInput, ValidationError):
                return None
        elif p.body_optional:
            kwargs["body"] = None
        else:
            return None
        if p.takes_request:
            kwargs["request"] = request
        got = await endpoint(caller=Caller(token, p.roles), srv=srv, **kwargs)
        if isinstance(got, Response):
            return got
        content = await serialize_response(field=field, response_content=got,
                                           dump_json=True)
        return Response(content=content, media_type="application/json")

    return direct


class DirectLane:
    """ASGI middleware, innermost of jobcoord's (inside the body limits): a request to a
    route with a direct answer (`answer`) is answered here, past the framework's exception
    layers, router and per-request dependency solving, which cost the server more time than
    a completion's transaction. A JobcoordError is answered by `on_error`, the app's own
    handler of it. A request the direct way hands back goes on to the framework with its
    body as received."""

    def __init__(self, app: Any, routes: list[APIRoute],
                 on_error: Callable[[JobcoordError], Response]) -> None:
        self.app = app
        self.on_error = on_error
        self.routes: list[tuple[frozenset[str], re.Pattern[str], Answer]] = []
        for route in routes:
            got = answer(route)
            if got is not None:
                self.routes.append((frozenset(route.methods or ()), route.path_regex, got))

    def _find(self, scope: dict[str, Any]) -> tuple[Answer, dict[str, str]] | None:
        if scope["type"] != "http" or scope.get("root_path"):
            return None
        method, path = scope["method"], scope["path"]
        for methods, regex, direct in self.routes:
            if method in methods:
                m = regex.match(path)
                if m is not None:
                    return direct, m.groupdict()
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        found = self._find(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        direct, path_params = found
        request = Request(scope, receive, send)
        try:
            given_once(request)
        except InvalidInput:
            response = None
        else:
            try:
                response = await direct(request, path_params)
            except JobcoordError as e:
                response = self.on_error(e)
        if response is None:
            await self.app(scope, _replay(await request.body(), receive), send)
            return
        await response(scope, receive, send)


def _replay(raw: bytes, receive: Any) -> Any:
    """`receive` as if nothing had been read from it: the body read first, then the rest."""
    told = False

    async def again() -> dict[str, Any]:
        nonlocal told
        if not told:
            told = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return again
