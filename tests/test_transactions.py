"""The SQLite engine's transaction discipline: writes begin IMMEDIATE, an open write keeps
other writers out, reads take no write lock, the driver never opens a transaction on its own,
and every connection gets the pragmas."""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import pytest
from sqlalchemy import event

from jobcoord.db import Database, Target
from jobcoord.service import Coordinator


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


def test_threads_of_one_process_wait_their_turn_for_the_write_lock_not_in_sqlite(
        sqlite_target: Target) -> None:
    """A second thread's write starts its BEGIN IMMEDIATE only after the first one's COMMIT:
    it waits in the process's own queue (woken at that commit), never inside SQLite's busy
    handler, whose sleeps grow to 100 ms."""
    import threading

    c = Coordinator.open(sqlite_target)
    statements = _trace(c.db)
    inside, release = threading.Event(), threading.Event()

    def holder(conn: Any) -> None:
        inside.set()
        assert release.wait(10)

    first = threading.Thread(target=lambda: c.db.write(holder, "first"))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: c.enqueue("k", {}))
    second.start()
    second.join(0.3)  # it has had every chance to reach SQLite
    assert second.is_alive()
    release.set()
    first.join(10)
    second.join(10)
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE", "COMMIT", "BEGIN IMMEDIATE", "COMMIT"]
    assert c.jobs()["jobs"][0]["kind"] == "k"
    c.close()


def test_a_thread_waiting_past_the_busy_timeout_gets_database_busy(
        sqlite_target: Target) -> None:
    import threading

    from jobcoord.errors import DatabaseBusy

    c = Coordinator.open(sqlite_target, busy_timeout=0.05)
    inside, release = threading.Event(), threading.Event()

    def holder(conn: Any) -> None:
        inside.set()
        assert release.wait(30)

    first = threading.Thread(target=lambda: c.db.write(holder, "first"))
    first.start()
    try:
        assert inside.wait(10)
        with pytest.raises(DatabaseBusy) as e:
            c.enqueue("k", {})
        assert e.value.code == "database_locked"
    finally:
        release.set()
        first.join(10)
    assert c.jobs()["jobs"] == []  # nothing was written
    c.close()
