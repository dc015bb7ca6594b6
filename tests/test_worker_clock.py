"""A worker resumed after a suspend (simulated by moving the clocks it reads; SQLite).

The coordinator judges leases by the wall clock; CLOCK_MONOTONIC stops while a machine is
suspended. A worker must notice the gap at once: stop its handler if the wall clock says the
lease is over, renew at once if it is not, and heartbeat at once either way."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from examples.handlers import app
from jobcoord.service import Coordinator
from jobcoord.worker import Clock, Log, Worker, WorkerConfig
from tests.test_worker import read, wait_for

pytestmark = pytest.mark.timeout(60)


class MovableClock(Clock):
    """The real clocks, plus jumps a test applies: `wall_s` to the wall clock, `boot_s` to
    CLOCK_BOOTTIME. The monotonic clock is never moved (it does not count a suspend)."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.boot_s = 0.0

    def boot(self) -> float:
        return super().boot() + self.boot_s

    def wall_us(self) -> int:
        return super().wall_us() + round(self.wall_s * 1e6)


class _Lines(io.TextIOBase):
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.lines.extend(line for line in text.splitlines() if line)
        return len(text)

    def events(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in map(json.loads, self.lines) if e["event"] == name]


@contextlib.contextmanager
def _running(target: Any, handlers: dict[str, Any], clock: MovableClock, log: _Lines
             ) -> Iterator[tuple[Coordinator, Worker]]:
    """A worker with a 30 s lease on its own thread, reading `clock`, logging to `log`."""
    c = Coordinator.open(target)
    cfg = WorkerConfig(worker_id="w1", handlers=handlers, roles=[], lease_s=30.0,
                       heartbeat_s=30.0, reap_s=0.0, poll_s=0.05, grace_s=0.2,
                       log_format="json")
    worker = Worker(c, cfg, Log("w1", "json", stream=log), clock=clock)  # type: ignore[arg-type]
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield c, worker
    finally:
        worker.stopping.set()
        worker.wake.set()
        thread.join(20)
        c.close()


@pytest.fixture
def resumable(sqlite_target: Any) -> Iterator[Any]:
    clock, log = MovableClock(), _Lines()
    with _running(sqlite_target, {"sleepy": app.handlers["sleepy"]}, clock, log) as (c, w):
        yield c, clock, log, w


def _heartbeat_at(c: Coordinator) -> str:
    return c.workers()["workers"][0]["heartbeat_at"]


def test_after_a_suspend_past_the_lease_the_handler_is_stopped_and_a_heartbeat_sent_at_once(
        resumable, tmp_path):
    c, clock, log, _ = resumable
    marker = str(tmp_path / "sleepy")
    c.enqueue("sleepy", {"seconds": 60, "marker": marker})
    wait_for(lambda: os.path.exists(marker + ".started"), 10, "the handler to start")
    before = _heartbeat_at(c)
    # Resume: the wall clock moved 40 s past a 30 s lease; monotonic and boot time did not
    # (the hardest case: only the wall clock can tell).
    clock.wall_s = 40.0
    t0 = time.monotonic()
    wait_for(lambda: os.path.exists(marker), 3, "the handler to be stopped")
    assert time.monotonic() - t0 < 1.5  # at once, not at the next renewal (10 s)
    assert read(marker) == "lease_expired"
    lost = log.events("lease_lost")
    assert lost and "wall clock" in lost[0]["detail"]
    wait_for(lambda: _heartbeat_at(c) != before, 1.5, "a heartbeat right after the resume")


def test_after_a_short_suspend_the_lease_is_renewed_at_once(resumable, tmp_path):
    c, clock, log, _ = resumable
    marker = str(tmp_path / "sleepy")
    job = c.enqueue("sleepy", {"seconds": 60, "marker": marker})["job_id"]
    wait_for(lambda: os.path.exists(marker + ".started"), 10, "the handler to start")
    before = _heartbeat_at(c)
    expires = c.show(job)["lease"]["expires_at"]
    # A 5 s suspend: CLOCK_BOOTTIME and the wall clock moved, monotonic did not. The lease
    # (30 s, renewed every 10 s) is still valid: renew now instead of trusting the timer.
    clock.wall_s = clock.boot_s = 5.0
    wait_for(lambda: log.events("renewed"), 1.5, "a renewal right after the resume")
    assert c.show(job)["lease"]["expires_at"] > expires
    assert not os.path.exists(marker)  # still running, still ours
    wait_for(lambda: _heartbeat_at(c) != before, 1.5, "a heartbeat right after the resume")


def test_a_handler_returning_after_the_lease_ended_has_its_outcome_discarded(
        sqlite_target: Any) -> None:
    """A worker stopped (SIGSTOP, a suspend) while its Python handler ran, resumed past the
    lease's end: the handler returned before the loop looked at the clocks, and its result
    was sent (refused `lease_expired`, or `stale_epoch` once another worker held the job,
    leaving a `complete_refused` event). The outcome of an attempt whose lease is over is
    discarded, as documented: `lease_lost`, nothing reported. Here the coordinator's own
    clock is not moved, so a result sent would even have been accepted."""
    from jobcoord.app import App

    late = App()
    clock, log = MovableClock(), _Lines()

    @late.handler("late")
    def resumes_past_the_lease(payload: dict, ctx: Any) -> dict:
        clock.wall_s = clock.boot_s = 40.0  # the process resumes 40 s on, past a 30 s lease
        return {"ok": 1}

    with _running(sqlite_target, {"late": late.handlers["late"]}, clock, log) as (c, _):
        job = c.enqueue("late", {})["job_id"]
        wait_for(lambda: log.events("lease_lost") or log.events("completed"), 10,
                 "the handler's outcome")
        assert not log.events("completed"), log.lines
        assert log.events("lease_lost")[0]["reason"] == "lease_expired"
        shown = c.show(job)
        assert shown["job"]["status"] == "running", shown  # its lease runs out; reaped later
        assert [e["reason"] for e in shown["events"]] == ["enqueued", "claimed"], shown
