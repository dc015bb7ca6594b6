"""The dashboard over real HTTP (a real `jobcoord serve`): sessions, scope, pagination, CSRF,
and actions that write the CLI's events."""

from __future__ import annotations

import re
from typing import Any

import httpx

from jobcoord import tokens
from jobcoord.db import Target
from jobcoord.service import Coordinator

from .serve_procs import served, token


def login(url: str, secret: str) -> tuple[httpx.Client, httpx.Response]:
    http = httpx.Client(base_url=url, timeout=30)
    r = http.post("/ui/login", data={"token": secret})
    http.cookies.update(r.cookies)
    return http, r


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_login_sets_an_httponly_samesite_strict_session_and_no_token_in_any_url(
        sqlite_target: Target) -> None:
    secret = token(sqlite_target, "v", "viewer")
    with served(sqlite_target, "--reap-every", "0") as s:
        form = httpx.get(s.url + "/ui/login").text
        assert 'method="post"' in form and 'type="password"' in form
        http, r = login(s.url, secret)
        assert r.status_code == 303 and r.headers["location"] == "/ui/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert secret not in cookie and secret not in r.headers["location"]
        page = http.get("/ui/")
        assert page.status_code == 200 and secret not in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        # Pages link scripts from this server only: htmx is vendored.
        assert '<script src="/ui/static/htmx.min.js"' in page.text
        assert http.get("/ui/static/htmx.min.js").status_code == 200
        http.close()


