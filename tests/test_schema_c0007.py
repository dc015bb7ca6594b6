"""Core revision c0007: claim indexes led by the tenant, so a claim bound to a tenant seeks to
that tenant's first eligible job. A populated c0006 database upgrades in place and downgrades
back, every row intact, on both databases."""

from __future__ import annotations

from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.maintenance import check
from jobcoord.migrate import current_revisions, migrate
from jobcoord.service import Coordinator
from tests.test_schema_c0002 import _alembic, _snapshot, empty_target, populated_at
from tests.timeline import IDLE_ON_AC

__all__ = ["empty_target"]  # the fixture, imported for this module's tests

NEW_INDEXES = {"ix_jobs_claim_tenant", "ix_jobs_claim_tenant_kind"}


def _indexes(db: Database) -> set[str]:
    """The jobs table's index names, expression indexes included (SQLAlchemy's inspector
    leaves those out on SQLite)."""
    sql = ("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs'"
           if db.dialect == "sqlite" else
           "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")
    return db.read(lambda conn: set(conn.exec_driver_sql(sql).scalars()))


def test_c0007_upgrades_a_populated_c0006_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0007" in CORE_REVISIONS
    db = Database.open(empty_target, create=True)
    try:
        populated_at(db, "c0006")
        old = Coordinator(db, verify=False)
        for tenant in ("alice", "bob"):
            old.enqueue("k", {"t": tenant}, tenant=tenant)
            old.enqueue("k", {"t": tenant}, tenant=tenant, role="gpu")
        before = _snapshot(db)
        assert not NEW_INDEXES & _indexes(db)

        out = migrate(db)
        assert out["revisions_before"] == ["c0006"]
        assert out["revisions"] == [CORE_REVISIONS[-1]]
        assert _indexes(db) >= NEW_INDEXES
        assert _snapshot(db) == before
        assert check(db)["ok"]

        c = Coordinator(db)  # verify_schema accepts the upgraded database
        c.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)
        for kinds in (None, ["k"]):  # the jobs enqueued before the upgrade are in the indexes
            got = c.claim("w2", tenant="bob", kinds=kinds)["job"]
            assert got is not None and got["tenant"] == "bob"
        assert c.claim("w2", tenant="bob")["job"] is None

        after = _snapshot(db)
        _alembic(db, "downgrade", "c0006")
        assert db.read(lambda conn: current_revisions(db, conn)) == {"c0006"}
        assert not NEW_INDEXES & _indexes(db)
        assert _snapshot(db) == after
        assert check(db)["ok"]
    finally:
        db.close()
