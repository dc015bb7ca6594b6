"""Dashboard logins: sessions kept in memory, the token looked up again on every request,
CSRF tokens per session, and the small form bodies of the login and the actions.

The server keeps a session id -> token hash table and sets the id in an HttpOnly,
SameSite=Strict cookie; the token itself never appears in a URL or a cookie. A revoked
token ends its sessions on their next request; a restarted server forgets its sessions (log
in again).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ...errors import InvalidInput
from ...tokens import Identity, live_identity

COOKIE = "jobcoord_session"
#: A session lasts this long without use.
SESSION_IDLE_S = 8 * 3600
#: Form bodies (login, actions) are small.
MAX_FORM = 16 * 1024


@dataclass
class Session:
    token_hash: str
    csrf: str
    last_used: float


@dataclass(frozen=True)
class Viewer:
    name: str
    role: str
    tenant: str | None
    csrf: str

    @property
    def operator(self) -> bool:
        return self.role == "operator"

    @property
    def scope(self) -> str | None:
        """The tenant this login sees (as the API's scope: an unbound viewer sees the
        default tenant, an unbound operator sees all)."""
        from ...service import DEFAULT_TENANT

        if self.tenant is not None:
            return self.tenant
        return None if self.operator else DEFAULT_TENANT


class NotLoggedIn(Exception):
    pass


class Sessions:
    """The server's sessions, shared by every request thread."""

    def __init__(self) -> None:
        self.by_id: dict[str, Session] = {}
        self.lock = threading.Lock()

    def new(self, token_hash: str) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self.lock:
            for key in [k for k, s in self.by_id.items()
                        if now - s.last_used > SESSION_IDLE_S]:
                del self.by_id[key]
            self.by_id[sid] = Session(token_hash, secrets.token_urlsafe(24), now)
        return sid

    async def viewer(self, request: Request) -> Viewer:
        """Who this request's session belongs to, with the token checked again now."""
        sid = request.cookies.get(COOKIE)
        with self.lock:
            session = self.by_id.get(sid) if sid else None
            if session is not None:
                session.last_used = time.monotonic()
        if session is None:
            raise NotLoggedIn
        srv = request.app.state.server
        row = await srv.call(token_by_hash, srv.c.db, session.token_hash)
        if row is None:  # revoked since: the session ends with it
            with self.lock:
                self.by_id.pop(sid or "", None)
            raise NotLoggedIn
        return Viewer(name=row.name, role=row.role, tenant=row.tenant, csrf=session.csrf)

    def end(self, sid: str | None, csrf: str) -> None:
        """Log out, when the form carries this session's CSRF token."""
        with self.lock:
            session = self.by_id.get(sid or "")
            if session is not None and hmac.compare_digest(csrf, session.csrf):
                self.by_id.pop(sid or "", None)


def token_by_hash(db: Any, token_hash: str) -> Identity | None:
    """The live viewer or operator token with this hash, or None."""
    ident = db.read(lambda conn: live_identity(db, conn, token_hash), "ui session")
    return ident if ident is not None and ident.role in ("viewer", "operator") else None


def from_another_site(request: Request) -> bool:
    """Whether a browser sent this form from a page of another origin. The login has no
    session, so no CSRF token to check: a page elsewhere could post its own token and log
    the reader into its session (login CSRF). Browsers say where a form came from
    (Sec-Fetch-Site, else Origin); a client that says neither is no browser."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return origin != f"{request.url.scheme}://{request.headers.get('host', '')}"


async def form(request: Request) -> dict[str, str]:
    """A small urlencoded form body (login, actions)."""
    raw = await request.body()
    if len(raw) > MAX_FORM:
        raise InvalidInput("invalid_input", "form too large")
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise InvalidInput("invalid_input", "form is not UTF-8") from None
    out = dict(pairs)
    if len(out) != len(pairs):
        # Of `as=dead&as=succeeded` which one was meant is nobody's guess (the API's
        # JSON bodies refuse duplicate keys alike).
        names = [name for name, _ in pairs]
        twice = next(name for name in names if names.count(name) > 1)
        raise InvalidInput("invalid_input", f"form field {twice[:80]!r} is given more than "
                           "once")
    return out