def test_a_login_posted_from_another_site_is_refused_and_sets_no_session(
        sqlite_target: Target) -> None:
    """Login CSRF: a page elsewhere posting its own token to /ui/login logged the reader
    into that token's session, pushing out theirs. A browser's form from another origin
    (Sec-Fetch-Site, else Origin) is 403 and sets no cookie; this page's own form logs in."""
    secret = token(sqlite_target, "v", "viewer")
    with served(sqlite_target, "--reap-every", "0") as s:
        for headers in ({"Origin": "http://attacker.example"}, {"Origin": "null"},
                        {"Origin": s.url.replace("127.0.0.1", "localhost")},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Sec-Fetch-Site": "cross-site", "Origin": s.url}):
            r = httpx.post(s.url + "/ui/login", data={"token": secret}, headers=headers)
            assert r.status_code == 403, (headers, r.status_code)
            assert "set-cookie" not in r.headers and "another site" in r.text
        for headers in ({"Origin": s.url, "Sec-Fetch-Site": "same-origin"},
                        {"Origin": s.url}, {"Sec-Fetch-Site": "none"}, {}):
            r = httpx.post(s.url + "/ui/login", data={"token": secret}, headers=headers)
            assert r.status_code == 303 and "set-cookie" in r.headers, headers


def test_bidi_controls_in_data_are_shown_as_escapes_on_the_dashboard(
        sqlite_target: Target) -> None:
    """A payload, an error or an artifact name holding U+202E (right-to-left override)
    reordered what the page showed after it, as the CLI's text output never lets it. The
    dashboard writes such characters as visible escapes; line breaks in shown JSON stay."""
    secret = token(sqlite_target, "v", "viewer")
    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("k", {"note": "invoice\u202egnp.exe", "iso": "a\u2066b\u2069"})["job_id"]
        c.heartbeat("w1", readings={"memory_used_pct": 5})
        got = c.claim("w1")
        c.fail(job, "w1", got["lease"]["epoch"], "boom \u202eevil", permanent=True)
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        for path in (f"/ui/jobs/{job}", "/ui/attention", "/ui/jobs"):
            page = http.get(path)
            assert page.status_code == 200, path
            assert not any(ch in page.text for ch in "\u202e\u2066\u2069"), path
        shown = http.get(f"/ui/jobs/{job}").text
        assert "invoice\\u202egnp.exe" in shown and "boom \\u202eevil" in shown
        http.close()


def test_the_attention_page_says_when_it_shows_only_the_newest_and_links_to_all(
        sqlite_target: Target) -> None:
    """Past 200 dead jobs the page listed 200 under "dead (200)" with nothing saying more
    existed, while the overview said 201: the oldest had no retry button anywhere here."""
    from jobcoord.store.report_statements import ATTENTION_SHOWN

    secret = token(sqlite_target, "v", "viewer")
    with Coordinator.open(sqlite_target) as c:
        c.enqueue_many([{"kind": "k"}] * (ATTENTION_SHOWN + 1))
        c.heartbeat("w1", readings={"memory_used_pct": 5})
        got = c.claim_many("w1", ATTENTION_SHOWN + 1)["claimed"]
        c.fail_many([{"job_id": g["job"]["job_id"], "worker_id": "w1",
                      "epoch": g["lease"]["epoch"], "error": "boom", "permanent": True}
                     for g in got])
    assert len(got) == ATTENTION_SHOWN + 1
    oldest = min(g["job"]["job_id"] for g in got)
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        page = http.get("/ui/attention").text
        assert page.count('id="dead-') == ATTENTION_SHOWN
        assert f'id="dead-{oldest}"' not in page
        assert f"the newest {ATTENTION_SHOWN} shown" in page
        assert 'href="/ui/jobs?status=dead"' in page
        assert "None." in page and "/ui/jobs?status=unknown" not in page  # no unknown job
        http.close()


def test_revoked_token_ends_its_dashboard_session_on_the_next_request(
        sqlite_target: Target) -> None:
    secret = token(sqlite_target, "v", "viewer")
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        assert http.get("/ui/jobs").status_code == 200
        with Coordinator.open(sqlite_target) as c:
            tokens.revoke(c.db, "v")
        r = http.get("/ui/jobs")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        http.close()


def test_a_logout_without_the_sessions_csrf_token_is_refused_and_says_so(
        sqlite_target: Target) -> None:
    """A logout with a missing or wrong CSRF token answered as a logout (303 to the login
    page, the cookie cleared) while the session went on working for whoever held its id.
    Refused as every other form without it (403 `csrf_mismatch`), the session and its
    cookie kept; with it, the session ends on the server."""
    secret = token(sqlite_target, "v", "viewer")
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        page = http.get("/ui/jobs")
        sid = http.cookies["jobcoord_session"]
        for form in ({}, {"csrf": "wrong"}):
            r = http.post("/ui/logout", data=form)
            assert r.status_code == 403 and "csrf_mismatch" in r.text, (form, r.status_code)
            assert "set-cookie" not in r.headers
            assert http.get("/ui/jobs").status_code == 200
        r = http.post("/ui/logout", data={"csrf": csrf_of(page.text)})
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        again = httpx.Client(base_url=s.url, timeout=30)
        again.cookies.set("jobcoord_session", sid, path="/ui")
        assert again.get("/ui/jobs").status_code == 303  # the session is over
        # Without a session at all: to the login page, as before.
        r = again.post("/ui/logout", data={})
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        again.close()
        http.close()


def test_jobs_are_paged_by_keyset_and_counts_stop_at_ten_thousand(
        sqlite_target: Target) -> None:
    secret = token(sqlite_target, "o", "operator")
    with Coordinator.open(sqlite_target) as c:
        for start in range(0, 10_050, 2_000):
            c.enqueue_many([{"kind": "summarize", "payload": {"i": i}}
                            for i in range(start, min(start + 2_000, 10_050))])
        c.enqueue("embed", {}, priority=3)
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        first = http.get("/ui/jobs").text
        assert "10,000+ matching" in first
        ids = [int(x) for x in re.findall(r'<a href="/ui/jobs/(\d+)">', first)]
        assert len(ids) == 50 and ids == sorted(ids, reverse=True)
        nxt = re.search(r'href="(/ui/jobs\?[^"]*before=\d+)"', first)
        assert nxt is not None
        second = http.get(nxt.group(1).replace("&amp;", "&")).text
        ids2 = [int(x) for x in re.findall(r'<a href="/ui/jobs/(\d+)">', second)]
        assert len(ids2) == 50 and max(ids2) < min(ids)  # no overlap, no gap
        assert ids2[0] == min(ids) - 1
        embed = http.get("/ui/jobs", params={"kind": "embed", "priority": "P3"}).text
        assert "(1 matching)" in embed
        assert http.get("/ui/jobs", params={"priority": "P9"}).status_code == 400
        # A keyset bound past any job id is refused as bad input, not a database error.
        assert http.get("/ui/jobs", params={"before": "9" * 30}).status_code == 400
        http.close()
    import inspect

    from jobcoord.http.dashboard import reads
    from jobcoord.store import report_statements as reports

    for module in (reads, reports):
        assert "OFFSET" not in inspect.getsource(module).upper().replace("NO OFFSET", "")
    page, _count = reports.job_page(("status", "kind"), True)
    assert "OFFSET" not in page.text("sqlite").upper()
    assert "OFFSET" not in page.text("postgresql").upper()


def test_a_tenant_bound_viewer_sees_only_its_tenant(sqlite_target: Target) -> None:
    secret = token(sqlite_target, "va", "viewer", tenant="alice")
    with Coordinator.open(sqlite_target) as c:
        mine = c.enqueue("summarize", {}, tenant="alice")["job_id"]
        theirs = c.enqueue("summarize", {}, tenant="bob")["job_id"]
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        page = http.get("/ui/jobs", params={"tenant": "bob"}).text
        assert f'/ui/jobs/{mine}"' in page and f'/ui/jobs/{theirs}"' not in page
        assert http.get(f"/ui/jobs/{mine}").status_code == 200
        missing = http.get("/ui/jobs/999999")
        other = http.get(f"/ui/jobs/{theirs}")
        assert other.status_code == missing.status_code == 404
        assert "(1 matching)" in page
        http.close()


def test_actions_need_the_sessions_csrf_token_and_write_the_clis_events(
        sqlite_target: Target) -> None:
    operator = token(sqlite_target, "o", "operator")
    with Coordinator.open(sqlite_target) as c:
        by_ui = c.enqueue("summarize", {"n": 1})["job_id"]
        by_api = c.enqueue("summarize", {"n": 2})["job_id"]
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, operator)
        other, _ = login(s.url, operator)
        theirs = csrf_of(other.get(f"/ui/jobs/{by_ui}/confirm/cancel").text)
        for form in ({}, {"csrf": "forged"}, {"csrf": theirs}):
            r = http.post(f"/ui/jobs/{by_ui}/cancel", data=form)
            assert r.status_code == 403 and "csrf" in r.text.lower()
        with Coordinator.open(sqlite_target) as c:
            assert c.show(by_ui)["job"]["status"] == "waiting"
        mine = csrf_of(http.get(f"/ui/jobs/{by_ui}/confirm/cancel").text)
        r = http.post(f"/ui/jobs/{by_ui}/cancel", data={"csrf": mine})
        assert r.status_code == 303
        http.close()
        other.close()
    with Coordinator.open(sqlite_target) as c:
        c.cancel(by_api)

        def last(job_id: int) -> Any:
            e = c.show(job_id)["events"][-1]
            return (e["from"], e["to"], e["reason"], e["worker_id"], e["detail"])
        assert last(by_ui) == last(by_api)


