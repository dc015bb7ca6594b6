"""`backup` never destroys the last good backup: the copy is checked before anything is put in
place, so a damaged live database leaves the destination exactly as it was."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

from jobcoord.db import Target, resolve_target
from tests.conftest import run_cli
from tests.test_restore import populated_backup


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damage_table_pages(path: str, table: str) -> None:
    """Overwrite the root page of one table with noise: the schema (and alembic_version)
    still read, so the coordinator opens, but quick_check of any page-for-page copy fails."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)
                        ).fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size + 8)
        f.write(os.urandom(page_size - 8))


def test_backup_force_from_a_damaged_database_keeps_the_last_good_backup(
        sqlite_target: Target, tmp_path: Path) -> None:
    dest = populated_backup(sqlite_target, tmp_path / "nightly.db")
    before = digest(dest)
    damage_table_pages(sqlite_target.sqlite_path or "", "job_events")
    r = run_cli(sqlite_target, "backup", str(dest), "--force", "--json")
    assert r.code == 7, (r.out, r.err)
    assert r.json["error"]["code"] == "database_corrupt"
    assert digest(dest) == before  # the last good backup, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobcoord.db", "nightly.db"]
    new = tmp_path / "restored.db"
    ok = run_cli(resolve_target(db=str(new)), "restore", str(dest), "--json")
    assert ok.code == 0, ok.out + ok.err


def test_backup_from_a_damaged_database_leaves_no_damaged_copy_behind(
        sqlite_target: Target, tmp_path: Path) -> None:
    populated_backup(sqlite_target, tmp_path / "first.db")
    damage_table_pages(sqlite_target.sqlite_path or "", "job_events")
    r = run_cli(sqlite_target, "backup", str(tmp_path / "second.db"), "--json")
    assert r.code == 7, (r.out, r.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.db", "jobcoord.db"]
