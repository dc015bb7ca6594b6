"""Faults between remote workers and `jobcoord serve`: the server SIGKILLed mid-run and
restarted, the server SIGSTOPped past a lease (a partition), a completion's answer lost after
the commit, and a real PostgreSQL restart under the server. Real processes, real signals,
real HTTP."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.errors import Refused
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import DroppingProxy, Served, served, token, wait_for
from tests.test_loops import private_pg
from tests.test_serve_workers import finish, ledger_violations, start_worker

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
        # Another result of that epoch was not the one accepted: refused, alone, chained or
        # in a group, as the core refuses it (and records it).
        with pytest.raises(Refused) as refused:
            wa.complete(job, "wa", epoch, {"answer": 43})
        assert refused.value.code == "job_finished"
        with pytest.raises(Refused) as refused:
            wa.complete_and_claim(job, "wa", epoch, {"answer": 43})
        assert refused.value.code == "job_finished"
        group = wa.complete_many([{"job_id": job, "worker_id": "wa", "epoch": epoch,
                                   "result": {"answer": 43}}])
        assert group["refused"] == 1, group
        assert group["results"][0]["error"]["code"] == "job_finished", group
        # The accepted one sent in a group is still answered as accepted.
        group = wa.complete_many([{"job_id": job, "worker_id": "wa", "epoch": epoch,
                                   "result": {"answer": 42}}])
        assert group["results"][0].get("already_accepted") is True, group
    with Coordinator.open(target) as c:
        shown = c.show(job)
    assert shown["job"]["result"] == {"answer": 42}
    assert [e["reason"] for e in shown["events"]].count("completed") == 1
    # The completion sent again is no new evidence: no refused attempt recorded for it; the
    # three with another result are.
    assert [(e["reason"], e["worker_id"]) for e in shown["events"]].count(
        ("complete_refused", "wa")) == 3


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_failure_answer_lost_after_commit_is_answered_as_accepted(
        target: Target, max_attempts: int) -> None:
    """A failure report whose answer a proxy cut after the commit: the client sends it again
    and is told its failure was the one recorded (`already_accepted`, with the status it
    took the job to: waiting for a retry, or dead on its last attempt), not 409
    `lease_expired` / `job_finished`; the job has one failure and no refused report. Any
    other report of that epoch keeps its refusal, and another worker is told nothing."""
    secret = token(target, "wa", "worker", worker="wa")
    other = token(target, "wb", "worker", worker="wb")
    with Coordinator.open(target) as c:
        job = c.enqueue("work", {}, max_attempts=max_attempts)["job_id"]
    status = "waiting" if max_attempts > 1 else "dead"
    with served(target, "--reap-every", "0") as s:
        proxy = DroppingProxy(s.port, b"/fail")
        try:
            with RemoteCoordinator(f"http://127.0.0.1:{proxy.port}", secret, timeout=10,
                                   retry_s=15) as wa, \
                    RemoteCoordinator(s.url, other, timeout=5.0, retry_s=1) as wb:
                wa.heartbeat("wa", readings={"memory_used_pct": 10})
                epoch = wa.claim("wa", wait=0)["lease"]["epoch"]
                got = wa.fail(job, "wa", epoch, "boom")  # its answer lost, sent again
                assert proxy.dropped == 1
                assert got["already_accepted"] is True, got
                assert got["status"] == status and got["job_id"] == job, got
                assert got["epoch"] == epoch and got["attempt"] == 1, got
                with Coordinator.open(target) as c:
                    shown = c.show(job)
                reasons = [e["reason"] for e in shown["events"]]
                assert shown["job"]["status"] == status and shown["job"]["attempts"] == 1
                assert reasons.count("failed") == 1 and "fail_refused" not in reasons, reasons
                # Another report of that epoch (another error, a permanent one) was not the
                # one recorded: refused as it was before.
                for error, permanent in (("another error", False), ("boom", True)):
                    with pytest.raises(Refused) as refused:
                        wa.fail(job, "wa", epoch, error, permanent=permanent)
                    assert refused.value.code in ("lease_expired", "job_finished")
                # Only that epoch's own worker is told so: to anyone else the job is not there.
                with pytest.raises(Refused) as refused:
                    wb.fail(job, "wb", epoch, "boom")
                assert refused.value.code == "job_not_found"
        finally:
            proxy.close()


def test_a_remote_workers_failure_whose_answer_is_lost_is_counted_failed_not_lost(
        target: Target, tmp_path: Any) -> None:
    """A real `jobcoord worker` whose failure report's answer is cut after the commit: the
    report sent again is accepted, the worker logs `failed` and counts it failed (not
    `report_refused`, not lost)."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("boom", {"i": 1}, max_attempts=1)["job_id"]
    with served(target, "--reap-every", "0") as s:
        proxy = DroppingProxy(s.port, b"/fail")
        try:
            summary, err = finish(start_worker(f"http://127.0.0.1:{proxy.port}", secret,
                                               str(tmp_path), "wa", "--burst", "--wait", "1"),
                                  120)
        finally:
            proxy.close()
    assert proxy.dropped == 1
    assert summary["failed"] == 1 and summary["lost"] == 0, (summary, err[-2000:])
    assert "report_refused" not in err, err[-2000:]
    with Coordinator.open(target) as c:
        shown = c.show(job)
    reasons = [e["reason"] for e in shown["events"]]
    assert shown["job"]["status"] == "dead" and "fail_refused" not in reasons, reasons


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


