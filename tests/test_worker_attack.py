"""The worker runtime under attack, with real leases on a real database: attempts of one job
whose earlier handlers ignore their stop; real `jobcoord worker` processes on both databases
stopped with SIGTERM while handlers ignore it, SIGKILLed at random moments, counting
--max-jobs with batch claims, and grouping results next to handlers that raise or return too
much."""

from __future__ import annotations

import io
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobcoord.app import App, Context
from jobcoord.maintenance import check
from jobcoord.service import Coordinator, JobSpec
from jobcoord.worker.config import WorkerConfig
from jobcoord.worker.log import Log
from jobcoord.worker.loop import Worker
from jobcoord.worker.run import JobRun
from tests.test_worker import wait_for
from tests.timeline import IDLE_ON_AC

pytestmark = pytest.mark.timeout(300)


def test_a_newer_attempt_waits_for_every_earlier_handler_of_its_job_not_only_the_last(
        sqlite_target: Any) -> None:
    # Epoch 1's handler ignores its stop. Epoch 2 waits for it without starting its own
    # handler; its lease ends too, and epoch 3 is claimed while epoch 2's run has not yet
    # noticed. Epoch 3 must still wait for epoch 1's handler, which is running.
    hold = threading.Event()
    entered: list[tuple[int, bool]] = []
    app = App()

    @app.handler("stuck", timeout=600)
    def stuck(_payload: Any, ctx: Context) -> Any:
        entered.append((ctx.epoch, hold.is_set()))
        if ctx.epoch == 1:
            hold.wait(60)  # ignores its stop
        return {"epoch": ctx.epoch}

    c = Coordinator.open(sqlite_target)
    cfg = WorkerConfig(worker_id="w1", handlers={"stuck": app.handlers["stuck"]}, roles=[],
                       lease_s=3.0, heartbeat_s=5.0, reap_s=0.0, poll_s=0.05, concurrency=4)
    w = Worker(c, cfg, Log("w1", "json", io.StringIO()))
    try:
        job = c.enqueue("stuck")["job_id"]
        c.heartbeat("w1", readings=IDLE_ON_AC)

        def start() -> JobRun:
            # As the claim loop starts what it claimed, with the runs alive before the claim.
            live = w.live_runs()
            got = c.claim("w1", lease_s=cfg.lease_s)
            w._start(got["job"], got["lease"], w.clock.boot(), 0.0, live)
            return w.runs[-1]

        first = start()
        wait_for(lambda: entered, 10, "epoch 1's handler")
        # Epoch 1's lease ends (released elsewhere): its run notices at its next renewal,
        # settles, and keeps its slot while the handler ignores the stop.
        c.fail(job, "w1", 1, "gone", reason="worker_shutdown")
        wait_for(lambda: first.reported, 10, "epoch 1's run to settle")
        second = start()
        assert second.predecessor is first
        time.sleep(0.3)  # epoch 2 holds its lease and waits
        c.fail(job, "w1", 2, "gone", reason="worker_shutdown")
        third = start()  # epoch 2's run is still alive: it notices at its renewal
        assert second.thread.is_alive()
        wait_for(lambda: not second.thread.is_alive(), 10, "epoch 2's run to end")
        time.sleep(0.5)
        assert first.thread.is_alive() and not hold.is_set()
        assert [e for e, _ in entered] == [1], (
            "a newer attempt's handler started while epoch 1's was still running")
        hold.set()
        wait_for(lambda: not third.thread.is_alive(), 20, "epoch 3 to finish")
        assert entered == [(1, False), (3, True)]
        assert c.show(job)["job"]["status"] == "succeeded"
        assert c.show(job)["job"]["epoch"] == 3
    finally:
        hold.set()
        for run in list(w.runs):
            run.thread.join(20)
        if w.completer is not None:
            w.completer.close()
        w.calls.shutdown()
        w.slots.close()
        w.handler_threads.close()
        if w.watch is not None:
            w.watch.close()
        c.close()


# --- real worker processes on both databases -----------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


