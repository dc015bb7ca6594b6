"""The statements both stores run, built from the Core tables of `schema.py` (so every column
list comes from the one definition of the schema), compiled by SQLAlchemy once per dialect
into the driver's own parameter style, and the claim's candidate select per shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

from ..schema import checkpoints, job_events, jobs, leases, workers

_SET_ITEM = re.compile(r"(^|, )(\w+)=")


class _Spelling:
    """What the stores' compilers write differently from SQLAlchemy's defaults."""

    def visit_update(self, update_stmt: Any, **kw: Any) -> str:
        # SQLAlchemy writes `SET a=:a, b=:b`; the statements have always read
        # `SET a = :a, b = :b`, as listeners and plans in the docs quote them.
        text = str(super().visit_update(update_stmt, **kw))  # type: ignore[misc]
        head, sep, rest = text.partition(" SET ")
        end = min((i for i in (rest.find(" WHERE "), rest.find(" RETURNING ")) if i >= 0),
                  default=len(rest))
        return head + sep + _SET_ITEM.sub(r"\1\2 = ", rest[:end]) + rest[end:]


def _dialect(name: str) -> Dialect:
    """The dialect whose compiler gives the driver's own parameter style (SQLite: `:name`,
    psycopg: `%(name)s`); imported on first use, so a SQLite process never loads psycopg's."""
    dialect = _DIALECTS.get(name)
    if dialect is None:
        if name == "sqlite":
            from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
            from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

            class Compiler(_Spelling, SQLiteCompiler):
                def limit_clause(self, select: Any, **kw: Any) -> str:
                    # SQLAlchemy adds "OFFSET ?" bound to 0 to every LIMIT: a parameter the
                    # cached statement would have to carry, for nothing.
                    if select._offset_clause is None and select._limit_clause is not None:
                        return "\n LIMIT " + self.process(select._limit_clause, **kw)
                    return str(super().limit_clause(select, **kw))

            class Pysqlite(SQLiteDialect_pysqlite):
                statement_compiler = Compiler

            dialect = Pysqlite(paramstyle="named")
        else:
            from sqlalchemy.dialects.postgresql.psycopg import (
                PGCompiler_psycopg,
                PGDialect_psycopg,
            )
            from sqlalchemy.engine.interfaces import BindTyping

            class PGCompiler(_Spelling, PGCompiler_psycopg):
                pass

            class Psycopg(PGDialect_psycopg):
                statement_compiler = PGCompiler

            dialect = Psycopg()
            # No "::TYPE" casts on the parameters: the driver binds typed values itself, and
            # the statements keep the plans measured without them.
            dialect.bind_typing = BindTyping.NONE
        _DIALECTS[name] = dialect
    return dialect


_DIALECTS: dict[str, Dialect] = {}


def _dialect_insert(name: str) -> Callable[..., Any]:
    """The dialect's own `insert`, the one with on_conflict_do_nothing / _do_update."""
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert


#: What a statement is made from: SQL text with `:name` parameters, a Core statement, or a
#: function of the dialect's own `insert` giving one (for ON CONFLICT, which each dialect
#: spells with its own construct).
Source = str | ClauseElement | Callable[[Callable[..., Any]], ClauseElement]


