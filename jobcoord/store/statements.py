"""The statements both stores run, written once with `:name` parameters and compiled by
SQLAlchemy into each driver's own parameter style, and the claim's candidate select per shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text as sql_text
from sqlalchemy.engine import Dialect


def _dialect(name: str) -> Dialect:
    """The dialect whose compiler gives the driver's own parameter style (SQLite: `:name`,
    psycopg: `%(name)s`); imported on first use, so a SQLite process never loads psycopg's."""
    dialect = _DIALECTS.get(name)
    if dialect is None:
        if name == "sqlite":
            from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

            dialect = SQLiteDialect_pysqlite(paramstyle="named")
        else:
            from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

            dialect = PGDialect_psycopg()
        _DIALECTS[name] = dialect
    return dialect


_DIALECTS: dict[str, Dialect] = {}


class SQL:
    """One statement written once with `:name` parameters, compiled by SQLAlchemy once per
    dialect into the driver's own parameter style, so the hot path can hand it straight to
    the DB-API cursor."""

    __slots__ = ("_texts", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self._texts: dict[str, str] = {}

    def text(self, dialect: str) -> str:
        """The statement for the named dialect's driver (compiled on first use)."""
        compiled = self._texts.get(dialect)
        if compiled is None:
            compiled = self._texts[dialect] = str(
                sql_text(self.source).compile(dialect=_dialect(dialect)))
        return compiled

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

INSERT_JOB = SQL(
    "INSERT INTO jobs (tenant, kind, required_role, priority, payload_json, status, created_at,"
    " updated_at, run_after, deadline_at, attempts, max_attempts, epoch, idempotency_key,"
    " effect_started, cancel_requested)"
    " VALUES (:tenant, :kind, :role, :priority, :payload, 'waiting', :now, :now, :run_after,"
    " :deadline, 0, :max_attempts, 0, :key, :f, :f)"
    # Two submissions with one key at once (PostgreSQL: neither sees the other's row yet):
    # the later insert waits for the earlier, then inserts nothing instead of failing.
    " ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING job_id"
)
# A batch without idempotency keys: ids computed inside the write transaction, so the rows go
# in with one executemany instead of one round trip (and one RETURNING) per job.
INSERT_JOB_AT = SQL(
    "INSERT INTO jobs (job_id, tenant, kind, required_role, priority, payload_json, status,"
    " created_at, updated_at, run_after, deadline_at, attempts, max_attempts, epoch,"
    " idempotency_key, effect_started, cancel_requested)"
    " VALUES (:job_id, :tenant, :kind, :role, :priority, :payload, 'waiting', :now, :now,"
    " :run_after, :deadline, 0, :max_attempts, 0, NULL, :f, :f)"
)
LAST_JOB_ID = SQL("SELECT COALESCE(MAX(job_id), 0) FROM jobs")
INSERT_EVENT = SQL(
    "INSERT INTO job_events (job_id, at, from_status, to_status, reason, worker_id, epoch,"
    " detail) VALUES (:job_id, :now, :from_status, :to_status, :reason, :worker, :epoch,"
    " :detail)"
)
JOB_BY_KEY = SQL(
    "SELECT job_id, kind, payload_json, priority, required_role, max_attempts FROM jobs"
    " WHERE tenant = :tenant AND idempotency_key = :key"
)
# The max_attempts a keyed job was submitted with: releases and operator retries raise the
# stored one later, so the key is compared with what the `enqueued` event recorded.
SUBMITTED_DETAIL = SQL(
    "SELECT detail FROM job_events WHERE job_id = :job_id AND reason = 'enqueued'"
    " ORDER BY event_id LIMIT 1"
)
RELEASES = SQL(
    "SELECT COUNT(*) FROM job_events WHERE job_id = :job_id AND reason = 'worker_shutdown'"
)
WORKER = SQL(
    "SELECT roles_json, kinds_json, heartbeat_at, memory_used_pct, temperature_c, on_battery,"
    " user_idle_s FROM workers WHERE worker_id = :worker"
)
ALL_WORKERS = SQL(
    "SELECT worker_id, roles_json, kinds_json, heartbeat_at, memory_used_pct, temperature_c,"
    " on_battery, user_idle_s, last_refusal, last_refusal_detail, last_refusal_at,"
    " heartbeat_raw FROM workers ORDER BY worker_id"
)
UPSERT_WORKER = SQL(
    "INSERT INTO workers (worker_id, roles_json, kinds_json, heartbeat_raw, heartbeat_at,"
    " memory_used_pct, temperature_c, on_battery, user_idle_s, created_at)"
    " VALUES (:worker, :roles, :kinds, :raw, :now, :mem, :temp, :battery, :idle, :now)"
    " ON CONFLICT (worker_id) DO UPDATE SET roles_json = excluded.roles_json,"
    " kinds_json = excluded.kinds_json, heartbeat_raw = excluded.heartbeat_raw,"
    " heartbeat_at = excluded.heartbeat_at, memory_used_pct = excluded.memory_used_pct,"
    " temperature_c = excluded.temperature_c, on_battery = excluded.on_battery,"
    " user_idle_s = excluded.user_idle_s"
)
RECORD_REFUSAL = SQL(
    "UPDATE workers SET last_refusal = :code, last_refusal_detail = :detail,"
    " last_refusal_at = :now WHERE worker_id = :worker"
)
TAKE_JOB = SQL(
    "UPDATE jobs SET status = 'running', epoch = epoch + 1, attempts = attempts + 1,"
    " effect_started = :f, updated_at = :now WHERE job_id = :job_id AND status = 'waiting'"
    " RETURNING job_id, kind, priority, payload_json, attempts, max_attempts, epoch, tenant"
)
INSERT_LEASE = SQL(
    "INSERT INTO leases (job_id, worker_id, epoch, granted_at, expires_at)"
    " VALUES (:job_id, :worker, :epoch, :now, :expires)"
)
CHECKPOINTS = SQL(
    "SELECT name, data_json, epoch, worker_id, updated_at FROM checkpoints"
    " WHERE job_id = :job_id ORDER BY name"
)
OWNED = SQL(
    "SELECT j.status, j.epoch, j.tenant, j.cancel_requested, j.effect_started, j.attempts,"
    " j.max_attempts, j.deadline_at, j.result_json, l.worker_id, l.epoch, l.expires_at"
    " FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id WHERE j.job_id = :job_id"
)
FINISH = SQL(
    "UPDATE jobs SET status = :to_status, result_json = :result, provenance_json = :provenance,"
    " last_error = :error, finished_at = :finished, run_after = :run_after, updated_at = :now"
    " WHERE job_id = :job_id AND status = 'running' AND epoch = :epoch"
)
GRANT_ATTEMPT = SQL("UPDATE jobs SET max_attempts = :max_attempts WHERE job_id = :job_id")
DROP_LEASE = SQL("DELETE FROM leases WHERE job_id = :job_id AND epoch = :epoch")
RENEW = SQL(
    "UPDATE leases SET expires_at = :expires WHERE job_id = :job_id AND epoch = :epoch"
    " AND worker_id = :worker AND expires_at > :now"
)
MARK_EFFECT = SQL(
    "UPDATE jobs SET effect_started = :t, updated_at = :now WHERE job_id = :job_id"
    " AND status = 'running' AND epoch = :epoch"
)
UPSERT_CHECKPOINT = SQL(
    "INSERT INTO checkpoints (job_id, name, data_json, epoch, worker_id, created_at,"
    " updated_at) VALUES (:job_id, :name, :data, :epoch, :worker, :now, :now)"
    " ON CONFLICT (job_id, name) DO UPDATE SET data_json = excluded.data_json,"
    " epoch = excluded.epoch, worker_id = excluded.worker_id, updated_at = excluded.updated_at"
)
EXPIRED_LEASES = SQL(
    "SELECT l.job_id, l.epoch, l.worker_id, l.expires_at, j.effect_started, j.attempts,"
    " j.max_attempts, j.deadline_at, j.cancel_requested FROM leases l"
    " JOIN jobs j ON j.job_id = l.job_id WHERE l.expires_at <= :now"
    " ORDER BY l.expires_at LIMIT :limit"
)
OVERDUE_WAITING = SQL(
    "SELECT job_id, epoch FROM jobs WHERE status = 'waiting' AND deadline_at <= :now"
    " ORDER BY deadline_at LIMIT :limit"
)
REQUEST_CANCEL = SQL(
    "UPDATE jobs SET cancel_requested = :t, updated_at = :now WHERE job_id = :job_id"
)
BACK_TO_WAITING = SQL(
    "UPDATE jobs SET status = 'waiting', run_after = :now, updated_at = :now,"
    " finished_at = NULL, effect_started = :f, cancel_requested = :f,"
    " max_attempts = :max_attempts, deadline_at = :deadline"
    " WHERE job_id = :job_id AND status = :status"
)
SETTLE_UNKNOWN = SQL(
    "UPDATE jobs SET status = :to_status, result_json = COALESCE(:result, result_json),"
    " finished_at = :now, updated_at = :now WHERE job_id = :job_id AND status = 'unknown'"
)
JOB_STATUS = SQL("SELECT status FROM jobs WHERE job_id = :job_id")
ANY_WAITING = SQL("SELECT 1 FROM jobs WHERE status = 'waiting' LIMIT 1")
SET_STATUS = SQL(
    "UPDATE jobs SET status = :to_status, updated_at = :now, finished_at = :finished,"
    " last_error = COALESCE(:error, last_error) WHERE job_id = :job_id"
    " AND status = :from_status AND epoch = :epoch"
)



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


def job_row() -> Any:
    """A job's whole row (`:job_id`), its columns as the model names them. Built on first use:
    the models import SQLAlchemy's ORM, which the claim and complete commands never need."""
    global _JOB_ROW
    if _JOB_ROW is None:
        from sqlalchemy import bindparam, select

        from ..models import Job

        _JOB_ROW = select(Job.__table__).where(Job.__table__.c.job_id == bindparam("job_id"))
    return _JOB_ROW


_JOB_ROW: Any = None


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
