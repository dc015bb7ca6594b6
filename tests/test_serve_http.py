"""`jobcoord serve` itself: submission durability and idempotency over HTTP, the long-poll
claim (woken by a commit through this server at once, by another process within its poll,
204 at the end, no thread per waiter), bad input on every endpoint, the binding rules, and
Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.serve_procs import Served, db_args, jobcoord_argv, served, token, tokens_for, wait_for


def test_submit_is_201_after_commit_and_idempotency_key_returns_the_same_job(
        target: Target) -> None:
    secret = token(target, "ci", "submitter", tenant="alice")
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        first = http.post("/v1/jobs", json={"kind": "summarize", "payload": {"doc": 1}},
                          headers={"Idempotency-Key": "doc-42"})
        assert first.status_code == 201
        job = first.json()["job_id"]
        assert first.headers["Location"] == f"/v1/jobs/{job}"
        # Committed before the answer: another connection to the database sees it now.
        with Coordinator.open(target) as c:
            assert c.show(job, tenant="alice")["job"]["status"] == "waiting"
        again = http.post("/v1/jobs", json={"kind": "summarize", "payload": {"doc": 1}},
                          headers={"Idempotency-Key": "doc-42"})
        assert again.status_code == 200 and again.json() == {"job_id": job, "created": False}
        other = http.post("/v1/jobs", json={"kind": "summarize", "payload": {"doc": 2}},
                          headers={"Idempotency-Key": "doc-42"})
        assert other.status_code == 409
        assert other.json()["error"]["code"] == "idempotency_conflict"


def test_curl_without_content_type_is_accepted(target: Target) -> None:
    secret = token(target, "ci", "submitter", tenant="alice")
    with served(target, "--reap-every", "0") as s:
        done = subprocess.run(
            ["curl", "-s", "-o", "-", "-w", "%{http_code}", "-H",
             f"Authorization: Bearer {secret}", "-H", "Idempotency-Key: doc-42", "-d",
             '{"kind":"summarize","payload":{}}', f"{s.url}/v1/jobs"],
            capture_output=True, check=False)
        assert done.stdout.decode().endswith("201"), done.stdout


def _claim_in_thread(client: httpx.Client, wait: float, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        t0 = time.monotonic()
        resp = client.post("/v1/claims", json={"wait": wait})
        out.update(status=resp.status_code, body=resp.content and resp.json(),
                   at=time.monotonic(), took=time.monotonic() - t0)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_long_poll_answers_at_once_for_a_job_submitted_through_the_server(
        target: Target) -> None:
    sub = token(target, "ci", "submitter")
    wa = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0", "--poll", "1") as s, s.client(sub) as http, \
            s.client(wa) as worker:
        worker.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 10}})
        out: dict[str, Any] = {}
        thread = _claim_in_thread(worker, 20, out)
        time.sleep(0.5)  # the claim is waiting
        assert not out
        submitted = time.monotonic()
        job = http.post("/v1/jobs", json={"kind": "k"}).json()["job_id"]
        thread.join(20)
        assert out["status"] == 200 and out["body"]["job"]["job_id"] == job
        # Woken by the commit, not by the 1 s poll.
        assert out["at"] - submitted < 0.5, out["at"] - submitted


def test_long_poll_sees_another_process_commit_within_its_poll_and_ends_with_204(
        target: Target) -> None:
    wa = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0", "--poll", "0.2") as s, s.client(wa) as worker:
        worker.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 10}})
        t0 = time.monotonic()
        empty = worker.post("/v1/claims", json={"wait": 1})
        assert empty.status_code == 204 and empty.content == b""
        assert 0.9 <= time.monotonic() - t0 < 5
        out: dict[str, Any] = {}
        thread = _claim_in_thread(worker, 20, out)
        time.sleep(0.3)
        with Coordinator.open(target) as c:  # another process's commit (the CLI's path)
            committed = time.monotonic()
            job = c.enqueue("k", {})["job_id"]
        thread.join(20)
        assert out["status"] == 200 and out["body"]["job"]["job_id"] == job
        assert out["at"] - committed < 0.2 * 2 + 1.0


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_two_hundred_idle_long_polls_do_not_need_two_hundred_threads(sqlite_target: Target
                                                                      ) -> None:
    # The server's threading does not depend on the database: SQLite only.
    target = sqlite_target
    secrets = tokens_for(target, [(f"w{i}", "worker", None, f"w{i}") for i in range(200)])
    with served(target, "--reap-every", "0", "--threads", "8") as s:
        assert s.proc is not None
        clients = [s.client(secret) for secret in secrets]
        for client in clients:
            client.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 10}})
        outs: list[dict[str, Any]] = [{} for _ in clients]
        threads = [_claim_in_thread(client, 4, out) for client, out in zip(clients, outs,
                                                                              strict=True)]
        time.sleep(2)
        assert not any(outs)  # all 200 still waiting
        assert _threads(s.proc.pid) < 30
        for thread in threads:
            thread.join(30)
        assert all(out["status"] == 204 for out in outs)
        for client in clients:
            client.close()


# Per endpoint: a valid body, the field to make NaN, the field that holds free JSON (or None),
# and a body with absurd values.
ENDPOINTS: dict[str, tuple[str, dict[str, Any], str, str | None, dict[str, Any]]] = {
    "submit": ("submitter", {"kind": "k"}, "delay_s", "payload",
               {"kind": "k", "priority": 99, "max_attempts": 0}),
    "heartbeat": ("worker", {"roles": ["r"]}, "readings", "readings",
                  {"readings": {"memory_used_pct": 1e300}}),
    "claims": ("worker", {"wait": 0}, "wait", None, {"wait": 999, "lease_s": -1}),
    "renew": ("worker", {"epoch": 1}, "lease_s", None, {"epoch": 1, "lease_s": -1}),
    "complete": ("worker", {"epoch": 1, "result": {}}, "epoch", "result", {"epoch": -5}),
    "fail": ("worker", {"epoch": 1, "error": "e"}, "epoch", None,
             {"epoch": 2**40, "error": "e"}),
    "effect": ("worker", {"epoch": 1}, "epoch", None, {"epoch": -1}),
    "checkpoint": ("worker", {"epoch": 1, "name": "n"}, "data", "data",
                   {"epoch": 1, "name": "a b/../../etc"}),
    "reconcile": ("operator", {"as": "dead", "reason": "r"}, "result", "result",
                  {"as": "lost", "reason": "r"}),
    "prune": ("operator", {"older_than": "30d", "dry_run": True}, "older_than", None,
              {"older_than": "-5d"}),
}


def _bad_bodies(base: dict[str, Any], nan_field: str, free: str | None,
                absurd: dict[str, Any]) -> list[tuple[str, bytes]]:
    first = next(iter(base))
    rest = {k: val for k, val in base.items() if k != nan_field}
    tail = json.dumps(rest)[1:]
    glue = ", " if rest else ""
    nan = "{" + f'"{nan_field}": ' + ('{"memory_used_pct": NaN}' if nan_field == "readings"
                                      else "NaN") + glue + tail
    wrong = dict(base, **{first: 5 if isinstance(base[first], list) else [1]})
    bodies = [
        ("invalid JSON", b'{"kind": '),
        ("not an object", b"[1, 2]"),
        ("empty object where fields are required" if first != "roles" else "null", b"null"),
        ("NaN", nan.encode()),
        ("Infinity", nan.replace("NaN", "Infinity").encode()),
        ("wrong type", json.dumps(wrong).encode()),
        ("unknown field", json.dumps(dict(base, surprise=1)).encode()),
        ("tenant in the body", json.dumps(dict(base, tenant="bob")).encode()),
        ("duplicate key", ("{" + f'"{first}": {json.dumps(base[first])}, '
                           + json.dumps(base)[1:]).encode()),
        ("absurd numbers", json.dumps(absurd).encode()),
    ]
    if free is not None:
        deep = '{"a": ' * 200 + "1" + "}" * 200
        bodies.append(("deep nesting", ("{" + f'"{free}": {deep}, '
                                        + json.dumps({k: val for k, val in base.items()
                                                      if k != free})[1:]).encode()))
    return bodies


def _chunks(size: int) -> Iterator[bytes]:
    """A JSON body of about `size` bytes sent by a generator: httpx sends it chunked, with no
    Content-Length to refuse it by."""
    yield b'{"kind": "'
    for _ in range(size >> 16):
        yield b"x" * (1 << 16)
    yield b'"}'


def test_bad_input_on_every_endpoint_is_4xx_json_and_changes_nothing(target: Target) -> None:
    secrets = {"submitter": token(target, "sub", "submitter"),
               "worker": token(target, "wa", "worker", worker="wa"),
               "operator": token(target, "op", "operator")}
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings={"memory_used_pct": 10})
        job = c.enqueue("k", {})["job_id"]
        c.claim("wa", lease_s=300)
        before = dump(c)
        paths = {"submit": "/v1/jobs", "heartbeat": "/v1/heartbeat", "claims": "/v1/claims",
                 "reconcile": f"/v1/jobs/{job}/reconcile", "prune": "/v1/prune"}
        failures = []
        with served(target, "--reap-every", "0") as s:
            clients = {role: s.client(secret) for role, secret in secrets.items()}
            for name, (role, base, nan_field, free, absurd) in ENDPOINTS.items():
                path = paths.get(name, f"/v1/jobs/{job}/{name}")
                for what, body in _bad_bodies(base, nan_field, free, absurd):
                    if name == "heartbeat" and what == "null":
                        continue  # every heartbeat field is optional
                    resp = clients[role].post(path, content=body)
                    ok = 400 <= resp.status_code < 500 and set(resp.json()) == {"error"}
                    if not ok or resp.status_code == 404:
                        failures.append(f"{name} {what}: {resp.status_code} {resp.text[:150]}")
                huge = clients[role].post(path, content=b'{"kind": "' + b"x" * (3 << 20)
                                          + b'"}')
                if huge.status_code != 413 or huge.json()["error"]["code"] != "body_too_large":
                    failures.append(f"{name} huge: {huge.status_code}")
                # The same without Content-Length (chunked): counted as the bytes arrive.
                chunked = clients[role].post(path, content=_chunks(3 << 20))
                if chunked.status_code != 413 \
                        or chunked.json()["error"]["code"] != "body_too_large":
                    failures.append(f"{name} huge chunked: {chunked.status_code} "
                                    f"{chunked.text[:150]}")
            # Path parameters: not a number, negative, past the id range, traversal.
            for bad in ("abc", "-1", "0", str(2**70), "..%2F..%2Fetc", "1%00"):
                resp = clients["submitter"].get(f"/v1/jobs/{bad}")
                if resp.status_code not in (400, 404) or "error" not in resp.json():
                    failures.append(f"/v1/jobs/{bad}: {resp.status_code}")
            # A query parameter given twice: which one counts is nobody's guess.
            for role, method, path in (("submitter", "GET", "/v1/jobs?limit=1&limit=500"),
                                       ("worker", "POST", f"/v1/jobs/{job}/renew?x=1&x=2")):
                resp = clients[role].request(method, path, json={"epoch": 1})
                if resp.status_code != 400 or resp.json()["error"]["code"] != "invalid_input":
                    failures.append(f"{method} {path}: {resp.status_code} {resp.text[:150]}")
            for client in clients.values():
                client.close()
        assert not failures, "\n".join(failures)
        assert dump(c) == before


def test_a_header_given_twice_or_a_body_cut_short_is_400_saying_so_and_changes_nothing(
        target: Target) -> None:
    """Two Authorization headers were judged by the first and two Idempotency-Keys keyed the
    job by the first: which one a client meant is nobody's guess, so neither counts (400);
    two Content-Types as well (docs/serve.md), also where the body is JSON whatever it says.
    A body that is not JSON said only "26: JSON decode error"."""
    secret = token(target, "sub", "submitter")
    with Coordinator.open(target) as c:
        before = dump(c)
        with served(target, "--reap-every", "0") as s, httpx.Client(base_url=s.url) as h:
            good, bad = f"Bearer {secret}", "Bearer jct_not-a-token"
            job = b'{"kind": "k", "payload": {}}'
            for headers in ([("Authorization", good), ("Authorization", bad)],
                            [("Authorization", bad), ("Authorization", good)],
                            [("Authorization", good), ("Idempotency-Key", "a"),
                             ("Idempotency-Key", "b")],
                            # The JSON routes read every body as JSON, whatever its label:
                            # two labels were put back as one, and the job was made (201).
                            [("Authorization", good), ("Content-Type", "application/json"),
                             ("Content-Type", "text/plain")],
                            [("Authorization", good), ("Content-Type", "text/plain"),
                             ("Content-Type", "application/json")]):
                resp = h.post("/v1/jobs", content=job, headers=headers)
                assert resp.status_code == 400, (headers[-1], resp.text)
                error = resp.json()["error"]
                assert error["code"] == "invalid_input"
                assert headers[-1][0] in error["message"] and "more than once" in \
                    error["message"], error
            cut = h.post("/v1/jobs", content=b'{"kind": "k", "payload": {',
                         headers={"Authorization": good})
            assert cut.status_code == 400, cut.text
            assert "not valid JSON" in cut.json()["error"]["message"], cut.text
        assert dump(c) == before


def test_an_answer_refused_before_the_route_is_rendered_as_every_other_error(
        target: Target) -> None:
    """A body over the limit is refused below the framework (413): its JSON was written
    with spaces, every other answer's without."""
    secret = token(target, "sub", "submitter")
    with served(target, "--reap-every", "0") as s, httpx.Client(base_url=s.url) as h:
        auth = {"Authorization": f"Bearer {secret}"}
        big = h.post("/v1/jobs", content=b"x" * (3 << 20), headers=auth)
        small = h.get("/v1/jobs/999999", headers=auth)
        for resp in (big, small):
            assert resp.content == json.dumps(resp.json(), ensure_ascii=False,
                                              separators=(",", ":")).encode(), resp.content
        assert (big.status_code, small.status_code) == (413, 404)


