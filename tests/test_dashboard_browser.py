"""The dashboard in a real browser: Playwright driving the system's Chromium (Debian's
`chromium` package; the pip package never downloads one here) against a real
`jobcoord serve` on 127.0.0.1.

Screenshots go to a temporary directory (kept by CI as artifacts); with
DASHBOARD_SCREENSHOTS=DIR they go to DIR instead (how docs/screenshots/ is made)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator

from .serve_procs import served, token

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="needs Debian's chromium (.ci/run installs it)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def shots(tmp_path: Any) -> Any:
    directory = os.environ.get("DASHBOARD_SCREENSHOTS") or str(tmp_path / "screenshots")
    os.makedirs(directory, exist_ok=True)

    def take(page: Any, name: str, **kw: Any) -> None:
        page.screenshot(path=os.path.join(directory, f"{name}.png"), **kw)
    return take


def login(browser: Any, url: str, secret: str, *, mobile: bool = False) -> Any:
    if mobile:
        context = browser.new_context(viewport={"width": 390, "height": 844},
                                      device_scale_factor=2, is_mobile=True)
    else:
        context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(url + "/ui/login")
    page.fill("#token", secret)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/ui/$"))
    return page


def make_unknown(target: Target) -> int:
    """A job whose lease expired after its external effect started: `unknown`."""
    with Coordinator.open(target) as c:
        job_id = c.enqueue("charge-card", {"order": 7}, key="order-7")["job_id"]
        c.heartbeat("laptop", roles=[], readings={"on_battery": True, "user_idle_s": 5})
        got = c.claim("laptop", lease_s=1)
        assert got["job"] is not None and got["job"]["job_id"] == job_id
        c.mark_effect(job_id, "laptop", got["lease"]["epoch"])
        deadline = time.monotonic() + 20
        while c.show(job_id)["job"]["status"] != "unknown":
            assert time.monotonic() < deadline
            c.reap()
            time.sleep(0.1)
        return job_id


def test_wrong_token_shows_an_error_not_a_stack_trace(browser: Any, sqlite_target: Target,
                                                      shots: Any) -> None:
    worker = token(sqlite_target, "w", "worker", worker="w1")
    with served(sqlite_target, "--reap-every", "0") as s:
        page = browser.new_page()
        for secret, words in (("jct_not-a-real-token", "unknown or revoked"),
                              (worker, "cannot open the dashboard")):
            page.goto(s.url + "/ui/login")
            page.fill("#token", secret)
            page.click("button[type=submit]")
            error = page.locator("#login-error")
            assert words in error.inner_text()
            body = page.content()
            assert "Traceback" not in body and "File \"" not in body
        shots(page, "login-error")
        # Not logged in: every page leads to the login form, never data.
        page.goto(s.url + "/ui/jobs")
        assert page.url.endswith("/ui/login")
        page.close()


def test_a_page_on_another_site_cannot_log_the_reader_into_its_session(
        browser: Any, sqlite_target: Target) -> None:
    """Login CSRF, as a reader meets it: logged in as an operator, they open a page on
    another site whose form posts that site's viewer token to the dashboard's login. Their
    session stays theirs (it was swapped for the viewer's)."""
    import http.server
    import threading

    operator = token(sqlite_target, "ops", "operator")
    planted = token(sqlite_target, "planted", "viewer")
    with served(sqlite_target, "--reap-every", "0") as s:
        attack = (f'<form id="f" method="post" action="{s.url}/ui/login">'
                  f'<input name="token" value="{planted}"></form>'
                  '<script>document.getElementById("f").submit()</script>').encode()

        class Attacker(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(attack)))
                self.end_headers()
                self.wfile.write(attack)

            def log_message(self, *args: Any) -> None:
                pass

        site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
        threading.Thread(target=site.serve_forever, daemon=True).start()
        try:
            page = login(browser, s.url, operator)
            assert "ops · operator" in page.locator(".role").inner_text()
            with page.expect_response(lambda r: r.url == s.url + "/ui/login") as answer:
                page.goto(f"http://localhost:{site.server_address[1]}/")  # another site
            assert answer.value.status == 403
            page.goto(s.url + "/ui/")
            assert "ops · operator" in page.locator(".role").inner_text()
            page.context.close()
        finally:
            site.shutdown()
            site.server_close()


