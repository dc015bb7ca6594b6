"""Core revision c0005: the schedules and schedule_fires tables. A populated c0003 database
upgrades in place (every row intact, schedules usable at once) and downgrades back, on both
databases; the schema refuses what the rules never write."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.errors import JobcoordError
from jobcoord.maintenance import check
from jobcoord.migrate import current_revisions, migrate
from jobcoord.service import Coordinator
from tests.sql import sql
from tests.test_schema_c0002 import _alembic, _snapshot, empty_target, populated_at

__all__ = ["empty_target"]  # the fixture, imported for this module's tests


def _has(db: Database, table: str) -> bool:
    return db.read(lambda conn: db.engine.dialect.has_table(conn, table))


def test_c0005_upgrades_a_populated_c0003_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0005" in CORE_REVISIONS
    db = Database.open(empty_target, create=True)
    try:
        populated_at(db, "c0003")
        before = _snapshot(db)
        assert not _has(db, "schedules")

        out = migrate(db)
        assert out["revisions_before"] == ["c0003"]
        assert out["revisions"] == [CORE_REVISIONS[-1]]
        assert _snapshot(db) == before
        assert check(db)["ok"]
        c = Coordinator(db)  # verify_schema accepts the upgraded database
        with freeze_time("2026-03-02T09:59:00Z") as frozen:
            c.add_schedule("hourly", "k", every="1h")
            frozen.move_to("2026-03-02T10:00:01Z")
            assert c.tick_schedules()["fired"] == 1
        assert len(c.jobs()["jobs"]) == len(before["jobs"]) + 1

        c.remove_schedule("hourly")
        _alembic(db, "downgrade", "c0003")
        assert db.read(lambda conn: current_revisions(db, conn)) == {"c0003"}
        assert not _has(db, "schedules") and not _has(db, "schedule_fires")
    finally:
        db.close()


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