def test_serve_binds_loopback_and_refuses_plain_http_elsewhere(target: Target) -> None:
    argv = [*jobcoord_argv(), *db_args(target), "serve", "--json"]
    refused = subprocess.run([*argv, "--host", "0.0.0.0"], capture_output=True, timeout=60,
                             check=False)
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["error"]["code"] == "invalid_input"
    half = subprocess.run([*argv, "--tls-cert", __file__], capture_output=True, timeout=60,
                          check=False)
    assert half.returncode == 2
    # A terminal's Ctrl-C: SIGINT at its default, even when this suite runs in the
    # background (where the shell starts it, and so its children, with SIGINT ignored).
    proc = subprocess.Popen([*argv, "--host", "0.0.0.0", "--port", "0", "--insecure-http"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = json.loads(proc.stdout.readline())
        assert line["event"] == "listening"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert b"unencrypted" in err
        assert json.loads(out.decode().splitlines()[-1])["event"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
@pytest.mark.parametrize("option", ["--reap-every", "--poll", "--upload-idle"])
def test_serve_refuses_a_number_option_that_is_not_finite_before_listening(
        sqlite_target: Target, option: str, value: str) -> None:
    """NaN passes every range check (it compares false with everything): `--upload-idle nan`
    served nothing (each connection's timer raised), `--reap-every nan` never reaped nor
    ticked schedules and wrote a bare NaN into its JSON line, `--poll nan` spun a core.
    Refused as usage, exit 2, nothing listening; the worker's `--wait` alike."""
    argv = [*jobcoord_argv(), *db_args(sqlite_target), "serve", "--json", "--port", "0",
            option, value]
    refused = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert refused.returncode == 2, refused
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "usage_error" and option in error["message"], error
    assert b"listening" not in refused.stdout
    token_file = sqlite_target.sqlite_path + ".token"
    with open(token_file, "w", encoding="utf-8") as f:
        f.write("jc_" + "a" * 43 + "\n")
    worker = subprocess.run([*jobcoord_argv(), "worker", "--server", "http://127.0.0.1:9",
                             "--token-file", token_file, "--wait", value, "--json"],
                            capture_output=True, timeout=60, check=False)
    assert worker.returncode == 2, worker
    error = json.loads(worker.stdout)["error"]
    assert error["code"] == "usage_error" and "--wait" in error["message"], error


def test_the_listening_url_of_an_ipv6_address_is_a_url_a_worker_can_use(
        sqlite_target: Target) -> None:
    """`serve --host ::1` said `http://::1:PORT`, which is no URL (`--server` refused it):
    the address is written in brackets."""
    import socket

    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this machine")
    with served(sqlite_target, "--host", "::1", "--reap-every", "0") as s:
        assert s.url.startswith("http://[::1]:"), s.url
        assert httpx.get(f"{s.url}/healthz", timeout=10).status_code == 200
        from jobcoord.http.client import server_base

        assert server_base(s.url) == s.url


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_stops_serve_gracefully_says_stopped_and_exits_0(sqlite_target: Target,
                                                                 sig: int) -> None:
    """SIGHUP (the terminal it was started in closed) killed it outright, exit 129, with no
    `stopped`: it stops as on SIGTERM."""
    s = Served(sqlite_target, "--reap-every", "0").start()
    try:
        assert s.proc is not None
        with s.client() as http:
            assert http.get("/healthz").status_code == 200
        s.signal(sig)
        out, _ = s.proc.communicate(timeout=30)
        assert s.proc.returncode == 0
        assert json.loads(out.decode().splitlines()[-1])["event"] == "stopped"
    finally:
        s.stop()


_STOPS = pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130),
                                                  (signal.SIGHUP, 0)],
                                 ids=["SIGTERM", "ctrl-c", "SIGHUP"])


