"""Clock jumps. Leases are judged by the coordinator's clock only (the time taken where the
call runs, bound into SQL as a parameter); a worker never sends a time. Safety never depends
on that clock: whatever it does, a job's outcome is accepted at most once, and only from the
current epoch. Liveness does: a jump forward reaps early (the job may run twice, one result is
kept), a jump backward delays reaping.

Each test runs on SQLite and PostgreSQL under freezegun."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

from jobcoord.errors import Refused
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.invariants import assert_invariants

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
HOUR = 3600


def at(t: float) -> datetime:
    return T0 + timedelta(seconds=t)


@pytest.fixture
def clock() -> Iterator[Any]:
    with freeze_time(at(0)) as frozen:
        yield frozen


@pytest.fixture(autouse=True)
def invariants_hold_afterwards(coord: Coordinator) -> Iterator[None]:
    yield
    result = check(coord.db, full=True)
    assert result["ok"], result
    if coord.db.target.sqlite_path:
        assert_invariants(coord.db.target.sqlite_path)


def refused(code: str, fn: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(Refused) as caught:
        fn(*args, **kwargs)
    assert caught.value.code == code, caught.value.message


def claim(coord: Coordinator, worker: str, lease_s: float) -> tuple[int, int]:
    coord.heartbeat(worker)
    got = coord.claim(worker, lease_s=lease_s)
    assert got["job"] is not None, got
    return got["job"]["job_id"], got["lease"]["epoch"]


def completed_events(coord: Coordinator, job_id: int) -> list[dict[str, Any]]:
    return [e for e in coord.show(job_id)["events"] if e["reason"] == "completed"]


def test_forward_jump_reaps_early_and_the_old_epoch_is_refused(coord: Coordinator,
                                                               clock: Any) -> None:
    job_id = coord.enqueue("work", {})["job_id"]
    _, e1 = claim(coord, "w1", 60)
    clock.move_to(at(10 + HOUR))  # the lease had 50 s left; the clock now says it is long gone
    # Even before the reaper runs, the owner's own completion is judged by this clock.
    refused("lease_expired", coord.complete, job_id, "w1", e1, {"by": "w1"})
    reaped = coord.reap()
    assert reaped["jobs"] == [{"job_id": job_id, "epoch": e1, "to": "waiting"}]
    _, e2 = claim(coord, "w2", 60)
    assert e2 == e1 + 1
    # The first worker really was still running: its late result is refused, by epoch.
    refused("stale_epoch", coord.complete, job_id, "w1", e1, {"by": "w1"})
    coord.complete(job_id, "w2", e2, {"by": "w2"})
    refused("job_finished", coord.complete, job_id, "w1", e1, {"by": "w1"})
    shown = coord.show(job_id)
    assert shown["job"]["result"] == {"by": "w2"}
    assert len(completed_events(coord, job_id)) == 1


def test_forward_jump_backoff_is_computed_from_the_jumped_clock(coord: Coordinator,
                                                                clock: Any) -> None:
    job_id = coord.enqueue("work", {})["job_id"]
    _, e1 = claim(coord, "w1", 60)
    clock.move_to(at(30 + HOUR))
    coord.heartbeat("w1")
    refused("lease_expired", coord.fail, job_id, "w1", e1, "boom")
    coord.reap()
    job = coord.show(job_id)["job"]
    assert job["status"] == "waiting"
    run_after = datetime.fromisoformat(job["run_after"].replace("Z", "+00:00"))
    assert run_after >= at(30 + HOUR)  # never scheduled in the (jumped-over) past


def test_backward_jump_delays_reaping_and_renew_still_works(coord: Coordinator,
                                                            clock: Any) -> None:
    job_id = coord.enqueue("work", {})["job_id"]
    _, e1 = claim(coord, "w1", 5)
    clock.move_to(at(2 - HOUR))
    coord.heartbeat("w1")
    # The lease looks an hour longer than it was: nothing is reaped yet.
    clock.move_to(at(60 - HOUR))
    assert coord.reap()["expired"] == 0
    assert coord.show(job_id)["job"]["status"] == "running"
    # The owner can still renew; a renewal never moves the expiry earlier than it was.
    renewed = coord.renew(job_id, "w1", e1, lease_s=5)
    assert renewed["expires_at_us"] >= int(at(5).timestamp()) * 1_000_000
    clock.move_to(at(5 + 1))  # the clock caught up past the original expiry
    assert coord.reap()["jobs"] == [{"job_id": job_id, "epoch": e1, "to": "waiting"}]
    # The event history is ordered by event_id, whatever their timestamps say.
    events = coord.show(job_id)["events"]
    assert [e["event_id"] for e in events] == sorted(e["event_id"] for e in events)
    assert [e["reason"] for e in events] == ["enqueued", "claimed", "lease_expired"]
    assert events[2]["at"] > events[1]["at"]


def test_backward_jump_between_claims_keeps_events_in_id_order(coord: Coordinator,
                                                               clock: Any) -> None:
    job_id = coord.enqueue("work", {})["job_id"]
    _, e1 = claim(coord, "w1", 5)
    coord.fail(job_id, "w1", e1, "transient")
    clock.move_to(at(20 - HOUR))  # earlier than every event so far
    coord.heartbeat("w2")
    assert coord.claim("w2")["job"] is None  # backoff is also judged by this clock: later
    clock.move_to(at(20))
    job_id2, e2 = claim(coord, "w2", 30)
    assert (job_id2, e2) == (job_id, e1 + 1)
    clock.move_to(at(21 - HOUR))
    coord.complete(job_id, "w2", e2, {"ok": 1})
    events = coord.show(job_id)["events"]
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids)
    assert events[-1]["reason"] == "completed"
    assert events[-1]["at"] < events[-2]["at"]  # timestamps went back; the order did not


def test_a_worker_that_reclaims_its_job_cannot_complete_with_the_old_epoch(
        coord: Coordinator, clock: Any) -> None:
    """The same worker id (a restarted process) is fenced by the epoch alone."""
    job_id = coord.enqueue("work", {})["job_id"]
    _, e1 = claim(coord, "w1", 60)
    clock.move_to(at(61))
    coord.reap()
    _, e2 = claim(coord, "w1", 60)
    assert e2 == e1 + 1
    refused("stale_epoch", coord.complete, job_id, "w1", e1, {"attempt": 1})
    refused("stale_epoch", coord.renew, job_id, "w1", e1)
    coord.complete(job_id, "w1", e2, {"attempt": 2})
    assert coord.show(job_id)["job"]["result"] == {"attempt": 2}
    assert len(completed_events(coord, job_id)) == 1


@pytest.mark.parametrize("moment", [
    datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(5000, 6, 1, 0, 0, 0, 999_998, tzinfo=UTC),
    datetime(2026, 6, 1, 12, 0, 0, 999_999, tzinfo=UTC),
    datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)])
def test_the_clock_reads_every_microsecond_exactly(moment: datetime) -> None:
    """The clock went through a float of seconds: late in the calendar its last
    microseconds of a second read as the next second's (a clock a second ahead, then back),
    and at 9999-12-31T23:59:59.999999 a `schedule tick` with no schedule at all failed,
    calling its own time a damaged row (exit 7). Integer arithmetic, exact everywhere."""
    from jobcoord.clock import iso, now_us
    from jobcoord.metrics import _parse_iso_us

    want = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    with freeze_time(moment):
        assert now_us() == want
    assert iso(want) == moment.isoformat().replace("+00:00", "Z")
    assert _parse_iso_us(moment.isoformat()) == want


@settings(max_examples=3000, deadline=None)
@given(st.integers(min_value=-62135596800 * 1_000_000,
                   max_value=253402300799 * 1_000_000 + 999_999))
def test_a_stored_time_is_written_as_datetime_writes_it(us: int) -> None:
    """Every time from year 1 to the calendar's last microsecond is written as the
    datetime of it writes itself (microseconds only when there are any), and the same
    time twice the same way."""
    from jobcoord.clock import iso

    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    want = moment.isoformat().replace("+00:00", "Z")
    assert iso(us) == want
    assert iso(us) == want


def test_a_time_past_the_calendar_is_damage_whatever_was_written_before() -> None:
    from jobcoord.clock import iso
    from jobcoord.errors import DatabaseCorrupt

    last = 253402300799 * 1_000_000 + 999_999
    assert iso(last) == "9999-12-31T23:59:59.999999Z"
    for us in (last + 1, 10**30, -10**30):
        with pytest.raises(DatabaseCorrupt):
            iso(us)


def test_a_tick_at_the_calendars_last_microsecond_answers(coord: Coordinator) -> None:
    with freeze_time("9999-12-31T23:59:59.999999"):
        got = coord.tick_schedules()
    assert got["at"] == "9999-12-31T23:59:59.999999Z" and got["fired"] == 0, got
    assert check(coord.db)["ok"]


END = "9999-12-31T23:59:00"


@pytest.mark.parametrize("call", [
    lambda c: c.enqueue("k", {}, deadline_s=3600),
    lambda c: c.enqueue("k", {}, delay_s=3600),
    lambda c: c.enqueue_many([{"kind": "k"}, {"kind": "k", "delay_s": 3600}]),
], ids=["deadline", "delay", "many"])
def test_a_submission_timed_past_the_calendars_end_is_invalid_input_and_changes_nothing(
        coord: Coordinator, call: Any) -> None:
    """At the calendar's end a deadline past it was committed, and from then on `show`,
    `explain` and `check` called the job's row damaged ("written outside jobcoord", exit
    7); a delay past it was refused as a damaged database (exit 7, not 2)."""
    from jobcoord.errors import InvalidInput
    from tests.conftest import dump

    with freeze_time(END):
        before = dump(coord)
        with pytest.raises(InvalidInput) as e:
            call(coord)
        assert "9999" in e.value.message, e.value.message
        assert dump(coord) == before
        assert check(coord.db)["ok"]


LAST = "9999-12-31T23:59:59.999999"


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
@pytest.mark.parametrize("call", [
    lambda c: c.claim("w", lease_s=60),
    lambda c: c.claim_many("w", 3, lease_s=60),
], ids=["claim", "claim_many"])
def test_a_claim_at_the_calendars_last_microsecond_is_refused_and_changes_nothing(
        coord: Coordinator, call: Any, limited: bool) -> None:
    """At the last microsecond no lease can start: one ending with the calendar would
    end as it starts, which the leases table's check refuses (a damaged database, exit
    7, on SQLite; an internal error on PostgreSQL). The claim is invalid input and
    nothing is written, not even the refusal counter."""
    from jobcoord.errors import InvalidInput
    from tests.conftest import dump

    if limited:
        coord.set_limit("k", 4)
    coord.enqueue("k", {})
    with freeze_time(LAST):
        coord.heartbeat("w")
        before = dump(coord)
        with pytest.raises(InvalidInput) as e:
            call(coord)
        assert "9999" in e.value.message, e.value.message
        assert dump(coord) == before
        assert check(coord.db)["ok"], check(coord.db)


def test_a_lease_or_backoff_at_the_calendars_end_ends_with_it(coord: Coordinator) -> None:
    """A claim, renewal or retry timed past the calendar's end was refused as a damaged
    database (exit 7). The coordinator's own times stop at the end of the year 9999: the
    lease ends there, the retry waits until then, and every row stays readable."""
    from jobcoord.stored import MAX_TIME_US

    with freeze_time(END):
        job = coord.enqueue("k", {}, max_attempts=3)["job_id"]
        coord.heartbeat("w")
        got = coord.claim("w", lease_s=3600)
        assert got["lease"]["expires_at_us"] == MAX_TIME_US, got
        epoch = got["lease"]["epoch"]
        assert coord.renew(job, "w", epoch, lease_s=3600)["expires_at_us"] == MAX_TIME_US
        coord.claim_many("w", 2, lease_s=3600)
        failed = coord.fail(job, "w", epoch, "boom")
        assert coord.show(job)["job"]["status"] == "waiting", failed
        assert check(coord.db)["ok"], check(coord.db)
