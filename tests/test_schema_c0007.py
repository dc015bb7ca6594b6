"""Core revision c0007: claim indexes led by the tenant, so a claim bound to a tenant seeks to
that tenant's first eligible job. A populated c0006 database upgrades in place and downgrades
back, every row intact, on both databases."""

from __future__ import annotations

from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.service import Coordinator
from tests.test_schema_c0002 import (
    Snapshot,
    _indexes,
    empty_target,
    populated_at,
    upgrade_in_place_and_back,
)
from tests.timeline import IDLE_ON_AC

__all__ = ["empty_target"]  # the fixture, imported for this module's tests

NEW_INDEXES = {"ix_jobs_claim_tenant", "ix_jobs_claim_tenant_kind"}


def _populate(db: Database, revision: str) -> None:
    """Every status, and waiting jobs of two tenants with and without a role."""
    populated_at(db, revision)
    old = Coordinator(db, verify=False)
    for tenant in ("alice", "bob"):
        old.enqueue("k", {"t": tenant}, tenant=tenant)
        old.enqueue("k", {"t": tenant}, tenant=tenant, role="gpu")


def test_c0007_upgrades_a_populated_c0006_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0007" in CORE_REVISIONS

    def upgraded(c: Coordinator, before: Snapshot) -> None:
        assert _indexes(c.db) >= NEW_INDEXES
        c.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)
        for kinds in (None, ["k"]):  # the jobs enqueued before the upgrade are in the indexes
            got = c.claim("w2", tenant="bob", kinds=kinds)["job"]
            assert got is not None and got["tenant"] == "bob"
        assert c.claim("w2", tenant="bob")["job"] is None

    upgrade_in_place_and_back(empty_target, "c0006", populate=_populate,
                              new_indexes=NEW_INDEXES, upgraded=upgraded)
