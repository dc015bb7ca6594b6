"""Schedules under a frozen clock, on both databases: cron slots and intervals, daylight
saving nights in two zones, windows that end as `window_missed`, catch-up and overlap
policies, pause and resume, and one job per (schedule, slot) held by the unique key."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import select, update

from jobcoord.errors import Refused
from jobcoord.schema import job_events, schedule_fires, schedules
from jobcoord.service import Coordinator
from tests.timeline import IDLE_ON_AC


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def z(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def fires(c: Coordinator) -> list[tuple[str, str, int | None]]:
    """(slot, outcome, job) of every handled slot, in slot order."""
    F = schedule_fires.c
    rows = c.db.read(lambda conn: conn.execute(
        select(F.slot_at, F.outcome, F.job_id).order_by(F.schedule_id, F.slot_at)).all())
    from jobcoord.clock import iso

    return [(str(iso(r[0])), r[1], r[2]) for r in rows]


def fired_slots(c: Coordinator) -> list[str]:
    return [slot for slot, outcome, _ in fires(c) if outcome == "fired"]


def tick_through(c: Coordinator, frozen: Any, start: datetime, end: datetime,
                 step: timedelta) -> None:
    t = start
    while t <= end:
        frozen.move_to(t)
        c.tick_schedules()
        t += step


def test_a_cron_slot_fires_one_job_with_the_schedules_kind_and_payload(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:00:00Z") as frozen:
        got = coord.add_schedule("nightly", "reindex", cron="0 2 * * *", tz="UTC",
                                 payload={"corpus": "notes"}, priority="P2")
        assert got["next_fire_at"] == "2026-03-03T02:00:00Z"
        assert coord.tick_schedules()["fired"] == 0  # not due yet
        frozen.move_to("2026-03-03T02:00:05Z")
        first = coord.tick_schedules()
        assert first["fired"] == 1 and first["schedules"][0]["next_fire_at"] == \
            "2026-03-04T02:00:00Z"
        assert first["at"] == "2026-03-03T02:00:05Z"  # every time in an answer is ISO text
        again = coord.tick_schedules()  # the same slot is never fired twice
        assert again["fired"] == 0 and again["schedules"] == []
        job = coord.show(first["schedules"][0]["jobs"][0])["job"]
        assert (job["kind"], job["payload"], job["priority"], job["status"]) == (
            "reindex", {"corpus": "notes"}, 2, "waiting")
        assert fired_slots(coord) == ["2026-03-03T02:00:00Z"]


@pytest.mark.parametrize(("cron", "first", "second"), [
    ("0 0 L * *", "2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z"),
    ("0 0 LW * *", "2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z"),
    ("0 0 * * 1#2", "2026-01-12T00:00:00Z", "2026-02-09T00:00:00Z"),
    ("0 0 * * 5L", "2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z"),
], ids=["last-day", "last-weekday", "nth-weekday", "last-such-weekday"])
def test_the_cron_forms_beyond_debians_fire_on_the_days_they_name(
        coord: Coordinator, cron: str, first: str, second: str) -> None:
    with freeze_time("2026-01-01T12:00:00Z") as frozen:
        assert coord.add_schedule("s", "k", cron=cron)["next_fire_at"] == first
        frozen.move_to(first)
        (got,) = coord.tick_schedules()["schedules"]
        assert (got["fired"], got["next_fire_at"]) == (1, second), got


def test_an_interval_fires_at_multiples_of_it_since_the_epoch(coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:07:00Z") as frozen:
        assert coord.add_schedule("q", "k", every="15m")["next_fire_at"] == \
            "2026-03-02T09:15:00Z"
        tick_through(coord, frozen, utc("2026-03-02T09:10:00Z"),
                     utc("2026-03-02T10:05:00Z"), timedelta(minutes=5))
        assert fired_slots(coord) == ["2026-03-02T09:15:00Z", "2026-03-02T09:30:00Z",
                                      "2026-03-02T09:45:00Z", "2026-03-02T10:00:00Z"]
        assert len(coord.jobs()["jobs"]) == 4


# A 02:30 slot (and New York's 01:30, the hour it repeats) on the nights the clocks change:
# (zone, cron, transition day, the slot that night in UTC, the next night's slot in UTC).
DST_CASES = [
    # Spring forward: 02:00 -> 03:00, 02:30 does not exist: fires once, at 03:00 local.
    ("Europe/Berlin", "30 2 * * *", "2026-03-29", "2026-03-29T01:00:00Z",
     "2026-03-30T00:30:00Z"),
    ("America/New_York", "30 2 * * *", "2026-03-08", "2026-03-08T07:00:00Z",
     "2026-03-09T06:30:00Z"),
    # Fall back: 03:00 -> 02:00 in Berlin, 02:30 happens twice: fires once, the first time.
    ("Europe/Berlin", "30 2 * * *", "2026-10-25", "2026-10-25T00:30:00Z",
     "2026-10-26T01:30:00Z"),
    # New York falls back 02:00 -> 01:00: 02:30 happens once, 01:30 twice (fires once).
    ("America/New_York", "30 2 * * *", "2026-11-01", "2026-11-01T07:30:00Z",
     "2026-11-02T07:30:00Z"),
    ("America/New_York", "30 1 * * *", "2026-11-01", "2026-11-01T05:30:00Z",
     "2026-11-02T06:30:00Z"),
]


@pytest.mark.parametrize(("zone", "cron", "day", "that_night", "next_night"), DST_CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[1].split()[1]}" for c in DST_CASES])
def test_a_slot_fires_once_on_the_nights_the_clocks_change(
        coord: Coordinator, zone: str, cron: str, day: str, that_night: str,
        next_night: str) -> None:
    start = utc(day + "T00:00:00Z") - timedelta(hours=14)
    with freeze_time(start) as frozen:
        coord.add_schedule("dst", "k", cron=cron, tz=zone)
        tick_through(coord, frozen, start, start + timedelta(hours=48),
                     timedelta(minutes=10))
    assert fired_slots(coord) == [that_night, next_night]
    assert [o for _, o, _ in fires(coord)] == ["fired", "fired"]  # nothing missed either


def test_a_fired_job_that_never_ran_in_its_window_ends_dead_as_window_missed(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T01:00:00Z") as frozen:
        coord.add_schedule("nightly", "reindex", cron="0 2 * * *", window="4h")
        hand = coord.enqueue("other", deadline_s=3600)["job_id"]  # an ordinary deadline
        frozen.move_to("2026-03-02T02:00:30Z")
        job_id = coord.tick_schedules()["schedules"][0]["jobs"][0]
        assert coord.show(job_id)["job"]["deadline_at"] == "2026-03-02T06:00:00Z"
        frozen.move_to("2026-03-02T05:59:59Z")
        assert coord.reap()["deadline_dead"] == 1  # only the hand-made job, past its hour
        assert coord.show(job_id)["job"]["status"] == "waiting"
        frozen.move_to("2026-03-02T06:00:00Z")
        said = coord.explain(job_id)
        assert said["schedule"]["window_ends_at"] == "2026-03-02T06:00:00Z"
        assert "window_missed" in [r["code"] for r in said["reasons"]]
        assert coord.reap()["deadline_dead"] == 1
        shown = coord.show(job_id)
        assert shown["job"]["status"] == "dead" and "window" in shown["job"]["last_error"]
        assert shown["events"][-1]["reason"] == "window_missed"
        assert coord.show(hand)["events"][-1]["reason"] == "deadline_passed"


def test_a_job_started_inside_its_window_runs_to_the_end(coord: Coordinator) -> None:
    with freeze_time("2026-03-02T01:00:00Z") as frozen:
        coord.add_schedule("nightly", "reindex", cron="0 2 * * *", window="1h")
        frozen.move_to("2026-03-02T02:01:00Z")
        job_id = coord.tick_schedules()["schedules"][0]["jobs"][0]
        frozen.move_to("2026-03-02T02:59:00Z")
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        claimed = coord.claim("w1", lease_s=600)  # a lease may run past the window's end
        assert claimed["job"]["job_id"] == job_id
        frozen.move_to("2026-03-02T03:05:00Z")
        assert coord.reap()["deadline_dead"] == 0
        assert coord.complete(job_id, "w1", 1, {"ok": 1})["status"] == "succeeded"


def test_catchup_skip_counts_a_slot_found_late_as_missed_even_inside_its_window(
        coord: Coordinator) -> None:
    """On time means found less than ON_TIME_S after the slot; later, the catch-up policy
    decides, and skip fires nothing, window or not."""
    with freeze_time("2026-03-02T01:00:00Z") as frozen:
        coord.add_schedule("nightly", "reindex", cron="0 2 * * *", window="1h")
        frozen.move_to("2026-03-02T02:06:00Z")
        assert coord.tick_schedules()["missed"] == 1
    assert coord.jobs()["jobs"] == []


def _sleep_then_tick(c: Coordinator, catchup: str, *, window: str | None = None
                     ) -> dict[str, Any]:
    """An hourly schedule whose machine sleeps from 09:30 to 14:40: the 10:00 ... 14:00
    slots (five) are late when the first tick after waking runs."""
    with freeze_time("2026-03-02T09:30:00Z") as frozen:
        c.add_schedule("hourly", "k", every="1h", catchup=catchup, window=window)
        frozen.move_to("2026-03-02T14:40:00Z")
        return c.tick_schedules()


def test_catchup_skip_records_each_missed_slot_and_fires_nothing(coord: Coordinator) -> None:
    got = _sleep_then_tick(coord, "skip")
    assert (got["fired"], got["missed"]) == (0, 5)
    assert [o for _, o, _ in fires(coord)] == ["missed"] * 5
    assert coord.jobs()["jobs"] == []
    last = coord.schedules()["schedules"][0]["last"]
    assert (last["slot"], last["outcome"]) == ("2026-03-02T14:00:00Z", "missed")


def test_catchup_latest_fires_once_for_the_latest_missed_slot(coord: Coordinator) -> None:
    got = _sleep_then_tick(coord, "latest")
    assert (got["fired"], got["missed"]) == (1, 4)
    assert fired_slots(coord) == ["2026-03-02T14:00:00Z"]


def test_catchup_all_n_fires_up_to_n_of_the_latest_missed_slots(coord: Coordinator) -> None:
    got = _sleep_then_tick(coord, "all:3")
    assert (got["fired"], got["missed"]) == (3, 2)
    assert fired_slots(coord) == ["2026-03-02T12:00:00Z", "2026-03-02T13:00:00Z",
                                  "2026-03-02T14:00:00Z"]


def test_catchup_never_fires_a_slot_whose_window_has_closed(coord: Coordinator) -> None:
    got = _sleep_then_tick(coord, "all:5", window="50m")
    # 14:00 + 50m is still open at 14:40; the older windows have closed.
    assert (got["fired"], got["missed"]) == (1, 4)
    assert fired_slots(coord) == ["2026-03-02T14:00:00Z"]
    details = coord.db.read(lambda conn: conn.execute(
        select(schedule_fires.c.detail).where(schedule_fires.c.outcome == "missed")).all())
    assert all("window_closed" in d[0] for d in details)


def _hourly(c: Coordinator, frozen: Any, overlap: str) -> list[dict[str, Any]]:
    """Three hourly slots fired on time, the first job left waiting throughout."""
    c.add_schedule("hourly", "k", every="1h", overlap=overlap)
    out = []
    for hour in (10, 11, 12):
        frozen.move_to(f"2026-03-02T{hour}:00:10Z")
        out.append(c.tick_schedules())
    return out


def test_overlap_allow_fires_every_slot(coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:30:00Z") as frozen:
        ticks = _hourly(coord, frozen, "allow")
    assert [t["fired"] for t in ticks] == [1, 1, 1]


def test_overlap_skip_skips_a_slot_while_the_previous_job_waits_or_runs(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:30:00Z") as frozen:
        ticks = _hourly(coord, frozen, "skip")
        assert [(t["fired"], t["skipped"]) for t in ticks] == [(1, 0), (0, 1), (0, 1)]
        first = ticks[0]["schedules"][0]["jobs"][0]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        assert coord.claim("w1", lease_s=7200)["job"]["job_id"] == first  # running: live
        frozen.move_to("2026-03-02T13:00:10Z")
        assert coord.tick_schedules()["skipped"] == 1
        coord.complete(first, "w1", 1, {})
        frozen.move_to("2026-03-02T14:00:10Z")
        assert coord.tick_schedules()["fired"] == 1
    skipped = coord.schedules()["schedules"][0]
    assert skipped["last"]["outcome"] == "fired"
    assert [o for _, o, _ in fires(coord)] == ["fired", "skipped", "skipped", "skipped",
                                               "fired"]


def test_overlap_queue_one_holds_one_slot_until_the_previous_job_ends(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:30:00Z") as frozen:
        ticks = _hourly(coord, frozen, "queue_one")
        assert [(t["fired"], t["queued"], t["skipped"]) for t in ticks] == [
            (1, 0, 0), (0, 1, 0), (0, 0, 1)]
        assert coord.schedules()["schedules"][0]["queued_slot"] == "2026-03-02T11:00:00Z"
        first = ticks[0]["schedules"][0]["jobs"][0]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        assert coord.claim("w1", lease_s=7200)["job"]["job_id"] == first
        frozen.move_to("2026-03-02T12:20:00Z")
        assert coord.tick_schedules()["fired"] == 0  # still running: the slot stays held
        coord.complete(first, "w1", 1, {})
        frozen.move_to("2026-03-02T12:20:05Z")
        got = coord.tick_schedules()
        assert got["fired"] == 1
        assert coord.schedules()["schedules"][0]["queued_slot"] is None
    assert [(s, o) for s, o, _ in fires(coord)] == [
        ("2026-03-02T10:00:00Z", "fired"), ("2026-03-02T11:00:00Z", "fired"),
        ("2026-03-02T12:00:00Z", "skipped")]
    assert len(coord.jobs()["jobs"]) == 2


def test_a_paused_schedule_fires_nothing_and_resumes_from_the_next_slot(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:30:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h", catchup="all:10")
        assert coord.pause_schedule("hourly")["paused"] is True
        assert coord.schedules()["schedules"][0]["next_fire_at"] is None
        frozen.move_to("2026-03-02T12:00:10Z")
        assert coord.tick_schedules()["schedules"] == []
        got = coord.resume_schedule("hourly")
        assert got["next_fire_at"] == "2026-03-02T13:00:00Z"  # no catch-up of the pause
        frozen.move_to("2026-03-02T13:00:10Z")
        assert coord.tick_schedules()["fired"] == 1
    assert fired_slots(coord) == ["2026-03-02T13:00:00Z"]


def test_removing_a_schedule_keeps_its_jobs_and_frees_its_name(coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:59:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h")
        frozen.move_to("2026-03-02T10:00:10Z")
        job_id = coord.tick_schedules()["schedules"][0]["jobs"][0]
        assert coord.remove_schedule("hourly") == {"schedule": "hourly", "removed": True}
        assert coord.show(job_id)["job"]["status"] == "waiting"
        assert fires(coord) == [] and coord.schedules() == {"schedules": []}
        with pytest.raises(Refused) as e:
            coord.remove_schedule("hourly")
        assert e.value.code == "schedule_not_found"
        coord.add_schedule("hourly", "k", every="1h")


def test_a_slot_already_handled_is_never_fired_again_by_a_stale_ticker(
        coord: Coordinator) -> None:
    """The unique (schedule, slot) key, not the ticker's view, decides: a ticker that
    still sees the slot as due (the schedule row rewound as if read before the first fire
    committed) inserts no second job."""
    with freeze_time("2026-03-02T09:59:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h")
        frozen.move_to("2026-03-02T10:00:10Z")
        assert coord.tick_schedules()["fired"] == 1
        slot = int(utc("2026-03-02T10:00:00Z").timestamp()) * 1_000_000
        coord.db.write(lambda conn: conn.execute(update(schedules).values(
            next_slot_at=slot, due_at=slot)))
        again = coord.tick_schedules()
        assert again["fired"] == 0 and again["schedules"][0]["jobs"] == []
    assert len(coord.jobs()["jobs"]) == 1
    assert fires(coord)[0][1] == "fired" and len(fires(coord)) == 1


def test_a_tick_with_nothing_due_takes_no_write_lock(sqlite_target: Any) -> None:
    """Cheap when nothing is due: one read of the due index. Proof: it answers at once
    while another connection holds SQLite's write lock (a write would wait, then fail)."""
    import sqlite3
    import time

    with Coordinator.open(sqlite_target, busy_timeout=2.0) as c:
        c.add_schedule("later", "k", cron="0 2 * * *")
        other = sqlite3.connect(sqlite_target.sqlite_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            assert c.tick_schedules()["fired"] == 0
            assert time.monotonic() - started < 1.0
        finally:
            other.execute("ROLLBACK")
            other.close()
        plan = c.db.read(lambda conn: conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + __import__(
                "jobcoord.store.schedule_statements", fromlist=["DUE_TO_PLAN"]
            ).DUE_TO_PLAN.sqlite, {"now": 0, "limit": 100}).all())
        assert "ix_schedules_due_at" in " ".join(str(r) for r in plan)


