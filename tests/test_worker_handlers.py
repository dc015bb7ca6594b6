"""Handlers that outlive, outnumber or mislead their worker (real worker processes, real
commands, real signals; SQLite).

- a SIGKILLed worker takes its command handler and the handler's children with it;
- a SIGSTOPped worker's command handler is stopped by the lease it last renewed, before a
  replacement can claim the job, while a command under renewals runs as long as it needs;
- a command's output is validated exactly like `complete --result`;
- a command is judged by its own exit, even when a detached process holds its stdout;
- slots are counted by live handler: never more than --concurrency, never two of one job;
- a second signal still ends `worker --json` with one JSON line.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import time
from typing import Any

import pytest

from jobcoord.service import Coordinator
from tests import test_worker as tw
from tests.test_worker import APP, CMD, PY, gone, read, running, wait_for

# The worker fixtures, shared with test_worker.py.
db = tw.db
start = tw.start

pytestmark = pytest.mark.timeout(60)


def _kill(pid_file: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(read(pid_file)), signal.SIGKILL)


# --- handlers die with their worker -------------------------------------------------------


def test_handlers_die_with_their_worker_when_it_is_sigkilled(db, start, tmp_path):
    _, c = db
    script = tmp_path / "hang.sh"
    script.write_text('echo $$ > "$1/cmd.pid"\nsleep 300 &\necho $! > "$1/child.pid"\nwait\n')
    job = c.enqueue("hang", {})["job_id"]
    w = start("--exec", f"hang=sh {script} {tmp_path}")
    pids = [str(tmp_path / "cmd.pid"), str(tmp_path / "child.pid")]
    try:
        wait_for(lambda: all(os.path.exists(p) and read(p).strip() for p in pids), 10,
                 "the command and its child")
        assert running(c, job) is not None
        w.proc.kill()
        w.proc.wait(5)
        # Nothing may keep running a job the reaper is about to offer again.
        wait_for(lambda: all(gone(int(read(p))) for p in pids), 2.0,
                 "the handler and its child to die with the worker")
    finally:
        for p in pids:
            _kill(p)


# --- handlers never outlive the lease -------------------------------------------------------


@pytest.fixture
def both(target: Any, tmp_path: Any) -> Any:
    """A coordinator and a worker starter on the parametrized backend."""
    c = Coordinator.open(target)
    where = (("--db", target.sqlite_path) if target.sqlite_path else ("--url", target.url))
    procs: list[tw.Worker] = []

    def _start(*args: str, name: str = "w1") -> tw.Worker:
        w = tw.Worker("", str(tmp_path / f"{name}.log"), name, args, where=where)
        procs.append(w)
        return w

    yield c, _start
    for w in procs:
        if w.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                w.proc.send_signal(sig)
            w.proc.wait(10)
    c.close()


def _group(pgid: int) -> list[int]:
    """The live processes (zombies are gone) of process group `pgid`."""
    members = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, _ppid, pgrp = read(stat).rsplit(") ", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                members.append(int(stat.split("/")[2]))
    return members


#: How late after the lease's end the command's group may still be seen: the test's own
#: polling, not the runtime's (it stops the group a little before the end).
LEASE_END_SLACK_S = 0.3


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_stopped_workers_command_never_runs_past_the_lease_it_last_renewed(
        both, tmp_path, ignores_sigterm):
    c, start = both
    script = tmp_path / "tick.sh"
    # A side effect every 50 ms from a child that stays in the command's group. One that
    # ignores SIGTERM (its children inherit that) goes at SIGKILL, which lands before the
    # lease's end too: the SIGTERM came the kill grace (at most a quarter of the lease)
    # earlier. It ran the whole kill grace past the end, beside the next attempt.
    script.write_text(("trap '' TERM\n" if ignores_sigterm else "")
                      + 'echo $$ > "$1/cmd.pid"\n'
                      '(while :; do date +%s.%N >> "$1/ticks"; sleep 0.05; done) &\nwait\n')
    cmd_pid, ticks = str(tmp_path / "cmd.pid"), str(tmp_path / "ticks")
    job = c.enqueue("tick", {})["job_id"]
    w = start("--exec", f"tick=sh {script} {tmp_path}", "--lease", "3", "--kill-grace",
              "1" if ignores_sigterm else "5")
    wait_for(lambda: os.path.exists(ticks) and read(cmd_pid).strip(), 10, "command start")
    pgid = os.getpgid(int(read(cmd_pid)))
    time.sleep(1.2)  # past a renewal: the shim must follow renewals, not the first lease
    w.proc.send_signal(signal.SIGSTOP)  # a hung worker: it can neither renew nor stop it
    lease = running(c, job)
    assert lease is not None and lease["epoch"] == 1
    end = tw._ts(lease["expires_at"])  # the end of the lease it last renewed
    assert _group(pgid) and end - time.time() > 1.0
    wait_for(lambda: not _group(pgid), end - time.time() + LEASE_END_SLACK_S,
             "the command's process group to be stopped by the lease's end")
    assert time.time() <= end + LEASE_END_SLACK_S
    # No side effect past the lease's end, from a command deaf to SIGTERM too.
    last = float(read(ticks).split()[-1])
    assert last <= end
    # Only now can another worker have the job, and nothing of the first attempt runs.
    other = tw._steal(c, job, lease)
    assert not _group(pgid)
    w.proc.send_signal(signal.SIGCONT)
    lost = w.wait_event("lease_lost", job_id=job, epoch=1)
    assert lost["reason"] in ("lease_expired", "stale_epoch")
    w.wait_event("stopped", job_id=job, epoch=1)
    assert not w.events("completed") and not w.events("failed")
    assert running(c, job)["worker_id"] == "other"
    c.complete(job, "other", other["epoch"], {"by": "other"})
    shown = c.show(job)
    assert shown["job"]["result"] == {"by": "other"}
    assert [(e["worker_id"], e["epoch"]) for e in shown["events"]
            if e["reason"] == "completed"] == [("other", 2)]


def test_a_command_under_renewals_runs_past_several_lease_lengths_and_completes(
        both, tmp_path):
    c, start = both
    job = c.enqueue("summarize", {"sleep": 4, "text": "still going"})["job_id"]
    w = start("--exec", f"summarize={CMD}", "--lease", "1")
    done = w.wait_event("completed", timeout=30, job_id=job)
    assert done["duration_s"] >= 4
    assert len([e for e in w.events("renewed") if e["job_id"] == job]) >= 8
    assert not w.events("lease_lost") and not w.events("stopped")
    shown = c.show(job)
    assert shown["job"]["status"] == "succeeded" and shown["job"]["epoch"] == 1


# --- a command's output is validated like `complete --result` -------------------------------


@pytest.mark.parametrize("raw, needle", [
    (b'{"x": "\xff"}', "UTF-8"),
    (b'{"a": 1, "a": 2}', "duplicate"),
])
def test_malformed_command_output_fails_the_attempt_permanently_as_invalid_result(
        db, start, tmp_path, raw, needle):
    path, c = db
    script = tmp_path / "out.py"
    script.write_text("import sys\nsys.stdout.buffer.write(bytes.fromhex(sys.argv[1]))\n")
    job = c.enqueue("emit", {})["job_id"]
    code, summary = start("--exec", f"emit={PY} {script} {raw.hex()}", "--burst").finish()
    assert code == 0 and summary["failed"] == 1 and summary["completed"] == 0
    got = c.show(job)
    assert got["job"]["status"] == "dead"  # permanent: the same command prints it again
    assert got["job"]["result"] is None
    assert got["events"][-1]["reason"] == "invalid_result"
    assert needle in got["job"]["last_error"]
    # The CLI refuses the very same bytes (exit 2): one validation for both doors.
    from tests.conftest import run_cli

    refused = run_cli(None, "--db", path, "complete", str(job), "--worker", "w1", "--epoch",
                      "1", "--result-file", "-", stdin=raw)
    assert refused.code == 2 and needle in refused.err


# --- judged by its own exit -----------------------------------------------------------------


def test_a_command_exiting_0_while_a_detached_child_holds_stdout_completes_at_once(
        db, start, tmp_path):
    _, c = db
    pid_file = str(tmp_path / "daemon.pid")
    script = tmp_path / "detach.sh"
    # The daemon says when it has left the group (setsid done); only then does the command
    # print its result and exit 0, leaving the daemon holding stdout.
    script.write_text(f"setsid sh -c 'echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; "
                      f"exec sleep 300' &\n"
                      f"while [ ! -s {pid_file} ]; do sleep 0.01; done\n"
                      "echo '{\"ok\": 1}'\nexit 0\n")
    job = c.enqueue("detach", {})["job_id"]
    w = start("--exec", f"detach=sh {script}", "--timeout", "detach=30")
    try:
        t0 = time.monotonic()
        w.wait_event("completed", timeout=10, job_id=job)
        assert time.monotonic() - t0 < 8  # by its own exit, never by the 30 s budget
        assert c.show(job)["job"]["result"] == {"ok": 1}
        held = w.wait_event("output_held_open", job_id=job)
        assert "outside" in held["detail"]
        # A fully detached daemon (its own session) is not tracked: documented, not killed.
        assert not gone(int(read(pid_file)))
    finally:
        _kill(pid_file)


# --- slots by live handler --------------------------------------------------------------------


def _intervals(directory: str) -> list[dict[str, Any]]:
    out = []
    for path in glob.glob(os.path.join(directory, "*.json")):
        with contextlib.suppress(ValueError):
            out.append(json.loads(read(path)))
    return out


def test_never_more_live_handlers_than_concurrency_nor_two_handlers_of_one_job(
        db, start, tmp_path):
    _, c = db
    policy = tmp_path / "policy.toml"
    policy.write_text("retry_base_s = 1.0\nretry_max_s = 1.0\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    # Job 1 ignores its 1 s budget and sleeps 6 s; after a 1 s backoff it is offered again
    # while its first handler still sleeps in this worker. Job 2 arrives a little later.
    job1 = c.enqueue("overlap", {"dir": str(runs), "seconds": 6}, priority=0)["job_id"]
    job2 = c.enqueue("overlap", {"dir": str(runs), "seconds": 3}, priority=1,
                     delay_s=2.5)["job_id"]
    w = start(*APP, "--concurrency", "2", "--timeout", "overlap=1",
              global_args=("--policy", str(policy)))
    wait_for(lambda: any(r["job_id"] == job2 for r in _intervals(str(runs))), 20,
             "job 2 to start")
    time.sleep(1.0)  # let anything that would overlap show itself
    w.proc.kill()
    w.proc.wait(5)
    now = time.time()
    spans = [(r["job_id"], r["epoch"], r["start"], r["end"] or now)
             for r in _intervals(str(runs))]
    for _, _, t, _ in spans:
        live = [s for s in spans if s[2] <= t < s[3]]
        assert len(live) <= 2, f"{len(live)} live handlers with --concurrency 2: {live}"
        ids = [s[0] for s in live]
        assert len(ids) == len(set(ids)), f"two handlers of one job alive at once: {live}"
    assert job1 in {s[0] for s in spans}


# --- JSON to the end --------------------------------------------------------------------------


def test_a_second_signal_still_prints_one_json_line_and_exits_130(db, start):
    _, c = db
    job = c.enqueue("sleepy", {"seconds": 60})["job_id"]
    w = start(*APP, "--grace", "30")
    wait_for(lambda: running(c, job), 10, "claim")
    w.proc.send_signal(signal.SIGTERM)
    w.wait_event("shutting_down")
    w.proc.send_signal(signal.SIGINT)
    out, _ = w.proc.communicate(timeout=10)
    assert w.proc.returncode == 130
    lines = out.decode().splitlines()
    assert len(lines) == 1, lines
    got = json.loads(lines[0])
    assert got["event"] == "exiting_now" and got["running"] == [job]
