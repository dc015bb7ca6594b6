"""Engine and transactions: how jobcoord opens its two databases and runs a transaction.

Here: how a connection is set up, how a write transaction begins (`BEGIN IMMEDIATE` on
SQLite, plain `BEGIN` on PostgreSQL), how reads get one consistent snapshot, how connections
are shared by any number of threads, how driver errors map to jobcoord's errors, and the
bounded retry when the database stays busy. Callers see `Database.write(fn)` /
`Database.read(fn)`. (The statements that differ per dialect still live in the service.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, CursorResult, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import NullPool, QueuePool

from .errors import (
    DatabaseBusy,
    DatabaseCorrupt,
    JobcoordError,
    SchemaMismatch,
    StorageUnavailable,
)

T = TypeVar("T")

#: Revisions of the core branch, oldest first. The last one is what this code expects.
CORE_REVISIONS = ("c0001", "c0002", "c0003")
#: Revisions of optional branches, oldest first.
OPTIONAL_REVISIONS = {"artifacts": ("a0001",)}

SYNCHRONOUS_LEVELS = ("full", "normal")
DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_RETRIES = 4  # attempts in all, when the busy timeout runs out anyway


class SQL:
    """One fixed statement written once with `:name` parameters, kept in the paramstyle of
    each driver so the hot path can hand it straight to the DB-API cursor."""

    __slots__ = ("postgresql", "sqlite")

    def __init__(self, text: str) -> None:
        assert "%" not in text, "psycopg would read % as a placeholder"
        self.sqlite = text
        self.postgresql = re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", r"%(\1)s", text)

    @classmethod
    def cached(cls, text: str) -> SQL:
        """The SQL for a statement assembled at run time, translated once per distinct text
        (the translation costs more than running a small statement)."""
        stmt = _SQL_CACHE.get(text)
        if stmt is None:
            if len(_SQL_CACHE) >= 512:  # texts are few shapes, but never grow without bound
                _SQL_CACHE.clear()
            stmt = _SQL_CACHE[text] = cls(text)
        return stmt


_SQL_CACHE: dict[str, SQL] = {}


@dataclass
class Stats:
    """Counters a caller (the contention tests, the benchmarks) can read after a run."""

    busy_retries: int = 0
    busy_failures: int = 0
    # Busy errors by SQLite error name (or SQLSTATE): SQLITE_BUSY_SNAPSHOT means a deferred
    # transaction tried to upgrade to a write, which BEGIN IMMEDIATE never does.
    busy_errors: dict[str, int] = field(default_factory=dict)
    # SQLite busy errors that came back well before the busy timeout ran out. SQLite answers
    # at once, without waiting, when a transaction that began as a reader tries to write while
    # another connection writes: the signature of a write started with a deferred BEGIN. A
    # BEGIN IMMEDIATE waits out the busy timeout first, so this stays 0.
    busy_unwaited: int = 0


@dataclass(frozen=True)
class Target:
    """Where the coordinator's state lives."""

    url: str
    sqlite_path: str | None = None  # absolute path for SQLite files

    @property
    def dialect(self) -> str:
        return "sqlite" if self.sqlite_path is not None else "postgresql"

    def display(self) -> str:
        if self.sqlite_path is not None:
            return self.sqlite_path
        return make_url(self.url).render_as_string(hide_password=True)


