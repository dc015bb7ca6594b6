"""Checks and backups: recovery is checked, not assumed.

`check` runs SQLite's own check (quick or full) and the application invariants, which hold
on both databases. `backup` uses SQLite's online backup API in a single step (a page-by-page
backup restarts on every write and may never finish under load), writes to a temporary file,
syncs and renames it, then opens the copy on its own connection and checks it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Any

from sqlalchemy.engine import Connection

from .db import Database, classify, create_private_file
from .errors import DatabaseCorrupt, InvalidInput, JobcoordError, StorageUnavailable

#: Each invariant is a query returning the offending job ids (zero rows when it holds).
INVARIANTS: tuple[tuple[str, str], ...] = (
    ("running_without_lease",
     "SELECT j.job_id FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id"
     " WHERE j.status = 'running' AND l.job_id IS NULL"),
    ("lease_on_job_not_running",
     "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id"
     " WHERE j.status <> 'running'"),
    ("lease_epoch_differs_from_job",
     "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id"
     " WHERE l.epoch <> j.epoch"),
    ("succeeded_without_result",
     "SELECT job_id FROM jobs WHERE status = 'succeeded' AND result_json IS NULL"),
    ("latest_event_differs_from_status",
     "SELECT j.job_id FROM jobs j JOIN job_events e ON e.event_id ="
     " (SELECT MAX(event_id) FROM job_events WHERE job_id = j.job_id)"
     " WHERE e.to_status <> j.status"),
    ("job_without_events",
     "SELECT j.job_id FROM jobs j WHERE NOT EXISTS"
     " (SELECT 1 FROM job_events e WHERE e.job_id = j.job_id)"),
    ("attempts_out_of_range",
     "SELECT job_id FROM jobs WHERE attempts > max_attempts AND status <> 'waiting'"),
)


def _invariants(db: Database, conn: Connection) -> list[dict[str, Any]]:
    violations = []
    for name, sql in INVARIANTS:
        ids = [r[0] for r in db.run_text(conn, sql + " LIMIT 20").all()]
        if ids:
            violations.append({"invariant": name, "job_ids": ids})
    return violations


def check(db: Database, *, full: bool = False) -> dict[str, Any]:
    """Storage check plus application invariants. `ok` is False on any finding."""
    out: dict[str, Any] = {}
    if db.is_sqlite:
        pragma = "integrity_check" if full else "quick_check"

        def _storage(conn: Connection) -> tuple[list[str], list[Any]]:
            rows = [r[0] for r in conn.exec_driver_sql(f"PRAGMA {pragma}").all()]
            fks = [list(r) for r in conn.exec_driver_sql("PRAGMA foreign_key_check").all()]
            return rows, fks

        rows, fks = db.read(_storage, pragma)
        out[pragma] = rows[:20]
        out["foreign_key_violations"] = fks[:20]
        storage_ok = rows == ["ok"] and not fks
    else:
        storage_ok = True
    out["violations"] = db.read(lambda conn: _invariants(db, conn), "checking invariants")
    out["ok"] = storage_ok and not out["violations"]
    return out


def backup(db: Database, dest: str, *, force: bool = False) -> dict[str, Any]:
    """Copy the live database to `dest` with the online backup API, then check the copy."""
    if not db.is_sqlite:
        raise InvalidInput(
            "unsupported",
            "backup copies SQLite files; back up PostgreSQL with its own tools (pg_dump, "
            "pg_basebackup or continuous archiving)",
        )
    source = db.target.sqlite_path
    assert source is not None
    dest = os.path.abspath(dest)
    if dest == source:
        raise InvalidInput("invalid_input", "the backup destination is the database itself")
    if os.path.isdir(dest):
        raise InvalidInput("invalid_input", f"{dest} is a directory; name the backup file")
    if os.path.exists(dest) and not force:
        raise InvalidInput("destination_exists", f"{dest} already exists; pass --force to "
                           "replace it")
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise StorageUnavailable("database_unavailable", f"directory {parent} does not exist")
    tmp = f"{dest}.tmp-{os.getpid()}"
    create_private_file(tmp)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
        try:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)  # pages=-1: the whole database in one step
                # The copy should stand alone: one file, no -wal beside it.
                dst.execute("PRAGMA journal_mode=DELETE")
            finally:
                dst.close()
        finally:
            src.close()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
        dir_fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except sqlite3.Error as e:
        _unlink(tmp)
        raise classify(e, "backing up") from e
    except OSError as e:
        _unlink(tmp)
        raise StorageUnavailable("database_io_error", f"backup failed: {e.strerror}") from e
    except BaseException:
        _unlink(tmp)
        raise
    copy_check = _check_copy(dest)
    result = {"source": source, "backup": dest, "size_bytes": os.path.getsize(dest),
              "quick_check": copy_check, "ok": copy_check == ["ok"]}
    if not result["ok"]:
        raise DatabaseCorrupt("database_corrupt", f"the backup at {dest} failed quick_check: "
                              f"{copy_check[:3]}", **result)
    return result


def _check_copy(path: str) -> list[str]:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        finally:
            conn.close()
    except sqlite3.Error as e:
        err = classify(e, "checking the backup")
        if isinstance(err, JobcoordError):
            return [err.message]
        raise


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
