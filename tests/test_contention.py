"""Contention: many real worker processes on one SQLite file.

Every job succeeds exactly once, no (job, epoch) is handed out twice, every event sequence is
legal, `jobcoord check` passes, and no process is ever told "database is locked". The same
harness run with write transactions switched to a deferred BEGIN must find problems: that is
the proof the harness can see the bug it guards against.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests import procs
from tests.conftest import environment
from tests.invariants import assert_invariants, violations
from tests.procs import enqueue_with_key, one_job

pytestmark = pytest.mark.timeout(600)

SPAWN = multiprocessing.get_context("spawn")
REPO = Path(__file__).resolve().parent.parent


def jobcoord_cli(db: str, *args: str, env_extra: dict[str, str] | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobcoord", "--db", db, *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, **(env_extra or {})},
    )


def run_contention(path: str, tmp: Path, n_jobs: int, n_workers: int, batch: int = 0
                   ) -> dict[str, Any]:
    """Fill `path` with n_jobs and let n_workers processes drain it (claiming and completing
    `batch` jobs per call, when given). Returns the ledgers."""
    return {"ledgers": procs.run_contention(path, tmp, n_jobs, n_workers, timeout=500,
                                            batch=batch)}


def findings(path: str, n_jobs: int, run: dict[str, Any]) -> list[str]:
    """Everything that went wrong in a contention run, as sentences."""
    found: list[str] = []
    ledgers = run["ledgers"]
    claims = Counter((j, e) for led in ledgers for j, e in led["claims"])
    twice = [k for k, n in claims.items() if n > 1]
    if twice:
        found.append(f"(job, epoch) leased twice: {twice[:5]}")
    accepted = Counter(j for led in ledgers for j, _ in led["completed"])
    if any(n > 1 for n in accepted.values()):
        found.append("a job's completion was accepted twice")
    locked = sum(led["locked_seen"] for led in ledgers)
    if locked:
        found.append(f"{locked} calls were told 'database is locked'")
    errors: Counter[str] = Counter()
    for led in ledgers:
        errors.update(led["errors"])
    if errors:
        found.append(f"workers saw errors: {dict(errors)}")
    snapshot = sum(led["busy_errors"].get("SQLITE_BUSY_SNAPSHOT", 0) for led in ledgers)
    if snapshot:
        found.append(f"{snapshot} write transactions lost their snapshot (deferred BEGIN "
                     "upgraded to a write)")
    unwaited = sum(led["busy_unwaited"] for led in ledgers)
    if unwaited:
        found.append(f"{unwaited} write transactions were refused with SQLITE_BUSY at once, "
                     "without waiting out the busy timeout (they began as readers)")
    conn = sqlite3.connect(path)
    try:
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status"))
        if statuses != {"succeeded": n_jobs}:
            found.append(f"not every job succeeded: {statuses}")
        per_job = Counter(r[0] for r in conn.execute(
            "SELECT job_id FROM job_events WHERE reason = 'completed'"))
        if len(per_job) != n_jobs or set(per_job.values()) != {1}:
            found.append("some job does not have exactly one completed event")
        if sum(accepted.values()) != n_jobs:
            found.append(f"{sum(accepted.values())} accepted completions for {n_jobs} jobs")
    finally:
        conn.close()
    found += violations(path)
    return found


def report(run: dict[str, Any], label: str) -> None:
    ledgers = run["ledgers"]
    retries = sum(led["busy_retries"] for led in ledgers)
    failures = sum(led["busy_failures"] for led in ledgers)
    names: Counter[str] = Counter()
    for led in ledgers:
        names.update(led["busy_errors"])
    unwaited = sum(led["busy_unwaited"] for led in ledgers)
    print(f"\n{label}: busy retries {retries}, busy failures {failures}, "
          f"busy errors by name {dict(names)}, refused without waiting {unwaited}")


@pytest.mark.parametrize("batch", [0, 16], ids=["single", "batched"])
def test_eight_processes_drain_every_job_exactly_once(sqlite_target: Target,
                                                       tmp_path: Path, batch: int) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    run = run_contention(path, tmp_path, 1000, 8, batch)
    report(run, "8 processes, 1,000 jobs")
    assert findings(path, 1000, run) == []
    check = jobcoord_cli(path, "check", "--full", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["ok"] is True


@pytest.mark.slow
def test_eight_processes_drain_five_thousand_jobs_exactly_once(sqlite_target: Target,
                                                                tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    run = run_contention(path, tmp_path, 5000, 8)
    report(run, "8 processes, 5,000 jobs")
    assert findings(path, 5000, run) == []
    assert jobcoord_cli(path, "check", "--full").returncode == 0


#: A writer that commits a real change (the header's user_version) every few milliseconds,
#: holding the write lock in between. A transaction that began as a reader while it held the
#: lock is behind the newest commit when it tries to write, and SQLite refuses the upgrade at
#: once (SQLITE_BUSY_SNAPSHOT). With BEGIN IMMEDIATE every writer waits its turn instead.
BUMPER = """
import os, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
n = 0
while not os.path.exists(sys.argv[2]):
    n += 1
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"PRAGMA user_version = {n}")
    time.sleep(0.01)
    conn.execute("COMMIT")
    time.sleep(0.005)
