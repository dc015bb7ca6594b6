"""A submission through `jobcoord serve` while long-polls wait hands its job to the oldest
waiting poll in its own transaction (the core's enqueue_and_claim): against a real server
over real HTTP, and the core helper itself, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from jobcoord import faults
from jobcoord.core.handover import Claimant, enqueue_and_claim
from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.serve_procs import Served, served, token

READINGS = {"memory_used_pct": 5}


def _poll(s: Served, secret: str, wait: float, out: dict[str, Any],
          **body: Any) -> threading.Thread:
    """A long-poll on a thread of its own; its answer lands in `out`."""

    def run() -> None:
        with s.client(secret) as http:
            resp = http.post("/v1/claims", json={"wait": wait, **body})
            out.update(status=resp.status_code,
                       body=resp.json() if resp.status_code == 200 else None)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _events(target: Target, job_id: int) -> list[dict[str, Any]]:
    with Coordinator.open(target) as c:
        return list(c.show(job_id)["events"])


def test_the_job_goes_to_the_waiting_poll_in_the_submissions_transaction(
        target: Target) -> None:
    wa = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")
    with served(target, "--reap-every", "0") as s, s.client(sub) as submitter:
        with s.client(wa) as http:
            http.post("/v1/heartbeat", json={"readings": READINGS})
        for _ in range(3):
            out: dict[str, Any] = {}
            thread = _poll(s, wa, 20, out)
            time.sleep(0.5)  # waiting in its long-poll
            resp = submitter.post("/v1/jobs", json={"kind": "k", "payload": {"n": 1}})
            assert resp.status_code == 201, resp.text
            job = resp.json()["job_id"]
            assert resp.headers["Location"] == f"/v1/jobs/{job}"
            thread.join(20)
            assert out["status"] == 200
            body = out["body"]
            assert body["job"]["job_id"] == job and body["job"]["payload"] == {"n": 1}
            assert body["lease"]["worker_id"] == "wa" and body["lease"]["epoch"] == 1
            events = _events(target, job)
            enqueued = next(e for e in events if e["reason"] == "enqueued")
            claimed = [e for e in events if e["reason"] == "claimed"]
            # One transaction: the insert and the claim carry the same instant.
            assert len(claimed) == 1 and claimed[0]["worker_id"] == "wa"
            assert claimed[0]["at"] == enqueued["at"]
            with s.client(wa) as http:
                done = http.post(f"/v1/jobs/{job}/complete", json={"epoch": 1})
                assert done.json()["status"] == "succeeded"


@pytest.mark.parametrize("refused", ["tenant", "kinds", "poll_kinds", "role"])
def test_the_oldest_poll_not_allowed_to_take_the_job_leaves_it_to_one_that_is(
        target: Target, refused: str) -> None:
    """The oldest waiting poll's worker may not take the job (another tenant's token, kinds
    it does not handle, by its heartbeat or its poll, a role it lacks): the submission
    commits all the same and the job goes to the next poll, whose worker may take it,
    once."""
    tenant = "t1" if refused == "tenant" else None
    wa = token(target, "wa", "worker", worker="wa", tenant=tenant)
    wb = token(target, "wb", "worker", worker="wb", tenant="t2" if tenant else None)
    sub = token(target, "sub", "submitter", tenant="t2" if tenant else None)
    with served(target, "--reap-every", "0") as s:
        with s.client(wa) as a, s.client(wb) as b:
            beat: dict[str, Any] = {"readings": READINGS}
            if refused == "kinds":
                beat["kinds"] = ["other"]
            if refused == "role":
                beat["roles"] = ["cpu"]
            assert a.post("/v1/heartbeat", json=beat).status_code == 200
            assert b.post("/v1/heartbeat", json={"readings": READINGS, "roles": ["gpu"]}
                          ).status_code == 200
        first: dict[str, Any] = {}
        second: dict[str, Any] = {}
        ta = _poll(s, wa, 3, first,
                   **({"kinds": ["other"]} if refused == "poll_kinds" else {}))
        time.sleep(0.5)  # wa waits first: the oldest poll
        tb = _poll(s, wb, 20, second)
        time.sleep(0.5)
        spec: dict[str, Any] = {"kind": "k", "payload": {}}
        if refused == "role":
            spec["role"] = "gpu"
        with s.client(sub) as submitter:
            resp = submitter.post("/v1/jobs", json=spec)
        assert resp.status_code == 201, resp.text
        job = resp.json()["job_id"]
        tb.join(20)
        ta.join(20)
        assert second["status"] == 200 and second["body"]["job"]["job_id"] == job
        assert second["body"]["lease"]["worker_id"] == "wb"
        assert first["status"] == 204, first
    claimed = [e for e in _events(target, job) if e["reason"] == "claimed"]
    assert [e["worker_id"] for e in claimed] == ["wb"]


def test_a_refused_hand_over_commits_the_submission_and_leaves_the_job_waiting(
        target: Target) -> None:
    wa = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")
    with served(target, "--reap-every", "0") as s:
        with s.client(wa) as a:
            a.post("/v1/heartbeat", json={"readings": READINGS, "kinds": ["other"]})
        out: dict[str, Any] = {}
        thread = _poll(s, wa, 2, out)
        time.sleep(0.5)
        with s.client(sub) as submitter:
            resp = submitter.post("/v1/jobs", json={"kind": "k", "payload": {"n": 2}})
        assert resp.status_code == 201, resp.text
        job = resp.json()["job_id"]
        thread.join(20)
        assert out["status"] == 204
        with Coordinator.open(target) as c:
            shown = c.show(job)
            assert shown["job"]["status"] == "waiting"
            assert [e["reason"] for e in shown["events"]] == ["enqueued"]
        # The next claim of a worker that may take it does.
        with s.client(wa) as a:
            a.post("/v1/heartbeat", json={"readings": READINGS, "kinds": ["k"]})
            got = a.post("/v1/claims", json={}).json()
        assert got["job"]["job_id"] == job and got["lease"]["epoch"] == 1


def test_a_poll_that_timed_out_or_whose_client_went_away_is_not_handed_a_job(
        target: Target) -> None:
    wa = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")
    # The longest poll (1 s): a waiting long-poll looks again on its own only every 2 s, so
    # the poll whose client went away below is still waiting when the jobs are submitted.
    with served(target, "--reap-every", "0", "--poll", "1") as s:
        with s.client(wa) as a:
            a.post("/v1/heartbeat", json={"readings": READINGS})
            assert a.post("/v1/claims", json={"wait": 0.5}).status_code == 204
        # The client gives up long before the poll's own wait would end, and closes its
        # connection.
        with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {wa}"},
                          timeout=0.5) as a, pytest.raises(httpx.ReadTimeout):
            a.post("/v1/claims", json={"wait": 20})
        time.sleep(0.2)
        with s.client(sub) as submitter:
            jobs = [submitter.post("/v1/jobs", json={"kind": "k", "payload": {}}).json()[
                "job_id"] for _ in range(2)]
        time.sleep(0.5)
        with Coordinator.open(target) as c:
            for job in jobs:
                shown = c.show(job)
                assert shown["job"]["status"] == "waiting", shown
                assert [e["reason"] for e in shown["events"]] == ["enqueued"]
        with s.client(wa) as a:
            assert a.post("/v1/claims", json={}).json()["job"]["job_id"] == jobs[0]


def test_concurrent_submissions_hand_each_job_to_one_poll_only(target: Target) -> None:
    n_workers, n_submitters, each = 4, 3, 6
    secrets = [token(target, f"w{i}", "worker", worker=f"w{i}") for i in range(n_workers)]
    sub = token(target, "sub", "submitter")
    taken: list[tuple[str, int]] = []
    lock = threading.Lock()
    with served(target, "--reap-every", "0") as s:

        def work(i: int) -> None:
            with s.client(secrets[i]) as http:
                http.post("/v1/heartbeat", json={"readings": READINGS})
                while True:
                    resp = http.post("/v1/claims", json={"wait": 3})
                    if resp.status_code == 204:
                        return
                    got = resp.json()
                    job = got["job"]["job_id"]
                    with lock:
                        taken.append((f"w{i}", job))
                    http.post(f"/v1/jobs/{job}/complete",
                              json={"epoch": got["lease"]["epoch"]})

        def submit(made: list[int]) -> None:
            with s.client(sub) as http:
                for _ in range(each):
                    made.append(http.post("/v1/jobs", json={"kind": "k"}).json()["job_id"])
                    time.sleep(0.01)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(n_workers)]
        for t in workers:
            t.start()
        time.sleep(0.8)  # all waiting
        made: list[list[int]] = [[] for _ in range(n_submitters)]
        submitters = [threading.Thread(target=submit, args=(m,)) for m in made]
        for t in submitters:
            t.start()
        for t in submitters + workers:
            t.join(60)
    jobs = sorted(j for m in made for j in m)
    assert len(jobs) == n_submitters * each
    counts = Counter(job for _, job in taken)
    assert sorted(counts) == jobs and set(counts.values()) == {1}, counts
    with Coordinator.open(target) as c:
        for job in jobs:
            shown = c.show(job)
            assert shown["job"]["status"] == "succeeded"
            claims = [e for e in shown["events"] if e["reason"] == "claimed"]
            assert len(claims) == 1 and claims[0]["epoch"] == 1


# --- the core helper -------------------------------------------------------------------------


def test_enqueue_and_claim_takes_the_job_for_the_claimant_in_one_transaction(
        coord: Coordinator) -> None:
    coord.heartbeat("wa", readings=READINGS)
    got = enqueue_and_claim(coord, "k", {"n": 1}, claimant=Claimant("wa", 60))
    assert got["created"] is True
    claimed = got["claimed"]
    assert claimed["job"]["job_id"] == got["job_id"]
    assert claimed["lease"]["worker_id"] == "wa" and claimed["lease"]["epoch"] == 1
    events = coord.show(got["job_id"])["events"]
    assert [e["reason"] for e in events] == ["enqueued", "claimed"]
    assert events[0]["at"] == events[1]["at"]
    # The same idempotency key makes no new job, and claims nothing.
    keyed = enqueue_and_claim(coord, "k", {}, key="x", claimant=Claimant("wb"))
    assert keyed["claimed"] is None  # wb never said it is alive: its claim takes nothing
    again = enqueue_and_claim(coord, "k", {}, key="x", claimant=Claimant("wa"))
    assert again == {"job_id": keyed["job_id"], "created": False, "claimed": None}


def test_enqueue_and_claim_rolls_back_a_claim_that_takes_nothing_or_raises(
        coord: Coordinator) -> None:
    coord.heartbeat("wa", readings=READINGS, kinds=["other"])
    before = coord.workers()["workers"][0]["last_refusal"]
    got = enqueue_and_claim(coord, "k", {}, claimant=Claimant("wa"))
    assert got["created"] is True and got["claimed"] is None
    shown = coord.show(got["job_id"])
    assert shown["job"]["status"] == "waiting"
    assert [e["reason"] for e in shown["events"]] == ["enqueued"]
    # The refusal was rolled back with the claim: nothing recorded on the worker.
    assert coord.workers()["workers"][0]["last_refusal"] == before
    # A claim that raises (here inside a limit's check) is undone; the job stays.
    coord.heartbeat("wa", readings=READINGS)
    coord.set_limit("lim", 5)
    faults.install("checked.before_take:bug")
    try:
        raised = enqueue_and_claim(coord, "lim", {}, claimant=Claimant("wa"))
    finally:
        faults.install("")
    assert raised["created"] is True and raised["claimed"] is None
    shown = coord.show(raised["job_id"])
    assert shown["job"]["status"] == "waiting" and shown["lease"] is None
    taken = coord.claim("wa", kinds=["lim"])
    assert taken["job"]["job_id"] == raised["job_id"] and taken["lease"]["epoch"] == 1
