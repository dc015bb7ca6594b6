"""The PostgreSQL store: the engine and its bounded pool, the clock-skew check, SQLSTATE
mapping, snapshot reads, and the core's operations with row locks (FOR UPDATE, SKIP LOCKED)
and folded statements (one round trip per transition).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

from .. import faults
from ..errors import (
    DatabaseBusy,
    DatabaseCorrupt,
    JobcoordError,
    SchemaMismatch,
    StorageUnavailable,
)
from ..validate import dumps
from . import limit_statements as ls
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
from .base import classify as classify
from .postgresql_listen import LISTEN_RETRY_S, LISTEN_SLICE_S, ListenWaiter
from .postgresql_statements import (
    _ANNOUNCE,
    _CLAIM_STATEMENTS,
    _CONTINUE,
    _END_FOLDED,
    _EXPIRED_LEASES_LOCKED,
    _LOCK_JOB,
    _MIGRATION_LOCK,
    _NEXT_JOB_IDS,
    _OVERDUE_WAITING_LOCKED,
    _OWNED_LOCKED,
    BATCH_CLAIM_HEADS,
    CLAIM_HEADS,
    JOBS_CHANNEL,
    MIGRATION_LOCK_KEY,
    SEQUENCES,
    _claim_folded,
    claim_sql,
    owned_many_locked,
    take_many_folded,
)

# The PostgreSQL-only statements and the LISTEN waiter live in their own modules; their names
# are re-exported here, where callers have always imported them from.
__all__ = [
    "BATCH_CLAIM_HEADS",
    "CLAIM_HEADS",
    "JOBS_CHANNEL",
    "LISTEN_RETRY_S",
    "LISTEN_SLICE_S",
    "MAX_CLOCK_SKEW_S",
    "MIGRATION_LOCK_KEY",
    "PG_POOL_OVERFLOW",
    "PG_POOL_SIZE",
    "PG_STATES",
    "SEQUENCES",
    "SKEW_RECHECK_S",
    "_CLAIM_STATEMENTS",
    "ListenWaiter",
    "PooledConnections",
    "PostgresDatabase",
    "claim_sql",
    "classify",
    "clock_skew_refusal",
]

PG_STATES: dict[str, tuple[type[JobcoordError], str, str]] = {
    "40001": (DatabaseBusy, "database_locked", "serialization failure"),
    "40P01": (DatabaseBusy, "database_locked", "deadlock detected"),
    "55P03": (DatabaseBusy, "database_locked", "lock not available"),
    "53100": (StorageUnavailable, "database_full", "the database server's disk is full"),
    "25006": (StorageUnavailable, "database_readonly", "the database is read-only"),
    "42P01": (SchemaMismatch, "not_migrated", "a table is missing"),
    # jobcoord's statements are fixed and tested: a column, key or index they name missing
    # is a schema changed outside jobcoord. `check` names what.
    "42703": (DatabaseCorrupt, "schema_damaged",
              "a column is missing (the schema was changed outside jobcoord; run `jobcoord "
              "check`)"),
    # A write to a view standing where a table was ("cannot insert into view"): psycopg
    # raises it as an OperationalError, which read as the database being unreachable.
    "55000": (DatabaseCorrupt, "schema_damaged",
              "an object is not what jobcoord made (a view in a table's place?): the schema "
              "was changed outside jobcoord; run `jobcoord check`"),
    "42P10": (DatabaseCorrupt, "schema_damaged",
              "a key or unique constraint is missing (the schema was changed outside "
              "jobcoord; run `jobcoord check`)"),
    # Every number jobcoord writes is validated or counted up from a stored one: only a value
    # written outside it reaches the end of its column (an epoch at 2**31 - 1 a claim adds to).
    "22003": (DatabaseCorrupt, "value_out_of_range",
              "a stored number is at the end of its column's range (written outside jobcoord)"),
}


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
        from ..errors import InvalidInput

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


def _pg_engine(url: str, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> Engine:
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
                           pool_recycle=3600, connect_args={
                               "application_name": "jobcoord",
                               # A statement waiting for another transaction's row lock gives
                               # up after the busy timeout (SQLSTATE 55P03, DatabaseBusy: the
                               # bounded retry, then exit 5), as a locked SQLite file does;
                               # 0 would wait for ever.
                               "options": f"-c lock_timeout={max(1, round(busy_timeout * 1000))}",
                           })

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

#: How long `close` waits for the transactions under way in other threads to give their
#: connections back, so that the pool's end closes them too.
CLOSE_WAIT_S = 5.0


class PooledConnections(ConnectionSource):
    """A connection per transaction straight from the engine's own bounded pool
    (PostgreSQL: a network round trip costs far more than the checkout)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._given = threading.Condition()
        self._out = 0  # connections taken and not yet given back
        self._closed = False

    def take(self) -> Connection:
        conn = self.engine.connect()
        with self._given:
            self._out += 1
        return conn

    def give(self, conn: Connection, healthy: bool) -> None:
        if not healthy or self._closed:
            # Closed meanwhile: the pool it would go back to has ended (`close`), and
            # nothing would ever close it there.
            with contextlib.suppress(Exception):
                conn.invalidate()
        with contextlib.suppress(Exception):
            conn.close()
        with self._given:
            self._out -= 1
            self._given.notify_all()

    def close(self) -> None:
        """For good: connections given back from now on are closed; those out now are
        waited for (a transaction is short) so that the engine's disposal, next, closes
        them in the pool. One given back into a pool already disposed stayed open for the
        process's life."""
        with self._given:
            self._closed = True
            self._given.wait_for(lambda: self._out <= 0, timeout=CLOSE_WAIT_S)