print(n)
"""


def test_harness_catches_a_deferred_begin(sqlite_target: Target, tmp_path: Path) -> None:
    """The same run with write transactions starting as plain BEGIN: a claim reads as a
    reader and upgrades to a writer later, which SQLite refuses at once (the busy timeout is
    not consulted). The harness must report it, even when the bounded retry hides every
    refusal from the callers.

    How often workers collide on their own depends on the machine's load (on an idle machine
    they may not collide at all), so a steady committer makes collisions certain: every
    worker that starts a claim while it holds the lock is refused, and it holds the lock two
    thirds of the time for the whole run."""
    path = sqlite_target.sqlite_path
    assert path is not None
    stop = tmp_path / "stop"
    bumper = subprocess.Popen([sys.executable, "-c", BUMPER, path, str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        with environment(JOBCOORD_TEST_DEFERRED_WRITES="1"):
            run = run_contention(path, tmp_path, 300, 8)
    finally:
        stop.touch()
        commits, _ = bumper.communicate(timeout=60)
    report(run, "deferred BEGIN, 8 processes, 300 jobs, a steady committer")
    assert int(commits) > 0
    found = findings(path, 300, run)
    assert found, "the contention harness did not notice write transactions using BEGIN"


def test_a_steady_committer_alone_is_not_a_finding(sqlite_target: Target, tmp_path: Path
                                                   ) -> None:
    """The control for the test above: the same committer beside workers that use BEGIN
    IMMEDIATE leaves nothing to report, so what it found was the deferred BEGIN."""
    path = sqlite_target.sqlite_path
    assert path is not None
    stop = tmp_path / "stop"
    bumper = subprocess.Popen([sys.executable, "-c", BUMPER, path, str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        run = run_contention(path, tmp_path, 300, 8)
    finally:
        stop.touch()
        bumper.communicate(timeout=60)
    assert findings(path, 300, run) == []


# --- the busy bound ----------------------------------------------------------------------


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


class HeldLock:
    """Another process holding `path`'s write lock (BEGIN IMMEDIATE) until `release()`."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)


def snapshot_rows(path: str) -> tuple[Any, ...]:
    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
                     for t in ("jobs", "leases", "job_events", "workers"))
    finally:
        conn.close()


@pytest.mark.parametrize("command", [
    ["enqueue", "work", "--payload", "{}"],
    ["claim", "w1"],
    ["complete", "1", "--worker", "w1", "--epoch", "1", "--result", "{}"],
    ["reap"],
    ["migrate"],  # migrate's longer wait is its default only: --busy-timeout bounds it too
], ids=["enqueue", "claim", "complete", "reap", "migrate"])
def test_lock_held_past_the_busy_bound_exits_5_and_changes_nothing(
        sqlite_target: Target, command: list[str]) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        c.heartbeat("w1")
        c.enqueue("work", {})
        c.enqueue("work", {})
        c.claim("w1")
    before = snapshot_rows(path)
    held = HeldLock(path)
    try:
        res = jobcoord_cli(path, "--busy-timeout", "0.05", *command, "--json")
    finally:
        held.release()
    assert res.returncode == 5, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"]["code"] == "database_locked"
    assert "Traceback" not in res.stderr
    assert "nothing was changed" in res.stderr
    assert snapshot_rows(path) == before
    assert_invariants(path)


