"""Restore: a new database from a backup file, only once the backup is proven whole, and never
over anything that exists."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.db import Target, resolve_target
from jobcoord.maintenance import sqlite_uri
from jobcoord.models import CORE_TABLES
from jobcoord.service import Coordinator
from tests.conftest import run_cli
from tests.test_database_files import _error_case

IDLE_ON_AC = {"memory_used_pct": 40, "on_battery": False, "user_idle_s": 900}


def rows(path: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(sqlite_uri(str(path), "ro"), uri=True)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                for t in CORE_TABLES}
    finally:
        conn.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def populated_backup(target: Target, dest: Path) -> Path:
    """A coordinator with jobs in several states, backed up to `dest`."""
    c = Coordinator.open(target)
    try:
        with freeze_time("2026-03-01T09:00:00Z"):
            for i in range(4):
                c.enqueue("embed", {"n": i}, key=f"k{i}")
            c.heartbeat("w1", readings=IDLE_ON_AC)
            got = c.claim("w1")
            c.checkpoint(got["job"]["job_id"], "w1", 1, "step", {"done": 1})
            c.complete(got["job"]["job_id"], "w1", 1, {"ok": True})
            got = c.claim("w1")
            c.fail(got["job"]["job_id"], "w1", 1, "bad", permanent=True)
            c.claim("w1")  # left running, under a lease
    finally:
        c.close()
    r = run_cli(target, "backup", str(dest), "--json")
    assert r.code == 0, r.out + r.err
    return dest


def test_restore_makes_a_new_database_identical_to_the_backup(sqlite_target: Target,
                                                              tmp_path: Path) -> None:
    backup = populated_backup(sqlite_target, tmp_path / "backup.db")
    before = digest(backup)
    new = tmp_path / "restored" / "q.db"
    new.parent.mkdir()
    r = run_cli(resolve_target(db=str(new)), "restore", str(backup), "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["ok"] is True and r.json["integrity_check"] == ["ok"]
    assert r.json["jobs"] == {"waiting": 1, "succeeded": 1, "dead": 1, "running": 1}
    assert sorted(p.name for p in new.parent.iterdir()) == ["q.db"]  # no temporary left
    assert digest(backup) == before  # read, never written
    assert rows(new) == rows(backup) == rows(sqlite_target.sqlite_path)
    conn = sqlite3.connect(new)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    restored = resolve_target(db=str(new))
    assert run_cli(restored, "check", "--full").code == 0
    # The restored coordinator carries on: the same key is the same job, the lease holds.
    same = run_cli(restored, "enqueue", "embed", "--payload", '{"n": 0}', "--key", "k0",
                   "--json")
    assert same.json == {"job_id": 1, "created": False}
    assert run_cli(restored, "status", "--json").json["active_leases"] == 1


def test_restore_refuses_a_backup_carrying_a_trigger_jobcoord_never_makes(
        sqlite_target: Target, tmp_path: Path) -> None:
    """A backup with a trigger of someone's on `jobs` (rewriting each new job's kind) was
    restored (exit 0) and `check` said ok: every job submitted afterwards was changed behind
    the coordinator's rules. `check` names it (`trigger_unexpected`, exit 7), so `restore`
    refuses the backup and makes nothing. A table of one's own beside jobcoord's is left
    alone."""
    backup = populated_backup(sqlite_target, tmp_path / "backup.db")
    conn = sqlite3.connect(backup)
    conn.execute("CREATE TABLE notes(x TEXT)")  # one's own: not a finding
    conn.commit()
    conn.close()
    new = tmp_path / "restored.db"
    assert run_cli(resolve_target(db=str(new)), "restore", str(backup), "--json").code == 0
    new.unlink()
    conn = sqlite3.connect(backup)
    conn.execute("CREATE TRIGGER evil AFTER INSERT ON jobs BEGIN "
                 "UPDATE jobs SET kind = 'pwned' WHERE job_id = new.job_id; END")
    conn.commit()
    conn.close()
    r = run_cli(resolve_target(db=str(new)), "restore", str(backup), "--json")
    assert r.code == 7, r
    assert "trigger_unexpected" in r.out, r.out
    assert not new.exists()
    r = run_cli(resolve_target(db=str(backup)), "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    assert found["trigger_unexpected"]["triggers"] == [{"table": "jobs", "name": "evil"}]


def test_restore_never_writes_over_an_existing_database(sqlite_target: Target,
                                                       tmp_path: Path) -> None:
    backup = populated_backup(sqlite_target, tmp_path / "backup.db")
    live = Path(sqlite_target.sqlite_path or "")
    before = rows(live)
    r = run_cli(sqlite_target, "restore", str(backup), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "destination_exists"
    assert "move it away" in r.json["error"]["message"]
    assert rows(live) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_restore_refuses_a_target_with_a_leftover_beside_it(sqlite_target: Target,
                                                            tmp_path: Path, suffix: str) -> None:
    backup = populated_backup(sqlite_target, tmp_path / "backup.db")
    new = tmp_path / "new.db"
    stray = Path(str(new) + suffix)
    stray.write_bytes(b"left by another database")
    r = run_cli(resolve_target(db=str(new)), "restore", str(backup), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "destination_exists"
    assert not new.exists() and stray.read_bytes() == b"left by another database"


def test_restore_refuses_a_copy_of_live_files_with_a_wal_beside_it(sqlite_target: Target,
                                                                   tmp_path: Path) -> None:
    """A `cp` of a database while it runs: the file alone is not the database."""
    path = sqlite_target.sqlite_path
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({path!r}, isolation_level=None)\n"
        "c.execute('PRAGMA wal_autocheckpoint=0')\n"
        "c.execute(\"INSERT INTO workers (worker_id, roles_json, created_at)"
        " VALUES ('copy', '[]', 1)\")\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        copy = tmp_path / "copy.db"
        copy.write_bytes(Path(path or "").read_bytes())
        Path(str(copy) + "-wal").write_bytes(Path(f"{path}-wal").read_bytes())
    finally:
        holder.kill()
        holder.wait()
    new = tmp_path / "new.db"
    r = run_cli(resolve_target(db=str(new)), "restore", str(copy), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "backup_not_standalone"
    assert "jobcoord backup" in r.json["error"]["message"]
    assert not new.exists()


@pytest.mark.parametrize("case", ["empty_file", "plain_sqlite", "text_file", "newer",
                                  "damaged_pages"])
def test_an_unusable_backup_is_refused_and_nothing_is_created(tmp_path: Path,
                                                              sqlite_template: str,
                                                              case: str) -> None:
    bad, code, exit_code = _error_case(tmp_path, case, sqlite_template)
    before = digest(bad)
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli(resolve_target(db=str(out / "q.db")), "restore", str(bad), "--json")
    assert r.code == exit_code, r.out + r.err
    assert r.json["error"]["code"] == code
    assert "Traceback" not in r.err
    assert list(out.iterdir()) == []
    assert digest(bad) == before


def test_a_backup_that_breaks_an_invariant_is_refused(sqlite_target: Target,
                                                      tmp_path: Path) -> None:
    backup = populated_backup(sqlite_target, tmp_path / "backup.db")
    conn = sqlite3.connect(backup)
    conn.execute("DELETE FROM leases")  # a running job without its lease
    conn.commit()
    conn.close()
    new = tmp_path / "new.db"
    r = run_cli(resolve_target(db=str(new)), "restore", str(backup), "--json")
    assert r.code == 7 and r.json["error"]["code"] == "database_corrupt"
    assert r.json["error"]["details"]["violations"][0]["invariant"] == "running_without_lease"
    assert not new.exists()


def test_restore_of_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    target = resolve_target(db=str(tmp_path / "new.db"))
    missing = run_cli(target, "restore", str(tmp_path / "nope.db"), "--json")
    assert missing.code == 2 and "no backup file" in missing.json["error"]["message"]
    folder = run_cli(target, "restore", str(tmp_path), "--json")
    assert folder.code == 2
    same = run_cli(target, "restore", str(tmp_path / "new.db"), "--json")
    assert same.code == 2
    assert list(tmp_path.iterdir()) == []
    # A FIFO is there, but no file: said so (it was "no backup file at", as if absent).
    os.mkfifo(tmp_path / "pipe.db")
    pipe = run_cli(target, "restore", str(tmp_path / "pipe.db"), "--json")
    assert pipe.code == 2 and "not a regular file" in pipe.json["error"]["message"], pipe
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.db"]


def test_restore_to_postgresql_points_to_its_own_tools(tmp_path: Path) -> None:
    started = time.monotonic()
    r = run_cli(resolve_target(url="postgresql+psycopg://nobody@127.0.0.1:1/none"), "restore",
                str(tmp_path / "backup.db"), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "unsupported"
    assert "pg_restore" in r.json["error"]["message"]
    assert time.monotonic() - started < 30  # refused before any connection was tried


def test_a_backup_with_artifacts_at_their_first_revision_restores(tmp_path: Path) -> None:
    """A backup whose artifacts tables are at their first revision (a0001: no digest
    column yet) restores, `migrate` following: check's look at the artifact rows' digests
    read that column and the restore failed, exit 1."""
    from jobcoord.db import Database
    from jobcoord.migrate import migrate
    from tests.test_schema_c0002 import _alembic

    src = resolve_target(db=str(tmp_path / "old.db"))
    db = Database.open(src, create=True)
    migrate(db)
    _alembic(db, "upgrade", "a0001", frozenset({"artifacts"}))
    Coordinator(db, verify=False).enqueue("k", {})
    db.close()
    new = resolve_target(db=str(tmp_path / "new.db"))
    r = run_cli(new, "--artifacts", str(tmp_path / "store"), "restore",
                str(tmp_path / "old.db"), "--json")
    assert r.code == 0, r


@pytest.mark.parametrize("artifacts", [False, True], ids=["database", "with_artifacts"])
def test_a_backup_or_restore_through_a_regular_file_says_it_is_not_a_directory(
        sqlite_target: Target, tmp_path: Path, artifacts: bool) -> None:
    """`backup q.db/b.db` (the database file taken for a directory) said "directory q.db
    does not exist", which sent people looking for a directory while the file was there.
    Said as it is, as for a new database's path: exit 6, nothing made; a directory that
    is truly missing (a volume not mounted) still says so."""
    db = sqlite_target.sqlite_path
    assert db is not None
    args = ["--artifacts", str(tmp_path / "store")] if artifacts else []
    if artifacts:
        assert run_cli(sqlite_target, "migrate", "--with", "artifacts").code == 0
    else:
        assert run_cli(sqlite_target, "migrate").code == 0
    backup = tmp_path / "good.db"
    assert run_cli(sqlite_target, *args, "backup", str(backup), "--json").code == 0
    (tmp_path / "unmounted").symlink_to(tmp_path / "no volume" / "backups")
    before = sorted(p.name for p in Path(db).parent.iterdir())
    for dest, said in ((f"{db}/b.db", f"{db} is not a directory"),
                       (str(tmp_path / "no dir" / "b.db"), "does not exist"),
                       (str(tmp_path / "unmounted" / "b.db"), "does not exist")):
        r = run_cli(sqlite_target, *args, "backup", dest, "--json")
        assert (r.code, r.json["error"]["code"]) == (6, "database_unavailable"), r
        assert said in r.json["error"]["message"], r.json
        restored = resolve_target(db=dest)
        r = run_cli(restored, *args, "restore", str(backup), "--json")
        assert (r.code, r.json["error"]["code"]) == (6, "database_unavailable"), r
        assert said in r.json["error"]["message"], r.json
    assert sorted(p.name for p in Path(db).parent.iterdir()) == before
