"""Migrations: a new database is created owner-only and quick-checked; the Alembic history and
the models agree; the optional artifacts tables come and go without losing a row; alembic runs
from the repository and an installed wheel migrates from any directory; a failed migrate is
rolled back whole."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.maintenance import check
from jobcoord.migrate import migrate
from jobcoord.models import Base
from jobcoord.service import Coordinator
from tests.conftest import run_cli
from tests.sample_state import populate, snapshot

REPO = Path(__file__).resolve().parent.parent


def test_migrate_creates_an_owner_only_database_and_reports_quick_check(tmp_path: Path) -> None:
    path = tmp_path / "new" / "q.db"
    path.parent.mkdir()
    r = run_cli(None, "--db", str(path), "migrate", "--json")
    assert r.code == 0, r.err
    out = r.json
    assert out["quick_check"] == ["ok"]
    assert out["journal_mode"] == "wal"
    assert out["revisions"] == [CORE_REVISIONS[-1]] and out["changed"] is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = run_cli(None, "--db", str(path), "migrate", "--json")
    assert again.code == 0 and again.json["changed"] is False


def test_models_and_migration_history_agree(target: Target) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    db = Database.open(target)

    def diff(conn: Any, skip: set[str]) -> list[Any]:
        ctx = MigrationContext.configure(conn, opts={
            "compare_type": True,
            "include_object": lambda obj, name, kind, *_: not (
                (kind == "table" and name in skip) or name == "alembic_version")})
        return compare_metadata(ctx, Base.metadata)

    assert db.read(lambda conn: diff(conn, {"artifacts"})) == []
    migrate(db, add={"artifacts"})
    assert db.read(lambda conn: diff(conn, set())) == []
    db.close()


def test_artifacts_migration_round_trip_keeps_every_row(target: Target) -> None:
    c = Coordinator.open(target)
    populate(c)
    before = snapshot(c.db)
    assert before["leases"] and before["job_events"] and before["checkpoints"]
    c.close()

    db = Database.open(target)
    up = migrate(db, add={"artifacts"})
    assert up["features"] == ["artifacts"]
    assert snapshot(db) == before
    db.write(lambda conn: conn.exec_driver_sql(
        "INSERT INTO artifacts (job_id, epoch, name, location, digest, size, media_type,"
        " created_at) VALUES (1, 1, 'out', 'objects/x', 'sha256:ab', 2, 'application/json', 1)"))
    down = migrate(db, remove={"artifacts"}, force=True)  # rows present: refused without force
    assert down["features"] == [] and down["revisions"] == [CORE_REVISIONS[-1]]
    assert snapshot(db) == before  # not one job, lease, event or checkpoint lost or changed
    assert not db.read(lambda conn: db.engine.dialect.has_table(conn, "artifacts"))
    db.close()
    assert check(Coordinator.open(target).db)["ok"]


def test_migrate_with_artifacts_from_the_cli(tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    r = run_cli(None, "--db", path, "migrate", "--with", "artifacts", "--json")
    assert r.code == 0, r.err
    assert r.json["features"] == ["artifacts"]
    assert sorted(r.json["revisions"]) == sorted(["a0002", CORE_REVISIONS[-1]])
    bad = run_cli(None, "--db", path, "migrate", "--with", "nonsense", "--json")
    assert bad.code == 2 and bad.json["error"]["code"] == "invalid_input"


def test_alembic_upgrade_head_works_from_the_repository_root(tmp_path: Path) -> None:
    path = tmp_path / "repo.db"
    env = {**os.environ, "JOBCOORD_URL": f"sqlite:///{path}"}
    alembic = str(Path(sys.executable).with_name("alembic"))
    r = subprocess.run([alembic, "upgrade", "head"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    c = Coordinator.open(str(path))  # verifies the schema revision
    assert c.features == set()
    c.close()
    r = subprocess.run([alembic, "-n", "with_artifacts", "upgrade", "heads"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    c = Coordinator.open(str(path))
    assert c.features == {"artifacts"}
    c.close()


def test_installed_wheel_migrates_from_any_directory(tmp_path: Path) -> None:
    """A non-editable install carries the migrations inside the package."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                    str(REPO)], check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # Dependencies come from this environment's site-packages (a path entry, so this
    # environment's own editable jobcoord is not visible); jobcoord itself from the wheel.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    venv_site = next((venv / "lib").glob("python*/site-packages"))
    (venv_site / "deps.pth").write_text(site + "\n")
    (wheel,) = wheels.glob("jobcoord-*.whl")
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    elsewhere = tmp_path / "elsewhere"
    newdir = tmp_path / "some" / "new" / "dir"
    elsewhere.mkdir()
    newdir.mkdir(parents=True)
    r = subprocess.run([str(venv / "bin" / "jobcoord"), "--db", str(newdir / "x.db"),
                        "migrate", "--with", "artifacts", "--json"], cwd=elsewhere,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '"quick_check": ["ok"]' in r.stdout
    located = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import jobcoord.migrate as m; print(m.script_location())"],
                             cwd=elsewhere, capture_output=True, text=True, timeout=60)
    assert str(venv) in located.stdout, located.stdout  # from the wheel, not the checkout


