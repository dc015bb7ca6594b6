"""The dashboard's routes under /ui: pages, the live fragments htmx polls, the actions
(cancel, retry, reconcile: operator only, CSRF-checked, through the same Coordinator methods
as the CLI), login and logout."""

from __future__ import annotations

import hmac
import urllib.parse
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ... import tokens
from ...errors import InvalidInput, JobcoordError
from ...states import STATUSES
from ...store import report_statements as rs
from ..bodies import given_once
from ..routes_artifacts import artifact_file
from . import reads
from .reads import overview_data
from .session import COOKIE, SESSION_IDLE_S, NotLoggedIn, Sessions, Viewer, from_another_site
from .session import form as session_form
from .views import actions_for, capped_text, templates, worker_views

ACTIONS = ("cancel", "retry", "reconcile")


class Dashboard:
    def __init__(self) -> None:
        self.sessions = Sessions()
        self.env = templates()

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

        def csrf_refusal(form: Any, who: Viewer) -> Response | None:
            """The 403 of a form without this session's CSRF token, or None."""
            if hmac.compare_digest(form.get("csrf", ""), who.csrf):
                return None
            return d.error("the form is stale or was not sent by this dashboard (CSRF token "
                           "mismatch); reload the page", 403, who, "csrf_mismatch")

        async def guarded(request: Request, fn: Any) -> Response:
            try:
                who = await d.sessions.viewer(request)
            except NotLoggedIn:
                if request.headers.get("hx-request"):
                    return Response(status_code=204, headers={"HX-Redirect": "/ui/login"})
                return RedirectResponse("/ui/login", status_code=303)
            try:
                given_once(request)
                return await fn(who)
            except JobcoordError as e:
                from ..errors import headers_of, status_of

                page = d.error(e.message, status_of(e), who, e.code)
                page.headers.update(headers_of(e))  # Retry-After, as the API says it
                return page

        @r.get("/")
        async def root() -> Response:
            # The dashboard is the server's front page (the API lives under /v1).
            return RedirectResponse("/ui/", status_code=307)

        @r.get("/ui", response_class=HTMLResponse)
        @r.get("/ui/", response_class=HTMLResponse)
        async def overview(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                data = await overview_data(request, who.scope)
                return d.page("overview.html", who=who, title="Overview", nav="overview",
                              **data)
            return await guarded(request, go)

        @r.get("/ui/overview/live", response_class=HTMLResponse)
        async def overview_live(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                data = await overview_data(request, who.scope)
                return d.page("overview_live.html", who=who, **data)
            return await guarded(request, go)

        @r.get("/ui/jobs", response_class=HTMLResponse)
        async def jobs(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                filters = reads.filters(request.query_params, who.scope)
                srv = request.app.state.server
                rows, count, next_before = await srv.call(reads.jobs_page, srv.c.db, filters)
                shown = "10,000+" if count > reads.COUNT_CAP else f"{count:,}"
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
            payload, payload_cut = capped_text(job["payload"])
            result, result_cut = capped_text(job["result"])
            return {"job": job, "shown": shown, "explain": why, "payload": payload,
                    "payload_cut": payload_cut, "result": result, "result_cut": result_cut,
                    "provenance": capped_text(job["provenance"])[0],
                    "actions": actions_for(job["status"]) if who.operator else []}

        @r.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
        async def job(request: Request, job_id: str) -> Response:
            async def go(who: Viewer) -> Response:
                data = await job_data(request, who, reads.job_id(job_id))
                return d.page("job.html", who=who, title=f"Job {data['job']['job_id']}",
                              nav="jobs", **data)
            return await guarded(request, go)

        @r.get("/ui/jobs/{job_id}/live", response_class=HTMLResponse)
        async def job_live(request: Request, job_id: str) -> Response:
            async def go(who: Viewer) -> Response:
                data = await job_data(request, who, reads.job_id(job_id))
                return d.page("job_live.html", who=who, **data)
            return await guarded(request, go)

        @r.get("/ui/jobs/{job_id}/artifacts/{name}")
        async def artifact(request: Request, job_id: str, name: str) -> Response:
            async def go(who: Viewer) -> Response:
                srv = request.app.state.server
                shown = await srv.call(srv.c.show, reads.job_id(job_id), tenant=who.scope)
                for a in shown["artifacts"]:
                    if a["name"] == name and a["state"] == "accepted":
                        return await artifact_file(srv, reads.job_id(job_id), a)
                return d.error(f"no accepted artifact {name!r} on this job", 404, who)
            return await guarded(request, go)

        @r.get("/ui/workers", response_class=HTMLResponse)
        async def workers(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                srv = request.app.state.server
                got = await srv.call(srv.c.workers, tenant=who.scope)
                leases = await srv.call(reads.leases, srv.c.db, who.scope)
                return d.page("workers.html", who=who, title="Workers", nav="workers",
                              workers=worker_views(got["workers"], leases,
                                                    srv.c.policy.heartbeat_max_age_s))
            return await guarded(request, go)

        @r.get("/ui/attention", response_class=HTMLResponse)
        async def attention(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                srv = request.app.state.server
                unknown, dead = await srv.call(reads.attention, srv.c.db, who.scope)
                return d.page("attention.html", who=who, title="Needs attention",
                              nav="attention", unknown=unknown, dead=dead,
                              shown=rs.ATTENTION_SHOWN)
            return await guarded(request, go)

        @r.get("/ui/jobs/{job_id}/confirm/{action}", response_class=HTMLResponse)
        async def confirm(request: Request, job_id: str, action: str) -> Response:
            async def go(who: Viewer) -> Response:
                if action not in ACTIONS:
                    return d.error(f"no action {action!r}", 404, who)
                if not who.operator:
                    return d.error("a viewer may not act on jobs", 403, who, "forbidden")
                data = await job_data(request, who, reads.job_id(job_id))
                return d.page("confirm.html", who=who, title=f"{action.title()} job "
                              f"{data['job']['job_id']}?", nav="jobs", action=action,
                              prefill_as=request.query_params.get("as", ""),
                              prefill_reason=request.query_params.get("reason", "")[:500],
                              **data)
            return await guarded(request, go)

        @r.post("/ui/jobs/{job_id}/{action}", response_class=HTMLResponse)
        async def act(request: Request, job_id: str, action: str) -> Response:
            async def go(who: Viewer) -> Response:
                form = await session_form(request)
                # The server decides, whatever the page showed: CSRF first, then the role.
                stale = csrf_refusal(form, who)
                if stale is not None:
                    return stale
                if not who.operator:
                    return d.error("a viewer may not act on jobs", 403, who, "forbidden")
                if action not in ACTIONS:
                    return d.error(f"no action {action!r}", 404, who)
                jid = reads.job_id(job_id)
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
                                             result=reads.result_field(form.get("result", "")),
                                             tenant=who.scope)
                        srv.notify()
                except JobcoordError as e:
                    from ..errors import status_of

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
            if from_another_site(request):
                return d.page("login.html", 403, who=None, title="Log in",
                              message="A login sent from another site is refused: log in "
                                      "on this page.")
            try:
                form = await session_form(request)
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
            sid = d.sessions.new(tokens.hash_secret(secret))
            response = RedirectResponse("/ui/", status_code=303)
            response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/ui",
                                secure=request.url.scheme == "https",
                                max_age=SESSION_IDLE_S)
            return response

        @r.post("/ui/logout")
        async def logout(request: Request) -> Response:
            async def go(who: Viewer) -> Response:
                # As every other form: without this session's CSRF token it is refused, and
                # says so. Answered as a logout, it cleared the cookie while the session
                # went on working for whoever held its id.
                stale = csrf_refusal(await session_form(request), who)
                if stale is not None:
                    return stale
                d.sessions.end(request.cookies.get(COOKIE), who.csrf)
                response = RedirectResponse("/ui/login", status_code=303)
                response.delete_cookie(COOKIE, path="/ui")
                return response
            return await guarded(request, go)

        return r
