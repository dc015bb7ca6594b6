"""Batches: claim_many takes up to n jobs in one write transaction, in claim order, each under
its own lease, epoch and event and through the same gates; complete_many and fail_many judge
and fence every item on its own, in one transaction, with its own answer."""

from __future__ import annotations

from typing import Any

import pytest

from jobcoord.errors import InvalidInput
from jobcoord.service import Coordinator, JobSpec
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC

pytestmark = pytest.mark.timeout(600)


def _events(coord: Coordinator, job_id: int) -> list[tuple[Any, ...]]:
    return [(e["reason"], e["epoch"]) for e in coord.show(job_id)["events"]]


def _item(got: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"job_id": got["job"]["job_id"], "worker_id": got["lease"]["worker_id"],
            "epoch": got["lease"]["epoch"], "result": {"ok": got["job"]["job_id"]}} | over


def test_claim_many_takes_up_to_n_in_claim_order_each_with_its_own_lease_and_event(
        coord: Coordinator) -> None:
    ids = [coord.enqueue("k", {"i": i}, priority=p)["job_id"]
           for i, p in enumerate([3, 1, 0, 1, 2])]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 4, lease_s=30)
    assert got["reason"] is None
    taken = [g["job"]["job_id"] for g in got["claimed"]]
    # priority first, then age: P0, the two P1s in submission order, P2; the P3 stays
    assert taken == [ids[2], ids[1], ids[3], ids[4]]
    for g in got["claimed"]:
        assert g["lease"]["epoch"] == 1 and g["lease"]["worker_id"] == "w1"
        assert _events(coord, g["job"]["job_id"]) == [("enqueued", None), ("claimed", 1)]
    leases = {r["job_id"] for r in coord.jobs(status="running")["jobs"]}
    assert leases == set(taken)
    assert coord.jobs(status="waiting")["jobs"][0]["job_id"] == ids[0]


