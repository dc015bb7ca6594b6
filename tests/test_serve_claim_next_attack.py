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

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import DroppingProxy, Served, served, token, wait_for
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
    """Python will not read an integer of more than 4300 digits (nor nesting past its
    recursion limit): the body is answered with the JSON error `invalid_input`, not a bare
    400 `http_400`, on every route with a body."""
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
        # Nesting deep enough to stop Python's JSON reader is answered the same way.
        deep = '{"epoch": 1, "result": ' + "[" * 100_000 + "]" * 100_000 + "}"
        with s.client(secret) as http:
            resp = http.post(f"/v1/jobs/{job}/complete", content=deep,
                             headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, resp.text[:300]
        assert resp.json()["error"]["code"] == "invalid_input", resp.text[:300]
        assert "nested deeper" in resp.json()["error"]["message"], resp.text[:300]
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "running"


# -- lost answers -----------------------------------------------------------------------------


def test_a_lost_chained_answer_resent_after_the_next_lease_ended_claims_nothing(
        target: Target) -> None:
    """The answer to a chained completion is lost after the commit and the completion is
    sent again only after the lease of the job it claimed has ended: `already_accepted`
    with nothing claimed (a lease that ran out is not handed back). That job is reaped and
    runs again: every (job, epoch) claimed once, every job accepted once."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("a", {})["job_id"]
        orphan = c.enqueue("a", {})["job_id"]
    env = {"JOBCOORD_FAULT": "http.complete.after_commit:sleep=3"}
    with served(target, "--reap-every", "0.2", env=env) as s, \
            RemoteCoordinator(s.url, secret, timeout=1.0, retry_s=15) as wa, \
            RemoteCoordinator(s.url, secret, timeout=10.0, retry_s=15) as patient:
        wa.heartbeat("wa", readings=READINGS)
        epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
        # Sent again after the 1 s timeout: past the next job's 0.3 s lease.
        both = wa.complete_and_claim(job, "wa", epoch, {"x": 1}, lease_s=0.3)
        assert both["completed"]["already_accepted"] is True and both["next"]["job"] is None
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(orphan)["job"]["status"] == "waiting", timeout=20)
            assert c.show(orphan)["events"][-1]["reason"] == "lease_expired"
        again = patient.claim("wa", wait=5)
        assert again["job"]["job_id"] == orphan and again["lease"]["epoch"] == 2
        done = patient.complete(orphan, "wa", 2, {"x": 2})
        assert done["status"] == "succeeded" and not done.get("already_accepted")
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["result"] == {"x": 1}
        assert c.show(orphan)["job"]["result"] == {"x": 2}
        claims, done_ids = _claims_and_completions(c)
        assert sorted(claims) == sorted([(job, 1), (orphan, 1), (orphan, 2)])
        assert sorted(done_ids) == sorted([job, orphan])
        assert c.db.read(lambda conn: sql(conn, "SELECT COUNT(*) FROM leases").scalar()) == 0


def test_server_killed_after_a_chained_commit_answers_the_resent_completion_as_accepted(
        target: Target) -> None:
    """SIGKILL of the server between a chained completion's commit and its answer; a new
    server on the same port: the client's re-sent completion is `already_accepted` and is
    handed the job the dead answer claimed (same epoch, same lease: the database says so,
    not the dead server), which it completes; nothing else is claimed."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("a", {})["job_id"]
        orphan = c.enqueue("a", {})["job_id"]
        third = c.enqueue("a", {})["job_id"]
    first = Served(target, "--reap-every", "0",
                   env={"JOBCOORD_FAULT": "http.complete.after_commit:sleep=30"}).start()
    second = None
    got: dict[str, Any] = {}
    try:
        with RemoteCoordinator(first.url, secret, timeout=60.0, retry_s=30) as wa:
            wa.heartbeat("wa", readings=READINGS)
            epoch = wa.claim("wa", wait=0)["lease"]["epoch"]

            def chained() -> None:
                try:
                    got["both"] = wa.complete_and_claim(job, "wa", epoch, {"x": 1},
                                                        lease_s=60)
                except Exception as e:  # reported below
                    got["error"] = e

            thread = threading.Thread(target=chained)
            thread.start()
            with Coordinator.open(target) as c:
                wait_for(lambda: c.show(job)["job"]["status"] == "succeeded", timeout=20)
            first.kill()  # the commit is made, its answer is not sent
            second = Served(target, "--reap-every", "0.2", port=first.port).start()
            thread.join(60)
            assert not thread.is_alive()
            assert "error" not in got, got
            assert got["both"]["completed"]["already_accepted"] is True
            nxt = got["both"]["next"]
            assert nxt["job"]["job_id"] == orphan and nxt["lease"]["epoch"] == 1, nxt
            done = wa.complete(orphan, "wa", 1, {"x": 2})
            assert done["status"] == "succeeded" and not done.get("already_accepted")
        with Coordinator.open(target) as c:
            assert _untouched(c, third)
            _once_each(c)
            claims, _ = _claims_and_completions(c)
        assert sorted(claims) == sorted([(job, 1), (orphan, 1)])
    finally:
        first.stop()
        if second is not None:
            second.stop()


# -- other tenants, other workers, refusals, gates ------------------------------------------


def test_a_refused_chained_completion_claims_nothing(target: Target) -> None:
    """404 for another worker's lease in the token's tenant and for the token's own worker
    id on another tenant's job, 409 for a lease that ran out and for a cancelled job, 400
    for a result over the limit: the waiting job the claim would have taken is untouched,
    and the worker's own next claim still gets it."""
    secret = token(target, "wa", "worker", tenant="alice", worker="wa")
    with Coordinator.open(target) as c:
        for w in ("wa", "wb"):
            c.heartbeat(w, roles=[f"r-{w}"], readings=READINGS)
        theirs = c.enqueue("k", {}, tenant="alice", role="r-wb")["job_id"]
        assert c.claim("wb")["job"]["job_id"] == theirs
        bobs = c.enqueue("k", {}, tenant="bob", role="r-wa")["job_id"]
        assert c.claim("wa")["job"]["job_id"] == bobs
        late = c.enqueue("k", {}, tenant="alice", role="r-wa")["job_id"]
        assert c.claim("wa", lease_s=0.3)["job"]["job_id"] == late
        cancelled = c.enqueue("k", {}, tenant="alice", role="r-wa")["job_id"]
        assert c.claim("wa", tenant="alice")["job"]["job_id"] == cancelled
        c.cancel(cancelled)
        big = c.enqueue("k", {}, tenant="alice", role="r-wa")["job_id"]
        assert c.claim("wa", tenant="alice")["job"]["job_id"] == big
        too_large = "x" * (c.policy.max_result_bytes + 1)
        waiting = c.enqueue("k", {}, tenant="alice", role="r-wa")["job_id"]
    time.sleep(0.5)  # `late`'s lease runs out; nothing reaps it (--reap-every 0)
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        for job, status, code in ((theirs, 404, "job_not_found"), (bobs, 404, "job_not_found"),
                                  (late, 409, "lease_expired"),
                                  (cancelled, 409, "job_cancelled"),
                                  (big, 400, "result_too_large")):
            resp = http.post(f"/v1/jobs/{job}/complete",
                             json={"epoch": 1, "claim_next": True, "lease_s": 60,
                                   "result": too_large if job == big else {}})
            assert resp.status_code == status, (job, resp.text)
            assert resp.json()["error"]["code"] == code
            with Coordinator.open(target) as c:
                assert _untouched(c, waiting)
        got = http.post("/v1/claims", json={}).json()
        assert got["job"]["job_id"] == waiting
    with Coordinator.open(target) as c:
        assert c.show(theirs)["lease"]["worker_id"] == "wb"
        assert c.show(bobs)["job"]["status"] == "running"
        assert not [e for e in c.show(theirs)["events"] + c.show(bobs)["events"]
                    if e["reason"] == "completed"]


def test_a_gated_or_stale_worker_completes_and_its_chained_claim_is_refused(
        target: Target) -> None:
    """The completion is accepted; `next` is the claim's refusal (memory gate, stale
    heartbeat), the waiting job stays waiting."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        gated = c.enqueue("a", {})["job_id"]
        stale = c.enqueue("a", {})["job_id"]
        assert c.claim("wa")["job"]["job_id"] == gated
        assert c.claim("wa")["job"]["job_id"] == stale
        waiting = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        assert http.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 99}}
                         ).status_code == 200
        body = http.post(f"/v1/jobs/{gated}/complete",
                         json={"epoch": 1, "claim_next": True}).json()
        assert body["status"] == "succeeded"
        assert body["next"]["job"] is None and body["next"]["reason"] == "memory_gate"
        with Coordinator.open(target) as c:
            assert _untouched(c, waiting)
            c.heartbeat("wa", readings=READINGS)
            c.db.write(lambda conn: sql(conn, "UPDATE workers SET heartbeat_at = heartbeat_at"
                                              " - 7200000000 WHERE worker_id = 'wa'"))
        body = http.post(f"/v1/jobs/{stale}/complete",
                         json={"epoch": 1, "claim_next": True}).json()
        assert body["status"] == "succeeded"
        assert body["next"]["job"] is None and body["next"]["reason"] == "heartbeat_stale"
    with Coordinator.open(target) as c:
        assert _untouched(c, waiting)


def test_concurrent_chained_completions_by_two_tokens_each_get_a_distinct_own_job(
        target: Target) -> None:
    """8 chained completions at once by one worker token, 8 more by another worker's: every
    completion is accepted, each next job is a different job, leased to the worker that was
    told of it, never to the other; no (job, epoch) is claimed twice."""
    secrets = {w: token(target, w, "worker", worker=w) for w in ("wa", "wb")}
    held: dict[str, list[int]] = {}
    with Coordinator.open(target) as c:
        for w in secrets:
            c.heartbeat(w, readings=READINGS)
            c.enqueue_many([{"kind": "a", "payload": {}} for _ in range(8)])
            held[w] = [g["job"]["job_id"] for g in c.claim_many(w, 8)["claimed"]]
            assert len(held[w]) == 8
        c.enqueue_many([{"kind": "a", "payload": {}} for _ in range(24)])
    answers: list[tuple[str, int, Any]] = []
    with served(target, "--reap-every", "0") as s:
        clients = {w: s.client(secret) for w, secret in secrets.items()}
        start = threading.Barrier(16)

        def chain(w: str, job: int) -> None:
            start.wait()
            resp = clients[w].post(f"/v1/jobs/{job}/complete",
                                   json={"epoch": 1, "claim_next": True})
            answers.append((w, resp.status_code, resp.json()))

        threads = [threading.Thread(target=chain, args=(w, j))
                   for w, jobs in held.items() for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for client in clients.values():
            client.close()
    assert len(answers) == 16 and all(code == 200 for _, code, _ in answers), answers
    nexts = [(w, body["next"]) for w, _, body in answers]
    assert all(n["job"] is not None for _, n in nexts), nexts
    ids = [n["job"]["job_id"] for _, n in nexts]
    assert len(set(ids)) == 16 and not set(ids) & {j for js in held.values() for j in js}
    assert all(n["lease"]["worker_id"] == w for w, n in nexts)
    with Coordinator.open(target) as c:
        for w, n in nexts:
            assert c.show(n["job"]["job_id"])["lease"]["worker_id"] == w
        for jobs in held.values():
            assert all(c.show(j)["job"]["status"] == "succeeded" for j in jobs)
        _once_each(c)


# -- killed and stopped processes -------------------------------------------------------------


def _chained_in_flight(target: Target, tmp: str, sig: int, lease: str
                       ) -> tuple[dict[str, Any], int, int, Any]:
    """A remote worker process (leases of `lease` seconds) whose chained completion is
    committed but not yet answered (the server sits on the answer 3 s) gets `sig`. Returns
    the worker's summary (SIGTERM) or {} (SIGKILL), the two jobs, and the server (still
    running)."""
    from tests.test_serve_workers import finish, start_worker

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        first = c.enqueue("work", {"i": 1})["job_id"]
        second = c.enqueue("work", {"i": 2})["job_id"]
    s = Served(target, "--reap-every", "0.2",
               env={"JOBCOORD_FAULT": "http.complete.after_commit:sleep=3"}).start()
    proc = start_worker(s.url, secret, tmp, "wa", "--lease", lease, "--wait", "1",
                        "--grace", "20")
    try:
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(first)["job"]["status"] == "succeeded", timeout=60)
            shown = c.show(second)
            done = next(e for e in c.show(first)["events"] if e["reason"] == "completed")
            claimed = next(e for e in shown["events"] if e["reason"] == "claimed")
            # Claimed by the completion, in its transaction; the answer is still on its way.
            assert claimed["at"] == done["at"] and shown["lease"]["worker_id"] == "wa"
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(30)
            summary: dict[str, Any] = {}
        else:
            summary, _ = finish(proc, 60)
    except BaseException:
        proc.kill()
        proc.wait(30)
        s.stop()
        raise
    return summary, first, second, s


def test_remote_worker_sigkilled_before_its_chained_answer_the_next_job_is_reaped_and_done(
        target: Target, tmp_path: Any) -> None:
    from tests.test_serve_workers import finish, ledger_violations, start_worker

    _, _, second, s = _chained_in_flight(target, str(tmp_path), signal.SIGKILL, "2")
    try:
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(second)["job"]["status"] == "waiting", timeout=30)
            assert c.show(second)["events"][-1]["reason"] == "lease_expired"
        other = token(target, "wb", "worker", worker="wb")
        summary, _ = finish(start_worker(s.url, other, str(tmp_path), "wb", "--burst",
                                         "--wait", "1"), 120)
        assert summary["completed"] == 1
    finally:
        s.stop()
    with Coordinator.open(target) as c:
        assert not ledger_violations(c, 2), ledger_violations(c, 2)
        assert c.show(second)["job"]["result"]["worker"] == "wb"


def test_remote_worker_sigtermed_before_its_chained_answer_releases_the_next_job_at_once(
        target: Target, tmp_path: Any) -> None:
    summary, first, second, s = _chained_in_flight(target, str(tmp_path), signal.SIGTERM,
                                                   "30")
    s.stop()
    with Coordinator.open(target) as c:
        shown = c.show(second)
    assert summary["completed"] == 1 and summary["released"] == 1, (
        summary, [(e["reason"], e["worker_id"], e["epoch"]) for e in shown["events"]],
        shown["job"]["status"])
    with Coordinator.open(target) as c:
        assert c.show(first)["job"]["status"] == "succeeded"
        assert c.db.read(lambda conn: sql(conn, "SELECT COUNT(*) FROM leases").scalar()) == 0
    assert shown["job"]["status"] == "waiting"
    assert shown["events"][-1]["reason"] == "worker_shutdown"
    assert shown["events"][-1]["worker_id"] == "wa"


def test_server_stopped_past_the_lease_refuses_the_chained_completion_and_claims_nothing(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        assert c.claim("wa", lease_s=1.0)["job"]["job_id"] == job
        waiting = c.enqueue("a", {})["job_id"]
    got: dict[str, Any] = {}
    with served(target, "--reap-every", "0.2") as s, s.client(secret) as http:
        assert http.get("/v1/whoami").status_code == 200  # the connection is open
        s.signal(signal.SIGSTOP)
        try:
            thread = threading.Thread(target=lambda: got.update(resp=http.post(
                f"/v1/jobs/{job}/complete", json={"epoch": 1, "claim_next": True})))
            thread.start()
            time.sleep(2.0)  # longer than the lease; the request waits in the socket
        finally:
            s.signal(signal.SIGCONT)
        thread.join(30)
        resp = got["resp"]
        assert resp.status_code == 409, resp.text
        assert resp.json()["error"]["code"] == "lease_expired"
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(job)["job"]["status"] == "waiting", timeout=20)
            assert _untouched(c, waiting)
            assert not [e for e in c.show(job)["events"] if e["reason"] == "completed"]


# -- limits and capacity ----------------------------------------------------------------------


def test_the_slot_a_chained_completion_frees_is_the_next_jobs(target: Target) -> None:
    """A worker with one slot of capacity, a kind limited to 1 at once: the completion frees
    the limit's slot and the worker's capacity in its transaction, and the chained claim
    takes them."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.set_limit("a", 1)
        c.heartbeat("wa", readings={**READINGS, "capacity": {"slots": 1}})
        first, second, third = (c.enqueue("a", {}, needs={"slots": 1})["job_id"]
                                for _ in range(3))
        assert c.claim("wa")["job"]["job_id"] == first
        c.remove_limit("a")
        assert c.claim("wa")["reason"] == "resource_short"  # the capacity is taken
        c.set_limit("a", 1)
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        refused = http.post("/v1/claims", json={}).json()  # and the limit's slot
        assert refused["job"] is None, refused
        body = http.post(f"/v1/jobs/{first}/complete",
                         json={"epoch": 1, "claim_next": True}).json()
        assert body["status"] == "succeeded" and body["next"]["job"]["job_id"] == second
    with Coordinator.open(target) as c:
        assert _untouched(c, third)


