"""Core revision c0006: the limits table and jobs.needs_json. A populated c0003 database
upgrades in place (every row intact, no job declaring needs) and downgrades back, on both
databases."""

from __future__ import annotations

from jobcoord.db import CORE_REVISIONS, Target
from jobcoord.service import Coordinator
from tests.test_schema_c0002 import Snapshot, _snapshot, empty_target, upgrade_in_place_and_back
from tests.timeline import IDLE_ON_AC

__all__ = ["empty_target"]  # the fixture, imported for this module's tests


def test_c0006_upgrades_a_populated_c0003_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0006" in CORE_REVISIONS

    def upgraded(c: Coordinator, before: Snapshot) -> None:
        assert c.db.read(lambda conn: conn.exec_driver_sql(
            "SELECT COUNT(*) FROM jobs WHERE needs_json IS NOT NULL").scalar()) == 0
        c.heartbeat("w2", readings={**IDLE_ON_AC, "memory_available_mb": 100})
        c.set_limit("k", 1)
        assert c.limits()["limits"][0]["running"] == 1  # the old running job holds it
        c.remove_limit("k")
        big = c.enqueue("k", {}, needs="ram_mb=200")["job_id"]
        got = c.claim("w2")
        assert got["job"] is not None and got["job"]["job_id"] != big
        c.cancel(big)  # a waiting job with needs, gone: the rest is as before plus one claim
        assert len(_snapshot(c.db)["job_events"]) > len(before["job_events"])

    upgrade_in_place_and_back(empty_target, "c0003", new_tables={"limits"},
                              new_indexes={"ix_jobs_waiting_needs"}, upgraded=upgraded)
