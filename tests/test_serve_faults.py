"""Faults between remote workers and `jobcoord serve`: the server SIGKILLed mid-run and
restarted, the server SIGSTOPped past a lease (a partition), a completion's answer lost after
the commit, and a real PostgreSQL restart under the server. Real processes, real signals,
real HTTP."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.errors import Refused
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import Served, served, token, wait_for
from tests.test_loops import private_pg
from tests.test_serve_workers import ledger_violations, start_worker

__all__ = ["private_pg"]  # the throwaway-cluster fixture, used below


def _succeeded(target: Target) -> int:
    with Coordinator.open(target) as c:
        return int(c.status()["jobs"]["succeeded"])


def test_server_killed_mid_run_and_restarted_loses_nothing(target: Target, tmp_path: Any
                                                          ) -> None:
    n_jobs = 200
    with Coordinator.open(target) as c:
        # Each job takes a little while (a checkpoint and 30 ms), so the run lasts well past
        # the moment the server is killed however fast the server commits.
        c.enqueue_many([{"kind": "slow", "payload": {"i": i, "sleep": 0.03}}
                        for i in range(n_jobs)])
    secrets = [token(target, f"w{i}", "worker", worker=f"w{i}") for i in range(4)]
    first = Served(target, "--reap-every", "0.5").start()
    port = first.port
    # Short leases: a claim whose answer died with the server is reaped and offered again.
    workers = [start_worker(first.url, s, str(tmp_path), f"w{i}", "--lease", "3",
                            "--wait", "2", "--heartbeat-every", "1")
               for i, s in enumerate(secrets)]
    second = None
    try:
        wait_for(lambda: _succeeded(target) >= n_jobs // 4, timeout=60)
        first.kill()  # SIGKILL: no shutdown, answers in flight are lost
        killed_at = _succeeded(target)
        assert killed_at < n_jobs, "the run ended before the server could be killed"
        time.sleep(1.0)
        second = Served(target, "--reap-every", "0.5", port=port).start()
        wait_for(lambda: _succeeded(target) == n_jobs, timeout=120, every=0.2)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.communicate(timeout=60)
        first.stop()
        if second is not None:
            second.stop()
    with Coordinator.open(target) as c:
        assert not ledger_violations(c, n_jobs), ledger_violations(c, n_jobs)
    if target.sqlite_path:
        from tests.invariants import assert_invariants

        assert_invariants(target.sqlite_path)


def test_server_stopped_past_a_lease_reaps_after_resume_and_refuses_the_late_completion(
        target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    other = token(target, "wb", "worker", worker="wb")
    with Coordinator.open(target) as c:
        job = c.enqueue("work", {})["job_id"]
    with served(target, "--reap-every", "0.2") as s, \
            RemoteCoordinator(s.url, secret, retry_s=0.5, timeout=5) as wa, \
            RemoteCoordinator(s.url, other, retry_s=0.5, timeout=5) as wb:
        wa.heartbeat("wa", readings={"memory_used_pct": 10})
        got = wa.claim("wa", lease_s=1.0, wait=0)
        assert got["job"]["job_id"] == job
        epoch = got["lease"]["epoch"]
        s.signal(signal.SIGSTOP)  # a partition: the server hears nothing, answers nothing
        try:
            time.sleep(2.0)  # longer than the lease
        finally:
            s.signal(signal.SIGCONT)
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(job)["job"]["status"] == "waiting", timeout=20)
        with pytest.raises(Refused) as late:
            wa.complete(job, "wa", epoch, {"late": True})
        assert late.value.code == "lease_expired"
        raw = httpx.post(f"{s.url}/v1/jobs/{job}/complete", json={"epoch": epoch},
                         headers={"Authorization": f"Bearer {secret}"})
        assert raw.status_code == 409 and raw.json()["error"]["code"] == "lease_expired"
        wb.heartbeat("wb", readings={"memory_used_pct": 10})
        again = wb.claim("wb", wait=5)
        assert again["job"]["job_id"] == job and again["lease"]["epoch"] == epoch + 1
        wb.complete(job, "wb", epoch + 1, {"by": "wb"})
    with Coordinator.open(target) as c:
        shown = c.show(job)
    assert shown["job"]["status"] == "succeeded" and shown["job"]["result"] == {"by": "wb"}
    reasons = [e["reason"] for e in shown["events"]]
    assert reasons.count("completed") == 1 and "complete_refused" in reasons


def test_completion_answer_lost_after_commit_is_answered_as_accepted(target: Target) -> None:
    secret = token(target, "wa", "worker", worker="wa")
    other = token(target, "wb", "worker", worker="wb")
    with Coordinator.open(target) as c:
        job = c.enqueue("work", {})["job_id"]
    # The server commits the completion, then sits on the answer past the client's timeout.
    env = {"JOBCOORD_FAULT": "http.complete.after_commit:sleep=3"}
    with served(target, "--reap-every", "0", env=env) as s, \
            RemoteCoordinator(s.url, secret, timeout=1.0, retry_s=15) as wa, \
            RemoteCoordinator(s.url, other, timeout=5.0, retry_s=1) as wb:
        wa.heartbeat("wa", readings={"memory_used_pct": 10})
        epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
        done = wa.complete(job, "wa", epoch, {"answer": 42})  # times out once, sent again
        assert done["status"] == "succeeded" and done["epoch"] == epoch
        assert done.get("already_accepted") is True
        # Only that epoch's own worker is told so: to anyone else the job is not there.
        with pytest.raises(Refused) as refused:
            wb.complete(job, "wb", epoch, {"answer": 0})
        assert refused.value.code == "job_not_found"
    with Coordinator.open(target) as c:
        shown = c.show(job)
    assert shown["job"]["result"] == {"answer": 42}
    assert [e["reason"] for e in shown["events"]].count("completed") == 1


def test_serve_and_remote_worker_survive_a_real_postgresql_restart(
        private_pg: Any, tmp_path: Any) -> None:
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    url, restart = private_pg
    target = resolve_target(url=url)
    db = Database.open(target, create=True)
    migrate(db)
    db.close()
    sub = token(target, "sub", "submitter")
    wa = token(target, "wa", "worker", worker="wa")

    def status(job: int) -> str:
        with Coordinator.open(target) as c:
            return str(c.show(job)["job"]["status"])

    def submit(http: httpx.Client, n: int) -> int:
        end = time.monotonic() + 30
        while True:
            resp = http.post("/v1/jobs", json={"kind": "work", "payload": {"i": n}})
            if resp.status_code == 201:
                return int(resp.json()["job_id"])
            # While the database restarts: unavailable, with a hint when to come back.
            assert resp.status_code == 503 and "Retry-After" in resp.headers, resp.text
            assert time.monotonic() < end
            time.sleep(0.2)

    with served(target, "--reap-every", "0.3") as s, s.client(sub) as http:
        worker = start_worker(s.url, wa, str(tmp_path), "wa", "--lease", "5")
        try:
            before = submit(http, 1)
            wait_for(lambda: status(before) == "succeeded", timeout=30)
            restart()  # every connection of the server and the worker's server is cut
            after = submit(http, 2)
            wait_for(lambda: status(after) == "succeeded", timeout=60)
            with Coordinator.open(target) as c:  # an expired lease, for the reaper timer
                c.heartbeat("ghost", roles=["ghost"], readings={"memory_used_pct": 10})
                ghost = c.enqueue("work", {}, role="ghost")["job_id"]
                c.claim("ghost", lease_s=0.5)
            wait_for(lambda: status(ghost) == "waiting", timeout=30)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.communicate(timeout=60)
        assert worker.returncode == 0