def resolve_target(db: str | None = None, url: str | None = None) -> Target:
    """Turn `--db PATH` / `--url URL` / `JOBCOORD_URL` into a Target (default ./jobcoord.db)."""
    from .errors import InvalidInput

    if db is not None and url is not None:
        raise InvalidInput("invalid_input", "give either --db or --url, not both")
    if url is None and db is None:
        url = os.environ.get("JOBCOORD_URL") or None
    if url is None:
        path = db if db is not None else "jobcoord.db"
        if not path or "\x00" in path:
            raise InvalidInput("invalid_input", "--db must be a file path")
        path = os.path.abspath(path)
        # Quoted by URL.create: a raw "sqlite:///" + path would read "?" as the start of the
        # query and "#" as a fragment, and name another file.
        return Target(url=URL.create("sqlite", database=path).render_as_string(),
                      sqlite_path=path)
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise InvalidInput("invalid_input", f"not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
    if backend == "postgres":  # Heroku-style URLs name the scheme without "ql"
        parsed = parsed.set(drivername="postgresql+psycopg")
        backend = "postgresql"
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise InvalidInput("invalid_input", "a SQLite URL must name a file")
        return Target(url=url, sqlite_path=os.path.abspath(parsed.database))
    if backend == "postgresql":
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        return Target(url=parsed.render_as_string(hide_password=False))
    raise InvalidInput(
        "invalid_input",
        f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///PATH or "
        "postgresql+psycopg://USER@HOST/DB",
    )


# --- error classification --------------------------------------------------------------

_SQLITE_CODES: tuple[tuple[str, type[JobcoordError], str, str], ...] = (
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
        "probably full",
    ),
    ("SQLITE_IOERR", StorageUnavailable, "database_io_error", "disk I/O error"),
    ("SQLITE_CANTOPEN", StorageUnavailable, "database_unavailable", "cannot open the database"),
    ("SQLITE_PERM", StorageUnavailable, "database_readonly", "permission denied"),
    ("SQLITE_NOTADB", DatabaseCorrupt, "database_corrupt", "the file is not a database"),
    ("SQLITE_CORRUPT", DatabaseCorrupt, "database_corrupt", "the database is malformed"),
)

_PG_STATES: dict[str, tuple[type[JobcoordError], str, str]] = {
    "40001": (DatabaseBusy, "database_locked", "serialization failure"),
    "40P01": (DatabaseBusy, "database_locked", "deadlock detected"),
    "55P03": (DatabaseBusy, "database_locked", "lock not available"),
    "53100": (StorageUnavailable, "database_full", "the database server's disk is full"),
    "25006": (StorageUnavailable, "database_readonly", "the database is read-only"),
    "42P01": (SchemaMismatch, "not_migrated", "a table is missing"),
}


def classify(exc: BaseException, where: str = "") -> JobcoordError:
    """Map a driver error to jobcoord's hierarchy by SQLite's error name or PostgreSQL's
    SQLSTATE, never by message text."""
    orig = getattr(exc, "orig", exc)
    suffix = f" ({where})" if where else ""
    if isinstance(orig, PoolTimeout):
        return DatabaseBusy(
            "connections_exhausted",
            f"every connection to the database is in use{suffix}; nothing was changed, try "
            "again",
        )
    name = getattr(orig, "sqlite_errorname", None)
    if name:
        for prefix, cls, code, text in _SQLITE_CODES:
            if name.startswith(prefix):
                return cls(code, f"{text}{suffix} [{name}]", sqlite_error=name)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate and sqlstate in _PG_STATES:
        cls, code, text = _PG_STATES[sqlstate]
        return cls(code, f"{text}{suffix} [SQLSTATE {sqlstate}]", sqlstate=sqlstate)
    if sqlstate and (sqlstate[:2] == "08" or sqlstate in ("57P01", "57P02", "57P03")):
        # Connection lost, or the server shutting down or starting (a restart): transient.
        return StorageUnavailable(
            "database_unavailable", f"lost the database connection{suffix}: "
            f"{str(orig).strip()} [SQLSTATE {sqlstate}]", sqlstate=sqlstate)
    if any(c.__module__.startswith("psycopg") and c.__name__ == "OperationalError"
           for c in type(orig).__mro__):
        return StorageUnavailable(
            "database_unavailable", f"cannot reach the database{suffix}: {str(orig).strip()}"
        )
    return JobcoordError("internal_error", f"database error{suffix}: {orig}")


# --- engine ----------------------------------------------------------------------------


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

    # NullPool: Database keeps its own small stack of open connections (_ConnectionCache);
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


