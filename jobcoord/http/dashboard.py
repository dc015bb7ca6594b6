"""The web dashboard (server-rendered Jinja2 + vendored htmx, under /ui) and `/metrics`,
mounted on the `jobcoord serve` application.

- Log in with a `viewer` or `operator` token in a form (POST body, never a URL). The server
  keeps a session id -> token hash table in memory and sets the id in an HttpOnly,
  SameSite=Strict cookie; every request looks the token up again, so a revoked token ends its
  sessions on their next request. A restarted server forgets its sessions (log in again).
- Every action form carries the session's CSRF token; an action is refused (403) unless the
  token matches and the session's role is operator, whatever the page showed.
- Reads go through the public Coordinator methods (show, explain, workers) or through the
  parameterized SQL below, one read transaction (snapshot) per page part.
- Live parts (overview, job page) poll with htmx every few seconds and swap one fragment.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .. import tokens
from ..clock import MICROS, iso, now_us
from ..errors import InvalidInput, JobcoordError
from ..states import FINAL_STATUSES, STATUSES
from ..store import feature_statements as fs
from ..store import report_statements as rs

HERE = os.path.dirname(os.path.abspath(__file__))
COOKIE = "jobcoord_session"
#: A session lasts this long without use.
SESSION_IDLE_S = 8 * 3600
#: Rows on one page of the jobs view.
PAGE = 50
#: Counts above this are shown as "10,000+": counting stops there.
COUNT_CAP = 10_000
#: Payload and result text shown on the job page before it is cut.
SHOW_BYTES = 16 * 1024
#: Form bodies (login, actions) are small.
MAX_FORM = 16 * 1024
ACTIONS = ("cancel", "retry", "reconcile")
POLL = "every 3s"


def mount(app: Any) -> None:
    """Add /metrics and the dashboard (/ui, /ui/static) to the API application."""
    from fastapi.staticfiles import StaticFiles

    from .metrics_route import router as metrics_router

    app.include_router(metrics_router())
    app.include_router(Dashboard().router(), include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=os.path.join(HERE, "static")),
              name="ui-static")


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
        from ..service import DEFAULT_TENANT

        if self.tenant is not None:
            return self.tenant
        return None if self.operator else DEFAULT_TENANT


class NotLoggedIn(Exception):
    pass


def _templates() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
        autoescape=jinja2.select_autoescape(["html"]))
    env.filters["age"] = _age
    env.filters["num"] = lambda n: f"{n:,}"
    env.globals["poll"] = POLL
    return env


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _capped_text(value: Any) -> tuple[str, bool]:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text.encode()) <= SHOW_BYTES:
        return text, False
    return text.encode()[:SHOW_BYTES].decode("utf-8", "ignore"), True


class Dashboard:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.env = _templates()

    # -- sessions --

    def _new_session(self, token_hash: str) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self.lock:
            for key in [k for k, s in self.sessions.items()
                        if now - s.last_used > SESSION_IDLE_S]:
                del self.sessions[key]
            self.sessions[sid] = Session(token_hash, secrets.token_urlsafe(24), now)
        return sid

    async def _viewer(self, request: Request) -> Viewer:
        sid = request.cookies.get(COOKIE)
        with self.lock:
            session = self.sessions.get(sid) if sid else None
            if session is not None:
                session.last_used = time.monotonic()
        if session is None:
            raise NotLoggedIn
        srv = request.app.state.server
        row = await srv.call(_token_by_hash, srv.c.db, session.token_hash)
        if row is None:  # revoked since: the session ends with it
            with self.lock:
                self.sessions.pop(sid or "", None)
            raise NotLoggedIn
        return Viewer(name=row[0], role=row[1], tenant=row[2], csrf=session.csrf)

    # -- rendering --

    def page(self, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(**ctx)
        return HTMLResponse(html, status_code=status, headers={
            "Cache-Control": "no-store",
            # Scripts and styles from this server only; no frames of the dashboard elsewhere.
            "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; "
                                       "form-action 'self'; base-uri 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    def error(self, message: str, status: int, who: Viewer | None = None,
              code: str = "error") -> HTMLResponse:
        return self.page("error.html", status, who=who, message=message, code=code,
                         title="Error")

    # -- routes --

    def router(self) -> APIRouter:
        r = APIRouter()
        d = self

        async def guarded(request: Request, fn: Any) -> Response:
            try:
                who = await d._viewer(request)
            except NotLoggedIn:
                if request.headers.get("hx-request"):
                    return Response(status_code=204, headers={"HX-Redirect": "/ui/login"})
                return RedirectResponse("/ui/login", status_code=303)
            try:
                return await fn(who)
            except JobcoordError as e:
                from .errors import status_of

                return d.error(e.message, status_of(e), who, e.code)

        @r.get("/")
        async def root() -> Response:
            # The dashboard is the server's front page (the API lives under /v1).
            return RedirectResponse("/ui/", status_code=307)

        @r.get("/ui", response_class=HTMLResponse)
        @r.get("/ui/", response_class=HTMLResponse)
        async def overview(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                data = await _overview_data(request, who)
                return d.page("overview.html", who=who, title="Overview", nav="overview",
                              **data)
            return await guarded(request, go)

        @r.get("/ui/overview/live", response_class=HTMLResponse)
        async def overview_live(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                data = await _overview_data(request, who)
                return d.page("overview_live.html", who=who, **data)
            return await guarded(request, go)

        @r.get("/ui/jobs", response_class=HTMLResponse)
        async def jobs(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                filters = _filters(request.query_params, who)
                srv = request.app.state.server
                rows, count, next_before = await srv.call(_jobs_page, srv.c.db, filters)
                shown = "10,000+" if count > COUNT_CAP else f"{count:,}"
                query = {k: v for k, v in filters.items()
                         if k not in ("before", "scope") and v is not None}
                return d.page("jobs.html", who=who, title="Jobs", nav="jobs", rows=rows,
                              count=shown, filters=filters, statuses=STATUSES,
                              next_url=None if next_before is None else "/ui/jobs?"
                              + urllib.parse.urlencode({**query, "before": next_before}))
            return await guarded(request, go)

        async def job_data(request: Request, who: Viewer, job_id: int) -> dict[str, Any]:
            srv = request.app.state.server
            shown = await srv.call(srv.c.show, job_id, tenant=who.scope)
            why = await srv.call(srv.c.explain, job_id, tenant=who.scope)
            job = shown["job"]
            payload, payload_cut = _capped_text(job["payload"])
            result, result_cut = _capped_text(job["result"])
            return {"job": job, "shown": shown, "explain": why, "payload": payload,
                    "payload_cut": payload_cut, "result": result, "result_cut": result_cut,
                    "provenance": _capped_text(job["provenance"])[0],
                    "actions": _actions_for(job["status"]) if who.operator else []}

        @r.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
        async def job(request: Request, job_id: str) -> Response:
            async def go(who: Viewer) -> Response:
                data = await job_data(request, who, _job_id(job_id))
                return d.page("job.html", who=who, title=f"Job {data['job']['job_id']}",
                              nav="jobs", **data)
            return await guarded(request, go)

        @r.get("/ui/jobs/{job_id}/live", response_class=HTMLResponse)
        async def job_live(request: Request, job_id: str) -> Response:
            async def go(who: Viewer) -> Response:
                data = await job_data(request, who, _job_id(job_id))
                return d.page("job_live.html", who=who, **data)
            return await guarded(request, go)

        @r.get("/ui/jobs/{job_id}/artifacts/{name}")
        async def artifact(request: Request, job_id: str, name: str) -> Response:
            async def go(who: Viewer) -> Response:
                srv = request.app.state.server
                shown = await srv.call(srv.c.show, _job_id(job_id), tenant=who.scope)
                for a in shown["artifacts"]:
                    if a["name"] == name and a["state"] == "accepted":
                        return await _artifact_response(srv, _job_id(job_id), a)
                return d.error(f"no accepted artifact {name!r} on this job", 404, who)
            return await guarded(request, go)

        @r.get("/ui/workers", response_class=HTMLResponse)
        async def workers(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                srv = request.app.state.server
                got = await srv.call(srv.c.workers)
                leases = await srv.call(_leases, srv.c.db, who.scope)
                return d.page("workers.html", who=who, title="Workers", nav="workers",
                              workers=_worker_views(got["workers"], leases,
                                                    srv.c.policy.heartbeat_max_age_s))
            return await guarded(request, go)

        @r.get("/ui/attention", response_class=HTMLResponse)
        async def attention(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                srv = request.app.state.server
                unknown, dead = await srv.call(_attention, srv.c.db, who.scope)
                return d.page("attention.html", who=who, title="Needs attention",
                              nav="attention", unknown=unknown, dead=dead)
            return await guarded(request, go)

        @r.get("/ui/jobs/{job_id}/confirm/{action}", response_class=HTMLResponse)
        async def confirm(request: Request, job_id: str, action: str) -> Response:
            async def go(who: Viewer) -> Response:
                if action not in ACTIONS:
                    return d.error(f"no action {action!r}", 404, who)
                if not who.operator:
                    return d.error("a viewer may not act on jobs", 403, who, "forbidden")
                data = await job_data(request, who, _job_id(job_id))
                return d.page("confirm.html", who=who, title=f"{action.title()} job "
                              f"{data['job']['job_id']}?", nav="jobs", action=action,
                              prefill_as=request.query_params.get("as", ""),
                              prefill_reason=request.query_params.get("reason", "")[:500],
                              **data)
            return await guarded(request, go)

        @r.post("/ui/jobs/{job_id}/{action}", response_class=HTMLResponse)
        async def act(request: Request, job_id: str, action: str) -> Response:
            async def go(who: Viewer) -> Response:
                form = await _form(request)
                # The server decides, whatever the page showed: CSRF first, then the role.
                if not hmac.compare_digest(form.get("csrf", ""), who.csrf):
                    return d.error("the form is stale or was not sent by this dashboard "
                                   "(CSRF token mismatch); reload the page", 403, who,
                                   "csrf_mismatch")
                if not who.operator:
                    return d.error("a viewer may not act on jobs", 403, who, "forbidden")
                if action not in ACTIONS:
                    return d.error(f"no action {action!r}", 404, who)
                jid = _job_id(job_id)
                srv = request.app.state.server
                try:
                    if action == "cancel":
                        got = await srv.call(srv.c.cancel, jid, tenant=who.scope)
                    elif action == "retry":
                        got = await srv.call(srv.c.retry, jid, tenant=who.scope)
                        srv.notify()
                    else:
                        got = await srv.call(srv.c.reconcile, jid, form.get("as", ""),
                                             form.get("reason", ""),
                                             result=_result_field(form.get("result", "")),
                                             tenant=who.scope)
                        srv.notify()
                except JobcoordError as e:
                    from .errors import status_of

                    status = status_of(e)
                    data = await job_data(request, who, jid) if status != 404 else {}
                    if not data:
                        return d.error(e.message, status, who, e.code)
                    return d.page("job.html", status, who=who, title=f"Job {jid}",
                                  nav="jobs", refusal={"code": e.code, "message": e.message,
                                                       "action": action}, **data)
                return RedirectResponse(f"/ui/jobs/{jid}?done={action}-{got.get('status', '')}",
                                        status_code=303)
            return await guarded(request, go)

        @r.get("/ui/login", response_class=HTMLResponse)
        async def login_form(request: Request) -> Response:
            return d.page("login.html", who=None, title="Log in", message=None)

        @r.post("/ui/login", response_class=HTMLResponse)
        async def login(request: Request) -> Response:
            try:
                form = await _form(request)
            except InvalidInput as e:
                return d.page("login.html", 400, who=None, title="Log in", message=e.message)
            secret = form.get("token", "").strip()
            srv = request.app.state.server
            who = await srv.call(tokens.authenticate, srv.c.db, secret) if secret else None
            if who is None:
                return d.page("login.html", 401, who=None, title="Log in",
                              message="That token is unknown or revoked.")
            if who.role not in ("viewer", "operator"):
                return d.page("login.html", 403, who=None, title="Log in",
                              message=f"A {who.role} token cannot open the dashboard: use a "
                                      "viewer or operator token.")
            sid = d._new_session(tokens.hash_secret(secret))
            response = RedirectResponse("/ui/", status_code=303)
            response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/ui",
                                secure=request.url.scheme == "https",
                                max_age=SESSION_IDLE_S)
            return response

        @r.post("/ui/logout")
        async def logout(request: Request) -> Response:
            sid = request.cookies.get(COOKIE)
            form = await _form(request)
            with d.lock:
                session = d.sessions.get(sid or "")
                if session is not None and hmac.compare_digest(form.get("csrf", ""),
                                                               session.csrf):
                    d.sessions.pop(sid or "", None)
            response = RedirectResponse("/ui/login", status_code=303)
            response.delete_cookie(COOKIE, path="/ui")
            return response

        return r


# --- helpers that read (each one read transaction, parameterized SQL) -----------------------


def _token_by_hash(db: Any, token_hash: str) -> Any:
    row = db.read(lambda conn: db.run(conn, fs.SESSION_TOKEN, {"hash": token_hash}).first(),
                  "ui session")
    if row is None or row[3] is not None or not hmac.compare_digest(row[4], token_hash):
        return None
    if row[1] not in ("viewer", "operator"):
        return None
    return row


def _result_field(text: str) -> Any:
    """The reconcile form's result: JSON text, or nothing."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidInput("invalid_input", f"the result is not JSON: {e}") from None