# -- a --burst worker whose server is gone --------------------------------------------------
#
# A burst worker runs the queue dry for a script and exits: it must not hang on a server that
# is not there. It gives up once its claims have failed for the remote client's retry budget
# (10 s, `RemoteCoordinator.retry_s`) with nothing of its own running, and exits 6 (storage
# unavailable) with the error. A worker without --burst keeps trying, at most every 15 s.

#: The give-up bound (10 s) plus room for a slow machine: the worker must be gone by then.
BURST_EXIT_BOUND_S = 25.0


def _stop(proc: Any, server: Served) -> None:
    """After a test: the worker killed if it still runs, and the server stopped."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=30)
    server.stop()


def handler_started(c: Coordinator, job: int) -> bool:
    """Has the worker's handler of `job` begun (the `slow` handler's first checkpoint)? A job
    shown running is not yet known to its worker: the claim's answer may still be on its
    way, and a server killed then leaves the worker never having heard of it."""
    return any(cp["name"] == "started" for cp in c.show(job)["checkpoints"])


def _wait_exit(proc: Any, bound: float) -> tuple[float, str, str]:
    """Wait up to `bound` seconds for `proc`: (seconds it took, stdout, stderr). A worker still
    running then is killed and the test fails."""
    import subprocess

    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"still running after {bound:g}s: {err.decode()[-2000:]}"
                             ) from None
    return time.monotonic() - t0, out.decode(), err.decode()


def _error_line(out: str) -> dict[str, Any]:
    import json

    return dict(json.loads(out.strip().splitlines()[-1])["error"])


def test_a_burst_worker_with_nothing_listening_exits_6_within_a_bound(tmp_path: Any) -> None:
    from tests.test_loops import _free_port

    port = _free_port()  # bound once and closed: nothing listens there
    proc = start_worker(f"http://127.0.0.1:{port}", "no-such-token", str(tmp_path), "wa",
                        "--burst")
    took, out, err = _wait_exit(proc, BURST_EXIT_BOUND_S)
    assert proc.returncode == 6, (proc.returncode, err[-2000:])
    assert _error_line(out)["code"] == "server_unreachable", out
    assert took < BURST_EXIT_BOUND_S


def test_a_burst_worker_whose_server_is_killed_while_it_waits_exits_6_within_a_bound(
        target: Target, tmp_path: Any) -> None:
    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    s = Served(target, "--reap-every", "0").start()
    proc = start_worker(s.url, secret, str(tmp_path), "wa", "--burst", "--wait", "20")
    try:
        # Started and in its long-poll (nothing to claim, the poll waits up to 20 s).
        with Coordinator.open(target) as c:
            wait_for(lambda: any(w["worker_id"] == "wa" for w in c.workers()["workers"]),
                     timeout=30)
        time.sleep(1.0)
        assert proc.poll() is None
        s.kill()  # SIGKILL: nothing listens on the port any more
        took, out, err = _wait_exit(proc, BURST_EXIT_BOUND_S)
    finally:
        _stop(proc, s)
    assert proc.returncode == 6, (proc.returncode, err[-2000:])
    error = _error_line(out)
    assert error["code"] == "server_unreachable" and "--burst" in error["message"], error
    assert took < BURST_EXIT_BOUND_S, took
    events = [e["event"] for e in log_events(err)]
    assert events.count("giving_up") == 1, events
    assert "claim_error" in events[:events.index("giving_up")], events
    assert "claim_error" not in events[events.index("giving_up"):], events


def test_a_burst_worker_whose_server_dies_mid_job_stops_the_job_at_its_lease_end_and_exits_6(
        target: Target, tmp_path: Any) -> None:
    """A job of its own is kept until its lease ends (the server may come back and take the
    result until then); then the handler is stopped, and the worker gives up as above."""
    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("slow", {"sleep": 60})["job_id"]
    s = Served(target, "--reap-every", "0").start()
    proc = start_worker(s.url, secret, str(tmp_path), "wa", "--burst", "--lease", "3")
    try:
        with Coordinator.open(target) as c:
            wait_for(lambda: handler_started(c, job), timeout=30)
        s.kill()
        took, out, err = _wait_exit(proc, 3 + 10 + BURST_EXIT_BOUND_S)
    finally:
        _stop(proc, s)
    assert proc.returncode == 6, (proc.returncode, err[-2000:])
    assert _error_line(out)["code"] == "server_unreachable", out
    assert took < 3 + 10 + BURST_EXIT_BOUND_S, took
    events = log_events(err)
    names = [e["event"] for e in events]
    assert names.count("giving_up") == 1 and "claimed" not in names[1 + names.index(
        "claimed"):], names
    assert names.index("lease_lost") < names.index("giving_up"), names
    assert "claim_error" not in names[names.index("giving_up"):], names


def test_a_worker_stopped_while_its_server_is_down_gives_up_its_release_and_counts_it_lost(
        target: Target, tmp_path: Any) -> None:
    """SIGTERM to a remote worker mid-job, its server killed: the release could not be
    sent, and its report kept retrying until the lease's end (60 s here) while the stop
    waited 11 s for it, then closed the client under it; the summary counted the job
    nowhere (claimed 1, everything else 0) and an `internal_error` ("this
    RemoteCoordinator was closed") followed `stopped_worker`. A release that cannot be sent
    is given up within moments (the lease ends and the reaper takes the job back): logged
    `report_error`, counted lost, and the worker exits 0 well within its stop."""
    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("slow", {"sleep": 120})["job_id"]
    s = Served(target, "--reap-every", "0").start()
    proc = start_worker(s.url, secret, str(tmp_path), "wa", "--lease", "60", "--grace", "1",
                        "--kill-grace", "1")
    try:
        with Coordinator.open(target) as c:
            wait_for(lambda: handler_started(c, job), timeout=30)
        s.kill()
        proc.send_signal(signal.SIGTERM)
        took, out, err = _wait_exit(proc, 30)
    finally:
        _stop(proc, s)
    assert proc.returncode == 0, (proc.returncode, err[-2000:])
    events = log_events(err)
    names = [e["event"] for e in events]
    assert names[-1] == "stopped_worker", [(e["event"], e.get("error")) for e in events]
    assert "internal_error" not in names, [e for e in events if e["event"] == "internal_error"]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["claimed"] == 1 and summary["lost"] == 1, summary
    assert took < 1 + 1 + 10 + 5, took  # grace, kill grace, the wait for its report


def _cpu_s(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_worker_without_burst_keeps_trying_quietly_and_resumes_when_the_server_returns(
        target: Target, tmp_path: Any) -> None:
    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    first = Served(target, "--reap-every", "0").start()
    port = first.port
    proc = start_worker(first.url, secret, str(tmp_path), "wa", "--wait", "5")
    second = None
    try:
        with Coordinator.open(target) as c:
            wait_for(lambda: any(w["worker_id"] == "wa" for w in c.workers()["workers"]),
                     timeout=30)
        first.kill()
        cpu0 = _cpu_s(proc.pid)
        time.sleep(15.0)  # longer than a burst worker's bound: this one stays
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert _cpu_s(proc.pid) - cpu0 < 2.0, "the worker spins while the server is gone"
        second = Served(target, "--reap-every", "0", port=port).start()
        with Coordinator.open(target) as c:
            job = c.enqueue("work", {"i": 1})["job_id"]
            wait_for(lambda: c.show(job)["job"]["status"] == "succeeded", timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        first.stop()
        if second is not None:
            second.stop()
    assert proc.returncode == 0, err.decode()[-2000:]
    events = log_events(err.decode())
    errors = [e for e in events if e["event"] == "claim_error"]
    # Each retry says how long the outage has lasted, the waits double (at most 15 s), and
    # the outage's end is said once.
    # The worker's log with a failure: once, in a full run, it held no claim_error at all.
    assert 3 <= len(errors) <= 20, (len(errors), err.decode()[-4000:])
    assert errors[-1]["failing_s"] >= 10 and errors[-1]["retry_in_s"] <= 15
    back = [e for e in events if e["event"] == "claim_recovered"]
    assert len(back) == 1 and back[0]["failed_s"] >= 15 and back[0]["errors"] == len(errors)


def test_a_remote_handler_is_stopped_at_its_lease_end_while_a_renewal_hangs_in_a_partition(
        target: Target, tmp_path: Any) -> None:
    """A renewal to a server that hears nothing (SIGSTOPped: a partition) must not hold the
    lease keeper past the lease's end: a call's own timeout and retries are longer than a
    short lease, and a handler still running then runs beside the job's next attempt."""
    from datetime import datetime

    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("slow", {"sleep": 60})["job_id"]
    s = Served(target, "--reap-every", "0").start()
    proc = start_worker(s.url, secret, str(tmp_path), "wa", "--lease", "3")
    try:
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(job)["job"]["status"] == "running", timeout=30)
        time.sleep(1.5)  # a renewal or two through
        s.signal(signal.SIGSTOP)
        time.sleep(7.0)  # past the lease (3 s), within a call's timeout and retries
        s.signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        _stop(proc, s)
    events = log_events(err.decode())

    def at(e: dict[str, Any]) -> float:
        return datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()

    renewed = [at(e) for e in events if e["event"] in ("claimed", "renewed")]
    lost = [at(e) for e in events if e["event"] == "lease_lost"]
    assert renewed and lost, [e["event"] for e in events]
    # Renewals are timed from before they are sent: the lease ends at most 3 s after the
    # last one logged; the keeper looks at least every 0.25 s or so.
    assert lost[0] - max(r for r in renewed if r < lost[0]) < 3.0 + 1.0, events