def test_an_event_of_the_reaper_names_the_schedule_and_slot(coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:59:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h", window="10m")
        frozen.move_to("2026-03-02T10:00:10Z")
        job_id = coord.tick_schedules()["schedules"][0]["jobs"][0]
        frozen.move_to("2026-03-02T10:10:00Z")
        coord.reap()
    E = job_events.c
    detail = coord.db.read(lambda conn: conn.execute(
        select(E.detail).where(E.job_id == job_id, E.reason == "window_missed")).scalar_one())
    assert '"schedule": "hourly"' in detail.replace('":"', '": "')


def test_a_schedule_added_inside_the_repeated_hour_never_starts_behind_now(
        coord: Coordinator) -> None:
    """02:10 CET on Berlin's fall-back night comes after 02:30 CEST (00:30Z): the next
    02:30 is the next night's, not the one already passed."""
    with freeze_time("2026-10-25T01:10:00Z") as frozen:
        got = coord.add_schedule("dst", "k", cron="30 2 * * *", tz="Europe/Berlin")
        assert got["next_fire_at"] == "2026-10-26T01:30:00Z"
        coord.pause_schedule("dst")
        assert coord.resume_schedule("dst")["next_fire_at"] == "2026-10-26T01:30:00Z"
        frozen.move_to("2026-10-25T01:40:00Z")
        assert coord.tick_schedules()["schedules"] == []
    assert fires(coord) == []


def test_a_pruned_job_leaves_its_slot_handled_and_the_schedule_going(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:59:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h", overlap="skip")
        coord.enqueue("newest")  # prune always keeps the newest job
        frozen.move_to("2026-03-02T10:00:10Z")
        job_id = coord.tick_schedules()["schedules"][0]["jobs"][0]
        coord.enqueue("newer")
        coord.cancel(job_id)
        frozen.move_to("2026-03-02T10:30:00Z")
        assert coord.prune(60, statuses=["cancelled"])["jobs"] == 1
        last = coord.schedules()["schedules"][0]["last"]
        assert (last["outcome"], last["job_id"], last["job_status"]) == ("fired", None, None)
        frozen.move_to("2026-03-02T11:00:10Z")
        assert coord.tick_schedules()["fired"] == 1  # no live previous job: fires
    assert [s for s, _, _ in fires(coord)] == ["2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z"]


def test_threads_sharing_one_coordinator_tick_one_job_per_slot(coord: Coordinator) -> None:
    import threading

    with freeze_time("2026-03-02T09:59:30Z") as frozen:
        coord.add_schedule("minutely", "k", every="1m", catchup="all:1000")
        stop = threading.Event()
        errors: list[BaseException] = []

        def ticker() -> None:
            while not stop.is_set():
                try:
                    coord.tick_schedules()
                except BaseException as e:  # reported below
                    errors.append(e)
                    return

        threads = [threading.Thread(target=ticker) for _ in range(4)]
        for t in threads:
            t.start()
        for minute in range(30):
            frozen.move_to(utc("2026-03-02T10:00:05Z") + timedelta(minutes=minute))
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(30)
        coord.tick_schedules()
    assert errors == []
    slots = fired_slots(coord)
    assert len(slots) == len(set(slots)) == 30 == len(coord.jobs(limit=1000)["jobs"])


def test_catchup_latest_fires_only_the_on_time_slot_when_there_is_one(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:30:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h", catchup="latest")
        frozen.move_to("2026-03-02T13:02:00Z")  # 10:00-12:00 late, 13:00 on time
        got = coord.tick_schedules()
    assert (got["fired"], got["missed"]) == (1, 3)
    assert fired_slots(coord) == ["2026-03-02T13:00:00Z"]


def test_a_held_slot_whose_window_closes_meanwhile_is_recorded_missed(
        coord: Coordinator) -> None:
    with freeze_time("2026-03-02T09:59:00Z") as frozen:
        coord.add_schedule("hourly", "k", every="1h", window="20m", overlap="queue_one")
        frozen.move_to("2026-03-02T10:00:05Z")
        first = coord.tick_schedules()["schedules"][0]["jobs"][0]
        frozen.move_to("2026-03-02T11:00:05Z")
        assert coord.tick_schedules()["queued"] == 1  # the 10:00 job still waits
        coord.cancel(first)
        frozen.move_to("2026-03-02T11:25:00Z")  # 11:00's window closed at 11:20
        got = coord.tick_schedules()
        assert (got["fired"], got["missed"]) == (0, 1)
    assert [(s, o) for s, o, _ in fires(coord)] == [
        ("2026-03-02T10:00:00Z", "fired"), ("2026-03-02T11:00:00Z", "missed")]
    assert coord.schedules()["schedules"][0]["queued_slot"] is None


def test_the_overlap_check_reads_the_last_fired_slot_by_index(sqlite_target: Any) -> None:
    """A long-running job behind a minute schedule leaves thousands of skipped slots; the
    check for a live previous job must not read them."""
    from jobcoord.store import schedule_statements as s

    with Coordinator.open(sqlite_target) as c:
        plan = c.db.read(lambda conn: conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + s.LAST_JOB_FIRE.sqlite, {"schedule_id": 1}).all())
    text = " ".join(str(r) for r in plan)
    assert "ix_schedule_fires_schedule_id_outcome_slot_at" in text and "TEMP B-TREE" not in text
