"""A worker shutting down releases its job: the job is offered again at once and keeps an
attempt to run in, because a stopping worker is not the job's failure."""

from __future__ import annotations

from datetime import timedelta

from freezegun import freeze_time

from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.timeline import T0

IDLE_ON_AC = {"memory_used_pct": 40, "on_battery": False, "user_idle_s": 900}


def test_a_shutdown_release_is_claimable_at_once_even_on_the_last_attempt(coord: Coordinator
                                                                          ) -> None:
    with freeze_time(T0) as clock:
        job = coord.enqueue("embed", {"doc": 1}, max_attempts=1)["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        coord.claim("w1")
        out = coord.fail(job, "w1", 1, "worker shutting down", reason="worker_shutdown")
        assert out["status"] == "waiting" and out["max_attempts"] == 2
        clock.tick(timedelta(milliseconds=1))
        coord.heartbeat("w2", readings=IDLE_ON_AC)
        again = coord.claim("w2")
        assert again["job"]["job_id"] == job and again["lease"]["epoch"] == 2
        assert again["job"]["attempt"] == 2
        coord.complete(job, "w2", 2, {"ok": True})
        events = coord.show(job)["events"]
        assert [e["reason"] for e in events] == ["enqueued", "claimed", "worker_shutdown",
                                                 "claimed", "completed"]
        assert events[2]["detail"]["max_attempts"] == 2
    assert check(coord.db)["ok"]


def test_free_releases_give_their_attempt_back_so_the_job_keeps_every_real_attempt(
        coord: Coordinator) -> None:
    """README: "Shutdown releases give the attempt back at most max_releases times", and
    guarantees.md: they "are free". Only a release on the job's last attempt gave one back:
    a job of three attempts released twice had one real attempt left, and died after it."""
    with freeze_time(T0) as clock:
        job = coord.enqueue("embed", {"doc": 1}, max_attempts=3)["job_id"]
        statuses = []
        for reason in ("worker_shutdown", "worker_shutdown", "failed", "failed", "failed"):
            coord.heartbeat("w1", readings=IDLE_ON_AC)
            got = coord.claim("w1")
            assert got["job"] is not None and got["job"]["job_id"] == job, (statuses, got)
            statuses.append(coord.fail(job, "w1", got["lease"]["epoch"], "x",
                                       reason=reason)["status"])
            clock.tick(timedelta(hours=1))  # past any backoff
        assert statuses == ["waiting"] * 4 + ["dead"]
        shown = coord.show(job)["job"]
        assert (shown["attempts"], shown["max_attempts"]) == (5, 5)
    assert check(coord.db)["ok"]


def test_an_ordinary_failure_on_the_last_attempt_is_still_dead(coord: Coordinator) -> None:
    with freeze_time(T0):
        job = coord.enqueue("embed", {"doc": 1}, max_attempts=1)["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        coord.claim("w1")
        assert coord.fail(job, "w1", 1, "boom")["status"] == "dead"
    assert check(coord.db)["ok"]


def test_a_release_after_the_deadline_is_dead(coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        job = coord.enqueue("embed", {"doc": 1}, deadline_s=30)["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        coord.claim("w1", lease_s=60)
        clock.tick(timedelta(seconds=31))
        out = coord.fail(job, "w1", 1, "worker shutting down", reason="worker_shutdown")
        assert out["status"] == "dead"
    assert check(coord.db)["ok"]
