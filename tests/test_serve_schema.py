"""Core revision c0003: the tokens table. A populated c0002 database upgrades in place (every
row intact) and downgrades back, on both databases; the models agree with the history."""

from __future__ import annotations

from typing import Any

from jobcoord import tokens
from jobcoord.db import CORE_REVISIONS, Target
from jobcoord.service import Coordinator
from tests.sql import sql
from tests.test_schema_c0002 import Snapshot, _snapshot, empty_target, upgrade_in_place_and_back

__all__ = ["empty_target"]  # the fixture, imported for this module's tests


def test_c0003_upgrades_a_populated_c0002_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0003" in CORE_REVISIONS

    def upgraded(c: Coordinator, before: Snapshot) -> None:
        made = tokens.create(c.db, "ci", "submitter", tenant="alice")
        who = tokens.authenticate(c.db, made["token"])
        assert who is not None and (who.role, who.tenant) == ("submitter", "alice")
        assert _snapshot(c.db) == before

    upgrade_in_place_and_back(empty_target, "c0002", first="c0003", new_tables={"tokens"},
                              upgraded=upgraded)


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


def test_a_token_role_is_judged_by_its_characters_and_a_secret_no_token_has_is_none(
        target: Target) -> None:
    """A role given as a str subclass equal to "viewer" while it reads "admin" passed the
    check (the table's own check then refused it: exit 7); a secret with a lone surrogate
    raised UnicodeEncodeError out of `authenticate` (unknown: None)."""
    import pytest

    from jobcoord.errors import InvalidInput
    from tests.conftest import dump

    class Lying(str):
        def __eq__(self, other: object) -> bool:
            return str.__eq__("viewer", other)

        __hash__ = str.__hash__

    with Coordinator.open(target) as c:
        before = dump(c)
        with pytest.raises(InvalidInput):
            tokens.create(c.db, "ci", Lying("admin"))
        assert dump(c) == before
        for secret in ("jct_\ud800", "jct_é" * 3, "\x00"):
            assert tokens.authenticate(c.db, secret) is None
