"""Core revision c0002: partial indexes for role-less waiting jobs.

PostgreSQL does not treat `required_role IS NULL` on the leading column of the claim index as
an equality that keeps the rest of the index in order, so the role-less claim probe (the
default path) read every waiting job and sorted them. c0002 adds indexes over role-less
waiting jobs alone, in claim order. The revision upgrades a populated c0001 database in place
and downgrades back, every row intact, on both databases."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from jobcoord.db import CORE_REVISIONS, OPTIONAL_REVISIONS, SQL, Database, Target, resolve_target
from jobcoord.maintenance import check
from jobcoord.migrate import _config, current_revisions, migrate
from jobcoord.service import Coordinator
from tests.conftest import fresh_pg
from tests.timeline import IDLE_ON_AC

NEW_INDEXES = {"ix_jobs_claim_roleless", "ix_jobs_claim_roleless_kind"}


@pytest.fixture
def empty_target(backend: str, request: pytest.FixtureRequest, tmp_path: Any
                 ) -> Iterator[Target]:
    """A database with no schema at all."""
    if backend == "sqlite":
        yield resolve_target(db=str(tmp_path / "old.db"))
    else:
        request.getfixturevalue("pg_template")  # skips without PostgreSQL
        with fresh_pg(None) as t:
            yield t


def _alembic(db: Database, action: str, revision: str,
             features: frozenset[str] = frozenset()) -> None:
    """Alembic's upgrade or downgrade to `revision`, with the optional branches `features`."""
    from alembic import command

    with db.write_engine.connect() as conn, conn.begin():
        getattr(command, action)(_config(db, conn, set(features)), revision)


def _indexes(db: Database) -> set[str]:
    """The jobs table's index names, expression indexes included (SQLAlchemy's inspector
    leaves those out on SQLite, such as c0007's)."""
    sql = ("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs'"
           if db.dialect == "sqlite" else
           "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")
    return db.read(lambda conn: set(conn.exec_driver_sql(sql).scalars()))


def tables(db: Database) -> set[str]:
    from sqlalchemy import inspect

    return db.read(lambda conn: set(inspect(conn).get_table_names()))


#: Columns later revisions add to these tables (c0006: jobs.needs_json): left out of a
#: snapshot, so one taken before an upgrade compares with one taken after.
LATER_COLUMNS = {"needs_json"}