def test_the_front_page_is_the_dashboard(sqlite_target: Target) -> None:
    with served(sqlite_target, "--reap-every", "0") as s:
        r = httpx.get(s.url + "/")
        assert r.status_code == 307 and r.headers["location"] == "/ui/"
        assert httpx.get(s.url + "/", follow_redirects=True).url.path == "/ui/login"


def test_artifacts_installed_while_the_server_runs_show_on_the_job_page(
        sqlite_target: Target) -> None:
    """`migrate --with artifacts` beside a running server takes effect within 2 s
    (docs/serve.md): the job page showed "No artifacts" for an accepted one until some API
    request happened to look for the feature again."""
    import time

    from jobcoord.db import Database
    from jobcoord.migrate import migrate

    secret = token(sqlite_target, "v", "viewer")
    with Coordinator.open(sqlite_target) as c:
        c.heartbeat("w")
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w")["lease"]["epoch"]
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        assert "report.txt" not in http.get(f"/ui/jobs/{job}").text
        db = Database.open(sqlite_target)
        migrate(db, add={"artifacts"})
        db.close()
        with Coordinator.open(sqlite_target) as c:
            c.put_artifact(job, "w", epoch, "report.txt", b"the report\n")
            c.complete(job, "w", epoch, {})
        deadline = time.monotonic() + 4  # the feature is looked for again every 2 s
        while "report.txt" not in http.get(f"/ui/jobs/{job}").text:
            assert time.monotonic() < deadline, "the job page never showed the artifact"
            time.sleep(0.2)
        http.close()


def test_an_artifact_is_downloaded_verified_and_a_corrupt_one_is_never_served(
        sqlite_target: Target) -> None:
    import glob
    import os

    from jobcoord.db import Database
    from jobcoord.migrate import migrate

    db = Database.open(sqlite_target)
    migrate(db, add={"artifacts"})
    db.close()
    with Coordinator.open(sqlite_target) as c:
        c.heartbeat("w")
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w")["lease"]["epoch"]
        c.put_artifact(job, "w", epoch, "report.txt", b"the report\n")
        c.complete(job, "w", epoch, {})
    secret = token(sqlite_target, "v", "viewer")
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, secret)
        r = http.get(f"{s.url}/ui/jobs/{job}/artifacts/report.txt")
        assert r.status_code == 200 and r.content == b"the report\n"
        [obj] = glob.glob(f"{sqlite_target.sqlite_path}.artifacts/objects/sha256/*/*/*")
        os.chmod(obj, 0o600)
        with open(obj, "r+b") as f:
            f.write(b"X")
        r = http.get(f"{s.url}/ui/jobs/{job}/artifacts/report.txt")
        assert r.status_code != 200 and b"the report" not in r.content
        assert b"Xhe report" not in r.content


def _unknown_job(target: Target) -> int:
    """A job in `unknown`: its attempt marked its effect, then failed."""
    with Coordinator.open(target) as c:
        job = c.enqueue("k", {})["job_id"]
        c.heartbeat("w", readings={"memory_used_pct": 5})
        epoch = c.claim("w")["lease"]["epoch"]
        c.mark_effect(job, "w", epoch)
        assert c.fail(job, "w", epoch, "x")["status"] == "unknown"
        return int(job)


