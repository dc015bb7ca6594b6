"""Batches over HTTP: `POST /v1/claims` with `n` (claim_many) and `POST /v1/completions`
(complete_many), against a real `jobcoord serve` on SQLite and PostgreSQL. Each item is
fenced as its single call is; the token decides the worker and tenant; bad input changes
nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.errors import JobcoordError
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.serve_procs import served, token

READINGS = {"memory_used_pct": 10}


def _item(got: dict[str, Any], result: Any = None) -> dict[str, Any]:
    return {"job_id": got["job"]["job_id"], "worker_id": got["lease"]["worker_id"],
            "epoch": got["lease"]["epoch"], "result": result}


def test_claims_with_n_take_up_to_n_jobs_in_claim_order_in_one_transaction(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(5)]
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 3, wait=0)
        assert [g["job"]["job_id"] for g in got["claimed"]] == jobs[:3]
        assert got["reason"] is None
        assert len({g["lease"]["epoch"] for g in got["claimed"]}) == 1  # each its first
        rest = wa.claim_many("wa", 10, wait=0)
        assert [g["job"]["job_id"] for g in rest["claimed"]] == jobs[3:]
        none = wa.claim_many("wa", 10, wait=0)
        assert none["claimed"] == [] and none["reason"] == "no_waiting_jobs", none
    with Coordinator.open(target) as c:
        claimed = [e for j in jobs[:3] for e in c.show(j)["events"] if e["reason"] == "claimed"]
    assert len({e["at"] for e in claimed}) == 1  # one transaction's time


def test_a_batch_long_poll_answers_with_a_job_submitted_while_it_waits(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        answers: list[dict[str, Any]] = []
        t = threading.Thread(target=lambda: answers.append(wa.claim_many("wa", 4, wait=10)))
        t0 = time.monotonic()
        t.start()
        time.sleep(0.5)
        job = httpx.post(s.url + "/v1/jobs", json={"kind": "k", "payload": {}}, timeout=10,
                         headers={"Authorization": f"Bearer {sub}"}).json()["job_id"]
        t.join(20)
        waited = time.monotonic() - t0
        assert [g["job"]["job_id"] for g in answers[0]["claimed"]] == [job], answers
        assert waited < 5, waited
        # Nothing waits: the poll ends empty at its wait (204 over the wire).
        t0 = time.monotonic()
        empty = wa.claim_many("wa", 4, wait=1)
        assert empty["claimed"] == [] and time.monotonic() - t0 >= 0.9


def test_completions_fence_each_item_and_refuse_what_is_not_this_tokens_lease(
        target: Target) -> None:
    """One request, one transaction: this token's live lease is accepted; a stale epoch is
    refused with its own event; another worker's lease, this worker id's lease on another
    tenant's job and a missing job all answer job_not_found (as if absent); the same job
    twice is accepted once. The refusals never refuse the others."""
    secret = token(target, "wa", "worker", tenant="alice", worker="wa")
    with Coordinator.open(target) as c:
        for w in ("wa", "wb"):
            c.heartbeat(w, roles=[f"r-{w}"], readings=READINGS)
        mine = [c.enqueue("k", {"i": i}, tenant="alice", role="r-wa")["job_id"]
                for i in range(3)]
        leases = [c.claim("wa", lease_s=300) for _ in mine]
        # Given back and claimed again: its first lease's epoch is now stale.
        c.fail(mine[2], "wa", leases[2]["lease"]["epoch"], "stop", reason="worker_shutdown")
        assert c.claim("wa", lease_s=300)["job"]["job_id"] == mine[2]
        theirs = c.enqueue("k", {}, tenant="alice", role="r-wb")["job_id"]
        their_lease = c.claim("wb", lease_s=300)
        bobs = c.enqueue("k", {}, tenant="bob", role="r-wa")["job_id"]
        bobs_lease = c.claim("wa", lease_s=300)
        assert bobs_lease["job"]["job_id"] == bobs
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        items = [_item(leases[0], {"n": 0}), _item(leases[1], {"n": 1}),
                 _item(leases[2]),
                 {**_item(their_lease), "worker_id": "wa"}, _item(bobs_lease),
                 {"job_id": 10**9, "worker_id": "wa", "epoch": 1},
                 _item(leases[0], {"n": "again"}),
                 # An epoch this worker never claimed: as if absent, like another's lease.
                 {**_item(leases[2]), "epoch": leases[2]["lease"]["epoch"] + 5}]
        got = wa.complete_many(items)
    codes = [r["error"]["code"] if "error" in r else r["status"] for r in got["results"]]
    assert codes == ["succeeded", "succeeded", "stale_epoch", "job_not_found",
                     "job_not_found", "job_not_found", "job_finished", "job_not_found"], got
    assert (got["accepted"], got["refused"]) == (2, 6)
    assert got["results"][3]["error"]["message"] == f"job {theirs} not found"
    with Coordinator.open(target) as c:
        assert c.show(mine[0])["job"]["result"] == {"n": 0}
        assert c.show(mine[2])["job"]["status"] == "running"
        assert c.show(theirs)["job"]["status"] == "running"
        assert c.show(bobs)["job"]["status"] == "running"
        assert "complete_refused" in [e["reason"] for e in c.show(mine[2])["events"]]


def test_a_completion_group_whose_answer_was_lost_is_answered_as_accepted(
        target: Target) -> None:
    """The server commits the group, then sits on the answer past the client's timeout; the
    group is sent again and each accepted item is `already_accepted`, never a false
    failure; a refused item stays refused."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        jobs = [c.enqueue("work", {"i": i})["job_id"] for i in range(3)]
    env = {"JOBCOORD_FAULT": "http.completions.after_commit:sleep=3"}
    with served(target, "--reap-every", "0", env=env) as s, \
            RemoteCoordinator(s.url, secret, timeout=1.0, retry_s=15) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 3, wait=0)["claimed"]
        items = [_item(g, {"i": k}) for k, g in enumerate(got)]
        items[2]["epoch"] += 1  # an epoch it never claimed: refused as if absent
        done = wa.complete_many(items)
    results = done["results"]
    assert [r.get("already_accepted") for r in results[:2]] == [True, True], results
    assert [r["status"] for r in results[:2]] == ["succeeded", "succeeded"]
    assert results[2]["error"]["code"] == "job_not_found"
    with Coordinator.open(target) as c:
        for k, job in enumerate(jobs[:2]):
            shown = c.show(job)
            assert shown["job"]["result"] == {"i": k}
            assert [e["reason"] for e in shown["events"]].count("completed") == 1