def _signalled_until_gone(s: Served, sig: int, code: int, every_s: float) -> None:
    """Stop serve with `sig`, then send it again every `every_s` until the process is gone:
    it ends as the first signal asked (`code`, `stopped` last) with no traceback."""
    import time

    s.start()
    try:
        assert s.proc is not None
        with s.client() as http:
            assert http.get("/healthz").status_code == 200
        s.proc.send_signal(sig)
        deadline = time.monotonic() + 30
        while s.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(every_s)
            with contextlib.suppress(ProcessLookupError):
                s.proc.send_signal(sig)
        out, err = s.proc.communicate(timeout=30)
        assert s.proc.returncode == code, err.decode()[-2000:]
        assert json.loads(out.decode().splitlines()[-1])["event"] == "stopped"
        assert b"Traceback" not in err, err.decode()[-2000:]
    finally:
        s.stop()


@_STOPS
def test_signals_after_the_first_never_change_how_serve_ends(sqlite_target: Target, sig: int,
                                                             code: int) -> None:
    """A second SIGTERM as serve ended (a service manager repeating its stop) killed it,
    exit 143 after its `stopped`: the clean stop reported as a kill. After the first, more
    signals change nothing: the first one's exit code, `stopped` last, no traceback."""
    _signalled_until_gone(Served(sqlite_target, "--reap-every", "0"), sig, code, 0.003)