def test_claim_many_stops_short_when_fewer_jobs_wait(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert len(coord.claim_many("w1", 10)["claimed"]) == 3
    empty = coord.claim_many("w1", 10)
    assert empty == {"claimed": [], "reason": "no_waiting_jobs",
                     "detail": "no job is waiting"}
    assert coord.workers()["workers"][0]["last_refusal"]["reason"] == "no_waiting_jobs"


def test_a_gate_that_refuses_refuses_the_rest_of_the_batch(coord: Coordinator) -> None:
    # On battery: background priorities are held back, P0 is not. The batch takes the P0
    # jobs and stops at the first job the gate refuses, even with slots left.
    p0 = [coord.enqueue("k", priority=0)["job_id"] for _ in range(2)]
    coord.enqueue_many([JobSpec("k", priority=3) for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC | {"on_battery": True})
    got = coord.claim_many("w1", 5)
    assert [g["job"]["job_id"] for g in got["claimed"]] == p0
    again = coord.claim_many("w1", 5)
    assert again["claimed"] == [] and again["reason"] == "power_gate"


def test_a_gate_that_refuses_everything_takes_nothing(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k", priority=0) for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC | {"memory_used_pct": 90})
    before = dump(coord)["jobs"]
    got = coord.claim_many("w1", 3)
    assert got["claimed"] == [] and got["reason"] == "memory_gate"
    assert dump(coord)["jobs"] == before
    assert coord.claim_many("nobody", 3)["reason"] == "heartbeat_missing"


def test_claim_many_refuses_bad_arguments_and_changes_nothing(coord: Coordinator) -> None:
    coord.enqueue("k")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    for n in (0, -1, 1001, 2**70, 1.5, "-3", "x", None, True, [2]):
        with pytest.raises(InvalidInput) as caught:
            coord.claim_many("w1", n)
        assert "n" in caught.value.message
    for kw in ({"lease_s": 0}, {"kinds": []}, {"lease_s": "x"}):
        with pytest.raises(InvalidInput):
            coord.claim_many("w1", 2, **kw)
    with pytest.raises(InvalidInput):
        coord.claim_many("", 2)
    assert dump(coord) == before


def test_a_group_with_one_stale_epoch_accepts_the_others_and_refuses_that_one(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(4)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 4)["claimed"]
    items = [_item(g) for g in got]
    items[2]["epoch"] = 2  # not the epoch this worker holds
    done = coord.complete_many(items)
    assert (done["accepted"], done["refused"]) == (3, 1)
    stale = done["results"][2]
    assert stale["job_id"] == items[2]["job_id"]
    assert stale["error"]["code"] == "stale_epoch"
    for i, answer in enumerate(done["results"]):
        if i != 2:
            assert answer["status"] == "succeeded" and answer["job_id"] == items[i]["job_id"]
            assert coord.show(items[i]["job_id"])["job"]["result"] == {"ok": items[i]["job_id"]}
    # The refused item has its own event and its job is untouched: still running, epoch 1.
    refused_job = items[2]["job_id"]
    assert _events(coord, refused_job)[-1] == ("complete_refused", 2)
    assert coord.show(refused_job)["job"]["status"] == "running"
    for i in (0, 1, 3):
        assert ("complete_refused", 2) not in _events(coord, items[i]["job_id"])


def test_complete_many_judges_items_one_by_one_in_one_transaction(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.heartbeat("w2", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2)["claimed"]
    c = coord.claim("w2")
    done = coord.complete_many([
        _item(b), _item(a), _item(a, result={"again": 1}),  # the same job twice
        _item(c, worker_id="w1"),  # not the owner
        {"job_id": 999, "worker_id": "w1", "epoch": 1},  # no such job
    ])
    codes = [r.get("status") or r["error"]["code"] for r in done["results"]]
    assert codes == ["succeeded", "succeeded", "job_finished", "not_owner", "job_not_found"]
    # the first result of a job stands
    assert coord.show(a["job"]["job_id"])["job"]["result"] == {"ok": a["job"]["job_id"]}
    assert coord.show(c["job"]["job_id"])["job"]["status"] == "running"


@pytest.mark.parametrize("cancel_asked", [False, True])
def test_a_group_sent_again_answers_each_item_accepted_at_that_epoch_as_already_accepted(
        coord: Coordinator, cancel_asked: bool) -> None:
    """A group whose answer was lost is sent again: every item this worker had accepted at
    that epoch, with that result, says so (the server answers it `already_accepted`), the
    job's second item too. That item was refused "already completed earlier in this batch"
    (`earlier_in_batch`), when nothing was completed in this batch. Never accepted twice.
    (With a cancellation asked of another job, the group is judged item by item.)"""
    coord.enqueue_many([JobSpec("k") for _ in range(2)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2)["claimed"]
    group = [_item(a), _item(a)]
    if cancel_asked:
        coord.cancel(b["job"]["job_id"])
        group.append(_item(b))
    first = coord.complete_many(group)
    again = coord.complete_many(group)
    assert first["accepted"] == 1 and again["accepted"] == 0, again
    for one in again["results"][:2]:
        assert one["error"]["details"].get("same_as_accepted") is True, one
        assert "earlier_in_batch" not in one["error"]["details"], one
        assert "earlier in this batch" not in one["error"]["message"], one
    assert _events(coord, a["job"]["job_id"]).count(("completed", 1)) == 1


@pytest.mark.parametrize("cancel_asked", [False, True])
def test_a_job_accepted_in_an_earlier_request_is_never_said_completed_in_this_batch(
        coord: Coordinator, cancel_asked: bool) -> None:
    """A job completed by an earlier request, then twice in one group: the first item was
    `already_accepted` (same_as_accepted) and the second "was already completed earlier in
    this batch" (`earlier_in_batch`), though this batch completed nothing. Both say what is
    true: the same result stands; another result of that epoch is refused `job_finished`
    (and recorded), never as this batch's."""
    coord.enqueue_many([JobSpec("k") for _ in range(2)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2)["claimed"]
    coord.complete(a["job"]["job_id"], "w1", 1, {"ok": a["job"]["job_id"]})
    group = [_item(a), _item(a), _item(a, result={"other": 1})]
    if cancel_asked:
        coord.cancel(b["job"]["job_id"])
        group.append(_item(b))
    done = coord.complete_many(group)
    assert done["accepted"] == 0, done
    same, dup, other = done["results"][:3]
    for one in (same, dup):
        assert one["error"]["details"].get("same_as_accepted") is True, one
    for one in (same, dup, other):
        assert "earlier_in_batch" not in one["error"]["details"], one
        assert "earlier in this batch" not in one["error"]["message"], one
    assert other["error"]["code"] == "job_finished", other
    assert not other["error"]["details"].get("same_as_accepted"), other
    assert _events(coord, a["job"]["job_id"])[-2:] == [("completed", 1),
                                                         ("complete_refused", 1)]


def test_fail_many_judges_each_failure_like_fail(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k", max_attempts=1), JobSpec("k")])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2)["claimed"]
    done = coord.fail_many([
        {"job_id": a["job"]["job_id"], "worker_id": "w1", "epoch": 1, "error": "boom"},
        {"job_id": b["job"]["job_id"], "worker_id": "w1", "epoch": 1, "error": "later",
         "reason": "timeout"},
        {"job_id": b["job"]["job_id"], "worker_id": "w1", "epoch": 1, "error": "dup"},
    ])
    a_out, b_out, dup = done["results"]
    assert a_out["status"] == "dead" and "attempts used" in a_out["dead_because"]
    assert b_out["status"] == "waiting" and "run_after" in b_out
    assert dup["error"]["code"] == "lease_expired"  # b is waiting again: no lease to fail
    # Said as what happened: this batch already failed it, not a lease that expired.
    assert dup["error"]["message"] == (
        f"job {b['job']['job_id']} was already failed earlier in this batch (it is now "
        "waiting); only the first report of an attempt counts")
    assert dup["error"]["details"]["earlier_in_batch"] is True
    assert "reaped" not in dup["error"]["message"]
    assert (done["accepted"], done["refused"]) == (2, 1)
    assert _events(coord, b["job"]["job_id"])[-1] == ("fail_refused", 1)


@pytest.mark.parametrize("items", [
    [], None, "x", {"job_id": 1}, [1], [{"job_id": 1}], [{"job_id": 1, "worker_id": "w1"}],
    [{"job_id": 1, "worker_id": "w1", "epoch": 1, "bogus": 1}],
    [{"job_id": 0, "worker_id": "w1", "epoch": 1}],
    [{"job_id": 1, "worker_id": "w1", "epoch": -1}],
    [{"job_id": 1, "worker_id": "w1", "epoch": 1, "result": {"x": float("nan")}}],
    [{"job_id": 1, "worker_id": "w1", "epoch": 1}] * 1001,
], ids=lambda v: repr(v)[:40])
def test_complete_many_refuses_bad_items_and_changes_nothing(coord: Coordinator,
                                                             items: Any) -> None:
    coord.enqueue("k")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.claim("w1")
    before = dump(coord)
    with pytest.raises(InvalidInput) as caught:
        coord.complete_many(items)
    assert "items" in caught.value.message
    # A good item next to a bad one is not accepted either: validation comes first.
    if isinstance(items, list) and items and isinstance(items[0], dict) and len(items) < 5:
        with pytest.raises(InvalidInput):
            coord.complete_many([{"job_id": 1, "worker_id": "w1", "epoch": 1}, *items])
    with pytest.raises(InvalidInput):
        coord.fail_many(items if items else [])
    assert dump(coord) == before


def test_fail_many_needs_an_error_per_item(coord: Coordinator) -> None:
    with pytest.raises(InvalidInput) as caught:
        coord.fail_many([{"job_id": 1, "worker_id": "w1", "epoch": 1}])
    assert "items[0]" in caught.value.message and "error" in caught.value.message


# A batch claim under 8 processes never gives a (job, epoch) twice: the contention runs of
# tests/test_contention.py and tests/test_postgres.py, parametrized "batched".


# --- batch enqueue: settings checked once per distinct value, never across types ------------


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("priority", 1, True), ("max_attempts", 2, 2.0), ("kind", "k", ["k"]),
    ("role", "gpu", b"gpu"), ("delay_s", 0, float("nan")), ("tenant", "t", 1),
])
def test_a_batch_checks_each_distinct_setting_even_when_an_equal_one_passed(
        coord: Coordinator, field: str, good: Any, bad: Any) -> None:
    before = dump(coord)
    base = {"kind": "k"}
    with pytest.raises(InvalidInput):
        coord.enqueue_many([base | {field: good}, base | {field: good}, base | {field: bad}])
    assert dump(coord) == before
    assert len(coord.enqueue_many([base | {field: good}] * 3)) == 3


def test_batch_answers_give_their_times_as_iso_text(coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(2)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2)["claimed"]
    for got in (a, b):
        assert isinstance(got["lease"]["expires_at"], str)
        assert got["lease"]["expires_at"].endswith("Z")
        assert isinstance(got["lease"]["expires_at_us"], int)
    done = coord.complete_many([_item(a)])["results"][0]
    assert isinstance(done["finished_at"], str) and done["finished_at"].endswith("Z")
    failed = coord.fail_many([{"job_id": b["job"]["job_id"], "worker_id": "w1", "epoch": 1,
                               "error": "x"}])["results"][0]
    assert isinstance(failed["run_after"], str) and failed["run_after"].endswith("Z")


def test_a_batch_claim_counts_its_own_jobs_against_a_concurrency_limit(
        coord: Coordinator) -> None:
    coord.set_limit("k", 2)
    coord.enqueue_many([JobSpec("k") for _ in range(5)] + [JobSpec("j")])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 5)
    kinds = [g["job"]["kind"] for g in got["claimed"]]
    assert kinds.count("k") == 2, kinds  # the third would pass the limit of 2
    again = coord.claim_many("w1", 5)
    assert [g["job"]["kind"] for g in again["claimed"]].count("k") == 0


def _statements(coord: Coordinator, work: Any) -> list[str]:
    from sqlalchemy import event

    seen: list[str] = []

    def listen(_c: Any, _cur: Any, stmt: str, *_a: Any) -> None:
        seen.append(stmt)

    event.listen(coord.db.engine, "before_cursor_execute", listen)
    try:
        work()
    finally:
        event.remove(coord.db.engine, "before_cursor_execute", listen)
    return seen


def test_a_batch_claim_without_limits_or_needs_takes_its_jobs_as_one_set(
        coord: Coordinator) -> None:
    # The same few statements for 40 jobs as for one: one take, the leases and the events
    # in bulk (on PostgreSQL folded into the take), not a take per job.
    coord.enqueue_many([JobSpec("k", {"i": i}, priority=i % 3) for i in range(41)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got: dict[str, Any] = {}
    seen = _statements(coord, lambda: got.update(coord.claim_many("w1", 40, lease_s=30)))
    assert len(got["claimed"]) == 40
    takes = [s for s in seen if "SET status = 'running'" in s]
    assert len(takes) == 1, seen
    assert len(seen) <= 8, seen
    # Claim order, each with its own epoch, lease and event.
    order = [(g["job"]["priority"], g["job"]["job_id"]) for g in got["claimed"]]
    assert order == sorted(order)
    running = {r["job_id"] for r in coord.jobs(status="running", limit=100)["jobs"]}
    assert running == {g["job"]["job_id"] for g in got["claimed"]}
    for g in got["claimed"][::13]:
        assert _events(coord, g["job"]["job_id"]) == [("enqueued", None), ("claimed", 1)]


def test_a_batch_claim_gives_a_job_run_again_its_next_epoch_and_its_checkpoints(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    first = coord.claim("w1", lease_s=30)
    job = first["job"]["job_id"]
    coord.checkpoint(job, "w1", 1, "step", {"n": 1})
    coord.fail(job, "w1", 1, "again", reason="worker_shutdown")  # back to waiting at once
    got = coord.claim_many("w1", 5, lease_s=30)["claimed"]
    assert got[0]["job"]["job_id"] == job
    again = got[0]
    assert again["lease"]["epoch"] == 2 and again["job"]["attempt"] == 2
    assert [c["name"] for c in again["job"]["checkpoints"]] == ["step"]
    assert _events(coord, job)[-1] == ("claimed", 2)
    assert all(g["lease"]["epoch"] == 1 and g["job"]["checkpoints"] == [] for g in got[1:])


def test_a_group_completion_reads_every_lease_once_and_writes_in_bulk(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(30)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 30, lease_s=30)["claimed"]
    items = [_item(g) for g in got]
    items[7]["epoch"] = 5
    done: dict[str, Any] = {}
    seen = _statements(coord, lambda: done.update(coord.complete_many(items)))
    assert (done["accepted"], done["refused"]) == (29, 1)
    # One fence read for the 30 items, one executemany per statement kind: not 30 of each.
    assert len([s for s in seen if "FROM jobs LEFT OUTER JOIN leases" in s]) == 1, seen
    assert len(seen) <= 6, seen
    for i, g in enumerate(got):
        if i != 7:
            assert _events(coord, g["job"]["job_id"])[-1] == ("completed", 1)
    assert _events(coord, got[7]["job"]["job_id"])[-1] == ("complete_refused", 5)


def test_a_group_keeps_each_jobs_events_in_the_order_of_its_items(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(2)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2, lease_s=30)["claimed"]
    done = coord.complete_many([_item(b), _item(a, epoch=3), _item(a), _item(a)])
    codes = [r.get("status") or r["error"]["code"] for r in done["results"]]
    assert codes == ["succeeded", "stale_epoch", "succeeded", "job_finished"]
    # The refused report before the accepted one, then the late duplicate: as the single
    # calls one after the other would have recorded them.
    assert _events(coord, a["job"]["job_id"]) == [
        ("enqueued", None), ("claimed", 1), ("complete_refused", 3), ("completed", 1),
        ("complete_refused", 1)]
    assert "earlier in this batch" in done["results"][3]["error"]["message"]
    assert "earlier in this batch" not in done["results"][1]["error"]["message"]


def test_a_group_judges_each_lease_expiry_at_its_commit(coord: Coordinator) -> None:
    import time

    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    short = coord.claim("w1", lease_s=0.2)
    rest = coord.claim_many("w1", 2, lease_s=30)["claimed"]
    time.sleep(0.3)  # the short lease has expired, not yet reaped
    done = coord.fail_many([{"job_id": g["job"]["job_id"], "worker_id": "w1",
                             "epoch": g["lease"]["epoch"], "error": "x"}
                            for g in (short, *rest)])
    assert done["results"][0]["error"]["code"] == "lease_expired"
    assert "expired at" in done["results"][0]["error"]["message"]
    assert [r["status"] for r in done["results"][1:]] == ["waiting", "waiting"]
    assert _events(coord, short["job"]["job_id"])[-1] == ("fail_refused", 1)


def test_a_group_with_a_cancelled_job_carries_out_the_cancellation_and_accepts_the_rest(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 3, lease_s=30)["claimed"]
    cancelled = got[1]["job"]["job_id"]
    coord.cancel(cancelled)
    done = coord.complete_many([_item(g) for g in got])
    assert [r.get("status") or r["error"]["code"] for r in done["results"]] == [
        "succeeded", "job_cancelled", "succeeded"]
    assert coord.show(cancelled)["job"]["status"] == "cancelled"


def test_a_worker_claims_its_free_slots_in_one_batch_on_both_databases(
        coord: Coordinator, target: Any, tmp_path: Any) -> None:
    # PostgreSQL workers claim batches too: the set-based claim is one short statement.
    # Jobs claimed in one transaction share its time; single claims each have their own.
    import subprocess
    import sys
    import time
    from pathlib import Path

    assert coord.db.batch_claims
    coord.enqueue_many([JobSpec("noop", {"i": i}) for i in range(8)])
    where = (["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url])
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", *where, "worker", "--worker-id", "bw",
         "--app", "benchmarks.noop_app:app", "--concurrency", "4", "--lease", "60",
         "--heartbeat-every", "5", "--reap-every", "0", "--poll", "0.1"],
        cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while coord.status()["jobs"].get("succeeded", 0) < 8:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < end, "the worker did not finish the jobs"
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    times = [e["at"] for j in range(1, 9) for e in coord.show(j)["events"]
             if e["reason"] == "claimed"]
    assert len(times) == 8
    assert len(set(times)) < 8, times  # at least two jobs were claimed in one transaction
