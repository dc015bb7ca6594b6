"""The SQLite store: the engine and its pragmas, the BEGIN IMMEDIATE event, the stack of open
connections, SQLITE_* error names, and the core's operations as separate short statements
(BEGIN IMMEDIATE already holds the only write lock, so nothing needs a row lock).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Table, create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import NullPool

from .. import faults
from ..errors import (
    DatabaseBusy,
    DatabaseCorrupt,
    JobcoordError,
    SchemaMismatch,
    StorageUnavailable,
)
from ..validate import dumps
from . import statements as s
from .base import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_RETRIES,
    ChangeWaiter,
    ConnectionSource,
    Database,
    Taken,
    Target,
)
from .sqlite_files import (
    create_private_file,
    file_quick_check,
    precheck_sqlite_path,
    set_journal_mode,
    sqlite_pragma,
    table_columns,
)
from .sqlite_waiter import (
    AFTER_WRITE_EVERY_S,
    AFTER_WRITE_WINDOW_S,
    DATA_VERSION_EVERY_S,
    DATA_VERSION_SAFETY_S,
    WAIT_SLICE_S,
    DataVersionWaiter,
)

# The file checks, the file helpers and the waiter live in their own modules; their names are
# re-exported here, where callers have always imported them from.
__all__ = [
    "AFTER_WRITE_EVERY_S", "AFTER_WRITE_WINDOW_S", "DATA_VERSION_EVERY_S",
    "DATA_VERSION_SAFETY_S", "SQLITE_CODES", "WAIT_SLICE_S", "ConnectionStack",
    "DataVersionWaiter", "GroupCommit", "SqliteDatabase", "create_private_file",
    "file_quick_check", "precheck_sqlite_path", "set_journal_mode", "sqlite_pragma",
    "table_columns",
]

T = TypeVar("T")

# --- error classification --------------------------------------------------------------

SQLITE_CODES: tuple[tuple[str, type[JobcoordError], str, str], ...] = (
    ("SQLITE_BUSY", DatabaseBusy, "database_locked", "the database is locked by another process"),
    ("SQLITE_LOCKED", DatabaseBusy, "database_locked", "the database is locked"),
    (
        "SQLITE_READONLY",
        StorageUnavailable,
        "database_readonly",
        "the database or its directory is read-only (WAL mode needs to write the -wal and "
        "-shm files beside it); fix the permissions or run as the owner",
    ),
    ("SQLITE_FULL", StorageUnavailable, "database_full", "the disk is full"),
    # Opening a database no other process has open creates and sizes its -shm file; on a full
    # disk that fails with this I/O error before SQLITE_FULL could be reported.
    (
        "SQLITE_IOERR_SHMSIZE",
        StorageUnavailable,
        "database_full",
        "cannot grow the shared-memory (-shm) file beside the database; the disk is "
        "probably full (or a file-size limit, `ulimit -f`, is below 32 KiB)",
    ),
    ("SQLITE_IOERR", StorageUnavailable, "database_io_error", "disk I/O error"),
    ("SQLITE_CANTOPEN", StorageUnavailable, "database_unavailable", "cannot open the database"),
    ("SQLITE_PERM", StorageUnavailable, "database_readonly", "permission denied"),
    # SQLite checks a row's CHECK constraints when a statement changes a column they name:
    # a row written with its checks ignored fails the next update (a claim's attempt count
    # against a max_attempts of 0), never a row jobcoord wrote.
    ("SQLITE_CONSTRAINT_CHECK", DatabaseCorrupt, "row_breaks_check",
     "a stored row breaks one of its table's CHECK constraints (written outside jobcoord); "
     "`jobcoord check` names every such row"),
    ("SQLITE_NOTADB", DatabaseCorrupt, "database_corrupt", "the file is not a database"),
    ("SQLITE_CORRUPT", DatabaseCorrupt, "database_corrupt", "the database is malformed"),
)

def _sqlite_engine(path: str, *, create: bool, synchronous: str, busy_timeout: float,
                   frozen: bool = False) -> Engine:
    # mode=rw: every command but `migrate` must fail rather than create a file. `frozen` is
    # for a file nothing writes (a backup being restored): read-only, and immutable so that
    # SQLite creates no -wal or -shm beside it and reads exactly the bytes in the file.
    mode = "ro&immutable=1" if frozen else "rwc" if create else "rw"
    uri = f"file:{quote(path)}?mode={mode}"
    connect_kwargs: dict[str, Any] = {"timeout": busy_timeout, "uri": True}
    if sys.version_info >= (3, 12):
        # Pin the legacy mode: with autocommit=False our BEGIN IMMEDIATE fails ("cannot start a
        # transaction within a transaction"); with autocommit=True commit() silently does
        # nothing. Legacy plus isolation_level=None leaves every BEGIN to us.
        connect_kwargs["autocommit"] = sqlite3.LEGACY_TRANSACTION_CONTROL

    def _connect() -> sqlite3.Connection:
        # check_same_thread=False: Database hands an idle connection to whichever thread runs
        # the next transaction, never to two threads at once.
        return sqlite3.connect(uri, check_same_thread=False, **connect_kwargs)

    # NullPool: Database keeps its own small stack of open connections (ConnectionStack);
    # what it does not keep is really closed. Left to choose, SQLAlchemy would take this
    # creator-built "sqlite://" engine for an in-memory database and give it a
    # SingletonThreadPool, which closes connections other threads are still using.
    engine = create_engine("sqlite://", creator=_connect, poolclass=NullPool)
    sync = "FULL" if synchronous == "full" else "NORMAL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # The driver must not open transactions on its own: it would open a deferred one and
        # a later write could then fail at once with SQLITE_BUSY instead of waiting.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # Pragmas are no-ops inside a transaction, so they are set here, once per connection.
        cur.execute("PRAGMA foreign_keys=ON")
        # FULL syncs the WAL on every commit: an accepted job survives a power cut. NORMAL is
        # faster and still never corrupts, but a power cut may drop the last commits.
        cur.execute(f"PRAGMA synchronous={sync}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Write transactions take the write lock at their start (and so wait out the busy
        # timeout); read-only work uses a deferred BEGIN and never blocks writers.
        begin = conn.get_execution_options().get("jobcoord_begin", "BEGIN")
        # Straight to the driver: exec_driver_sql costs more than the BEGIN itself on the hot
        # path. Errors are wrapped as SQLAlchemy would, so callers still see DBAPIError.
        try:
            conn.connection.driver_connection.execute(begin)
        except sqlite3.Error as e:
            raise DBAPIError.instance(begin, None, e, sqlite3.Error) from e

    return engine


class ConnectionStack(ConnectionSource):
    """Open connections waiting for their next transaction, last in first out, shared by
    every thread (SQLite only).

    Checking a connection out of a SQLAlchemy pool and back costs about as much as a small
    claim on SQLite, so a transaction takes an open Connection from this stack and puts it
    back when it ends. Each is used by one thread at a time; at most `keep` wait here, the
    rest are closed, so threads that come and go never pin connections. After a fork the
    child starts with an empty stack: a connection must never be shared across processes."""

    def __init__(self, engine: Engine, keep: int = 8):
        self.engine = engine
        self.keep = keep
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def take(self) -> Connection:
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._pid = [], os.getpid()  # the parent's: never touch them
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed or conn.invalidated:
            conn = self.engine.connect()
        return conn

    def give(self, conn: Connection, healthy: bool) -> None:
        if healthy and not conn.closed and not conn.invalidated and not conn.in_transaction():
            with self._lock:
                if (self._pid == os.getpid() and len(self._idle) < self.keep
                        and not self._closed):
                    self._idle.append(conn)
                    return
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        """For good: the connections waiting here are closed, and so is every one given
        back from now on (one in use by another thread as the Coordinator closed was kept,
        open for the process's life)."""
        with self._lock:
            self._closed = True
        self.forget()

    def forget(self) -> None:
        """Close the connections waiting here (the engine was disposed); go on keeping
        the ones given back."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


#: The most write functions one group commit runs in its transaction.
GROUP_LIMIT = 64


def _busy(what: str) -> DBAPIError:
    """The error SQLite's own busy timeout raises, for a wait in this process's queue."""
    busy = sqlite3.OperationalError(f"database is locked ({what})")
    busy.sqlite_errorcode, busy.sqlite_errorname = sqlite3.SQLITE_BUSY, "SQLITE_BUSY"
    return DBAPIError.instance("BEGIN IMMEDIATE", None, busy, sqlite3.Error)


class _Call:
    """One `Database.write` waiting in the queue: its function, then its outcome."""

    __slots__ = ("again", "committing", "error", "fn", "ready", "result", "state")

    def __init__(self, fn: Callable[[Connection], Any]) -> None:
        self.fn = fn
        self.state = _QUEUED
        self.ready = threading.Event()  # set when it is answered or made the leader
        self.result: Any = None
        self.error: BaseException | None = None
        self.again = False  # its group broke for another call's sake: run it again
        self.committing = False  # its group's COMMIT was under way


_QUEUED, _TAKEN, _LEAD, _DONE = range(4)


class GroupCommit:
    """The write functions of this process's threads, committed in groups (SQLite allows one
    writer per file anyway, and each commit's fsync costs more than a small transaction).

    A thread that calls `run` while no group is being committed leads: it takes every call
    queued at that moment, up to `limit`, never waiting for more (alone, it runs at once),
    and runs them in one BEGIN IMMEDIATE transaction, each in its own savepoint; a function
    that raises is rolled back to its savepoint and its caller alone gets the exception. One
    COMMIT, and only then is each caller answered. Calls that arrived meanwhile wait in order;
    the first of them leads the next group. A driver error (the database busy, a failing
    statement, the commit) rolls back the whole group: its caller gets the error, to be
    classified and retried as any transaction's, and the group's other calls run again.

    A call that waits longer than `timeout` before any group takes it ends as SQLite's own
    busy timeout would: "database is locked". After a fork the child starts with an empty
    queue (a parent's thread that led would never answer the child)."""

    def __init__(self, limit: int = GROUP_LIMIT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._queue: collections.deque[_Call] = collections.deque()
        self._leading = False
        self._pid = os.getpid()
        #: Groups begun; then committed (or rolled back), the calls they ran, the largest one.
        self.begun = 0
        self.groups = 0
        self.calls = 0
        self.largest = 0

    def run(self, fn: Callable[[Connection], T], timeout: float,
            commit: Callable[[list[_Call]], None]) -> T:
        """`fn`'s result once the group that ran it has committed (or its exception);
        `commit(batch)` runs a batch in one transaction and sets each call's outcome."""
        call = _Call(fn)
        while True:
            with self._lock:
                if self._pid != os.getpid():
                    self._queue, self._leading = collections.deque(), False
                    self._pid = os.getpid()
                self._queue.append(call)
                if not self._leading:
                    self._leading, call.state = True, _LEAD
            if call.state != _LEAD:
                try:
                    self._wait(call, timeout)
                except BaseException:  # timed out, or interrupted (KeyboardInterrupt)
                    self._abandon(call)
                    raise
            if call.state == _LEAD:
                self._lead(call, commit)
            if call.again:
                call.again, call.committing, call.state = False, False, _QUEUED
                call.ready.clear()
                continue
            error, call.error = call.error, None
            if error is not None:
                raise error
            result: T = call.result
            return result

    @property
    def queued(self) -> int:
        """Calls waiting for a group to take them."""
        return len(self._queue)

    def _wait(self, call: _Call, timeout: float) -> None:
        if call.ready.wait(max(timeout, 0.001)):
            return
        with self._lock:
            if call.state == _QUEUED:  # no group took it in time: it leaves, unrun
                self._queue.remove(call)
                raise _busy("by a thread of this process")
        call.ready.wait()  # taken into a group: its answer follows that group's commit

    def _abandon(self, call: _Call) -> None:
        """A caller that stops waiting: its call leaves the queue, and if it had just been
        made the leader, the next call leads. A call a group already took runs anyway."""
        with self._lock:
            if call not in self._queue:
                return
            self._queue.remove(call)
            if call.state == _LEAD:
                if self._queue:
                    following = self._queue[0]
                    following.state = _LEAD
                    following.ready.set()
                else:
                    self._leading = False

    def _lead(self, me: _Call, commit: Callable[[list[_Call]], None]) -> None:
        with self._lock:
            batch = [self._queue.popleft()
                     for _ in range(min(self.limit, len(self._queue)))]
            for call in batch:
                call.state = _TAKEN
            self.begun += 1
        assert batch and batch[0] is me
        finished = False
        try:
            commit(batch)
            finished = True
        finally:
            with self._lock:
                self.groups += 1
                self.calls += len(batch)
                self.largest = max(self.largest, len(batch))
                for call in batch:
                    if not finished:  # the leader was interrupted (KeyboardInterrupt)
                        call.result = None
                        if call.committing:  # perhaps committed: never run it twice
                            call.again, call.error = False, StorageUnavailable(
                                "write_interrupted", "the transaction was interrupted as it "
                                "committed; whether this change was saved is unknown")
                        else:  # rolled back: nothing of the group was saved
                            call.again, call.error = True, None
                    call.state = _DONE
                following = self._queue[0] if self._queue else None
                if following is None:
                    self._leading = False
                else:
                    following.state = _LEAD
            # Answered only now: after the commit (or after the rollback of all of them).
            for call in batch[1:]:
                call.ready.set()
            if following is not None:
                following.ready.set()


class SqliteDatabase(Database):
    """A SQLite file: write transactions begin with BEGIN IMMEDIATE, reads with a deferred
    BEGIN; each keeps a small stack of open connections."""

    dialect = "sqlite"
    folds_transitions = False
    events_settle_s = 0.0

    #: How long `let_writers_in` pauses: a process waiting for the write lock retries it at
    #: least every 100 ms (SQLite's busy handler), and would find it taken again at once.
    LET_WRITERS_IN_S = 0.1

    def let_writers_in(self) -> None:
        time.sleep(self.LET_WRITERS_IN_S)

    def __init__(self, target: Target, engine: Engine, **kw: Any) -> None:
        super().__init__(target, engine, **kw)
        self._driver_errors = (DBAPIError, PoolTimeout, sqlite3.Error)
        # The deferred switch exists only for the test proving the harness catches it.
        begin = "BEGIN" if faults.DEFERRED_WRITES else "BEGIN IMMEDIATE"
        self.write_engine = engine.execution_options(jobcoord_begin=begin)
        # A deferred BEGIN: the snapshot starts at the first read and holds to the end.
        self.read_engine = engine
        self._writers = ConnectionStack(self.write_engine)
        self._readers = ConnectionStack(self.read_engine)
        self._group = GroupCommit()
        #: (device, inode) of the file at the path when this process first used it: the
        #: kept connections hold that file open, whatever is put at the path later.
        self._file: tuple[int, int] | None = None

        @event.listens_for(engine, "engine_disposed")
        def _forget(_engine: Engine) -> None:
            # Disposing the engine means "no old connection from here on": the stacks too.
            self._writers.forget()
            self._readers.forget()

    def _same_file(self) -> None:
        """Refuse to go on with a file no longer at the path (replaced, or removed): the
        kept connections would read and write it still, deleted, where no other process
        sees it (a worker completing jobs nobody can ever read). One stat per transaction."""
        path = self.target.sqlite_path
        if path is None:
            return
        try:
            st = os.stat(path)
            found: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            found = None
        except OSError:
            return  # SQLite says what is wrong with it
        if self._file is None:
            self._file = found
        elif found != self._file:
            raise DatabaseCorrupt(
                "database_replaced", f"the database file {path} was "
                + ("removed" if found is None else "replaced by another file")
                + " while this process had it open; its open connections reach only the "
                "old file, so nothing more is read or written through them: start this "
                "process again (a database in use is never replaced or removed, see "
                "`restore`)", path=path)

    def _attempt(self, fn: Callable[[Connection], T], where: str, write: bool) -> T:
        self._same_file()
        if not write:
            return super()._attempt(fn, where, write)
        # Threads of this process queue here and their writes commit in groups (GroupCommit):
        # one BEGIN IMMEDIATE and one fsync for every write queued at that moment, and the
        # next group begins the instant the previous one commits. Left to SQLite, they would
        # poll the write lock in its busy handler's sleeps (1, 2, 5, ... 100 ms), each with a
        # commit of its own.
        return self._group.run(fn, self.try_wait(), self._commit_group)

    def _commit_group(self, batch: list[_Call]) -> None:
        """Run `batch` in one write transaction and set each call's outcome. Alone, a call
        runs as it always has (its exception ends the transaction). In a group each runs in
        a savepoint: an exception rolls back its own changes, the others commit. A driver
        error ends the whole group uncommitted: the call that met it (every call, when it
        came from BEGIN or COMMIT) gets the error, the others run again."""
        culprit: _Call | None = None
        try:
            with super()._begin(True) as conn:
                if len(batch) == 1:
                    culprit = batch[0]
                    batch[0].result = batch[0].fn(conn)
                else:
                    raw = conn.connection.driver_connection
                    for call in batch:
                        culprit = call
                        raw.execute("SAVEPOINT jobcoord_call")
                        try:
                            call.result = call.fn(conn)
                        except self._driver_errors:
                            raise
                        except Exception as e:  # to its own caller; the group goes on
                            call.error = e
                            raw.execute("ROLLBACK TO jobcoord_call")
                        raw.execute("RELEASE jobcoord_call")
                culprit = None
                for call in batch:
                    call.committing = True
        except Exception as e:
            for call in batch:
                call.result = None
                if culprit is None or call is culprit:
                    call.error = e
                else:
                    call.error, call.again = None, True

    @classmethod
    def open_file(cls, target: Target, *, create: bool = False, synchronous: str = "full",
                  busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                  busy_retries: int = DEFAULT_RETRIES, frozen: bool = False
                  ) -> SqliteDatabase:
        assert target.sqlite_path is not None
        existed = precheck_sqlite_path(target.sqlite_path, create=create)
        if create and not existed:
            create_private_file(target.sqlite_path)
        engine = _sqlite_engine(target.sqlite_path, create=create, synchronous=synchronous,
                                busy_timeout=busy_timeout, frozen=frozen)
        return cls(target, engine, busy_retries=busy_retries, busy_timeout=busy_timeout)

    # -- the core's operations --

    def binary_collation(self) -> str:
        return "BINARY"

    def lock_for_decision(self, conn: Connection, job_id: int) -> None:
        pass  # BEGIN IMMEDIATE already excludes every other writer

    def read_owned(self, conn: Connection, job_id: int) -> Any:
        return self.run(conn, s.OWNED, {"job_id": job_id}).fetchone()

    def candidate_sql(self, roles: Sequence[str], kinds: Sequence[str] | None, *,
                      due_only: bool, locked: bool = True, tenant: str | None = None
                      ) -> tuple[s.SQL, dict[str, Any]]:
        # No lock clause: BEGIN IMMEDIATE holds the only write lock.
        return s.candidate_sql(roles, kinds, due_only=due_only, locked=False, tenant=tenant)

    def take_next(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None, batch: int = 1) -> Taken:
        stmt, params = self.candidate_sql(roles, kinds, due_only=True, tenant=tenant)
        params.update(now=now, maxp=max_priority)
        found = self.run(conn, stmt, params).fetchone()
        if found is None:
            return Taken(0, False, None)
        # None cannot happen under the write lock; the guard is defence in depth.
        return Taken(1, True, self.take_job(conn, found[0], worker=worker, now=now,
                                            expires=expires, expires_iso=expires_iso))

    def take_many(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, n: int, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None) -> list[tuple[Any, ...]]:
        # One statement picks and takes the first n in claim order (BEGIN IMMEDIATE holds the
        # only write lock); the leases and events follow as one executemany each.
        stmt, params = s.take_many_sql(roles, kinds, tenant)
        params.update(now=now, maxp=max_priority, n=n, f=False)
        got = sorted(self.run(conn, stmt, params).fetchall(),
                     key=lambda r: (r[2], r[8], r[0]))
        if not got:
            return []
        faults.point("claim.after_take")
        self.run_many(conn, s.INSERT_LEASE, [
            {"job_id": r[0], "worker": worker, "epoch": r[6], "now": now, "expires": expires}
            for r in got])
        faults.point("claim.after_lease")
        self.run_many(conn, s.INSERT_EVENT, [
            {"job_id": r[0], "now": now, "from_status": "waiting", "to_status": "running",
             "reason": "claimed", "worker": worker, "epoch": r[6],
             "detail": dumps({"expires_at": expires_iso, "attempt": r[4]})} for r in got])
        faults.point("claim.after_event")
        return [tuple(r[:8]) for r in got]

    def hold_worker(self, conn: Connection, worker_id: str) -> None:
        pass  # BEGIN IMMEDIATE already serialises every claim

    def hold_limit(self, conn: Connection, kind: str, *, wait: bool
                   ) -> tuple[bool, tuple[Any, ...] | None]:
        # BEGIN IMMEDIATE already serialises every claim: the limits it read are current.
        return True, None

    def take_job(self, conn: Connection, job_id: int, *, worker: str, now: int, expires: int,
                 expires_iso: str) -> tuple[Any, ...] | None:
        job = self.run(conn, s.TAKE_JOB, {"job_id": job_id, "now": now, "f": False}
                       ).fetchone()
        if job is None:
            return None
        faults.point("claim.after_take")
        job_id, epoch, attempts = job[0], job[6], job[4]
        self.run(conn, s.INSERT_LEASE, {"job_id": job_id, "worker": worker, "epoch": epoch,
                                        "now": now, "expires": expires})
        faults.point("claim.after_lease")
        self.run(conn, s.INSERT_EVENT, {
            "job_id": job_id, "now": now, "from_status": "waiting", "to_status": "running",
            "reason": "claimed", "worker": worker, "epoch": epoch,
            "detail": dumps({"expires_at": expires_iso, "attempt": attempts})})
        faults.point("claim.after_event")
        return tuple(job)

    def end_running(self, conn: Connection, params: Mapping[str, Any], *, reason: str,
                    worker: str | None, detail: str | None) -> int:
        updated: int = self.run(conn, s.FINISH, params).rowcount
        if updated != 1:
            return updated
        # Fault points are named by the reason: completed.*, failed.*, lease_expired.*, ...
        faults.point(f"{reason}.after_update")
        self.run(conn, s.DROP_LEASE, {"job_id": params["job_id"], "epoch": params["epoch"]})
        faults.point(f"{reason}.after_drop_lease")
        self.run(conn, s.INSERT_EVENT, {
            "job_id": params["job_id"], "now": params["now"], "from_status": "running",
            "to_status": params["to_status"], "reason": reason, "worker": worker,
            "epoch": params["epoch"], "detail": detail})
        faults.point(f"{reason}.after_event")
        return updated

    def allocate_job_ids(self, conn: Connection, n: int) -> Sequence[int]:
        # BEGIN IMMEDIATE holds the only write lock: these are the ids SQLite would pick.
        first = self.run(conn, s.LAST_JOB_ID, {}).fetchone()[0] + 1
        return range(first, first + n)

    def insert_enqueued(self, conn: Connection, ids: Sequence[int], now: int, detail: str
                        ) -> None:
        if isinstance(ids, range) and ids.step == 1 and len(ids):
            # `allocate_job_ids`' range, under the write lock: the rows with these ids are
            # this batch's and no other's.
            self.run(conn, s.INSERT_ENQUEUED_RANGE,
                     {"now": now, "detail": detail, "first": ids[0], "last": ids[-1]})
            return
        super().insert_enqueued(conn, ids, now, detail)

    def expired_leases(self, conn: Connection, now: int, limit: int) -> list[Any]:
        return self.run(conn, s.EXPIRED_LEASES, {"now": now, "limit": limit}).all()

    def overdue_waiting(self, conn: Connection, now: int, limit: int) -> list[Any]:
        return self.run(conn, s.OVERDUE_WAITING, {"now": now, "limit": limit}).all()

    def pick_for_delete(self, conn: Connection, select: s.SQL, params: Mapping[str, Any]
                        ) -> list[Any]:
        # BEGIN IMMEDIATE holds the only write lock (the compiler writes no row lock).
        return self.run(conn, select, params).all()

    def change_waiter(self) -> ChangeWaiter:
        return DataVersionWaiter(self.target.sqlite_path or "", self.busy_timeout)

    # -- the tools' operations --

    def schema_object_names(self, conn: Connection) -> set[str]:
        return {r[0] for r in conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type IN ('index', 'trigger')").all()}

    def triggers(self, conn: Connection) -> list[tuple[str, str]]:
        # Table names know no case here (ON "JOBS" is on jobs): answered as jobcoord names
        # them. lower() folds ASCII only, as SQLite's names do.
        return [(r[0], r[1]) for r in conn.exec_driver_sql(
            "SELECT lower(tbl_name), name FROM sqlite_master WHERE type = 'trigger' "
            "ORDER BY tbl_name, name").all()]

    def key_columns(self, conn: Connection, table: str
                    ) -> tuple[frozenset[str], set[frozenset[str]]]:
        # SQLite's own lists: the inspector skips expression indexes with a warning, and
        # would count a partial unique index as a key.
        # table_info's pk column numbers the primary key's columns (0: not in it). A PRAGMA
        # takes no bound parameter: the names are quoted as identifiers.
        quoted = conn.dialect.identifier_preparer.quote_identifier
        pk = frozenset(r[1] for r in conn.exec_driver_sql(
            f"PRAGMA table_info({quoted(table)})").all() if r[5])
        uniques = {frozenset(r[2] for r in conn.exec_driver_sql(
                       f"PRAGMA index_info({quoted(index[1])})").all())
                   for index in conn.exec_driver_sql(
                       f"PRAGMA index_list({quoted(table)})").all()
                   if index[2] and not index[4]}
        return pk, uniques

    def trigger_texts(self, conn: Connection) -> dict[str, str]:
        return {r[0]: r[1] or "" for r in conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
            "AND lower(tbl_name) = 'jobs'").all()}

    def check_constraints(self, conn: Connection, table: str) -> dict[str, str | None]:
        from sqlalchemy import inspect

        return {str(c["name"]): " ".join(str(c["sqltext"]).split())
                for c in inspect(conn).get_check_constraints(table) if c.get("name")}

    def unique_indexes(self, conn: Connection, table: str
                       ) -> dict[str, frozenset[str] | None]:
        # index_list's origin: "c" made by CREATE INDEX, "u" by a UNIQUE in the table's
        # definition (named sqlite_autoindex_*), "pk" the primary key's. The inspector
        # would skip expression indexes with a warning.
        quoted = conn.dialect.identifier_preparer.quote_identifier
        found: dict[str, frozenset[str] | None] = {}
        for r in conn.exec_driver_sql(f"PRAGMA index_list({quoted(table)})").all():
            if r[2] and r[3] in ("c", "u"):
                columns = [c[2] for c in conn.exec_driver_sql(
                    f"PRAGMA index_info({quoted(r[1])})").all()]
                found[str(r[1])] = None if None in columns else frozenset(columns)
        return found

    def integrity_check(self, conn: Connection, *, full: bool = False
                        ) -> tuple[list[str], list[list[Any]]]:
        return self.page_check(conn, full=full), self.foreign_key_violations(conn)

    def foreign_key_violations(self, conn: Connection,
                               tables: Sequence[Table] | None = None) -> list[list[Any]]:
        """Rows whose key points at no row (a job deleted by hand, its events left):
        SQLite enforces foreign keys only on connections that ask, and its shell does not.
        [table, rowid, parent table, key number] each. A table made again without its
        foreign key is found by `check`'s schema look."""
        # Of jobcoord's tables only (or of `tables`): a table of one's own beside them is
        # the owner's, its keys too (an orphan there made `backup` refuse the database).
        # Asked table by table: the whole file's check read every orphan of the owner's
        # tables too, however many, only to drop them. Of `main`: a temporary table of the
        # same name would be looked at instead.
        from ..schema import metadata

        present = {r[0] for r in conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'table'").all()}
        quote = conn.dialect.identifier_preparer.quote_identifier
        rows: list[list[Any]] = []
        for table in metadata.sorted_tables if tables is None else tables:
            if table.name in present:
                rows += [list(r) for r in conn.exec_driver_sql(
                    f"PRAGMA main.foreign_key_check({quote(table.name)})").all()]
        return rows

    def page_check(self, conn: Connection, *, full: bool = False) -> list[str]:
        """SQLite's own check of the file's pages (quick_check, or integrity_check when
        `full`): ["ok"] when whole."""
        return sqlite_pragma(self, conn, "integrity_check" if full else "quick_check")

    def data_version(self, conn: Connection) -> int:
        """Changes only when another connection commits: whether a snapshot is still what
        this connection read."""
        return int(conn.exec_driver_sql("PRAGMA data_version").scalar_one())

    def prepare_for_migration(self) -> None:
        # journal_mode persists in the file; it must be set outside a transaction, and a
        # filesystem without shared memory (a network mount) silently keeps the old mode.
        # Switching needs an exclusive lock, and SQLite answers BUSY at once, without its
        # busy handler, when another process holds the file (a concurrent migrate creating
        # the same new database): wait and try again, up to the busy timeout.
        from .base import classify

        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                with self.engine.connect() as conn:
                    raw = conn.connection.dbapi_connection
                    assert raw is not None
                    mode = raw.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except (sqlite3.Error, DBAPIError) as e:
                err = classify(e, "switching to WAL mode")
                if err.code != "database_locked" or time.monotonic() > deadline:
                    raise err from e
                time.sleep(0.05)
        if str(mode).lower() != "wal":
            raise StorageUnavailable(
                "database_unavailable",
                f"this filesystem does not support WAL mode (got {mode!r}); SQLite databases "
                "must be on a local disk, not a network filesystem",
            )

    @contextlib.contextmanager
    def migration_transaction(self, conn: Connection) -> Iterator[None]:
        # Rebuilding a referenced table with foreign keys on would fire ON DELETE CASCADE on
        # its children; the pragma only takes effect outside a transaction. The write
        # engine's BEGIN IMMEDIATE makes a concurrent migrate wait.
        raw = conn.connection.dbapi_connection
        assert raw is not None
        raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                yield
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    raise SchemaMismatch(
                        "migration_failed",
                        f"migration left {len(broken)} broken foreign keys; rolled back",
                    )
        finally:
            raw.execute("PRAGMA foreign_keys=ON")

    def storage_facts(self, conn: Connection) -> dict[str, Any]:
        sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
        return {"dialect": self.dialect,
                "journal_mode": conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
                "synchronous": {0: "off", 1: "normal", 2: "full", 3: "extra"}.get(sync)}

    def file_facts(self) -> dict[str, Any]:
        path = self.target.sqlite_path or ""
        wal = path + "-wal"
        out: dict[str, Any] = {
            "path": path, "file_size_bytes": os.path.getsize(path),
            "wal_size_bytes": os.path.getsize(wal) if os.path.exists(wal) else 0,
            "sqlite_version": sqlite3.sqlite_version}
        if sqlite3.sqlite_version_info < (3, 51, 3):
            # SQLite 3.7.0 to 3.51.2 can, rarely, corrupt a WAL database when two
            # connections write or checkpoint at the same instant (fixed in 3.51.3).
            out["warnings"] = [
                f"SQLite {sqlite3.sqlite_version} predates the fix for the WAL-reset bug "
                "(3.51.3); keep backups with `jobcoord backup` and run `jobcoord check`"]
        return out