@_STOPS
def test_signals_while_the_stopped_loop_ends_change_nothing(sqlite_target: Target, sig: int,
                                                           code: int) -> None:
    """After the server stopped, its event loop still runs a while (tasks ended, threads
    joined) with the signal handlers put back. A SIGTERM then ran a handler that raised, in a
    loop callback: `Exception in callback` and a traceback after a clean stop. Signals kept
    coming while the loop idles there a second (a fault point) change nothing."""
    _signalled_until_gone(Served(sqlite_target, "--reap-every", "0",
                                 env={"JOBCOORD_FAULT": "http.served:sleep=1"}),
                          sig, code, 0.02)


def test_sigterm_answers_waiting_long_polls_204_at_once_with_no_traceback(
        sqlite_target: Target) -> None:
    """Long-polls waiting when serve is stopped get their "nothing" answer (204) as the stop
    begins; they were cut after the 5 s grace with a plain-text 500 each, and a traceback
    per poll in the log."""
    import threading
    import time

    wa = token(sqlite_target, "wa", "worker", worker="wa")
    s = Served(sqlite_target, "--reap-every", "0").start()
    answers: list[tuple[int, str, float]] = []

    def poll() -> None:
        with httpx.Client(base_url=s.url, timeout=60,
                          headers={"Authorization": f"Bearer {wa}"}) as http:
            got = http.post("/v1/claims", json={"kinds": ["nothing"], "wait": 30})
            answers.append((got.status_code, got.text, time.monotonic()))

    try:
        assert s.proc is not None
        with s.client(wa) as http:
            assert http.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 5}}
                             ).status_code == 200
        polls = [threading.Thread(target=poll) for _ in range(5)]
        for t in polls:
            t.start()
        time.sleep(1.0)
        stopped_at = time.monotonic()
        s.signal(signal.SIGTERM)
        for t in polls:
            t.join(30)
        _out, err = s.proc.communicate(timeout=30)
    finally:
        s.stop()
    assert s.proc.returncode == 0
    assert [a[0] for a in answers] == [204] * 5, answers
    assert max(a[2] for a in answers) - stopped_at < 2.0, answers
    assert b"Traceback" not in err, err.decode()[-3000:]


def test_sigterm_answers_a_request_whose_body_is_still_arriving_503_with_no_traceback(
        sqlite_target: Target) -> None:
    """A submission whose body was still arriving (a slow client, a large result) when serve
    was stopped was cut after the 5 s grace: a plain-text 500 and a traceback in the log.
    It is answered 503 `server_stopping` (the JSON error: send it again) as the stop
    begins, and nothing was submitted."""
    import socket
    import time

    sub = token(sqlite_target, "sub", "submitter", tenant="t")
    s = Served(sqlite_target, "--reap-every", "0").start()
    try:
        assert s.proc is not None
        port = int(s.url.rsplit(":", 1)[1])
        conns = []
        for _ in range(3):
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            conn.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nAuthorization: Bearer " + sub.encode()
                         + b"\r\nContent-Length: 100\r\n\r\n{")
            conns.append(conn)
        time.sleep(1.0)
        stopped_at = time.monotonic()
        s.signal(signal.SIGTERM)
        answers = []
        for conn in conns:
            got = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                got += chunk
            answers.append((got, time.monotonic() - stopped_at))
            conn.close()
        _out, err = s.proc.communicate(timeout=30)
    finally:
        s.stop()
    assert s.proc.returncode == 0
    for got, after in answers:
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), got
        assert json.loads(body)["error"]["code"] == "server_stopping", got
        assert after < 2.0, answers
    assert b"Traceback" not in err, err.decode()[-3000:]
    with Coordinator.open(sqlite_target) as c:
        assert c.jobs(tenant="t")["jobs"] == []


def test_every_500_answer_is_logged_as_an_internal_error(sqlite_target: Target) -> None:
    """A database error the store cannot name (here a trigger of someone's refusing every
    new job; a table or column gone is named, `table_missing` / `column_missing`) is a 500;
    it was answered with no `internal_error` event, so an operator alerting on those never
    heard of it. Every 500 is logged: its code and message, never a traceback."""
    import sqlite3

    op = token(sqlite_target, "op", "operator")
    s = Served(sqlite_target, "--reap-every", "0").start()
    try:
        assert s.proc is not None
        with s.client(op) as http:
            assert http.post("/v1/jobs", json={"kind": "k", "payload": {}}).status_code == 201
            with contextlib.closing(sqlite3.connect(sqlite_target.sqlite_path or "")) as raw:
                raw.execute("CREATE TRIGGER frozen BEFORE INSERT ON jobs BEGIN "
                            "SELECT RAISE(ABORT, 'jobs are frozen'); END")
                raw.commit()
            got = http.post("/v1/jobs", json={"kind": "k", "payload": {}})
            assert got.status_code == 500, got.text
        s.signal(signal.SIGTERM)
        out, err = s.proc.communicate(timeout=30)
    finally:
        s.stop()
    events = [json.loads(line) for line in out.decode().splitlines()]
    logged = [e for e in events if e["event"] == "internal_error"]
    assert len(logged) == 1 and "jobs are frozen" in logged[0]["message"], events
    assert b"Traceback" not in err


def test_a_bug_is_a_json_500_and_the_connection_keeps_serving(sqlite_target: Target) -> None:
    wa = token(sqlite_target, "wa", "worker", worker="wa")
    with Coordinator.open(sqlite_target) as c:
        c.heartbeat("wa", readings={"memory_used_pct": 5})
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("wa")["lease"]["epoch"]
    s = Served(sqlite_target, "--reap-every", "0",
               env={"JOBCOORD_FAULT": "http.complete.after_commit:bug"}).start()
    try:
        assert s.proc is not None
        with s.client(wa) as http:
            got = http.post(f"/v1/jobs/{job}/complete", json={"epoch": epoch})
            assert got.status_code == 500
            assert got.json() == {"error": {"code": "internal_error",
                                            "message": "unexpected server error"}}
            # The same kept-alive connection answers the next request.
            assert http.get("/v1/whoami").status_code == 200
        s.signal(signal.SIGTERM)
        out, err = s.proc.communicate(timeout=30)
    finally:
        s.stop()
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert [e["message"] for e in events if e["event"] == "internal_error"] == [
        "FaultBug: fault point http.complete.after_commit: an unexpected error, as a bug "
        "would raise"]
    assert b"Traceback" not in err and wa.encode() not in out + err