def test_a_form_field_or_query_parameter_given_twice_is_400_and_changes_nothing(
        sqlite_target: Target) -> None:
    """Of `as=dead&as=succeeded` the dashboard took the last and reconciled the job (an
    action nobody can undo) as succeeded; of `?kind=zzz&kind=k` it filtered on `k`; a
    NUL in a filter was taken. The API refuses all three with 400; so does the dashboard."""
    operator = token(sqlite_target, "o", "operator")
    job = _unknown_job(sqlite_target)
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, operator)
        mine = csrf_of(http.get(f"/ui/jobs/{job}/confirm/reconcile").text)
        r = http.post(f"/ui/jobs/{job}/reconcile",
                      headers={"content-type": "application/x-www-form-urlencoded"},
                      content=f"csrf={mine}&as=dead&as=succeeded&reason=checked")
        assert r.status_code == 400 and "as&#39; is given more than once" in r.text, r.text
        for query in ("kind=zzz&kind=k", "kind=%00"):
            r = http.get(f"/ui/jobs?{query}")
            assert r.status_code == 400, (query, r.status_code)
        http.close()
    with Coordinator.open(sqlite_target) as c:
        assert c.show(job)["job"]["status"] == "unknown"


def test_a_role_refusal_says_an_operator_token(sqlite_target: Target) -> None:
    operator = token(sqlite_target, "o", "operator")
    with served(sqlite_target, "--reap-every", "0") as s:
        r = httpx.post(s.url + "/v1/jobs/1/renew", json={"epoch": 1},
                       headers={"Authorization": f"Bearer {operator}"})
    assert r.status_code == 403
    assert r.json()["error"]["message"].startswith("an operator token may not"), r.text


def test_a_job_id_or_cursor_that_is_no_ascii_number_in_range_is_400_never_500(
        sqlite_target: Target) -> None:
    """`before=²` (a digit to str.isdigit, not to int) and a job id or cursor of 5,000
    digits (past int()'s limit) were 500s on the pages, also on an action with a valid CSRF
    token; `before=٣` and a full-width １ were read as cursors 3 and 1. The API answers 400
    for all of them, and so does the dashboard."""
    operator = token(sqlite_target, "o", "operator")
    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("k", {})["job_id"]
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, operator)
        big = "9" * 5000
        for path in ("/ui/jobs?before=%C2%B2", "/ui/jobs?before=%D9%A3",
                     "/ui/jobs?before=%EF%BC%91", f"/ui/jobs?before={big}",
                     f"/ui/jobs/{big}", f"/ui/jobs/{big}/live", "/ui/jobs/%C2%B2"):
            r = http.get(path)
            assert r.status_code == 400, (path, r.status_code, r.text[:300])
        mine = csrf_of(http.get(f"/ui/jobs/{job}/confirm/cancel").text)
        r = http.post(f"/ui/jobs/{big}/cancel", data={"csrf": mine})
        assert r.status_code == 400, (r.status_code, r.text[:300])
        http.close()
    with Coordinator.open(sqlite_target) as c:
        assert c.show(job)["job"]["status"] == "waiting"


def test_a_reconcile_result_the_cli_refuses_is_refused_on_the_dashboard_too(
        sqlite_target: Target) -> None:
    """The form's result was parsed leniently and handed over as a value: duplicate keys
    kept the last (`{"a":1,"a":2}` reconciled with `{"a": 2}`). It goes to the Coordinator as
    JSON text, checked as the CLI's `--result` is."""
    operator = token(sqlite_target, "o", "operator")
    job = _unknown_job(sqlite_target)
    with served(sqlite_target, "--reap-every", "0") as s:
        http, _ = login(s.url, operator)
        mine = csrf_of(http.get(f"/ui/jobs/{job}/confirm/reconcile").text)
        for bad in ('{"a":1,"a":2}', '{"a": NaN}', "[" * 100 + "]" * 100, "{"):
            r = http.post(f"/ui/jobs/{job}/reconcile",
                          data={"csrf": mine, "as": "succeeded", "reason": "checked",
                                "result": bad})
            assert r.status_code == 400, (bad, r.status_code, r.text[:300])
        r = http.post(f"/ui/jobs/{job}/reconcile",
                      data={"csrf": mine, "as": "succeeded", "reason": "checked",
                            "result": '{"a": 1}'})
        assert r.status_code in (200, 303), r.text[:300]
        http.close()
    with Coordinator.open(sqlite_target) as c:
        shown = c.show(job)["job"]
        assert (shown["status"], shown["result"]) == ("succeeded", {"a": 1})
