"""The worker's reused threads and the batching rules that keep claims and groups large: a
worker starts a thread per slot, not per job; a finished run's slot is free before the claim
loop is woken; work never waits for a busy thread; the completer flushes at once when every
live run's result is in, and still waits its delay while another run could join."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

from jobcoord.app import App, Context
from jobcoord.service import Coordinator, JobSpec
from jobcoord.worker.completer import Completer
from jobcoord.worker.config import WorkerConfig
from jobcoord.worker.log import Log
from jobcoord.worker.loop import Worker
from jobcoord.worker.threads import Threads
from tests.test_worker import wait_for
from tests.test_worker_batching import _item
from tests.timeline import IDLE_ON_AC

pytestmark = pytest.mark.timeout(120)


def test_threads_are_reused_and_a_busy_one_never_holds_up_new_work() -> None:
    pool = Threads("t")
    for _ in range(50):
        pool.submit(lambda: None).join(5)
    # Sequential work: one thread, every time.
    assert pool.started == 1
    hold = threading.Event()
    stuck = pool.submit(hold.wait)  # like a handler that ignores its stop
    ran = threading.Event()
    other = pool.submit(ran.set)
    assert ran.wait(5), "work waited for a busy thread"
    other.join(5)
    assert stuck.is_alive() and not other.is_alive()
    assert pool.started == 2
    hold.set()
    stuck.join(5)
    assert not stuck.is_alive()
    pool.close()


def test_a_task_is_over_before_its_then_runs() -> None:
    pool = Threads("t")
    seen: list[bool] = []
    done = threading.Event()

    def then() -> None:
        seen.append(task.is_alive())
        done.set()

    task = pool.submit(lambda: time.sleep(0.05), then=then)
    assert done.wait(5)
    # The claim loop woken by `then` must already see the slot free.
    assert seen == [False]
    pool.close()


def test_an_error_in_the_work_ends_the_task_and_the_thread_lives_on() -> None:
    pool = Threads("t")

    def boom() -> None:
        raise RuntimeError("x")

    failed = pool.submit(boom)
    failed.join(5)
    assert not failed.is_alive()
    after = threading.Event()
    pool.submit(after.set)
    assert after.wait(5) and pool.started == 1
    pool.close()


app = App()


@app.handler("quick")
def quick(payload: Any, ctx: Context) -> dict[str, Any]:
    return {"job": ctx.job_id}


def test_a_worker_starts_threads_per_slot_not_per_job(sqlite_target: Any) -> None:
    n, slots = 120, 4
    c = Coordinator.open(sqlite_target)
    try:
        c.enqueue_many([JobSpec("quick", {}) for _ in range(n)])
        cfg = WorkerConfig(worker_id="w1", handlers={"quick": app.handlers["quick"]}, roles=[],
                           heartbeat_s=5.0, reap_s=0.0, poll_s=0.05, concurrency=slots)
        w = Worker(c, cfg, Log("w1", "json", io.StringIO()))
        thread = threading.Thread(target=w.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: c.status()["jobs"].get("succeeded", 0) == n, 60,
                     "every job to succeed")
        finally:
            w.stopping.set()
            w.wake.set()
            thread.join(30)
        assert w.counts["completed"] == n
        # One run's lease keeper per slot (a chained start may borrow one more), and as
        # many handler threads: never one per job.
        assert w.slots.started <= slots + 1, w.slots.started
        assert w.handler_threads.started <= slots + 1, w.handler_threads.started
        # A handler that returns at once runs on its run's own thread: no hand-over to a
        # lease loop on another thread (a few may be, on a busy machine).
        assert w.counts["handed_over"] <= n // 10, w.counts["handed_over"]
        shown = c.jobs(status="succeeded", limit=1)["jobs"][0]
        prov = c.show(shown["job_id"])["job"]["provenance"]
        assert prov["worker"] == "w1" and prov["python"] and prov["jobcoord"]
        assert prov["handler"]["type"] == "python"
    finally:
        c.close()


def test_the_completer_flushes_at_once_when_every_live_run_is_in(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k"), JobSpec("k")])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 2, lease_s=60)["claimed"]
    completer = Completer(coord.complete_many, coord.complete, group=8, delay_s=10.0,
                          running=lambda: 2)
    out: list[Any] = []
    threads = [threading.Thread(target=lambda g=g: out.append(
        completer.complete(_item(g), time.monotonic() + 60))) for g in got]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    completer.close()
    # Both live runs were in: no third result could join, so no 10 s wait.
    assert time.monotonic() - t0 < 5 and len(out) == 2
    assert completer.flushes["all"] >= 1 and completer.flushes["delay"] == 0
    assert all(a["status"] == "succeeded" for a in out)


def test_the_completer_waits_its_delay_while_another_run_could_join(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k")])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 1, lease_s=60)["claimed"]
    completer = Completer(coord.complete_many, coord.complete, group=8, delay_s=0.6,
                          running=lambda: 2)
    t0 = time.monotonic()
    answer = completer.complete(_item(got[0]), time.monotonic() + 60)
    waited = time.monotonic() - t0
    completer.close()
    assert answer["status"] == "succeeded"
    assert waited >= 0.55, "flushed early although another live run could still join"
    assert completer.flushes["delay"] == 1 and completer.flushes["all"] == 0
