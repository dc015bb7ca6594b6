"""Artifacts revision a0002: a populated a0001 database is upgraded in place and back.

The database is built the way users have it: core at its head with jobs in every status, the
artifacts branch at a0001 with rows in each of its validation states. a0002 must keep every
row (core tables untouched, artifact rows mapped to the new columns), and the downgrade must
give the a0001 rows back exactly. Both databases."""

from __future__ import annotations

from typing import Any

import pytest

from jobcoord.db import CORE_REVISIONS, OPTIONAL_REVISIONS, Database, Target
from jobcoord.migrate import migrate
from jobcoord.service import Coordinator
from tests.sql import sql
from tests.test_schema_c0002 import (
    Snapshot,
    _alembic,
    _every_status,
    _snapshot,
    empty_target,
    upgrade_in_place_and_back,
)

__all__ = ["empty_target"]  # the fixture, imported for this module's tests

HEX = ["a" * 64, "b" * 64, "c" * 64]

#: The optional branch these tests upgrade and downgrade.
ARTIFACTS = frozenset({"artifacts"})


def _artifact_rows(db: Database, columns: str) -> list[tuple[Any, ...]]:
    return db.read(lambda conn: [tuple(r) for r in conn.exec_driver_sql(
        f"SELECT {columns} FROM artifacts ORDER BY artifact_id").all()])


#: The core branch's head: the artifacts branch upgrades beside whatever it is.
CORE = CORE_REVISIONS[-1]

A0001 = ("artifact_id, job_id, name, location, sha256, size_bytes, media_type,"
         " validation_state, created_at")


def test_a0002_upgrades_a_populated_a0001_database_in_place_and_back(
        empty_target: Target) -> None:
    assert OPTIONAL_REVISIONS["artifacts"][-1] == "a0002"
    jobs: dict[int, int] = {}
    old_rows: list[tuple[Any, ...]] = []

    def populate(db: Database, revision: str) -> None:
        migrate(db)  # core at its head
        _alembic(db, "upgrade", revision, ARTIFACTS)
        _every_status(Coordinator(db, verify=False))
        jobs.update(db.read(lambda conn: dict(conn.exec_driver_sql(
            "SELECT job_id, epoch FROM jobs").all())))
        first, second = sorted(jobs)[:2]
        for i, (job, name, state) in enumerate([(first, "report.pdf", "valid"),
                                                (first, "raw.bin", "pending"),
                                                (second, "bad.png", "invalid")]):
            db.write(lambda conn, i=i, job=job, name=name, state=state: sql(
                conn, "INSERT INTO artifacts (job_id, name, location, sha256, size_bytes,"
                " media_type, validation_state, created_at) VALUES (:j, :n, 'objects/x', :h,"
                " :s, 'application/pdf', :st, :t)",
                {"j": job, "n": name, "h": HEX[i], "s": 10 + i, "st": state, "t": 1000 + i}))
        old_rows.extend(_artifact_rows(db, A0001))
        assert len(old_rows) == 3

    def upgraded(c: Coordinator, before: Snapshot) -> None:
        db = c.db
        first, second = sorted(jobs)[:2]
        new = _artifact_rows(db, "artifact_id, job_id, epoch, name, digest, size, state,"
                             " reason, location, created_at, verified_at")
        assert new == [
            (old_rows[0][0], first, jobs[first], "report.pdf", f"sha256:{HEX[0]}", 10,
             "accepted", None, "objects/x", 1000, 1000),
            (old_rows[1][0], first, jobs[first], "raw.bin", f"sha256:{HEX[1]}", 11,
             "staged", None, "objects/x", 1001, None),
            (old_rows[2][0], second, jobs[second], "bad.png", f"sha256:{HEX[2]}", 12,
             "rejected", "invalid_before_a0002", "objects/x", 1002, None),
        ]
        assert c.features == {"artifacts"}
        listed = c.artifacts(first)["artifacts"]
        assert [a["name"] for a in listed] == ["report.pdf"]
        # New rows get ids past the copied ones (the PostgreSQL sequence was moved on).
        db.write(lambda conn: sql(
            conn, "INSERT INTO artifacts (job_id, epoch, name, digest, size, media_type,"
            " location, created_at) VALUES (:j, 9, 'n', :d, 1, 'a/b', 'l', 1)",
            {"j": second, "d": "sha256:" + "d" * 64}))
        assert _artifact_rows(db, "artifact_id")[-1][0] > old_rows[-1][0]
        db.write(lambda conn: conn.exec_driver_sql(
            "DELETE FROM artifacts WHERE name = 'n'"))
        assert _snapshot(db) == before  # the core tables untouched

    def downgraded(db: Database) -> None:
        assert _artifact_rows(db, A0001) == old_rows

    upgrade_in_place_and_back(empty_target, "a0001", populate=populate, features=ARTIFACTS,
                              upgraded=upgraded, downgraded=downgraded)


def test_a0002_downgrade_keeps_the_accepted_row_of_a_name_staged_by_several_attempts(
        empty_target: Target) -> None:
    db = Database.open(empty_target, create=True)
    try:
        migrate(db, add={"artifacts"})
        c = Coordinator(db)
        job = c.enqueue("k", {})["job_id"]
        rows = [(1, "rejected"), (2, "accepted"), (3, "staged")]
        for epoch, state in rows:
            db.write(lambda conn, epoch=epoch, state=state: sql(
                conn, "INSERT INTO artifacts (job_id, epoch, name, digest, size, media_type,"
                " state, location, created_at) VALUES (:j, :e, 'out', :d, :e, 'a/b', :st,"
                " 'l', 1)", {"j": job, "e": epoch, "d": "sha256:" + HEX[epoch - 1],
                            "st": state}))
        _alembic(db, "downgrade", "a0001", ARTIFACTS)
        assert _artifact_rows(db, "sha256, validation_state") == [(HEX[1], "valid")]
    finally:
        db.close()


