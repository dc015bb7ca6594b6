"""One Coordinator shared by many threads, on both databases: the way a web application or a
thread pool uses it. Also the connection rules behind that: every transaction gives its
connection back, reads are one snapshot, a nested call joins the transaction around it, and
the PostgreSQL clock check runs again on a timer."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import event

from jobcoord.db import Database, Target, resolve_target
from jobcoord.errors import InvalidInput, JobcoordError, StorageUnavailable
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from jobcoord.store import postgresql as dbmod
from tests.sql import sql


def _run_threads(n: int, body: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            start.wait()
            body(i)
        except BaseException as e:  # collected: a thread's failure must fail the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


_CRASH_REPRO = r"""
import sys, threading
from jobcoord.service import Coordinator
where = sys.argv[1]
c = Coordinator.open(url=where) if "://" in where else Coordinator.open(where)
c.heartbeat("w", readings={"memory_used_pct": 10})
done = []
def body():
    for _ in range(15):
        c.enqueue("k", {})
    while True:
        got = c.claim("w")
        if got["job"] is None:
            break
        c.complete(got["job"]["job_id"], "w", got["lease"]["epoch"], {"ok": True})
        done.append(1)
threads = [threading.Thread(target=body) for _ in range(24)]
for t in threads: t.start()
for t in threads: t.join()
print(len(done))
"""


def test_24_threads_sharing_one_coordinator_do_not_crash_the_process(target: Target) -> None:
    # In its own process: the defect was a SIGSEGV, which would take pytest down with it.
    where = target.sqlite_path or target.url
    proc = subprocess.run([sys.executable, "-c", _CRASH_REPRO, where], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert int(proc.stdout.strip()) == 24 * 15
    with Coordinator.open(target) as c:
        assert c.status()["jobs"]["succeeded"] == 24 * 15
        assert check(c.db)["violations"] == []


def test_32_threads_of_mixed_operations_keep_every_invariant(coord: Coordinator) -> None:
    for w in range(4):
        coord.heartbeat(f"w{w}", readings={"memory_used_pct": 10})
    completed: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()

    def body(i: int) -> None:
        worker = f"w{i % 4}"
        for n in range(12):
            op = (i + n) % 6
            if op == 0:
                coord.enqueue("k", {"i": i, "n": n % 3}, key=f"k-{i}-{n % 3}")
            elif op == 1:
                coord.enqueue_many([{"kind": "k", "payload": {"b": i}}] * 3)
            elif op == 2:
                got = coord.claim(worker, lease_s=60)
                if got["job"] is not None:
                    job_id, epoch = got["job"]["job_id"], got["lease"]["epoch"]
                    coord.renew(job_id, worker, epoch, lease_s=60)
                    coord.complete(job_id, worker, epoch, {"by": worker})
                    with lock:
                        completed[(job_id, epoch)] += 1
            elif op == 3:
                coord.reap()
            elif op == 4:
                coord.status()
                coord.jobs(limit=5)
            else:
                coord.heartbeat(worker, readings={"memory_used_pct": 10})

    errors = _run_threads(32, body)
    assert errors == [], errors[:3]
    assert all(n == 1 for n in completed.values())
    assert coord.status()["jobs"]["succeeded"] == len(completed)
    assert check(coord.db)["violations"] == []


def test_200_short_lived_threads_each_get_a_connection_and_give_it_back(
        coord: Coordinator) -> None:
    # Before: each writer thread pinned a connection for ever; on PostgreSQL the 16th thread
    # waited 30 s for the pool and failed with an unclassified TimeoutError.
    for i in range(200):
        box: list[Any] = []
        t = threading.Thread(target=lambda i=i, box=box: box.append(coord.enqueue("k", {"i": i})))
        t.start()
        t.join(60)
        assert box and box[0]["created"], f"thread {i} got no answer"
    if not coord.db.is_sqlite:
        pool = coord.db.engine.pool
        assert pool.checkedout() == 0
        assert pool.size() <= dbmod.PG_POOL_SIZE


def test_running_out_of_connections_is_database_busy_not_an_internal_error(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    if target.sqlite_path is not None:
        pytest.skip("SQLite opens a connection per concurrent transaction: no shared limit")
    monkeypatch.setattr(dbmod, "PG_POOL_SIZE", 1)
    monkeypatch.setattr(dbmod, "PG_POOL_OVERFLOW", 0)
    with Coordinator.open(target) as c:
        c.db.engine.pool._timeout = 0.5  # type: ignore[attr-defined]
        held = c.db.engine.connect()  # the one connection there is
        try:
            with pytest.raises(JobcoordError) as caught:
                c.enqueue("k", {})
            assert caught.value.exit_code == 5
            assert caught.value.code == "connections_exhausted"
        finally:
            held.close()
        assert c.enqueue("k", {})["created"]


# --- one snapshot per read -----------------------------------------------------------------


def _read_while_a_completion_commits(target: Target, read: str) -> tuple[int, int, Any]:
    """Claim a fresh job, then call `read` (a Coordinator method name) on it while another
    connection completes the job just before the read's first statement on `leases` (the
    read's second statement). Returns the job id, the epoch and what the read answered."""
    with Coordinator.open(target) as coord, Coordinator.open(target) as other:
        coord.heartbeat("w")
        job_id = coord.enqueue("k", {})["job_id"]
        epoch = coord.claim("w")["lease"]["epoch"]
        fired = []

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "FROM leases" in statement and not fired:
                fired.append(1)
                other.complete(job_id, "w", epoch, {"late": False})

        event.listen(coord.db.engine, "before_cursor_execute", before)
        try:
            got = getattr(coord, read)(job_id)
        finally:
            event.remove(coord.db.engine, "before_cursor_execute", before)
        assert fired and other.show(job_id)["job"]["status"] == "succeeded"
        return job_id, epoch, got