def test_a_claim_answered_after_its_local_lease_end_runs_its_job_once_the_lease_is_confirmed(
        target: Target, tmp_path: Any) -> None:
    """A long-polling claim held by a stalled server (SIGSTOPped longer than a lease) is
    answered once the server resumes: the job was leased by the server just then, but by
    the worker's count from when the claim was sent the lease is over. The worker renews
    before starting the handler (the coordinator decides, not the local count), and the
    job runs once: never dropped to be reaped with its only attempt used unrun."""
    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    s = Served(target, "--reap-every", "1").start()
    proc = start_worker(s.url, secret, str(tmp_path), "wa", "--lease", "4", "--wait", "2")
    try:
        wait_for(lambda: s.proc.poll() is None and _claims_waiting(s), timeout=30)
        time.sleep(1.0)  # the worker's long-poll is in flight
        s.signal(signal.SIGSTOP)
        try:
            time.sleep(0.3)
            with Coordinator.open(target) as c:  # beside the stopped server, not through it
                job = c.enqueue("slow", {"i": 1, "sleep": 0.5}, max_attempts=1)["job_id"]
            time.sleep(6.0)  # longer than the lease
        finally:
            s.signal(signal.SIGCONT)
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(job)["job"]["status"] in ("succeeded", "dead"), timeout=30)
            shown = c.show(job)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        _stop(proc, s)
    events = log_events(err.decode())
    assert shown["job"]["status"] == "succeeded", (shown, [e["event"] for e in events])
    assert shown["job"]["attempts"] == 1 and shown["job"]["result"]["epoch"] == 1
    names = [e["event"] for e in events]
    assert "lease_confirmed" in names and "lease_lost" not in names, "\n".join(
        str(e) for e in events)


