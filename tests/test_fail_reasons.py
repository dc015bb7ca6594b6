"""A failure report names its reason, which becomes its event's reason code: any name of the
caller's, except the reasons jobcoord records for its own transitions and refusals. A failed
attempt recorded as `completed` was taken by `completed_by` as an accepted result, and a
forged `claimed` or `lease_expired` event broke the history's count of epochs and the
expiry metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobcoord.core.items import RESERVED_REASONS
from jobcoord.errors import InvalidInput, Refused
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.serve_procs import served, token
from tests.test_artifacts_rules import install
from tests.timeline import IDLE_ON_AC

#: What the worker runtime and the artifact rules send as a failure's reason.
FAILURE_REASONS = ("failed", "timeout", "invalid_result", "result_too_large",
                   "worker_shutdown", "artifact_invalid")
REFUSED = sorted(RESERVED_REASONS | {"complete_refused", "fail_refused", "artifact_refused"})
#: The same names in other cases: a reader matching reasons without regard to case (a log
#: search, a dashboard filter) would take `Completed` for `completed`.
REFUSED += ["Completed", "CLAIMED", "Lease_Expired", "Fail_Refused"]


def _running(c: Coordinator) -> tuple[int, int]:
    c.heartbeat("w1", readings=IDLE_ON_AC)
    c.enqueue("k", {"i": 1})
    got = c.claim("w1", lease_s=300)
    return got["job"]["job_id"], got["lease"]["epoch"]


@pytest.mark.parametrize("reason", REFUSED)
def test_a_failure_naming_a_reason_jobcoord_records_for_itself_is_refused_and_changes_nothing(
        coord: Coordinator, reason: str) -> None:
    job_id, epoch = _running(coord)
    before = dump(coord)
    with pytest.raises(InvalidInput, match="records for its own transitions") as e:
        coord.fail(job_id, "w1", epoch, "boom", reason=reason)
    assert e.value.details["field"] == "reason"
    with pytest.raises(InvalidInput, match=r"items\[0\]: reason"):
        coord.fail_many([{"job_id": job_id, "worker_id": "w1", "epoch": epoch,
                          "error": "boom", "reason": reason}])
    assert dump(coord) == before
    assert coord.completed_by(job_id, "w1", epoch) is False


@pytest.mark.parametrize("reason", [*FAILURE_REASONS, "oom", "cuda.error:7"])
def test_a_failure_may_name_its_own_reason(coord: Coordinator, reason: str) -> None:
    job_id, epoch = _running(coord)
    coord.fail(job_id, "w1", epoch, "boom", reason=reason)
    events = coord.show(job_id)["events"]
    assert events[-1]["reason"] == reason
    assert coord.completed_by(job_id, "w1", epoch) is False


def test_every_reason_jobcoord_records_for_itself_is_reserved(
        sqlite_target: Any, tmp_path: Path, clock: Any) -> None:
    """Every transition and refusal there is, on one database: the reasons recorded, less
    the failures' own, are all refused as a failure's reason (a new transition's reason
    that is not reserved fails here)."""
    install(sqlite_target)
    with Coordinator.open(sqlite_target) as c:
        c.artifacts_dir = str(tmp_path / "store")
        c.heartbeat("w1", readings=IDLE_ON_AC)

        def take() -> tuple[int, int]:
            got = c.claim("w1", lease_s=30)
            return got["job"]["job_id"], got["lease"]["epoch"]

        ids = [c.enqueue("k", {"i": i})["job_id"] for i in range(8)]
        j, e = take()  # completed, with an accepted artifact; a late report of it refused
        c.put_artifact(j, "w1", e, "out.txt", b"hello")
        c.complete(j, "w1", e, {"ok": True})
        with pytest.raises(Refused):
            c.complete(j, "w1", e, {"again": True})
        with pytest.raises(Refused):
            c.fail(j, "w1", e, "late")
        with pytest.raises(Refused):
            c.put_artifact(j, "w1", e, "late.txt", b"x")
        j, e = take()  # a staged artifact of a failed attempt, rejected by the gc
        c.put_artifact(j, "w1", e, "part.txt", b"part")
        c.fail(j, "w1", e, "boom")
        c.gc_artifacts(grace_s=0)
        j, e = take()  # effect started, then unknown, reconciled
        c.mark_effect(j, "w1", e)
        c.fail(j, "w1", e, "boom")
        c.reconcile(j, "dead", "checked by hand")
        j, e = take()  # cancelled while running: cancel requested
        c.cancel(j)
        c.cancel(ids[-1])  # cancelled while waiting
        j, e = take()  # dead, retried by the operator
        c.fail(j, "w1", e, "boom", permanent=True)
        c.retry(j)
        j, e = take()  # its lease expires and the reaper takes it back
        clock.tick(31)
        c.reap()
        c.enqueue("k", {"deadline": 1}, deadline_s=5)
        clock.tick(6)
        c.reap()  # a waiting job past its deadline
        recorded = c.db.read(lambda conn: set(conn.exec_driver_sql(
            "SELECT DISTINCT reason FROM job_events").scalars()))
    expected = {"enqueued", "claimed", "completed", "complete_refused", "fail_refused",
                "artifact_refused", "artifact_staged", "artifact_verified",
                "artifact_accepted", "artifact_rejected", "effect_started", "reconciled",
                "cancel_requested", "cancelled", "operator_retry", "lease_expired",
                "deadline_passed", "failed"}
    assert expected <= recorded, expected - recorded  # the scenario covers what it says
    own = recorded - set(FAILURE_REASONS)
    assert all(r in RESERVED_REASONS or r.endswith("_refused") for r in own), \
        own - RESERVED_REASONS


def test_the_server_refuses_a_reserved_reason_too(target: Any) -> None:
    with Coordinator.open(target) as c:
        job_id, epoch = _running(c)
        secret = token(target, "w1", "worker", worker="w1")
        before = dump(c)
        with served(target, "--reap-every", "0") as s, s.client(secret) as http:
            resp = http.post(f"/v1/jobs/{job_id}/fail",
                             json={"epoch": epoch, "error": "boom", "reason": "completed"})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == "invalid_input"
        assert dump(c) == before
