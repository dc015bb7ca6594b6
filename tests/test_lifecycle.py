"""The job lifecycle, rule by rule: fencing epochs, renewals, retries with backoff, external
effects and reconciliation, checkpoints, cancel, retry, reaping, and the event history.

Every test runs on SQLite and PostgreSQL under a frozen clock, and the storage and application
invariants (`maintenance.check`) must hold when it ends."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.errors import InvalidInput, Refused
from jobcoord.maintenance import check
from jobcoord.policy import Policy
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC, at, iso_at

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def invariants_hold_afterwards(coord: Coordinator) -> Iterator[None]:
    yield
    result = check(coord.db)
    assert result["ok"], result


def refused(code: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Refused:
    with pytest.raises(Refused) as caught:
        fn(*args, **kwargs)
    assert caught.value.code == code, caught.value.message
    assert caught.value.exit_code == 4
    return caught.value


def start(coord: Coordinator, worker: str = "w1", *, lease_s: float = 45, **enqueue: Any
          ) -> tuple[int, int]:
    """Enqueue one job, heartbeat `worker` and claim the job; returns (job_id, epoch)."""
    job_id = coord.enqueue("work", {"n": 1}, **enqueue)["job_id"]
    coord.heartbeat(worker, readings=IDLE_ON_AC)
    got = coord.claim(worker, lease_s=lease_s)
    assert got["job"]["job_id"] == job_id
    return job_id, got["lease"]["epoch"]


def claim(coord: Coordinator, worker: str, lease_s: float = 45) -> dict[str, Any]:
    coord.heartbeat(worker, readings=IDLE_ON_AC)
    return coord.claim(worker, lease_s=lease_s)


def status(coord: Coordinator, job_id: int) -> str:
    return coord.show(job_id)["job"]["status"]


def transitions(coord: Coordinator, job_id: int) -> list[tuple[Any, str, str]]:
    return [(e["from"], e["to"], e["reason"]) for e in coord.show(job_id)["events"]]


# --- fencing ------------------------------------------------------------------------------


def test_epoch_increases_on_every_claim_of_a_job(coord, clock):
    job_id, epoch1 = start(coord, lease_s=10)
    epochs = [epoch1]
    for n in range(2):
        clock.tick(11)
        assert coord.reap()["waiting"] == 1
        got = claim(coord, f"w{n + 2}", lease_s=10)
        assert got["job"]["job_id"] == job_id
        epochs.append(got["lease"]["epoch"])
    assert epochs == sorted(set(epochs)) and len(epochs) == 3
    assert coord.show(job_id)["job"]["epoch"] == epochs[-1]


def test_stale_epoch_is_refused_and_changes_nothing(coord, clock):
    job_id, epoch1 = start(coord, lease_s=10)
    clock.tick(11)
    coord.reap()
    epoch2 = claim(coord, "w2")["lease"]["epoch"]
    before = coord.show(job_id)
    # The late first worker, and even the new owner quoting the old epoch, are fenced off.
    for worker in ("w1", "w2"):
        refused("stale_epoch", coord.complete, job_id, worker, epoch1, {"late": True})
        refused("stale_epoch", coord.renew, job_id, worker, epoch1)
        refused("stale_epoch", coord.fail, job_id, worker, epoch1, "late")
        refused("stale_epoch", coord.mark_effect, job_id, worker, epoch1)
        refused("stale_epoch", coord.checkpoint, job_id, worker, epoch1, "step", {"x": 1})
    assert "is stale" in refused("stale_epoch", coord.complete, job_id, "w1", epoch1, {}).message
    after = coord.show(job_id)
    assert after["job"] == before["job"] and after["lease"] == before["lease"]
    assert after["checkpoints"] == []
    coord.complete(job_id, "w2", epoch2, {"ok": True})
    assert coord.show(job_id)["job"]["result"] == {"ok": True}


def test_an_epoch_no_claim_gave_yet_is_refused_as_not_given_not_as_stale(coord, clock):
    """An epoch past the job's was refused as "epoch 8 is stale", which sent a reader
    looking for a newer attempt that never was. Still `stale_epoch` (the code scripts
    match), said as what it is."""
    job_id, epoch = start(coord)
    before = coord.show(job_id)
    with pytest.raises(Refused) as e:
        coord.complete(job_id, "w1", epoch + 7, {"late": True})
    assert e.value.code == "stale_epoch"
    assert "stale" not in e.value.message and "never" in e.value.message, e.value.message
    assert f"epoch {epoch}" in e.value.message
    after = coord.show(job_id)  # (a complete_refused event records the refusal)
    assert after["job"] == before["job"] and after["lease"] == before["lease"]


def test_only_the_lease_owner_may_act_on_a_running_job(coord, clock):
    job_id, epoch = start(coord)
    coord.heartbeat("intruder", readings=IDLE_ON_AC)
    refused("not_owner", coord.complete, job_id, "intruder", epoch, {"stolen": True})
    refused("not_owner", coord.renew, job_id, "intruder", epoch)
    refused("not_owner", coord.fail, job_id, "intruder", epoch, "nope")
    refused("not_owner", coord.mark_effect, job_id, "intruder", epoch)
    refused("not_owner", coord.checkpoint, job_id, "intruder", epoch, "step")
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "running" and shown["lease"]["worker_id"] == "w1"
    assert not shown["job"]["effect_started"] and shown["checkpoints"] == []


def test_unknown_job_id_is_not_found_for_every_fenced_operation(coord, clock):
    refused("job_not_found", coord.complete, 999, "w1", 1, {})
    refused("job_not_found", coord.renew, 999, "w1", 1)
    refused("job_not_found", coord.fail, 999, "w1", 1, "x")
    refused("job_not_found", coord.mark_effect, 999, "w1", 1)
    refused("job_not_found", coord.checkpoint, 999, "w1", 1, "step")


# --- renew --------------------------------------------------------------------------------


def test_renew_extends_a_live_lease_of_its_owner_and_epoch(coord, clock):
    job_id, epoch = start(coord, lease_s=45)
    clock.tick(40)
    renewed = coord.renew(job_id, "w1", epoch, lease_s=45)
    assert renewed["expires_at"] == iso_at(85)
    assert coord.show(job_id)["lease"]["expires_at"] == iso_at(85)
    clock.move_to(at(60))  # past the original expiry, inside the renewed one
    assert coord.reap()["expired"] == 0
    coord.complete(job_id, "w1", epoch, {"ok": True})
    assert status(coord, job_id) == "succeeded"


def test_renew_after_expiry_is_refused_even_before_reaping(coord, clock):
    job_id, epoch = start(coord, lease_s=45)
    clock.move_to(at(45))
    refused("lease_expired", coord.renew, job_id, "w1", epoch)
    assert coord.show(job_id)["lease"]["expires_at"] == iso_at(45)
    coord.reap()
    refused("lease_expired", coord.renew, job_id, "w1", epoch)
    assert status(coord, job_id) == "waiting"


def test_renew_of_a_job_cancelled_meanwhile_says_job_cancelled_and_ends_it(coord, clock):
    job_id, epoch = start(coord)
    assert coord.cancel(job_id) == {"job_id": job_id, "status": "running",
                                    "cancel_requested": True}
    assert status(coord, job_id) == "running"
    refused("job_cancelled", coord.renew, job_id, "w1", epoch)
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "cancelled" and shown["lease"] is None
    # From then on every fenced call keeps saying so.
    refused("job_cancelled", coord.complete, job_id, "w1", epoch, {})
    assert coord.show(job_id)["job"]["result"] is None


# --- fail, retries and backoff ---------------------------------------------------------------


def test_backoff_formula_doubles_from_the_base_and_stops_at_the_cap():
    p = Policy(retry_base_s=10, retry_max_s=600)
    assert [p.backoff_s(n) for n in range(1, 9)] == [10, 20, 40, 80, 160, 320, 600, 600]
    assert Policy(retry_base_s=3, retry_max_s=7).backoff_s(3) == 7
    assert p.backoff_s(10**6) == 600  # no overflow for absurd attempt counts


def test_retryable_failure_waits_the_backoff_then_dies_at_max_attempts(coord, clock):
    job_id = coord.enqueue("work", {"n": 1}, max_attempts=3)["job_id"]
    t = 0.0
    for attempt, backoff in ((1, 10), (2, 20)):
        got = claim(coord, "w1")
        assert got["job"]["attempt"] == attempt
        out = coord.fail(job_id, "w1", got["lease"]["epoch"], f"error {attempt}")
        assert out["status"] == "waiting"
        assert out["run_after"] == iso_at(t + backoff)
        job = coord.show(job_id)["job"]
        assert job["status"] == "waiting" and job["run_after"] == iso_at(t + backoff)
        assert job["last_error"] == f"error {attempt}"
        # Not claimable a microsecond before run_after...
        clock.move_to(at(t + backoff) - timedelta(microseconds=1))
        early = claim(coord, "w1")
        assert early["job"] is None and early["reason"] == "no_waiting_jobs"
        assert status(coord, job_id) == "waiting"
        # ...and claimable at run_after.
        t += backoff
        clock.move_to(at(t))
    got = claim(coord, "w1")
    assert got["job"]["attempt"] == 3
    out = coord.fail(job_id, "w1", got["lease"]["epoch"], "error 3")
    assert out["status"] == "dead" and "3 attempts" in out["dead_because"]
    assert claim(coord, "w1")["job"] is None

    shown = coord.show(job_id)
    fails = [e for e in shown["events"] if e["reason"] == "failed"]
    assert [e["detail"]["error"] for e in fails] == ["error 1", "error 2", "error 3"]
    assert [e["detail"].get("backoff_s") for e in fails] == [10, 20, None]
    assert [e["to"] for e in fails] == ["waiting", "waiting", "dead"]
    assert shown["job"]["attempts"] == 3 and shown["job"]["last_error"] == "error 3"
    assert shown["job"]["finished_at"] == iso_at(t)


def test_backoff_uses_the_policy_and_is_capped(coord, clock):
    capped = Coordinator(coord.db, Policy(retry_base_s=5, retry_max_s=12), verify=False)
    job_id = capped.enqueue("work", {}, max_attempts=5)["job_id"]
    chosen = []
    for _ in range(3):
        got = claim(capped, "w1")
        out = capped.fail(job_id, "w1", got["lease"]["epoch"], "boom")
        chosen.append(capped.show(job_id)["events"][-1]["detail"]["backoff_s"])
        clock.move_to(datetime.fromisoformat(out["run_after"].replace("Z", "+00:00")))
    assert chosen == [5, 10, 12]


def test_retry_that_would_start_past_the_deadline_goes_dead(coord, clock):
    job_id = coord.enqueue("work", {}, max_attempts=5, deadline_s=25)["job_id"]
    got = claim(coord, "w1")
    assert coord.fail(job_id, "w1", got["lease"]["epoch"], "first")["status"] == "waiting"
    clock.move_to(at(10))  # backoff 10 s: run_after = 10 < deadline 25
    got = claim(coord, "w1")
    out = coord.fail(job_id, "w1", got["lease"]["epoch"], "second")  # next at 30 > 25
    assert out["status"] == "dead" and "deadline" in out["dead_because"]
    shown = coord.show(job_id)
    assert shown["job"]["attempts"] == 2 < shown["job"]["max_attempts"]
    assert shown["events"][-1]["detail"]["dead_because"] == out["dead_because"]


def test_a_deadline_must_leave_time_after_the_delay(coord, clock):
    with pytest.raises(InvalidInput) as caught:
        coord.enqueue("work", {}, delay_s=60, deadline_s=60)
    assert caught.value.message.startswith("deadline")
    job_id = coord.enqueue("work", {}, delay_s=60, deadline_s=61)["job_id"]
    clock.move_to(at(60))
    assert claim(coord, "w1")["job"]["job_id"] == job_id


def test_permanent_failure_goes_straight_to_dead(coord, clock):
    job_id, epoch = start(coord, max_attempts=5)
    out = coord.fail(job_id, "w1", epoch, "bad input file", permanent=True)
    assert out["status"] == "dead" and out["dead_because"] == "permanent failure"
    job = coord.show(job_id)["job"]
    assert job["status"] == "dead" and job["attempts"] == 1
    assert job["last_error"] == "bad input file"
    refused("job_finished", coord.fail, job_id, "w1", epoch, "again")


def test_expired_lease_with_attempts_used_is_reaped_to_dead(coord, clock):
    job_id, _ = start(coord, lease_s=10, max_attempts=1)
    clock.tick(10)
    reaped = coord.reap()
    assert reaped["dead"] == 1 and reaped["waiting"] == 0
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "dead"
    assert "lease expired" in shown["job"]["last_error"]
    assert shown["events"][-1]["detail"]["because"] == "all 1 attempts used"


def test_expired_lease_past_the_deadline_is_reaped_to_dead(coord, clock):
    job_id, _ = start(coord, lease_s=30, deadline_s=20)
    clock.tick(30)
    assert coord.reap()["dead"] == 1
    assert coord.show(job_id)["events"][-1]["detail"]["because"] == "deadline passed"


# --- external effects and reconciliation ---------------------------------------------------


def _unknown_job(coord: Coordinator, clock: Any) -> int:
    job_id, epoch = start(coord, lease_s=10)
    assert coord.mark_effect(job_id, "w1", epoch)["effect_started"] is True
    assert coord.show(job_id)["job"]["effect_started"] is True
    clock.tick(10)
    reaped = coord.reap()
    assert reaped["unknown"] == 1 and reaped["waiting"] == 0
    assert status(coord, job_id) == "unknown"
    return job_id


def test_expiry_after_an_external_effect_makes_the_job_unknown_and_unclaimable(coord, clock):
    job_id = _unknown_job(coord, clock)
    got = claim(coord, "w2")
    assert got["job"] is None and got["reason"] == "no_waiting_jobs"
    refused("illegal_transition", coord.cancel, job_id)
    assert coord.show(job_id)["events"][-1]["detail"]["because"] == (
        "an external effect had started")


def test_reconcile_as_succeeded_needs_a_result_and_keeps_it(coord, clock):
    job_id = _unknown_job(coord, clock)
    with pytest.raises(InvalidInput):
        coord.reconcile(job_id, "succeeded", "provider shows the call finished")
    assert status(coord, job_id) == "unknown"
    coord.reconcile(job_id, "succeeded", "provider shows R-17 done", result={"remote": "R-17"})
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "succeeded"
    assert shown["job"]["result"] == {"remote": "R-17"}
    last = shown["events"][-1]
    assert (last["from"], last["to"], last["reason"]) == ("unknown", "succeeded", "reconciled")
    assert last["detail"]["reason"] == "provider shows R-17 done"


def test_reconcile_as_waiting_offers_the_job_again_with_an_attempt_left(coord, clock):
    job_id = _unknown_job(coord, clock)
    # A result given with it was dropped without a word: the job runs again and its next
    # attempt's result is the one kept. Refused, nothing changed.
    before = dump(coord)
    with pytest.raises(InvalidInput) as e:
        coord.reconcile(job_id, "waiting", "never reached", result={"remote": "R-17"})
    assert "result" in e.value.message and dump(coord) == before
    coord.reconcile(job_id, "waiting", "the call never reached the provider")
    job = coord.show(job_id)["job"]
    assert job["status"] == "waiting" and not job["effect_started"]
    got = claim(coord, "w2")
    assert got["job"]["job_id"] == job_id
    assert got["job"]["attempt"] == 2 <= got["job"]["max_attempts"]


def test_reconcile_as_dead_records_the_reason(coord, clock):
    job_id = _unknown_job(coord, clock)
    coord.reconcile(job_id, "dead", "provider rejected it")
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "dead" and shown["job"]["result"] is None
    assert shown["events"][-1]["detail"] == {"reason": "provider rejected it"}


@pytest.mark.parametrize("state", ["waiting", "running", "succeeded", "dead", "cancelled"])
def test_reconcile_is_refused_for_jobs_that_are_not_unknown(coord, clock, state):
    job_id, epoch = start(coord)
    if state == "waiting":
        coord.fail(job_id, "w1", epoch, "retry me")
    elif state == "succeeded":
        coord.complete(job_id, "w1", epoch, {"ok": 1})
    elif state == "dead":
        coord.fail(job_id, "w1", epoch, "x", permanent=True)
    elif state == "cancelled":
        coord.cancel(job_id)
        refused("job_cancelled", coord.renew, job_id, "w1", epoch)
    before = coord.show(job_id)
    assert before["job"]["status"] == state
    refused("illegal_transition", coord.reconcile, job_id, "dead", "why not", result=None)
    assert coord.show(job_id) == before


# --- checkpoints ------------------------------------------------------------------------------


def test_checkpoints_written_under_an_epoch_reach_the_next_attempt(coord, clock):
    job_id, epoch1 = start(coord, lease_s=10)
    coord.checkpoint(job_id, "w1", epoch1, "uploaded", {"remote_id": "R-17"})
    coord.checkpoint(job_id, "w1", epoch1, "step", {"n": 1})
    coord.checkpoint(job_id, "w1", epoch1, "step", {"n": 2})  # replaced, not duplicated
    clock.tick(10)
    coord.reap()
    got = claim(coord, "w2")
    assert got["lease"]["epoch"] > epoch1
    cps = {c["name"]: (c["data"], c["epoch"], c["worker_id"]) for c in got["job"]["checkpoints"]}
    assert cps == {"uploaded": ({"remote_id": "R-17"}, epoch1, "w1"),
                   "step": ({"n": 2}, epoch1, "w1")}
    # The old attempt cannot write any more; the new one can.
    refused("stale_epoch", coord.checkpoint, job_id, "w1", epoch1, "step", {"n": 99})
    coord.checkpoint(job_id, "w2", got["lease"]["epoch"], "step", {"n": 3})
    by_name = {c["name"]: c for c in coord.show(job_id)["checkpoints"]}
    assert by_name["step"]["data"] == {"n": 3}
    assert by_name["step"]["epoch"] == got["lease"]["epoch"]


def test_checkpoint_after_lease_expiry_is_refused(coord, clock):
    job_id, epoch = start(coord, lease_s=10)
    clock.tick(10)
    refused("lease_expired", coord.checkpoint, job_id, "w1", epoch, "late", {})
    assert coord.show(job_id)["checkpoints"] == []


# --- cancel and retry -------------------------------------------------------------------------


def test_cancel_of_a_waiting_job_is_immediate_and_final(coord, clock):
    job_id = coord.enqueue("work", {})["job_id"]
    assert coord.cancel(job_id) == {"job_id": job_id, "status": "cancelled"}
    job = coord.show(job_id)["job"]
    assert job["status"] == "cancelled" and job["finished_at"] == iso_at(0)
    got = claim(coord, "w1")
    assert got["job"] is None and got["reason"] == "no_waiting_jobs"
    refused("job_finished", coord.cancel, job_id)


def test_cancel_of_a_running_job_ends_it_at_the_owners_next_complete(coord, clock):
    job_id, epoch = start(coord)
    coord.cancel(job_id)
    coord.cancel(job_id)  # asking twice is harmless and records one request
    refused("job_cancelled", coord.complete, job_id, "w1", epoch, {"too": "late"})
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "cancelled" and shown["job"]["result"] is None
    assert [e["reason"] for e in shown["events"]].count("cancel_requested") == 1
    assert transitions(coord, job_id)[-1] == ("running", "cancelled", "cancelled")


def test_cancel_of_a_running_job_whose_worker_vanished_is_ended_by_the_reaper(coord, clock):
    job_id, _ = start(coord, lease_s=10)
    coord.cancel(job_id)
    clock.tick(10)
    assert coord.reap()["cancelled"] == 1
    assert status(coord, job_id) == "cancelled"


@pytest.mark.parametrize("final", ["succeeded", "dead"])
def test_cancel_of_a_finished_job_is_refused(coord, clock, final):
    job_id, epoch = start(coord)
    if final == "succeeded":
        coord.complete(job_id, "w1", epoch, {"ok": True})
    else:
        coord.fail(job_id, "w1", epoch, "x", permanent=True)
    before = coord.show(job_id)
    refused("job_finished", coord.cancel, job_id)
    assert coord.show(job_id) == before


def test_retry_sends_a_dead_job_back_to_waiting_with_one_more_attempt(coord, clock):
    job_id, epoch = start(coord, max_attempts=1)
    coord.fail(job_id, "w1", epoch, "boom")
    assert status(coord, job_id) == "dead"
    clock.tick(5)
    assert coord.retry(job_id) == {"job_id": job_id, "status": "waiting"}
    job = coord.show(job_id)["job"]
    assert job["status"] == "waiting" and job["finished_at"] is None
    assert (job["attempts"], job["max_attempts"]) == (1, 2)
    assert job["run_after"] == iso_at(5)
    got = claim(coord, "w1")
    assert got["job"]["job_id"] == job_id and got["job"]["attempt"] == 2
    assert transitions(coord, job_id)[-2] == ("dead", "waiting", "operator_retry")


def test_retry_sends_an_unknown_job_back_to_waiting(coord, clock):
    job_id = _unknown_job(coord, clock)
    coord.retry(job_id)
    job = coord.show(job_id)["job"]
    assert job["status"] == "waiting" and not job["effect_started"]
    assert job["max_attempts"] > job["attempts"]


@pytest.mark.parametrize("state", ["waiting", "running", "succeeded", "cancelled"])
def test_retry_is_refused_unless_dead_or_unknown(coord, clock, state):
    if state == "waiting":
        job_id = coord.enqueue("work", {})["job_id"]
    else:
        job_id, epoch = start(coord)
        if state == "succeeded":
            coord.complete(job_id, "w1", epoch, {})
        elif state == "cancelled":
            coord.cancel(job_id)
            refused("job_cancelled", coord.renew, job_id, "w1", epoch)
    before = coord.show(job_id)
    refused("illegal_transition", coord.retry, job_id)
    assert coord.show(job_id) == before


# --- reaping ------------------------------------------------------------------------------------


def test_reap_is_idempotent(coord, clock):
    jobs = [start(coord, f"w{n}", lease_s=10)[0] for n in range(3)]
    clock.tick(9)
    assert coord.reap()["expired"] == 0  # nothing is due a second early
    clock.tick(1)
    first = coord.reap()
    assert first["expired"] == 3 and first["waiting"] == 3
    assert sorted(j["job_id"] for j in first["jobs"]) == sorted(jobs)
    snapshot = [coord.show(j) for j in jobs]
    second = coord.reap()
    assert second["expired"] == 0 and second["jobs"] == [] and second["deadline_dead"] == 0
    assert [coord.show(j) for j in jobs] == snapshot


def test_reap_leaves_live_leases_alone(coord, clock):
    job_id, epoch = start(coord, lease_s=60)
    clock.tick(59)
    assert coord.reap()["expired"] == 0
    coord.complete(job_id, "w1", epoch, {"ok": True})


def test_reap_sweeps_waiting_jobs_past_their_deadline_to_dead(coord, clock):
    late = coord.enqueue("work", {}, deadline_s=30)["job_id"]
    fine = coord.enqueue("work", {}, deadline_s=300)["job_id"]
    clock.move_to(at(29))
    assert coord.reap()["deadline_dead"] == 0
    clock.move_to(at(30))
    # Past its deadline the job is no longer claimable, even before the sweep.
    got = claim(coord, "w1")
    assert got["job"]["job_id"] == fine
    out = coord.reap()
    assert out["deadline_dead"] == 1 and out["jobs"] == [
        {"job_id": late, "epoch": 0, "to": "dead"}]
    shown = coord.show(late)
    assert shown["job"]["status"] == "dead" and shown["job"]["attempts"] == 0
    assert transitions(coord, late)[-1] == ("waiting", "dead", "deadline_passed")
    assert coord.reap()["deadline_dead"] == 0


# --- the history --------------------------------------------------------------------------------


def test_every_transition_is_an_event_in_order_with_the_detail_behind_each_decision(
        coord, clock):
    job_id = coord.enqueue("work", {"n": 1}, priority="P1", max_attempts=2)["job_id"]
    got = claim(coord, "w1", lease_s=10)
    coord.fail(job_id, "w1", got["lease"]["epoch"], "model timed out")
    clock.move_to(at(10))
    got = claim(coord, "w2", lease_s=10)
    epoch2 = got["lease"]["epoch"]
    coord.checkpoint(job_id, "w2", epoch2, "sent", {"remote_id": "R-1"})
    coord.mark_effect(job_id, "w2", epoch2)
    clock.move_to(at(25))
    refused("lease_expired", coord.complete, job_id, "w2", epoch2, {"late": 1})
    coord.reap()
    coord.reconcile(job_id, "waiting", "remote R-1 never ran")
    got = claim(coord, "w3")
    coord.complete(job_id, "w3", got["lease"]["epoch"], {"answer": 42})

    events = coord.show(job_id)["events"]
    assert [(e["from"], e["to"], e["reason"]) for e in events] == [
        (None, "waiting", "enqueued"),
        ("waiting", "running", "claimed"),
        ("running", "waiting", "failed"),
        ("waiting", "running", "claimed"),
        ("running", "running", "effect_started"),
        ("running", "running", "complete_refused"),
        ("running", "unknown", "lease_expired"),
        ("unknown", "waiting", "reconciled"),
        ("waiting", "running", "claimed"),
        ("running", "succeeded", "completed"),
    ]
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids)
    times = [e["at"] for e in events]
    assert times == sorted(times)
    enq, c1, f1, c2, eff, rej, reap, rec, c3, done = events
    assert enq["detail"]["priority"] == 1
    assert (c1["worker_id"], c1["epoch"], c1["detail"]["attempt"]) == ("w1", 1, 1)
    assert c1["detail"]["expires_at"] == iso_at(10)
    assert f1["detail"] == {"error": "model timed out", "attempt": 1, "backoff_s": 10.0,
                            "run_after": iso_at(10)}
    assert (c2["worker_id"], c2["epoch"], c2["detail"]["attempt"]) == ("w2", 2, 2)
    assert (eff["worker_id"], eff["epoch"]) == ("w2", 2)
    assert rej["detail"] == {"refusal": "lease_expired"}
    assert reap["detail"]["because"] == "an external effect had started"
    assert reap["detail"]["expired_at"] == iso_at(20)
    assert rec["detail"]["reason"] == "remote R-1 never ran"
    assert (c3["worker_id"], c3["epoch"], c3["detail"]["attempt"]) == ("w3", 3, 3)
    assert (done["worker_id"], done["epoch"], done["at"]) == ("w3", 3, iso_at(25))


def test_a_refused_transition_writes_no_transition_event(coord, clock):
    job_id, epoch = start(coord)
    coord.complete(job_id, "w1", epoch, {"ok": True})
    before = transitions(coord, job_id)
    refused("job_finished", coord.complete, job_id, "w1", epoch, {"again": True})
    refused("job_finished", coord.cancel, job_id)
    refused("illegal_transition", coord.retry, job_id)
    after = transitions(coord, job_id)
    # A late result is kept as evidence, but as a non-transition (succeeded -> succeeded).
    assert after[:len(before)] == before
    assert all(f == t == "succeeded" for f, t, _ in after[len(before):])


# --- several processes at once -------------------------------------------------------------------


def _in_threads(target: Any, n: int, work: Callable[[Coordinator, int], Any]) -> list[str]:
    """Run `work` in n threads, each with its own coordinator (its own connections), the
    way separate processes would; return the errors they hit."""
    errors: list[str] = []
    start_together = threading.Barrier(n)

    def run(i: int) -> None:
        c = Coordinator.open(target)
        try:
            start_together.wait()
            work(c, i)
        except Exception as e:  # collected and asserted empty below
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_concurrent_reapers_reap_each_expired_lease_exactly_once(coord, target, clock):
    coord.enqueue_many([{"kind": "work", "payload": {"n": n}} for n in range(120)])
    coord.enqueue_many([{"kind": "work", "payload": {"n": n}, "deadline_s": 5}
                        for n in range(40)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    for _ in range(120):
        assert coord.claim("w1", lease_s=5)["job"] is not None
    clock.tick(10)
    counts: list[dict[str, Any]] = []
    errors = _in_threads(target, 4, lambda c, _i: counts.extend(
        c.reap(limit=20) for _ in range(8)))
    assert errors == []
    assert sum(r["expired"] for r in counts) == 120
    assert sum(r["deadline_dead"] for r in counts) == 40
    assert coord.reap()["jobs"] == []
    for job in coord.jobs(limit=1000)["jobs"]:
        reasons = [e["reason"] for e in coord.show(job["job_id"])["events"]]
        assert reasons.count("lease_expired") + reasons.count("deadline_passed") == 1


def _wait_until_row_locked(coord: Coordinator, job_id: int) -> None:
    """Poll from another connection until some transaction holds the job's row lock."""
    from sqlalchemy.exc import DBAPIError

    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        with coord.db.engine.connect() as conn:
            try:
                conn.exec_driver_sql("SELECT job_id FROM jobs WHERE job_id = %(j)s FOR UPDATE"
                                     " NOWAIT", {"j": job_id})
            except DBAPIError:
                return
            finally:
                conn.rollback()
        time.sleep(0.02)
    raise AssertionError("the completion never took the job's row lock")


