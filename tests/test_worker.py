"""The worker runtime with real worker processes, real handlers, real signals (SQLite).

Each test starts `python -m jobcoord --db DB worker ...` from the repository root (so
`examples.handlers:app` and `examples/*.py` resolve) with a JSON decision log, and watches the
database and the log. Waits poll in small steps and are bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from examples import remote_service
from jobcoord.service import Coordinator
from tests.conftest import run_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
CMD = f"{PY} examples/summarize_cmd.py"

pytestmark = pytest.mark.timeout(60)


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what}")


class Worker:
    def __init__(self, db: str, log: str, name: str, args: tuple[str, ...],
                 global_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 where: tuple[str, ...] | None = None):
        self.name = name
        self.log = log
        # `where`: the database as the CLI names it (`--url URL` for PostgreSQL).
        where = ("--db", db) if where is None else where
        argv = [PY, "-m", "jobcoord", *where, *global_args, "worker", "--worker-id", name,
                "--log-format", "json", "--json", "--heartbeat-every", "0.5", "--poll", "0.05",
                "--reap-every", "0", *args]
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                                         stdin=subprocess.DEVNULL,
                                         env=None if env is None else {**os.environ, **env})

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        with open(self.log, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if name is None or entry["event"] == name:
                    out.append(entry)
        return out

    def wait_event(self, name: str, timeout: float = 15.0, **match: Any) -> dict[str, Any]:
        def found() -> Any:
            for e in self.events(name):
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            if self.proc.poll() is not None and name != "stopped_worker":
                with open(self.log, encoding="utf-8") as f:
                    raise AssertionError(f"worker exited {self.proc.returncode}: {f.read()}")
            return None

        return wait_for(found, timeout, f"{name} {match} in {self.name}'s log")

    def finish(self, timeout: float = 20.0) -> tuple[int, dict[str, Any] | None]:
        out, _ = self.proc.communicate(timeout=timeout)
        text = out.decode().strip()
        return self.proc.returncode, json.loads(text) if text else None


@pytest.fixture
def db(sqlite_target: Any) -> Iterator[tuple[str, Coordinator]]:
    c = Coordinator.open(sqlite_target)
    yield sqlite_target.sqlite_path, c
    c.close()


@pytest.fixture
def start(db: tuple[str, Coordinator], tmp_path: Any) -> Iterator[Callable[..., Worker]]:
    procs: list[Worker] = []

    def _start(*args: str, name: str = "w1", global_args: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> Worker:
        w = Worker(db[0], str(tmp_path / f"{name}.log"), name, args, global_args, env)
        procs.append(w)
        return w

    yield _start
    for w in procs:
        if w.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                w.proc.send_signal(sig)
            w.proc.wait(10)


APP = ("--app", "examples.handlers:app")


def running(c: Coordinator, job_id: int) -> dict[str, Any] | None:
    shown = c.show(job_id)
    return shown["lease"] if shown["job"]["status"] == "running" else None


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split(") ")[1].startswith("Z")


# --- outcomes ---------------------------------------------------------------------------------


def test_python_handler_worker_completes_jobs_with_epoch_and_provenance(db, start):
    _, c = db
    ids = [c.enqueue("summarize", {"text": f"doc {i} says hello to the whole wide world"})
           ["job_id"] for i in range(3)]
    w = start(*APP, "--burst")
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 3 and summary["claimed"] == 3
    for job_id in ids:
        job = c.show(job_id)["job"]
        assert job["status"] == "succeeded" and job["result"]["words"] == 9
        prov = job["provenance"]
        assert prov["worker"] == "w1" and prov["host"] and prov["jobcoord"]
        assert prov["handler"] == {"kind": "summarize", "type": "python",
                                   "callable": "examples.handlers:summarize"}
        assert prov["epoch"] == 1 and prov["duration_s"] >= 0
        assert prov["reported"]["model"] == "tiny-summarizer"
    claimed = {e["job_id"]: e for e in w.events("claimed")}
    completed = {e["job_id"]: e for e in w.events("completed")}
    assert set(claimed) == set(completed) == set(ids)
    assert all(e["epoch"] == 1 and "claim_ms" in e for e in claimed.values())


@pytest.mark.parametrize("batch", [("--no-batch",), ()])
def test_a_worker_with_a_tenant_claims_only_that_tenants_jobs(db, start, batch):
    _, c = db
    # Other tenants' jobs first in claim order (older, higher priority): never claimed.
    others = [c.enqueue("summarize", {"text": "not yours"}, tenant=t, priority=0)["job_id"]
              for t in ("bob", "default")]
    alices = [c.enqueue("summarize", {"text": f"doc {i}"}, tenant="alice")["job_id"]
              for i in range(3)]
    w = start(*APP, "--tenant", "alice", "--concurrency", "2", *batch, "--burst")
    code, summary = w.finish()
    assert code == 0 and summary["claimed"] == 3 and summary["completed"] == 3, summary
    assert {e["job_id"] for e in w.events("claimed")} == set(alices)
    assert all(c.show(j)["job"]["status"] == "succeeded" for j in alices)
    assert all(c.show(j)["job"]["status"] == "waiting" for j in others)


def test_command_worker_completes_fails_with_stderr_tail_and_exit_65_is_permanent(db, start):
    _, c = db
    ok = c.enqueue("summarize", {"text": "one two three four five six"})["job_id"]
    failing = c.enqueue("summarize", {"fail": "CUDA out of memory"})["job_id"]
    bad = c.enqueue("summarize", {"bad": True})["job_id"]
    w = start("--exec", f"summarize={CMD}", "--burst")
    code, summary = w.finish()
    assert code == 0, summary
    job = c.show(ok)["job"]
    assert job["status"] == "succeeded"
    assert job["result"] == {"summary": "one two three four five", "pad": "", "job": str(ok)}
    assert job["provenance"]["reported"]["model"] == "cmd-summarizer"
    assert job["provenance"]["handler"]["type"] == "command"
    failed = c.show(failing)
    assert failed["job"]["status"] == "waiting"  # retried after backoff
    assert "exit code 3" in failed["job"]["last_error"]
    assert "error: CUDA out of memory" in failed["job"]["last_error"]
    assert failed["events"][-1]["reason"] == "failed"
    dead = c.show(bad)["job"]
    assert dead["status"] == "dead" and "exit code 65" in dead["last_error"]


@pytest.mark.parametrize("sig", [9, 15, 11])
def test_a_command_killed_by_a_signal_is_reported_as_killed_by_that_signal(db, start, sig):
    """A command the OOM killer ends (SIGKILL) is said to be killed by signal 9, as any
    signal's end is, never "exit code 1" (which it looked like when the process that runs
    it could not pass SIGKILL on)."""
    _, c = db
    job = c.enqueue("summarize", {}, max_attempts=1)["job_id"]
    w = start("--exec", f"summarize=sh -c 'cat >/dev/null; kill -{sig} $$'", "--burst")
    code, summary = w.finish()
    assert code == 0, summary
    error = c.show(job)["job"]["last_error"]
    assert f"killed by signal {sig}" in error, error


def test_exception_is_retried_and_permanent_error_goes_dead(db, start):
    _, c = db
    flaky = c.enqueue("flaky", {})["job_id"]
    strict = c.enqueue("strict", {})["job_id"]
    code, _ = start(*APP, "--burst").finish()
    assert code == 0
    f = c.show(flaky)
    assert f["job"]["status"] == "waiting" and f["job"]["attempts"] == 1
    assert "ValueError: model server refused" in f["job"]["last_error"]
    s = c.show(strict)["job"]
    assert s["status"] == "dead" and "PermanentError" in s["last_error"]


def test_worker_claims_only_kinds_it_handles_and_explain_names_the_missing_handler(db, start):
    _, c = db
    orphan = c.enqueue("transcribe", {}, priority=0)["job_id"]
    done = c.enqueue("summarize", {"text": "a b"}, priority=1)["job_id"]
    code, summary = start(*APP, "--burst").finish()
    assert code == 0 and summary["claimed"] == 1
    assert c.show(done)["job"]["status"] == "succeeded"
    assert c.show(orphan)["job"]["status"] == "waiting"
    reasons = c.explain(orphan)["reasons"]
    assert any(r["code"] == "no_handler" and "transcribe" in r["detail"] for r in reasons)
    worker = c.workers()["workers"][0]
    assert "summarize" in worker["kinds"] and "transcribe" not in worker["kinds"]


def test_high_memory_reading_is_refused_by_the_gate_and_logged(db, start):
    _, c = db
    job = c.enqueue("summarize", {"text": "x"}, priority=0)["job_id"]
    w = start(*APP, "--readings-override", '{"memory_used_pct": 92}')
    e = w.wait_event("gate_refused")
    assert e["reason"] == "memory_gate" and "92" in e["detail"]
    time.sleep(0.5)  # about ten more refused polls
    assert len(w.events("gate_refused")) == 1  # one line per decision, not per poll
    assert c.show(job)["job"]["status"] == "waiting"
    assert c.workers()["workers"][0]["last_refusal"]["reason"] == "memory_gate"
    started = w.events("started")[0]
    assert started["sources"]["memory_used_pct"] == "override"
    assert started["sources"]["on_battery"] != "override"  # the rest stay real


# --- budgets ----------------------------------------------------------------------------------


def test_budget_timeout_stops_the_handler_and_fails_the_attempt_retryably(db, start, tmp_path):
    _, c = db
    marker = str(tmp_path / "sleepy")
    job = c.enqueue("sleepy", {"seconds": 30, "marker": marker})["job_id"]
    w = start(*APP, "--timeout", "sleepy=0.5")
    e = w.wait_event("failed", job_id=job)
    assert e["reason"] == "timeout" and e["permanent"] is False
    got = c.show(job)
    assert got["job"]["status"] == "waiting" and "budget" in got["job"]["last_error"]
    assert got["events"][-1]["reason"] == "timeout"
    # The handler creates the marker, then writes the reason: wait for the words, not
    # just the file.
    assert wait_for(lambda: os.path.exists(marker) and read(marker), 5,
                    "handler stop marker")
    assert read(marker) == "timeout"


def test_timeout_of_a_handler_that_must_not_retry_sends_the_job_dead(db, start):
    _, c = db
    job = c.enqueue("deadline_render", {})["job_id"]
    w = start(*APP)
    w.wait_event("failed", job_id=job)
    assert c.show(job)["job"]["status"] == "dead"


def test_command_timeout_terminates_its_process_group(db, start, tmp_path):
    _, c = db
    pid_file = str(tmp_path / "cmd.pid")
    job = c.enqueue("summarize", {"sleep": 30, "pid_file": pid_file})["job_id"]
    w = start("--exec", f"summarize={CMD}", "--timeout", "summarize=0.5")
    w.wait_event("failed", job_id=job)
    pid = int(read(pid_file))
    assert gone(pid)
    assert os.path.exists(pid_file + ".term")  # asked politely first (SIGTERM)
    assert c.show(job)["events"][-1]["reason"] == "timeout"


def test_oversized_result_fails_the_attempt_and_is_never_stored(db, start):
    _, c = db
    job = c.enqueue("summarize", {"text": "a", "pad": 5000})["job_id"]
    w = start(*APP, "--max-result-bytes", "summarize=1000", "--burst")
    code, _ = w.finish()
    assert code == 0
    got = c.show(job)["job"]
    assert got["status"] == "dead" and got["result"] is None
    assert "1000 byte budget" in got["last_error"]
    assert w.events("failed")[0]["reason"] == "result_too_large"


# --- losing the lease -------------------------------------------------------------------------


def _steal(c: Coordinator, job: int, lease: dict[str, Any]) -> dict[str, Any]:
    """Wait out the paused worker's lease, reap it, and claim the job as `other`."""
    wait_for(lambda: time.time() > _ts(lease["expires_at"]) + 0.05, 10, "lease expiry")
    assert c.reap()["expired"] == 1
    c.heartbeat("other", readings={"memory_used_pct": 10})
    got = c.claim("other", lease_s=30)
    assert got["job"]["job_id"] == job
    return got["lease"]


