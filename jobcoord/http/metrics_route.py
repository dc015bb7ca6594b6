"""`GET /metrics` on `jobcoord serve`: the Prometheus exposition of jobcoord.metrics.

Who may scrape: a `viewer` or `operator` token not bound to a tenant (the figures cover the
whole database, every tenant), or the separate `--metrics-token` (for a Prometheus that
should hold no API token), or anyone on loopback when `serve --metrics-public` was given on a
loopback address. The settings come from the `serve` options this module adds
(`serve_with_metrics_options`)."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any

import click
from fastapi import APIRouter, Request, Response

from .. import tokens
from ..errors import Forbidden, InvalidInput, Unauthorized
from .bodies import given_once

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class MetricsSettings:
    #: SHA-256 of the --metrics-token secret (the secret itself is not kept).
    token_hash: str | None = None
    public: bool = False


#: Set by `serve` before the app is built (one server per process).
SETTINGS = MetricsSettings()


def _client_is_loopback(request: Request) -> bool:
    """A loopback client asking for a loopback host. The client alone is not enough: a page
    of another site in the operator's browser, its name rebound to 127.0.0.1 (DNS
    rebinding), is a loopback client too, and its requests name that site as Host. (A
    request in absolute form, `GET http://site/metrics`, is judged by its Host too: no
    browser sends that form but to a proxy, and a local program may name any Host.)"""
    from .server import is_loopback

    # One Host only: of two, which one a proxy in front judged is anyone's guess.
    hosts = request.headers.getlist("host")
    named = _HOST.fullmatch(hosts[0]) if len(hosts) == 1 else None
    host = named and (named["v6"] or named["name"])
    return bool(host and request.client is not None and is_loopback(request.client.host)
                and is_loopback(host.lower()))


#: A Host header as browsers send it: a name or IPv4 address, or [an IPv6 address], and an
#: optional port; nothing else (a user part, a path) is a host.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::[0-9]{1,5})?")


def router() -> APIRouter:
    r = APIRouter()

    @r.get("/metrics", include_in_schema=True, response_class=Response,
           responses={200: {"content": {CONTENT_TYPE: {}},
                            "description": "Prometheus text exposition"}})
    async def metrics(request: Request) -> Response:
        srv = request.app.state.server
        # As every /v1 route: a token given twice (which one counts?) and a query parameter
        # this route does not take are 400, never judged by the first or left unread.
        given_once(request)
        if request.url.query:
            raise InvalidInput("invalid_input", "/metrics takes no query parameters")
        await _authorize(request, srv)
        registry = getattr(request.app.state, "metrics_registry", None)
        if registry is None:
            from ..metrics import registry_for

            registry = request.app.state.metrics_registry = registry_for(srv.c)
        from ..metrics import exposition

        body = await srv.call(exposition, registry)
        return Response(body, media_type=CONTENT_TYPE)

    return r


async def _authorize(request: Request, srv: Any) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() == "bearer" and secret.strip():
        secret = secret.strip()
        if SETTINGS.token_hash is not None and hmac.compare_digest(
                hashlib.sha256(secret.encode()).hexdigest(), SETTINGS.token_hash):
            return
        who = await srv.call(tokens.authenticate, srv.c.db, secret)
        if who is None:
            raise Unauthorized("unauthorized", "unknown or revoked token")
        if who.role not in ("viewer", "operator"):
            raise Forbidden("forbidden", f"{tokens.article(who.role)} {who.role} token may "
                            "not read /metrics (needs a viewer or operator token, or "
                            "--metrics-token)")
        if who.tenant is not None:
            raise Forbidden("forbidden", "the metrics cover every tenant: a token bound to a "
                            "tenant may not read them")
        return
    if SETTINGS.public and _client_is_loopback(request):
        return
    raise Unauthorized("unauthorized", "missing token: send Authorization: Bearer <token>")


def serve_with_metrics_options(serve: click.Command) -> click.Command:
    """`serve` with --metrics-token and --metrics-public added."""
    extra = [
        click.Option(["--metrics-token"], envvar="JOBCOORD_METRICS_TOKEN", metavar="SECRET",
                     help="A separate secret that may read /metrics only (also from "
                          "$JOBCOORD_METRICS_TOKEN, which keeps it out of `ps`)."),
        click.Option(["--metrics-public"], is_flag=True,
                     help="Serve /metrics without a token to loopback clients (only when "
                          "listening on a loopback address)."),
    ]

    def callback(**kw: Any) -> Any:
        from .server import is_loopback

        secret, public = kw.pop("metrics_token"), kw.pop("metrics_public")
        if public and not is_loopback(kw["host"]):
            raise InvalidInput("invalid_input", "--metrics-public is only for a loopback "
                               "address; give Prometheus --metrics-token instead")
        if secret is not None and len(secret.strip()) < 16:
            raise InvalidInput("invalid_input", "--metrics-token must be at least 16 "
                               "characters")
        SETTINGS.token_hash = (None if secret is None
                               else hashlib.sha256(secret.strip().encode()).hexdigest())
        SETTINGS.public = public
        assert serve.callback is not None
        return click.get_current_context().invoke(serve.callback, **kw)

    return click.Command(serve.name, params=[*serve.params, *extra], callback=callback,
                         help=serve.help, short_help=serve.short_help)