class SQL:
    """One statement, compiled by SQLAlchemy once per dialect into the driver's own named
    parameter style (SQLite `:name`, psycopg `%(name)s`: both take a mapping, so no
    parameter order is kept), so the hot path can hand the cached string straight to the
    DB-API cursor."""

    __slots__ = ("_source", "_texts")

    def __init__(self, source: Source) -> None:
        self._source = source
        self._texts: dict[str, str] = {}

    @property
    def source(self) -> str:
        """The statement as text with `:name` parameters (SQLite's compilation of a built
        one): for reading, and for the tests that prepare every statement."""
        return self._source if isinstance(self._source, str) else self.text("sqlite")

    def text(self, dialect: str) -> str:
        """The statement for the named dialect's driver (compiled on first use)."""
        compiled = self._texts.get(dialect)
        if compiled is None:
            compiled = self._texts[dialect] = self._compile(dialect)
        return compiled

    def element(self, dialect: str) -> ClauseElement:
        """The statement as SQLAlchemy builds it for this dialect."""
        source = self._source
        if isinstance(source, str):
            return sql_text(source)
        if isinstance(source, ClauseElement):
            return source
        return source(_dialect_insert(dialect))

    def _compile(self, dialect: str) -> str:
        compiled = self.element(dialect).compile(dialect=_dialect(dialect))
        # Every value comes from the caller's parameters: a value SQLAlchemy bound itself
        # (a Python constant in the statement) would be missing when the cached text runs.
        bound = [name for name, bind in compiled.binds.items() if bind.value is not None]
        if bound:
            raise ValueError(f"statement binds constants {bound}: write them with "
                             "literal_column so the cached text carries them")
        return str(compiled)

    @property
    def sqlite(self) -> str:
        return self.text("sqlite")

    @property
    def postgresql(self) -> str:
        return self.text("postgresql")

    @classmethod
    def cached(cls, text: str) -> SQL:
        """The SQL for a statement assembled at run time, compiled once per distinct text
        (compiling costs more than running a small statement)."""
        stmt = _SQL_CACHE.get(text)
        if stmt is None:
            if len(_SQL_CACHE) >= 512:  # texts are few shapes, but never grow without bound
                _SQL_CACHE.clear()
            stmt = _SQL_CACHE[text] = cls(text)
        return stmt


_SQL_CACHE: dict[str, SQL] = {}


def const(value: str | int) -> ColumnElement[Any]:
    """A constant written into the statement's text, not bound: the partial claim and
    deadline indexes match only a literal `status = 'waiting'`."""
    return literal_column(f"'{value}'" if isinstance(value, str) else str(int(value)))


P = bindparam
ZERO, ONE = const(0), const(1)
J, L, E, W, C = jobs.c, leases.c, job_events.c, workers.c, checkpoints.c
WAITING = J.status == const("waiting")

#: A new job's values: the caller's parameters, a new job's fixed starting state.
_NEW_JOB = {
    "tenant": P("tenant"), "kind": P("kind"), "required_role": P("role"),
    "priority": P("priority"), "payload_json": P("payload"), "status": const("waiting"),
    "created_at": P("now"), "updated_at": P("now"), "run_after": P("run_after"),
    "deadline_at": P("deadline"), "attempts": ZERO, "max_attempts": P("max_attempts"),
    "epoch": ZERO, "effect_started": P("f"), "cancel_requested": P("f"),
}

INSERT_JOB = SQL(
    lambda insert: insert(jobs).values(**_NEW_JOB, idempotency_key=P("key"))
    # Two submissions with one key at once (PostgreSQL: neither sees the other's row yet):
    # the later insert waits for the earlier, then inserts nothing instead of failing.
    .on_conflict_do_nothing(index_elements=[J.tenant, J.idempotency_key])
    .returning(J.job_id)
)
# A batch without idempotency keys: ids computed inside the write transaction, so the rows go
# in with one executemany instead of one round trip (and one RETURNING) per job.
INSERT_JOB_AT = SQL(insert(jobs).values(**_NEW_JOB, job_id=P("job_id"), idempotency_key=null()))
LAST_JOB_ID = SQL(select(func.coalesce(func.max(J.job_id), ZERO)))
# Inline: the insert returns nothing, not even the new event's id (which PostgreSQL's
# compiler would otherwise ask back).
INSERT_EVENT = SQL(insert(job_events).inline().values(
    job_id=P("job_id"), at=P("now"), from_status=P("from_status"), to_status=P("to_status"),
    reason=P("reason"), worker_id=P("worker"), epoch=P("epoch"), detail=P("detail")))
JOB_BY_KEY = SQL(
    select(J.job_id, J.kind, J.payload_json, J.priority, J.required_role, J.max_attempts)
    .where(J.tenant == P("tenant"), J.idempotency_key == P("key")))
# The max_attempts a keyed job was submitted with: releases and operator retries raise the
# stored one later, so the key is compared with what the `enqueued` event recorded.
SUBMITTED_DETAIL = SQL(
    select(E.detail).where(E.job_id == P("job_id"), E.reason == const("enqueued"))
    .order_by(E.event_id).limit(ONE))