def test_a_tenant_bound_chained_claim_refused_by_a_limit_names_no_other_tenants_holder(
        target: Target) -> None:
    alice = token(target, "wa", "worker", tenant="alice", worker="wa")
    with Coordinator.open(target) as c:
        c.set_limit("k", 1)
        for w in ("wa", "wbob"):
            c.heartbeat(w, roles=[f"r-{w}"], readings=READINGS)
        held = c.enqueue("k", {}, tenant="bob", role="r-wbob")["job_id"]
        assert c.claim("wbob", tenant="bob")["job"]["job_id"] == held
        mine = c.enqueue("other", {}, tenant="alice", role="r-wa")["job_id"]
        assert c.claim("wa", tenant="alice")["job"]["job_id"] == mine
        waiting = c.enqueue("k", {}, tenant="alice", role="r-wa")["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(alice) as http:
        body = http.post(f"/v1/jobs/{mine}/complete",
                         json={"epoch": 1, "claim_next": True}).json()
    assert body["status"] == "succeeded"
    nxt = body["next"]
    assert nxt["job"] is None and nxt["reason"] == "concurrency_limit", nxt
    text = json.dumps(nxt)
    assert "wbob" not in text and "bob" not in text and f"job {held}" not in text, text
    with Coordinator.open(target) as c:
        assert _untouched(c, waiting)


# -- a proxy that drops the answer ------------------------------------------------------------


def test_a_chained_answer_dropped_on_the_wire_hands_the_resent_completion_its_next_job(
        target: Target) -> None:
    """No fault point: a proxy cuts the connection as the chained completion's answer
    arrives. The client sends the completion again at once: `already_accepted`, and `next`
    is the job the lost answer claimed, with the same epoch and lease (renewable), not a
    job leased to nobody until the reaper ends it. With max_attempts=1 that job runs and
    succeeds (it used to end dead without having run); nothing else is claimed, no
    (job, epoch) twice."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("a", {})["job_id"]
        orphan = c.enqueue("a", {}, max_attempts=1)["job_id"]
        third = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0.2") as s:
        proxy = DroppingProxy(s.port, b"/complete")
        try:
            with RemoteCoordinator(f"http://127.0.0.1:{proxy.port}", secret, timeout=10,
                                   retry_s=15) as wa:
                wa.heartbeat("wa", readings=READINGS)
                epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
                both = wa.complete_and_claim(job, "wa", epoch, {"x": 1}, lease_s=30)
                assert proxy.dropped == 1
                assert both["completed"]["already_accepted"] is True
                nxt = both["next"]
                assert nxt["job"]["job_id"] == orphan and nxt["lease"]["epoch"] == 1, nxt
                assert nxt["job"]["attempt"] == 1 and nxt["lease"]["worker_id"] == "wa"
                with Coordinator.open(target) as c:
                    lease = c.show(orphan)["lease"]
                    assert _untouched(c, third)
                assert nxt["lease"]["expires_at"] == lease["expires_at"], (nxt, lease)
                assert wa.renew(orphan, "wa", 1, lease_s=30)["epoch"] == 1
                done = wa.complete(orphan, "wa", 1, {"x": 2})
                assert done["status"] == "succeeded" and not done.get("already_accepted")
        finally:
            proxy.close()
    with Coordinator.open(target) as c:
        _once_each(c)
        assert [e["reason"] for e in c.show(job)["events"]].count("completed") == 1
        shown = c.show(orphan)
        assert shown["job"]["status"] == "succeeded" and shown["job"]["attempts"] == 1
        assert "lease_expired" not in [e["reason"] for e in shown["events"]]


def test_a_resent_chained_completion_hands_back_only_a_next_job_nobody_touched(
        target: Target) -> None:
    """The job a lost chained answer claimed is handed back only while it is exactly as that
    claim left it: not once this worker renewed it (it knew of it: handing it back would
    start it twice), not past its lease, not to another worker (404 as if absent). Then the
    re-sent completion is `already_accepted` with `next: null`, as before."""
    secret = token(target, "wa", "worker", worker="wa")
    other = token(target, "wb", "worker", worker="wb")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        jobs = [c.enqueue("a", {})["job_id"] for _ in range(5)]
    first, renewed, second, expired, third = jobs
    body = {"epoch": 1, "claim_next": True, "result": {}}
    with served(target, "--reap-every", "0") as s:
        proxy = DroppingProxy(s.port, b"/complete", drops=2)
        lossy = httpx.Client(base_url=f"http://127.0.0.1:{proxy.port}",
                             headers={"Authorization": f"Bearer {secret}"}, timeout=10)
        with lossy, s.client(secret) as wa, s.client(other) as wb:
            assert wa.post("/v1/claims", json={"lease_s": 60}).json()["job"]["job_id"] == first
            # Renewed by this worker before the completion is sent again.
            with pytest.raises(httpx.TransportError):
                lossy.post(f"/v1/jobs/{first}/complete", json={**body, "lease_s": 60})
            assert wa.post(f"/v1/jobs/{renewed}/renew",
                           json={"epoch": 1, "lease_s": 60}).status_code == 200
            again = wa.post(f"/v1/jobs/{first}/complete", json={**body, "lease_s": 60})
            assert again.status_code == 200, again.text
            assert again.json()["already_accepted"] is True and again.json()["next"] is None
            # Another worker sending it: as if absent.
            resp = wb.post(f"/v1/jobs/{first}/complete", json={**body, "lease_s": 60})
            assert resp.status_code == 404, resp.text
            assert wa.post(f"/v1/jobs/{renewed}/complete", json={"epoch": 1}).status_code == 200
            # Past the next job's lease.
            assert wa.post("/v1/claims", json={"lease_s": 60}).json()["job"]["job_id"] == second
            with pytest.raises(httpx.TransportError):
                lossy.post(f"/v1/jobs/{second}/complete", json={**body, "lease_s": 0.2})
            time.sleep(0.4)
            again = wa.post(f"/v1/jobs/{second}/complete", json={**body, "lease_s": 0.2})
            assert again.status_code == 200, again.text
            assert again.json()["already_accepted"] is True and again.json()["next"] is None
    with Coordinator.open(target) as c:
        assert c.show(expired)["lease"]["epoch"] == 1  # expired, not reaped (reaper off)
        assert _untouched(c, third)
        _once_each(c)


def test_a_lease_shorter_than_a_microsecond_is_invalid_input_not_an_internal_error(
        target: Target) -> None:
    """`lease_s: 1e-7` passed the range check (above 0) and rounded to a lease of 0 µs,
    which the database's check refused: 500 `internal_error` and, for a chained completion,
    the completion rolled back with it. It is 400 `invalid_input` on every route that takes
    a lease, and in the Python API, before anything is written."""
    from jobcoord.errors import InvalidInput

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        assert c.claim("wa")["job"]["job_id"] == job
        waiting = c.enqueue("a", {})["job_id"]
        for call in (lambda: c.claim("wa", lease_s=1e-7),
                     lambda: c.renew(job, "wa", 1, lease_s=1e-7),
                     lambda: c.complete_and_claim(job, "wa", 1, {}, lease_s=1e-7)):
            try:
                call()
            except InvalidInput as e:
                assert "microsecond" in e.message, e.message
            else:
                raise AssertionError("a lease of 0 µs was taken")
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        for path, body in ((f"/v1/jobs/{job}/complete", {"epoch": 1, "claim_next": True,
                                                          "lease_s": 1e-7}),
                           ("/v1/claims", {"lease_s": 1e-7}),
                           (f"/v1/jobs/{job}/renew", {"epoch": 1, "lease_s": 4e-7})):
            resp = http.post(path, json=body)
            assert resp.status_code == 400, (path, resp.text)
            assert resp.json()["error"]["code"] == "invalid_input", (path, resp.text)
        # One microsecond is a lease (it runs out at once; the reaper offers the job again).
        ok = http.post(f"/v1/jobs/{job}/complete",
                       json={"epoch": 1, "claim_next": True, "lease_s": 1e-6})
        assert ok.status_code == 200, ok.text
        assert ok.json()["next"]["job"]["job_id"] == waiting


def test_server_killed_inside_a_chained_completions_transaction_keeps_neither_half(
        target: Target) -> None:
    """SIGKILL of the server inside the transaction, after the completion's update and
    before the claim's lease is written: neither is kept. The client sends the completion
    again to a new server on the same port and gets a plain acceptance and the same next
    job, each claimed and accepted once."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        assert c.claim("wa")["job"]["job_id"] == job  # around the server: no fault here
        nxt = c.enqueue("a", {})["job_id"]
    first = Served(target, "--reap-every", "0",
                   env={"JOBCOORD_FAULT": "claim.after_take:kill"}).start()
    second = None
    got: dict[str, Any] = {}
    try:
        with RemoteCoordinator(first.url, secret, timeout=30.0, retry_s=60) as wa:
            def chained() -> None:
                try:
                    got["both"] = wa.complete_and_claim(job, "wa", 1, {"x": 1}, lease_s=60)
                except Exception as e:  # reported below
                    got["error"] = e

            thread = threading.Thread(target=chained)
            thread.start()
            assert first.proc is not None
            first.proc.wait(30)
            assert first.proc.returncode == -signal.SIGKILL
            with Coordinator.open(target) as c:
                assert c.show(job)["job"]["status"] == "running"
                assert _untouched(c, nxt)
            second = Served(target, "--reap-every", "0", port=first.port).start()
            thread.join(90)
            assert not thread.is_alive()
        assert "error" not in got, got
        assert got["both"]["completed"]["status"] == "succeeded"
        assert not got["both"]["completed"].get("already_accepted")
        assert got["both"]["next"]["job"]["job_id"] == nxt
        with Coordinator.open(target) as c:
            _once_each(c)
            claims, done = _claims_and_completions(c)
            assert c.show(nxt)["lease"]["worker_id"] == "wa"
        assert sorted(claims) == sorted([(job, 1), (nxt, 1)]) and done == [job]
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_remote_worker_behind_a_proxy_losing_completion_answers_runs_every_job_once(
        target: Target, tmp_path: Any) -> None:
    """A real `jobcoord worker` chaining through a proxy that cuts every third completion's
    answer (six times): every job succeeds, each accepted once, no (job, epoch) claimed
    twice, nothing left leased. The job each lost answer claimed is handed back to the
    completion sent again and run at once under that lease: none is reaped, and with one
    attempt each none ends dead without having run."""
    from tests.test_serve_workers import finish, ledger_violations, start_worker

    n = 30
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "work", "payload": {"i": i}, "max_attempts": 1}
                        for i in range(n)])
    secret = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0.2") as s:
        proxy = DroppingProxy(s.port, b"/complete", drops=6, every=3)
        proc = start_worker(f"http://127.0.0.1:{proxy.port}", secret, str(tmp_path), "wa",
                            "--lease", "10", "--wait", "1")
        try:
            with Coordinator.open(target) as c:
                wait_for(lambda: c.status()["jobs"].get("succeeded", 0) == n, timeout=180,
                         every=0.2)
            proc.send_signal(signal.SIGTERM)
            summary, _ = finish(proc, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            proxy.close()
    assert proxy.dropped == 6
    assert summary["completed"] == n, summary
    with Coordinator.open(target) as c:
        assert not ledger_violations(c, n), ledger_violations(c, n)
        reaped = c.db.read(lambda conn: sql(
            conn, "SELECT COUNT(*) FROM job_events WHERE reason = 'lease_expired'").scalar())
    assert reaped == 0  # every job a lost answer claimed was handed back and run


def test_the_worker_routes_beside_it_take_their_own_json_types_too(target: Target) -> None:
    """The worker's other bodies had the same loose reading: `permanent: "yes"` or `1` on a
    failure sent the job to dead, `wait: true` long-polled a second. 400, nothing changed."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings=READINGS)
        job = c.enqueue("a", {})["job_id"]
        assert c.claim("wa")["job"]["job_id"] == job
        waiting = c.enqueue("a", {})["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        for permanent in ("yes", "true", 1, 0):
            resp = http.post(f"/v1/jobs/{job}/fail",
                             json={"epoch": 1, "error": "e", "permanent": permanent})
            assert resp.status_code == 400, (permanent, resp.text)
        for wait in (True, "1", [1]):
            resp = http.post("/v1/claims", json={"wait": wait})
            assert resp.status_code == 400, (wait, resp.text)
            assert resp.json()["error"]["code"] == "invalid_input"
        assert http.post("/v1/claims", json={"wait": 0}).json()["job"]["job_id"] == waiting
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "running"
        assert c.show(job)["lease"]["epoch"] == 1


def test_submit_and_prune_bodies_take_their_own_json_types_too(target: Target) -> None:
    """Submit read `max_attempts: "3"` or `true` as a number, `delay_s: true` as a second's
    delay and `priority: true` as priority 1; prune read `dry_run: "false"` as a real prune.
    Each is 400 invalid_input now, and nothing changed."""
    submitter = token(target, "sub", "submitter")
    operator = token(target, "op", "operator")
    with Coordinator.open(target) as c:
        done = c.enqueue("a", {})["job_id"]
        c.heartbeat("w", readings=READINGS)
        c.claim("w")
        c.complete(done, "w", 1, {})
    bad_submits = [{"max_attempts": "3"}, {"max_attempts": True}, {"max_attempts": 2.5},
                   {"delay_s": True}, {"delay_s": "5"}, {"deadline_s": True},
                   {"deadline_s": "60"}, {"priority": True}, {"priority": 1.5}]
    with served(target, "--reap-every", "0") as s:
        with s.client(submitter) as http:
            for extra in bad_submits:
                resp = http.post("/v1/jobs", json={"kind": "a", "payload": {}} | extra)
                assert resp.status_code == 400, (extra, resp.text)
                assert resp.json()["error"]["code"] == "invalid_input", (extra, resp.text)
            ok = http.post("/v1/jobs", json={"kind": "a", "payload": {}, "max_attempts": 3,
                                             "delay_s": 0, "deadline_s": 60, "priority": 2})
            assert ok.status_code == 201, ok.text
        with s.client(operator) as http:
            for dry_run in ("false", "true", 0, 1):
                resp = http.post("/v1/prune", json={"older_than": 0, "dry_run": dry_run})
                assert resp.status_code == 400, (dry_run, resp.text)
            for older_than in (True, False):
                resp = http.post("/v1/prune", json={"older_than": older_than})
                assert resp.status_code == 400, (older_than, resp.text)
    with Coordinator.open(target) as c:
        assert c.show(done)["job"]["status"] == "succeeded"  # never pruned
        assert len(c.jobs(limit=100)["jobs"]) == 2  # the good submit only
