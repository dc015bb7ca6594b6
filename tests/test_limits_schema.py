"""Core revision c0006: the limits table and jobs.needs_json. A populated c0003 database
upgrades in place (every row intact, no job declaring needs) and downgrades back, on both
databases."""

from __future__ import annotations

from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.maintenance import check
from jobcoord.migrate import current_revisions, migrate
from jobcoord.service import Coordinator
from tests.test_schema_c0002 import _alembic, _indexes, _snapshot, empty_target, populated_at
from tests.timeline import IDLE_ON_AC

__all__ = ["empty_target"]  # the fixture, imported for this module's tests


def _has_limits(db: Database) -> bool:
    return db.read(lambda conn: db.engine.dialect.has_table(conn, "limits"))


def test_c0006_upgrades_a_populated_c0003_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0006" in CORE_REVISIONS
    db = Database.open(empty_target, create=True)
    try:
        populated_at(db, "c0003")
        before = _snapshot(db)
        assert not _has_limits(db) and "ix_jobs_waiting_needs" not in _indexes(db)

        out = migrate(db)
        assert out["revisions_before"] == ["c0003"]
        assert out["revisions"] == [CORE_REVISIONS[-1]]
        assert _snapshot(db) == before
        assert "ix_jobs_waiting_needs" in _indexes(db)
        assert db.read(lambda conn: conn.exec_driver_sql(
            "SELECT COUNT(*) FROM jobs WHERE needs_json IS NOT NULL").scalar()) == 0
        assert check(db)["ok"]

        c = Coordinator(db)  # verify_schema accepts the upgraded database
        c.heartbeat("w2", readings={**IDLE_ON_AC, "memory_available_mb": 100})
        c.set_limit("k", 1)
        assert c.limits()["limits"][0]["running"] == 1  # the old running job holds it
        c.remove_limit("k")
        big = c.enqueue("k", {}, needs="ram_mb=200")["job_id"]
        got = c.claim("w2")
        assert got["job"] is not None and got["job"]["job_id"] != big

        c.cancel(big)  # a waiting job with needs, gone: the rest is as before plus one claim
        _alembic(db, "downgrade", "c0003")
        assert db.read(lambda conn: current_revisions(db, conn)) == {"c0003"}
        assert not _has_limits(db)
        assert check(db)["ok"]
        assert len(_snapshot(db)["job_events"]) > len(before["job_events"])
    finally:
        db.close()
