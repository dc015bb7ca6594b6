"""`claimed_by` and `completed_by`: whether a worker claimed a job at an epoch, and whether
the accepted completion at that epoch was its own. The server reads them on a worker's
refused fenced call, to tell a lease the worker lost from one it never held; each is one
read of the job's events through their index, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from jobcoord.errors import InvalidInput, Refused
from jobcoord.service import Coordinator
from jobcoord.store import query_statements as qs
from tests.timeline import IDLE_ON_AC


def _ready(coord: Coordinator, *workers: str) -> None:
    for w in workers:
        coord.heartbeat(w, readings=IDLE_ON_AC)


def _two_attempts(coord: Coordinator, clock: Any) -> tuple[int, int, int]:
    """A job w1 claimed and failed, then w2 claimed after the backoff: (job, w1's epoch,
    w2's epoch)."""
    _ready(coord, "w1", "w2")
    job = coord.enqueue("k", {}, max_attempts=3)["job_id"]
    first = coord.claim("w1", lease_s=60)["lease"]["epoch"]
    coord.fail(job, "w1", first, "boom")
    clock.tick(timedelta(seconds=11))  # past the first retry's backoff (10 s)
    second = coord.claim("w2", lease_s=60)["lease"]["epoch"]
    assert second == first + 1
    return job, first, second


def test_claimed_by_answers_for_this_worker_and_this_epoch_only(
    coord: Coordinator, clock: Any
) -> None:
    _ready(coord, "w1")
    job = coord.enqueue("k", {})["job_id"]
    epoch = coord.claim("w1", lease_s=60)["lease"]["epoch"]
    assert coord.claimed_by(job, "w1", epoch) is True
    assert coord.claimed_by(job, "w2", epoch) is False  # not this worker's claim
    assert coord.claimed_by(job, "w1", epoch + 1) is False  # an epoch nobody claimed
    assert coord.claimed_by(job + 1, "w1", epoch) is False  # no such job
    assert coord.completed_by(job, "w1", epoch) is False  # claimed, not completed

    job, first, second = _two_attempts(coord, clock)
    assert coord.claimed_by(job, "w2", second) is True
    assert coord.claimed_by(job, "w1", second) is False  # w1's claim was an earlier epoch
    assert coord.claimed_by(job, "w2", first) is False
    assert coord.claimed_by(job, "w1", first) is True  # its lost lease stays its claim


def test_completed_by_answers_for_the_accepted_completion_only(
    coord: Coordinator, clock: Any
) -> None:
    job, first, second = _two_attempts(coord, clock)
    assert coord.completed_by(job, "w2", second) is False  # running: nothing accepted yet
    coord.complete(job, "w2", second, {"ok": True})
    with pytest.raises(Refused, match="already succeeded"):
        coord.complete(job, "w1", first, {"late": True})  # refused: recorded, not accepted
    assert coord.completed_by(job, "w2", second) is True
    assert coord.completed_by(job, "w1", second) is False  # another worker's completion
    assert coord.completed_by(job, "w1", first) is False  # its report was refused
    assert coord.completed_by(job, "w2", first) is False  # another epoch
    assert coord.completed_by(job + 1, "w2", second) is False  # no such job
    assert coord.claimed_by(job, "w2", second) is True


def test_a_tenant_sees_its_own_jobs_events_only(coord: Coordinator) -> None:
    _ready(coord, "w1")
    job = coord.enqueue("k", {}, tenant="alice")["job_id"]
    epoch = coord.claim("w1", lease_s=60, tenant="alice")["lease"]["epoch"]
    coord.complete(job, "w1", epoch, {})
    for asked in (coord.claimed_by, coord.completed_by):
        assert asked(job, "w1", epoch, tenant="alice") is True
        assert asked(job, "w1", epoch) is True
        assert asked(job, "w1", epoch, tenant="bob") is False
        assert asked(job, "w1", epoch, tenant="default") is False


def test_bad_arguments_are_refused_before_any_read(coord: Coordinator) -> None:
    for args in (
        (0, "w1", 1),
        ("x", "w1", 1),
        (1, "", 1),
        (1, "w 1", 1),
        (1, "w1", -1),
        (1, "w1", 2**31),
    ):
        with pytest.raises(InvalidInput):
            coord.claimed_by(*args)
    with pytest.raises(InvalidInput):
        coord.completed_by(1, "w1", 1, tenant="no spaces")


def test_the_lookup_reads_the_jobs_events_through_their_index(coord: Coordinator) -> None:
    """One job's events found by its id in ix_job_events_job_id_event_id, not by reading
    every event: many other jobs' events are never visited."""
    _ready(coord, "w1")
    coord.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(2000)])
    got = coord.claim("w1", lease_s=60)
    job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
    coord.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))
    for by_tenant in (False, True):
        stmt = qs.event_by(by_tenant)
        params = {
            "job_id": job,
            "worker": "w1",
            "epoch": epoch,
            "reason": "claimed",
            "tenant": "default",
        }
        if coord.db.dialect == "sqlite":
            plan = coord.db.read(
                lambda conn, s=stmt, p=params: [
                    r[-1]
                    for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + s.text("sqlite"), p).all()
                ]
            )
            reads = [line for line in plan if "job_events" in line]
            assert reads == [
                "SEARCH job_events USING INDEX ix_job_events_job_id_event_id (job_id=?)"
            ], plan
        else:
            plan = "\n".join(
                coord.db.read(
                    lambda conn, s=stmt, p=params: [
                        r[0]
                        for r in conn.exec_driver_sql(
                            "EXPLAIN (COSTS OFF) " + s.text("postgresql"), p
                        ).all()
                    ]
                )
            )
            assert "ix_job_events_job_id_event_id" in plan, plan
            assert "Seq Scan on job_events" not in plan, plan
        assert coord.claimed_by(job, "w1", epoch, tenant="default" if by_tenant else None)