class Proc:
    """A `jobcoord worker --app tests.attack_app:app` process with a JSON log."""

    def __init__(self, target: Any, log: Path, name: str, *args: str) -> None:
        where = (["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url])
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jobcoord", *where, "worker", "--worker-id", name,
                 "--app", "tests.attack_app:app", "--log-format", "json", "--json",
                 "--heartbeat-every", "0.5", "--poll", "0.05", "--reap-every", "0", *args],
                cwd=REPO, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == name:
                out.append(entry)
        return out

    def finish(self, timeout: float = 60) -> tuple[int, dict[str, Any] | None]:
        out, _ = self.proc.communicate(timeout=timeout)
        text = out.decode().strip().splitlines()
        return self.proc.returncode, json.loads(text[-1]) if text else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def procs() -> Any:
    started: list[Proc] = []

    def _start(*args: Any) -> Proc:
        p = Proc(*args)
        started.append(p)
        return p

    yield _start
    for p in started:
        p.kill()


def _reasons(c: Coordinator, job_id: int) -> list[str]:
    return [e["reason"] for e in c.show(job_id)["events"]]


def _books(c: Coordinator) -> None:
    """`check` finds nothing: storage, job counts, leases and every job's event history."""
    found = check(c.db)
    assert found["ok"], found


def test_sigterm_with_concurrency_8_releases_jobs_whose_handlers_ignore_it(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    ledger = str(tmp_path / "ledger")
    ids = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("ignore", {"s": 2.5, "ledger": ledger}) for _ in range(8)])]
    w = procs(target, tmp_path / "w.log", "w1", "--concurrency", "8", "--grace", "0.2",
              "--lease", "30")
    wait_for(lambda: coord.status()["jobs"]["running"] == 8, 30, "8 running")
    time.sleep(0.3)
    w.proc.send_signal(signal.SIGTERM)
    code, summary = w.finish(30)
    assert code == 0 and summary is not None and summary["released"] == 8, summary
    # The handlers returned after the release (they ignore their stop): no result landed.
    assert len(Path(ledger).read_text().splitlines()) == 8
    for j in ids:
        job = coord.show(j)["job"]
        assert job["status"] == "waiting" and job["result"] is None
        assert _reasons(coord, j)[-1] == "worker_shutdown"
        assert "completed" not in _reasons(coord, j)
    _books(coord)


def test_max_jobs_is_exact_when_claims_come_in_batches(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    ledger = str(tmp_path / "ledger")
    coord.enqueue_many([JobSpec("note", {"s": 0.05, "ledger": ledger}) for _ in range(40)])
    w = procs(target, tmp_path / "w.log", "w1", "--concurrency", "8", "--max-jobs", "13")
    code, summary = w.finish(60)
    assert code == 0 and summary is not None and summary["claimed"] == 13, summary
    counts = coord.status()["jobs"]
    assert (counts["succeeded"], counts["waiting"]) == (13, 27), counts
    _books(coord)


def test_a_group_next_to_handlers_that_raise_or_return_too_much(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    ledger = str(tmp_path / "ledger")
    good = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("note", {"s": 0.05, "ledger": ledger}) for _ in range(4)])]
    bad = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("boom", max_attempts=1) for _ in range(2)])]
    large = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("big", {"n": 5000}) for _ in range(2)])]
    small = coord.enqueue("big", {"n": 10})["job_id"]
    w = procs(target, tmp_path / "w.log", "w1", "--concurrency", "8",
              "--max-result-bytes", "big=100", "--burst", "--flush-delay", "0.2")
    code, summary = w.finish(60)
    assert code == 0, summary
    for j in [*good, small]:
        assert coord.show(j)["job"]["status"] == "succeeded"
    for j in bad:
        job = coord.show(j)["job"]
        assert job["status"] == "dead" and "boom" in job["last_error"]
    for j in large:
        job = coord.show(j)["job"]
        assert job["status"] == "dead" and job["result"] is None
        assert _reasons(coord, j)[-1] == "result_too_large"
    _books(coord)


def test_handlers_running_past_their_lease_keep_it_by_renewal(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    ledger = str(tmp_path / "ledger")
    ids = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("note", {"s": 3.0, "ledger": ledger}) for _ in range(4)])]
    w = procs(target, tmp_path / "w.log", "w1", "--concurrency", "4", "--lease", "1.2",
              "--burst")
    code, summary = w.finish(60)
    assert code == 0 and summary is not None and summary["completed"] == 4, summary
    assert not w.events("lease_lost")
    renewed = Counter(e["job_id"] for e in w.events("renewed"))
    assert all(renewed[j] >= 2 for j in ids), renewed
    for j in ids:
        assert coord.show(j)["job"]["epoch"] == 1
    _books(coord)