def test_a_group_over_the_body_limit_is_sent_in_halves_and_each_item_accepted(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        for i in range(3):
            c.enqueue("k", {"i": i})
    big = "x" * (600 * 1024)  # each under the result limit; the three together over the body
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 3, wait=0)["claimed"]
        done = wa.complete_many([_item(g, big) for g in got])
    assert done["accepted"] == 3 and done["refused"] == 0, done


BAD_COMPLETIONS = [
    {}, {"items": []}, {"items": "x"}, {"items": [{}]},
    {"items": [{"job_id": "1", "epoch": 1}]}, {"items": [{"job_id": 1, "epoch": True}]},
    {"items": [{"job_id": 1, "epoch": 1.5}]}, {"items": [{"job_id": 0, "epoch": 1}]},
    {"items": [{"job_id": 2**63, "epoch": 1}]},
    {"items": [{"job_id": 1, "epoch": 1, "worker_id": "wb"}]},
    {"items": [{"job_id": 1, "epoch": 1, "provenance": "x"}]},
    {"items": [{"job_id": 1, "epoch": 1}] * 1001}, {"items": [], "extra": 1}]
BAD_CLAIMS = [{"n": 0}, {"n": 1001}, {"n": True}, {"n": "3"}, {"n": 2.5}, {"n": None, "x": 1}]