def test_a_client_gone_before_its_body_was_read_is_no_internal_error(
        sqlite_target: Target) -> None:
    """A client that sent 9 bytes of the 100 it declared and closed the connection: the
    server logged `internal_error` (ClientDisconnect), which its docs call a bug and an
    operator may alert on. Nothing of it is a bug, nothing is recorded, the server serves."""
    import socket

    secret = token(sqlite_target, "sub", "submitter")
    s = Served(sqlite_target, "--reap-every", "0").start()
    try:
        assert s.proc is not None
        for path, auth in (("/v1/jobs", True), ("/v1/claims", False), ("/ui/login", False),
                           ("/ui/logout", False)):
            with socket.create_connection(("127.0.0.1", s.port)) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode()
                             + (f"Authorization: Bearer {secret}\r\n".encode() if auth
                                else b"")
                             + b"Content-Length: 100\r\n\r\n{\"kind\": ")
                time.sleep(0.3)
        time.sleep(0.5)
        with s.client(secret) as http:
            assert http.post("/v1/jobs", json={"kind": "k"}).status_code == 201
        s.signal(signal.SIGTERM)
        out, err = s.proc.communicate(timeout=30)
    finally:
        s.stop()
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert not [e for e in events if e["event"] == "internal_error"], events
    assert b"Traceback" not in err
    with Coordinator.open(sqlite_target) as c:
        assert len(c.jobs()["jobs"]) == 1


def test_no_token_is_ever_logged(target: Target) -> None:
    secret = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0") as s:
        with s.client(secret) as http:
            http.post("/v1/jobs", json={"kind": "k"})
            http.get("/v1/jobs/999")
        with s.client("jct_" + "x" * 43) as bad:
            bad.get("/v1/jobs")
        assert s.proc is not None
        s.proc.send_signal(signal.SIGTERM)
        out, err = s.proc.communicate(timeout=30)
    assert secret.encode() not in out + err
    assert b"jct_" not in out + err


def test_cors_is_off(target: Target) -> None:
    with served(target, "--reap-every", "0") as s:
        resp = httpx.options(f"{s.url}/v1/jobs", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in resp.headers


def test_reaper_timer_returns_expired_leases(target: Target) -> None:
    with Coordinator.open(target) as c:
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        job = c.enqueue("k", {})["job_id"]
        c.claim("w1", lease_s=0.5)
        with served(target, "--reap-every", "0.2"):
            wait_for(lambda: c.show(job)["job"]["status"] == "waiting", timeout=20)


def test_serve_answers_an_unwritable_database_directory_with_503_or_success(
        sqlite_target: Target) -> None:
    secret = token(sqlite_target, "ci", "submitter")
    with served(sqlite_target, "--reap-every", "0.2") as s, s.client(secret) as http:
        assert http.get("/v1/jobs").status_code == 200
        path = sqlite_target.sqlite_path
        assert path is not None
        os.chmod(os.path.dirname(path), 0o500)  # unwritable directory: WAL writes fail
        try:
            resp = http.post("/v1/jobs", json={"kind": "k"})
            # Either still writable through open handles (201) or refused as storage (503),
            # never a 500 or a dead server.
            assert resp.status_code in (201, 503), resp.text
            if resp.status_code == 503:
                assert "Retry-After" in resp.headers
        finally:
            os.chmod(os.path.dirname(path), 0o700)
        assert http.post("/v1/jobs", json={"kind": "k"}).status_code == 201


def test_the_remote_client_refuses_what_json_cannot_carry_as_the_coordinator_does(
        target: Target) -> None:
    """NaN, a set, an object JSON cannot write: the local Coordinator raises InvalidInput,
    the remote client raised ValueError or TypeError from its HTTP library (a remote
    worker's handler saving NaN in a checkpoint ended its job with a bare ValueError).
    InvalidInput, as locally, with nothing sent or changed."""
    from jobcoord.errors import InvalidInput
    from jobcoord.http.client import RemoteCoordinator

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("k", {})["job_id"]
    with served(target, "--reap-every", "0") as s, RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings={"memory_used_pct": 10})
        epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
        with Coordinator.open(target) as c:
            before = dump(c)
        for call in (lambda: wa.complete(job, "wa", epoch, float("nan")),
                     lambda: wa.complete(job, "wa", epoch, {1, 2}),
                     lambda: wa.checkpoint(job, "wa", epoch, "step", {"v": float("inf")}),
                     lambda: wa.heartbeat("wa", readings={"memory_used_pct": float("nan")})):
            with pytest.raises(InvalidInput):
                call()
        with Coordinator.open(target) as c:
            assert dump(c) == before


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_an_operator_action_with_a_bad_body_is_400_and_changes_nothing(
        sqlite_target: Target, action: str) -> None:
    """Cancel and retry take no fields, and read no body: `notjson`, unknown fields,
    duplicate keys and NaN were each answered 200 and the job cancelled (or retried).
    Refused now as every route refuses them (400, nothing changed); no body, or `{}`, acts."""
    op = token(sqlite_target, "op", "operator")
    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("k", {})["job_id"]
        if action == "retry":  # a dead job
            c.heartbeat("w", readings={"memory_used_pct": 5})
            epoch = c.claim("w")["lease"]["epoch"]
            c.fail(job, "w", epoch, "boom", permanent=True)
        before = dump(c)
    path = f"/v1/jobs/{job}/{action}"
    with served(sqlite_target, "--reap-every", "0") as s, s.client(op) as http:
        for bad in (b"notjson", b'{"bogus": 1}', b'{"a": 1, "a": 2}', b'{"a": NaN}', b"[]",
                    b'{"tenant": "t"}'):
            got = http.post(path, content=bad, headers={"Content-Type": "application/json"})
            assert got.status_code == 400, (bad, got.text)
            assert got.json()["error"]["code"] == "invalid_input"
        with Coordinator.open(sqlite_target) as c:
            assert dump(c) == before
        assert http.post(path, content=b"{}").status_code == 200