def _ts(iso_text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp()


def test_handler_that_outlives_its_lease_is_stopped_and_reports_nothing(db, start, tmp_path):
    _, c = db
    marker = str(tmp_path / "sleepy")
    job = c.enqueue("sleepy", {"seconds": 60, "marker": marker})["job_id"]
    w = start(*APP, "--lease", "1")
    lease = wait_for(lambda: running(c, job), 10, "claim")
    wait_for(lambda: os.path.exists(marker + ".started"), 10, "handler start")
    w.proc.send_signal(signal.SIGSTOP)  # a GC pause, a suspended laptop
    other = _steal(c, job, lease)
    w.proc.send_signal(signal.SIGCONT)
    lost = w.wait_event("lease_lost", job_id=job)
    # Someone else holds epoch 2 now. The worker learns it from a refused renewal
    # (stale_epoch), or sooner from its own wall clock being past the lease's end.
    assert lost["reason"] in ("stale_epoch", "lease_expired")
    w.wait_event("stopped", job_id=job)
    # The handler creates the marker, then writes the reason: wait for the words, not
    # just the file.
    assert wait_for(lambda: os.path.exists(marker) and read(marker), 5,
                    "handler stop marker")
    assert read(marker) == lost["reason"]
    # Nothing from the first attempt landed: the job is still the new owner's.
    assert running(c, job)["worker_id"] == "other"
    assert not w.events("failed") and not w.events("completed")
    c.complete(job, "other", other["epoch"], {"by": "other"})
    assert c.show(job)["job"]["result"] == {"by": "other"}


def test_lease_expired_but_not_yet_reaped_still_stops_the_handler(db, start, tmp_path):
    _, c = db
    marker = str(tmp_path / "sleepy")
    job = c.enqueue("sleepy", {"seconds": 60, "marker": marker})["job_id"]
    w = start(*APP, "--lease", "1")
    lease = wait_for(lambda: running(c, job), 10, "claim")
    wait_for(lambda: os.path.exists(marker + ".started"), 10, "handler start")
    w.proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: time.time() > _ts(lease["expires_at"]) + 0.05, 10, "lease expiry")
    w.proc.send_signal(signal.SIGCONT)  # nobody has reaped: the expiry alone refuses it
    assert w.wait_event("lease_lost", job_id=job)["reason"] == "lease_expired"
    # The handler creates the marker, then writes the reason: wait for the words, not
    # just the file.
    assert wait_for(lambda: os.path.exists(marker) and read(marker), 5,
                    "handler stop marker")
    assert read(marker) == "lease_expired"
    assert not w.events("failed") and not w.events("completed")
    assert c.reap()["waiting"] == 1
    assert [e["reason"] for e in c.show(job)["events"]][-1] == "lease_expired"