def test_lock_released_within_the_busy_timeout_is_waited_out(sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    held = HeldLock(path)
    proc = subprocess.Popen([sys.executable, "-m", "jobcoord", "--db", path, "--busy-timeout",
                             "30", "enqueue", "work", "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the enqueue is now waiting on the lock (or still starting up)
    assert proc.poll() is None
    held.release()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert json.loads(out)["created"] is True


def test_migrate_without_a_busy_timeout_waits_out_a_lock_longer_than_the_default_5s(
        sqlite_target: Target) -> None:
    """migrate's own default wait (60 s) is longer than every other command's 5 s, so a
    concurrent migrate or a long write finishes first; JOBCOORD_BUSY_TIMEOUT bounds it as the
    flag does."""
    path = sqlite_target.sqlite_path
    assert path is not None
    env = {k: v for k, v in os.environ.items() if k != "JOBCOORD_BUSY_TIMEOUT"}
    held = HeldLock(path)
    try:
        bounded = jobcoord_cli(path, "migrate", "--json",
                               env_extra={"JOBCOORD_BUSY_TIMEOUT": "0.05"})
        assert bounded.returncode == 5, bounded.stdout + bounded.stderr
        proc = subprocess.Popen([sys.executable, "-m", "jobcoord", "--db", path, "migrate",
                                 "--json"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(6.5)  # past the 5 s every other command waits
        assert proc.poll() is None, proc.communicate()
    finally:
        held.release()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert json.loads(out)["changed"] is False


# --- idempotent submission under contention -------------------------------------------------


def test_same_idempotency_key_from_eight_processes_creates_one_job(sqlite_target: Target,
                                                                   tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    start = SPAWN.Event()
    procs = []
    for i in range(8):
        payload = {"doc": "a"} if i % 2 == 0 else {"doc": "b"}
        ledger = str(tmp_path / f"sub{i}.json")
        p = SPAWN.Process(target=enqueue_with_key, args=(path, "K-1", payload, ledger, start))
        p.start()
        procs.append((p, ledger))
    start.set()
    outs = []
    for p, ledger in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
        outs.append(json.loads(Path(ledger).read_text()))
    # Every caller got an answer: the job, or the conflict. Never an internal error.
    assert {o.get("error") for o in outs} <= {None, "idempotency_conflict"}, outs
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT job_id, payload_json FROM jobs").fetchall()
    conn.close()
    assert len(rows) == 1
    (job_id, stored), = rows
    winner = json.loads(stored)
    created = [o for o in outs if "ok" in o and o["ok"]["created"]]
    assert len(created) == 1
    for o in outs:
        if o["payload"] == winner:
            assert o["ok"]["job_id"] == job_id
        else:
            assert o["error"] == "idempotency_conflict" and o["exit"] == 4
            assert o["job_id"] == job_id
    assert_invariants(path)


def test_reaper_loop_outlives_a_lock_held_past_the_busy_bound(sqlite_target: Target) -> None:
    """`reap --every` is a long-running sweep: a pass refused as busy is skipped (and said
    on stderr), the loop goes on, and the next pass after the lock is released reaps."""
    path = sqlite_target.sqlite_path
    assert path is not None
    job_id = one_job(path, lease_s=0.2)
    held = HeldLock(path)
    reaper = subprocess.Popen([sys.executable, "-m", "jobcoord", "--db", path,
                               "--busy-timeout", "0.05", "reap", "--every", "0.1", "--json"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 60
        time.sleep(3.0)  # several passes meet the held lock
        assert reaper.poll() is None, reaper.communicate()
    finally:
        held.release()
    conn = sqlite3.connect(path, timeout=30)
    while conn.execute("SELECT status FROM jobs WHERE job_id = ?", (job_id,)
                       ).fetchone()[0] != "waiting":
        assert time.monotonic() < deadline, "the reaper never reaped after the lock was freed"
        assert reaper.poll() is None, reaper.communicate()
        time.sleep(0.1)
    conn.close()
    reaper.terminate()
    out, err = reaper.communicate(timeout=30)
    assert reaper.returncode == 0, err
    assert "Traceback" not in err
    assert "reap pass skipped (database_locked)" in err
    assert any(json.loads(line).get("expired") == 1 for line in out.splitlines())
    assert_invariants(path)