RELEASES = SQL(select(func.count()).select_from(job_events).where(
    E.job_id == P("job_id"), E.reason == const("worker_shutdown")))
WORKER = SQL(
    select(W.roles_json, W.kinds_json, W.heartbeat_at, W.memory_used_pct, W.temperature_c,
           W.on_battery, W.user_idle_s).where(W.worker_id == P("worker")))
ALL_WORKERS = SQL(
    select(W.worker_id, W.roles_json, W.kinds_json, W.heartbeat_at, W.memory_used_pct,
           W.temperature_c, W.on_battery, W.user_idle_s, W.last_refusal,
           W.last_refusal_detail, W.last_refusal_at, W.heartbeat_raw).order_by(W.worker_id))


def _upsert(insert: Callable[..., Any], table: Any, values: dict[str, Any],
            key: Sequence[str], keep: Sequence[str]) -> ClauseElement:
    """Insert a row or, when its key exists, overwrite every column but `keep` (and the key)
    with the new row's."""
    stmt = insert(table).values(**values)
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=[table.c[k] for k in key],
        set_={name: stmt.excluded[name] for name in values if name not in (*key, *keep)})


UPSERT_WORKER = SQL(lambda insert: _upsert(insert, workers, {
    "worker_id": P("worker"), "roles_json": P("roles"), "kinds_json": P("kinds"),
    "heartbeat_raw": P("raw"), "heartbeat_at": P("now"), "memory_used_pct": P("mem"),
    "temperature_c": P("temp"), "on_battery": P("battery"), "user_idle_s": P("idle"),
    "created_at": P("now")}, key=("worker_id",), keep=("created_at",)))
RECORD_REFUSAL = SQL(update(workers).where(W.worker_id == P("worker")).values(
    last_refusal=P("code"), last_refusal_detail=P("detail"), last_refusal_at=P("now")))
#: What a claim returns of the job it took, in this order.
TAKEN_COLUMNS = (J.job_id, J.kind, J.priority, J.payload_json, J.attempts, J.max_attempts,
                 J.epoch, J.tenant)
TAKE_JOB = SQL(
    update(jobs).where(J.job_id == P("job_id"), WAITING)
    .values(status=const("running"), epoch=J.epoch + ONE, attempts=J.attempts + ONE,
            effect_started=P("f"), updated_at=P("now"))
    .returning(*TAKEN_COLUMNS))
INSERT_LEASE = SQL(insert(leases).values(
    job_id=P("job_id"), worker_id=P("worker"), epoch=P("epoch"), granted_at=P("now"),
    expires_at=P("expires")))
CHECKPOINTS = SQL(
    select(C.name, C.data_json, C.epoch, C.worker_id, C.updated_at)
    .where(C.job_id == P("job_id")).order_by(C.name))
OWNED_SELECT = (
    select(J.status, J.epoch, J.tenant, J.cancel_requested, J.effect_started, J.attempts,
           J.max_attempts, J.deadline_at, J.result_json, L.worker_id, L.epoch, L.expires_at)
    .select_from(jobs.outerjoin(leases, L.job_id == J.job_id))
    .where(J.job_id == P("job_id")))
OWNED = SQL(OWNED_SELECT)
RUNNING_AT_EPOCH = (J.job_id == P("job_id"), J.status == const("running"),
                    J.epoch == P("epoch"))
FINISH = SQL(update(jobs).where(*RUNNING_AT_EPOCH).values(
    status=P("to_status"), result_json=P("result"), provenance_json=P("provenance"),
    last_error=P("error"), finished_at=P("finished"), run_after=P("run_after"),
    updated_at=P("now")))
GRANT_ATTEMPT = SQL(update(jobs).where(J.job_id == P("job_id"))
                    .values(max_attempts=P("max_attempts")))
DROP_LEASE = SQL(delete(leases).where(L.job_id == P("job_id"), L.epoch == P("epoch")))
RENEW = SQL(update(leases).where(
    L.job_id == P("job_id"), L.epoch == P("epoch"), L.worker_id == P("worker"),
    L.expires_at > P("now")).values(expires_at=P("expires")))
