"""Core revision c0005: the schedules and schedule_fires tables. A populated c0003 database
upgrades in place (every row intact, schedules usable at once) and downgrades back, on both
databases; the schema refuses what the rules never write."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.db import CORE_REVISIONS, Target
from jobcoord.errors import JobcoordError
from jobcoord.service import Coordinator
from tests.sql import sql
from tests.test_schema_c0002 import Snapshot, empty_target, upgrade_in_place_and_back

__all__ = ["empty_target"]  # the fixture, imported for this module's tests


def test_c0005_upgrades_a_populated_c0003_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0005" in CORE_REVISIONS

    def upgraded(c: Coordinator, before: Snapshot) -> None:
        with freeze_time("2026-03-02T09:59:00Z") as frozen:
            c.add_schedule("hourly", "k", every="1h")
            frozen.move_to("2026-03-02T10:00:01Z")
            assert c.tick_schedules()["fired"] == 1
        assert len(c.jobs()["jobs"]) == len(before["jobs"]) + 1
        c.remove_schedule("hourly")

    upgrade_in_place_and_back(empty_target, "c0003",
                              new_tables={"schedules", "schedule_fires"}, upgraded=upgraded)


@pytest.mark.parametrize(("column", "value"), [
    ("catchup", "'sometimes'"), ("overlap", "'never'"), ("every_us", "0"),
    ("window_us", "-1"), ("priority", "7")])
def test_the_schedules_table_refuses_values_the_rules_never_write(
        target: Target, column: str, value: str) -> None:
    values = {"name": "'x'", "tenant": "'default'", "kind": "'k'", "priority": "1",
              "payload_json": "'{}'", "max_attempts": "3", "every_us": "60000000",
              "catchup": "'skip'", "overlap": "'allow'", "next_slot_at": "1",
              "created_at": "1", "updated_at": "1", column: value}
    with Coordinator.open(target) as c:
        def _insert(conn: Any) -> None:
            sql(conn, f"INSERT INTO schedules ({', '.join(values)}) VALUES "
                f"({', '.join(values.values())})")
        with pytest.raises(JobcoordError):
            c.db.write(_insert)
        assert c.schedules() == {"schedules": []}
