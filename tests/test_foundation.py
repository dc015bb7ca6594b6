"""The foundation: migrations, the SQLite engine's transaction discipline, status, check and
backup. Each test states the property it proves."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from jobcoord.db import Database, Target, resolve_target
from jobcoord.maintenance import check
from jobcoord.migrate import migrate
from jobcoord.models import Base
from jobcoord.service import Coordinator

from .conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
STATUSES = ("waiting", "running", "succeeded", "dead", "cancelled", "unknown")


def _populate(c: Coordinator) -> None:
    """Jobs in several states, with leases, events and checkpoints."""
    c.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 10, "user_idle_s": 9999,
                                               "on_battery": False})
    for i in range(6):
        c.enqueue("summarize", {"i": i}, priority=i % 4, role="gpu", key=f"k{i}")
    first = c.claim("w1")["job"]
    c.complete(first["job_id"], "w1", 1, {"ok": True})
    second = c.claim("w1")["job"]
    c.checkpoint(second["job_id"], "w1", 1, "remote", {"remote_id": "R-17"})
    c.fail(second["job_id"], "w1", 1, "boom")
    third = c.claim("w1")["job"]  # stays running, holding a lease
    assert third is not None


def _snapshot(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("workers", "jobs", "leases", "job_events", "checkpoints")
    return db.read(lambda conn: {
        t: sorted(tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {t}").all())
        for t in tables})


# --- migrate ----------------------------------------------------------------------------------


def test_migrate_creates_an_owner_only_database_and_reports_quick_check(tmp_path: Path) -> None:
    path = tmp_path / "new" / "q.db"
    path.parent.mkdir()
    r = run_cli(None, "--db", str(path), "migrate", "--json")
    assert r.code == 0, r.err
    out = r.json
    assert out["quick_check"] == ["ok"]
    assert out["journal_mode"] == "wal"
    assert out["revisions"] == ["c0003"] and out["changed"] is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = run_cli(None, "--db", str(path), "migrate", "--json")
    assert again.code == 0 and again.json["changed"] is False


def test_status_of_a_new_database_counts_nothing(target: Target) -> None:
    out = run_cli(target, "status", "--json").json
    assert out["workers"] == 0 and out["active_leases"] == 0
    assert out["jobs"] == dict.fromkeys(STATUSES, 0)
    assert out["revisions"] == ["c0003"]
    if target.sqlite_path:
        assert out["journal_mode"] == "wal"
        assert out["file_size_bytes"] > 0
        assert out["synchronous"] == "full"
        old_sqlite = sqlite3.sqlite_version_info < (3, 51, 3)
        assert ("WAL-reset" in " ".join(out.get("warnings", []))) == old_sqlite


def test_every_command_prints_exactly_one_json_object(target: Target) -> None:
    for args in (["status"], ["check"], ["jobs"], ["workers"], ["reap"]):
        r = run_cli(target, *args, "--json")
        assert r.code == 0, (args, r.err)
        assert isinstance(r.json, dict)
        assert r.out.count("\n") == 1


# --- the engine: BEGIN IMMEDIATE, pragmas ------------------------------------------------------


def _trace(db: Database) -> list[str]:
    statements: list[str] = []

    @event.listens_for(db.engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _rec: Any) -> None:
        dbapi_conn.set_trace_callback(statements.append)

    db.engine.dispose()  # new connections get the trace callback
    return statements


def test_write_transactions_reach_sqlite_as_begin_immediate(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    statements = _trace(c.db)
    c.enqueue("summarize", {"doc": 1})
    begins = [s for s in statements if s.upper().startswith("BEGIN")]
    assert begins == ["BEGIN IMMEDIATE"]
    assert any(s.startswith("INSERT INTO jobs") for s in statements)
    assert statements[-1] == "COMMIT"
    statements.clear()
    c.jobs()
    assert [s for s in statements if s.upper().startswith("BEGIN")] == ["BEGIN"]
    c.close()


def test_an_open_write_transaction_keeps_other_writers_out(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    path = sqlite_target.sqlite_path
    assert path
    with c.db.write_engine.begin() as conn:
        conn.exec_driver_sql("SELECT 1")  # the transaction (and its write lock) is open
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError) as e:
            other.execute("BEGIN IMMEDIATE")
        assert e.value.sqlite_errorname == "SQLITE_BUSY"
        # WAL: readers are never blocked by the writer.
        assert other.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)
        other.close()
    c.close()


def test_read_work_does_not_take_the_write_lock(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    path = sqlite_target.sqlite_path
    assert path
    with c.db.engine.begin() as conn:
        conn.exec_driver_sql("SELECT COUNT(*) FROM jobs").all()
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # succeeds: the reader holds no write lock
        other.execute("ROLLBACK")
        other.close()
    c.close()


def test_the_driver_never_opens_transactions_on_its_own(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    with c.db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        assert raw.isolation_level is None
        if sys.version_info >= (3, 12):
            assert raw.autocommit == sqlite3.LEGACY_TRANSACTION_CONTROL
        raw.execute("SELECT 1")
        assert not raw.in_transaction
    c.close()


@pytest.mark.parametrize(("level", "expected"), [("full", 2), ("normal", 1)])
def test_every_connection_gets_the_pragmas(sqlite_target: Target, level: str,
                                           expected: int) -> None:
    db = Database.open(sqlite_target, synchronous=level, busy_timeout=7.5)
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == expected
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7500
    db.close()


def test_the_claim_reads_the_claim_index_instead_of_scanning(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    for kinds in (None, ["summarize", "embed"]):
        text, params = c._candidate_sql(["gpu", "cpu"], kinds, due_only=True)
        params.update(now=0, maxp=3)
        plan = c.db.read(lambda conn, text=text, params=params: [
            r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + text, params).all()])
        searches = [p for p in plan if "jobs" in p and ("SEARCH" in p or "SCAN" in p)]
        assert searches, plan
        assert all("USING INDEX ix_jobs_claim_" in p for p in searches), plan
        assert not any(p.startswith("SCAN jobs") for p in plan), plan
    c.close()


# --- the schema enforces what it can ----------------------------------------------------------


def test_the_schema_refuses_what_the_rules_forbid(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    c.heartbeat("w1", readings={"user_idle_s": 9999})
    job = c.enqueue("k", {}, key="same")["job_id"]
    c.claim("w1")
    raw = sqlite3.connect(sqlite_target.sqlite_path or "", isolation_level=None)
    raw.execute("PRAGMA foreign_keys=ON")
    bad = [
        "UPDATE jobs SET priority = 4",
        "UPDATE jobs SET priority = 'high'",
        "UPDATE jobs SET status = 'bogus'",
        f"INSERT INTO leases VALUES ({job}, 'w2', 2, 1, 2)",  # a second lease for one job
        "INSERT INTO leases VALUES (999, 'w2', 1, 1, 2)",  # a lease for no job
        "INSERT INTO jobs (tenant, kind, priority, payload_json, status, created_at, updated_at,"
        " run_after, idempotency_key) VALUES ('default', 'k', 1, '{}', 'waiting', 1, 1, 1,"
        " 'same')",
    ]
    for sql in bad:
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute(sql)
    raw.close()
    assert check(c.db)["ok"]
    c.close()


# --- migrations: history and models agree; optional artifacts; alembic from the repo -----------


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
    _populate(c)
    before = _snapshot(c.db)
    assert before["leases"] and before["job_events"] and before["checkpoints"]
    c.close()

    db = Database.open(target)
    up = migrate(db, add={"artifacts"})
    assert up["features"] == ["artifacts"]
    assert _snapshot(db) == before
    db.write(lambda conn: conn.exec_driver_sql(
        "INSERT INTO artifacts (job_id, name, location, sha256, size_bytes, media_type,"
        " created_at) VALUES (1, 'out', 'file:out.json', 'ab', 2, 'application/json', 1)"))
    down = migrate(db, remove={"artifacts"})
    assert down["features"] == [] and down["revisions"] == ["c0003"]
    assert _snapshot(db) == before  # not one job, lease, event or checkpoint lost or changed
    assert not db.read(lambda conn: db.engine.dialect.has_table(conn, "artifacts"))
    db.close()
    assert check(Coordinator.open(target).db)["ok"]


def test_migrate_with_artifacts_from_the_cli(tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    r = run_cli(None, "--db", path, "migrate", "--with", "artifacts", "--json")
    assert r.code == 0, r.err
    assert r.json["features"] == ["artifacts"]
    assert sorted(r.json["revisions"]) == ["a0001", "c0003"]
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


# --- errors leave the filesystem as it was ----------------------------------------------------


def _fs(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mode, p.read_bytes()) for p in sorted(directory.iterdir())
            if p.is_file()}


@pytest.mark.parametrize("command", [["status"], ["jobs"], ["enqueue", "k"], ["check"]])
def test_a_missing_database_is_not_created(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "missing.db"
    r = run_cli(None, "--db", str(path), *command, "--json")
    assert r.code == 8 and r.json["error"]["code"] == "not_migrated"
    assert "jobcoord migrate" in r.json["error"]["message"]
    assert list(tmp_path.iterdir()) == []
    assert "Traceback" not in r.err


def _error_case(tmp_path: Path, name: str, sqlite_template: str) -> tuple[Path, str, int]:
    db = tmp_path / "q.db"
    if name == "empty_file":
        db.write_bytes(b"")
        return db, "not_migrated", 8
    if name == "plain_sqlite":
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE other (x)")
        conn.commit()
        conn.close()
        return db, "not_migrated", 8
    if name == "text_file":
        db.write_text('{"this": "is json, not a database"}' * 100)
        return db, "database_corrupt", 7
    if name in ("newer", "older"):
        db.write_bytes(Path(sqlite_template).read_bytes())
        if name == "newer":
            conn = sqlite3.connect(db)
            conn.execute("UPDATE alembic_version SET version_num = 'c9999'")
            conn.commit()
            conn.close()
            return db, "schema_newer", 8
        return db, "schema_outdated", 8
    if name == "damaged_pages":
        db.write_bytes(Path(sqlite_template).read_bytes())
        data = bytearray(db.read_bytes())
        for page in range(1, len(data) // 4096):
            data[page * 4096:page * 4096 + 100] = os.urandom(100)
        db.write_bytes(bytes(data))
        return db, "database_corrupt", 7
    raise AssertionError(name)


@pytest.mark.parametrize("case", ["empty_file", "plain_sqlite", "text_file", "newer", "older",
                                  "damaged_pages"])
def test_unusable_databases_are_refused_with_their_code_and_left_unchanged(
        tmp_path: Path, sqlite_template: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, code, exit_code = _error_case(tmp_path, case, sqlite_template)
    if case == "older":  # this code expects a revision the database has not reached yet
        import jobcoord.migrate as m

        monkeypatch.setattr(m, "CORE_REVISIONS", ("c0001", "c0002", "c0003", "c0004"))
    before = _fs(tmp_path)
    for command in (["status"], ["enqueue", "k"], ["claim", "w1"]):
        r = run_cli(None, "--db", str(db), *command, "--json")
        assert (r.code, r.json["error"]["code"]) == (exit_code, code), (command, r.out, r.err)
        assert "Traceback" not in r.err
    assert _fs(tmp_path) == before


def test_a_missing_directory_or_a_directory_path_is_unavailable(tmp_path: Path) -> None:
    for path, command in ((tmp_path / "no" / "such" / "q.db", "migrate"),
                          (tmp_path / "no" / "such" / "q.db", "status"),
                          (tmp_path, "migrate"), (tmp_path, "status")):
        r = run_cli(None, "--db", str(path), command, "--json")
        assert r.code == 6, (path, r.out)
        assert r.json["error"]["code"] == "database_unavailable"
    assert list(tmp_path.iterdir()) == []


def test_migrate_into_a_read_only_directory_is_refused_as_an_unprivileged_user(
        tmp_path: Path) -> None:
    """Root ignores permissions, so the check runs as `nobody`."""
    python = "/usr/bin/python3"
    if not os.path.exists(python) or subprocess.run(["which", "setpriv"],
                                                    capture_output=True).returncode:
        pytest.skip("needs setpriv and a system python3 readable by nobody")
    import tempfile

    # Every parent must be traversable by nobody (pytest's own temp root is not).
    base = Path(tempfile.mkdtemp(prefix="jobcoord-ro-"))
    os.chmod(base, 0o755)
    directory = base / "ro"
    directory.mkdir()
    os.chmod(directory, 0o755)  # owned by root: nobody may not create files here
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {"PYTHONPATH": f"{REPO}:{site}", "PATH": "/usr/bin:/bin"}
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            python, "-c", "import jobcoord.cli, sqlalchemy"],
                           env=env, capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"nobody cannot import jobcoord here: {probe.stderr.strip()[-200:]}")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python,
                        "-m", "jobcoord", "--db", str(directory / "q.db"), "migrate", "--json"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert '"database_readonly"' in r.stdout
    assert "Traceback" not in r.stderr
    assert list(directory.iterdir()) == []
    import shutil

    shutil.rmtree(base)


# --- check and backup ------------------------------------------------------------------------


def test_check_reports_each_broken_invariant_and_exits_7(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    _populate(c)
    assert run_cli(sqlite_target, "check", "--full", "--json").code == 0
    raw = sqlite3.connect(sqlite_target.sqlite_path or "", isolation_level=None)
    raw.execute("DELETE FROM leases")  # a running job now has no lease
    raw.execute("UPDATE jobs SET result_json = NULL WHERE status = 'succeeded'")
    raw.close()
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7
    found = {v["invariant"] for v in r.json["violations"]}
    assert {"running_without_lease", "succeeded_without_result"} <= found
    c.close()


def test_backup_refuses_to_overwrite_without_force(sqlite_target: Target, tmp_path: Path
                                                   ) -> None:
    dest = tmp_path / "backup.db"
    dest.write_bytes(b"precious")
    r = run_cli(sqlite_target, "backup", str(dest), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "destination_exists"
    assert dest.read_bytes() == b"precious"
    r = run_cli(sqlite_target, "backup", str(dest), "--force", "--json")
    assert r.code == 0, r.err
    assert r.json["quick_check"] == ["ok"]
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600


def test_backup_under_a_concurrent_writer_is_a_consistent_copy(sqlite_target: Target,
                                                               tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from jobcoord.service import Coordinator\n"
        "c = Coordinator.open(sys.argv[1])\n"
        "deadline = time.monotonic() + 20\n"
        "while time.monotonic() < deadline:\n"
        "    c.enqueue('k', {'pad': 'x' * 500})\n"
    ), path], stdout=subprocess.DEVNULL)
    try:
        c = Coordinator.open(sqlite_target)
        while c.status()["jobs"]["waiting"] < 200:  # the writer is well under way
            time.sleep(0.05)
        copies = []
        for i in range(3):
            dest = tmp_path / f"b{i}.db"
            r = run_cli(sqlite_target, "backup", str(dest), "--json")
            assert r.code == 0, r.err
            copies.append(dest)
        assert writer.poll() is None  # still writing while every backup was taken
    finally:
        writer.terminate()
        writer.wait(30)
    for dest in copies:
        conn = sqlite3.connect(dest)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()
        copy_target = resolve_target(db=str(dest))
        assert check(Coordinator.open(copy_target).db, full=True)["ok"]
    c.close()


def test_backup_and_writer_threads_share_no_connection(sqlite_target: Target,
                                                       tmp_path: Path) -> None:
    """The backup reads on its own connection: a write transaction held open elsewhere in the
    process neither blocks it nor leaks into the copy."""
    c = Coordinator.open(sqlite_target)
    c.enqueue("k", {"committed": True})
    held = threading.Event()
    release = threading.Event()

    def hold_open_write() -> None:
        with c.db.write_engine.connect() as conn:
            tx = conn.begin()
            conn.exec_driver_sql("INSERT INTO workers (worker_id, created_at) VALUES ('x', 1)")
            held.set()
            release.wait(10)
            tx.rollback()

    t = threading.Thread(target=hold_open_write)
    t.start()
    held.wait(10)
    r = run_cli(sqlite_target, "backup", str(tmp_path / "b.db"), "--json")
    release.set()
    t.join()
    assert r.code == 0, r.err
    copy = sqlite3.connect(tmp_path / "b.db")
    assert copy.execute("SELECT COUNT(*) FROM jobs").fetchone() == (1,)
    assert copy.execute("SELECT COUNT(*) FROM workers").fetchone() == (0,)
    copy.close()
    c.close()


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