MARK_EFFECT = SQL(update(jobs).where(*RUNNING_AT_EPOCH)
                  .values(effect_started=P("t"), updated_at=P("now")))
UPSERT_CHECKPOINT = SQL(lambda insert: _upsert(insert, checkpoints, {
    "job_id": P("job_id"), "name": P("name"), "data_json": P("data"), "epoch": P("epoch"),
    "worker_id": P("worker"), "created_at": P("now"), "updated_at": P("now")},
    key=("job_id", "name"), keep=("created_at",)))
EXPIRED_LEASES_SELECT = (
    select(L.job_id, L.epoch, L.worker_id, L.expires_at, J.effect_started, J.attempts,
           J.max_attempts, J.deadline_at, J.cancel_requested)
    .select_from(leases.join(jobs, J.job_id == L.job_id)).where(L.expires_at <= P("now"))
    .order_by(L.expires_at).limit(P("limit")))
EXPIRED_LEASES = SQL(EXPIRED_LEASES_SELECT)
OVERDUE_WAITING_SELECT = (
    select(J.job_id, J.epoch).where(WAITING, J.deadline_at <= P("now"))
    .order_by(J.deadline_at).limit(P("limit")))
OVERDUE_WAITING = SQL(OVERDUE_WAITING_SELECT)
REQUEST_CANCEL = SQL(update(jobs).where(J.job_id == P("job_id"))
                     .values(cancel_requested=P("t"), updated_at=P("now")))
BACK_TO_WAITING = SQL(update(jobs).where(J.job_id == P("job_id"), J.status == P("status"))
                      .values(status=const("waiting"), run_after=P("now"), updated_at=P("now"),
                              finished_at=null(), effect_started=P("f"),
                              cancel_requested=P("f"), max_attempts=P("max_attempts"),
                              deadline_at=P("deadline")))
SETTLE_UNKNOWN = SQL(
    update(jobs).where(J.job_id == P("job_id"), J.status == const("unknown"))
    .values(status=P("to_status"), result_json=func.coalesce(P("result"), J.result_json),
            finished_at=P("now"), updated_at=P("now")))
JOB_STATUS = SQL(select(J.status).where(J.job_id == P("job_id")))
ANY_WAITING = SQL(select(ONE).where(WAITING).limit(ONE))
SET_STATUS = SQL(
    update(jobs).where(J.job_id == P("job_id"), J.status == P("from_status"),
                       J.epoch == P("epoch"))
    .values(status=P("to_status"), updated_at=P("now"), finished_at=P("finished"),
            last_error=func.coalesce(P("error"), J.last_error)))


class PruneStatements:
    """The statements of one prune, for `n_statuses` statuses (:s0, :s1, ...), one tenant
    (:tenant) or all, and the tables whose rows go with a job.

    The guard is part of every statement, so a job retried or reconciled meanwhile is never
    deleted; finished_at is set by every transition into a finished status. The newest job
    always stays: SQLite gives a new row the largest id plus one, so deleting the largest
    would hand its id (and epoch 1) to the next job, and a late report for the old job could
    then pass the new one's fence."""

    def __init__(self, n_statuses: int, *, by_tenant: bool, related: Sequence[str]) -> None:
        self.guard = (f"status IN ({', '.join(f':s{i}' for i in range(n_statuses))})"
                      " AND finished_at < :cutoff AND job_id < (SELECT MAX(job_id) FROM jobs)"
                      + (" AND tenant = :tenant" if by_tenant else ""))
        picked = f"SELECT job_id FROM jobs WHERE {self.guard}"
        #: How many jobs, and keys, the prune would delete (dry run).
        self.count_jobs = ("SELECT COUNT(*), COUNT(idempotency_key) FROM jobs"
                           f" WHERE {self.guard}")
        #: How many rows of each related table go with them (dry run).
        self.count_related = {table: f"SELECT COUNT(*) FROM {table} WHERE job_id IN ({picked})"
                              for table in related}
        #: The next batch (:limit) of jobs to delete, oldest id first.
        self.pick = (f"SELECT job_id, idempotency_key FROM jobs WHERE {self.guard}"
                     " ORDER BY job_id LIMIT :limit")

    @staticmethod
    def _ids(n: int) -> str:
        return ", ".join(f":j{i}" for i in range(n))

    def count_related_of(self, table: str, n: int) -> str:
        """Rows of `table` that go with the batch's jobs :j0..."""
        return f"SELECT COUNT(*) FROM {table} WHERE job_id IN ({self._ids(n)})"

    def delete_of(self, n: int) -> str:
        """Delete the batch's jobs :j0..., the guard checked again."""
        return f"DELETE FROM jobs WHERE job_id IN ({self._ids(n)}) AND {self.guard}"