def test_late_result_of_a_handler_ignoring_cancellation_never_lands(db, start):
    _, c = db
    job = c.enqueue("stubborn", {"seconds": 2.5})["job_id"]
    w = start(*APP, "--lease", "1")
    lease = wait_for(lambda: running(c, job), 10, "claim")
    w.proc.send_signal(signal.SIGSTOP)
    other = _steal(c, job, lease)
    time.sleep(max(0.0, 2.6 - (time.time() - _ts(lease["expires_at"]) + 1)))
    w.proc.send_signal(signal.SIGCONT)  # the handler's sleep is over: it returns a result
    wait_for(lambda: w.events("stopped") or w.events("report_refused"), 10, "outcome")
    c.complete(job, "other", other["epoch"], {"by": "other"})
    shown = c.show(job)
    assert shown["job"]["result"] == {"by": "other"}
    completed = [e for e in shown["events"] if e["reason"] == "completed"]
    assert [(e["worker_id"], e["epoch"]) for e in completed] == [("other", 2)]


def test_command_outliving_its_lease_is_terminated(db, start, tmp_path):
    _, c = db
    pid_file = str(tmp_path / "cmd.pid")
    job = c.enqueue("summarize", {"sleep": 60, "pid_file": pid_file})["job_id"]
    w = start("--exec", f"summarize={CMD}", "--lease", "1", "--kill-grace", "1")
    lease = wait_for(lambda: running(c, job), 10, "claim")
    wait_for(lambda: os.path.exists(pid_file) and read(pid_file), 10, "command start")
    pid = int(read(pid_file))
    w.proc.send_signal(signal.SIGSTOP)
    _steal(c, job, lease)
    # Its own process group, which the pause did not touch; its shim stopped it at the
    # lease's end all the same, the way the worker would: SIGTERM first.
    assert gone(pid) and read(pid_file + ".term") == "SIGTERM"
    w.proc.send_signal(signal.SIGCONT)
    w.wait_event("stopped", job_id=job)
    assert running(c, job)["worker_id"] == "other"
    assert not w.events("completed") and not w.events("failed")