def _job_id(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2**62:
        raise InvalidInput("invalid_input", f"{text!r} is not a job id")
    return int(text)


async def _form(request: Request) -> dict[str, str]:
    raw = await request.body()
    if len(raw) > MAX_FORM:
        raise InvalidInput("invalid_input", "form too large")
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise InvalidInput("invalid_input", "form is not UTF-8") from None
    return dict(pairs)


#: The overview's aggregates (full scans of the jobs table on a large database) are shared
#: by every session of the same scope for this long: ten people polling every 3 s cost one
#: computation per interval, not ten. The page says when its figures were read.
OVERVIEW_TTL_S = 2.5
_overview_cache: dict[str | None, tuple[float, dict[str, Any]]] = {}
_overview_locks: dict[str | None, Any] = {}


async def _overview_data(request: Request, who: Viewer) -> dict[str, Any]:
    import asyncio

    srv = request.app.state.server
    lock = _overview_locks.setdefault(who.scope, asyncio.Lock())
    async with lock:  # one computation at a time per scope; the others wait and share it
        cached = _overview_cache.get(who.scope)
        if cached is not None and time.monotonic() - cached[0] < OVERVIEW_TTL_S:
            data = dict(cached[1])
        else:
            data = await srv.call(_overview_read, srv.c.db, who.scope)
            _overview_cache[who.scope] = (time.monotonic(), dict(data))
    got = await srv.call(srv.c.workers)
    views = _worker_views(got["workers"], {}, srv.c.policy.heartbeat_max_age_s)
    data["workers_online"] = sum(1 for w in views if w["online"])
    data["workers_total"] = len(views)
    data["blocking"] = [w for w in views if w["online"] and w["gate_text"]]
    return data


def _overview_read(db: Any, scope: str | None) -> dict[str, Any]:
    now = now_us()
    hour_ago = now - 3600 * MICROS
    params = {"tenant": scope, "since": hour_ago}
    scoped = scope is not None

    def _do(conn: Any) -> dict[str, Any]:
        rows = db.run(conn, rs.OVERVIEW_COUNTS[scoped], params).all()
        oldest = db.run(conn, rs.OVERVIEW_OLDEST[scoped], params).all()
        recent = db.run(conn, rs.OVERVIEW_RECENT[scoped], params).all()
        return {"rows": rows, "oldest": oldest, "recent": recent}

    got = db.read(_do, "ui overview")
    by_status = dict.fromkeys(STATUSES, 0)
    kinds: dict[str, dict[str, int]] = {}
    for status, kind, n in got["rows"]:
        by_status[status] += n
        kinds.setdefault(kind, dict.fromkeys(STATUSES, 0))[status] = n
    recent = dict(got["recent"])
    return {
        "by_status": by_status, "statuses": STATUSES,
        "kinds": sorted(kinds.items()),
        "oldest": [{"kind": k, "age_s": max(0.0, (now - c) / MICROS), "waiting": n}
                   for k, c, n in sorted(got["oldest"], key=lambda r: r[1])],
        "finished_hour": recent.get("succeeded", 0),
        "failed_hour": recent.get("dead", 0) + recent.get("unknown", 0),
        "cancelled_hour": recent.get("cancelled", 0), "now": iso(now)}


def _filters(q: Any, who: Viewer) -> dict[str, Any]:
    def text(name: str) -> str | None:
        value = (q.get(name) or "").strip()
        return value or None

    status = text("status")
    if status is not None and status not in STATUSES:
        raise InvalidInput("invalid_input", f"status must be one of {', '.join(STATUSES)}")
    priority = text("priority")
    if priority is not None:
        priority = priority.upper().removeprefix("P")
        if priority not in ("0", "1", "2", "3"):
            raise InvalidInput("invalid_input", "priority must be 0..3 (or P0..P3)")
    before = text("before")
    if before is not None and not before.isdigit():
        raise InvalidInput("invalid_input", "before must be a job id")
    tenant = text("tenant")
    if who.scope is not None:
        tenant = who.scope  # a scoped login sees its tenant only, whatever the URL says
    out = {"status": status, "kind": text("kind"), "tenant": tenant,
           "priority": None if priority is None else int(priority), "key": text("key"),
           "before": None if before is None else int(before)}
    for name in ("kind", "tenant", "key"):
        if out[name] is not None and len(out[name]) > 200:
            raise InvalidInput("invalid_input", f"{name} is too long")
    return out


def _jobs_page(db: Any, f: dict[str, Any]) -> tuple[list[Any], int, int | None]:
    """One page, newest first, by keyset (job_id < before; no OFFSET), and the number of
    matches, counted no further than COUNT_CAP + 1."""
    params = {"limit": PAGE + 1, "cap": COUNT_CAP + 1}
    filters = tuple(name for _col, name in rs.JOB_FILTERS if f[name] is not None)
    params.update((name, f[name]) for name in filters)
    if f["before"] is not None:
        params["before"] = f["before"]
    page, counted = rs.job_page(filters, f["before"] is not None)

    def _do(conn: Any) -> tuple[list[Any], int]:
        rows = db.run(conn, page, params).all()
        count = db.run(conn, counted, params).scalar_one()
        return rows, count

    rows, count = db.read(_do, "ui jobs")
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    view = [{"job_id": r[0], "tenant": r[1], "kind": r[2], "priority": r[3],
             "status": r[4], "attempts": r[5], "max_attempts": r[6],
             "created_at": iso(r[7]), "updated_at": iso(r[8])} for r in rows]
    return view, count, rows[-1][0] if more else None


def _leases(db: Any, scope: str | None) -> dict[str, list[dict[str, Any]]]:
    now = now_us()
    rows = db.read(lambda conn: db.run(conn, rs.LEASE_LIST[scope is not None],
                                       {"tenant": scope}).all(), "ui leases")
    out: dict[str, list[dict[str, Any]]] = {}
    for worker, job_id, epoch, expires, kind in rows:
        out.setdefault(worker, []).append({"job_id": job_id, "epoch": epoch, "kind": kind,
                                           "expires_in_s": (expires - now) / MICROS})
    return out


def _attention(db: Any, scope: str | None) -> tuple[list[Any], list[Any]]:
    def _do(conn: Any) -> tuple[list[Any], list[Any]]:
        scoped = scope is not None
        unknown = db.run(conn, rs.UNKNOWN_JOBS[scoped], {"tenant": scope}).all()
        dead = db.run(conn, rs.DEAD_JOBS[scoped], {"tenant": scope}).all()
        return unknown, dead

    unknown, dead = db.read(_do, "ui attention")

    def view(r: Any) -> dict[str, Any]:
        return {"job_id": r[0], "tenant": r[1], "kind": r[2], "attempts": r[3],
                "last_error": (r[4] or "")[:2000], "updated_at": iso(r[5])}

    return [view(r) for r in unknown], [view(r) for r in dead]


def _gate_text(gates: dict[str, Any]) -> str:
    """"on battery, P2/P3 held" -- the words of the refusal and what it holds back."""
    if gates["can_claim"] and gates["max_priority"] >= 3:
        return ""
    reason = gates.get("refusal") or {}
    words = reason.get("detail") or reason.get("reason") or "gated"
    if not gates["can_claim"]:
        return f"{words}: all work held"
    held = "/".join(f"P{p}" for p in range(gates["max_priority"] + 1, 4))
    return f"{words}, {held} held"


def _worker_views(workers: list[dict[str, Any]], leases: dict[str, list[dict[str, Any]]],
                  max_age: float) -> list[dict[str, Any]]:
    out = []
    for w in workers:
        gates = w["gates"]
        verdicts = [{"priority": f"P{p}",
                     "ok": gates["can_claim"] and p <= gates["max_priority"]}
                    for p in range(4)]
        age = w["heartbeat_age_s"]
        out.append({**w, "online": age is not None and age <= max_age,
                    "gate_text": _gate_text(gates), "verdicts": verdicts,
                    "leases": leases.get(w["worker_id"], [])})
    return out


def _actions_for(status: str) -> list[str]:
    if status in ("waiting", "running"):
        return ["cancel"]
    if status == "unknown":
        return ["reconcile", "cancel"]
    if status in FINAL_STATUSES and status != "succeeded":
        return ["retry"]
    return []


async def _artifact_response(srv: Any, job_id: int, a: dict[str, Any]) -> Response:
    """An accepted artifact, copied out of the store verified (size and digest) into a
    temporary file that is streamed and then removed: a corrupt object is never served."""
    import tempfile

    from fastapi.responses import FileResponse
    from starlette.background import BackgroundTask

    fd, path = tempfile.mkstemp(prefix="jobcoord-artifact-")
    os.close(fd)
    try:
        await srv.call(srv.c.get_artifact, job_id, a["name"], path)
    except BaseException:
        os.unlink(path)
        raise
    digest = a["digest"]
    return FileResponse(path, media_type=a["media_type"] or "application/octet-stream",
                        filename=os.path.basename(a["name"]),
                        background=BackgroundTask(os.unlink, path),
                        headers={"X-Content-Digest": digest,
                                 "ETag": '"' + hashlib.sha256(digest.encode()).hexdigest()[:32]
                                 + '"'})
