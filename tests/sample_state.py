"""A database in several states for tests that must see every table filled: jobs waiting,
succeeded, failed and running, with leases, events and checkpoints; and a snapshot of those
tables to compare."""

from __future__ import annotations

from typing import Any

from jobcoord.db import Database
from jobcoord.service import Coordinator


def populate(c: Coordinator) -> None:
    """Jobs in several states, with leases, events and checkpoints."""
    c.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 10, "user_idle_s": 9999,
                                               "on_battery": False})
    for i in range(6):
        c.enqueue("summarize", {"i": i}, priority=i % 4, role="gpu", key=f"k{i}")
    first = c.claim("w1")["job"]
    c.complete(first["job_id"], "w1", 1, {"ok": True})
    second = c.claim("w1")["job"]
    c.checkpoint(second["job_id"], "w1", 1, "remote", {"remote_id": "R-17"})
    c.fail(second["job_id"], "w1", 1, "boom")
    third = c.claim("w1")["job"]  # stays running, holding a lease
    assert third is not None


def snapshot(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("workers", "jobs", "leases", "job_events", "checkpoints")
    return db.read(lambda conn: {
        t: sorted(tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {t}").all())
        for t in tables})
