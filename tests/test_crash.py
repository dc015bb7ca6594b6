"""Crashes and pauses with real processes and real signals.

A worker killed while it owns a job loses it only to the lease; a process killed between the
statements of a claim or a completion leaves the whole change or none of it; a worker paused
past its lease cannot renew or complete when it wakes; the reaper and a completer racing on
the same lease never both win; two migrations at once leave one schema; a backup taken while
writers run is a consistent database.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.invariants import assert_invariants, violations
from tests.procs import enqueue_writer, one_job

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
SPAWN = multiprocessing.get_context("spawn")

# A worker as its own OS process: claim (optionally mark an external effect), print the lease
# as one JSON line, then either sit on the job or renew it every 0.5 s until refused, and then
# try to complete it. Every answer it gets is printed as a JSON line.
WORKER = r"""
import json, sys, time
from jobcoord.errors import JobcoordError
from jobcoord.service import Coordinator
path, worker, lease, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
c = Coordinator.open(path)
c.heartbeat(worker)
got = c.claim(worker, lease_s=lease)
job_id, epoch = got["job"]["job_id"], got["lease"]["epoch"]
if mode == "effect":
    c.mark_effect(job_id, worker, epoch)
print(json.dumps({"job_id": job_id, "epoch": epoch}), flush=True)
if mode in ("sit", "effect"):
    time.sleep(3600)
while True:
    try:
        c.renew(job_id, worker, epoch, lease_s=lease)
        print(json.dumps({"renew": "ok"}), flush=True)
    except JobcoordError as e:
        print(json.dumps({"renew": e.code}), flush=True)
        break
    # Long enough that the test's SIGSTOP lands here, not inside a write transaction.
    time.sleep(0.5)
try:
    c.complete(job_id, worker, epoch, {"by": worker})
    print(json.dumps({"complete": "ok"}), flush=True)
except JobcoordError as e:
    print(json.dumps({"complete": e.code}), flush=True)
