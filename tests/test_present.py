"""Presentation: the core hands over times as microseconds, and every answer of the write
operations says them as ISO 8601 text (present.py), on both databases."""

from __future__ import annotations

from typing import Any

from jobcoord.service import Coordinator
from tests.timeline import IDLE_ON_AC, iso_at


def test_every_write_answer_gives_its_times_as_iso_text(coord: Coordinator, clock: Any) -> None:
    t = 0.0

    def tick(s: float) -> None:
        nonlocal t
        clock.tick(s)
        t += s

    assert coord.heartbeat("w1", readings=IDLE_ON_AC)["received_at"] == iso_at(0)
    first = coord.enqueue("work", {"n": 1}, max_attempts=3)["job_id"]
    got = coord.claim("w1", lease_s=45)
    assert got["job"]["job_id"] == first and got["job"]["checkpoints"] == []
    assert got["lease"]["expires_at"] == iso_at(45)

    tick(1)
    assert coord.checkpoint(first, "w1", 1, "step", {"n": 1})["saved_at"] == iso_at(1)
    tick(1)
    assert coord.renew(first, "w1", 1, lease_s=45)["expires_at"] == iso_at(47)
    backoff = coord.policy.backoff_s(1)
    assert coord.fail(first, "w1", 1, "boom")["run_after"] == iso_at(2 + backoff)

    tick(backoff)
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    again = coord.claim("w1", lease_s=45)
    assert again["job"]["job_id"] == first
    assert [c["updated_at"] for c in again["job"]["checkpoints"]] == [iso_at(1)]
    assert again["lease"]["expires_at"] == iso_at(t + 45)

    second = coord.enqueue("work", {"n": 2})["job_id"]
    tick(1)
    both = coord.complete_and_claim(first, "w1", 2, {"ok": 1}, lease_s=45)
    assert both["completed"]["finished_at"] == iso_at(t)
    assert both["next"]["job"]["job_id"] == second
    assert both["next"]["lease"]["expires_at"] == iso_at(t + 45)
    tick(1)
    assert coord.complete(second, "w1", 1, {"ok": 2})["finished_at"] == iso_at(t)

    assert coord.reap()["at"] == iso_at(t)
    assert coord.prune(60, dry_run=True)["cutoff"] == iso_at(t - 60)


def test_every_schedule_and_batch_answer_gives_its_times_as_iso_text(coord: Coordinator,
                                                                     clock: Any) -> None:
    added = coord.add_schedule("minutely", "work", every="60")
    assert added["next_fire_at"] == iso_at(60)
    assert coord.pause_schedule("minutely")["next_fire_at"] is None
    assert coord.resume_schedule("minutely")["next_fire_at"] == iso_at(60)

    clock.tick(60)
    ticked = coord.tick_schedules()
    assert ticked["at"] == iso_at(60) and ticked["fired"] == 1
    assert [s["next_fire_at"] for s in ticked["schedules"]] == [iso_at(120)]

    coord.enqueue("work", {"n": 2}, max_attempts=3)
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    many = coord.claim_many("w1", 2, lease_s=45)
    assert [c["lease"]["expires_at"] for c in many["claimed"]] == [iso_at(105)] * 2
    first, second = (c["job"]["job_id"] for c in many["claimed"])
    clock.tick(1)
    done = coord.complete_many([{"job_id": first, "worker_id": "w1", "epoch": 1,
                                 "result": None}])
    assert [r["finished_at"] for r in done["results"]] == [iso_at(61)]
    failed = coord.fail_many([{"job_id": second, "worker_id": "w1", "epoch": 1,
                               "error": "boom"}])
    assert [r["run_after"] for r in failed["results"]] == [
        iso_at(61 + coord.policy.backoff_s(1))]
