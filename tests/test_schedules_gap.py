"""A schedule whose last tick was weeks ago, on both databases: the first tick after the gap
fires the on-time slots and catches up the latest missed ones (never the earliest), counts
what it missed or says that it could not, computes a number of cron slots bounded by the
slots it handles (not by the length of the gap), and computes them before it takes the
write lock, so an enqueue beside it is not kept waiting; the write uses them only while the
schedule's row is unchanged, and adds the slots that came due meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import func, select, update

from jobcoord.core import schedules as schedule_rules
from jobcoord.core import slots
from jobcoord.db import Target
from jobcoord.schema import schedule_fires, schedules
from jobcoord.service import Coordinator
from tests.test_schedules import fired_slots, fires

REPO = Path(__file__).resolve().parent.parent
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
    """Counts the cron slots computed (cronsim's steps), and those computed while the tick's
    write transaction was open."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, coord: Coordinator) -> None:
        self.total = self.in_write = 0
        self.writing = False
        self.during: Any = None  # called at the first step of the tick
        steps, real_sim = self, slots.CronSim

        class Counted(real_sim):  # type: ignore[misc, valid-type]
            def __next__(self) -> datetime:
                steps.total += 1
                steps.in_write += steps.writing
                if steps.during is not None:
                    during, steps.during = steps.during, None
                    during()
                return super().__next__()

        monkeypatch.setattr(slots, "CronSim", Counted)
        real_write = coord.db.write

        def write(fn: Any, where: str = "") -> Any:
            def inside(conn: Any) -> Any:
                self.writing = True
                try:
                    return fn(conn)
                finally:
                    self.writing = False
            return real_write(inside, where)

        monkeypatch.setattr(coord.db, "write", write)


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
    steps = _Steps(monkeypatch, coord)
    with freeze_time(tick_at):
        got = coord.tick_schedules()
    assert got["fired"] == 3 * len(ON_TIME)
    handled = coord.db.read(lambda conn: conn.execute(
        select(func.count()).select_from(schedule_fires)).scalar_one())
    assert handled == 3 * (len(ON_TIME) + schedule_rules.MAX_MISSED_ROWS)
    # Each handled slot is computed about twice (found walking back from now, then walked
    # forward), whatever the gap; the whole gap is never walked.
    assert 0 < steps.total <= 3 * handled


def test_a_tick_computes_no_slot_inside_its_write_transaction(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    tick_at = datetime(2026, 3, 15, 12, 0, 30, tzinfo=UTC)
    _minute_crons_after_a_gap(coord, timedelta(days=70), tick_at)
    steps = _Steps(monkeypatch, coord)
    with freeze_time(tick_at):
        assert coord.tick_schedules()["fired"] == 3 * len(ON_TIME)
    assert steps.total > 0 and steps.in_write == 0


def test_an_enqueue_beside_a_tick_after_a_long_gap_is_not_kept_waiting(
        sqlite_target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process enqueues while the tick computes its slots, giving up after 1 s
    of SQLite's write lock held elsewhere: it succeeds, since no slot is computed while the
    tick holds that lock."""
    path = sqlite_target.sqlite_path or ""
    with freeze_time(datetime.now(UTC) - timedelta(days=70)), \
            Coordinator.open(sqlite_target) as c:
        for i in range(3):
            c.add_schedule(f"s{i}", "k", cron="* * * * *", catchup="latest")
    seen: dict[str, Any] = {}

    def enqueue() -> None:
        seen["run"] = subprocess.run(
            [sys.executable, "-m", "jobcoord", "--db", path, "--busy-timeout", "1",
             "enqueue", "urgent", "--json"], capture_output=True, text=True, cwd=REPO,
            env=dict(os.environ), timeout=60)

    with Coordinator.open(sqlite_target, busy_timeout=30) as c:
        steps = _Steps(monkeypatch, c)
        steps.during = enqueue
        got = c.tick_schedules()
        assert got["fired"] > 0 and "run" in seen
        run = seen["run"]
        assert run.returncode == 0, (run.stdout, run.stderr)
        assert [j["kind"] for j in c.jobs(kind="urgent")["jobs"]] == ["urgent"]


def _before_the_write(monkeypatch: pytest.MonkeyPatch, coord: Coordinator, then: Any) -> None:
    """Run `then` once the tick has planned its slots, before its write transaction."""
    real_write = coord.db.write

    def write(fn: Any, where: str = "") -> Any:
        if where == "schedule tick":
            then()
        return real_write(fn, where)

    monkeypatch.setattr(coord.db, "write", write)


def test_a_slot_that_comes_due_while_the_tick_waits_for_the_write_fires_in_it(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    with freeze_time("2026-03-15T11:59:50Z") as frozen:
        coord.add_schedule("minutely", "k", cron="* * * * *", catchup="latest")
        frozen.move_to("2026-03-15T12:00:50Z")
        _before_the_write(monkeypatch, coord, lambda: frozen.move_to("2026-03-15T12:01:10Z"))
        got = coord.tick_schedules()
    assert fired_slots(coord) == ["2026-03-15T12:00:00Z", "2026-03-15T12:01:00Z"]
    assert (got["missed"], got["missed_exact"]) == (0, True)
    assert got["schedules"][0]["next_fire_at"] == "2026-03-15T12:02:00Z"


def test_a_schedule_another_ticker_handled_after_the_plan_is_not_fired_again(
        target: Target, coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    with freeze_time(ADDED):
        coord.add_schedule("minutely", "k", cron="* * * * *", catchup="latest")
    with freeze_time(TICK), Coordinator.open(target) as other:
        _before_the_write(monkeypatch, coord, other.tick_schedules)
        got = coord.tick_schedules()
    assert got["schedules"] == [] and got["fired"] == 0
    assert fired_slots(coord) == ON_TIME and len(coord.jobs()["jobs"]) == len(ON_TIME)


def test_a_schedule_row_changed_after_the_plan_is_planned_afresh(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write uses the plan only while the row is the one planned from: here its next
    slot moved on to 12:00 meanwhile, and only 12:00 is handled."""
    with freeze_time(ADDED):
        coord.add_schedule("minutely", "k", cron="* * * * *", catchup="latest")
    noon = int(datetime(2026, 3, 15, 12, tzinfo=UTC).timestamp()) * 1_000_000

    def move_on() -> None:
        coord.db.write(lambda conn: conn.execute(
            update(schedules).values(next_slot_at=noon, due_at=noon)))

    with freeze_time(TICK):
        _before_the_write(monkeypatch, coord, move_on)
        got = coord.tick_schedules()
    assert fired_slots(coord) == ["2026-03-15T12:00:00Z"] and fires(coord)[0][1] == "fired"
    assert (got["missed"], got["missed_exact"]) == (0, True)
