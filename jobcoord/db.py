"""Engine and transactions: the one seam between jobcoord and its two databases.

Everything dialect-specific lives here: how a connection is set up, how a write transaction
begins (`BEGIN IMMEDIATE` on SQLite, plain `BEGIN` plus `FOR UPDATE SKIP LOCKED` row locks on
PostgreSQL), how driver errors map to jobcoord's errors, and the bounded retry when the
database stays busy. The service above only sees `Database.write(fn)` / `Database.read(fn)`.
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
from sqlalchemy.engine import Connection, CursorResult, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from .errors import (
    DatabaseBusy,
    DatabaseCorrupt,
    JobcoordError,
    SchemaMismatch,
    StorageUnavailable,
)

T = TypeVar("T")

#: Revisions of the core branch, oldest first. The last one is what this code expects.
CORE_REVISIONS = ("c0001", "c0002")
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
        return Target(url=f"sqlite:///{path}", sqlite_path=os.path.abspath(path))
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise InvalidInput("invalid_input", f"not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
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
    name = getattr(orig, "sqlite_errorname", None)
    if name:
        for prefix, cls, code, text in _SQLITE_CODES:
            if name.startswith(prefix):
                return cls(code, f"{text}{suffix} [{name}]", sqlite_error=name)
        if "no such table" in str(orig):
            return SchemaMismatch("not_migrated", f"the database is not migrated{suffix}; "
                                  "run `jobcoord migrate`")
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate and sqlstate in _PG_STATES:
        cls, code, text = _PG_STATES[sqlstate]
        return cls(code, f"{text}{suffix} [SQLSTATE {sqlstate}]", sqlstate=sqlstate)
    if type(orig).__module__.startswith("psycopg") and type(orig).__name__ == "OperationalError":
        return StorageUnavailable(
            "database_unavailable", f"cannot reach the database{suffix}: {str(orig).strip()}"
        )
    return JobcoordError("internal_error", f"database error{suffix}: {orig}")


def _is_busy(err: JobcoordError) -> bool:
    return isinstance(err, DatabaseBusy)


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
        # check_same_thread=False: SQLAlchemy's pool may hand a connection to another thread,
        # never to two at once.
        return sqlite3.connect(uri, check_same_thread=False, **connect_kwargs)

    engine = create_engine("sqlite://", creator=_connect)
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


def _pg_engine(url: str) -> Engine:
    limit = _max_clock_skew()
    # Recycle hourly so a long-running worker's clock is measured again.
    engine = create_engine(url, pool_pre_ping=False, pool_recycle=3600,
                           connect_args={"application_name": "jobcoord"})

    @event.listens_for(engine, "connect")
    def _measure_clock(dbapi_conn: Any, record: Any) -> None:
        # The system clock itself, not datetime.now(): a test's frozen clock must not trip this.
        before = time.clock_gettime(time.CLOCK_REALTIME)
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            server = float(cur.fetchone()[0])
        after = time.clock_gettime(time.CLOCK_REALTIME)
        dbapi_conn.rollback()
        offset = server - (before + after) / 2
        record.info["clock_offset_s"] = offset
        refusal = clock_skew_refusal(offset, (after - before) / 2, limit)
        if refusal is not None:
            raise refusal

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


@dataclass
class Database:
    """An open coordinator database: an engine, its dialect, and transaction helpers."""

    target: Target
    engine: Engine
    busy_retries: int = DEFAULT_RETRIES
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    stats: Stats = field(default_factory=Stats)
    write_engine: Engine = field(init=False)
    _local: threading.local = field(init=False, repr=False)
    _held: list[Connection] = field(init=False, repr=False)
    _driver_errors: tuple[type[BaseException], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from . import faults

        self._local = threading.local()
        self._held = []
        if self.is_sqlite:
            self._driver_errors = (DBAPIError, sqlite3.Error)
        else:
            import psycopg

            self._driver_errors = (DBAPIError, psycopg.Error)

        # The deferred switch exists only for the test proving the harness catches it.
        begin = "BEGIN" if faults.DEFERRED_WRITES else "BEGIN IMMEDIATE"
        self.write_engine = (
            self.engine.execution_options(jobcoord_begin=begin)
            if self.is_sqlite
            else self.engine
        )

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
        for conn in self._held:
            with contextlib.suppress(Exception):
                conn.close()
        self._held.clear()
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
        refusal can be recorded as an event) and the error is raised afterwards."""
        return self._transaction(fn, where, write=True)

    def read(self, fn: Callable[[Connection], T], where: str = "") -> T:
        """Run `fn` in a read transaction (deferred BEGIN: takes no write lock)."""
        return self._transaction(fn, where, write=False)

    def _write_connection(self) -> Connection | None:
        """This thread's write connection, kept open between transactions: checking a
        connection out of the pool and back costs more than a whole claim. None when this
        thread is already inside a write transaction (a nested write gets its own)."""
        local = self._local
        conn: Connection | None = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid() or conn.closed or conn.invalidated:
            conn = self.write_engine.connect()
            local.conn, local.pid = conn, os.getpid()
            self._held.append(conn)
        return None if conn.in_transaction() else conn

    def _drop_write_connection(self, conn: Connection) -> None:
        self._local.conn = None
        with contextlib.suppress(ValueError):
            self._held.remove(conn)
        with contextlib.suppress(Exception):
            conn.close()

    @contextlib.contextmanager
    def _begin(self, write: bool) -> Iterator[Connection]:
        held = self._write_connection() if write else None
        if held is None:
            with (self.write_engine if write else self.engine).begin() as conn, \
                    self._direct(conn):
                yield conn
            return
        try:
            with held.begin(), self._direct(held):
                yield held
        except JobcoordError:
            raise  # a rule's refusal: rolled back, the connection is fine
        except BaseException:
            # The failure may have left the connection half-begun: start afresh next time.
            self._drop_write_connection(held)
            raise

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

    def _transaction(self, fn: Callable[[Connection], T], where: str, *, write: bool) -> T:
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
                if _is_busy(err):
                    name = err.details.get("sqlite_error") or err.details.get("sqlstate") or "?"
                    self.stats.busy_errors[name] = self.stats.busy_errors.get(name, 0) + 1
                    if self.is_sqlite and time.monotonic() - started < self.busy_timeout / 2:
                        self.stats.busy_unwaited += 1
                if _is_busy(err) and attempt < self.busy_retries:
                    self.stats.busy_retries += 1
                    # Jitter so that retrying processes do not collide again in lockstep.
                    time.sleep(random.uniform(0.02, 0.1) * attempt)
                    continue
                if _is_busy(err):
                    self.stats.busy_failures += 1
                    err.message = (
                        f"the database is still locked after {attempt} attempts; nothing was "
                        "changed, try again"
                    )
                raise err from e
            if isinstance(result, JobcoordError):
                raise result
            return result


def sqlite_pragma(db: Database, conn: Connection, pragma: str) -> list[Any]:
    return [row[0] for row in conn.exec_driver_sql(f"PRAGMA {pragma}").all()]