def test_sigkill_at_random_moments_never_accepts_a_result_twice(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    rng = random.Random(7)
    ledger = str(tmp_path / "ledger")
    n = 60
    ids = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("note", {"s": rng.uniform(0, 0.2), "ledger": ledger}, max_attempts=100)
         for _ in range(n)])]
    for k in range(6):
        w = procs(target, tmp_path / f"w{k}.log", f"w{k}", "--concurrency", "8",
                  "--lease", "1", "--flush-delay", rng.choice(["0.005", "0.1"]))
        time.sleep(rng.uniform(0.4, 1.5))  # start-up, claims, groups, hand-overs
        w.kill()
        time.sleep(1.1)
        coord.reap()
    last = procs(target, tmp_path / "last.log", "last", "--concurrency", "8", "--burst")
    code, _ = last.finish(120)
    assert code == 0
    for j in ids:
        shown = coord.show(j)
        job, events = shown["job"], shown["events"]
        assert job["status"] == "succeeded", job
        completed = [e for e in events if e["reason"] == "completed"]
        assert len(completed) == 1 and completed[0]["epoch"] == job["epoch"]
        assert job["result"] == {"job": j, "epoch": job["epoch"]}
        claims = [e["epoch"] for e in events if e["reason"] == "claimed"]
        assert claims == list(range(1, job["epoch"] + 1))
    _books(coord)


@pytest.mark.parametrize("depth", [65, 5000])
def test_a_result_nested_too_deep_fails_its_attempt_and_spares_its_group(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any, depth: int) -> None:
    # 65 levels: the coordinator refuses the group's input, each item then goes alone.
    # 5000: deeper than the encoder itself can walk.
    ledger = str(tmp_path / "ledger")
    good = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("note", {"s": 0.05, "ledger": ledger}) for _ in range(3)])]
    bad = coord.enqueue("deep", {"depth": depth}, max_attempts=1)["job_id"]
    w = procs(target, tmp_path / "w.log", "w1", "--concurrency", "4", "--burst",
              "--flush-delay", "0.2", "--lease", "5")
    code, summary = w.finish(60)
    assert code == 0, summary
    assert not w.events("internal_error")
    for j in good:
        assert coord.show(j)["job"]["status"] == "succeeded"
    shown = coord.show(bad)
    assert shown["job"]["status"] == "dead", shown["job"]
    assert shown["events"][-1]["reason"] == "invalid_result"
    assert "nested deeper" in shown["job"]["last_error"]
    _books(coord)


