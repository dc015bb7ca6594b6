"""The seed's five tests, exactly as stated, on SQLite and PostgreSQL, with a frozen clock."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from jobcoord.errors import Refused
from jobcoord.maintenance import check
from tests.timeline import IDLE_ON_AC, at, iso_at


def assert_checks_pass(coord) -> None:
    result = check(coord.db)
    assert result["ok"], result


def test_p0_user_request_is_claimed_before_p3_idle_learning(coord):
    with freeze_time(at(0)) as clock:
        # The P3 job is older, so only priority can put the P0 job first.
        idle = coord.enqueue("idle_learning", {"archive": "notes"}, priority="P3", role="gpu")
        clock.tick(1)
        user = coord.enqueue("user_request", {"doc": "report.pdf"}, priority="P0", role="gpu")
        coord.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
        first = coord.claim("w1")
        assert first["job"]["job_id"] == user["job_id"]
        assert first["job"]["priority"] == 0
        second = coord.claim("w1")
        assert second["job"]["job_id"] == idle["job_id"]
        assert second["job"]["priority"] == 3
    assert_checks_pass(coord)


def test_worker_at_90_percent_memory_gets_no_claim_under_85_percent_policy(coord):
    assert coord.policy.max_memory_pct == 85
    with freeze_time(at(0)):
        job = coord.enqueue("user_request", {"doc": 1}, priority="P0", role="gpu")
        coord.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 90})
        got = coord.claim("w1")
        assert got["job"] is None
        assert got["reason"] == "memory_gate"
        assert "90" in got["detail"] and "85" in got["detail"]
        assert coord.show(job["job_id"])["job"]["status"] == "waiting"
        assert coord.show(job["job_id"])["lease"] is None
    assert_checks_pass(coord)


def test_45s_lease_from_t102_expires_at_t147_and_is_refused_at_t148_before_reaping(coord):
    with freeze_time(at(100)) as clock:
        job = coord.enqueue("user_request", {"doc": 1}, priority="P0", role="gpu")
        job_id = job["job_id"]
        coord.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
        coord.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)

        clock.move_to(at(102))
        got = coord.claim("w1", lease_s=45)
        assert got["lease"]["expires_at"] == iso_at(147)
        epoch = got["lease"]["epoch"]

        clock.move_to(at(148))
        with pytest.raises(Refused) as refused:
            coord.complete(job_id, "w1", epoch, {"late": True})
        assert refused.value.code == "lease_expired"
        shown = coord.show(job_id)
        assert shown["job"]["status"] == "running"  # the reaper has not run
        assert shown["job"]["result"] is None

        clock.move_to(at(149))
        reaped = coord.reap()
        assert reaped["expired"] == 1 and reaped["waiting"] == 1
        assert coord.show(job_id)["job"]["status"] == "waiting"

        clock.move_to(at(150))
        coord.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)
        again = coord.claim("w2")
        assert again["job"]["job_id"] == job_id
        assert again["lease"]["worker_id"] == "w2"
        assert again["lease"]["epoch"] > epoch
    assert_checks_pass(coord)


def test_second_completion_of_finished_job_is_refused_and_first_result_unchanged(coord):
    with freeze_time(at(0)) as clock:
        job_id = coord.enqueue("user_request", {"doc": 1}, priority="P0")["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        epoch = coord.claim("w1")["lease"]["epoch"]
        coord.complete(job_id, "w1", epoch, {"summary": "first"})
        first = coord.show(job_id)["job"]

        clock.tick(1)
        with pytest.raises(Refused) as refused:
            coord.complete(job_id, "w1", epoch, {"summary": "second"})
        assert refused.value.code == "job_finished"
        after = coord.show(job_id)["job"]
        assert after["result"] == {"summary": "first"}
        assert after == first
    assert_checks_pass(coord)


def test_completion_after_lease_expiry_is_refused(coord):
    with freeze_time(at(0)) as clock:
        job_id = coord.enqueue("user_request", {"doc": 1}, priority="P0")["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        got = coord.claim("w1", lease_s=30)
        epoch = got["lease"]["epoch"]

        clock.move_to(at(30))  # exactly at expires_at: the lease is over
        with pytest.raises(Refused) as refused:
            coord.complete(job_id, "w1", epoch, {"late": True})
        assert refused.value.code == "lease_expired"
        job = coord.show(job_id)["job"]
        assert job["status"] == "running" and job["result"] is None
    assert_checks_pass(coord)
