"""Wake-ups: an idle worker waits for the store's hint that jobs became claimable (SQLite:
`PRAGMA data_version`; PostgreSQL: LISTEN/NOTIFY sent by the committing transaction) instead
of sleeping its whole poll; the poll stays the authority and the fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.conftest import _pg_admin, dump
from tests.test_worker import wait_for
from tests.timeline import IDLE_ON_AC, at, iso_at

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parent.parent


def _woken_by(coord: Coordinator, action: Any, timeout: float = 5.0) -> tuple[bool, float]:
    """Wait on a fresh waiter while `action` runs 0.1 s later: (woken early, seconds)."""
    waiter = coord.db.change_waiter()
    try:
        assert waiter.mode != "poll"
        timer = threading.Timer(0.1, action)
        t0 = time.monotonic()
        timer.start()
        woke = waiter.wait(timeout, threading.Event())
        waited = time.monotonic() - t0
        timer.join()
        return woke, waited
    finally:
        waiter.close()


def test_an_enqueue_commit_wakes_a_waiting_worker(coord: Coordinator) -> None:
    woke, waited = _woken_by(coord, lambda: coord.enqueue("k"))
    assert woke and waited < 2.0


def test_a_job_back_to_waiting_wakes_a_waiting_worker(coord: Coordinator) -> None:
    coord.enqueue("k")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim("w1")
    woke, waited = _woken_by(coord, lambda: coord.fail(
        got["job"]["job_id"], "w1", 1, "released", reason="worker_shutdown"))
    assert woke and waited < 2.0


def test_claimable_reads_without_recording_anything(coord: Coordinator) -> None:
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.heartbeat("hot", readings=IDLE_ON_AC | {"memory_used_pct": 95})
    before = dump(coord)
    assert coord.claimable("w1") is False and coord.claimable("nobody") is False
    coord.enqueue("k")
    before = dump(coord)
    assert coord.claimable("w1") is True
    assert coord.claimable("w1", kinds=["other"]) is False
    assert coord.claimable("hot") is False  # the memory gate
    assert dump(coord) == before


def test_claimable_is_false_while_limits_or_unfit_needs_hold_every_waiting_job(
        coord: Coordinator) -> None:
    """A job a limit holds, or whose needs do not fit, is not one the worker could take:
    the look says no, exactly as the claim would refuse, and records nothing."""
    for w in ("w1", "w2"):
        coord.heartbeat(w, readings=IDLE_ON_AC)
    coord.set_limit("llm", 1)
    coord.enqueue("llm", {"n": 1})
    coord.enqueue("llm", {"n": 2})
    assert coord.claim("w1")["job"] is not None
    before = dump(coord)
    assert coord.claimable("w2") is False
    assert dump(coord) == before
    assert coord.claim("w2")["reason"] == "concurrency_limit"  # the claim agrees
    coord.set_limit("embed", 1, key="model")
    coord.enqueue("embed", {"model": "a"})
    assert coord.claimable("w2") is True
    assert coord.claim("w2")["job"]["payload"] == {"model": "a"}
    coord.enqueue("embed", {"model": "a"})
    assert coord.claimable("w2") is False  # the key's slot is held
    coord.enqueue("embed", {"model": "b"})
    assert coord.claimable("w2") is True  # another key's is free
    assert coord.claim("w2")["job"]["payload"] == {"model": "b"}
    coord.enqueue("render", {}, needs={"gpu_mem_mb": 12000})  # no GPU reported
    assert coord.claimable("w2") is False
    assert coord.claim("w2")["reason"] in ("concurrency_limit", "resource_short")
    coord.heartbeat("w2", readings=IDLE_ON_AC | {"memory_available_mb": 100})
    coord.enqueue("render", {}, needs={"ram_mb": 10})
    assert coord.claimable("w2") is True
    assert coord.claim("w2")["job"]["kind"] == "render"


def test_idle_workers_do_not_answer_each_others_refusals_while_a_limit_holds_the_queue(
        target: Target, tmp_path: Path) -> None:
    """Every refused claim is a commit, and every commit wakes the idle workers (on SQLite,
    any change of the file). With the only waiting job held by a limit, a look that
    ignored the limit would send each woken worker into a refused claim, waking the
    others: two idle workers refusing each other without end, a core's worth of CPU."""
    with Coordinator.open(target) as coord:
        coord.set_limit("summarize", 1)
        coord.heartbeat("holder", readings=IDLE_ON_AC)
        coord.enqueue("summarize", {"text": "held"})
        coord.enqueue("summarize", {"text": "waits"})
        assert coord.claim("holder", lease_s=600)["job"] is not None
        logs = [tmp_path / f"w{i}.log" for i in range(2)]
        procs = [_worker(target, log, "--poll", "30", worker_id=f"idle{i}")
                 for i, log in enumerate(logs)]
        try:
            for log in logs:
                wait_for(lambda log=log: b"waiting_for" in log.read_bytes(), 30,
                         "the workers to go idle")
            time.sleep(0.5)
            before = _refusals(coord, "idle%")
            time.sleep(2.0)
            assert _refusals(coord, "idle%") == before
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)