def _claims_waiting(s: Served) -> bool:
    """The worker has heartbeated (and so begun to claim) through this server."""
    with Coordinator.open(s.target) as c:
        return bool(c.workers()["workers"])


@contextlib.contextmanager
def _write_lock(target: Target) -> Iterator[None]:
    """Another process's lock on the database for as long as the block runs: SQLite's write
    lock, or PostgreSQL's exclusive locks on the workers and jobs tables (every heartbeat,
    claim and submission waits for them)."""
    if target.sqlite_path is not None:
        import sqlite3

        blocker = sqlite3.connect(target.sqlite_path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        return
    from sqlalchemy import create_engine, text

    engine = create_engine(target.url)
    try:
        with engine.connect() as conn:
            conn.execute(text("LOCK TABLE workers, jobs IN ACCESS EXCLUSIVE MODE"))
            try:
                yield
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def test_a_locked_database_is_answered_503_within_a_clients_timeout_and_a_burst_worker_exits_5(
        target: Target, tmp_path: Any) -> None:
    """The server's wait for a locked database is bounded below a remote client's timeout
    (10 s): the client hears `database_locked` (503, Retry-After) and a --burst worker exits
    5 as a local one does, not 6 for a server it could not reach; a request whose client has
    long given up does not hold a server thread for half a minute."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.test_serve_workers import log_events

    secret = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")

    def write(i: int) -> tuple[int, str, float]:
        t0 = time.monotonic()
        if i % 2:
            raw = httpx.post(f"{s.url}/v1/heartbeat", json={}, timeout=60,
                             headers={"Authorization": f"Bearer {secret}"})
        else:
            raw = httpx.post(f"{s.url}/v1/jobs", json={"kind": "work", "payload": {}},
                             timeout=60, headers={"Authorization": f"Bearer {sub}"})
        code = raw.json()["error"]["code"] if raw.status_code == 503 else raw.text
        assert raw.status_code != 503 or raw.headers["Retry-After"]
        return raw.status_code, code, time.monotonic() - t0

    # The reaper's own writes wait on the lock too: requests queued behind them as well.
    with served(target, "--reap-every", "1") as s, _write_lock(target):
        time.sleep(1.5)
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(write, range(6)))
        for status, code, took in answers:
            assert (status, code) == (503, "database_locked"), answers
            assert took < 8.0, answers
        proc = start_worker(s.url, secret, str(tmp_path), "wa", "--burst")
        try:
            _took, out, err = _wait_exit(proc, 90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    assert proc.returncode == 5, (proc.returncode, err[-2000:])
    assert _error_line(out)["code"] == "database_locked", out
    assert "giving_up" in [e["event"] for e in log_events(err)]


def test_requests_queued_for_a_server_thread_are_answered_503_within_their_budget(
        target: Target) -> None:
    """The 3 s a request may spend on a locked database counts from when the request asked
    for a server thread, not from its first try: with more writes than threads (8), a write
    that waited for a thread is not given a fresh budget of its own (24 writes: the slowest
    took 15 s, past a client's 10 s timeout; about 5 s now, bounded below the timeout with
    room for a loaded machine). One that waited its whole budget in the queue is answered
    `server_busy` without a try."""
    from concurrent.futures import ThreadPoolExecutor

    sub = token(target, "sub", "submitter")

    def write(_i: int) -> tuple[int, str, float]:
        t0 = time.monotonic()
        raw = httpx.post(f"{s.url}/v1/jobs", json={"kind": "work", "payload": {}},
                         timeout=60, headers={"Authorization": f"Bearer {sub}"})
        code = raw.json()["error"]["code"] if raw.status_code == 503 else raw.text
        assert raw.status_code != 503 or raw.headers["Retry-After"]
        return raw.status_code, code, time.monotonic() - t0

    with served(target) as s, _write_lock(target), ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(write, range(24)))
    assert {(status, code) for status, code, _ in answers} <= {
        (503, "database_locked"), (503, "server_busy")}, answers
    assert max(took for _, _, took in answers) < 8.0, sorted(a[2] for a in answers)
    with Coordinator.open(target) as c:
        assert c.jobs()["jobs"] == []


def test_a_request_stalled_with_server_threads_free_is_tried_not_answered_server_busy(
        target: Target) -> None:
    """A server process stalled (stopped, paused, swapped out) for longer than the 3 s busy
    budget just after a request asked for a thread, with every thread free: the request
    waited for no thread, so it is tried with its whole budget. It was answered 503
    `server_busy` ("no server thread was free"), and a worker's long-poll claim answered
    that way lost the job it was about to be handed."""
    sub = token(target, "sub", "submitter")
    with served(target, "--reap-every", "0",
                env={"JOBCOORD_FAULT": "http.asked_thread:sleep=3.5"}) as s:
        raw = httpx.post(f"{s.url}/v1/jobs", json={"kind": "work", "payload": {}},
                         timeout=60, headers={"Authorization": f"Bearer {sub}"})
    assert raw.status_code == 201, raw.text
    with Coordinator.open(target) as c:
        assert [j["kind"] for j in c.jobs()["jobs"]] == ["work"]


def test_a_submission_whose_answer_is_lost_is_sent_again_only_with_an_idempotency_key(
        target: Target) -> None:
    """The remote client sent every call again after a network error, a submission without
    an idempotency key too: one `enqueue` whose answer a proxy cut after the commit made two
    jobs. Without a key it is not sent again: the client says the answer was lost (the job
    may exist); with a key it is, and the server answers with the same job."""
    from jobcoord.errors import StorageUnavailable

    secret = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0") as s:
        proxy = DroppingProxy(s.port, b"POST /v1/jobs ", drops=2)
        try:
            with RemoteCoordinator(f"http://127.0.0.1:{proxy.port}", secret, timeout=10,
                                   retry_s=15) as ci:
                with pytest.raises(StorageUnavailable) as lost:
                    ci.enqueue("unkeyed", {"once": True})
                assert "idempotency key" in lost.value.message, lost.value.to_json()
                got = ci.enqueue("keyed", {"once": True}, key="doc-42")
                assert proxy.dropped == 2
        finally:
            proxy.close()
        with Coordinator.open(target) as c:
            kinds = sorted(j["kind"] for j in c.jobs()["jobs"])
    assert kinds == ["keyed", "unkeyed"], kinds  # one job each, whatever was lost
    assert got["created"] is False  # the answer to the key sent again: the same job


def test_an_idempotency_key_a_header_cannot_carry_is_refused_not_garbled(
        target: Target) -> None:
    """A non-ASCII key (`ключ`) went into the header as UTF-8 and was stored as the Latin-1
    reading of those bytes: the same key through the CLI and HTTP made two jobs, and the
    remote client raised UnicodeEncodeError. HTTP refuses it (400) and the client says why
    (InvalidInput), nothing stored."""
    from jobcoord.errors import InvalidInput

    secret = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0") as s:
        with s.client(secret) as h:
            resp = h.post("/v1/jobs", json={"kind": "k", "payload": {}},
                          headers={"Idempotency-Key": "ключ".encode()})
            assert resp.status_code == 400, resp.text
            assert "Idempotency-Key" in resp.json()["error"]["message"]
        with RemoteCoordinator(s.url, secret, timeout=10) as ci, \
                pytest.raises(InvalidInput):
            ci.enqueue("k", {}, key="ключ")
    with Coordinator.open(target) as c:
        assert c.jobs()["jobs"] == []


def test_an_empty_idempotency_key_is_refused_as_the_cli_refuses_it(target: Target) -> None:
    """An `Idempotency-Key` header sent with an empty value is not taken for no key (each
    submission sent again would make another job): refused 400 as `enqueue --key ''` and
    the Python API refuse it (exit 2), nothing stored. (curl's `-H 'Idempotency-Key: '`
    sends no such header at all; `-H 'Idempotency-Key;'` sends it empty.)"""
    secret = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0") as s, s.client(secret) as h:
        resp = h.post("/v1/jobs", json={"kind": "k", "payload": {}},
                      headers={"Idempotency-Key": ""})
        assert resp.status_code == 400, resp.text
        assert "key" in resp.json()["error"]["message"]
    with Coordinator.open(target) as c:
        assert c.jobs()["jobs"] == []