def test_a_job_id_in_a_path_is_decimal_digits_or_400(sqlite_target: Target) -> None:
    """`/v1/jobs/1.0`, `/v1/jobs/%201`, `/v1/jobs/+1` and `/v1/jobs/1_0` each named job 1
    (or 10): the framework's number reading is lenient. A job id is plain ASCII digits:
    anything else is 400 `invalid_input`, as a bad body field is."""
    viewer = token(sqlite_target, "v", "viewer")
    op = token(sqlite_target, "op", "operator")
    with Coordinator.open(sqlite_target) as c:
        for _ in range(10):
            c.enqueue("k", {})
        before = dump(c)
    with served(sqlite_target, "--reap-every", "0") as s, s.client(viewer) as http, \
            s.client(op) as operator:
        assert http.get("/v1/jobs/1").status_code == 200
        for bad in ("1.0", "%201", "+1", "1_0", "%EF%BC%91", "01e0"):
            got = http.get(f"/v1/jobs/{bad}")
            assert got.status_code == 400, (bad, got.text)
            assert got.json()["error"]["code"] == "invalid_input"
            assert operator.post(f"/v1/jobs/{bad}/cancel").status_code == 400
        with Coordinator.open(sqlite_target) as c:
            assert dump(c) == before


def test_a_number_in_a_query_is_decimal_digits_or_400(sqlite_target: Target) -> None:
    """`?limit=1_0` listed ten jobs and `?limit=%201` one: the framework's number reading is
    lenient, as it was for job ids in paths. A number in a query is plain ASCII digits."""
    viewer = token(sqlite_target, "v", "viewer")
    with Coordinator.open(sqlite_target) as c:
        for _ in range(12):
            c.enqueue("k", {})
    with served(sqlite_target, "--reap-every", "0") as s, s.client(viewer) as http:
        assert len(http.get("/v1/jobs", params={"limit": "10"}).json()["jobs"]) == 10
        for bad in ("1_0", " 1", "1.0", "+1", "１", "1e1"):
            got = http.get("/v1/jobs", params={"limit": bad})
            assert got.status_code == 400, (bad, got.text)
            assert got.json()["error"]["code"] == "invalid_input"
            assert "limit" in got.json()["error"]["message"]


def test_an_unknown_query_parameter_is_400_not_ignored(sqlite_target: Target) -> None:
    """`GET /v1/jobs?tenant=nobody` answered every tenant's jobs (the parameter was ignored:
    a script meaning a filter got none), and `?foo=1` passed anywhere. An unknown query
    parameter is 400 `invalid_input` naming it, as an unknown body field is; nothing runs."""
    op = token(sqlite_target, "op", "operator")
    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("k", {})["job_id"]
        before = dump(c)
    with served(sqlite_target, "--reap-every", "0") as s, s.client(op) as http:
        assert http.get("/v1/jobs", params={"status": "waiting", "limit": 5}).status_code == 200
        for method, path, params in (("GET", "/v1/jobs", {"tenant": "nobody"}),
                                     ("GET", f"/v1/jobs/{job}", {"foo": "1"}),
                                     ("POST", f"/v1/jobs/{job}/cancel", {"force": "1"})):
            got = http.request(method, path, params=params)
            assert got.status_code == 400, (path, params, got.text)
            assert got.json()["error"]["code"] == "invalid_input"
            assert next(iter(params)) in got.json()["error"]["message"]
        with Coordinator.open(sqlite_target) as c:
            assert dump(c) == before


