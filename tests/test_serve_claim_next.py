"""`POST /v1/jobs/{id}/complete` with `claim_next`: the completion and the worker's next claim
in one request and one transaction (the core's complete_and_claim), against a real
`jobcoord serve` over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.errors import Refused
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import served, token

READINGS = {"memory_used_pct": 5}


def _expires(lease: dict[str, Any]) -> float:
    return datetime.fromisoformat(lease["expires_at"].replace("Z", "+00:00")).timestamp()


def test_claim_next_answers_the_completion_and_the_next_job_with_its_lease(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        first = c.enqueue("a", {"n": 1})["job_id"]
        second = c.enqueue("a", {"n": 2})["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        assert http.post("/v1/heartbeat", json={"readings": READINGS}).status_code == 200
        # Documented: the body's fields and the route's description.
        doc = http.get("/openapi.json").json()
        fields = doc["components"]["schemas"]["CompleteBody"]["properties"]
        assert fields["claim_next"]["type"] == "boolean" and "lease_s" in fields
        assert "claim_next" in doc["paths"]["/v1/jobs/{job_id}/complete"]["post"][
            "description"]
        got = http.post("/v1/claims", json={}).json()
        assert got["job"]["job_id"] == first
        sent = time.time()
        resp = http.post(f"/v1/jobs/{first}/complete", json={
            "epoch": got["lease"]["epoch"], "result": {"ok": 1}, "claim_next": True,
            "lease_s": 120})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert (body["job_id"], body["status"], body["epoch"]) == (first, "succeeded", 1)
        nxt = body["next"]
        assert nxt["job"]["job_id"] == second and nxt["job"]["payload"] == {"n": 2}
        assert nxt["lease"]["worker_id"] == "wa" and nxt["lease"]["epoch"] == 1
        assert sent + 100 < _expires(nxt["lease"]) < time.time() + 121
        # Nothing left: the completion is accepted and `next` is the claim's refusal.
        last = http.post(f"/v1/jobs/{second}/complete", json={
            "epoch": 1, "result": {"ok": 2}, "claim_next": True}).json()
        assert last["status"] == "succeeded"
        assert last["next"]["job"] is None and last["next"]["reason"] == "no_waiting_jobs"
    with Coordinator.open(target) as c:
        one, two = c.show(first), c.show(second)
    assert one["job"]["status"] == two["job"]["status"] == "succeeded"
    assert two["job"]["result"] == {"ok": 2}
    # One transaction: the completion and the next claim carry the same instant.
    done = next(e for e in one["events"] if e["reason"] == "completed")
    claimed = next(e for e in two["events"] if e["reason"] == "claimed")
    assert done["at"] == claimed["at"] and claimed["worker_id"] == "wa"


def test_claim_next_takes_the_kinds_of_the_workers_heartbeat(target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        first = c.enqueue("a", {})["job_id"]
        c.enqueue("b", {}, priority=0)  # ahead in claim order, but not a kind wa handles
        wanted = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        http.post("/v1/heartbeat", json={"readings": READINGS, "kinds": ["a"]})
        epoch = http.post("/v1/claims", json={}).json()["lease"]["epoch"]
        body = http.post(f"/v1/jobs/{first}/complete",
                         json={"epoch": epoch, "claim_next": True}).json()
        assert body["next"]["job"]["job_id"] == wanted


def test_a_stale_epoch_completion_with_claim_next_is_refused_and_claims_nothing(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        assert c.claim("wa")["lease"]["epoch"] == 1
        # The attempt is given back and claimed again: epoch 1 is stale now.
        c.fail(job, "wa", 1, "released", reason="worker_shutdown")
        assert c.claim("wa")["lease"]["epoch"] == 2
        waiting = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        resp = http.post(f"/v1/jobs/{job}/complete",
                         json={"epoch": 1, "result": {}, "claim_next": True})
        assert resp.status_code == 409, resp.text
        assert resp.json()["error"]["code"] == "stale_epoch"
    with Coordinator.open(target) as c:
        assert c.show(waiting)["job"]["status"] == "waiting"
        assert not [e for e in c.show(waiting)["events"] if e["reason"] == "claimed"]
        shown = c.show(job)
    assert shown["job"]["status"] == "running" and shown["lease"]["epoch"] == 2


def test_claim_next_bad_input_is_400_and_changes_nothing(target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        c.claim("wa")
        waiting = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        for body in ({"epoch": 1, "lease_s": 30},  # a next lease without claim_next
                     {"epoch": 1, "claim_next": "maybe"},
                     {"epoch": 1, "claim_next": True, "lease_s": "long"},
                     {"epoch": 1, "claim_next": True, "lease_s": -1},
                     {"epoch": 1, "claim_next": True, "kinds": ["a"]}):
            resp = http.post(f"/v1/jobs/{job}/complete", json=body)
            assert resp.status_code == 400, (body, resp.text)
            assert set(resp.json()["error"]) <= {"code", "message", "details"}
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "running"
        assert c.show(waiting)["job"]["status"] == "waiting"


def test_a_lost_chained_answer_sent_again_is_accepted_with_the_job_it_claimed(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("a", {})["job_id"]
        orphan = c.enqueue("a", {})["job_id"]
        third = c.enqueue("a", {})["job_id"]
    env = {"JOBCOORD_FAULT": "http.complete.after_commit:sleep=3"}
    with served(target, "--reap-every", "0", env=env) as s, \
            RemoteCoordinator(s.url, secret, timeout=1.0, retry_s=15) as wa:
        wa.heartbeat("wa", readings=READINGS)
        epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
        both = wa.complete_and_claim(job, "wa", epoch, {"x": 1})  # times out, sent again
        assert both["completed"]["already_accepted"] is True
        # The job the lost answer claimed, handed back under that claim's lease.
        assert both["next"]["job"]["job_id"] == orphan
        assert both["next"]["lease"]["epoch"] == 1
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "succeeded"
        assert c.show(orphan)["lease"]["worker_id"] == "wa"
        assert c.show(orphan)["lease"]["expires_at"] == both["next"]["lease"]["expires_at"]
        # The re-sent completion claimed no second one.
        assert c.show(third)["job"]["status"] == "waiting"


def test_remote_complete_and_claim_returns_the_coordinators_shape(target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("a", {})["job_id"]
        nxt = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0") as s, RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
        both = wa.complete_and_claim(job, "wa", epoch, {"x": 1}, lease_s=60)
        assert set(both) == {"completed", "next"}
        assert both["completed"]["status"] == "succeeded" and "next" not in both["completed"]
        assert both["next"]["job"]["job_id"] == nxt
        with pytest.raises(Refused) as refused:  # an epoch it never claimed: as if absent
            wa.complete_and_claim(nxt, "wa", 7, {})
        assert refused.value.code == "job_not_found"