def test_viewer_sees_no_actions_and_a_forged_action_post_is_refused(
        browser: Any, sqlite_target: Target, shots: Any) -> None:
    viewer = token(sqlite_target, "v", "viewer")
    unknown = make_unknown(sqlite_target)
    with Coordinator.open(sqlite_target) as c:
        waiting = c.enqueue("summarize", {"doc": 1})["job_id"]
    with served(sqlite_target, "--reap-every", "0") as s:
        page = login(browser, s.url, viewer)
        page.goto(f"{s.url}/ui/jobs/{waiting}")
        assert page.locator("#timeline").is_visible()
        assert page.locator(".actions").count() == 0
        assert page.locator("a.act-cancel").count() == 0
        page.goto(f"{s.url}/ui/attention")
        assert page.locator(f"#unknown-{unknown}").is_visible()
        assert page.locator("form[action*=reconcile]").count() == 0
        shots(page, "viewer-attention")
        # The viewer's own session, its own CSRF token (from the logout form): the server
        # still refuses, whatever the page offered.
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        for path, form in ((f"/ui/jobs/{waiting}/cancel", {"csrf": csrf}),
                           (f"/ui/jobs/{unknown}/reconcile",
                            {"csrf": csrf, "as": "succeeded", "reason": "forged"})):
            got = page.request.post(s.url + path, form=form, max_redirects=0)
            assert got.status == 403, got.text()
        page.goto(f"{s.url}/ui/jobs/{waiting}/confirm/cancel")
        assert "may not act" in page.locator("#error-message").inner_text()
        page.context.close()
    with Coordinator.open(sqlite_target) as c:
        assert c.show(waiting)["job"]["status"] == "waiting"
        assert c.show(unknown)["job"]["status"] == "unknown"


def test_operator_sees_a_submitted_job_live_cancels_and_reconciles(
        browser: Any, sqlite_target: Target, shots: Any) -> None:
    operator = token(sqlite_target, "ops", "operator")
    submitter = token(sqlite_target, "ci", "submitter")
    unknown = make_unknown(sqlite_target)
    with Coordinator.open(sqlite_target) as c:
        for i in range(3):
            c.enqueue("summarize", {"doc": i}, priority=2)
        c.enqueue("embed", {"doc": 1})
    with served(sqlite_target, "--reap-every", "0") as s:
        page = login(browser, s.url, operator)
        before = int(page.locator("#count-waiting").inner_text().replace(",", ""))
        # Submitted through the API: the overview shows it without a reload.
        r = httpx.post(s.url + "/v1/jobs", json={"kind": "transcribe", "payload": {"f": 1}},
                       headers={"Authorization": f"Bearer {submitter}"})
        assert r.status_code == 201, r.text
        new_id = r.json()["job_id"]
        page.wait_for_function(
            "n => document.querySelector('#count-waiting').textContent.trim() === String(n)",
            arg=before + 1, timeout=15_000)
        assert page.locator("#by-kind", has_text="transcribe").is_visible()
        assert page.locator(".gate", has_text="laptop").is_visible()
        shots(page, "overview", full_page=True)

        # The jobs list, then the job page with its timeline.
        page.click("nav >> text=Jobs")
        page.click(f"#jobs >> text='{new_id}'")
        timeline = page.locator("#timeline")
        assert "submitted" in timeline.inner_text() or "waiting" in timeline.inner_text()
        assert page.locator("#explain").inner_text()
        shots(page, "job", full_page=True)

        # Cancel it: confirmation first, then the job page says cancelled.
        page.click("a.act-cancel")
        assert "Cancel job" in page.locator("h1").inner_text()
        page.click("#confirm")
        page.wait_for_url(re.compile(rf".*/ui/jobs/{new_id}\?done=cancel.*"))
        assert "cancelled" in page.locator("h1 .status").inner_text()
        assert "cancelled" in page.locator("#timeline").inner_text()

        # Reconcile the unknown job from the needs-attention view.
        page.goto(s.url + "/ui/attention")
        row = page.locator(f"#unknown-{unknown}")
        row.locator("select[name=as]").select_option("succeeded")
        row.locator("input[name=reason]").fill("the card was charged (bank statement)")
        row.locator("button").click()
        assert "Reconcile job" in page.locator("h1").inner_text()
        page.click("#confirm")  # no result: the rule's refusal is shown with its reason
        assert "needs" in page.locator("#refusal").inner_text()
        page.goto(f"{s.url}/ui/jobs/{unknown}/confirm/reconcile")
        page.check("input[name=as][value=succeeded]")
        page.fill("#reason", "the card was charged (bank statement)")
        page.fill("#result", '{"charged": true}')
        page.click("#confirm")
        page.wait_for_url(re.compile(rf".*/ui/jobs/{unknown}\?done=reconcile.*"))
        assert "succeeded" in page.locator("h1 .status").inner_text()

        # A refusal is shown with its reason: cancelling a finished job.
        page.goto(f"{s.url}/ui/jobs/{new_id}/confirm/cancel")
        page.click("#confirm")
        assert "job_finished" in page.locator("#refusal").inner_text()
        shots(page, "refusal")

        page.goto(s.url + "/ui/workers")
        assert page.locator("#worker-laptop").is_visible()
        shots(page, "workers", full_page=True)
        page.context.close()

        phone = login(browser, s.url, operator, mobile=True)
        shots(phone, "overview-phone", full_page=True)
        phone.context.close()
    with Coordinator.open(sqlite_target) as c:
        assert c.show(new_id)["job"]["status"] == "cancelled"
        events = c.show(unknown)["events"]
        assert events[-1]["reason"] == "reconciled" or events[-1]["to"] == "succeeded"