def test_a_first_migrate_that_fails_is_rolled_back_and_can_be_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jobcoord.migrate as m

    real = m.installed_features

    def broken(revisions: set[str]) -> set[str]:
        raise RuntimeError("a migration script failed")

    path = tmp_path / "q.db"
    monkeypatch.setattr(m, "installed_features", broken)  # fails inside the transaction
    r = run_cli(None, "--db", str(path), "migrate", "--json")
    assert (r.code, r.json["error"]["code"]) == (8, "migration_failed")
    assert run_cli(None, "--db", str(path), "status", "--json").json["error"]["code"] == (
        "not_migrated")  # nothing of the schema was left half-applied
    monkeypatch.setattr(m, "installed_features", real)
    assert run_cli(None, "--db", str(path), "migrate", "--json").code == 0


def test_a_failed_migrate_of_an_existing_database_keeps_the_file(sqlite_target: Target,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import jobcoord.migrate as m

    path = Path(sqlite_target.sqlite_path or "")
    before = path.read_bytes()
    monkeypatch.setattr(m, "installed_features", lambda revisions: 1 / 0)
    r = run_cli(sqlite_target, "migrate", "--json")
    assert r.code == 8
    assert path.read_bytes() == before


FOREIGN_FILES: dict[str, tuple[list[str], str, str]] = {
    # what another program wrote, the error, a name the message gives
    "a table": (["CREATE TABLE notes(body TEXT)", "INSERT INTO notes VALUES ('mine')"],
                "foreign_database", "notes"),
    "only a view": (["CREATE VIEW answer AS SELECT 42 AS n"], "foreign_database", "answer"),
    "only a user_version": (["PRAGMA user_version = 42"], "foreign_database", "user_version"),
    "only an application_id": (["PRAGMA application_id = 1234"], "foreign_database",
                               "application_id"),
    # Another program's Alembic history: its revision is unknown here, but the file holds
    # none of jobcoord's tables, so it is not a newer jobcoord's database.
    "another program's alembic history": (
        ["CREATE TABLE alembic_version(version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
         "INSERT INTO alembic_version VALUES ('1975f2b0c0de')",
         "CREATE TABLE users(id INTEGER PRIMARY KEY)"], "foreign_database", "users"),
    # Only another program's Alembic history, no tables yet: it was called schema_newer
    # ("upgrade jobcoord").
    "only another program's alembic_version": (
        ["CREATE TABLE alembic_version(version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
         "INSERT INTO alembic_version VALUES ('abc123')"], "foreign_database", "abc123"),
    # jobcoord's own revision over none of its tables: migrate said it was up to date
    # (exit 0, switched to WAL) and every other command failed on the missing tables.
    "jobcoord's revision without its tables": (
        ["CREATE TABLE alembic_version(version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
         f"INSERT INTO alembic_version VALUES ('{CORE_REVISIONS[-1]}')"], "schema_unknown",
        "none of its tables"),
    # A table named like one of jobcoord's, no revision: refused as before (schema_unknown),
    # and the file is no longer switched to WAL on the way to that refusal.
    "a table named like ours": (["CREATE TABLE jobs(title TEXT)"], "schema_unknown", "jobs"),
}


@pytest.mark.parametrize("case", list(FOREIGN_FILES))
def test_migrate_refuses_another_programs_sqlite_database_and_changes_nothing(
        tmp_path: Path, case: str) -> None:
    """A mistyped --db naming another program's database: migrate added jobcoord's tables
    to it and switched it to WAL, exit 0. Refused now (exit 8, naming what it holds), the
    file byte for byte as it was and nothing beside it."""
    import sqlite3

    statements, code, named = FOREIGN_FILES[case]
    path = tmp_path / "their notes #1.db"
    other = sqlite3.connect(path)
    for statement in statements:
        other.execute(statement)
    other.commit()
    other.close()
    before = path.read_bytes()
    r = run_cli(None, "--db", str(path), "migrate", "--json")
    assert r.code == 8 and r.json["error"]["code"] == code, r
    assert named in r.json["error"]["message"]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_migrate_naming_an_unknown_feature_creates_no_file(tmp_path: Path) -> None:
    """`migrate --with bogus` on a new path was refused (exit 2) after the file was made:
    an empty file stayed behind."""
    path = tmp_path / "new #1.db"
    for args in (("--with", "bogus"), ("--without", "bogus"),
                 ("--with", "artifacts", "--without", "artifacts"),
                 # --force is --without's (drop the feature's rows too): alone it was
                 # accepted and did nothing, a mistyped command passing as done.
                 ("--force",), ("--with", "artifacts", "--force")):
        r = run_cli(None, "--db", str(path), "migrate", *args, "--json")
        assert r.code == 2 and r.json["error"]["code"] == "invalid_input", r
        assert list(tmp_path.iterdir()) == []


def test_migrate_of_an_empty_file_creates_jobcoords_tables(tmp_path: Path) -> None:
    import sqlite3

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    r = run_cli(None, "--db", str(empty), "migrate", "--json")
    assert r.code == 0 and r.json["journal_mode"] == "wal", r


def test_migrate_refuses_a_database_another_program_is_creating_as_it_runs(
        tmp_path: Path) -> None:
    """Another program holds the file's write lock, creating its table, as migrate starts:
    migrate read the file before that commit (empty), then gave it jobcoord's tables beside
    the other program's, exit 0. The check now reads under the write lock: migrate waits
    for the other program's commit, then refuses, the file as that program left it."""
    import sqlite3
    import threading

    path = tmp_path / "theirs.db"
    sqlite3.connect(path).close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE notes(body TEXT)")
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(
        r=run_cli(None, "--db", str(path), "migrate", "--json")))
    t.start()
    time.sleep(1.0)
    other.execute("INSERT INTO notes VALUES ('mine')")
    other.execute("COMMIT")
    after_commit = path.read_bytes()
    t.join(60)
    other.close()
    r = out["r"]
    assert r.code == 8 and r.json["error"]["code"] == "foreign_database", r
    assert path.read_bytes() == after_commit
    names = sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()
    assert names == [("notes",)]


