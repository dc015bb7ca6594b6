"""Complete-and-claim-next: a worker's completion and its next claim in one write transaction.

It must accept exactly what `complete` accepts, refuse exactly what `complete` refuses (and
then claim nothing), keep the fence and every event row, and the next claim must follow every
rule of `claim`. Each test runs on SQLite and PostgreSQL under a frozen clock."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.errors import InvalidInput, Refused
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.timeline import IDLE_ON_AC

REPO = Path(__file__).resolve().parent.parent


def claimed(coord: Coordinator, worker: str = "w1", **enqueue: Any) -> tuple[int, int]:
    """Enqueue one job, heartbeat `worker`, claim it; returns (job_id, epoch)."""
    job_id = coord.enqueue("work", {"n": "claimed"}, **enqueue)["job_id"]
    coord.heartbeat(worker, readings=IDLE_ON_AC)
    got = coord.claim(worker, lease_s=45)
    assert got["job"]["job_id"] == job_id
    return job_id, got["lease"]["epoch"]


def reasons(coord: Coordinator, job_id: int) -> list[str]:
    return [e["reason"] for e in coord.show(job_id)["events"]]


def test_complete_and_claim_finishes_the_job_and_leases_the_next_in_claim_order(
        coord: Coordinator, clock: Any) -> None:
    first, epoch = claimed(coord)
    background = coord.enqueue("work", {"n": "p3"}, priority=3)["job_id"]
    clock.tick(1)
    urgent = coord.enqueue("work", {"n": "p0"}, priority=0)["job_id"]
    clock.tick(2)

    out = coord.complete_and_claim(first, "w1", epoch, {"answer": 42}, lease_s=30)

    assert out["completed"] == {"job_id": first, "status": "succeeded", "epoch": epoch,
                                "finished_at": "2026-03-01T09:00:03Z"}
    nxt = out["next"]
    assert nxt["job"]["job_id"] == urgent  # P0 before the older P3
    assert nxt["job"]["payload"] == {"n": "p0"}
    assert nxt["lease"] == {"worker_id": "w1", "epoch": 1,
                            "expires_at": "2026-03-01T09:00:33Z",
                            "expires_at_us": nxt["lease"]["expires_at_us"]}
    done = coord.show(first)
    assert done["job"]["status"] == "succeeded"
    assert done["job"]["result"] == {"answer": 42}
    assert done["lease"] is None
    assert reasons(coord, first) == ["enqueued", "claimed", "completed"]
    assert reasons(coord, urgent) == ["enqueued", "claimed"]
    assert coord.show(urgent)["events"][-1]["epoch"] == 1
    assert coord.show(background)["job"]["status"] == "waiting"
    # The next job's lease is fenced like any other: its epoch completes it, the old does not.
    assert coord.complete(urgent, "w1", 1)["status"] == "succeeded"
    assert check(coord.db)["ok"]


def test_complete_and_claim_with_nothing_left_completes_and_says_why_nothing_was_claimed(
        coord: Coordinator, clock: Any) -> None:
    job_id, epoch = claimed(coord)
    out = coord.complete_and_claim(job_id, "w1", epoch)
    assert out["completed"]["status"] == "succeeded"
    assert out["next"] == {"job": None, "reason": "no_waiting_jobs",
                           "detail": "no job is waiting"}
    assert coord.show(job_id)["job"]["result"] == {}


def test_the_next_claim_still_passes_the_gates(coord: Coordinator, clock: Any) -> None:
    job_id, epoch = claimed(coord)
    other = coord.enqueue("work", {"n": "next"})["job_id"]
    coord.heartbeat("w1", readings={**IDLE_ON_AC, "memory_used_pct": 90})
    out = coord.complete_and_claim(job_id, "w1", epoch, {"ok": True})
    assert out["completed"]["status"] == "succeeded"
    assert out["next"]["job"] is None
    assert out["next"]["reason"] == "memory_gate"
    assert coord.show(other)["job"]["status"] == "waiting"


def test_the_next_claim_only_takes_the_kinds_asked_for(coord: Coordinator, clock: Any) -> None:
    job_id, epoch = claimed(coord)
    coord.enqueue("embed", {"n": "embed"})
    wanted = coord.enqueue("summarize", {"n": "sum"})["job_id"]
    out = coord.complete_and_claim(job_id, "w1", epoch, kinds=["summarize"])
    assert out["next"]["job"]["job_id"] == wanted


# --- refusals: exactly complete's, and then no claim ------------------------------------------


def _stale_epoch(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, epoch = claimed(coord)
    return job_id, "w1", epoch + 1, {}


def _not_owner(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, epoch = claimed(coord)
    coord.heartbeat("w2", readings=IDLE_ON_AC)
    return job_id, "w2", epoch, {}


def _expired_not_reaped(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, epoch = claimed(coord)
    clock.tick(46)
    coord.heartbeat("w1", readings=IDLE_ON_AC)  # fresh, so only the lease can refuse
    return job_id, "w1", epoch, {}


def _expired_and_reaped(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, _, epoch, _ = _expired_not_reaped(coord, clock)
    assert coord.reap()["expired"] == 1
    return job_id, "w1", epoch, {}


def _finished(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, epoch = claimed(coord)
    coord.complete(job_id, "w1", epoch, {"first": True})
    return job_id, "w1", epoch, {}


def _unknown_job(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    claimed(coord)
    return 999_999, "w1", 1, {}


def _other_tenant(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, epoch = claimed(coord, tenant="acme")
    return job_id, "w1", epoch, {"tenant": "globex"}


def _cancelled(coord: Coordinator, clock: Any) -> tuple[int, str, int, dict[str, Any]]:
    job_id, epoch = claimed(coord)
    coord.cancel(job_id)
    return job_id, "w1", epoch, {}


REFUSALS: dict[str, tuple[str, Callable[..., tuple[int, str, int, dict[str, Any]]]]] = {
    "stale epoch": ("stale_epoch", _stale_epoch),
    "another worker": ("not_owner", _not_owner),
    "expired, reaper not run yet": ("lease_expired", _expired_not_reaped),
    "expired and reaped": ("lease_expired", _expired_and_reaped),
    "already finished": ("job_finished", _finished),
    "no such job": ("job_not_found", _unknown_job),
    "another tenant's job": ("job_not_found", _other_tenant),
    "cancelled while running": ("job_cancelled", _cancelled),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_complete_and_claim_refuses_exactly_what_complete_refuses_and_then_claims_nothing(
        coord: Coordinator, clock: Any, case: str) -> None:
    code, setup = REFUSALS[case]
    job_id, worker, epoch, extra = setup(coord, clock)
    bystander = coord.enqueue("work", {"n": "bystander"})["job_id"]
    before = coord.show(job_id, tenant=extra.get("tenant")) if code != "job_not_found" else None

    with pytest.raises(Refused) as caught:
        coord.complete_and_claim(job_id, worker, epoch, {"late": True}, **extra)
    assert caught.value.code == code, caught.value.message
    assert caught.value.exit_code == 4

    # Nothing was claimed: the waiting job is untouched and the worker holds no new lease.
    waiting = coord.show(bystander)
    assert waiting["job"]["status"] == "waiting"
    assert waiting["job"]["epoch"] == 0
    assert waiting["lease"] is None
    assert reasons(coord, bystander) == ["enqueued"]
    if before is not None and code != "job_cancelled":
        after = coord.show(job_id)
        assert after["job"]["status"] == before["job"]["status"]
        assert after["job"]["result"] == before["job"]["result"]
        assert after["job"]["epoch"] == before["job"]["epoch"]

    # complete refuses the same call with the same code.
    with pytest.raises(Refused) as again:
        coord.complete(job_id, worker, epoch, {"late": True}, **extra)
    assert again.value.code == code
    assert check(coord.db)["ok"]


def test_a_refused_second_completion_keeps_the_first_result_and_records_the_attempt(
        coord: Coordinator, clock: Any) -> None:
    job_id, _, epoch, _ = _finished(coord, clock)
    with pytest.raises(Refused):
        coord.complete_and_claim(job_id, "w1", epoch, {"second": True})
    shown = coord.show(job_id)
    assert shown["job"]["result"] == {"first": True}
    assert [e["reason"] for e in shown["events"]][-1] == "complete_refused"


@pytest.mark.parametrize("ended_by", ["fail", "release"])
def test_a_report_on_an_attempt_that_already_ended_says_so_not_that_it_was_reaped(
        coord: Coordinator, clock: Any, ended_by: str) -> None:
    """This worker's own failure (or release) ended the attempt: a later report of that
    epoch is refused as lease_expired, told that the attempt ended, never that a lease
    expired and was reaped (which sends an operator looking for a clock or reaper fault)."""
    job_id, epoch = claimed(coord)
    if ended_by == "fail":
        coord.fail(job_id, "w1", epoch, "boom")
    else:
        coord.fail(job_id, "w1", epoch, "stopping", reason="worker_shutdown")
    reports = {
        "fail": lambda: coord.fail(job_id, "w1", epoch, "another"),
        "complete": lambda: coord.complete(job_id, "w1", epoch, {"late": True}),
        "renew": lambda: coord.renew(job_id, "w1", epoch),
    }
    for name, report in reports.items():
        with pytest.raises(Refused) as refused:
            report()
        assert refused.value.code == "lease_expired", name
        message = refused.value.message
        assert "reaped" not in message and "has ended" in message, (name, message)
        assert "waiting" in message, (name, message)


def _resend(coord: Coordinator, how: str, job_id: int, worker: str, epoch: int,
            result: Any) -> str:
    """Send one completion through `how`; the refusal's code."""
    if how == "complete_many":
        got = coord.complete_many([{"job_id": job_id, "worker_id": worker, "epoch": epoch,
                                    "result": result}])["results"][0]
        return str(got["error"]["code"])
    with pytest.raises(Refused) as refused:
        getattr(coord, how)(job_id, worker, epoch, result)
    return refused.value.code


