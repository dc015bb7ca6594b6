"""The seam between the rules and the databases: what a store must do for the core.

`Database` runs transactions (write, read, busy retry, error classification) and names the
operations the core asks for -- take the next job, end a running job, lock a job before a
decision, allocate ids, pick expired leases -- each implemented by `sqlite.SqliteDatabase`
and `postgresql.PostgresDatabase` in its own way, so the core never branches on the dialect.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from sqlalchemy.engine import Connection, Engine

from ..errors import DatabaseBusy, JobcoordError
from .driver_errors import classify
from .sources import ChangeWaiter, ConnectionSource, Result
from .statements import SQL

# Re-exported: these lived here before their own modules, and callers import them from here.
from .target import Target, resolve_target

__all__ = [
    "CORE_REVISIONS", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_RETRIES", "OPTIONAL_REVISIONS",
    "SYNCHRONOUS_LEVELS", "ChangeWaiter", "ConnectionSource", "Database", "Result", "Stats",
    "Taken", "Target", "classify", "resolve_target",
]

T = TypeVar("T")

#: Revisions of the core branch, oldest first. The last one is what this code expects.
CORE_REVISIONS = ("c0001", "c0002", "c0003", "c0004", "c0005", "c0006", "c0007")
#: Revisions of optional branches, oldest first.
OPTIONAL_REVISIONS = {"artifacts": ("a0001", "a0002")}

SYNCHRONOUS_LEVELS = ("full", "normal")
DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_RETRIES = 4  # attempts in all, when the busy timeout runs out anyway

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


class Taken(NamedTuple):
    """What a claim's take found: how many candidates the probes read, whether one was
    picked (False: every candidate was held by concurrent claimers), and the job taken
    (job_id, kind, priority, payload_json, attempts, max_attempts, epoch, tenant) or None."""

    candidates: int
    picked: bool
    job: tuple[Any, ...] | None


_NO_PARAMS: Mapping[str, Any] = {}



class Database:
    """An open coordinator database: an engine, its transactions, and the operations the core
    asks for. Open one with `Database.open(target)`; it is a `SqliteDatabase` or a
    `PostgresDatabase`.

    Safe to share between any number of threads: every transaction runs on a connection
    that no other thread uses until it ends."""

    #: "sqlite" or "postgresql"; for tools (migrate, check, transfer) and reports, never for
    #: the core's rules.
    dialect: str = ""
    #: Whether a transition of the hot path runs as one statement (PostgreSQL) or as the
    #: separate statements it is made of (SQLite); see each store.
    folds_transitions: bool = False
    #: Whether a worker should claim several jobs per transaction (claim_many): on a store
    #: whose claimers lock rows until commit, a longer claim transaction holds up
    #: concurrent completions, so its worker claims one job per call there.
    batch_claims: bool = True
    #: Seconds after which no event with a smaller id can still commit. Ids are taken before
    #: the commit, so with concurrent writers (PostgreSQL) a lower id may become visible
    #: after a higher one, within the lock and busy timeouts; a fold of the events by id
    #: (metrics.py) only takes events older than this. SQLite commits one writer at a time,
    #: in id order.
    events_settle_s: float = 30.0
    #: Driver errors a transaction classifies (set by each store).
    _driver_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, target: Target, engine: Engine, *, busy_retries: int = DEFAULT_RETRIES,
                 busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> None:
        self.target = target
        self.engine = engine
        self.busy_retries = busy_retries
        self.busy_timeout = busy_timeout
        self.stats = Stats()
        self._local = threading.local()
        self._stats_lock = threading.Lock()
        self.write_engine: Engine = engine
        self.read_engine: Engine = engine
        self._writers: ConnectionSource
        self._readers: ConnectionSource

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
            from .sqlite import SqliteDatabase

            return SqliteDatabase.open_file(target, create=create, synchronous=synchronous,
                                            busy_timeout=busy_timeout,
                                            busy_retries=busy_retries, frozen=frozen)
        from .postgresql import PostgresDatabase

        return PostgresDatabase.open_server(target, busy_timeout=busy_timeout,
                                            busy_retries=busy_retries)

    @property
    def is_sqlite(self) -> bool:
        return self.target.sqlite_path is not None

    def close(self) -> None:
        self._writers.close()
        self._readers.close()
        self.engine.dispose()

    # -- statements --

    def run(self, conn: Connection, stmt: SQL, params: Mapping[str, Any] | None = None
            ) -> Result:
        """Execute a statement, compiled once for this dialect, inside the transaction
        SQLAlchemy began: the one way to run a statement. Inside `write`/`read` the cached
        text goes straight to the DB-API connection, skipping SQLAlchemy's result machinery
        (ten times the cost of a hot-path statement itself); driver errors are classified by
        `_transaction` like SQLAlchemy's."""
        text = stmt.text(self.dialect)
        direct = getattr(self._local, "direct", None)
        if direct is not None and direct[0] is conn:
            return Result(direct[1].execute(text, params or _NO_PARAMS))
        # Watched (tracing, a test) or not begun by `_begin`: SQLAlchemy's path, so listeners
        # see every statement.
        return Result(conn.exec_driver_sql(text, dict(params) if params else {}))

    def run_many(self, conn: Connection, stmt: SQL, rows: Sequence[Mapping[str, Any]]
                 ) -> None:
        """`run` for many parameter sets at once (the driver's executemany): the one way to
        insert in bulk."""
        text = stmt.text(self.dialect)
        direct = getattr(self._local, "direct", None)
        if direct is not None and direct[0] is conn:
            direct[1].cursor().executemany(text, rows)
        else:
            conn.exec_driver_sql(text, [dict(r) for r in rows])

    # -- the operations the core asks for (each store implements them its way) --

    def binary_collation(self) -> str:
        """The collation that orders text by code point on this dialect (byte order of
        UTF-8), so both databases sort the same keys the same way."""
        raise NotImplementedError

    def lock_for_decision(self, conn: Connection, job_id: int) -> None:
        """Hold the job's row until commit before reading it to decide a change, so a
        concurrent reaper, completer or operator is waited for instead of both deciding on
        the same old row."""
        raise NotImplementedError

    def read_owned(self, conn: Connection, job_id: int) -> Any:
        """The fence read: the job's status, epoch, tenant, cancel flag, effect flag,
        attempts, max attempts, deadline, result, and its lease's worker, epoch and expiry
        (None when there is no such job), with the job row held until commit."""
        raise NotImplementedError

    def candidate_sql(self, roles: Sequence[str], kinds: Sequence[str] | None, *,
                      due_only: bool, locked: bool = True, tenant: str | None = None
                      ) -> tuple[SQL, dict[str, Any]]:
        """The claim's candidate select for this worker's roles and kinds (one index probe
        per (role, kind)), only jobs of `tenant` when given, and its parameters. `locked`
        False is for diagnosis only: it must neither lock rows nor skip locked ones."""
        raise NotImplementedError

    def take_next(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None, batch: int = 1) -> Taken:
        """Take the first eligible waiting job in claim order (of `tenant` only, when given):
        the job to running with the next epoch and attempt, the lease, and the `claimed`
        event (its detail: the attempt and `expires_iso`). `batch`: how many jobs the
        transaction means to take (a store whose concurrent claimers hold rows until commit
        looks further ahead for more)."""
        raise NotImplementedError

    def take_job(self, conn: Connection, job_id: int, *, worker: str, now: int, expires: int,
                 expires_iso: str) -> tuple[Any, ...] | None:
        """Take this waiting job (chosen by the caller's own checks) like `take_next` takes
        its pick: running with the next epoch and attempt, the lease, the `claimed` event.
        None when it is no longer waiting or a concurrent claim holds it."""
        raise NotImplementedError

    def hold_worker(self, conn: Connection, worker_id: str) -> None:
        """Hold this worker's row until commit, so that its claims fit jobs into its free
        capacity one at a time."""
        raise NotImplementedError

    def hold_limit(self, conn: Connection, kind: str, *, wait: bool) -> bool:
        """Hold the limits row of `kind` until commit, so that one claim at a time counts
        and fills that kind's slots. With `wait` False a row another transaction holds is
        not waited for: False."""
        raise NotImplementedError

    def end_running(self, conn: Connection, params: Mapping[str, Any], *, reason: str,
                    worker: str | None, detail: str | None) -> int:
        """A running job's end at (job_id, epoch): the compare-and-set to `to_status`, its
        lease dropped, the event recorded. Returns how many rows the compare-and-set
        changed. Fault points `<reason>.after_update`, `.after_drop_lease`, `.after_event`."""
        raise NotImplementedError

    def allocate_job_ids(self, conn: Connection, n: int) -> Sequence[int]:
        """`n` new job ids, ascending, for a batch inserted in this write transaction."""
        raise NotImplementedError

    def expired_leases(self, conn: Connection, now: int, limit: int) -> list[Any]:
        """Expired leases with their jobs' facts, oldest expiry first, for the reaper; rows
        another reaper holds are skipped."""
        raise NotImplementedError

    def overdue_waiting(self, conn: Connection, now: int, limit: int) -> list[Any]:
        """Waiting jobs past their deadline (job_id, epoch), for the reaper."""
        raise NotImplementedError

    def pick_for_delete(self, conn: Connection, select: SQL, params: Mapping[str, Any]
                        ) -> list[Any]:
        """Run a select of rows this transaction is about to delete, holding them."""
        raise NotImplementedError

    def announce_jobs(self, conn: Connection) -> None:
        """A hint, delivered when this transaction commits, that jobs became claimable
        (enqueued, back to waiting). Waiting workers use it to claim at once instead of at
        their next poll; it is never needed for correctness."""

    def change_waiter(self) -> ChangeWaiter:
        """A waiter for this process's idle worker: wakes on a hint that jobs may have
        become claimable, or after the poll interval (the poll stays the authority)."""
        return ChangeWaiter()

    def storage_facts(self, conn: Connection) -> dict[str, Any]:
        """For `status`, read inside its read transaction: the dialect's name first, then what
        this database can tell about its storage."""
        raise NotImplementedError

    def file_facts(self) -> dict[str, Any]:
        """Facts about the storage read outside any transaction, for `status`."""
        return {}

    # -- the tools' operations (migrate, check, transfer) --

    def integrity_check(self, conn: Connection, *, full: bool = False
                        ) -> tuple[list[str], list[list[Any]]] | None:
        """The database's own check of its pages (quick, or `full`) and its foreign keys:
        (the check's rows, ["ok"] when whole; the violations), or None where the database
        has no such check (PostgreSQL)."""
        return None

    def prepare_for_migration(self) -> None:
        """What must hold before a migration's transaction, outside it (SQLite: WAL)."""

    @contextlib.contextmanager
    def migration_transaction(self, conn: Connection) -> Iterator[None]:
        """The one transaction a migration runs in on `conn`, taken so that a concurrent
        migration waits for it, and checked before it commits."""
        raise NotImplementedError
        yield

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
        """Let `run` use this connection's driver directly while its transaction runs,
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
