"""Six processes tick the same schedule over many slots at once, on both databases: exactly
one job exists per slot, every slot is handled once, and the processes' own counts of what
they fired add up to the jobs made (no process believes it fired a slot another one did)."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from jobcoord.db import Target
from jobcoord.schema import jobs, schedule_fires
from jobcoord.service import Coordinator

pytestmark = pytest.mark.timeout(300)

SPAWN = multiprocessing.get_context("spawn")
PROCESSES = 6
SLOTS = 60
FIRST = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def _ticker(url: str, start: Any, offsets: list[float], out: Any) -> None:
    """One process: wait until every process has connected, then tick once at each slot
    (+ its own offset of a few seconds, so the processes' frozen clocks interleave)."""
    from freezegun import freeze_time

    fired = 0
    with Coordinator.open(url, busy_timeout=10.0) as c:
        c.status()  # connected and the schema read before the common start
        # A barrier, not a fixed time: on a loaded machine a process may take longer to
        # start than any fixed wait, and the first would then tick every slot alone.
        start.wait()
        for i, offset in enumerate(offsets):
            with freeze_time(FIRST + timedelta(minutes=i, seconds=offset)):
                fired += c.tick_schedules()["fired"]
            # A breath between ticks, as a serve's timer has: without it one process can
            # hold SQLite's write lock tick after tick while the others sleep in their busy
            # wait, and tick every slot alone.
            time.sleep(0.01)
    out.put(fired)


def test_six_processes_ticking_one_schedule_make_exactly_one_job_per_slot(
        target: Target) -> None:
    with Coordinator.open(target) as c:
        from freezegun import freeze_time

        with freeze_time(FIRST - timedelta(seconds=30)):
            # allow and all:N: every slot must fire, whichever process reaches it first and
            # however late its frozen clock finds it.
            c.add_schedule("every-minute", "k", every="1m", overlap="allow",
                           catchup="all:1000")
    import random

    rng = random.Random(15)
    out = SPAWN.Queue()
    start = SPAWN.Barrier(PROCESSES, timeout=120)
    procs = [SPAWN.Process(target=_ticker, args=(
        target.url, start, [rng.choice((1.0, 2.0, 3.0)) for _ in range(SLOTS)], out))
        for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    counts = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    F = schedule_fires.c
    with Coordinator.open(target) as c:
        rows = c.db.read(lambda conn: conn.execute(
            select(F.slot_at, F.outcome, F.job_id).order_by(F.slot_at)).all())
        n_jobs = c.db.read(lambda conn: len(conn.execute(select(jobs.c.job_id)).all()))
    slots = [r[0] for r in rows]
    assert len(slots) == len(set(slots)) == SLOTS
    expected = [int((FIRST + timedelta(minutes=i)).timestamp()) * 1_000_000
                for i in range(SLOTS)]
    assert slots == expected
    assert {r[1] for r in rows} == {"fired"}
    linked = Counter(r[2] for r in rows)
    assert None not in linked and all(n == 1 for n in linked.values())
    assert n_jobs == SLOTS == sum(counts)
    assert sum(1 for n in counts if n) >= 2, counts  # the slots were really shared out