def test_explain_and_show_read_one_snapshot_while_a_completion_commits(target: Target) -> None:
    # The completion committed mid-read; each read still saw one moment: running, leased.
    _, _, explained = _read_while_a_completion_commits(target, "explain")
    assert explained["status"] == "running"
    assert explained["reasons"][0]["code"] == "running"
    _, epoch, shown = _read_while_a_completion_commits(target, "show")
    assert shown["job"]["status"] == "running"
    assert shown["lease"] is not None and shown["lease"]["epoch"] == epoch
    assert [e["to"] for e in shown["events"]] == ["waiting", "running"]


# --- nested calls --------------------------------------------------------------------------


def test_a_write_inside_a_write_joins_it_and_commits_or_rolls_back_with_it(
        coord: Coordinator) -> None:
    db = coord.db

    def outer(conn: Any) -> int:
        inner = db.write(lambda c: sql(c, "SELECT COUNT(*) FROM jobs").scalar())
        seen = db.read(lambda c: sql(c, "SELECT COUNT(*) FROM jobs").scalar())
        return int(inner) + int(seen)

    assert db.write(outer) == 0

    def failing(conn: Any) -> None:
        db.write(lambda c: sql(
            c, "UPDATE workers SET created_at = 1 WHERE worker_id = 'nobody'"))
        raise StorageUnavailable("boom", "rolled back as a whole")

    with pytest.raises(StorageUnavailable):
        db.write(failing)
    assert coord.enqueue("k", {})["created"]


def test_a_write_inside_a_read_is_refused_clearly(coord: Coordinator) -> None:
    db = coord.db
    with pytest.raises(JobcoordError) as caught:
        db.read(lambda conn: db.write(lambda c: None, "inner"))
    assert "inside a read" in caught.value.message


# --- the PostgreSQL clock check, again on a timer ------------------------------------------


