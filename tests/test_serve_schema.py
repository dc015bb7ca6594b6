"""Core revision c0003: the tokens table. A populated c0002 database upgrades in place (every
row intact) and downgrades back, on both databases; the models agree with the history."""

from __future__ import annotations

from typing import Any

from jobcoord import tokens
from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.maintenance import check
from jobcoord.migrate import current_revisions, migrate
from jobcoord.service import Coordinator
from tests.sql import sql
from tests.test_schema_c0002 import _alembic, _snapshot, empty_target, populated_at

__all__ = ["empty_target"]  # the fixture, imported for this module's tests


def _has_tokens(db: Database) -> bool:
    return db.read(lambda conn: db.engine.dialect.has_table(conn, "tokens"))


def test_c0003_upgrades_a_populated_c0002_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0003" in CORE_REVISIONS
    db = Database.open(empty_target, create=True)
    try:
        populated_at(db, "c0002")
        before = _snapshot(db)
        assert not _has_tokens(db)

        _alembic(db, "upgrade", "c0003")
        assert db.read(lambda conn: current_revisions(db, conn)) == {"c0003"}
        assert _snapshot(db) == before
        migrate(db)  # then to the head, which verify_schema expects
        assert check(db)["ok"]
        c = Coordinator(db)  # verify_schema accepts the upgraded database
        made = tokens.create(c.db, "ci", "submitter", tenant="alice")
        who = tokens.authenticate(c.db, made["token"])
        assert who is not None and (who.role, who.tenant) == ("submitter", "alice")

        _alembic(db, "downgrade", "c0002")
        assert db.read(lambda conn: current_revisions(db, conn)) == {"c0002"}
        assert not _has_tokens(db)
        assert _snapshot(db) == before
    finally:
        db.close()


def test_tokens_schema_refuses_a_bad_role_and_a_worker_binding_on_other_roles(
        target: Target) -> None:
    import pytest

    from jobcoord.errors import JobcoordError

    with Coordinator.open(target) as c:
        for role, worker in (("admin", None), ("viewer", "w1")):
            def _insert(conn: Any, role: str = role, worker: str | None = worker) -> None:
                sql(conn, "INSERT INTO tokens (name, token_hash, role, worker_id,"
                              " created_at) VALUES ('x', :h, :role, :w, 1)",
                              {"h": "0" * 64, "role": role, "w": worker})
            with pytest.raises(JobcoordError):
                c.db.write(_insert)