def _snapshot(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("workers", "jobs", "leases", "job_events", "checkpoints")

    def _rows(conn: Any, table: str) -> list[tuple[Any, ...]]:
        result = conn.exec_driver_sql(f"SELECT * FROM {table}")
        keep = [i for i, name in enumerate(result.keys()) if name not in LATER_COLUMNS]
        return sorted(tuple(r[i] for i in keep) for r in result.all())

    return db.read(lambda conn: {t: _rows(conn, t) for t in tables})


def populated_at(db: Database, revision: str) -> None:
    """A database at `revision` holding a job in every status: filled by this code at the
    head (its statements name every column the head has), then downgraded, every row kept."""
    _alembic(db, "upgrade", CORE_REVISIONS[-1])
    _every_status(Coordinator(db, verify=False))
    _alembic(db, "downgrade", revision)
    assert db.read(lambda conn: current_revisions(db, conn)) == {revision}


def _every_status(c: Coordinator) -> None:
    c.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
    ids = [c.enqueue("k", {"i": i}, role="gpu" if i % 2 else None, key=f"k{i}",
                     max_attempts=1)["job_id"] for i in range(8)]
    done = c.claim("w1")
    c.complete(done["job"]["job_id"], "w1", 1, {"ok": True})                      # succeeded
    dead = c.claim("w1")
    c.fail(dead["job"]["job_id"], "w1", 1, "boom", permanent=True)               # dead
    unknown = c.claim("w1")
    c.mark_effect(unknown["job"]["job_id"], "w1", 1)
    c.fail(unknown["job"]["job_id"], "w1", 1, "reset")                           # unknown
    running = c.claim("w1")
    c.checkpoint(running["job"]["job_id"], "w1", 1, "step", {"n": 1})            # running
    c.cancel(ids[-1])                                                            # cancelled
    statuses = {j["status"] for j in c.jobs()["jobs"]}
    assert statuses == {"waiting", "running", "succeeded", "dead", "cancelled", "unknown"}


Snapshot = dict[str, list[tuple[Any, ...]]]


def _nothing(*_: Any) -> None:
    pass


def upgrade_in_place_and_back(
        target: Target, old: str, *, populate: Callable[[Database, str], None] = populated_at,
        features: frozenset[str] = frozenset(), first: str | None = None,
        new_tables: Iterable[str] = (), new_indexes: Iterable[str] = (),
        upgraded: Callable[[Coordinator, Snapshot], None] = _nothing,
        downgraded: Callable[[Database], None] = _nothing) -> None:
    """The frame of every schema-upgrade test, on an empty database `target`.

    `populate` fills it at revision `old` (of the optional branches `features`, core at its
    head, if any). The upgrade (to `first` alone, when given, then by `migrate` to the heads)
    keeps every core row, adds `new_tables` (any table) and `new_indexes` (on jobs), and
    leaves a database that `check` passes and verify_schema accepts: `upgraded` then uses it
    (given the snapshot from before). The downgrade back to `old` takes the tables and
    indexes away again, keeps every core row as `upgraded` left it and passes `check`;
    `downgraded` checks the rest."""
    new_tables, new_indexes = set(new_tables), set(new_indexes)
    core = CORE_REVISIONS[-1]
    at_old = {core, old} if features else {old}
    db = Database.open(target, create=True)
    try:
        populate(db, old)
        assert db.read(lambda conn: current_revisions(db, conn)) == at_old
        before = _snapshot(db)
        assert not new_tables & tables(db) and not new_indexes & _indexes(db)

        if first is not None:
            _alembic(db, "upgrade", first, features)
            assert db.read(lambda conn: current_revisions(db, conn)) == {first}
            assert _snapshot(db) == before
        out = migrate(db)  # the installed branches go to their heads
        assert sorted(out["revisions_before"]) == sorted(
            {first} if first is not None else at_old)
        assert sorted(out["revisions"]) == sorted(
            [core, *(OPTIONAL_REVISIONS[f][-1] for f in features)])
        assert tables(db) >= new_tables and _indexes(db) >= new_indexes
        assert _snapshot(db) == before
        assert check(db)["ok"]
        upgraded(Coordinator(db), before)  # verify_schema accepts the upgraded database

        after = _snapshot(db)
        _alembic(db, "downgrade", old, features)
        assert db.read(lambda conn: current_revisions(db, conn)) == at_old
        assert not new_tables & tables(db) and not new_indexes & _indexes(db)
        assert _snapshot(db) == after
        assert check(db)["ok"]
        downgraded(db)
    finally:
        db.close()


def test_c0002_upgrades_a_populated_c0001_database_in_place_and_back(
        empty_target: Target) -> None:
    assert "c0002" in CORE_REVISIONS

    def upgraded(c: Coordinator, before: Snapshot) -> None:
        c.heartbeat("w2", readings=IDLE_ON_AC)
        assert c.claim("w2")["job"] is not None  # a role-less waiting job, through c0002

    upgrade_in_place_and_back(empty_target, "c0001", new_indexes=NEW_INDEXES,
                              upgraded=upgraded)


def _plans(node: dict[str, Any], cte: str | None = None) -> Iterator[tuple[str | None, Any]]:
    """Every plan node with the name of the CTE it belongs to."""
    if node.get("Parent Relationship") == "InitPlan" and node.get("Subplan Name", "").startswith(
            "CTE "):
        cte = node["Subplan Name"][4:]
    yield cte, node
    for child in node.get("Plans", []):
        yield from _plans(child, cte)


@pytest.mark.parametrize("kinds", [None, ["k1", "k2"]])
def test_the_roleless_claim_probe_reads_an_index_in_order_without_sorting(
        request: pytest.FixtureRequest, kinds: list[str] | None) -> None:
    request.getfixturevalue("pg_template")
    import json

    with fresh_pg(request.getfixturevalue("pg_template")) as target, \
            Coordinator.open(target) as c:
        c.enqueue_many([{"kind": f"k{i % 3}", "role": "gpu" if i % 5 == 0 else None,
                         "priority": i % 4} for i in range(3000)])
        c.db.write(lambda conn: conn.exec_driver_sql("ANALYZE jobs"))
        text, params = c._claim_folded_sql(["gpu"], kinds)
        params.update(now=2**60, maxp=3, f=False, worker="w", expires=2**60 + 1,
                      expires_json='"x"', heads=4)

        def explain(conn: Any) -> Any:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            with contextlib.suppress(Exception):
                conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
            return conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + SQL(text).postgresql,
                                        params).scalar()

        raw = c.db.read(explain)
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
        probe = [n for cte, n in _plans(plan) if cte == "c0_0"]
        assert probe, json.dumps(plan)[:2000]
        types = [n["Node Type"] for n in probe]
        assert "Sort" not in types and "Incremental Sort" not in types, types
        scans = [n.get("Index Name") for n in probe if "Index" in n["Node Type"]]
        want = "ix_jobs_claim_roleless" if kinds is None else "ix_jobs_claim_roleless_kind"
        assert scans == [want], (types, scans)
