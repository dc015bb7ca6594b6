"""A schedule whose last tick was weeks ago, on both databases: the first tick after the gap
fires the on-time slots and catches up the latest missed ones (never the earliest), counts
what it missed or says that it could not, and computes a number of cron slots bounded by
the slots it handles (not by the length of the gap)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import func, select

from jobcoord.core import schedules as schedule_rules
from jobcoord.core import slots
from jobcoord.schema import schedule_fires
from jobcoord.service import Coordinator
from tests.test_schedules import fired_slots, fires

ADDED = "2026-01-01T00:00:00Z"
TICK = "2026-03-15T12:00:30Z"
#: Found less than 5 minutes after their time at 12:00:30: on time.
ON_TIME = [f"2026-03-15T{t}:00Z" for t in ("11:56", "11:57", "11:58", "11:59", "12:00")]


def _minutes(start: str, end: str) -> int:
    def at(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((at(end) - at(start)) / timedelta(minutes=1))


@pytest.mark.parametrize(("catchup", "window", "fired"), [
    ("latest", None, ON_TIME),
    ("latest", "1h", ON_TIME),
    ("skip", None, ON_TIME),
    ("all:3", None, ["2026-03-15T11:53:00Z", "2026-03-15T11:54:00Z", "2026-03-15T11:55:00Z",
                     *ON_TIME]),
    ("all:3", "1h", ["2026-03-15T11:53:00Z", "2026-03-15T11:54:00Z", "2026-03-15T11:55:00Z",
                     *ON_TIME]),
], ids=["latest", "latest-window", "skip", "all3", "all3-window"])
def test_after_a_70_day_gap_the_on_time_slots_fire_and_catchup_takes_the_latest_missed(
        coord: Coordinator, catchup: str, window: str | None, fired: list[str]) -> None:
    with freeze_time(ADDED):
        coord.add_schedule("minutely", "k", cron="* * * * *", catchup=catchup, window=window)
    with freeze_time(TICK):
        got = coord.tick_schedules()
    assert fired_slots(coord) == fired
    assert got["fired"] == len(fired) == len(coord.jobs()["jobs"])
    # 105,835 slots were missed: too many to count in one tick, and the answer says so.
    assert got["missed_exact"] is False and got["schedules"][0]["missed_exact"] is False
    missed = [slot for slot, outcome, _ in fires(coord) if outcome == "missed"]
    assert len(missed) == schedule_rules.MAX_MISSED_ROWS <= got["missed"]
    # The missed rows are the latest missed slots, right before what fired or was on time.
    assert missed[-1] == ("2026-03-15T11:52:00Z" if catchup.startswith("all")
                          else "2026-03-15T11:55:00Z")
    F = schedule_fires.c
    oldest = coord.db.read(lambda conn: conn.execute(
        select(F.detail).where(F.outcome == "missed").order_by(F.slot_at).limit(1)
    ).scalar_one())
    assert '"older_missed": "many"' in oldest.replace('":"', '": "')
    assert got["schedules"][0]["next_fire_at"] == "2026-03-15T12:01:00Z"


def test_after_a_70_day_gap_an_interval_counts_every_missed_slot(coord: Coordinator) -> None:
    with freeze_time(ADDED):
        coord.add_schedule("minutely", "k", every="1m", catchup="latest")
    with freeze_time(TICK):
        got = coord.tick_schedules()
    assert fired_slots(coord) == ON_TIME
    # From 00:01 on 1 January to 11:55 on 15 March, every minute's slot.
    assert got["missed"] == _minutes(ADDED, "2026-03-15T11:55:00Z") == 105_835
    assert got["missed_exact"] is True


def test_a_short_gap_of_a_cron_counts_every_missed_slot(coord: Coordinator) -> None:
    with freeze_time("2026-03-15T10:00:30Z"):
        coord.add_schedule("minutely", "k", cron="* * * * *", catchup="latest")
    with freeze_time("2026-03-15T11:00:30Z"):
        got = coord.tick_schedules()
    assert fired_slots(coord) == [f"2026-03-15T10:{m}:00Z" for m in (56, 57, 58, 59)] + [
        "2026-03-15T11:00:00Z"]
    assert (got["missed"], got["missed_exact"]) == (55, True)
    assert [o for _, o, _ in fires(coord)].count("missed") == 55


def test_schedule_tick_says_when_older_missed_slots_were_not_counted(cli: Any) -> None:
    with freeze_time(ADDED):
        assert cli("schedule", "add", "cron", "k", "--cron", "* * * * *").code == 0
        assert cli("schedule", "add", "every", "k", "--every", "1m").code == 0
    with freeze_time(TICK):
        got = cli("schedule", "tick")
    assert got.code == 0
    assert got.out.strip() == (f"fired 10, missed {101 + 105_835} or more (older slots not "
                               "counted), skipped 0, queued 0")


class _Steps:
    """Counts the cron slots computed (cronsim's steps)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.total = 0
        steps, real_sim = self, slots.CronSim

        class Counted(real_sim):  # type: ignore[misc, valid-type]
            def __next__(self) -> datetime:
                steps.total += 1
                return super().__next__()

        monkeypatch.setattr(slots, "CronSim", Counted)


def _minute_crons_after_a_gap(coord: Coordinator, gap: timedelta, tick_at: datetime) -> None:
    with freeze_time(tick_at - gap):
        for i in range(3):
            coord.add_schedule(f"s{i}", "k", cron="* * * * *", catchup="latest",
                               tz="Europe/Berlin")


@pytest.mark.parametrize("gap_days", [10, 70])
def test_a_tick_after_a_long_gap_computes_slots_bounded_by_what_it_handles(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch, gap_days: int) -> None:
    tick_at = datetime(2026, 3, 15, 12, 0, 30, tzinfo=UTC)
    _minute_crons_after_a_gap(coord, timedelta(days=gap_days), tick_at)
    steps = _Steps(monkeypatch)
    with freeze_time(tick_at):
        got = coord.tick_schedules()
    assert got["fired"] == 3 * len(ON_TIME)
    handled = coord.db.read(lambda conn: conn.execute(
        select(func.count()).select_from(schedule_fires)).scalar_one())
    assert handled == 3 * (len(ON_TIME) + schedule_rules.MAX_MISSED_ROWS)
    # Each handled slot is computed about twice (found walking back from now, then walked
    # forward), whatever the gap; the whole gap is never walked.
    assert 0 < steps.total <= 3 * handled
