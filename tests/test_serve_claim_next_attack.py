"""`POST /v1/jobs/{id}/complete` with `claim_next`, attacked from outside: a real
`jobcoord serve` on 127.0.0.1, real HTTP, real signals, on SQLite and PostgreSQL. Lost
answers and the job they claimed, killed and stopped processes, other tenants and workers,
input of the wrong types, gates, and concurrent chained completions by one token."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from typing import Any

from jobcoord.db import Target
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import Served, served, token, wait_for
from tests.sql import sql

READINGS = {"memory_used_pct": 5}


def _claims_and_completions(c: Coordinator) -> tuple[list[tuple[int, int]], list[int]]:
    """Every (job, epoch) claimed, and every job's accepted completions, from the events."""
    def read(conn: Any) -> tuple[list[tuple[int, int]], list[int]]:
        claims = [(int(j), int(e)) for j, e in sql(
            conn, "SELECT job_id, epoch FROM job_events WHERE reason = 'claimed'").all()]
        done = [int(j) for (j,) in sql(
            conn, "SELECT job_id FROM job_events WHERE reason = 'completed'").all()]
        return claims, done
    return c.db.read(read)


def _once_each(c: Coordinator) -> None:
    claims, done = _claims_and_completions(c)
    assert not [k for k, n in Counter(claims).items() if n > 1], claims
    assert not [k for k, n in Counter(done).items() if n > 1], done


def _untouched(c: Coordinator, job: int) -> bool:
    shown = c.show(job)
    return shown["job"]["status"] == "waiting" and not [
        e for e in shown["events"] if e["reason"] == "claimed"]


# -- input ------------------------------------------------------------------------------------


def test_claim_next_lease_s_and_epoch_take_their_own_json_types_only(target: Target) -> None:
    """`claim_next: "yes"` or `1` claimed a job, `lease_s: true` leased it for one second,
    `lease_s: "30"` was read as a number, `epoch: true` fenced as epoch 1: JSON of another
    type is 400 and changes nothing."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        c.claim("wa")
        waiting = c.enqueue("a", {})["job_id"]
    bodies: list[dict[str, Any]] = [
        *({"epoch": 1, "claim_next": flag} for flag in ("yes", "true", 1, 0, "false", [True],
                                                        {})),
        *({"epoch": 1, "claim_next": True, "lease_s": lease}
          for lease in (True, False, "30", [30], {"s": 30}, 0, -0.5, 1e12, 10**30)),
        *({"epoch": epoch, "claim_next": True} for epoch in (True, "1", [1])),
    ]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        for body in bodies:
            resp = http.post(f"/v1/jobs/{job}/complete", json=body)
            assert resp.status_code == 400, (body, resp.text)
            assert resp.json()["error"]["code"] == "invalid_input", (body, resp.text)
        # NaN and Infinity are not JSON: written out by hand.
        for text in ('{"epoch": 1, "claim_next": true, "lease_s": NaN}',
                     '{"epoch": 1, "claim_next": true, "lease_s": Infinity}',
                     '{"epoch": 1, "claim_next": true, "lease_s": 1e999}'):
            resp = http.post(f"/v1/jobs/{job}/complete", content=text,
                             headers={"Content-Type": "application/json"})
            assert resp.status_code == 400, (text, resp.text)
            assert resp.json()["error"]["code"] == "invalid_input", (text, resp.text)
        # A whole number of seconds is a number like any other.
        ok = http.post(f"/v1/jobs/{job}/complete",
                       json={"epoch": 1, "claim_next": True, "lease_s": 60})
        assert ok.status_code == 200, ok.text
        assert ok.json()["next"]["job"]["job_id"] == waiting
    with Coordinator.open(target) as c:
        completed = [e for e in c.show(job)["events"] if e["reason"] == "completed"]
        claimed = [e for e in c.show(waiting)["events"] if e["reason"] == "claimed"]
    assert len(completed) == len(claimed) == 1


def test_a_five_thousand_digit_number_in_a_body_is_invalid_input(target: Target) -> None:
    """Python will not read an integer of more than 4300 digits: the body is answered with
    the JSON error `invalid_input`, not a bare 400 `http_400`, on every route with a body."""
    secret = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")
    op = token(target, "op", "operator")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        c.claim("wa")
    huge = "9" * 5000
    cases = [
        (secret, f"/v1/jobs/{job}/complete", f'{{"epoch": 1, "claim_next": true, '
                                             f'"lease_s": {huge}}}'),
        (secret, f"/v1/jobs/{job}/complete", f'{{"epoch": {huge}}}'),
        (secret, f"/v1/jobs/{job}/complete", f'{{"epoch": 1, "result": {{"n": {huge}}}}}'),
        (secret, "/v1/claims", f'{{"lease_s": {huge}}}'),
        (secret, "/v1/heartbeat", f'{{"readings": {{"memory_used_pct": {huge}}}}}'),
        (sub, "/v1/jobs", f'{{"kind": "a", "priority": {huge}}}'),
        (op, "/v1/prune", f'{{"older_than": {huge}, "dry_run": true}}'),
    ]
    with served(target, "--reap-every", "0") as s:
        for secret_, path, text in cases:
            with s.client(secret_) as http:
                resp = http.post(path, content=text,
                                 headers={"Content-Type": "application/json"})
            assert resp.status_code == 400, (path, resp.text[:300])
            error = resp.json()["error"]
            assert error["code"] == "invalid_input", (path, resp.text[:300])
            assert "digits" in error["message"], error
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "running"
