"""The batched worker runtime: results accepted in groups, each handler acknowledged only after
its group committed; a lease near its end is flushed at once; a worker SIGKILLed with a group
half-flushed loses no accepted result and has none accepted twice."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobcoord.app import App, Context
from jobcoord.clock import MICROS
from jobcoord.errors import Refused
from jobcoord.service import Coordinator, JobSpec
from jobcoord.worker.completer import Completer
from jobcoord.worker.config import WorkerConfig
from jobcoord.worker.log import Log
from jobcoord.worker.loop import Worker as WorkerLoop
from tests.invariants import assert_invariants
from tests.test_worker import Worker, wait_for
from tests.timeline import IDLE_ON_AC

pytestmark = pytest.mark.timeout(120)


def _item(got: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": got["job"]["job_id"], "worker_id": got["lease"]["worker_id"],
            "epoch": got["lease"]["epoch"], "result": {"n": got["job"]["job_id"]}}


def test_a_lease_near_its_end_forces_an_early_flush(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k"), JobSpec("k")])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    long = coord.claim("w1", lease_s=60)
    short = coord.claim("w1", lease_s=1.6)
    completer = Completer(coord.complete_many, coord.complete, group=8, delay_s=5.0)
    answers: dict[str, Any] = {}

    def hand_over(name: str, got: dict[str, Any]) -> None:
        left_s = (got["lease"]["expires_at_us"] / MICROS) - time.time()
        try:
            answers[name] = completer.complete(_item(got), time.monotonic() + left_s)
        except Refused as e:
            answers[name] = e.code

    try:
        first = threading.Thread(target=hand_over, args=("long", long))
        first.start()
        time.sleep(0.3)
        assert "long" not in answers, "a group flushed before its delay with no reason"
        t0 = time.monotonic()
        second = threading.Thread(target=hand_over, args=("short", short))
        second.start()
        first.join(10)
        second.join(10)
        waited = time.monotonic() - t0
    finally:
        completer.close()
    # Flushed when the short lease came within the margin of its end (about 0.6 s after it
    # was handed over), not after the 5 s delay, which would have lost it.
    assert answers["short"]["status"] == "succeeded", answers
    assert answers["long"]["status"] == "succeeded"
    assert waited < 2.5
    assert completer.flushes["lease"] == 1 and completer.flushes["delay"] == 0


def test_a_full_group_flushes_without_waiting_for_the_delay(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(4)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 4, lease_s=60)["claimed"]
    completer = Completer(coord.complete_many, coord.complete, group=4, delay_s=30.0)
    out: list[Any] = []
    threads = [threading.Thread(target=lambda g=g: out.append(
        completer.complete(_item(g), time.monotonic() + 60))) for g in got]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    completer.close()
    assert time.monotonic() - t0 < 5 and len(out) == 4
    assert completer.flushes["full"] == 1
    assert all(a["status"] == "succeeded" for a in out)


def test_each_handler_gets_its_own_answer_from_a_group(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 3, lease_s=60)["claimed"]
    stale = _item(got[1]) | {"epoch": 5}
    bad = _item(got[2]) | {"result": {"x": float("nan")}}  # refused as input: on its own
    completer = Completer(coord.complete_many, coord.complete, group=3, delay_s=1.0)
    out: dict[int, Any] = {}

    def hand_over(i: int, item: dict[str, Any]) -> None:
        try:
            out[i] = completer.complete(item, time.monotonic() + 60)["status"]
        except Exception as e:
            out[i] = getattr(e, "code", repr(e))

    threads = [threading.Thread(target=hand_over, args=(i, it))
               for i, it in enumerate([_item(got[0]), stale, bad])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    completer.close()
    assert out == {0: "succeeded", 1: "stale_epoch", 2: "invalid_input"}


def test_sigkill_with_a_half_flushed_group_loses_no_accepted_result_and_accepts_none_twice(
        sqlite_target: Any, tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    ledger = str(tmp_path / "ran.txt")
    rng = random.Random(16)
    n = 80
    with Coordinator.open(path) as c:
        c.enqueue_many([JobSpec("note", {"ledger": ledger, "s": rng.uniform(0, 0.15)})
                        for _ in range(n)])
    # A long flush delay keeps finished results waiting in groups, so the kill lands while
    # some handlers have returned and their group has not been committed yet.
    w = Worker(path, str(tmp_path / "w1.log"), "w1",
               ("--app", "tests.batch_app:app", "--concurrency", "8", "--flush-delay", "0.4",
                "--lease", "3"))
    try:
        def ready() -> bool:
            done = dict(_rows(path, "SELECT status, COUNT(*) FROM jobs GROUP BY status"))
            return done.get("succeeded", 0) >= 16 and bool(_unflushed(path, ledger))
        wait_for(ready, 30, "accepted results and finished handlers waiting in a group")
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait(10)
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
    unflushed = _unflushed(path, ledger)
    assert unflushed, "the kill did not land with a group waiting"
    accepted = {j: (r, e) for j, r, e in _rows(
        path, "SELECT job_id, result_json, epoch FROM jobs WHERE status = 'succeeded'")}
    # Past the dead worker's leases: the reaper offers its jobs again; a second worker runs
    # everything left, the un-flushed jobs included (at least once).
    time.sleep(3.2)
    with Coordinator.open(path) as c:
        c.reap()
    w2 = Worker(path, str(tmp_path / "w2.log"), "w2",
                ("--app", "tests.batch_app:app", "--concurrency", "8", "--burst"))
    code, _ = w2.finish(60)
    assert code == 0
    after = {j: (r, e) for j, r, e in _rows(
        path, "SELECT job_id, result_json, epoch FROM jobs WHERE status = 'succeeded'")}
    assert len(after) == n, "not every job succeeded"
    for job, first in accepted.items():
        assert after[job] == first, f"job {job}'s accepted result changed"
    completed = Counter(j for (j,) in _rows(
        path, "SELECT job_id FROM job_events WHERE reason = 'completed'"))
    assert set(completed.values()) == {1}, "a result was accepted twice"
    for job in unflushed:
        assert after[job][1] == 2, f"job {job} ran its handler but was not run again"
    assert_invariants(path)


def _rows(path: str, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _unflushed(path: str, ledger: str) -> list[int]:
    """Jobs whose handler returned at epoch 1 while the job is still running at epoch 1:
    results waiting in a group that has not committed."""
    try:
        with open(ledger) as f:
            ran = {tuple(map(int, line.split())) for line in f if line.strip()}
    except FileNotFoundError:
        return []
    running = {(j, e) for j, e in _rows(
        path, "SELECT job_id, epoch FROM jobs WHERE status = 'running'")}
    return sorted(j for j, e in ran & running)


quick_app = App()
#: Every handler of the batch returns together: the group's results all wait at once.
together = threading.Barrier(8, timeout=20)


@quick_app.handler("quick")
def quick(payload: Any, ctx: Context) -> dict[str, Any]:
    together.wait()
    return {"job": ctx.job_id}


class _Writes:
    """A log stream that keeps each write apart: what was written together, and when."""

    def __init__(self) -> None:
        self.writes: list[list[dict[str, Any]]] = []

    def write(self, text: str) -> None:
        self.writes.append([json.loads(line) for line in text.splitlines()])

    def flush(self) -> None:
        pass

    def together(self, event: str) -> list[int]:
        """How many `event` lines each write that held any carried."""
        return [n for n in (sum(1 for e in w if e["event"] == event) for w in self.writes)
                if n]


def test_a_claimed_batch_and_a_committed_group_are_each_logged_in_one_write(
        sqlite_target: Any) -> None:
    n, slots = 8, 8
    together.reset()
    c = Coordinator.open(sqlite_target)
    try:
        c.enqueue_many([JobSpec("quick", {}) for _ in range(n)])
        stream = _Writes()
        cfg = WorkerConfig(worker_id="w1", handlers={"quick": quick_app.handlers["quick"]},
                           roles=[], heartbeat_s=5.0, reap_s=0.0, poll_s=0.05,
                           concurrency=slots, burst=True, flush_delay_s=2.0)
        WorkerLoop(c, cfg, Log("w1", "json", stream)).run()
    finally:
        c.close()
    # One claim took all eight (its lines in one write), and their results, handed in
    # together, committed as one group of eight: one write for each, a line per job.
    assert stream.together("claimed") == [n], stream.together("claimed")
    assert stream.together("completed") == [n], stream.together("completed")
    lines = [e for w in stream.writes for e in w]
    assert sorted(e["job_id"] for e in lines if e["event"] == "completed") == list(
        range(1, n + 1))


def test_a_groups_accepted_results_are_noted_before_any_handler_is_acknowledged(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 3, lease_s=60)["claimed"]
    noted: list[list[Any]] = []
    completer = Completer(coord.complete_many, coord.complete, group=3, delay_s=5.0,
                          on_accepted=noted.append)
    seen: dict[int, Any] = {}

    def hand_over(i: int, item: dict[str, Any]) -> None:
        try:
            completer.complete(item, time.monotonic() + 60, note=i)
            seen[i] = list(noted)  # what had been noted when this handler was answered
        except Refused as e:
            seen[i] = e.code

    items = [_item(got[0]), _item(got[1]) | {"epoch": 9}, _item(got[2])]
    threads = [threading.Thread(target=hand_over, args=(i, it)) for i, it in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    completer.close()
    # Only the accepted results are noted, all at once, and before either was answered;
    # the refused one is its own answer and never noted.
    assert noted == [[0, 2]]
    assert seen == {0: [[0, 2]], 1: "stale_epoch", 2: [[0, 2]]}