def test_migrate_without_artifacts_refuses_while_rows_exist_unless_forced(
        target: Target, tmp_path: Any) -> None:
    from jobcoord.errors import Refused
    from tests.conftest import run_cli
    from tests.test_artifacts_rules import start

    store = str(tmp_path / "store")
    db = Database.open(target)
    migrate(db, add={"artifacts"})
    db.close()
    with Coordinator.open(target) as c:
        c.artifacts_dir = store
        job, epoch = start(c)
        c.put_artifact(job, "w1", epoch, "a.bin", b"x" * 1000)
        c.put_artifact(job, "w1", epoch, "b.bin", b"y" * 24)
        c.complete(job, "w1", epoch, {})
    r = run_cli(target, "--artifacts", store, "migrate", "--without", "artifacts", "--json")
    assert r.code == 4, r.out
    err = r.json["error"]
    assert err["code"] == "artifacts_present"
    assert "2 artifact rows" in err["message"] and "1024 bytes" in err["message"]
    assert err["details"]["objects"] == 2
    db = Database.open(target)
    try:
        with pytest.raises(Refused):
            migrate(db, remove={"artifacts"}, artifacts_dir=store)
        assert len(_artifact_rows(db, "artifact_id")) == 2  # nothing changed
    finally:
        db.close()
    r = run_cli(target, "--artifacts", store, "migrate", "--without", "artifacts", "--force",
                "--json")
    assert r.code == 0, r.err
    assert r.json["removed"] == {"artifact_rows_dropped": 2, "artifact_bytes_unreferenced": 1024,
                                 "objects_left": 2, "object_bytes_left": 1024}
    assert r.json["features"] == []
    # A schema downgrade never deletes objects: gc owns them.
    from jobcoord.artifacts import ObjectStore

    assert len(list(ObjectStore(store).iter_objects())) == 2
    # Objects without any row still count; with neither there is nothing to refuse.
    assert run_cli(target, "migrate", "--with", "artifacts").code == 0
    r = run_cli(target, "--artifacts", store, "migrate", "--without", "artifacts", "--json")
    assert r.code == 4 and r.json["error"]["details"]["rows"] == 0
    assert run_cli(target, "--artifacts", str(tmp_path / "empty"), "migrate", "--without",
                   "artifacts").code == 0


def test_migrate_without_artifacts_over_a_store_that_is_a_file_is_store_unavailable(
        target: Target, tmp_path: Any) -> None:
    """A regular file where the store's root is: `migrate --without artifacts` said
    `migration_failed` (exit 8, "Not a directory") while every other store call says
    `artifact_store_unavailable` (exit 6). Exit 6 now, alike, nothing changed."""
    from tests.conftest import run_cli

    db = Database.open(target)
    migrate(db, add={"artifacts"})
    db.close()
    afile = tmp_path / "afile"
    afile.write_bytes(b"not a store")
    for force in ([], ["--force"]):
        r = run_cli(target, "--artifacts", str(afile), "migrate", "--without", "artifacts",
                    *force, "--json")
        assert r.code == 6, r.out
        assert r.json["error"]["code"] == "artifact_store_unavailable"
    assert afile.read_bytes() == b"not a store"
    with Coordinator.open(target) as c:
        assert c.has_feature("artifacts")


@pytest.mark.parametrize("linked", ["objects", "objects/sha256", "objects/sha256 gone",
                                    "the store"])
def test_migrate_without_artifacts_over_a_store_it_cannot_list_is_store_unavailable(
        target: Target, tmp_path: Any, linked: str) -> None:
    """`objects/` (or `objects/sha256`) a link to nothing (a volume not mounted): `migrate
    --without artifacts` counted the store's objects as none and, with `--force`, dropped
    the rows saying no object was left. The store cannot be listed: exit 6, nothing
    changed, as for gc, verify, get and backup."""
    import os

    from tests.conftest import run_cli

    db = Database.open(target)
    migrate(db, add={"artifacts"})
    db.close()
    store = tmp_path / "store # ?%"
    with Coordinator.open(target) as c:
        c.artifacts_dir = str(store)
        job = c.enqueue("k", {})["job_id"]
        c.heartbeat("w1")
        epoch = c.claim("w1")["lease"]["epoch"]
        c.put_artifact(job, "w1", epoch, "kept.bin", b"accepted bytes")
        c.complete(job, "w1", epoch, {})
    # Also `objects/` left without its `sha256/` (the empty mount point of a volume not
    # mounted), and the store's own path a link to nothing, while rows name objects.
    place = {"objects/sha256 gone": store / "objects" / "sha256", "the store": store}.get(
        linked, store / linked)
    place.rename(tmp_path / "volume")
    if linked != "objects/sha256 gone":
        os.symlink(tmp_path / "unmounted", place)
    for force in ([], ["--force"]):
        r = run_cli(target, "--artifacts", str(store), "migrate", "--without", "artifacts",
                    *force, "--json")
        assert r.code == 6, (force, r.out)
        assert r.json["error"]["code"] == "artifact_store_unavailable", r.json
    with Coordinator.open(target) as c:
        assert c.has_feature("artifacts") and c.artifacts(job)["artifacts"]
