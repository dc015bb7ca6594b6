"""The worker runtime under attack: attempts of one job whose earlier handlers ignore their
stop, with real leases on a real database."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

from jobcoord.app import App, Context
from jobcoord.service import Coordinator
from jobcoord.worker.config import WorkerConfig
from jobcoord.worker.log import Log
from jobcoord.worker.loop import Worker
from jobcoord.worker.run import JobRun
from tests.test_worker import wait_for
from tests.timeline import IDLE_ON_AC

pytestmark = pytest.mark.timeout(120)


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