@pytest.mark.parametrize("closed", [False, True], ids=["| head -c0", ">&-"])
def test_a_server_whose_output_reader_is_gone_serves_on_and_stops_cleanly(
        sqlite_target: Target, tmp_path: Any, closed: bool) -> None:
    """`jobcoord serve --port P | head -c0` (or a terminal closed under it): its `listening`
    line met a closed pipe and the server died at start, exit 1, with uvicorn's traceback;
    started with stdout closed (`>&-`) it died the same way. Its event lines are dropped
    when their reader is gone; it serves, and stops on SIGTERM exit 0."""
    import socket

    secret = token(sqlite_target, "sub", "submitter")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    read_end, write_end = os.pipe()
    os.close(read_end)
    err_path = tmp_path / "serve.err"
    with open(err_path, "wb") as errf:
        proc = subprocess.Popen([*jobcoord_argv(), *db_args(sqlite_target), "serve",
                                 "--port", str(port), "--reap-every", "0", "--json"],
                                stdout=write_end, stderr=errf,
                                preexec_fn=(lambda: os.close(1)) if closed else None)
    os.close(write_end)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2
                                 ).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # died: stop waiting, the asserts say why
        wait_for(answers, 30)
        assert proc.poll() is None, err_path.read_text()[-3000:]
        got = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", json={"kind": "k"},
                         headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        assert got.status_code == 201
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, err_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err_path.read_text()


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x01b\r\n"
    b"Content-Length: 12\r\n\r\n{\"kind\":\"k\"}",
    b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Any: \x7f\r\n\r\n",
    b"GET /v1/jo bs HTTP/1.1\r\nHost: x\r\n\r\n",
    b"BREW /v1/jobs HTTP/9.9\r\n\r\n",
], ids=["control-character-in-header", "delete-in-header", "space-in-path", "no-http"])
def test_a_request_the_http_parser_refuses_is_answered_in_the_json_error_shape(
        sqlite_target: Target, request_bytes: bytes) -> None:
    """A control character in a header value, a space in the path, a request line that is
    no HTTP: the parser under the app refused them with a plain-text 400 ("Invalid HTTP
    request received."), where docs/serve.md promises every error in the JSON shape."""
    import socket

    with served(sqlite_target, "--reap-every", "0") as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            sock.sendall(request_bytes)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), answer
        assert b"content-type: application/json" in head.lower(), answer
        assert json.loads(body)["error"]["code"] == "invalid_input"
    with Coordinator.open(sqlite_target) as c:
        assert c.jobs()["jobs"] == []


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_serve_exit_130_after_its_writes_have_committed(
        sqlite_target: Target, presses: int) -> None:
    """Ctrl-C once a reap pass (or any request's write) had committed stopped the server
    exit 0: the CLI holds a Ctrl-C that comes after a commit until the result is printed,
    and uvicorn hands its captured Ctrl-C back to that handler. Two quick presses printed a
    traceback (the Ctrl-C raised inside uvicorn's shutdown). Always `stopped`, exit 130."""
    secret = token(sqlite_target, "sub", "submitter")
    proc = subprocess.Popen(
        [*jobcoord_argv(), *db_args(sqlite_target), "serve", "--port", "0", "--json",
         "--reap-every", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        listening = json.loads(proc.stdout.readline())
        assert listening["event"] == "listening"
        got = httpx.post(f"{listening['url']}/v1/jobs", json={"kind": "k"},
                         headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        assert got.status_code == 201
        time.sleep(0.5)  # reap passes commit meanwhile
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()[-3000:]
    assert b"Traceback" not in err, err.decode()[-3000:]
    assert json.loads(out.decode().splitlines()[-1])["event"] == "stopped"


def _raw(port: int, request: bytes) -> tuple[bytes, bytes]:
    """One request on a connection of its own, read to the server's close: head and body."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def test_a_path_with_a_trailing_slash_is_404_like_any_unknown_path(
        sqlite_target: Target) -> None:
    """`GET /v1/jobs/1/` and `POST /v1/jobs/` got an undocumented 307 to a Location built
    from the client's Host header (`http://x/v1/jobs/1`). The API has no such path: 404 in
    the JSON error shape, no Location, whatever the method."""
    secret = token(sqlite_target, "op", "operator")
    with served(sqlite_target, "--reap-every", "0") as s:
        for method, path in [
                ("GET", "/v1/jobs/1/"), ("POST", "/v1/jobs/"), ("HEAD", "/v1/jobs/1/"),
                ("GET", "/v1/jobs/"), ("POST", "/v1/jobs/1/complete/"), ("PUT", "/v1/jobs/1/"),
                ("DELETE", "/v1/jobs/1/"), ("GET", "/healthz/"), ("GET", "/v1/whoami/"),
                ("GET", "/ui/jobs/")]:
            body = b'{"kind": "k"}' if method in ("POST", "PUT") else b""
            head, answer = _raw(s.port, (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}"
                f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
                + body)
            assert head.startswith(b"HTTP/1.1 404 "), (method, path, head)
            assert b"\r\nlocation:" not in head.lower(), (method, path, head)
            if method != "HEAD":
                assert json.loads(answer)["error"]["code"] == "not_found", (path, answer)
    with Coordinator.open(sqlite_target) as c:
        assert c.jobs()["jobs"] == []


def _read_until_closed(sock: Any, within: float) -> tuple[bytes, float]:
    """Everything the server sends on `sock` until it closes it (or `within` s pass: then
    what came, and the time is `within`)."""
    t0 = time.monotonic()
    got = b""
    sock.settimeout(0.2)
    while time.monotonic() - t0 < within:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset
            break
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk
    return got, within


def test_a_request_whose_headers_never_end_is_cut_within_the_upload_idle_bound(
        sqlite_target: Target) -> None:
    """A connection that sent `GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n` and never the blank
    line was held open forever (uvicorn's keep-alive timeout covers only the time between
    requests), as was one that sent nothing, or a header a byte every few tenths of a second:
    enough of them took every descriptor and a normal /healthz got no answer. The request
    line and headers have `--upload-idle` s from the connection's start or the request's
    first byte: then a request begun is answered 408 `request_timeout` and the connection
    closed; a connection that sent nothing is closed without an answer."""
    import socket

    with served(sqlite_target, "--reap-every", "0", "--upload-idle", "1") as s:
        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", s.port), timeout=10)

        unfinished = [connect() for _ in range(20)]
        for sock in unfinished:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        silent = connect()
        drip = connect()
        drip.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        t0 = time.monotonic()
        drip.settimeout(0.3)
        dripped = b""
        while time.monotonic() - t0 < 8:  # a byte every 0.3 s: each well within the bound
            try:
                dripped += drip.recv(65536)
                break
            except TimeoutError:
                pass
            try:
                drip.sendall(b"a")
            except OSError:
                break
        took = time.monotonic() - t0
        assert took < 4, (took, dripped)
        answers = [_read_until_closed(sock, 5) for sock in unfinished]
        quiet = _read_until_closed(silent, 5)
        drip_rest, _ = _read_until_closed(drip, 5)
        for got, after in [*answers, (dripped + drip_rest, took)]:
            assert after < 5, (after, got)
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), got
            assert b"connection: close" in head.lower(), got
            assert json.loads(body)["error"]["code"] == "request_timeout", got
        assert quiet[0] == b"" and quiet[1] < 5, quiet
        for sock in [*unfinished, silent, drip]:
            sock.close()
        # A request sent at once is answered as ever, and its connection kept alive.
        with s.client() as http:
            assert http.get("/healthz").status_code == 200
            time.sleep(1.5)  # longer than the bound: between requests is keep-alive's
            assert http.get("/healthz").status_code == 200


def test_a_json_body_that_sends_nothing_for_upload_idle_is_400_and_nothing_done(
        sqlite_target: Target) -> None:
    """A submission with complete headers, `Content-Length: 100` and 9 bytes of its body was
    never answered: the connection was held as long as the client kept it. A JSON body
    that sends nothing for `--upload-idle` s is answered 400 `body_incomplete`, the
    connection closed, and nothing submitted; a request answered before its body ended (a
    GET with a body) has its connection closed, not left waiting for the rest."""
    import socket

    sub = token(sqlite_target, "sub", "submitter", tenant="t")
    with served(sqlite_target, "--reap-every", "0", "--upload-idle", "1") as s:
        posts = []
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         + sub.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"kind\":")
            posts.append(sock)
        sent = time.monotonic()
        get = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        get.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"x\":")
        for sock in posts:
            got, _ = _read_until_closed(sock, 6)
            after = time.monotonic() - sent
            assert 0.5 < after < 4, (after, got)
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 "), got
            assert b"connection: close" in head.lower(), got
            error = json.loads(body)["error"]
            assert error["code"] == "body_incomplete", error
            assert "nothing was done" in error["message"], error
            sock.close()
        got, _ = _read_until_closed(get, 6)
        after = time.monotonic() - sent
        assert got.startswith(b"HTTP/1.1 200 ") and after < 4, (after, got)
        get.close()
        with s.client() as http:
            assert http.get("/healthz").status_code == 200
    with Coordinator.open(sqlite_target) as c:
        assert c.jobs(tenant="t")["jobs"] == []


def test_a_json_body_trickling_in_slower_than_the_stop_looks_is_read_whole(
        sqlite_target: Target) -> None:
    """A body is waited for in slices (each ends to look whether the server is stopping):
    a slice ending while no part has come takes nothing, so a body sent in parts with
    pauses longer than a slice, a part now and then across several slices, arrives whole
    and in order."""
    import socket

    sub = token(sqlite_target, "sub", "submitter", tenant="t")
    payload = {"text": "x" * 3000, "n": list(range(50))}
    body = json.dumps({"kind": "k", "payload": payload}).encode()
    parts = [body[i:i + 700] for i in range(0, len(body), 700)]
    with served(sqlite_target, "--reap-every", "0", "--upload-idle", "3") as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + sub.encode() + b"\r\nContent-Type: application/json\r\n"
                     + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for part in parts:
            time.sleep(0.4)  # longer than a slice (STOP_LOOK_S)
            sock.sendall(part)
        got = b""
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < 10:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        sock.close()
        assert got.startswith(b"HTTP/1.1 201 "), got
    with Coordinator.open(sqlite_target) as c:
        jobs = c.jobs(tenant="t")["jobs"]
        assert len(jobs) == 1
        assert c.show(jobs[0]["job_id"])["job"]["payload"] == payload


@pytest.mark.parametrize("kind", ["json", "json_chunked", "artifact"])
def test_a_body_over_the_limit_is_answered_413_to_a_client_that_sends_it_whole(
        sqlite_target: Target, kind: str) -> None:
    """A body over the limit was answered 413 and its connection closed at once, its
    body unread: a client that sends its whole body before reading (Python's
    `http.client`, `urllib`) met a reset or a broken pipe, never the 413. The rest of the
    body is taken and dropped, as for any request answered before its body ended (within
    `--upload-idle` s in all); then the client reads its 413."""
    import socket

    secret = token(sqlite_target, "w", "worker", worker="w")
    size = 8 << 20
    if kind == "artifact":
        head = (f"PUT /v1/jobs/1/artifacts/a?epoch=1 HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {secret}\r\nX-Content-Digest: sha256:{'0' * 64}\r\n"
                f"Content-Length: {size}\r\n\r\n").encode()
        body, code = b"x" * size, "artifact_too_large"
    elif kind == "json":
        head = (f"POST /v1/jobs/1/checkpoint HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                f"{secret}\r\nContent-Length: {size}\r\n\r\n").encode()
        body, code = b"x" * size, "body_too_large"
    else:
        head = (f"POST /v1/jobs/1/checkpoint HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                f"{secret}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        piece = b"x" * 65536
        body = (b"%x\r\n" % len(piece) + piece + b"\r\n") * (size // len(piece)) + b"0\r\n\r\n"
        code = "body_too_large"
    with served(sqlite_target, "--reap-every", "0", "--max-artifact-bytes", "1000",
                "--upload-idle", "10") as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(head)
        time.sleep(0.5)  # the server answers before the body starts
        sock.sendall(body)  # a reset or broken pipe here was the defect
        got = b""
        sock.settimeout(10)
        while b"\r\n\r\n" not in got or not got.endswith(b"}}"):
            chunk = sock.recv(65536)
            assert chunk, got  # closed before the whole answer
            got += chunk
        sock.close()
        head_in, _, answer = got.partition(b"\r\n\r\n")
        assert head_in.startswith(b"HTTP/1.1 413 "), got[:300]
        assert json.loads(answer)["error"]["code"] == code, answer
        with s.client() as http:  # the server serves on
            assert http.get("/healthz").status_code == 200


def test_a_413_for_a_body_that_never_comes_closes_its_connection_after_upload_idle(
        sqlite_target: Target) -> None:
    """The connection of a body refused by its declared length stays open for the rest
    of it (above), but only `--upload-idle` s in all: a client that declared a terabyte
    and sends nothing gets its 413, then its connection closed."""
    import socket

    secret = token(sqlite_target, "w", "worker", worker="w")
    with served(sqlite_target, "--reap-every", "0", "--upload-idle", "1") as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sent = time.monotonic()
        sock.sendall((f"POST /v1/jobs/1/checkpoint HTTP/1.1\r\nHost: x\r\nAuthorization: "
                      f"Bearer {secret}\r\nContent-Length: {1 << 40}\r\n\r\n").encode())
        got, _ = _read_until_closed(sock, 8)
        after = time.monotonic() - sent
        sock.close()
        assert got.startswith(b"HTTP/1.1 413 ") and b"body_too_large" in got, got
        assert 0.5 < after < 4, after


def test_a_method_a_path_does_not_take_is_405_json_and_changes_nothing(
        sqlite_target: Target) -> None:
    """A wrong method on a path the API has is 405 `method_not_allowed` in the JSON error
    shape (docs/serve.md's table), never Starlette's plain text, and changes nothing."""
    secret = token(sqlite_target, "op", "operator")
    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("k", {})["job_id"]
        before = dump(c)
    with served(sqlite_target, "--reap-every", "0") as s, s.client(secret) as http:
        for method, path in (("DELETE", f"/v1/jobs/{job}"), ("GET", "/v1/claims"),
                             ("PUT", f"/v1/jobs/{job}"), ("POST", "/healthz"),
                             ("HEAD", f"/v1/jobs/{job}")):
            resp = http.request(method, path)
            assert resp.status_code == 405, (method, path, resp.status_code, resp.text)
            if method != "HEAD":  # a HEAD answer has no body
                assert resp.json()["error"]["code"] == "method_not_allowed", resp.text
    with Coordinator.open(sqlite_target) as c:
        assert dump(c) == before


def test_a_reader_that_takes_nothing_of_an_answer_is_cut_within_four_upload_idles(
        sqlite_target: Target) -> None:
    """A client that asked for a 6 MB answer and read none of it held its connection, and
    the answer in the server's memory, for as long as it liked (40 such readers: +330 MB);
    a download cut for its idle reader stayed open the same way (`close` waits for the
    bytes to go). An answer whose reader takes nothing for four times `--upload-idle` has
    its connection aborted."""
    import socket

    with Coordinator.open(sqlite_target) as c:
        c.heartbeat("w")
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w", lease_s=300)["lease"]["epoch"]
        for i in range(30):
            c.checkpoint(job, "w", epoch, f"c{i}", {"x": "y" * 200_000})
    secret = token(sqlite_target, "op", "operator")
    with served(sqlite_target, "--reap-every", "0", "--upload-idle", "0.5") as s:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.port))
        sock.sendall(f"GET /v1/jobs/{job} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     f"{secret}\r\n\r\n".encode())
        time.sleep(6)  # reads nothing: four idles are 2 s
        got, _ = _read_until_closed(sock, 20)
        sock.close()
        assert len(got) < 6_000_000, len(got)  # cut, not the whole answer late
        with s.client(secret) as http:  # the server serves on
            assert http.get(f"/v1/jobs/{job}").status_code == 200
