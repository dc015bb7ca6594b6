"""Rule 3 is judged when the write happens, not when the call started.

Every write reads the clock inside its transaction, after the lock that orders it against other
writers is held: SQLite's BEGIN IMMEDIATE (held when the transaction function starts), or on
PostgreSQL the job's row lock. So a completion that waited for the lock across its lease's end
is refused, and event times never run backwards against event ids for one job."""

from __future__ import annotations

import contextlib
import itertools
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from jobcoord.clock import now_us
from jobcoord.db import Target
from jobcoord.errors import JobcoordError, Refused
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.conftest import fresh_pg
from tests.sql import sql
from tests.timeline import IDLE_ON_AC


def _poll(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


_HOLDER = """
import sqlite3, sys, time
path, ready, until_us = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = sqlite3.connect(path, isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
open(ready, "w").close()
while time.time() * 1e6 < until_us:
    time.sleep(0.02)
conn.execute("COMMIT")
"""


def test_a_completion_that_waited_for_the_sqlite_write_lock_past_expiry_is_refused(
        sqlite_target: Target, tmp_path: Any) -> None:
    coord = Coordinator.open(sqlite_target, busy_timeout=30)
    try:
        job_id = coord.enqueue("k", {})["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        got = coord.claim("w1", lease_s=3)
        epoch, expires_us = got["lease"]["epoch"], got["lease"]["expires_at_us"]
        ready = tmp_path / "locked"
        # Another process holds the write lock across the lease's end.
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, sqlite_target.sqlite_path,
                                   str(ready), str(expires_us + 300_000)])
        try:
            _poll(ready.exists, 30, "the other process to hold BEGIN IMMEDIATE")
            assert now_us() < expires_us, "the machine is too slow for this test's lease"
            with pytest.raises(Refused) as caught:
                coord.complete(job_id, "w1", epoch, {"late": True})
            assert caught.value.code == "lease_expired", caught.value.message
        finally:
            assert holder.wait(timeout=60) == 0
        job = coord.show(job_id)["job"]
        assert job["status"] == "running" and job["finished_at"] is None
        assert check(coord.db)["ok"]
    finally:
        coord.close()


@pytest.fixture
def pg_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with fresh_pg(request.getfixturevalue("pg_template")) as t:
        yield t


def test_a_completion_waiting_on_the_pg_job_row_lock_past_expiry_is_refused(
        pg_target: Target) -> None:
    import psycopg

    coord = Coordinator.open(pg_target)
    holder = psycopg.connect(pg_target.url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        job_id = coord.enqueue("k", {})["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        got = coord.claim("w1", lease_s=2)
        epoch, expires_us = got["lease"]["epoch"], got["lease"]["expires_at_us"]
        holder.execute("SELECT job_id FROM jobs WHERE job_id = %s FOR UPDATE", (job_id,))
        outcome: list[Any] = []

        def complete() -> None:
            try:
                outcome.append(coord.complete(job_id, "w1", epoch, {"late": True}))
            except JobcoordError as e:
                outcome.append(e)

        t = threading.Thread(target=complete)
        t.start()
        with psycopg.connect(pg_target.url.replace("postgresql+psycopg://", "postgresql://"),
                             autocommit=True) as watch:
            _poll(lambda: watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'").fetchone()[0] == 1, 30,
                "the completion to wait on the row lock")
        assert now_us() < expires_us, "the machine is too slow for this test's lease"
        _poll(lambda: now_us() > expires_us + 200_000, 30, "the lease to expire")
        holder.commit()
        t.join(60)
        assert len(outcome) == 1
        assert isinstance(outcome[0], Refused), outcome
        assert outcome[0].code == "lease_expired"
        assert coord.show(job_id)["job"]["status"] == "running"
    finally:
        holder.close()
        coord.close()


def test_event_times_never_run_backwards_against_event_ids(target: Target) -> None:
    """A concurrent workload of workers, a reaper and an operator on one database (each thread
    its own Coordinator): for every job, `at` is non-decreasing in event_id order."""
    setup = Coordinator.open(target)
    try:
        for i in range(60):
            setup.enqueue("k", {"i": i}, max_attempts=5)
    finally:
        setup.close()
    stop = time.monotonic() + 3.0
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        c = Coordinator.open(target, busy_timeout=10)
        rng = random.Random(name)
        try:
            while time.monotonic() < stop:
                c.heartbeat(name, readings=IDLE_ON_AC)
                got = c.claim(name, lease_s=0.3)
                if got["job"] is None:
                    continue
                job_id, epoch = got["job"]["job_id"], got["lease"]["epoch"]
                try:
                    if rng.random() < 0.3:
                        c.mark_effect(job_id, name, epoch)
                    if rng.random() < 0.3:
                        time.sleep(0.3)  # let the lease run out sometimes
                    action = rng.choice(["complete", "fail", "fail_na", "renew"])
                    if action == "complete":
                        c.complete(job_id, name, epoch, {"ok": True})
                    elif action == "renew":
                        c.renew(job_id, name, epoch, lease_s=0.3)
                    else:
                        c.fail(job_id, name, epoch, "x", effect_not_applied=action == "fail_na")
                except Refused:
                    pass
        except BaseException as e:
            errors.append(e)
        finally:
            c.close()

    def operator() -> None:
        c = Coordinator.open(target, busy_timeout=10)
        rng = random.Random(7)
        try:
            while time.monotonic() < stop:
                c.reap()
                job_id = rng.randint(1, 60)
                with contextlib.suppress(Refused):
                    rng.choice([c.cancel, c.retry])(job_id)
                with contextlib.suppress(Refused):
                    c.reconcile(job_id, "waiting", "checked by hand")
        except BaseException as e:
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
    threads.append(threading.Thread(target=operator))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    c = Coordinator.open(target)
    try:
        rows = c.db.read(lambda conn: sql(
            conn, "SELECT job_id, event_id, at FROM job_events ORDER BY job_id, event_id"
        ).all())
        backwards = [(a, b) for a, b in itertools.pairwise(rows)
                     if a[0] == b[0] and b[2] < a[2]]
        assert not backwards, backwards[:5]
        assert len(rows) > 100
        assert check(c.db)["ok"]
    finally:
        c.close()


def test_a_pg_write_waiting_on_a_row_lock_past_the_busy_timeout_is_busy_and_changes_nothing(
        pg_target: Target) -> None:
    import psycopg

    from jobcoord.errors import DatabaseBusy

    coord = Coordinator.open(pg_target, busy_timeout=0.5)
    holder = psycopg.connect(pg_target.url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        job_id = coord.enqueue("k", {})["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        epoch = coord.claim("w1", lease_s=60)["lease"]["epoch"]
        holder.execute("SELECT job_id FROM jobs WHERE job_id = %s FOR UPDATE", (job_id,))
        started = time.monotonic()
        with pytest.raises(DatabaseBusy) as caught:
            coord.complete(job_id, "w1", epoch, {"x": 1})
        # Bounded: a few retries of a 0.5 s lock wait, not for as long as the lock is held.
        assert time.monotonic() - started < 15
        assert caught.value.exit_code == 5
        holder.rollback()
        assert coord.show(job_id)["job"]["status"] == "running"
        assert coord.complete(job_id, "w1", epoch, {"x": 1})["status"] == "succeeded"
    finally:
        holder.close()
        coord.close()