@pytest.mark.parametrize("handler", ["python", "command"])
def test_cancelling_a_running_job_stops_its_handler(db, start, tmp_path, handler):
    _, c = db
    marker = str(tmp_path / "marker")
    if handler == "python":
        job = c.enqueue("sleepy", {"seconds": 60, "marker": marker})["job_id"]
        w = start(*APP, "--lease", "1.5")
    else:
        job = c.enqueue("summarize", {"sleep": 60, "pid_file": marker})["job_id"]
        w = start("--exec", f"summarize={CMD}", "--lease", "1.5")
    wait_for(lambda: running(c, job), 10, "claim")
    wait_for(lambda: os.path.exists(marker if handler == "command" else marker + ".started"),
             10, "handler start")
    assert c.cancel(job)["cancel_requested"] is True
    lost = w.wait_event("lease_lost", job_id=job)
    assert lost["reason"] == "job_cancelled"
    assert c.show(job)["job"]["status"] == "cancelled"
    if handler == "python":
        assert wait_for(lambda: os.path.exists(marker) and read(marker), 5, "marker")
        assert read(marker) == "job_cancelled"
    else:
        w.wait_event("stopped", job_id=job)
        assert gone(int(read(marker)))


# --- shutdown ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_releases_the_running_job_after_the_grace_period(db, start, tmp_path, sig):
    """SIGHUP too (the terminal it ran in closed, an SSH session dropped): it killed the
    worker outright (exit 129, no summary), its running job left to its lease's end."""
    _, c = db
    marker = str(tmp_path / "sleepy")
    job = c.enqueue("sleepy", {"seconds": 60, "marker": marker})["job_id"]
    w = start(*APP, "--lease", "30", "--grace", "0.3")
    wait_for(lambda: running(c, job), 10, "claim")
    t0 = time.monotonic()
    w.proc.send_signal(sig)
    code, summary = w.finish()
    assert code == 0 and summary["released"] == 1
    assert w.events("shutting_down")[0]["signal"] == sig.name
    # Released at once, not after the 30 s lease.
    assert time.monotonic() - t0 < 15
    got = c.show(job)
    assert got["job"]["status"] == "waiting" and got["lease"] is None
    assert got["events"][-1]["reason"] == "worker_shutdown"
    assert read(marker) == "worker_shutdown"


@pytest.mark.parametrize("mode", ["text", "json"])
def test_a_worker_whose_terminal_closed_releases_its_jobs_and_exits_0(db, tmp_path, mode):
    """Its terminal closed (a real pseudo-terminal, its stdout, hung up): the kernel's SIGHUP
    stopped it and released its job, then the summary written to the dead terminal (EIO)
    ended it exit 1 as an internal error (with --json, a traceback too). What cannot be
    printed is dropped; the exit code is the shutdown's, 0."""
    import pty

    path, c = db
    job = c.enqueue("sleepy", {"seconds": 60})["job_id"]
    err = str(tmp_path / "stderr.log")
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout on the terminal, stderr to a file
        try:
            os.chdir(REPO)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            os.execv(PY, [PY, "-m", "jobcoord", "--db", path, "worker", "--worker-id", "w1",
                          "--log-format", "json", "--poll", "0.05", "--reap-every", "0",
                          "--grace", "0.3", *APP, *(["--json"] if mode == "json" else [])])
        finally:
            os._exit(99)
    try:
        wait_for(lambda: running(c, job), 15, "claim")
    finally:
        os.close(fd)  # the terminal closes: SIGHUP to its session
    _, status = os.waitpid(pid, 0)
    with open(err, encoding="utf-8") as f:
        logged = f.read()
    assert os.waitstatus_to_exitcode(status) == 0, logged[-2000:]
    assert "Traceback" not in logged and "internal" not in logged, logged[-2000:]
    got = c.show(job)
    assert got["job"]["status"] == "waiting"
    assert got["events"][-1]["reason"] == "worker_shutdown"


def test_a_worker_started_to_outlive_its_terminal_ignores_the_hangup(db, start):
    """`nohup jobcoord worker ...`: SIGHUP ignored when it started stays ignored."""
    _, c = db
    job = c.enqueue("sleepy", {"seconds": 1.5})["job_id"]
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does, inherited
    try:
        w = start(*APP, "--lease", "30", "--grace", "0.3", "--max-jobs", "1")
    finally:
        signal.signal(signal.SIGHUP, before)
    wait_for(lambda: running(c, job), 10, "claim")
    w.proc.send_signal(signal.SIGHUP)
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1 and summary["released"] == 0
    assert not w.events("shutting_down")
    assert c.show(job)["job"]["status"] == "succeeded"


