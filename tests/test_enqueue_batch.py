"""A keyless batch's rows go to the database as position-bound tuples, on SQLite many rows
per INSERT: each job must be stored exactly as its own `enqueue` stores it, whatever
statement of the batch it lands in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobcoord.service import Coordinator
from jobcoord.store.base import MANY_ROWS


def _specs(n: int) -> list[dict[str, Any]]:
    """Jobs whose settings change from job to job (and repeat), some with needs or a
    deadline, so a row's values must come from its own job, not a neighbour's."""
    out = []
    for i in range(n):
        spec: dict[str, Any] = {"kind": f"k{i % 3}", "payload": {"n": i, "text": "é" * (i % 2)},
                                "priority": i % 4, "delay_s": i % 5}
        if i % 2:
            spec["role"] = "gpu"
        if i % 7 == 0:
            spec["deadline_s"] = 100
        if i % 11 == 0:
            spec["needs"] = {"ram_mb": i + 1}
        if i % 13 == 0:
            spec["tenant"] = "acme"
        if i % 17 == 0:
            spec["max_attempts"] = 5
        out.append(spec)
    return out


def _rows(coord: Coordinator, table: str, order: str) -> list[tuple[Any, ...]]:
    def _read(conn: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.exec_driver_sql(
            f"SELECT * FROM {table} ORDER BY {order}").all()]
    return coord.db.read(_read)


def _same_settings(n: int) -> list[dict[str, Any]]:
    """Jobs that share every setting (the common batch: its events share one detail)."""
    return [{"kind": "k", "payload": {"n": i}, "priority": 2, "max_attempts": 4,
             "delay_s": 30} for i in range(n)]


@pytest.mark.parametrize("make", [_specs, _same_settings], ids=["mixed", "same_settings"])
def test_a_batch_over_several_statements_stores_each_job_as_its_own_enqueue_does(
        coord: Coordinator, clock: Any, make: Callable[[int], list[dict[str, Any]]]) -> None:
    n = 2 * MANY_ROWS + 3  # two full statements and a short one
    specs = make(n)
    singles = [coord.enqueue(**s)["job_id"] for s in specs]
    batch = [b["job_id"] for b in coord.enqueue_many(specs)]
    assert batch == list(range(singles[-1] + 1, singles[-1] + 1 + n)) or \
        not coord.db.is_sqlite
    jobs = {r[0]: r[1:] for r in _rows(coord, "jobs", "job_id")}
    all_events = _rows(coord, "job_events", "event_id")
    # One event per job, in the order of the jobs' ids (the batch's after the singles').
    assert [r[1] for r in all_events] == singles + batch
    events = {r[1]: r[2:] for r in all_events}
    for one, many in zip(singles, batch, strict=True):
        assert jobs[many] == jobs[one], (one, many)
        assert events[many] == events[one], (one, many)
    # Each waiting job counted once, by tenant and kind: twice what the singles made.
    counts = {(r[1], r[2], r[3]): r[5] for r in _rows(coord, "job_counts", "1, 2, 3, 4, 5")}
    for (tenant, status, kind), count in counts.items():
        assert status == "waiting"
        assert count == 2 * sum(1 for s in specs if s["kind"] == kind
                                and s.get("tenant", "default") == tenant)


def test_a_sqlite_batch_inserts_many_jobs_per_statement(sqlite_target: Any) -> None:
    # One row per INSERT runs the job-count trigger under a statement journal per job.
    with Coordinator.open(sqlite_target) as coord:
        seen: list[str] = []
        driver = coord.db.write(lambda conn: conn.connection.driver_connection)
        driver.set_trace_callback(seen.append)
        try:
            coord.enqueue_many(_specs(2 * MANY_ROWS + 3))
        finally:
            driver.set_trace_callback(None)
        # Distinct texts: the trace repeats a statement's text at each trigger it runs.
        inserts = {s for s in seen if s.startswith("INSERT INTO jobs ")}
        events = {s for s in seen if s.startswith("INSERT INTO job_events ")}
        assert len(inserts) == 3 and len(events) == 3
        assert coord.jobs(limit=1)["jobs"]


def test_a_sqlite_batch_of_one_detail_records_its_events_in_one_statement(
        sqlite_target: Any) -> None:
    # A row per event bound and sent cost a tenth of a large batch.
    with Coordinator.open(sqlite_target) as coord:
        coord.enqueue("k", {"before": True})
        seen: list[str] = []
        driver = coord.db.write(lambda conn: conn.connection.driver_connection)
        driver.set_trace_callback(seen.append)
        try:
            made = coord.enqueue_many(_same_settings(2 * MANY_ROWS + 3))
        finally:
            driver.set_trace_callback(None)
        events = [s for s in seen if s.startswith("INSERT INTO job_events ")]
        assert len(events) == 1 and " SELECT " in events[0], events
        first = made[0]["job_id"]
        counted = coord.db.read(lambda conn: conn.exec_driver_sql(
            "SELECT job_id, count(*) FROM job_events GROUP BY job_id ORDER BY job_id").all())
        assert [tuple(r) for r in counted] == [(first - 1, 1)] + [
            (m["job_id"], 1) for m in made]
