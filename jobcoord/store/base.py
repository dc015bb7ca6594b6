"""The seam between the rules and the databases: what a store must do for the core.

`Database` runs transactions (write, read, busy retry, error classification) and names the
operations the core asks for -- take the next job, end a running job, lock a job before a
decision, allocate ids, pick expired leases -- each implemented by `sqlite.SqliteDatabase`
and `postgresql.PostgresDatabase` in its own way, so the core never branches on the dialect.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Table
from sqlalchemy.engine import Connection, Engine

from .. import faults, interrupts
from ..errors import DatabaseBusy, DatabaseCorrupt, InvalidInput, JobcoordError, SchemaMismatch
from . import statements
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
#: The longest busy timeout taken (seconds), through the CLI or the Python API.
MAX_BUSY_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 4  # attempts in all, when the busy timeout runs out anyway
#: The least a try with a deadline near waits for the write lock (`Database.try_wait`).
MIN_TRY_WAIT_S = 0.25

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
_FINISH_KEYS = ("job_id", "epoch", "to_status", "result", "provenance", "error", "finished",
                "run_after", "now")


def _finish_params(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in _FINISH_KEYS}

#: run_many's positional texts: (statement (kept alive, so its id stays its own), text, order).
_POSITIONAL: dict[tuple[int, str, tuple[str, ...]], tuple[SQL, str, tuple[int, ...] | None]] = {}


#: At most this many rows in one SQLite insert of run_many (fewer when the build allows
#: fewer parameters per statement).
MANY_ROWS = 256
_ROWS_TEXTS: dict[tuple[int, str, int], tuple[SQL, str]] = {}
_NUMBERED = re.compile(r"\?([0-9]+)")


def _rows_text(stmt: SQL, text: str, width: int, rows: int) -> str:
    """A positional SQLite insert of one row (`?1`..`?width`) as the insert of `rows` rows,
    the k-th row's values numbered from k * width + 1 (each row's values follow the one
    before it in the parameters)."""
    key = (id(stmt), text, rows)
    found = _ROWS_TEXTS.get(key)
    if found is None:
        head, sep, group = text.partition(" VALUES ")
        if not sep:
            raise ValueError("not an INSERT ... VALUES statement")
        groups = [_NUMBERED.sub(lambda m, off=k * width: f"?{int(m.group(1)) + off}", group)
                  for k in range(rows)]
        found = _ROWS_TEXTS[key] = (stmt, head + sep + ", ".join(groups))
    return found[1]


def _positional(text: str, dialect: str, columns: Sequence[str]
                ) -> tuple[str, tuple[int, ...] | None]:
    """A named-parameter statement as one taking each row's values in `columns` order.
    SQLite: `:name` becomes `?N` (numbered, so a parameter used twice is given once).
    psycopg: `%(name)s` becomes `%s`, and the order picks, per placeholder, the column
    to give (psycopg numbers nothing)."""
    where = {name: i for i, name in enumerate(columns)}
    if dialect == "sqlite":
        named = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")
        used = set(named.findall(text))
        if used != set(columns):
            raise ValueError(f"columns {sorted(columns)} are not the statement's "
                             f"parameters {sorted(used)}")
        return named.sub(lambda m: f"?{where[m.group(1)] + 1}", text), None
    named = re.compile(r"%\(([A-Za-z_][A-Za-z0-9_]*)\)s")
    order = tuple(where[name] for name in named.findall(text))
    if set(named.findall(text)) != set(columns):
        raise ValueError(f"columns {sorted(columns)} are not the statement's parameters")
    return named.sub("%s", text), order



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
        #: When set, no busy transaction is tried again once this many seconds have gone
        #: since its first try, or since the thread's `deadline` began (the server's bound:
        #: below its clients' own timeout).
        self.busy_budget: float | None = None
        #: Set by Coordinator.close: no transaction begins after it.
        self.closed = False
        #: Set by the Coordinator: called when a statement failed for a reason the store
        #: cannot name (a table missing, say) with the place it failed; the error to raise
        #: instead when the schema explains it (its features changed under this process, a
        #: `migrate --with/--without` beside it, re-read by then; or a table of its revision
        #: gone), else None.
        self.schema_watch: Callable[[str], JobcoordError | None] | None = None
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
        from ..validate import finite_seconds

        # NaN passes every range check (each comparison is false) and then waits some small,
        # unsaid time: refused with the rest, as the CLI's --busy-timeout is.
        busy_timeout = finite_seconds(busy_timeout, "busy_timeout", 0, MAX_BUSY_TIMEOUT_S)
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

    def run_many(self, conn: Connection, stmt: SQL, rows: Sequence[Any],
                 columns: Sequence[str] | None = None) -> None:
        """`run` for many parameter sets at once (the driver's executemany): the one way to
        insert in bulk. Rows are mappings, or with `columns` tuples of those parameters'
        values in that order: the driver then binds by position, with no mapping built,
        and none read by name, for every row."""
        direct = getattr(self._local, "direct", None)
        if direct is None or direct[0] is not conn:
            # Watched or not begun by `_begin`: SQLAlchemy's path, with named parameters.
            text = stmt.text(self.dialect)
            conn.exec_driver_sql(text, [dict(zip(columns, r, strict=True)) for r in rows]
                                 if columns is not None else [dict(r) for r in rows])
            return
        if columns is None:
            direct[1].cursor().executemany(stmt.text(self.dialect), rows)
            return
        key = (id(stmt), self.dialect, tuple(columns))
        found = _POSITIONAL.get(key)
        if found is None:
            found = _POSITIONAL[key] = (stmt, *_positional(stmt.text(self.dialect),
                                                           self.dialect, columns))
        _, text, order = found
        cursor = direct[1].cursor()
        if order is not None:  # psycopg: one value per placeholder, repeats included
            pick = operator.itemgetter(*order)
            cursor.executemany(text, [pick(r) for r in rows] if len(order) > 1
                               else [(pick(r),) for r in rows])
            return
        # SQLite: many rows per statement. Each statement runs its triggers (the job counts')
        # under a statement journal of every page it touches; one row per statement copied a
        # dozen pages per job, several times the insert itself.
        width = len(columns)
        limit = getattr(direct[1], "getlimit", None)
        most = limit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if limit is not None else 999
        per = max(1, min(MANY_ROWS, most // width))
        whole = len(rows) - len(rows) % per
        flat = itertools.chain.from_iterable
        if whole:
            cursor.executemany(_rows_text(stmt, text, width, per),
                               [tuple(flat(rows[i:i + per])) for i in range(0, whole, per)])
        if whole < len(rows):
            cursor.execute(_rows_text(stmt, text, width, len(rows) - whole),
                           tuple(flat(rows[whole:])))

    def run_many_count(self, conn: Connection, stmt: SQL, rows: Sequence[Mapping[str, Any]]
                       ) -> int:
        """`run_many` of a statement that changes rows: how many rows it changed in all."""
        text = stmt.text(self.dialect)
        direct = getattr(self._local, "direct", None)
        if direct is not None and direct[0] is conn:
            cur = direct[1].cursor()
            cur.executemany(text, rows)
            return int(cur.rowcount)
        return int(conn.exec_driver_sql(text, [dict(r) for r in rows]).rowcount)

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

    def take_many(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, n: int, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None) -> list[tuple[Any, ...]]:
        """Take up to `n` eligible waiting jobs in claim order (of `tenant` only, when
        given) as one set: each job to running with its next epoch and attempt, its own
        lease and its own `claimed` event, exactly as `take_next` takes one. Returns the
        taken jobs in claim order, each as `Taken.job`; fewer than `n` (or none) when fewer
        can be taken now."""
        raise NotImplementedError

    def read_owned_many(self, conn: Connection, job_ids: Sequence[int]
                        ) -> dict[int, tuple[Any, ...]]:
        """`read_owned` of many jobs in one statement, their rows held until commit (taken
        in job id order): each job's fence row by its id; a job that does not exist is
        absent."""
        ids = sorted(set(job_ids))
        size = 1
        while size < len(ids):
            size *= 2
        # Sizes rounded up to a power of two (the last id repeated): one statement per
        # size, a handful in all, each compiled once.
        params = {f"j{i}": ids[min(i, len(ids) - 1)] for i in range(size)}
        return {row[0]: tuple(row[1:])
                for row in self.run(conn, self._owned_many(size), params)}

    def _owned_many(self, size: int) -> SQL:
        return statements.owned_many(size)

    def end_running_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]],
                         events: Sequence[Mapping[str, Any]]) -> None:
        """`end_running` of many running jobs at once, each row its parameters plus
        `reason`, `worker` and `detail`: the compare-and-sets and the dropped leases in
        bulk, then `events` (each row of `INSERT_EVENT`: the ends' events and any other
        event of the same batch, in the order given) in one insert. Only for jobs whose rows
        this transaction holds and has judged: a compare-and-set that changes nothing fails
        loudly. Fault points as `end_running`'s, once per reason."""
        s = statements
        reasons = sorted({r["reason"] for r in rows})
        updated = self.run_many_count(conn, s.FINISH, [_finish_params(r) for r in rows])
        if updated != len(rows):
            raise JobcoordError("internal_error", f"{len(rows) - updated} of {len(rows)} "
                                "jobs changed under their write lock")
        for reason in reasons:
            faults.point(f"{reason}.after_update")
        self.run_many(conn, s.DROP_LEASE, [{"job_id": r["job_id"], "epoch": r["epoch"]}
                                           for r in rows])
        for reason in reasons:
            faults.point(f"{reason}.after_drop_lease")
        self.run_many(conn, s.INSERT_EVENT, events)
        for reason in reasons:
            faults.point(f"{reason}.after_event")

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

    def hold_limit(self, conn: Connection, kind: str, *, wait: bool
                   ) -> tuple[bool, tuple[Any, ...] | None]:
        """Hold the limits row of `kind` until commit, so that one claim at a time counts
        and fills that kind's slots: (held, the row as held: kind, concurrency, key field;
        None when the claim's own earlier read is current). With `wait` False a row another
        transaction holds is not waited for: not held."""
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

    def let_writers_in(self) -> None:
        """Between two write transactions of one long task (a tick firing many slots): give
        writers waiting for the write lock their turn. Nothing where writers wait on rows."""

    def insert_enqueued(self, conn: Connection, ids: Sequence[int], now: int, detail: str
                        ) -> None:
        """The `enqueued` events of a batch just inserted under `ids` (from
        `allocate_job_ids`), every one with the same time and detail, in id order."""
        self.run_many(conn, statements.INSERT_ENQUEUED, [(i, now, detail) for i in ids],
                      columns=("job_id", "now", "detail"))

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

    def foreign_key_violations(self, conn: Connection,
                               tables: Sequence[Table] | None = None) -> list[list[Any]]:
        """Rows whose foreign key points at no row, of the models' tables present (or of
        `tables`): [table, the row's key, parent table, key name] each, at most 20 a key.
        PostgreSQL enforces its keys, but not with its triggers off (a session with
        session_replication_role = replica: replication tools, a restore with
        --disable-triggers). Built from the models: one outer join a key."""
        from sqlalchemy import and_, inspect, select

        from ..schema import metadata

        present = set(inspect(conn).get_table_names())
        found: list[list[Any]] = []
        for child in tables if tables is not None else metadata.sorted_tables:
            if child.name not in present:
                continue
            for key in sorted(child.foreign_key_constraints, key=lambda k: str(k.name)):
                parent = key.referred_table
                if parent.name not in present:
                    continue
                pk = list(child.primary_key.columns)
                rows = conn.execute(
                    select(*pk)
                    .select_from(child.outerjoin(parent, and_(
                        *(e.parent == e.column for e in key.elements))))
                    .where(*(e.parent.is_not(None) for e in key.elements),
                           key.elements[0].column.is_(None))
                    .order_by(*pk).limit(20)).all()
                found += [[child.name, row[0] if len(row) == 1 else list(row), parent.name,
                           str(key.name)] for row in rows]
        return found

    #: Whether `schema_object_names` lists the constraints by their names: the indexes
    #: behind primary keys and UNIQUE constraints, and the foreign keys (PostgreSQL; SQLite
    #: names its key indexes sqlite_autoindex_* and none of them, nor a foreign key, can be
    #: dropped without rebuilding the table).
    names_constraint_indexes = False

    def schema_object_names(self, conn: Connection) -> set[str]:
        """The names of the indexes and triggers the database holds, and of its foreign
        keys where `names_constraint_indexes` (for `check`)."""
        raise NotImplementedError

    def triggers(self, conn: Connection) -> list[tuple[str, str]]:
        """Every trigger the database holds, as (table, trigger) (for `check`)."""
        raise NotImplementedError

    def lock_exclusive(self, conn: Connection, tables: Sequence[str]) -> None:
        """Hold `tables` against every other writer until commit (readers go on). A store
        whose write transaction holds the whole database already (SQLite) has nothing to
        add."""

    def key_columns(self, conn: Connection, table: str
                    ) -> tuple[frozenset[str], set[frozenset[str]]]:
        """`table`'s primary key columns and the column sets of its unique constraints and
        indexes, for a store that does not name its keys' indexes (`check` finds a key by
        its columns there). SQLAlchemy's inspector answers it anywhere; a store may read
        its own catalogue instead."""
        from sqlalchemy import inspect

        found = inspect(conn)
        pk = frozenset(found.get_pk_constraint(table)["constrained_columns"] or ())
        uniques = {frozenset(u["column_names"]) for u in found.get_unique_constraints(table)}
        uniques |= {frozenset(str(c) for c in i["column_names"])
                    for i in found.get_indexes(table) if i["unique"]}
        return pk, uniques

    def trigger_texts(self, conn: Connection) -> dict[str, str]:
        """What each trigger on `jobs` does, by name, as the database keeps it (SQLite:
        the statement that made it; PostgreSQL: its function's name and body)."""
        return {}

    def check_constraints(self, conn: Connection, table: str) -> dict[str, str | None]:
        """`table`'s named CHECK constraints: their text, whitespace collapsed, where the
        database keeps it as written (SQLite); None where it prints its own form back
        (PostgreSQL: only the names are compared)."""
        from sqlalchemy import inspect

        return {str(c["name"]): None for c in inspect(conn).get_check_constraints(table)
                if c.get("name")}

    def unique_indexes(self, conn: Connection, table: str
                       ) -> dict[str, frozenset[str] | None]:
        """`table`'s unique indexes but its primary key's, by name: their columns, None
        where one is an expression (those behind a UNIQUE constraint included)."""
        from sqlalchemy import inspect

        return {str(i["name"]): (None if None in i["column_names"]
                                 else frozenset(str(c) for c in i["column_names"]))
                for i in inspect(conn).get_indexes(table) if i["unique"]}

    def foreign_key_columns(self, conn: Connection, table: str
                            ) -> set[tuple[frozenset[str], str, str]]:
        """`table`'s foreign keys as (its columns, the table they refer to, what a delete
        of the referred row does: "CASCADE", "SET NULL", "NO ACTION"...): a table made
        again without its foreign key (SQLite names none) or with another ON DELETE is
        found by what the key is, not by its name."""
        from sqlalchemy import inspect

        return {(frozenset(k["constrained_columns"]), k["referred_table"],
                 str((k.get("options") or {}).get("ondelete") or "NO ACTION").upper())
                for k in inspect(conn).get_foreign_keys(table)}

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
        guard = getattr(self._local, "guard", None)
        if guard is not None and getattr(self._local, "conn", None) is None:
            # First thing in the transaction, in its group's turn on whichever thread leads
            # the group: a guard that raises rolls back this call's changes alone.
            inner = fn

            def fn(conn: Connection) -> T:
                guard(conn)
                return inner(conn)
        return self._transaction(fn, where, write=True)

    @contextlib.contextmanager
    def guarded(self, check: Callable[[Connection], None]) -> Iterator[None]:
        """Every write transaction this thread begins inside runs `check(conn)` first, in
        the transaction: its exception refuses the write before anything is changed (the
        server's check that a request's token is still live, made in the request's own
        transaction instead of one of its own)."""
        self._local.guard = check
        try:
            yield
        finally:
            self._local.guard = None

    def read(self, fn: Callable[[Connection], T], where: str = "") -> T:
        """Run `fn` in a read transaction: one consistent snapshot for all its statements
        (SQLite: a deferred BEGIN, which takes no write lock; PostgreSQL: REPEATABLE READ,
        READ ONLY)."""
        return self._transaction(fn, where, write=False)

    @contextlib.contextmanager
    def _begin(self, write: bool) -> Iterator[Connection]:
        if write:
            interrupts.next_write()  # a Ctrl-C held since the last commit ends it here
        cache = self._writers if write else self._readers
        conn = cache.take()
        healthy = False
        interrupted: BaseException | None = None
        self._local.conn, self._local.writing = conn, write
        try:
            with conn.begin(), self._direct(conn):
                try:
                    yield conn
                    if write:
                        # The commit follows: a Ctrl-C from here must not say "rolled
                        # back" of a change that is made (see jobcoord/interrupts.py).
                        interrupts.committing()
                except Exception:
                    raise
                except BaseException as e:  # KeyboardInterrupt, SystemExit
                    interrupted = e
                    raise
            healthy = True
            if write:
                faults.point("write.after_commit")
        except JobcoordError:
            healthy = True  # a rule's refusal: rolled back, the connection is fine
            raise
        except Exception:
            if interrupted is not None:
                # Ctrl-C landed while a statement was in flight: the driver is still mid-
                # command and the rollback fails ("another command is already in
                # progress"). Nothing was committed; the interrupt is what happened (exit
                # 130, not "database unavailable"), and the connection is not reused.
                raise interrupted from None
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

    @contextlib.contextmanager
    def deadline(self, at: float) -> Iterator[None]:
        """While the block runs, this thread's busy transactions are not tried again after
        `time.monotonic()` reaches `at`, and a try waits for the lock no longer than what is
        left (see `try_wait`). The server sets it from when a request asked for a thread, so
        time spent queued for one counts against the request's budget."""
        local = self._local
        outer = getattr(local, "deadline", None)
        local.deadline = at if outer is None else min(outer, at)
        try:
            yield
        finally:
            local.deadline = outer

    def try_wait(self) -> float:
        """How long this thread's next try may wait for the write lock: the busy timeout, or
        less when its deadline is near (never under MIN_TRY_WAIT_S: a healthy group commit
        takes milliseconds, and giving up sooner would refuse a write that could run)."""
        until = getattr(self._local, "deadline", None)
        if until is None:
            return self.busy_timeout
        return min(self.busy_timeout, max(until - time.monotonic(), MIN_TRY_WAIT_S))

    def _count_busy(self, err: JobcoordError, started: float) -> None:
        name = err.details.get("sqlite_error") or err.details.get("sqlstate") or "?"
        with self._stats_lock:
            self.stats.busy_errors[name] = self.stats.busy_errors.get(name, 0) + 1
            if self.is_sqlite and time.monotonic() - started < self.busy_timeout / 2:
                self.stats.busy_unwaited += 1

    def _attempt(self, fn: Callable[[Connection], T], where: str, write: bool) -> T:
        """One try of a transaction: begin, run `fn`, commit. A driver error is raised as it
        is, for `_transaction` to classify and retry."""
        with self._begin(write) as conn:
            result = fn(conn)
            if isinstance(result, JobcoordError) and not write:
                raise result
        return result

    def _transaction(self, fn: Callable[[Connection], T], where: str, *, write: bool) -> T:
        if self.closed:
            raise InvalidInput("coordinator_closed", f"this Coordinator was closed ({where}); "
                               "open another")
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
        if self.busy_budget is not None and getattr(self._local, "deadline", None) is None:
            with self.deadline(time.monotonic() + self.busy_budget):
                return self._tries(fn, where, write)
        return self._tries(fn, where, write)

    def _schema_look(self, err: JobcoordError, where: str) -> JobcoordError | None:
        """A statement failed with an error the store cannot name, or a table missing: does
        the schema explain it? (A feature removed by another process's migrate left every
        statement naming its tables failing, 500 on a server, until a restart; a table
        dropped by hand was an internal error quoting the driver, a column dropped as well.)"""
        # A damaged schema PostgreSQL named (a column missing: `schema_damaged`) is looked
        # at too, for the look names what is missing.
        if self.schema_watch is None or getattr(self._local, "watching", False) or not (
                type(err) is JobcoordError or isinstance(err, SchemaMismatch)
                or (isinstance(err, DatabaseCorrupt) and err.code == "schema_damaged")):
            return None
        self._local.watching = True  # the look's own reads failing look no further
        try:
            return self.schema_watch(where)
        except Exception:  # the look itself failed: the first error stands
            return None
        finally:
            self._local.watching = False

    def _tries(self, fn: Callable[[Connection], T], where: str, write: bool) -> T:
        """`fn` in a transaction, tried again while the database is busy: at most
        `busy_retries` tries, none begun after this thread's deadline."""
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                result = self._attempt(fn, where, write)
            except self._driver_errors as e:
                err = classify(e, where)
                busy = isinstance(err, DatabaseBusy)
                if busy:
                    self._count_busy(err, started)
                until = getattr(self._local, "deadline", None)
                if busy and attempt < self.busy_retries and (
                        until is None or time.monotonic() < until):
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
                else:
                    err = self._schema_look(err, where) or err
                raise err from e
            if isinstance(result, JobcoordError):
                raise result
            return result