def test_sigterm_with_results_waiting_in_a_group_delivers_them_and_releases_the_rest(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    ledger = str(tmp_path / "ledger")
    slow = coord.enqueue("ignore", {"s": 3, "ledger": ledger}, priority=0)["job_id"]
    quick = [j["job_id"] for j in coord.enqueue_many(
        [JobSpec("note", {"s": 0.3, "ledger": ledger}) for _ in range(4)])]
    w = procs(target, tmp_path / "w.log", "w1", "--concurrency", "8", "--grace", "0.2",
              "--flush-delay", "1", "--lease", "30")
    # The quick results wait in a group: the slow run could still join it.
    wait_for(lambda: len(Path(ledger).read_text().splitlines()) >= 4
             if Path(ledger).exists() else False, 30, "the quick handlers to return")
    assert coord.status()["jobs"]["succeeded"] == 0
    w.proc.send_signal(signal.SIGTERM)
    code, summary = w.finish(30)
    assert code == 0 and summary is not None, summary
    assert (summary["completed"], summary["released"]) == (4, 1), summary
    for j in quick:
        assert coord.show(j)["job"]["status"] == "succeeded"
    assert coord.show(slow)["job"]["status"] == "waiting"
    assert _reasons(coord, slow)[-1] == "worker_shutdown"
    _books(coord)


def _deaf(tmp_path: Path) -> str:
    """A command that ignores SIGTERM (and so does what it runs): only SIGKILL stops it."""
    script = tmp_path / "deaf cmd #1.sh"
    script.write_text("#!/bin/sh\ntrap '' TERM\ncat >/dev/null\nexec sleep 300\n")
    script.chmod(0o755)
    return f"deaf='{script}'"


def test_a_command_deaf_to_sigterm_is_released_on_shutdown_within_its_lease(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    """`--kill-grace` (5 s) longer than what was left of the lease (3 s): the worker waited
    out the grace for the command to stop, renewing nothing, and its release was refused
    (lease_expired): the job stayed `running` until the reaper took it back as a used
    attempt (its last: dead). The command is stopped before the lease ends, the job
    released with its attempt kept."""
    job = coord.enqueue("deaf", {}, max_attempts=1)["job_id"]
    w = procs(target, tmp_path / "w.log", "w1", "--exec", _deaf(tmp_path), "--lease", "3",
              "--grace", "0.5")
    wait_for(lambda: coord.show(job)["job"]["status"] == "running", 30, "running")
    time.sleep(1.0)
    w.proc.send_signal(signal.SIGTERM)
    code, summary = w.finish(30)
    assert code == 0 and summary is not None and summary["released"] == 1, summary
    shown = coord.show(job)
    assert shown["job"]["status"] == "waiting", shown["events"]
    assert _reasons(coord, job)[-1] == "worker_shutdown"
    _books(coord)


def test_a_command_deaf_to_sigterm_that_timed_out_fails_as_a_timeout_within_its_lease(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    """Its budget (1 s) spent, the command is stopped; with `--kill-grace` 8 s past the
    lease's end (3 s), the lease ran out during the stop: the reaper offered the job again
    while the command still ran (two handlers of one job at once in two workers), and the
    `timeout` report was refused. The command is killed before the lease ends, and the
    attempt ends as a timeout."""
    job = coord.enqueue("deaf", {}, max_attempts=3)["job_id"]
    w = procs(target, tmp_path / "w.log", "w1", "--exec", _deaf(tmp_path), "--lease", "3",
              "--timeout", "deaf=1", "--kill-grace", "8", "--max-jobs", "1")
    code, summary = w.finish(30)
    assert code == 0 and summary is not None, summary
    reasons = _reasons(coord, job)
    assert reasons[-1] == "timeout" and "fail_refused" not in reasons, reasons
    assert coord.show(job)["job"]["status"] == "waiting"
    _books(coord)


@pytest.mark.parametrize("how", ["tuple_key", "big_int", "deep", "unreadable", "list",
                                 "text"])
def test_a_provenance_that_is_no_json_fails_its_attempt_as_invalid_result(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any, how: str) -> None:
    """A Python handler's provenance with a tuple key, a 5,000-digit number, 3,000 levels
    or a value whose repr raises was an internal error at every report until the lease
    ran out; the reaper then ended the job with no error recorded. It fails the attempt
    as a result that is no JSON does: `invalid_result`, its error saying why. A provenance
    that is no mapping (a list, a string) failed as if the handler had raised the worker's
    own `ValueError` of turning it into one, which pointed at the handler's code."""
    if how == "list":  # pairs are what dict() takes: still a provenance
        ok = coord.enqueue("odd_provenance", {"how": "pairs"}, max_attempts=1)["job_id"]
    job = coord.enqueue("odd_provenance", {"how": how}, max_attempts=1)["job_id"]
    w = procs(target, tmp_path / "w.log", "w1", "--burst", "--lease", "30")
    code, summary = w.finish(60)
    assert code == 0, summary
    assert not w.events("report_error") and not w.events("report_retry")
    shown = coord.show(job)
    assert shown["job"]["status"] == "dead", shown["job"]
    assert shown["events"][-1]["reason"] == "invalid_result", shown["events"][-1]
    assert "provenance" in shown["job"]["last_error"], shown["job"]["last_error"]
    if how == "list":
        good = coord.show(ok)
        assert good["job"]["status"] == "succeeded", good["job"]
        assert good["job"]["provenance"]["reported"] == {"model": "v2"}
    _books(coord)


def test_with_json_what_a_python_handler_prints_never_reaches_stdout(
        coord: Coordinator, target: Any, tmp_path: Path, procs: Any) -> None:
    """`worker --json` promises one JSON object on stdout, its summary; a Python handler's
    print (and a child process it started) went there before it. They go to stderr."""
    job = coord.enqueue("chatty", {})["job_id"]
    w = procs(target, tmp_path / "w.log", "w1", "--burst")
    out, _ = w.proc.communicate(timeout=60)
    assert w.proc.returncode == 0, out
    (line,) = out.decode().splitlines()
    assert json.loads(line)["completed"] == 1
    log = w.log.read_text(encoding="utf-8")
    assert "I am not JSON" in log and "nor this" in log and "a child says so too" in log
    assert coord.show(job)["job"]["status"] == "succeeded"