def test_sigterm_lets_a_job_that_finishes_within_the_grace_period_complete(db, start):
    _, c = db
    job = c.enqueue("sleepy", {"seconds": 1})["job_id"]
    other = c.enqueue("summarize", {"text": "never claimed"})["job_id"]
    w = start(*APP, "--grace", "20")
    wait_for(lambda: running(c, job), 10, "claim")
    w.proc.send_signal(signal.SIGTERM)
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1 and summary["released"] == 0
    assert c.show(job)["job"]["status"] == "succeeded"
    assert c.show(other)["job"]["status"] == "waiting"  # no new claims after the signal


def test_second_signal_exits_at_once(db, start):
    _, c = db
    job = c.enqueue("sleepy", {"seconds": 60})["job_id"]
    w = start(*APP, "--grace", "30")
    wait_for(lambda: running(c, job), 10, "claim")
    w.proc.send_signal(signal.SIGTERM)
    w.wait_event("shutting_down")
    w.proc.send_signal(signal.SIGINT)
    assert w.proc.wait(10) == 130
    assert running(c, job) is not None  # left to its lease and the reaper


def test_concurrency_runs_jobs_side_by_side(db, start, tmp_path):
    _, c = db
    markers = [str(tmp_path / f"m{i}") for i in range(2)]
    ids = [c.enqueue("sleepy", {"seconds": 60, "marker": m})["job_id"] for m in markers]
    w = start(*APP, "--concurrency", "2")
    leases = wait_for(lambda: [running(c, j) for j in ids] if all(running(c, j) for j in ids)
                      else None, 10, "both jobs running")
    assert {lease["worker_id"] for lease in leases} == {"w1"}
    assert len(w.events("claimed")) == 2


# --- the seed 002 checkpoint pattern ----------------------------------------------------------


@pytest.mark.parametrize("handler", ["python", "command"])
def test_checkpointed_remote_id_is_resumed_after_sigkill_not_resubmitted(db, start, tmp_path,
                                                                         handler):
    _, c = db
    remote = str(tmp_path / "remote")
    job = c.enqueue("render", {"remote_dir": remote, "prompt": "a lighthouse"})["job_id"]
    args = (APP if handler == "python"
            else ("--exec", f"render={PY} examples/render_cmd.py"))
    first = start(*args, "--lease", "1", name="first")
    cp = wait_for(lambda: c.show(job)["checkpoints"], 15, "checkpoint")
    assert cp[0]["name"] == "remote_submitted" and cp[0]["epoch"] == 1
    assert remote_service.submissions(remote) == ["R-1"]
    first.proc.send_signal(signal.SIGKILL)  # crash while watching the remote request
    first.proc.wait(5)
    second = start(*args, "--lease", "1", "--reap-every", "0.2", name="second")
    claimed = second.wait_event("claimed", job_id=job)
    assert claimed["epoch"] == 2 and claimed["checkpoints"] == ["remote_submitted"]
    remote_service.finish(remote, "R-1", "lighthouse.png")
    wait_for(lambda: c.show(job)["job"]["status"] == "succeeded", 15, "completion")
    result = c.show(job)["job"]["result"]
    assert result == {"remote_id": "R-1", "output": "lighthouse.png", "resumed": True}
    assert remote_service.submissions(remote) == ["R-1"]  # never submitted twice
    reasons = [e["reason"] for e in c.show(job)["events"]]
    assert reasons == ["enqueued", "claimed", "lease_expired", "claimed", "completed"]


def test_a_local_workers_command_calls_back_to_its_database_not_an_inherited_server(
        db, start, tmp_path):
    """A server named in the worker's own environment (JOBCOORD_SERVER) is not passed to
    its commands: their `jobcoord checkpoint` / `effect` reach this worker's database."""
    _, c = db
    script = tmp_path / "ck.sh"
    script.write_text(
        "#!/bin/sh\ncat >/dev/null\nset -e\n"
        f"J='{PY} -m jobcoord'\n"
        '$J checkpoint "$JOBCOORD_JOB_ID" --worker "$JOBCOORD_WORKER" '
        '--epoch "$JOBCOORD_EPOCH" --name step >&2\n'
        '$J effect "$JOBCOORD_JOB_ID" --worker "$JOBCOORD_WORKER" '
        '--epoch "$JOBCOORD_EPOCH" >&2\necho "{}"\n')
    script.chmod(0o755)
    job = c.enqueue("ck", {}, max_attempts=1)["job_id"]
    w = start("--exec", f"ck={script}", "--burst", env={
        "JOBCOORD_SERVER": "http://127.0.0.1:9", "JOBCOORD_TOKEN_FILE": str(tmp_path / "no")})
    code, _ = w.finish(60)
    shown = c.show(job)
    assert code == 0 and shown["job"]["status"] == "succeeded", read(w.log)
    assert [cp["name"] for cp in shown["checkpoints"]] == ["step"]
    assert "effect_started" in [e["reason"] for e in shown["events"]]