@contextlib.contextmanager
def completion_in_flight(coord: Coordinator, target: Target, result: str
                         ) -> Iterator[tuple[int, int]]:
    """A real `complete` process, paused inside its transaction after it changed the job and
    holding the job's row lock; yields (job id, epoch) and checks the completion committed."""
    job_id = coord.enqueue("work", {})["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    epoch = coord.claim("w1", lease_s=600)["lease"]["epoch"]
    env = {**os.environ, "JOBCOORD_FAULT": "completed.after_event:sleep=3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--url", target.url, "complete", str(job_id),
         "--worker", "w1", "--epoch", str(epoch), "--result", result, "--json"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_row_locked(coord, job_id)
        yield job_id, epoch
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)


def test_on_postgresql_a_cancel_waits_for_a_completion_in_flight_and_sees_it(
        coord, target, backend):
    if backend != "postgresql":
        pytest.skip("SQLite: BEGIN IMMEDIATE already keeps a second writer out entirely")
    with completion_in_flight(coord, target, '{"ok": true}') as (job_id, _epoch):
        refused("job_finished", coord.cancel, job_id)
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "succeeded" and not shown["job"]["cancel_requested"]
    assert [e["reason"] for e in shown["events"]][-1] == "completed"


def test_on_postgresql_a_second_completion_waits_for_the_first_in_flight_and_is_refused(
        coord, target, backend):
    """The fence read locks the job's row: a duplicate completion arriving while the first is
    still inside its transaction waits, then reads the committed row and is told the first
    outcome stands (without the lock it would read `running` and fail its compare-and-set)."""
    if backend != "postgresql":
        pytest.skip("SQLite: BEGIN IMMEDIATE already keeps a second writer out entirely")
    with completion_in_flight(coord, target, '{"first": true}') as (job_id, epoch):
        second = refused("job_finished", coord.complete, job_id, "w1", epoch, {"second": True})
        assert second.details["accepted_epoch"] == epoch
    shown = coord.show(job_id)
    assert shown["job"]["status"] == "succeeded" and shown["job"]["result"] == {"first": True}
    assert [e["reason"] for e in shown["events"]][-2:] == ["completed", "complete_refused"]