# --- time on PostgreSQL --------------------------------------------------------------------
#
# One clock judges every lease on both databases: the coordinator's own clock (clock.py),
# read by the process making the call and bound into SQL as a parameter, never SQL's now().
# On PostgreSQL that process may run on any of several hosts, so the server's clock is used as
# the reference they must all agree with: every new connection measures this host's offset
# from clock_timestamp() and refuses to work when it exceeds MAX_CLOCK_SKEW_S (exit 6,
# clock_skew). Why not let the server's clock judge instead: the same statements and the same
# rules then run on both databases, freezegun controls time in the PostgreSQL half of the
# suite exactly as in the SQLite half, and safety never depended on clocks anyway (fencing
# epochs and compare-and-set updates do); a clock only decides *when* a lease counts as
# expired, and the check bounds how far two hosts can disagree about that.

#: Largest tolerated distance between this host's clock and the server's, in seconds; a
#: fraction of the shortest sensible lease. Override with JOBCOORD_MAX_CLOCK_SKEW.
MAX_CLOCK_SKEW_S = 1.0


def clock_skew_refusal(offset_s: float, uncertainty_s: float, limit_s: float
                       ) -> JobcoordError | None:
    """The refusal when the measured offset is certainly beyond the limit, else None."""
    if abs(offset_s) - uncertainty_s <= limit_s:
        return None
    side = "ahead of" if offset_s < 0 else "behind"
    return StorageUnavailable(
        "clock_skew",
        f"this host's clock is {abs(offset_s):.3f}s {side} the database server's (the limit "
        f"is {limit_s:g}s); leases would expire at different times on different hosts. Sync "
        "the clocks (NTP) or raise JOBCOORD_MAX_CLOCK_SKEW",
        offset_s=round(offset_s, 6),
    )


def _max_clock_skew() -> float:
    raw = os.environ.get("JOBCOORD_MAX_CLOCK_SKEW")
    if raw is None:
        return MAX_CLOCK_SKEW_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        from .errors import InvalidInput

        raise InvalidInput("invalid_input", "JOBCOORD_MAX_CLOCK_SKEW must be seconds in 0..3600")
    return value


#: How often a connection's clock offset is measured again, seconds. A host whose clock steps
#: after connecting is noticed within this long on its next transaction.
SKEW_RECHECK_S = 30.0
#: PostgreSQL connections kept open per process, and how many more may be opened under load.
PG_POOL_SIZE = 5
PG_POOL_OVERFLOW = 15


def _host_time() -> float:
    """This host's wall clock for the skew check: the system clock itself, not
    datetime.now(), so a test's frozen clock does not trip it (tests replace this function
    to simulate a host whose clock stepped)."""
    return time.clock_gettime(time.CLOCK_REALTIME)


def _measure_clock(dbapi_conn: Any, info: dict[str, Any], limit: float) -> None:
    """Measure this host's clock against the server's on one connection (outside any
    transaction) and refuse to use it when they differ by more than `limit` seconds."""
    before = _host_time()
    with dbapi_conn.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        server = float(cur.fetchone()[0])
    after = _host_time()
    dbapi_conn.rollback()
    offset = server - (before + after) / 2
    info["clock_offset_s"] = offset
    info["clock_measured_at"] = time.monotonic()
    refusal = clock_skew_refusal(offset, (after - before) / 2, limit)
    if refusal is not None:
        # Measure again on the next use: a refused connection must never count as checked.
        info["clock_measured_at"] = float("-inf")
        raise refusal


def _pg_engine(url: str) -> Engine:
    limit = _max_clock_skew()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise StorageUnavailable(
            "driver_missing",
            "the PostgreSQL driver is not installed; install jobcoord with its postgresql "
            "extra: pip install 'jobcoord[postgresql]'",
        ) from None
    # A bounded pool: each transaction checks a connection out and gives it back, so any
    # number of threads share at most PG_POOL_SIZE + PG_POOL_OVERFLOW connections; recycled
    # hourly.
    engine = create_engine(url, poolclass=QueuePool, pool_size=PG_POOL_SIZE,
                           max_overflow=PG_POOL_OVERFLOW, pool_timeout=30, pool_pre_ping=False,
                           pool_recycle=3600, connect_args={"application_name": "jobcoord"})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        _measure_clock(dbapi_conn, record.info, limit)

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # The offset is measured again on a timer, so a clock that steps after the
        # connection opened is caught within SKEW_RECHECK_S, before this connection judges
        # (or reaps) another host's leases with it.
        measured = record.info.get("clock_measured_at", float("-inf"))
        if time.monotonic() - measured >= SKEW_RECHECK_S:
            _measure_clock(dbapi_conn, record.info, limit)

    return engine