# --- bad options --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    ((), "at least one handler"),
    (("--exec", "summarize"), "KIND="),
    (("--app", "no_such_module_xyz:app"), "cannot import"),
    (("--app", "examples.handlers:summarize"), "not a jobcoord.app.App"),
    (("--exec", f"summarize={CMD}", "--timeout", "other=5"), "no handler for kind"),
    (("--exec", f"summarize={CMD}", "--readings-override", '{"cpu": 1}'), "unknown reading"),
    (("--exec", f"summarize={CMD}", "--readings-override", '{"capacity": {"ram_mb": 1}}'),
     "memory_available_mb"),
    (("--exec", f"summarize={CMD}", "--lease", "-1"), "lease"),
    (("--exec", f"summarize={CMD}", "--tenant", "two words"), "tenant: 'two words' may use"),
    (("--exec", f"summarize={CMD}", "--tenant", ""), "tenant: must not be empty"),
    # An empty id (an unset shell variable) became HOST:PID, a new worker at every start.
    (("--exec", f"summarize={CMD}", "--worker-id", ""), "worker: must not be empty"),
    (("--exec", "summarize=''"), "empty command"),
    (("--exec", "summarize=\"\" --flag"), "empty command"),
    # A program that is not there failed every job of its kind, one attempt at a time.
    (("--exec", "summarize=./no-such-program --flag"), "no program './no-such-program'"),
    (("--exec", "summarize=no-such-program-xyz"), "no program 'no-such-program-xyz'"),
    (("--exec", "summarize=" + os.path.join(REPO, "pyproject.toml")),  # a file, no x bit
     "pyproject.toml' to run"),
])
def test_bad_worker_options_exit_2_and_change_nothing(db, sqlite_target, args, needle):
    _, c = db
    run = run_cli(sqlite_target, "worker", *args, "--json")
    assert run.code == 2, run.err
    assert needle in run.json["error"]["message"]
    assert c.workers()["workers"] == []


@pytest.mark.parametrize("first_line, refused", [
    ("#!/nonexistent/interp", True),
    ("#!/usr/bin/env no-such-interpreter-xyz -u", True),
    ("#!/bin/sh", False),
    ("#!/usr/bin/env sh", False),
])
def test_an_exec_script_whose_interpreter_is_not_there_is_refused_at_startup(
        db, sqlite_target, tmp_path, first_line, refused):
    """An executable script whose `#!` names a missing interpreter failed every job of its
    kind (exit 127 each), as a missing program did."""
    _, c = db
    script = tmp_path / "run me #1.sh"
    script.write_text(f"{first_line}\ncat >/dev/null\necho '{{}}'\n")
    script.chmod(0o755)
    c.enqueue("k", {})
    args = ("--exec", f"k='{script}'", "--burst", "--json")
    run = run_cli(sqlite_target, "worker", *args)
    if refused:
        assert run.code == 2, run.err
        assert "no such program to run it" in run.json["error"]["message"]
        assert c.workers()["workers"] == []
    else:
        assert run.code == 0, run.err


def test_heartbeats_and_renewals_continue_while_a_long_handler_runs(db, start):
    _, c = db
    job = c.enqueue("sleepy", {"seconds": 60})["job_id"]
    w = start(*APP, "--lease", "1.5")
    wait_for(lambda: running(c, job), 10, "claim")
    ages = []
    for _ in range(3):
        time.sleep(1.0)
        ages.append(c.workers()["workers"][0]["heartbeat_age_s"])
    assert all(age < 1.5 for age in ages), ages  # heartbeat every 0.5 s, handler busy
    renewals = w.events("renewed")
    assert len(renewals) >= 4 and all(e["job_id"] == job for e in renewals)
    assert running(c, job)["worker_id"] == "w1"