def test_bad_batch_requests_are_400_and_change_nothing(target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("k", {})["job_id"]
        c.heartbeat("wa", readings=READINGS)
        epoch = c.claim("wa", lease_s=300)["lease"]["epoch"]
        c.enqueue("k", {})
        before = dump(c)
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        answers = [http.post("/v1/completions", json=b) for b in BAD_COMPLETIONS]
        answers += [http.post("/v1/claims", json=b) for b in BAD_CLAIMS]
        answers.append(http.post("/v1/completions", content=b'{"items": [{"job_id": 1, '
                                 b'"epoch": NaN}]}',
                                 headers={"Content-Type": "application/json"}))
    for body, r in zip([*BAD_COMPLETIONS, *BAD_CLAIMS, "NaN"], answers, strict=True):
        assert r.status_code == 400, (str(body)[:80], r.status_code, r.text[:200])
        assert set(r.json()["error"]) <= {"code", "message", "details"}
    with Coordinator.open(target) as c:
        assert dump(c) == before
        assert c.show(job)["lease"]["epoch"] == epoch


def test_a_remote_worker_with_one_slot_still_chains_its_claims(target: Target,
                                                               tmp_path: Any) -> None:
    """One slot: a group of one would cost two round trips per job; the completion claims
    the next job in its own request instead (`claim_next`)."""
    from tests.test_serve_workers import run_fleet

    _summaries, events = run_fleet(target, str(tmp_path), 60, 1)
    via = {e["via"] for e in events if e["event"] == "claimed"}
    assert "completion" in via, via


def test_refused_tokens_never_reach_the_batch_routes(target: Target) -> None:
    sub = token(target, "sub", "submitter")
    with Coordinator.open(target) as c:
        c.enqueue("k", {})
        before = dump(c)
    with served(target, "--reap-every", "0") as s:
        for secret, status in ((sub, 403), ("jct_nope", 401), (None, 401)):
            headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
            for path, body in (("/v1/claims", {"n": 2}),
                               ("/v1/completions", {"items": [{"job_id": 1, "epoch": 1}]})):
                r = httpx.post(s.url + path, json=body, headers=headers, timeout=10)
                assert r.status_code == status, (path, secret, r.text[:200])
    with Coordinator.open(target) as c:
        assert dump(c) == before


def test_client_complete_many_raises_what_the_server_refuses_as_a_whole(
        target: Target) -> None:
    """A refusal of the whole request (not an item's) reaches the caller as an error."""
    secret = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa, pytest.raises(JobcoordError) as caught:
        wa.complete_many([])
    assert caught.value.code == "invalid_input"


def test_a_group_with_one_result_over_the_limit_saves_nothing_and_names_that_item(
        target: Target) -> None:
    """Over the body limit because one result alone is over the result limit: refused as a
    whole before any half is sent (the core refuses such a group whole), the item named."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        for i in range(3):
            c.enqueue("k", {"i": i})
    huge = "y" * (1024 * 1024 + 70_000)
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 3, wait=0)["claimed"]
        with pytest.raises(JobcoordError) as caught:
            wa.complete_many([_item(got[0], "a"), _item(got[1], "b"), _item(got[2], huge)])
    assert caught.value.code == "result_too_large", caught.value.to_json()
    assert caught.value.details.get("item") == 2, caught.value.to_json()
    with Coordinator.open(target) as c:
        assert [j["status"] for j in c.jobs()["jobs"]] == ["running"] * 3


def _split_group_of_one_job_twice(target: Target, *, last: str | None = None,
                                  completed_before: bool = False) -> dict[str, Any]:
    """Two jobs claimed through a server, then one group so large the client sends it in
    halves: job 1, job 2, job 1 again (its last result `last`, else the same). With
    `completed_before`, job 1 was completed by a request of its own first."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        for i in range(2):
            c.enqueue("k", {"i": i})
    big = "x" * (600 * 1024)
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 2, wait=0)["claimed"]
        if completed_before:
            wa.complete(got[0]["job"]["job_id"], "wa", got[0]["lease"]["epoch"], big)
        return wa.complete_many([_item(got[0], big), _item(got[1], big),
                                 _item(got[0], big if last is None else last)])


def test_a_split_group_answers_a_second_item_of_one_job_as_one_group_would(
        target: Target) -> None:
    """The same job twice in a group the client sends in halves: the later item is the
    core's refusal of a job reported earlier in the batch, not `already_accepted`."""
    done = _split_group_of_one_job_twice(target, last="again")
    assert done["accepted"] == 2 and done["refused"] == 1, done
    again = done["results"][2]
    assert again["error"]["code"] == "job_finished", again
    assert again["error"]["details"].get("earlier_in_batch") is True, again