def precheck_sqlite_path(path: str, *, create: bool) -> bool:
    """Refuse paths SQLite cannot use, before SQLite touches anything. Returns whether the
    file already exists."""
    parent = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise StorageUnavailable("database_unavailable", f"{path} is a directory, not a database")
    exists = os.path.exists(path)
    if not exists:
        try:
            os.stat(parent)
        except PermissionError:
            raise StorageUnavailable(
                "database_unavailable", f"cannot reach {path}: permission denied on {parent}"
            ) from None
        except OSError:
            pass
        if not os.path.isdir(parent):
            raise StorageUnavailable(
                "database_unavailable", f"cannot create {path}: directory {parent} does not exist"
            )
        if not create:
            raise SchemaMismatch(
                "not_migrated", f"no database at {path}; run `jobcoord migrate` to create it"
            )
    return exists


def create_private_file(path: str) -> bool:
    """Create an empty database file readable and writable by its owner only (0600).
    Returns whether this call created it (False: it already existed)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except PermissionError as e:
        raise StorageUnavailable(
            "database_readonly", f"cannot create {path}: the directory is not writable"
        ) from e
    except OSError as e:
        code = "database_full" if e.errno == errno.ENOSPC else "database_unavailable"
        raise StorageUnavailable(code, f"cannot create {path}: {e.strerror}") from e
    os.close(fd)
    return True


class _ConnectionCache:
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
                if self._pid == os.getpid() and len(self._idle) < self.keep:
                    self._idle.append(conn)
                    return
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


class _EngineConnections:
    """A connection per transaction straight from the engine's own bounded pool
    (PostgreSQL: a network round trip costs far more than the checkout)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def take(self) -> Connection:
        return self.engine.connect()

    def give(self, conn: Connection, healthy: bool) -> None:
        if not healthy:
            with contextlib.suppress(Exception):
                conn.invalidate()
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        pass