def test_worker_runs_the_same_on_postgresql_and_sqlite(target, tmp_path):
    """The runtime has no SQLite assumptions: the same worker against `--url`."""
    c = Coordinator.open(target)
    try:
        ids = [c.enqueue("summarize", {"text": "hello there"})["job_id"] for _ in range(3)]
        flag = ["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url]
        run = subprocess.run(
            [PY, "-m", "jobcoord", *flag, "worker", *APP, "--burst", "--poll", "0.05",
             "--concurrency", "2", "--json"], cwd=REPO, capture_output=True, text=True,
            timeout=30, check=False)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["completed"] == 3
        assert [c.show(j)["job"]["status"] for j in ids] == ["succeeded"] * 3
    finally:
        c.close()


def test_handler_ignoring_its_timeout_holds_its_lease_and_slot_until_it_returns(
        db, start, tmp_path):
    """A Python handler past its budget cannot be stopped from outside. Its timeout was
    reported at once: the job was claimable again (after its backoff) while the handler
    still ran in this worker, beside the next attempt. The lease is kept, renewed, and the
    timeout reported once the handler returned; its slot stays taken meanwhile."""
    _, c = db
    marker = str(tmp_path / "returned")
    stuck = c.enqueue("stubborn", {"seconds": 3, "marker": marker}, priority=0)["job_id"]
    nxt = c.enqueue("summarize", {"text": "next"}, priority=1)["job_id"]
    w = start(*APP, "--timeout", "stubborn=0.3", "--concurrency", "1", "--lease", "1.5")
    still = w.wait_event("handler_still_running", job_id=stuck)
    assert still["reason"] == "timeout" and still["holding_lease"] is True
    while not os.path.exists(marker):  # the job stays this attempt's while the handler runs
        lease = running(c, stuck)
        assert lease is not None and lease["epoch"] == 1, c.show(stuck)
        time.sleep(0.1)
    failed = w.wait_event("failed", job_id=stuck)
    assert failed["reason"] == "timeout"
    returned = w.wait_event("handler_returned_late", job_id=stuck)
    assert _ts(failed["ts"]) >= float(read(marker)) - 0.001
    assert w.events("renewed")  # the lease outlived its 1.5 s by renewals
    claimed = w.wait_event("claimed", job_id=nxt)
    # The next job waits for the slot: never two handlers with --concurrency 1.
    assert claimed["ts"] >= returned["ts"]
    assert c.show(stuck)["job"]["status"] == "waiting"


def test_a_python_handler_ignoring_its_stop_holds_the_lease_on_sigterm_until_it_returns(
        db, start, tmp_path):
    """On SIGTERM past --grace, a Python handler that ignores `ctx.cancelled` was released
    at once: another worker claimed the job while the handler still ran in this one. The
    lease is kept and renewed until the handler returns, then the job is released."""
    _, c = db
    marker = str(tmp_path / "returned")
    job = c.enqueue("stubborn", {"seconds": 3, "marker": marker})["job_id"]
    w = start(*APP, "--grace", "0.2", "--lease", "1.5")
    wait_for(lambda: running(c, job), 10, "claim")
    w.proc.send_signal(signal.SIGTERM)
    still = w.wait_event("handler_still_running", job_id=job)
    assert still["reason"] == "worker_shutdown" and still["holding_lease"] is True
    while not os.path.exists(marker):
        lease = running(c, job)
        assert lease is not None and lease["epoch"] == 1, c.show(job)
        time.sleep(0.1)
    released = w.wait_event("released", job_id=job)
    assert _ts(released["ts"]) >= float(read(marker)) - 0.001
    assert w.proc.wait(timeout=30) == 0
    shown = c.show(job)
    assert shown["job"]["status"] == "waiting" and shown["job"]["epoch"] == 1


def test_a_locked_database_delays_renewal_but_the_worker_keeps_its_lease_and_finishes(db, start):
    import sqlite3

    path, c = db
    job = c.enqueue("sleepy", {"seconds": 5})["job_id"]
    w = start(*APP, "--lease", "6", global_args=("--busy-timeout", "0.1"))
    wait_for(lambda: running(c, job), 10, "claim")
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        w.wait_event("renew_error", timeout=10)
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    w.wait_event("completed", job_id=job)
    assert c.show(job)["job"]["status"] == "succeeded"
    assert not w.events("lease_lost")
    assert w.proc.poll() is None  # errors are logged and retried, never fatal


def test_a_result_json_cannot_hold_fails_the_attempt_instead_of_stalling_the_job(db, start):
    _, c = db
    job = c.enqueue("bad_result", {})["job_id"]
    code, summary = start(*APP, "--burst").finish()
    assert code == 0 and summary["failed"] == 1
    got = c.show(job)
    assert got["job"]["status"] == "waiting" and "not JSON" in got["job"]["last_error"]
    assert got["events"][-1]["reason"] == "invalid_result"


def test_an_unwieldy_error_message_is_kept_bounded_with_both_ends(db, start):
    _, c = db
    job = c.enqueue("noisy", {})["job_id"]
    code, _ = start(*APP, "--burst").finish()
    assert code == 0
    error = c.show(job)["job"]["last_error"]
    assert error.startswith("RuntimeError: start\\0") and "\x00" not in error
    assert error.endswith("the real cause is at the end") and len(error) <= 4010


def test_many_workers_reaping_at_once_recover_a_dead_workers_job_exactly_once(db, start):
    _, c = db
    job = c.enqueue("summarize", {"text": "orphaned by a crash"})["job_id"]
    c.heartbeat("ghost", readings={"memory_used_pct": 10})
    assert c.claim("ghost", lease_s=0.5)["job"]["job_id"] == job  # then the ghost dies
    workers = [start(*APP, "--reap-every", "0.05", name=f"r{i}") for i in range(3)]
    wait_for(lambda: c.show(job)["job"]["status"] == "succeeded", 20, "recovery")
    events = c.show(job)["events"]
    assert [e["reason"] for e in events] == ["enqueued", "claimed", "lease_expired",
                                             "claimed", "completed"]
    reaped = sum(e["expired"] for w in workers for e in w.events("reaped"))
    assert reaped == 1


def test_text_log_has_one_line_per_decision_with_job_and_epoch(db, tmp_path):
    path, c = db
    job = c.enqueue("summarize", {"text": "plain text log"})["job_id"]
    run = subprocess.run(
        [PY, "-m", "jobcoord", "--db", path, "worker", *APP, "--worker-id", "tw", "--burst",
         "--poll", "0.05", "--max-jobs", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    claimed = [ln for ln in lines if " tw claimed " in ln]
    completed = [ln for ln in lines if " tw completed " in ln]
    assert len(claimed) == len(completed) == 1
    assert f"job_id={job} epoch=1" in claimed[0] and "claim_ms=" in claimed[0]
    assert f"job_id={job} epoch=1" in completed[0] and "duration_s=" in completed[0]
    assert "completed: 1" in run.stdout  # the summary, for people


def test_max_jobs_stops_the_worker_after_that_many_claims(db, start):
    _, c = db
    ids = [c.enqueue("summarize", {"text": str(i)})["job_id"] for i in range(3)]
    code, summary = start(*APP, "--max-jobs", "2").finish()
    assert code == 0 and summary["claimed"] == 2
    assert [c.show(j)["job"]["status"] for j in ids] == ["succeeded", "succeeded", "waiting"]


def test_an_app_module_failing_to_load_is_a_clear_usage_error(db, sqlite_target, tmp_path,
                                                              monkeypatch):
    (tmp_path / "broken_handlers.py").write_text('raise RuntimeError("no GPU found")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    run = run_cli(sqlite_target, "worker", "--app", "broken_handlers:app", "--json")
    assert run.code == 2
    assert run.json["error"]["message"] == ("--app: importing 'broken_handlers' failed: "
                                            "RuntimeError: no GPU found")
    assert "Traceback" not in run.err


@pytest.mark.parametrize("exit_call,shown", [("sys.exit(0)", "SystemExit: 0"),
                                              ("sys.exit(3)", "SystemExit: 3"),
                                              ("sys.exit('no GPU')", "SystemExit: no GPU")])
def test_an_app_module_exiting_while_it_loads_is_a_clear_usage_error(
        db, sqlite_target, tmp_path, monkeypatch, exit_call, shown):
    """A sys.exit() in the module escaped: the worker ended with the module's own code (0,
    or 3, which reads as "no eligible job"), printing nothing, its --json no JSON."""
    name = f"exiting_{abs(hash(exit_call))}"
    (tmp_path / f"{name}.py").write_text(f"import sys\n{exit_call}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = run_cli(sqlite_target, "worker", "--app", f"{name}:app", "--burst", "--json")
    assert run.code == 2, run
    assert run.json["error"]["message"] == f"--app: importing {name!r} failed: {shown}"


def test_a_command_leaving_a_background_child_on_stdout_still_finishes(db, start, tmp_path):
    _, c = db
    pid_file = str(tmp_path / "child.pid")
    job = c.enqueue("summarize", {"text": "done", "background_pid_file": pid_file})["job_id"]
    w = start("--exec", f"summarize={CMD}")
    w.wait_event("completed", job_id=job)  # not after the child's 60 s
    assert c.show(job)["job"]["result"]["summary"] == "done"
    assert wait_for(lambda: gone(int(read(pid_file))), 5, "leftover child killed")


def test_burst_worker_exits_when_the_gate_refuses_instead_of_hanging(db, start):
    _, c = db
    job = c.enqueue("summarize", {"text": "x"}, priority=0)["job_id"]
    w = start(*APP, "--burst", "--readings-override", '{"memory_used_pct": 97}')
    code, summary = w.finish()
    assert code == 0 and summary["claimed"] == 0 and summary["gate_refused"] == 1
    assert w.events("gate_refused")[0]["reason"] == "memory_gate"
    assert c.show(job)["job"]["status"] == "waiting"


def test_a_burst_worker_reaps_expired_leases_before_it_finds_the_queue_empty(db, start):
    """A worker killed mid-job leaves its lease; a burst worker run to empty the queue
    recovers that job (reaps, then claims it) instead of exiting with it `running` until
    someone runs `jobcoord reap`."""
    _, c = db
    job = c.enqueue("summarize", {"text": "x"})["job_id"]
    c.heartbeat("dead-worker", readings={"memory_used_pct": 10})
    assert c.claim("dead-worker", lease_s=0.5)["job"]["job_id"] == job
    time.sleep(0.8)
    w = start(*APP, "--burst", "--reap-every", "5")  # its timer would first reap in 5 s
    code, summary = w.finish()
    assert code == 0 and summary["claimed"] == 1 and summary["reaped"] == 1, summary
    shown = c.show(job)["job"]
    assert shown["status"] == "succeeded" and shown["attempts"] == 2, shown


@pytest.mark.parametrize("size, in_env", [(100, True), (200_000, False)])
def test_commands_get_every_checkpoint_in_a_file_and_small_ones_in_the_environment(
        db, start, size, in_env):
    _, c = db
    job = c.enqueue("summarize", {"echo_checkpoints": True})["job_id"]
    c.heartbeat("before", readings={"memory_used_pct": 10})
    c.claim("before", lease_s=0.3)  # an earlier attempt saved progress, then died
    c.checkpoint(job, "before", 1, "progress", {"blob": "x" * size})
    w = start("--exec", f"summarize={CMD}", "--reap-every", "0.05")
    w.wait_event("completed", job_id=job)
    result = c.show(job)["job"]["result"]
    assert result["names"] == ["progress"] and result["sizes"]["progress"] > size
    assert result["in_env"] is in_env
    assert not os.path.exists(result["file"])  # removed once the job is over


@pytest.mark.parametrize("value", ["1.5", "0", "-5", "abc", "1e3"])
def test_max_result_bytes_is_a_whole_number_of_bytes(db, value):
    """`--max-result-bytes KIND=BYTES` takes whole bytes only: a fraction is refused (exit 2)
    before anything runs, and the message speaks of bytes, not seconds."""
    path, c = db
    job = c.enqueue("summarize", {"text": "a"})["job_id"]
    got = run_cli(None, "--db", path, "worker", *APP, "--burst",
                  "--max-result-bytes", f"summarize={value}")
    assert got.code == 2, got
    assert "max-result-bytes" in got.err and "seconds" not in got.err
    assert c.show(job)["job"]["status"] == "waiting"