def test_idle_workers_woken_by_other_commits_do_not_claim_in_answer(
        target: Target, tmp_path: Path) -> None:
    """Every refused claim is counted (a write): an idle worker woken by another's commit
    looks first, read-only, and claims only when something is there for it."""
    log = tmp_path / "w.log"
    with Coordinator.open(target) as coord:
        proc = _worker(target, log, "--poll", "30")
        try:
            wait_for(lambda: b"waiting_for" in log.read_bytes(), 30, "the worker to go idle")
            time.sleep(0.3)
            before = _refusals(coord)
            for i in range(20):  # commits that make nothing claimable for "idle"
                coord.heartbeat(f"other{i}", readings=IDLE_ON_AC)
                coord.claim(f"other{i}")
                time.sleep(0.02)
            time.sleep(0.3)
            assert _refusals(coord) == before
            assert _pickup_s(coord, log) < 3.0  # and a real job still wakes it
        finally:
            proc.terminate()
            proc.wait(30)


def _refusals(coord: Coordinator, workers: str = "idle") -> int:
    """Refused claims counted for the workers whose id is LIKE `workers`."""
    from jobcoord.store.statements import SQL

    stmt = SQL("SELECT COALESCE(SUM(n), 0) FROM claim_refusals WHERE worker_id LIKE :w")
    return int(coord.db.read(lambda conn: coord.db.run(conn, stmt, {"w": workers}).scalar()))


def test_a_repeated_refusal_is_recorded_again_after_five_seconds_and_a_new_one_at_once(
        coord: Coordinator, clock: Any) -> None:
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.claim("w1")
    clock.move_to(at(4.9))
    coord.claim("w1")
    assert coord.workers()["workers"][0]["last_refusal"]["at"] == iso_at(0)
    clock.move_to(at(5))
    coord.claim("w1")
    assert coord.workers()["workers"][0]["last_refusal"]["at"] == iso_at(5)
    clock.move_to(at(6))
    coord.heartbeat("w1", readings=IDLE_ON_AC | {"memory_used_pct": 95})
    coord.claim("w1")
    assert coord.workers()["workers"][0]["last_refusal"] == {
        "reason": "memory_gate", "detail": coord.claim("w1")["detail"], "at": iso_at(6)}


def _worker(target: Target, log: Path, *args: str, worker_id: str = "idle"
            ) -> subprocess.Popen[bytes]:
    where = (["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url])
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "jobcoord", *where, "worker", "--worker-id", worker_id,
             "--app", "examples.handlers:app", "--log-format", "json",
             "--heartbeat-every", "10", "--reap-every", "0", *args],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)


def _pickup_s(coord: Coordinator, log: Path) -> float:
    """Seconds from an enqueue's commit to its job's completion by the idle worker."""
    t0 = time.monotonic()
    job = coord.enqueue("summarize", {"text": "a b"})["job_id"]
    wait_for(lambda: coord.show(job)["job"]["status"] == "succeeded", 30, "the job's pickup")
    return time.monotonic() - t0


def test_an_idle_worker_picks_a_new_job_up_long_before_its_poll(target: Target,
                                                                 tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    with Coordinator.open(target) as coord:
        proc = _worker(target, log, "--poll", "20")
        try:
            wait_for(lambda: b"waiting_for" in log.read_bytes(), 30, "the worker to go idle")
            assert b'"hint": "poll"' not in log.read_bytes()
            time.sleep(0.2)
            assert _pickup_s(coord, log) < 3.0
            assert _pickup_s(coord, log) < 3.0  # and again, after waiting anew
        finally:
            proc.terminate()
            proc.wait(30)


def test_without_listen_the_poll_still_picks_jobs_up(request: pytest.FixtureRequest,
                                                      tmp_path: Path) -> None:
    """PostgreSQL: the listening connection cut (as a pooler without LISTEN, or a network
    drop, would): the worker falls back to its poll and still picks every job up."""
    from tests.conftest import fresh_pg

    log = tmp_path / "w.log"
    with fresh_pg(request.getfixturevalue("pg_template")) as target, \
            Coordinator.open(target) as coord:
        proc = _worker(target, log, "--poll", "0.5")
        try:
            wait_for(lambda: b"waiting_for" in log.read_bytes(), 30, "the worker to go idle")
            dbname = target.url.rsplit("/", 1)[1]
            with _pg_admin() as admin:
                killed = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "application_name = 'jobcoord-listen' AND datname = %s", (dbname,)
                ).fetchall()
            assert killed == [(True,)]
            for _ in range(3):
                assert _pickup_s(coord, log) < 5.0
            assert proc.poll() is None, log.read_text()
        finally:
            proc.terminate()
            proc.wait(30)


def test_idle_cpu_of_a_waiting_worker_is_under_one_percent_of_a_core(
        target: Target, tmp_path: Path) -> None:
    proc = _worker(target, tmp_path / "w.log", "--poll", "30")
    try:
        wait_for(lambda: b"waiting_for" in (tmp_path / "w.log").read_bytes(), 30, "idle")
        time.sleep(0.5)
        before, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(5)
        share = (_cpu_s(proc.pid) - before) / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"\nidle worker CPU: {share * 100:.2f}% of a core")
    assert share < 0.01


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
