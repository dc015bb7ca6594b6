"""Rule 6 after an external effect, and the bound on shutdown releases.

After an attempt marked an external effect (`effect_started`), any end without an accepted
result (a retryable failure, a handler timeout, a shutdown release, lease expiry) makes the job
`unknown` for `reconcile`: the effect is never silently run again. Only a worker that knows the
effect did not happen (`effect_not_applied=True`, `fail --effect-not-applied`) takes the normal
retry path. Shutdown releases grant an extra attempt only `max_releases` times.

Every test runs on SQLite and PostgreSQL under a frozen clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobcoord.maintenance import check
from jobcoord.policy import Policy
from jobcoord.service import Coordinator
from tests.timeline import IDLE_ON_AC


@pytest.fixture(autouse=True)
def invariants_hold_afterwards(coord: Coordinator) -> Iterator[None]:
    yield
    result = check(coord.db)
    assert result["ok"], result


def _effect_started(coord: Coordinator, **enqueue: Any) -> tuple[int, int]:
    job_id = coord.enqueue("pay", {"amount": 5}, **enqueue)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim("w1", lease_s=30)
    epoch = got["lease"]["epoch"]
    coord.mark_effect(job_id, "w1", epoch)
    return job_id, epoch


def _last_event(coord: Coordinator, job_id: int) -> dict[str, Any]:
    return coord.show(job_id)["events"][-1]


@pytest.mark.parametrize("reason", ["failed", "timeout", "worker_shutdown"])
def test_an_end_without_a_result_after_an_effect_makes_the_job_unknown(coord, clock, reason):
    job_id, epoch = _effect_started(coord, max_attempts=5)
    out = coord.fail(job_id, "w1", epoch, "connection reset", reason=reason)
    assert out["status"] == "unknown"
    job = coord.show(job_id)["job"]
    assert job["status"] == "unknown" and job["effect_started"]
    last = _last_event(coord, job_id)
    assert (last["from"], last["to"], last["reason"]) == ("running", "unknown", reason)
    # Nobody can claim it again until an operator reconciles it.
    assert coord.claim("w1")["job"] is None


def test_lease_expiry_after_an_effect_makes_the_job_unknown(coord, clock):
    job_id, _ = _effect_started(coord, max_attempts=5)
    clock.tick(31)
    coord.reap()
    assert coord.show(job_id)["job"]["status"] == "unknown"


def test_a_permanent_failure_after_an_effect_is_dead_with_the_evidence_kept(coord, clock):
    job_id, epoch = _effect_started(coord)
    out = coord.fail(job_id, "w1", epoch, "card declined", permanent=True)
    assert out["status"] == "dead"
    job = coord.show(job_id)["job"]
    assert job["status"] == "dead" and job["effect_started"]
    assert "effect_started" in [e["reason"] for e in coord.show(job_id)["events"]]


def test_effect_not_applied_takes_the_normal_retry_path_and_is_recorded(coord, clock):
    job_id, epoch = _effect_started(coord, max_attempts=5)
    out = coord.fail(job_id, "w1", epoch, "refused before sending", effect_not_applied=True)
    assert out["status"] == "waiting"
    last = _last_event(coord, job_id)
    assert (last["to"], last["reason"]) == ("waiting", "failed")
    assert last["detail"]["effect_not_applied"] is True


def test_fail_effect_not_applied_from_the_cli(coord, clock, cli):
    job_id, epoch = _effect_started(coord, max_attempts=5)
    r = cli("fail", str(job_id), "--worker", "w1", "--epoch", str(epoch), "--error", "x",
            "--effect-not-applied", "--json")
    assert r.code == 0, r.err
    assert r.json["status"] == "waiting"
    assert _last_event(coord, job_id)["detail"]["effect_not_applied"] is True


def test_effect_not_applied_without_an_effect_changes_nothing_of_the_rule(coord, clock):
    job_id = coord.enqueue("pay", {}, max_attempts=5)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    epoch = coord.claim("w1")["lease"]["epoch"]
    assert coord.fail(job_id, "w1", epoch, "x", effect_not_applied=True)["status"] == "waiting"


def test_shutdown_releases_past_max_releases_count_as_attempts(target, clock):
    coord = Coordinator.open(target, policy=Policy(max_releases=2))
    try:
        job_id = coord.enqueue("long", {}, max_attempts=1)["job_id"]
        statuses = []
        for _ in range(3):
            coord.heartbeat("w1", readings=IDLE_ON_AC)
            got = coord.claim("w1")
            assert got["job"] is not None, got
            out = coord.fail(job_id, "w1", got["lease"]["epoch"], "stopping",
                             reason="worker_shutdown")
            statuses.append(out["status"])
        # Two releases were free; the third counts as the job's one real attempt.
        assert statuses == ["waiting", "waiting", "dead"]
        assert coord.show(job_id)["job"]["attempts"] == 3
    finally:
        coord.close()


def test_max_releases_default_is_ten(coord, clock):
    assert Policy().max_releases == 10
    job_id = coord.enqueue("long", {}, max_attempts=1)["job_id"]
    statuses = []
    for _ in range(11):
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        got = coord.claim("w1")
        statuses.append(coord.fail(job_id, "w1", got["lease"]["epoch"], "stopping",
                                   reason="worker_shutdown")["status"])
    assert statuses == ["waiting"] * 10 + ["dead"]
