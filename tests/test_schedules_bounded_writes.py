"""A tick that fires many catch-up jobs across many schedules writes them in bounded write
transactions, on both databases: none handles more than 1,000 slots (so inserts no more
than 1,000 jobs), an enqueue in another process beside such a tick is not kept waiting on
SQLite's write lock, and a tick that dies between two of its transactions leaves every slot
it handled with exactly one job, the rest firing on the next tick."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import func, select

from jobcoord import faults
from jobcoord.core import schedules as schedule_rules
from jobcoord.db import Target
from jobcoord.faults import FaultBug
from jobcoord.schema import jobs, schedule_fires, schedules
from jobcoord.service import Coordinator
from tests.conftest import fresh_pg, fresh_sqlite
from tests.test_schedules_gap import ADDED, ON_TIME, TICK, _Steps

REPO = Path(__file__).resolve().parent.parent
#: The most slots (each one `schedule_fires` row and at most one job) that one write
#: transaction of a tick handles, as docs/guarantees.md states it.
BOUND = 1000


def _counts(c: Coordinator) -> tuple[int, int]:
    return c.db.read(lambda conn: (
        conn.execute(select(func.count()).select_from(jobs)).scalar_one(),
        conn.execute(select(func.count()).select_from(schedule_fires)).scalar_one()))


class _Writes:
    """The jobs and slot rows each committed write transaction of a tick added."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, coord: Coordinator) -> None:
        self.added: list[tuple[int, int]] = []
        real_write = coord.db.write

        def write(fn: Any, where: str = "") -> Any:
            if where != "schedule tick":
                return real_write(fn, where)
            before = _counts(coord)
            got = real_write(fn, where)
            after = _counts(coord)
            self.added.append((after[0] - before[0], after[1] - before[1]))
            return got

        monkeypatch.setattr(coord.db, "write", write)


def _catching_up(coord: Coordinator, n: int, *, window: bool = False) -> None:
    """`n` minute crons with `all:1000` added 70 days before TICK, never ticked since."""
    with freeze_time(ADDED):
        for i in range(n):
            coord.add_schedule(f"s{i}", "k", cron="* * * * *", catchup="all:1000")
        if window:  # every slot's window has closed: 1,105 slots handled, no job
            coord.add_schedule("windowed", "k", cron="* * * * *", catchup="all:1000",
                               window="30s")


def _one_job_per_fired_slot(coord: Coordinator) -> Counter[int]:
    """Fired slots per schedule, after checking each has exactly one job of its own."""
    F = schedule_fires.c
    rows = coord.db.read(lambda conn: conn.execute(
        select(F.schedule_id, F.slot_at, F.outcome, F.job_id)).all())
    fired = [r for r in rows if r[2] == "fired"]
    job_ids = [r[3] for r in fired]
    assert None not in job_ids and len(set(job_ids)) == len(job_ids)
    assert _counts(coord)[0] == len(job_ids)
    return Counter(r[0] for r in fired)