def test_a_clock_that_steps_after_connecting_is_refused_on_the_next_check(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    if target.sqlite_path is not None:
        pytest.skip("one host, one clock: SQLite has no server clock to disagree with")
    with Coordinator.open(target) as c:
        c.heartbeat("w")
        c.enqueue("k", {})
        # The host's clock steps 5 s ahead of the server's after the connection opened.
        real = dbmod._host_time
        monkeypatch.setattr(dbmod, "_host_time", lambda: real() + 5.0)
        assert c.claim("w")["job"] is not None  # measured under 30 s ago: not checked yet
        monkeypatch.setattr(dbmod, "SKEW_RECHECK_S", 0.0)
        with pytest.raises(StorageUnavailable) as caught:
            c.reap()
        assert caught.value.code == "clock_skew"
        with pytest.raises(StorageUnavailable):
            c.claim("w")
        # Back in step: the next check lets work go on.
        monkeypatch.setattr(dbmod, "_host_time", real)
        assert c.reap()["expired"] == 0
        assert c.status()["clock_offset_s"] is not None


def test_the_clock_offset_is_measured_again_after_the_interval(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    if target.sqlite_path is not None:
        pytest.skip("PostgreSQL only: the server's clock is the reference")
    calls = []
    real = dbmod._measure_clock

    def counting(*args: Any) -> None:
        calls.append(time.monotonic())
        real(*args)

    monkeypatch.setattr(dbmod, "_measure_clock", counting)
    with Coordinator.open(target) as c:
        c.status()
        first = len(calls)
        c.status()
        assert len(calls) == first  # within the interval: no extra round trip
        monkeypatch.setattr(dbmod, "SKEW_RECHECK_S", 0.0)
        c.status()
        assert len(calls) == first + 1


# --- error classification and URLs ---------------------------------------------------------


def test_errors_are_classified_by_the_drivers_code_not_by_message_text(
        sqlite_target: Target) -> None:
    import sqlite3

    conn = sqlite3.connect(sqlite_target.sqlite_path)
    try:
        with pytest.raises(sqlite3.Error) as missing:
            conn.execute("SELECT * FROM no_such_table_here")
    finally:
        conn.close()
    # A generic SQLITE_ERROR carries no code that says "schema": it is not guessed from text.
    assert dbmod.classify(missing.value).code == "internal_error"
    text_only = sqlite3.OperationalError("database is locked")  # no SQLite error name
    assert dbmod.classify(text_only).code == "internal_error"


def test_postgres_urls_are_accepted_and_mean_psycopg() -> None:
    t = resolve_target(url="postgres://someone@127.0.0.1:5432/jobs")
    assert t.url.startswith("postgresql+psycopg://someone@")
    assert resolve_target(url="postgresql://someone@h/db").url.startswith("postgresql+psycopg")


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@[::1:5432/x",  # a bracketed host never closed
    "postgresql+psycopg://postgres@host:port/x",  # a port that is no number
    "postgresql+psycopg2://postgres@127.0.0.1/db",  # drivers jobcoord does not use
    "postgresql+asyncpg://postgres@127.0.0.1/db",
    "postgresql+pg8000://postgres@127.0.0.1/db",
    "sqlite+pysqlcipher:///x.db",
    # Query parameters the driver would refuse only as it connects: a port that is no number
    # (an internal error), an option libpq does not know or a timeout that is no number (a
    # database error, exit 1), a port out of range (unreachable, exit 6).
    "postgresql://postgres@127.0.0.1/postgres?port=abc",
    "postgresql://postgres@127.0.0.1/postgres?connect_timeout=abc",
    "postgresql://postgres@127.0.0.1/postgres?foo=bar",
    "postgresql://postgres@127.0.0.1:99999/postgres",
    "postgresql://postgres@127.0.0.1/postgres?port=0",
    "postgresql://postgres@127.0.0.1:0/postgres",  # connected to the default port, exit 0
    "postgresql://postgres@127.0.0.1/postgres?sslmode=disable&sslmode=require",  # twice
])
def test_a_malformed_url_or_another_driver_is_invalid_input_never_an_internal_error(
        url: str) -> None:
    """Each ended as an internal error (exit 1) or a database out of reach: int()'s
    ValueError from the port, the missing module of a driver jobcoord never uses, a
    connection option the driver refuses. All are refused before anything is opened."""
    with pytest.raises(InvalidInput) as e:
        resolve_target(url=url)
    assert e.value.code == "invalid_input"
    r = subprocess.run([sys.executable, "-m", "jobcoord", "--url", url, "status", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout


def test_a_missing_postgresql_driver_names_the_extra_to_install() -> None:
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from jobcoord.cli import main\n"
            "main(['--url', 'postgresql://someone@127.0.0.1:1/none', 'status', '--json'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 6, proc.stderr
    assert "jobcoord[postgresql]" in proc.stdout
    assert '"driver_missing"' in proc.stdout


def test_database_objects_share_nothing_between_processes_after_a_fork(
        sqlite_target: Target) -> None:
    import os

    db = Database.open(sqlite_target)
    try:
        db.read(lambda c: sql(c, "SELECT 1").scalar())  # leaves a cached connection
        pid = os.fork()
        if pid == 0:  # the child uses its own connection, never the parent's
            try:
                n = db.read(lambda c: sql(c, "SELECT COUNT(*) FROM jobs").scalar())
                os._exit(0 if n == 0 else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert db.read(lambda c: sql(c, "SELECT 1").scalar()) == 1
    finally:
        db.close()


def test_a_sqlite_target_url_names_exactly_its_file(tmp_path: Any) -> None:
    from sqlalchemy.engine import make_url

    path = str(tmp_path / "a b#1?x=%41.db")
    t = resolve_target(db=path)
    assert make_url(t.url).database == path
    assert resolve_target(url=t.url).sqlite_path == path


def test_a_server_restart_is_storage_unavailable_not_an_internal_error(target: Target) -> None:
    if target.sqlite_path is not None:
        pytest.skip("PostgreSQL only: a server that terminates connections")
    import psycopg

    with Coordinator.open(target) as c, c.db.engine.connect() as victim:
        pid = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        victim.commit()
        c.db.read(lambda conn: conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})"))
        with pytest.raises(psycopg.OperationalError) as lost:
            victim.connection.dbapi_connection.execute("SELECT 1")
    err = dbmod.classify(lost.value)
    assert isinstance(err, StorageUnavailable)
    assert err.code == "database_unavailable"