def test_migrate_refuses_a_foreign_file_with_its_log_beside_it_writing_nothing_itself(
        tmp_path: Path) -> None:
    """Another program's file with its -wal still beside it: refused (exit 8), its table
    and rows as that program committed them, no jobcoord table in it, and no switch of its
    journal mode; SQLite, opening it, folds the log in (as any reader would), so the
    message says jobcoord wrote nothing, not that nothing changed."""
    import shutil
    import sqlite3

    src = tmp_path / "src.db"
    other = sqlite3.connect(src)
    other.execute("PRAGMA journal_mode=wal")
    other.execute("PRAGMA wal_autocheckpoint=0")
    other.execute("CREATE TABLE notes(body TEXT)")
    other.execute("INSERT INTO notes VALUES ('mine')")
    other.commit()
    path = tmp_path / "theirs #1.db"
    shutil.copy(src, path)
    shutil.copy(str(src) + "-wal", str(path) + "-wal")
    other.close()
    r = run_cli(None, "--db", str(path), "migrate", "--json")
    assert r.code == 8 and r.json["error"]["code"] == "foreign_database", r
    assert "wrote nothing" in r.json["error"]["message"]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]
    assert conn.execute("SELECT body FROM notes").fetchall() == [("mine",)]
    conn.close()


def test_another_programs_alembic_history_is_a_foreign_database_for_every_command(
        target: Target) -> None:
    """A database holding only another program's Alembic history (an unknown revision,
    none of jobcoord's tables): on PostgreSQL every command and `migrate` said it was
    migrated by a newer jobcoord ("upgrade jobcoord"). It is another program's database
    (exit 8 `foreign_database`) on both, and nothing is written to it."""
    import sqlalchemy as sa

    engine = sa.create_engine(target.url)
    with engine.begin() as conn:
        if target.sqlite_path is not None:
            for (name,) in conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%'").all():
                conn.exec_driver_sql(f'DROP TABLE "{name}"')
        else:
            conn.exec_driver_sql("DROP SCHEMA public CASCADE")
            conn.exec_driver_sql("CREATE SCHEMA public")
        conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) "
                             "PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('deadbeef1234')")
    engine.dispose()
    for args in (("status",), ("migrate",)):
        r = run_cli(target, *args, "--json")
        assert r.code == 8, (args, r.out)
        assert '"foreign_database"' in r.out, (args, r.out)
    engine = sa.create_engine(target.url)
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == ["alembic_version"]
    engine.dispose()