#: A job's whole row (`:job_id`), its columns as the schema names them.
JOB_ROW = select(jobs).where(J.job_id == P("job_id"))


def job_row() -> Any:
    """A job's whole row (`:job_id`), its columns as the schema names them."""
    return JOB_ROW


# --- the claim's candidate select -----------------------------------------------------------

#: Candidate statements by shape (roles, kinds, due only, lock clause).
_CANDIDATE_TEXT: dict[tuple[int, int | None, bool, str], str] = {}


def role_kind_params(roles: Sequence[str], kinds: Sequence[str] | None) -> dict[str, Any]:
    """The parameters naming a worker's roles (:r1..) and kinds (:k0..) in a candidate
    select."""
    params: dict[str, Any] = {f"r{i}": role for i, role in enumerate(roles, 1)}
    if kinds is not None:
        params.update((f"k{j}", kind) for j, kind in enumerate(kinds))
    return params


def candidate_sql(roles: Sequence[str], kinds: Sequence[str] | None, *, due_only: bool,
                  lock: str) -> tuple[str, dict[str, Any]]:
    """One index probe per (role, kind): each reads only the head of its slice of the
    partial claim index, however many jobs wait for other roles and kinds. `lock` is the
    store's row-locking clause for each probe ("" for none)."""
    # The text depends only on the shape, so it is built once per shape, not per claim.
    shape = (len(roles), None if kinds is None else len(kinds), due_only, lock)
    text = _CANDIDATE_TEXT.get(shape)
    if text is None:
        text = _CANDIDATE_TEXT[shape] = candidate_text(roles, kinds, due_only, lock)
    return text, role_kind_params(roles, kinds)


def candidate_text(roles: Sequence[str], kinds: Sequence[str] | None, due_only: bool,
                   lock: str) -> str:
    probes, pick = candidate_parts(roles, kinds, due_only, lock)
    return f"WITH {probes} {pick}"


def candidate_parts(roles: Sequence[str], kinds: Sequence[str] | None, due_only: bool,
                    lock: str, *, limit: str = "1", union_only: bool = False
                    ) -> tuple[str, str]:
    """The probes (named CTEs) and the select that picks the first of their heads (or,
    with union_only, the union of every probe's rows)."""
    parts = []
    role_opts: list[str | None] = [None, *roles]
    kind_opts: list[str | None] = list(kinds) if kinds is not None else [None]
    for i, role in enumerate(role_opts):
        for j, kind in enumerate(kind_opts):
            where = ["status = 'waiting'", "priority <= :maxp"]
            if role is None:
                where.append("required_role IS NULL")
            else:
                where.append(f"required_role = :r{i}")
            if kind is not None:
                where.append(f"kind = :k{j}")
            if due_only:
                where.append("run_after <= :now")
                where.append("(deadline_at IS NULL OR deadline_at > :now)")
            parts.append(
                f"c{i}_{j} AS MATERIALIZED (SELECT job_id, priority, created_at FROM jobs"
                f" WHERE {' AND '.join(where)} ORDER BY priority, created_at, job_id"
                f" LIMIT {limit}{lock})"
            )
    names = [p.split(" ", 1)[0] for p in parts]
    union = " UNION ALL ".join(f"SELECT * FROM {n}" for n in names)
    if union_only:
        return ", ".join(parts), union
    return (", ".join(parts), f"SELECT job_id FROM ({union}) AS candidates"
            " ORDER BY priority, created_at, job_id LIMIT 1")