@pytest.mark.parametrize("how", ["complete", "complete_and_claim", "complete_many"])
def test_the_accepted_completion_sent_again_is_refused_without_a_new_event(
        coord: Coordinator, clock: Any, how: str) -> None:
    """The same worker's same result at the accepted epoch (its answer was lost) is no new
    evidence, as a failure report sent again is not: refused as finished, nothing recorded.
    Another result, or another worker, is still recorded as a refused attempt."""
    job_id, worker, epoch, _ = _finished(coord, clock)
    before = [e["reason"] for e in coord.show(job_id)["events"]]
    assert _resend(coord, how, job_id, worker, epoch, {"first": True}) == "job_finished"
    assert [e["reason"] for e in coord.show(job_id)["events"]] == before
    coord.heartbeat("w2", readings=IDLE_ON_AC)
    for who, result in ((worker, {"second": True}), ("w2", {"first": True})):
        assert _resend(coord, how, job_id, who, epoch, result) == "job_finished"
        last = coord.show(job_id)["events"][-1]
        assert (last["reason"], last["worker_id"]) == ("complete_refused", who)
    assert coord.show(job_id)["job"]["result"] == {"first": True}


@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {"lease_s": -1}),
    ((), {"lease_s": float("nan")}),
    (({"x": float("nan")},), {}),
    ((), {"kinds": ["bad\x00kind"]}),
    ((), {"provenance": {"x": float("inf")}}),
])
def test_bad_input_to_complete_and_claim_is_refused_before_any_write(
        coord: Coordinator, clock: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    job_id, epoch = claimed(coord)
    other = coord.enqueue("work", {"n": "next"})["job_id"]
    with pytest.raises(InvalidInput):
        coord.complete_and_claim(job_id, "w1", epoch, *args, **kwargs)
    assert coord.show(job_id)["job"]["status"] == "running"
    assert reasons(coord, job_id) == ["enqueued", "claimed"]
    assert coord.show(other)["job"]["status"] == "waiting"


# --- one transaction: a crash between the completion and the claim keeps neither --------------

CAC = r"""
import json, sys
from jobcoord.service import Coordinator
c = Coordinator.open(sys.argv[1])
out = c.complete_and_claim(int(sys.argv[2]), "w1", int(sys.argv[3]), {"done": True})
print(json.dumps(out))
"""


def _state(path: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(
            "SELECT j.job_id, j.status, j.epoch, j.result_json, l.worker_id,"
            " (SELECT COUNT(*) FROM job_events e WHERE e.job_id = j.job_id)"
            " FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id ORDER BY j.job_id")]
    finally:
        conn.close()


@pytest.mark.parametrize("point", ["completed.after_event", "claim.after_take",
                                   "claim.after_event"])
def test_a_crash_inside_complete_and_claim_keeps_neither_the_completion_nor_the_claim(
        sqlite_target: Target, point: str) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        job_id, epoch = claimed(c)
        c.enqueue("work", {"n": "next"})
    before = _state(path)
    env = {**os.environ, "JOBCOORD_FAULT": f"{point}:kill"}
    killed = subprocess.run([sys.executable, "-c", CAC, path, str(job_id), str(epoch)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _state(path) == before

    done = subprocess.run([sys.executable, "-c", CAC, path, str(job_id), str(epoch)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["completed"]["status"] == "succeeded"
    assert out["next"]["lease"]["epoch"] == 1
    with Coordinator.open(path) as c:
        assert check(c.db)["ok"]


# --- batch enqueue without keys: ids computed in the transaction, rows inserted together -----


def test_a_keyless_batch_gets_increasing_ids_in_batch_order_each_with_the_enqueued_event(
        coord: Coordinator, clock: Any) -> None:
    single = coord.enqueue("work", {"n": 0}, priority=2, delay_s=30)["job_id"]
    batch = coord.enqueue_many([
        {"kind": "work", "payload": {"n": 1}, "priority": 2, "delay_s": 30},
        {"kind": "embed", "payload": {"n": 2}, "role": "gpu"},
        {"kind": "work", "payload": {"n": 3}, "priority": "P0", "tenant": "acme"},
    ])
    after = coord.enqueue("work", {"n": 4})["job_id"]
    ids = [b["job_id"] for b in batch]
    assert all(b["created"] for b in batch)
    assert single < ids[0] < ids[1] < ids[2] < after
    if coord.db.is_sqlite:
        assert ids == [single + 1, single + 2, single + 3]
    # Each batch job is stored and recorded exactly as a single enqueue would have done it.
    first_single = coord.show(single)["events"]
    first_batch = coord.show(ids[0])["events"]
    assert [(e["reason"], e["from"], e["to"], e["detail"]) for e in first_batch] == \
        [(e["reason"], e["from"], e["to"], e["detail"]) for e in first_single]
    shown = coord.show(ids[1])["job"]
    assert (shown["kind"], shown["role"], shown["payload"], shown["status"], shown["epoch"],
            shown["attempts"], shown["max_attempts"]) == ("embed", "gpu", {"n": 2}, "waiting",
                                                         0, 0, 3)
    assert coord.show(ids[2], tenant="acme")["job"]["priority"] == 0
    with pytest.raises(Refused):
        coord.show(ids[2], tenant="default")
    assert check(coord.db)["ok"]


def test_a_batch_with_an_invalid_job_inserts_nothing(coord: Coordinator, clock: Any) -> None:
    coord.enqueue("work", {"n": 0})
    with pytest.raises(InvalidInput):
        coord.enqueue_many([{"kind": "work", "payload": {"n": 1}},
                            {"kind": "work", "payload": {"n": float("nan")}}])
    assert len(coord.jobs()["jobs"]) == 1


def test_a_batch_with_keys_still_answers_each_key(coord: Coordinator, clock: Any) -> None:
    first = coord.enqueue("work", {"n": 1}, key="k1")["job_id"]
    out = coord.enqueue_many([{"kind": "work", "payload": {"n": 1}, "key": "k1"},
                              {"kind": "work", "payload": {"n": 2}}])
    assert out[0] == {"job_id": first, "created": False}
    assert out[1]["created"] is True


def test_batch_jobs_are_claimed_in_order_after_the_jobs_before_them(
        coord: Coordinator, clock: Any) -> None:
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    ids = [coord.enqueue("work", {"n": 0})["job_id"]]
    ids += [b["job_id"] for b in coord.enqueue_many([{"kind": "work", "payload": {"n": i}}
                                                     for i in range(1, 6)])]
    got = coord.claim("w1")
    order = []
    while got["job"] is not None:
        order.append(got["job"]["job_id"])
        got = coord.complete_and_claim(got["job"]["job_id"], "w1", got["lease"]["epoch"])["next"]
    assert order == ids
    assert check(coord.db)["ok"]


# --- the held write connection and the direct driver path ----------------------------------


def test_threads_sharing_one_coordinator_each_claim_and_complete_without_losing_a_job(
        coord: Coordinator) -> None:
    import threading

    ids = [b["job_id"] for b in coord.enqueue_many([{"kind": "work", "payload": {"n": i}}
                                                    for i in range(60)])]
    done: list[int] = []
    errors: list[BaseException] = []

    def work(worker: str) -> None:
        try:
            coord.heartbeat(worker, readings=IDLE_ON_AC)
            got = coord.claim(worker)
            while got["job"] is not None:
                done.append(got["job"]["job_id"])
                got = coord.complete_and_claim(got["job"]["job_id"], worker,
                                               got["lease"]["epoch"], {"by": worker})["next"]
        except BaseException as e:  # surfaced below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(done) == ids
    assert {j["status"] for j in coord.jobs(limit=100)["jobs"]} == {"succeeded"}
    assert check(coord.db)["ok"]


def test_a_statement_listener_sees_the_claim_and_completion_statements(
        coord: Coordinator) -> None:
    from sqlalchemy import event

    coord.enqueue("work", {"n": 1})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    seen: list[str] = []
    event.listen(coord.db.engine, "before_cursor_execute",
                 lambda _c, _cur, stmt, *_a: seen.append(stmt))
    got = coord.claim("w1")
    coord.complete(got["job"]["job_id"], "w1", got["lease"]["epoch"])
    if coord.db.folds_transitions:
        # PostgreSQL: the claim is one statement and the completion's end another.
        (claim,) = [s for s in seen if "UPDATE jobs SET status = 'running'" in s]
        (end,) = [s for s in seen if "DELETE FROM leases" in s]
        assert "INSERT INTO leases" in claim and "INSERT INTO job_events" in claim
        assert "INSERT INTO job_events" in end
        return
    assert any(s.startswith("UPDATE jobs SET status = 'running'") for s in seen)
    assert any(s.startswith("INSERT INTO leases") for s in seen)
    assert any(s.startswith("DELETE FROM leases") for s in seen)
    assert sum(s.startswith("INSERT INTO job_events") for s in seen) == 2


def test_after_the_database_stayed_locked_the_next_claim_works(sqlite_target: Target) -> None:
    from jobcoord.errors import DatabaseBusy

    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path, busy_timeout=0.05) as c:
        job_id = c.enqueue("work", {"n": 1})["job_id"]
        c.heartbeat("w1", readings=IDLE_ON_AC)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseBusy):
                c.claim("w1")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        got = c.claim("w1")
        assert got["job"]["job_id"] == job_id
        assert c.complete(job_id, "w1", got["lease"]["epoch"])["status"] == "succeeded"
        assert check(c.db)["ok"]