def test_one_write_transaction_of_a_tick_handles_at_most_1000_slots(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    _catching_up(coord, 3, window=True)
    writes = _Writes(monkeypatch, coord)
    steps = _Steps(monkeypatch, coord)
    with freeze_time(TICK):
        got = coord.tick_schedules()
    # The later writes use the rest of what was computed before the first: still no slot
    # is computed while the write lock is held.
    assert steps.total > 0 and steps.in_write == 0
    per_schedule = 1000 + len(ON_TIME)
    assert got["fired"] == 3 * per_schedule and got["missed_exact"] is False
    assert sorted(s["schedule"] for s in got["schedules"]) == ["s0", "s1", "s2", "windowed"]
    assert all(len(s["jobs"]) == s["fired"] for s in got["schedules"])
    assert len(writes.added) > 1
    assert all(made <= BOUND and handled <= BOUND for made, handled in writes.added), \
        writes.added
    assert sorted(_one_job_per_fired_slot(coord).values()) == [per_schedule] * 3
    # Each schedule's row is advanced past now: nothing is due, the next tick is idle.
    with freeze_time(TICK):
        assert coord.tick_schedules()["schedules"] == []


def test_an_enqueue_beside_a_tick_firing_many_catchup_jobs_is_not_kept_waiting(
        sqlite_target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process enqueues, waiting at most 1 s for SQLite's write lock on each of
    its attempts (about 4 s in all), while a tick inserts 10,000 catch-up jobs made slow
    (0.5 ms each, 5 s or more in all); it succeeds, since no write of the tick holds that
    lock for more than 1,000 of them."""
    path = sqlite_target.sqlite_path or ""
    with Coordinator.open(sqlite_target) as c:
        _catching_up(c, 10)
    real_insert = schedule_rules.insert
    seen: dict[str, Any] = {}

    def slow_insert(*args: Any) -> Any:
        if "started" not in seen:
            seen["started"] = subprocess.Popen(
                [sys.executable, "-m", "jobcoord", "--db", path, "--busy-timeout", "1",
                 "enqueue", "urgent", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                env=dict(os.environ))
        time.sleep(0.0005)
        return real_insert(*args)

    monkeypatch.setattr(schedule_rules, "insert", slow_insert)
    with Coordinator.open(sqlite_target, busy_timeout=30) as c, freeze_time(TICK):
        assert c.tick_schedules()["fired"] == 10 * (1000 + len(ON_TIME))
    out, err = seen["started"].communicate(timeout=60)
    assert seen["started"].returncode == 0, (out, err)
    with Coordinator.open(sqlite_target) as c:
        assert [j["kind"] for j in c.jobs(kind="urgent")["jobs"]] == ["urgent"]


def test_a_tick_that_dies_between_two_writes_leaves_one_job_per_slot_and_the_rest_fire_next(
        coord: Coordinator) -> None:
    _catching_up(coord, 3)
    faults.install("schedule.tick.between_writes:bug")
    try:
        with freeze_time(TICK), pytest.raises(FaultBug):
            coord.tick_schedules()
    finally:
        faults.install("")
    first = _one_job_per_fired_slot(coord)
    assert 0 < sum(first.values()) < 3 * (1000 + len(ON_TIME))
    with freeze_time(TICK):
        got = coord.tick_schedules()
    assert got["fired"] == 3 * (1000 + len(ON_TIME)) - sum(first.values())
    after = _one_job_per_fired_slot(coord)
    assert sorted(after.values()) == [1000 + len(ON_TIME)] * 3
    # The slots are the latest 1,000 missed and the on-time ones, as an unbroken tick's.
    F = schedule_fires.c
    slots = coord.db.read(lambda conn: conn.execute(
        select(F.slot_at).where(F.outcome == "fired")).scalars().all())
    assert len(set(slots)) == 1000 + len(ON_TIME)


DAY_BEFORE, DAY_AFTER = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"


def _six_every_second(c: Coordinator) -> None:
    """Six schedules with 1,000 catch-up slots each and 300 on time a day later: each one
    takes more than one write transaction of a tick."""
    with freeze_time(DAY_BEFORE):
        for i in range(6):
            c.add_schedule(f"s{i}", "k", every="1s", catchup="all:1000")


def _handled(c: Coordinator) -> dict[str, list[tuple[Any, ...]]]:
    """Each schedule's handled slots: (slot, outcome, made a job, detail)."""
    S, F = schedules.c, schedule_fires.c
    rows = c.db.read(lambda conn: conn.execute(
        select(S.name, F.slot_at, F.outcome, F.job_id, F.detail)
        .join(schedule_fires, F.schedule_id == S.schedule_id)
        .order_by(S.name, F.slot_at)).all())
    out: dict[str, list[tuple[Any, ...]]] = {}
    for name, slot, outcome, job, detail in rows:
        out.setdefault(name, []).append((slot, outcome, job is not None, detail))
    return out


def _rows(c: Coordinator) -> dict[str, tuple[Any, ...]]:
    S = schedules.c
    return {r[0]: tuple(r[1:]) for r in c.db.read(lambda conn: conn.execute(
        select(S.name, S.next_slot_at, S.due_at, S.queued_slot_at, S.updated_at)).all())}


@contextlib.contextmanager
def _another_database(target: Target, request: pytest.FixtureRequest, tmp_path: Any
                      ) -> Iterator[Target]:
    if target.sqlite_path:
        yield fresh_sqlite(request.getfixturevalue("sqlite_template"), str(tmp_path),
                           "reference.db")
    else:
        with fresh_pg(request.getfixturevalue("pg_template")) as other:
            yield other


def test_a_tick_split_across_writes_handles_at_most_limit_schedules(
        target: Target, coord: Coordinator, request: pytest.FixtureRequest, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`schedule tick --limit N` handles at most N schedules, each counted once however many
    write transactions it takes, and the schedules it does not reach are left untouched for
    the next tick: what each handled is what one unsplit tick (no bound on the slots of a
    write) handles, nothing lost or repeated. It handled every due schedule, half each."""
    _six_every_second(coord)
    before = _rows(coord)
    with freeze_time(DAY_AFTER):
        got = coord.tick_schedules(limit=2)
    names = [s["schedule"] for s in got["schedules"]]
    assert len(names) == 2 and sorted(_handled(coord)) == sorted(names), names
    after = _rows(coord)
    assert {n: after[n] for n in before if n not in names} == {
        n: before[n] for n in before if n not in names}
    with _another_database(target, request, tmp_path) as other, \
            Coordinator.open(other) as reference:
        _six_every_second(reference)
        bounded = schedule_rules.MAX_TICK_SLOTS
        monkeypatch.setattr(schedule_rules, "MAX_TICK_SLOTS", 10**9)
        with freeze_time(DAY_AFTER):
            whole = reference.tick_schedules(limit=100)
        monkeypatch.setattr(schedule_rules, "MAX_TICK_SLOTS", bounded)
        expected = _handled(reference)
        expected_rows = _rows(reference)
    answers = {s["schedule"]: {k: v for k, v in s.items() if k != "jobs"}
               for s in whole["schedules"]}
    for s in got["schedules"]:
        assert len(s["jobs"]) == s["fired"] > 1000
        assert {k: v for k, v in s.items() if k != "jobs"} == answers[s["schedule"]]
    assert {n: _handled(coord)[n] for n in names} == {n: expected[n] for n in names}
    # Two more ticks handle the other four, two each; then nothing is due.
    with freeze_time(DAY_AFTER):
        assert len(coord.tick_schedules(limit=2)["schedules"]) == 2
        assert len(coord.tick_schedules(limit=2)["schedules"]) == 2
        assert coord.tick_schedules(limit=2)["schedules"] == []
    assert _handled(coord) == expected
    assert {n: r[:3] for n, r in _rows(coord).items()} == {
        n: r[:3] for n, r in expected_rows.items()}
    _one_job_per_fired_slot(coord)
