"""`jobcoord demo` end to end: real worker processes, a real SIGKILL, a real reaper."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from jobcoord.demo import report

pytestmark = pytest.mark.timeout(90)


def _jobcoord(*args: str, cwd: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobcoord", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=75, check=False,
                          env=None if env is None else {**os.environ, **env})


def test_demo_runs_every_job_exactly_once_recovers_the_killed_worker_and_leaves_the_database(
        tmp_path):
    # A user's own policy (here: a memory limit no reading reaches) must not change the demo.
    policy = tmp_path / "lenient.toml"
    policy.write_text("max_memory_pct = 99\nbackground_min_idle_s = 0\n")
    run = _jobcoord("demo", "--json", cwd=str(tmp_path), env={"JOBCOORD_POLICY": str(policy)})
    assert run.returncode == 0, run.stdout + run.stderr
    s = json.loads(run.stdout)
    assert s["ok"] and s["problems"] == []
    assert s["artifact"]["digest"].startswith("sha256:")  # a summary's rendered report

    # Default directory: a new one under the current directory.
    directory = os.path.join(str(tmp_path), s["directory"])
    assert os.path.dirname(os.path.abspath(directory)) == str(tmp_path)
    assert os.path.isfile(os.path.join(directory, "jobcoord.db"))

    # Every job succeeded, each with exactly one accepted completion.
    assert s["succeeded"] == s["jobs"] >= 20
    assert s["completed_exactly_once"] is True

    # A schedule fired from the workers' own ticks; its job ran like the rest, and explain
    # names the schedule, slot and window.
    sch = s["schedule"]
    assert sch["status"] == "succeeded" and sch["jobs"]
    assert sch["explain"]["name"] == "digest-every-second" and sch["explain"]["paused"]
    assert sch["explain"]["window_ends_at"] > sch["explain"]["slot"]

    # At least three real workers ran work, with two roles between them.
    ran = {w["worker_id"]: w["ran"] for w in s["workers"]}
    assert sum(1 for r in ran.values() if r) >= 3
    assert sum(sum(r.values()) for r in ran.values()) == s["jobs"]
    roles = {role for w in s["workers"] for role in (w["roles"] or [])}
    assert {"gpu", "cpu"} <= roles

    # The high-memory worker was refused by the memory gate and ran nothing.
    laptop = next(w for w in s["workers"] if w["worker_id"] == "laptop")
    assert laptop["ran"] == {}
    assert [g["reason"] for g in laptop["gates"]] == ["memory_gate"]
    # The worker whose owner is active took user requests but no background work.
    desk = next(w for w in s["workers"] if w["worker_id"] == "desk-cpu")
    assert "index" not in desk["ran"]
    assert any(g["reason"] == "user_active" for g in desk["gates"])

    # A remote worker joined over HTTP (a real `jobcoord serve` on a free loopback port, a
    # worker token in a file only the user can read) and completed the jobs only it serves;
    # the server was stopped cleanly at the end, and no secret was printed.
    remote = next(w for w in s["workers"] if w["remote"])
    assert remote["worker_id"] == "study-pc" and remote["ran"] == {"ocr": 2}
    server = s["server"]
    assert server["url"].startswith("http://127.0.0.1:") and server["stopped_cleanly"]
    token_file = os.path.join(str(tmp_path), server["token_file"])
    assert os.stat(token_file).st_mode & 0o777 == 0o600
    with open(token_file) as f:
        secret = f.read().strip()
    assert secret.startswith("jct_") and secret not in run.stdout + run.stderr

    # One worker was SIGKILLed mid-job; the reaper recovered the job and another worker
    # finished it under a new epoch.
    killed, rec = s["killed"], s["recovered_job"]
    assert rec["job_id"] == killed["job_id"] and rec["status"] == "succeeded"
    reasons = [(e["reason"], e["worker_id"], e["epoch"]) for e in rec["events"]]
    assert reasons[0][0] == "enqueued"
    assert ("claimed", killed["worker_id"], killed["epoch"]) in reasons
    assert ("lease_expired", killed["worker_id"], killed["epoch"]) in reasons
    finish = [r for r in reasons if r[0] == "completed"]
    assert len(finish) == 1 and finish[0][1] != killed["worker_id"]
    assert finish[0][2] == killed["epoch"] + 1
    assert rec["provenance"]["worker"] == finish[0][1]
    assert rec["provenance"]["reported"]["model"] == "demo-embedder"
    assert s["duration_s"] < 60

    # The database stays behind for the user to explore.
    db = os.path.join(directory, "jobcoord.db")
    status = _jobcoord("--db", db, "status", "--json", cwd=str(tmp_path))
    assert status.returncode == 0, status.stderr
    # The workload's jobs and the limit demo's two.
    assert json.loads(status.stdout)["jobs"]["succeeded"] == s["jobs"] + 2
    shown = _jobcoord("--db", db, "show", str(rec["job_id"]), "--json", cwd=str(tmp_path))
    assert json.loads(shown.stdout)["job"]["status"] == "succeeded"

    # The human rendering says the same.
    text = "\n".join(report(s))
    assert f"{s['jobs']}/{s['jobs']} jobs succeeded; each completed exactly once: yes" in text
    assert "memory_gate" in text and f"recovered job {rec['job_id']}" in text
    assert "[remote: over HTTP with a token]" in text and "stopped cleanly" in text

    # A concurrency limit held the second job back, in explain's words, until the slot freed.
    lim = s["limit"]
    assert lim["refusal"]["reason"] == "concurrency_limit"
    assert f"held by job {lim['held_job']} on desk-70b" in lim["refusal"]["detail"]
    assert [r["code"] for r in lim["explain"]] == ["concurrency_limit"]
    assert lim["claimed_after"] == lim["held_back_job"]
    assert "limit llm-70b --concurrency 1: job" in text


def test_demo_refuses_a_directory_that_already_has_a_database_and_changes_nothing(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "jobcoord.db").write_bytes(b"precious")
    run = _jobcoord("demo", "--dir", str(target), "--json", cwd=str(tmp_path))
    assert run.returncode == 2
    assert json.loads(run.stdout)["error"]["code"] == "invalid_input"
    assert (target / "jobcoord.db").read_bytes() == b"precious"
    assert sorted(os.listdir(target)) == ["jobcoord.db"]


def test_demo_stops_and_names_a_worker_that_died_unexpectedly(tmp_path):
    import re
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "jobcoord", "demo", "--dir",
                             str(tmp_path / "d")], cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            found = re.match(r"started worker laptop\s+pid (\d+)", line)
            if found:
                os.kill(int(found.group(1)), signal.SIGKILL)  # not the demo's own kill
                break
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "PROBLEM: worker laptop exited with code -9" in out


def test_the_demo_report_prints_commands_that_run_when_pasted_into_a_shell(tmp_path):
    """The report's "explore the database" commands quote the path: a --dir with spaces, `#`,
    `?` or `%` still gives commands a shell runs as printed."""
    directory = tmp_path / "my demo #1 ?%"
    directory.mkdir()
    db = str(directory / "jobcoord.db")
    assert _jobcoord("--db", db, "migrate", cwd=str(tmp_path)).returncode == 0
    s = {"killed": None, "succeeded": 0, "jobs": 0, "completed_exactly_once": True,
         "workers": [], "recovered_job": None, "problems": [], "duration_s": 0.1,
         "database": db, "directory": str(directory)}
    lines = [ln.strip() for ln in report(s) if ln.strip().startswith("jobcoord --db")]
    assert lines
    for line in lines:  # what a shell makes of it: --db and exactly this path
        assert shlex.split(line, comments=True)[1:3] == ["--db", db], line
    status = next(ln for ln in lines if ln.endswith(" status"))
    bindir = os.path.dirname(sys.executable)  # the jobcoord of this environment
    run = subprocess.run(["bash", "-c", status + " --json"], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"]})
    assert run.returncode == 0, (status, run.stderr)
    assert json.loads(run.stdout)["path"] == db