def test_a_job_accepted_in_an_earlier_request_is_never_said_completed_in_this_batch(
        target: Target) -> None:
    """A job completed by an earlier request, then twice in one `POST /v1/completions`: the
    first item was `already_accepted` and the second refused `job_finished` "was already
    completed earlier in this batch" (`earlier_in_batch`), though the batch completed
    nothing. Both items are the accepted completion sent again: both `already_accepted`."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.enqueue("k", {})
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        http.post("/v1/heartbeat", json={"readings": READINGS})
        got = http.post("/v1/claims", json={"wait": 0}).json()
        job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
        first = http.post(f"/v1/jobs/{job}/complete", json={"epoch": epoch, "result": "r"})
        assert first.status_code == 200, first.text
        item = {"job_id": job, "epoch": epoch, "result": "r"}
        done = http.post("/v1/completions", json={"items": [item, item]})
    assert done.status_code == 200, done.text
    body = done.json()
    assert "earlier in this batch" not in done.text, body
    assert body["results"] == [{"job_id": job, "status": "succeeded", "epoch": epoch,
                                "already_accepted": True}] * 2, body
    with Coordinator.open(target) as c:
        events = [e["reason"] for e in c.show(job)["events"]]
    assert events.count("completed") == 1 and "complete_refused" not in events, events


def test_a_split_group_never_says_a_job_accepted_in_an_earlier_request_completed_in_it(
        target: Target) -> None:
    """A group the client sends in halves, holding twice a job an earlier request completed:
    the server answered both items `already_accepted`, and the client turned the second
    into "already completed earlier in this batch" (`earlier_in_batch`), as if the first
    had been this group's own acceptance."""
    done = _split_group_of_one_job_twice(target, completed_before=True)
    first, _, again = done["results"]
    assert first.get("already_accepted") is True, first
    assert again == first, again


def test_the_remote_client_imports_no_database_or_server_code() -> None:
    """A worker on another machine loads the client alone: no SQLAlchemy, no FastAPI (the
    batch answers it shares with the core live in a module without them)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import sys, jobcoord.http.client; "
         "print(sorted(m for m in ('sqlalchemy', 'fastapi', 'uvicorn', 'alembic') "
         "if m in sys.modules))"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_a_split_group_with_one_bad_item_saves_nothing_and_names_it_in_the_group(
        target: Target) -> None:
    """A group over the body limit is checked item by item as the core checks it before any
    part is sent: an epoch out of range after 20 good items refuses the whole group (the
    index is the group's, not a part's), and none of the 20 is accepted."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(20)])
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 20, wait=0)["claimed"]
        items = [_item(g, "x" * 100_000) for g in got]
        items.append({**items[0], "epoch": -1})
        with pytest.raises(JobcoordError) as caught:
            wa.complete_many(items)
        assert caught.value.code == "invalid_input", caught.value.to_json()
        assert caught.value.details.get("item") == 20, caught.value.to_json()
        with pytest.raises(JobcoordError) as caught:
            wa.complete_many([items[0]] * 1001)
        assert caught.value.code == "invalid_input", caught.value.to_json()
    with Coordinator.open(target) as c:
        assert {j["status"] for j in c.jobs()["jobs"]} == {"running"}


def test_a_completion_at_its_result_and_provenance_limits_fits_one_request(
        target: Target) -> None:
    """The body limit has room for a result at the result limit with a provenance at its
    own (64 KiB) limit: what the core accepts, one request carries."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(2)])
        limit = c.policy.max_result_bytes
    result = "x" * (limit - 2)  # stored with its quotes: exactly the limit
    provenance = {"p": "y" * (64 * 1024 - 8)}  # {"p":"..."}: exactly 64 KiB
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        got = wa.claim_many("wa", 2, wait=0)["claimed"]
        one = wa.complete(got[0]["job"]["job_id"], "wa", got[0]["lease"]["epoch"], result,
                          provenance=provenance)
        assert one["status"] == "succeeded", one
        group = wa.complete_many([{**_item(got[1], result), "provenance": provenance}])
        assert group["accepted"] == 1, group


@pytest.mark.parametrize("secret", ["jct_\u00e9", "jct_a\nb", "jct_a b", "jct_\x00"])
def test_a_token_with_characters_no_token_has_is_invalid_input(secret: str) -> None:
    with pytest.raises(JobcoordError) as caught:
        RemoteCoordinator("http://127.0.0.1:9", secret)
    assert caught.value.code == "invalid_input", caught.value.to_json()


def test_a_claim_with_n_takes_at_most_32_mib_of_payloads_at_the_payload_limit(
        target: Target, tmp_path: Any) -> None:
    """With a 1 MiB payload limit a claim takes at most 32 jobs, whatever `n` asks; the
    rest wait for the next claim."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f"max_payload_bytes = {1024 * 1024}\n")
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(40)])
    with served(target, "--reap-every", "0", env={"JOBCOORD_POLICY": str(policy)}) as s, \
            RemoteCoordinator(s.url, secret) as wa:
        wa.heartbeat("wa", readings=READINGS)
        first = wa.claim_many("wa", 1000, wait=0)["claimed"]
        second = wa.claim_many("wa", 1000, wait=0)["claimed"]
    assert (len(first), len(second)) == (32, 8)