"""


def start_worker(path: str, worker: str, lease: float, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WORKER, path, worker, str(lease), mode],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def read_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"worker said nothing; stderr: {proc.stderr.read() if proc.stderr else ''}"
    return dict(json.loads(line))


def cli(path: str, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if fault:
        env["JOBCOORD_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "jobcoord", "--db", path, *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


def job_row(path: str, job_id: int) -> tuple[Any, ...]:
    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute("SELECT status, epoch, attempts FROM jobs WHERE job_id = ?",
                                  (job_id,)).fetchone())
    finally:
        conn.close()


def wait_past(expires_at_s: float) -> None:
    time.sleep(max(0.0, expires_at_s - time.time()) + 0.05)


# --- a worker killed while it owns a job -----------------------------------------------------


@pytest.mark.parametrize(("mode", "after_reap"), [("sit", "waiting"), ("effect", "unknown")])
def test_killed_worker_loses_the_job_only_when_its_lease_expires(
        sqlite_target: Target, mode: str, after_reap: str) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        job_id = c.enqueue("work", {"x": 1})["job_id"]
        proc = start_worker(path, "doomed", 4.0, mode)
        claimed = read_line(proc)
        granted = time.time()
        assert claimed == {"job_id": job_id, "epoch": 1}
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        # The lease is still live: the job stays running and nothing reaps it.
        assert c.reap()["expired"] == 0
        assert job_row(path, job_id) == ("running", 1, 1)
        wait_past(granted + 4.0)
        reaped = c.reap()
        assert reaped["jobs"] == [{"job_id": job_id, "epoch": 1, "to": after_reap}]
        assert job_row(path, job_id)[0] == after_reap
        c.heartbeat("rescuer")
        if after_reap == "unknown":
            # Never run an effect twice on a guess: unknown waits for an operator.
            assert c.claim("rescuer")["job"] is None
            c.reconcile(job_id, "waiting", "checked the remote side: nothing was sent")
        got = c.claim("rescuer")
        assert got["job"]["job_id"] == job_id and got["lease"]["epoch"] == 2
        c.complete(job_id, "rescuer", 2, {"by": "rescuer"})
    # The dead worker's epoch can never complete it, whoever sends it.
    late = cli(path, "complete", str(job_id), "--worker", "doomed", "--epoch", "1",
               "--result", "{}", "--json")
    assert late.returncode == 4, late.stdout + late.stderr
    assert json.loads(late.stdout)["error"]["code"] == "job_finished"
    with Coordinator.open(path) as c:
        assert c.show(job_id)["job"]["result"] == {"by": "rescuer"}
    assert_invariants(path)


# --- SIGKILL inside the claim and complete transactions ---------------------------------------


@pytest.mark.parametrize("point", ["claim.after_take", "claim.after_lease",
                                   "claim.after_event"])
def test_kill_inside_a_claim_leaves_no_half_owned_job(sqlite_target: Target,
                                                      point: str) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    job_id = one_job(path)
    res = cli(path, "claim", "w1", "--json", fault=f"{point}:kill")
    assert res.returncode == -signal.SIGKILL, res.stdout + res.stderr
    # None of the claim happened: still waiting, epoch 0, no lease, no claimed event.
    assert job_row(path, job_id) == ("waiting", 0, 0)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0
    assert conn.execute("SELECT reason FROM job_events").fetchall() == [("enqueued",)]
    conn.close()
    check = cli(path, "check", "--full", "--json")
    assert check.returncode == 0, check.stdout
    assert_invariants(path)
    # And the job is claimable as if nothing had happened.
    again = cli(path, "claim", "w1", "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["lease"]["epoch"] == 1


@pytest.mark.parametrize("point", ["completed.after_update", "completed.after_drop_lease",
                                   "completed.after_event"])
def test_kill_inside_a_completion_keeps_the_lease_whole(sqlite_target: Target,
                                                        point: str) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    job_id = one_job(path, lease_s=600)
    res = cli(path, "complete", str(job_id), "--worker", "w1", "--epoch", "1",
              "--result", '{"n": 1}', "--json", fault=f"{point}:kill")
    assert res.returncode == -signal.SIGKILL
    assert job_row(path, job_id) == ("running", 1, 1)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT job_id, epoch, worker_id FROM leases").fetchall() == [
        (job_id, 1, "w1")]
    assert conn.execute("SELECT COUNT(*) FROM job_events WHERE reason = 'completed'"
                        ).fetchone()[0] == 0
    conn.close()
    assert cli(path, "check", "--full").returncode == 0
    assert_invariants(path)
    # The worker never got an answer, so it retries: the retry is accepted once.
    retry = cli(path, "complete", str(job_id), "--worker", "w1", "--epoch", "1",
                "--result", '{"n": 1}', "--json")
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert job_row(path, job_id) == ("succeeded", 1, 1)
    assert_invariants(path)


@pytest.mark.parametrize("batch", [0, 16], ids=["single", "batched"])
def test_kills_at_random_moments_never_corrupt_or_half_apply(sqlite_target: Target,
                                                             tmp_path: Path, batch: int) -> None:
    """Claim/complete processes killed at random times (no fault point): after every kill the
    database checks clean and every job is wholly waiting, running with its lease, or done."""
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        c.enqueue_many([{"kind": "work", "payload": {"i": i}} for i in range(3000)])
    rng = random.Random(4)
    script = ("import sys\nfrom tests.procs import claim_complete_worker\n"
              "class Go:\n    def wait(self): pass\n"
              "claim_complete_worker(sys.argv[1], sys.argv[2], sys.argv[3], Go(),"
              f" batch={batch})\n")
    for trial in range(5):
        proc = subprocess.Popen([sys.executable, "-c", script, path, f"k{trial}",
                                 str(tmp_path / f"k{trial}.json")], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.6 + rng.random() * 0.6)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        found = violations(path)
        assert found == [], f"after kill {trial}: {found}"


# --- a paused worker ---------------------------------------------------------------------


def test_worker_paused_past_its_lease_cannot_renew_or_complete(sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        job_id = c.enqueue("work", {})["job_id"]
        proc = start_worker(path, "sleeper", 2.0, "renew")
        assert read_line(proc) == {"job_id": job_id, "epoch": 1}
        assert read_line(proc) == {"renew": "ok"}
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.5)  # past any lease it could have renewed before the stop
            assert c.reap()["jobs"] == [{"job_id": job_id, "epoch": 1, "to": "waiting"}]
            c.heartbeat("other")
            got = c.claim("other", lease_s=60)
            assert got["lease"]["epoch"] == 2
        finally:
            proc.send_signal(signal.SIGCONT)
        lines = [read_line(proc)]
        while "complete" not in lines[-1]:
            lines.append(read_line(proc))
        assert proc.wait(timeout=30) == 0
        # Renews still in flight when it stopped are fine; the first one after waking fails.
        assert {"renew": "stale_epoch"} in lines
        assert lines[-1] == {"complete": "stale_epoch"}
        c.complete(job_id, "other", 2, {"by": "other"})
        assert c.show(job_id)["job"]["result"] == {"by": "other"}
    assert_invariants(path)


# --- the reaper racing a completer -------------------------------------------------------


def reaper_loop(path: str, stop: Any) -> None:
    with Coordinator.open(path) as c:
        while not stop.is_set():
            c.reap()


def test_reaper_racing_a_completer_never_lets_both_win(sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    n = 60
    lease = 0.1
    with Coordinator.open(path) as c:
        for i in range(n):
            c.enqueue("work", {"i": i}, max_attempts=1)
        c.heartbeat("racer")
        stop = SPAWN.Event()
        reaper = SPAWN.Process(target=reaper_loop, args=(path, stop))
        reaper.start()
        rng = random.Random(7)
        outcomes: dict[tuple[int, int], str] = {}
        try:
            for _ in range(n):
                got = c.claim("racer", lease_s=lease)
                assert got["job"] is not None
                key = (got["job"]["job_id"], got["lease"]["epoch"])
                time.sleep(rng.uniform(0.0, 2 * lease))
                try:
                    c.complete(key[0], "racer", key[1], {"ok": True})
                    outcomes[key] = "accepted"
                except Exception as e:
                    outcomes[key] = getattr(e, "code", repr(e))
        finally:
            stop.set()
            reaper.join(timeout=60)
        c.reap()
    assert set(outcomes.values()) <= {"accepted", "lease_expired", "job_finished"}
    conn = sqlite3.connect(path)
    ends = {(j, e): r for j, e, r in conn.execute(
        "SELECT job_id, epoch, reason FROM job_events WHERE from_status = 'running'"
        " AND to_status <> 'running'")}
    statuses = dict(conn.execute("SELECT job_id, status FROM jobs"))
    conn.close()
    for key, outcome in outcomes.items():
        if outcome == "accepted":
            assert ends[key] == "completed" and statuses[key[0]] == "succeeded"
        else:
            assert ends[key] == "lease_expired" and statuses[key[0]] == "dead"
    accepted = sum(o == "accepted" for o in outcomes.values())
    print(f"\nreaper race: {accepted} completions accepted, {n - accepted} lost to the reaper")
    # Both sides must have won sometimes, or the race was not exercised.
    assert 0 < accepted < n
    assert_invariants(path)


# --- two migrations at once ---------------------------------------------------------------


def test_two_migrations_at_once_on_a_new_file_leave_one_schema(tmp_path: Path) -> None:
    for trial in range(3):
        path = str(tmp_path / f"new{trial}.db")
        procs = [subprocess.Popen([sys.executable, "-m", "jobcoord", "--db", path, "migrate",
                                   "--json"], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        for code, out, err in results:
            assert code == 0, out + err
        changed = sorted(json.loads(out)["changed"] for _, out, _ in results)
        assert changed == [False, True]
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT COUNT(*) FROM alembic_version").fetchone()[0] == 1
        conn.close()
        assert cli(path, "check", "--full").returncode == 0
        assert_invariants(path)


# --- backup while writers run -------------------------------------------------------------


def test_backup_taken_while_writers_run_is_a_consistent_database(sqlite_target: Target,
                                                                 tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    writers = [SPAWN.Process(target=enqueue_writer, args=(path, str(tmp_path / f"l{i}")))
               for i in range(4)]
    for w in writers:
        w.start()
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"l{i}").exists() and (tmp_path / f"l{i}").stat().st_size
                      for i in range(4)):
            assert time.monotonic() < deadline, "the writers did not start"
            time.sleep(0.1)
        for i in range(3):
            dest = str(tmp_path / f"backup{i}.db")
            res = cli(path, "backup", dest, "--json")
            assert res.returncode == 0, res.stdout + res.stderr
            assert json.loads(res.stdout)["quick_check"] == ["ok"]
            conn = sqlite3.connect(dest)
            assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] > 0
            conn.close()
            found = violations(dest, wal=False)
            assert found == [], found
            time.sleep(0.3)
    finally:
        for w in writers:
            w.kill()
            w.join(timeout=30)
    assert_invariants(path)