@dataclass
class Database:
    """An open coordinator database: an engine, its dialect, and transaction helpers.

    Safe to share between any number of threads: every transaction runs on a connection
    that no other thread uses until it ends."""

    target: Target
    engine: Engine
    busy_retries: int = DEFAULT_RETRIES
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    stats: Stats = field(default_factory=Stats)
    write_engine: Engine = field(init=False)
    read_engine: Engine = field(init=False)
    _local: threading.local = field(init=False, repr=False)
    _writers: _ConnectionCache | _EngineConnections = field(init=False, repr=False)
    _readers: _ConnectionCache | _EngineConnections = field(init=False, repr=False)
    _stats_lock: threading.Lock = field(init=False, repr=False)
    _driver_errors: tuple[type[BaseException], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from . import faults

        self._local = threading.local()
        self._stats_lock = threading.Lock()
        if self.is_sqlite:
            self._driver_errors = (DBAPIError, PoolTimeout, sqlite3.Error)
            # The deferred switch exists only for the test proving the harness catches it.
            begin = "BEGIN" if faults.DEFERRED_WRITES else "BEGIN IMMEDIATE"
            self.write_engine = self.engine.execution_options(jobcoord_begin=begin)
            # A deferred BEGIN: the snapshot starts at the first read and holds to the end.
            self.read_engine = self.engine
            self._writers = _ConnectionCache(self.write_engine)
            self._readers = _ConnectionCache(self.read_engine)

            @event.listens_for(self.engine, "engine_disposed")
            def _forget(_engine: Engine) -> None:
                # Disposing the engine means "no old connection from here on": the stacks too.
                self._writers.close()
                self._readers.close()
        else:
            import psycopg

            self._driver_errors = (DBAPIError, PoolTimeout, psycopg.Error)
            self.write_engine = self.engine
            # One snapshot for every statement of a read (READ COMMITTED would give each
            # statement its own): `explain` must never see a running job without its lease.
            self.read_engine = self.engine.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True)
            self._writers = _EngineConnections(self.write_engine)
            self._readers = _EngineConnections(self.read_engine)

    @classmethod
    def open(
        cls,
        target: Target,
        *,
        create: bool = False,
        synchronous: str = "full",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        busy_retries: int = DEFAULT_RETRIES,
        frozen: bool = False,
    ) -> Database:
        if target.sqlite_path is not None:
            existed = precheck_sqlite_path(target.sqlite_path, create=create)
            if create and not existed:
                create_private_file(target.sqlite_path)
            engine = _sqlite_engine(
                target.sqlite_path,
                create=create,
                synchronous=synchronous,
                busy_timeout=busy_timeout,
                frozen=frozen,
            )
        else:
            engine = _pg_engine(target.url)
        return cls(target=target, engine=engine, busy_retries=busy_retries,
                   busy_timeout=busy_timeout)

    @property
    def dialect(self) -> str:
        return self.target.dialect

    @property
    def is_sqlite(self) -> bool:
        return self.target.sqlite_path is not None

    def close(self) -> None:
        self._writers.close()
        self._readers.close()
        self.engine.dispose()

    # -- statements --

    def run(self, conn: Connection, stmt: SQL, params: Mapping[str, Any] | None = None
            ) -> CursorResult[Any]:
        """Execute a fixed statement in the driver's own paramstyle."""
        text = stmt.sqlite if self.is_sqlite else stmt.postgresql
        return conn.exec_driver_sql(text, dict(params) if params else {})

    def execute(self, conn: Connection, stmt: SQL, params: Mapping[str, Any]) -> Any:
        """The hot path's statements (claim, complete, fail): a fixed statement straight on
        the DB-API connection inside the transaction SQLAlchemy began, skipping its result
        machinery (ten times the cost of the statement itself). Returns the DB-API cursor:
        fetchone(), fetchall(), rowcount, iteration. Driver errors are classified by
        `_transaction` like SQLAlchemy's."""
        text = stmt.sqlite if self.is_sqlite else stmt.postgresql
        direct = getattr(self._local, "direct", None)
        if direct is not None and direct[0] is conn:
            return direct[1].execute(text, params)
        # Watched (tracing, a test) or not begun by `_begin`: SQLAlchemy's path, whose
        # CursorResult answers fetchone(), fetchall(), rowcount and iteration alike.
        return conn.exec_driver_sql(text, dict(params))

    def execute_many(self, conn: Connection, stmt: SQL, rows: Sequence[Mapping[str, Any]]
                     ) -> None:
        """`execute` for many parameter sets at once (the driver's executemany)."""
        text = stmt.sqlite if self.is_sqlite else stmt.postgresql
        direct = getattr(self._local, "direct", None)
        if direct is not None and direct[0] is conn:
            direct[1].cursor().executemany(text, rows)
        else:
            conn.exec_driver_sql(text, [dict(r) for r in rows])

    def run_text(self, conn: Connection, text: str, params: Mapping[str, Any] | None = None
                 ) -> CursorResult[Any]:
        """Execute a statement assembled at run time (still parameterized)."""
        return self.run(conn, SQL.cached(text), params)

    def lock_clause(self) -> str:
        """Row locking for a claim's candidate select. SQLite needs none: BEGIN IMMEDIATE
        already holds the only write lock. PostgreSQL locks the candidate row and lets
        concurrent claimers skip it instead of waiting."""
        return "" if self.is_sqlite else " FOR UPDATE SKIP LOCKED"

    @property
    def folds_transitions(self) -> bool:
        """Whether a transition of the hot path runs as one statement (PostgreSQL) or as the
        separate statements it is made of (SQLite).

        On PostgreSQL every statement is a round trip to the server, and a claim and a
        completion were six each: candidate, take, lease and event become one data-modifying
        `WITH` statement, and so do finish, drop lease and event. The transaction and every
        compare-and-set guard are the same, so the rows written are the same. On SQLite the
        statements are calls into the same process, and `BEGIN IMMEDIATE` already serialises
        the writers, so nothing is folded."""
        return not self.is_sqlite

    def binary_collation(self) -> str:
        """The collation that orders text by code point on this dialect (byte order of
        UTF-8), so both databases sort the same keys the same way."""
        return "BINARY" if self.is_sqlite else "C"

    # -- transactions --

    def write(self, fn: Callable[[Connection], T], where: str = "") -> T:
        """Run `fn` in one write transaction (BEGIN IMMEDIATE on SQLite), retrying the whole
        transaction a bounded number of times, with jitter, if the database stays busy.

        If `fn` returns a JobcoordError instead of raising it, the transaction commits (so a
        refusal can be recorded as an event) and the error is raised afterwards. Called from
        inside a transaction of this thread, `fn` joins that transaction (no retry of its
        own: the outer one retries as a whole)."""
        return self._transaction(fn, where, write=True)

    def read(self, fn: Callable[[Connection], T], where: str = "") -> T:
        """Run `fn` in a read transaction: one consistent snapshot for all its statements
        (SQLite: a deferred BEGIN, which takes no write lock; PostgreSQL: REPEATABLE READ,
        READ ONLY)."""
        return self._transaction(fn, where, write=False)

    @contextlib.contextmanager
    def _begin(self, write: bool) -> Iterator[Connection]:
        cache = self._writers if write else self._readers
        conn = cache.take()
        healthy = False
        self._local.conn, self._local.writing = conn, write
        try:
            with conn.begin(), self._direct(conn):
                yield conn
            healthy = True
        except JobcoordError:
            healthy = True  # a rule's refusal: rolled back, the connection is fine
            raise
        finally:
            # After a driver error the connection may be half-begun: never reuse it.
            self._local.conn = None
            cache.give(conn, healthy)

    @contextlib.contextmanager
    def _direct(self, conn: Connection) -> Iterator[None]:
        """Let `execute` use this connection's driver directly while its transaction runs,
        unless someone listens to its statements. Decided once per transaction: asking
        SQLAlchemy's event registry per statement costs more than the statement."""
        local = self._local
        outer = getattr(local, "direct", None)
        local.direct = (None if conn.dispatch.before_cursor_execute
                        else (conn, conn.connection.driver_connection))
        try:
            yield
        finally:
            local.direct = outer

    def _count_busy(self, err: JobcoordError, started: float) -> None:
        name = err.details.get("sqlite_error") or err.details.get("sqlstate") or "?"
        with self._stats_lock:
            self.stats.busy_errors[name] = self.stats.busy_errors.get(name, 0) + 1
            if self.is_sqlite and time.monotonic() - started < self.busy_timeout / 2:
                self.stats.busy_unwaited += 1

    def _transaction(self, fn: Callable[[Connection], T], where: str, *, write: bool) -> T:
        outer = getattr(self._local, "conn", None)
        if outer is not None:
            # Nested in a transaction of this thread: join it. A write inside a read cannot
            # (SQLite would upgrade a reader, PostgreSQL's snapshot is read only).
            if write and not self._local.writing:
                raise JobcoordError("internal_error", "a write cannot run inside a read "
                                    f"transaction ({where})")
            result = fn(outer)
            if isinstance(result, JobcoordError):
                raise result
            return result
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                with self._begin(write) as conn:
                    result = fn(conn)
                    if isinstance(result, JobcoordError) and not write:
                        raise result
            except self._driver_errors as e:
                err = classify(e, where)
                busy = isinstance(err, DatabaseBusy)
                if busy:
                    self._count_busy(err, started)
                if busy and attempt < self.busy_retries:
                    with self._stats_lock:
                        self.stats.busy_retries += 1
                    # Jitter so that retrying processes do not collide again in lockstep.
                    time.sleep(random.uniform(0.02, 0.1) * attempt)
                    continue
                if busy:
                    with self._stats_lock:
                        self.stats.busy_failures += 1
                    err = DatabaseBusy(
                        err.code, f"the database is still locked after {attempt} attempts; "
                        "nothing was changed, try again", **err.details)
                raise err from e
            if isinstance(result, JobcoordError):
                raise result
            return result


def sqlite_pragma(db: Database, conn: Connection, pragma: str) -> list[Any]:
    return [row[0] for row in conn.exec_driver_sql(f"PRAGMA {pragma}").all()]