class PostgresDatabase(Database):
    """A PostgreSQL server: a bounded pool, REPEATABLE READ snapshots for reads, row locks
    for decisions, one statement per transition."""

    dialect = "postgresql"
    folds_transitions = True
    # A claim_many is one short statement here (take_many): the rows a FOR UPDATE SKIP
    # LOCKED recheck failed on stay locked only until that statement's commit, not for a
    # transaction of many steps, so completions no longer queue behind batch claims
    # (benchmarks/README.md: 4 processes, batch 32, 5.51x the SKIP LOCKED ceiling where
    # the step-by-step batch stalled at 0.03x). Workers claim batches, as on SQLite.
    batch_claims = True

    def __init__(self, target: Target, engine: Engine, **kw: Any) -> None:
        import psycopg

        super().__init__(target, engine, **kw)
        self._driver_errors = (DBAPIError, PoolTimeout, psycopg.Error)
        self.write_engine = engine
        # One snapshot for every statement of a read (READ COMMITTED would give each
        # statement its own): `explain` must never see a running job without its lease.
        self.read_engine = engine.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True)
        self._writers = PooledConnections(self.write_engine)
        self._readers = PooledConnections(self.read_engine)

    @classmethod
    def open_server(cls, target: Target, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                    busy_retries: int = DEFAULT_RETRIES) -> PostgresDatabase:
        return cls(target, _pg_engine(target.url, busy_timeout), busy_retries=busy_retries,
                   busy_timeout=busy_timeout)

    # -- the core's operations --

    def binary_collation(self) -> str:
        return "C"

    def lock_for_decision(self, conn: Connection, job_id: int) -> None:
        self.run(conn, _LOCK_JOB, {"job_id": job_id})

    def read_owned(self, conn: Connection, job_id: int) -> Any:
        return self.run(conn, _OWNED_LOCKED, {"job_id": job_id}).fetchone()

    def candidate_sql(self, roles: Sequence[str], kinds: Sequence[str] | None, *,
                      due_only: bool, locked: bool = True, tenant: str | None = None
                      ) -> tuple[s.SQL, dict[str, Any]]:
        # Locks the candidate row and lets concurrent claimers skip it instead of waiting.
        return s.candidate_sql(roles, kinds, due_only=due_only, locked=locked, tenant=tenant)

    def take_next(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None, batch: int = 1) -> Taken:
        stmt = _claim_folded(roles, kinds, tenant is not None)
        params = s.role_kind_params(roles, kinds, tenant)
        # The statement spells the event's detail around the expiry's JSON string.
        params.update(now=now, maxp=max_priority, f=False, worker=worker, expires=expires,
                      expires_json=dumps(expires_iso))
        # Concurrent batches each hold up to `batch` rows until they commit, all of them
        # near the head of the queue: a batch starts further down than a single claim.
        for heads in (CLAIM_HEADS if batch == 1 else BATCH_CLAIM_HEADS):
            params["heads"] = heads
            found = self.run(conn, stmt, params).fetchone()
            # Every candidate held by other claimers, and a slice may hold more: look
            # further down the slices before saying they are all being claimed.
            if found[1] is not None or found[0] < heads:
                break
        if found[1] is None:
            return Taken(found[0], False, None)
        if found[2] is None:  # the compare-and-set took nothing: defence in depth
            return Taken(found[0], True, None)
        # All three happened in that one statement; a fault here still sits inside the
        # open transaction, before its commit.
        faults.point("claim.after_take")
        faults.point("claim.after_lease")
        faults.point("claim.after_event")
        return Taken(found[0], True, tuple(found[2:]))

    def take_many(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                  *, n: int, worker: str, now: int, expires: int, max_priority: int,
                  expires_iso: str, tenant: str | None = None) -> list[tuple[Any, ...]]:
        stmt = take_many_folded(roles, kinds, tenant is not None)
        params = s.role_kind_params(roles, kinds, tenant)
        params.update(now=now, maxp=max_priority, n=n, f=False, worker=worker,
                      expires=expires, expires_json=dumps(expires_iso))
        # Concurrent claimers hold their picks until they commit (one statement later): the
        # probes read a few batches' worth of heads; only when every one of them was held
        # does the take look further down.
        got: list[Any] = []
        for heads in (max(BATCH_CLAIM_HEADS[0], 4 * n), max(BATCH_CLAIM_HEADS[1], 32 * n)):
            params["heads"] = heads
            got = self.run(conn, stmt, params).fetchall()
            if got:
                break
        if not got:
            return []
        # Leases and events were written by that one statement, inside the transaction.
        faults.point("claim.after_take")
        faults.point("claim.after_lease")
        faults.point("claim.after_event")
        return [tuple(r[:8]) for r in sorted(got, key=lambda r: (r[2], r[8], r[0]))]

    def _owned_many(self, size: int) -> s.SQL:
        return owned_many_locked(size)

    def hold_worker(self, conn: Connection, worker_id: str) -> None:
        self.run(conn, ls.HOLD_WORKER, {"worker": worker_id})

    def hold_limit(self, conn: Connection, kind: str, *, wait: bool
                   ) -> tuple[bool, tuple[Any, ...] | None]:
        row = self.run(conn, ls.HOLD_LIMIT if wait else ls.TRY_HOLD_LIMIT,
                       {"kind": kind}).fetchone()
        # Waited for: held, or the limit was removed meanwhile (the claim still applies the
        # one it read, the cautious side). Not waited for: held only if the row came back.
        # The row as held is the latest committed: a limit changed since the claim read the
        # limits is judged as it is now.
        return wait or row is not None, None if row is None else tuple(row)

    def take_job(self, conn: Connection, job_id: int, *, worker: str, now: int, expires: int,
                 expires_iso: str) -> tuple[Any, ...] | None:
        # Skip a job a concurrent claim holds instead of waiting to find it taken.
        if self.run(conn, ls.HOLD_WAITING, {"job_id": job_id}).fetchone() is None:
            return None
        job = self.run(conn, s.TAKE_JOB, {"job_id": job_id, "now": now, "f": False}
                       ).fetchone()
        if job is None:
            return None
        epoch, attempts = job[6], job[4]
        self.run(conn, s.INSERT_LEASE, {"job_id": job_id, "worker": worker, "epoch": epoch,
                                        "now": now, "expires": expires})
        self.run(conn, s.INSERT_EVENT, {
            "job_id": job_id, "now": now, "from_status": "waiting", "to_status": "running",
            "reason": "claimed", "worker": worker, "epoch": epoch,
            "detail": dumps({"expires_at": expires_iso, "attempt": attempts})})
        return tuple(job)

    def end_running(self, conn: Connection, params: Mapping[str, Any], *, reason: str,
                    worker: str | None, detail: str | None) -> int:
        updated: int = self.run(conn, _END_FOLDED, {
            **params, "reason": reason, "worker": worker, "detail": detail}).fetchone()[0]
        if updated == 1:
            # All three follow the one statement, inside the open transaction.
            faults.point(f"{reason}.after_update")
            faults.point(f"{reason}.after_drop_lease")
            faults.point(f"{reason}.after_event")
        return updated

    def allocate_job_ids(self, conn: Connection, n: int) -> Sequence[int]:
        return sorted(r[0] for r in self.run(conn, _NEXT_JOB_IDS, {"n": n}))

    def expired_leases(self, conn: Connection, now: int, limit: int) -> list[Any]:
        return self.run(conn, _EXPIRED_LEASES_LOCKED, {"now": now, "limit": limit}).all()

    def overdue_waiting(self, conn: Connection, now: int, limit: int) -> list[Any]:
        return self.run(conn, _OVERDUE_WAITING_LOCKED, {"now": now, "limit": limit}).all()

    def pick_for_delete(self, conn: Connection, select: s.SQL, params: Mapping[str, Any]
                        ) -> list[Any]:
        # The select says FOR UPDATE SKIP LOCKED: another prune's batch is skipped.
        return self.run(conn, select, params).all()

    def announce_jobs(self, conn: Connection) -> None:
        self.run(conn, _ANNOUNCE, {})

    def change_waiter(self) -> ChangeWaiter:
        return ListenWaiter(self.target.url)

    # -- the tools' operations --

    @contextlib.contextmanager
    def migration_transaction(self, conn: Connection) -> Iterator[None]:
        with conn.begin():
            self.run(conn, _MIGRATION_LOCK)
            yield

    def lock_exclusive(self, conn: Connection, tables: Sequence[str]) -> None:
        """Hold `tables` against every other writer until commit (readers go on)."""
        conn.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN EXCLUSIVE MODE")

    def continue_sequences(self, conn: Connection, tables: Sequence[str]) -> dict[str, int]:
        """Make new ids continue after the rows copied with explicit ids (which never
        advance a sequence): the next id of each table that has a sequence."""
        return {t: int(self.run(conn, _CONTINUE[t]).scalar_one()) for t in SEQUENCES
                if t in tables}

    names_constraint_indexes = True

    def schema_object_names(self, conn: Connection) -> set[str]:
        # In the schema the connection works in (its search_path's first), as every
        # statement of jobcoord's does.
        return {r[0] for r in conn.exec_driver_sql(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "UNION ALL SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT t.tgisinternal AND n.nspname = current_schema() "
            "UNION ALL SELECT k.conname FROM pg_constraint k JOIN pg_namespace n "
            "ON n.oid = k.connamespace WHERE k.contype = 'f' AND n.nspname = current_schema()"
            ).all()}

    def trigger_texts(self, conn: Connection) -> dict[str, str]:
        # A trigger's work is its function's: the function's name and body, as stored.
        return {r[0]: f"{r[1]}\n{r[2]}" for r in conn.exec_driver_sql(
            "SELECT t.tgname, p.proname, p.prosrc FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE NOT t.tgisinternal AND n.nspname = current_schema() "
            "AND c.relname = 'jobs'").all()}

    def triggers(self, conn: Connection) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in conn.exec_driver_sql(
            "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT t.tgisinternal AND n.nspname = current_schema() "
            "ORDER BY c.relname, t.tgname").all()]

    def storage_facts(self, conn: Connection) -> dict[str, Any]:
        # Measured when the connection opened: this host against the server.
        offset = conn.info.get("clock_offset_s")
        return {"dialect": self.dialect,
                "clock_offset_s": None if offset is None else round(offset, 6)}
