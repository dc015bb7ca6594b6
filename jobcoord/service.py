"""The coordinator: every rule of the job lifecycle, in one place.

Each public method is one short transaction (prune: one per batch; some reads: none) and
returns plain dicts ready for JSON.
Write transactions begin with BEGIN IMMEDIATE on SQLite (db.py), so reading a job and changing
it can never interleave with another writer. Every state change is additionally a
compare-and-set on (status, epoch), and writes its job_events row in the same transaction.
No file, network or model I/O ever happens inside a transaction.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from . import faults
from . import validate as v
from .clock import MICROS, iso, now_us, seconds_to_us
from .db import SQL, Database, Target, resolve_target
from .errors import InvalidInput, JobcoordError, Refused
from .policy import GateDecision, Policy, Readings, evaluate
from .states import FINAL_STATUSES, STATUSES

DEFAULT_TENANT = "default"
_NO_KINDS = "give at least one kind, or leave it out to take any kind"
#: Claim candidate statements by shape (roles, kinds, due only, lock clause; PostgreSQL's
#: folded claim statement is cached here too, its lock clause marked " take").
_CANDIDATE_TEXT: dict[tuple[int, int | None, bool, str], str] = {}

# --- fixed statements -------------------------------------------------------------------

_INSERT_JOB = SQL(
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
_INSERT_JOB_AT = SQL(
    "INSERT INTO jobs (job_id, tenant, kind, required_role, priority, payload_json, status,"
    " created_at, updated_at, run_after, deadline_at, attempts, max_attempts, epoch,"
    " idempotency_key, effect_started, cancel_requested)"
    " VALUES (:job_id, :tenant, :kind, :role, :priority, :payload, 'waiting', :now, :now,"
    " :run_after, :deadline, 0, :max_attempts, 0, NULL, :f, :f)"
)
_LAST_JOB_ID = SQL("SELECT COALESCE(MAX(job_id), 0) FROM jobs")
_NEXT_JOB_IDS = SQL(
    "SELECT nextval(pg_get_serial_sequence('jobs', 'job_id')) FROM generate_series(1, :n)"
)
_INSERT_EVENT = SQL(
    "INSERT INTO job_events (job_id, at, from_status, to_status, reason, worker_id, epoch,"
    " detail) VALUES (:job_id, :now, :from_status, :to_status, :reason, :worker, :epoch,"
    " :detail)"
)
_JOB_BY_KEY = SQL(
    "SELECT job_id, kind, payload_json, priority, required_role, max_attempts FROM jobs"
    " WHERE tenant = :tenant AND idempotency_key = :key"
)
# The max_attempts a keyed job was submitted with: releases and operator retries raise the
# stored one later, so the key is compared with what the `enqueued` event recorded.
_SUBMITTED_DETAIL = SQL(
    "SELECT detail FROM job_events WHERE job_id = :job_id AND reason = 'enqueued'"
    " ORDER BY event_id LIMIT 1"
)
_RELEASES = SQL(
    "SELECT COUNT(*) FROM job_events WHERE job_id = :job_id AND reason = 'worker_shutdown'"
)
_WORKER = SQL(
    "SELECT roles_json, kinds_json, heartbeat_at, memory_used_pct, temperature_c, on_battery,"
    " user_idle_s FROM workers WHERE worker_id = :worker"
)
_UPSERT_WORKER = SQL(
    "INSERT INTO workers (worker_id, roles_json, kinds_json, heartbeat_raw, heartbeat_at,"
    " memory_used_pct, temperature_c, on_battery, user_idle_s, created_at)"
    " VALUES (:worker, :roles, :kinds, :raw, :now, :mem, :temp, :battery, :idle, :now)"
    " ON CONFLICT (worker_id) DO UPDATE SET roles_json = excluded.roles_json,"
    " kinds_json = excluded.kinds_json, heartbeat_raw = excluded.heartbeat_raw,"
    " heartbeat_at = excluded.heartbeat_at, memory_used_pct = excluded.memory_used_pct,"
    " temperature_c = excluded.temperature_c, on_battery = excluded.on_battery,"
    " user_idle_s = excluded.user_idle_s"
)
_RECORD_REFUSAL = SQL(
    "UPDATE workers SET last_refusal = :code, last_refusal_detail = :detail,"
    " last_refusal_at = :now WHERE worker_id = :worker"
)
_TAKE_JOB = SQL(
    "UPDATE jobs SET status = 'running', epoch = epoch + 1, attempts = attempts + 1,"
    " effect_started = :f, updated_at = :now WHERE job_id = :job_id AND status = 'waiting'"
    " RETURNING job_id, kind, priority, payload_json, attempts, max_attempts, epoch, tenant"
)
_INSERT_LEASE = SQL(
    "INSERT INTO leases (job_id, worker_id, epoch, granted_at, expires_at)"
    " VALUES (:job_id, :worker, :epoch, :now, :expires)"
)
_CHECKPOINTS = SQL(
    "SELECT name, data_json, epoch, worker_id, updated_at FROM checkpoints"
    " WHERE job_id = :job_id ORDER BY name"
)
_OWNED = SQL(
    "SELECT j.status, j.epoch, j.tenant, j.cancel_requested, j.effect_started, j.attempts,"
    " j.max_attempts, j.deadline_at, j.result_json, l.worker_id, l.epoch, l.expires_at"
    " FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id WHERE j.job_id = :job_id"
)
# PostgreSQL: the fence read takes the job row's lock itself (see _owned).
_OWNED_LOCKED = SQL(_OWNED.sqlite + " FOR UPDATE OF j")
_FINISH = SQL(
    "UPDATE jobs SET status = :to_status, result_json = :result, provenance_json = :provenance,"
    " last_error = :error, finished_at = :finished, run_after = :run_after, updated_at = :now"
    " WHERE job_id = :job_id AND status = 'running' AND epoch = :epoch"
)
_GRANT_ATTEMPT = SQL("UPDATE jobs SET max_attempts = :max_attempts WHERE job_id = :job_id")
_DROP_LEASE = SQL("DELETE FROM leases WHERE job_id = :job_id AND epoch = :epoch")
_RENEW = SQL(
    "UPDATE leases SET expires_at = :expires WHERE job_id = :job_id AND epoch = :epoch"
    " AND worker_id = :worker AND expires_at > :now"
)
_MARK_EFFECT = SQL(
    "UPDATE jobs SET effect_started = :t, updated_at = :now WHERE job_id = :job_id"
    " AND status = 'running' AND epoch = :epoch"
)
_UPSERT_CHECKPOINT = SQL(
    "INSERT INTO checkpoints (job_id, name, data_json, epoch, worker_id, created_at,"
    " updated_at) VALUES (:job_id, :name, :data, :epoch, :worker, :now, :now)"
    " ON CONFLICT (job_id, name) DO UPDATE SET data_json = excluded.data_json,"
    " epoch = excluded.epoch, worker_id = excluded.worker_id, updated_at = excluded.updated_at"
)
_EXPIRED_LEASES = SQL(
    "SELECT l.job_id, l.epoch, l.worker_id, l.expires_at, j.effect_started, j.attempts,"
    " j.max_attempts, j.deadline_at, j.cancel_requested FROM leases l"
    " JOIN jobs j ON j.job_id = l.job_id WHERE l.expires_at <= :now"
    " ORDER BY l.expires_at LIMIT :limit"
)
_OVERDUE_WAITING = SQL(
    "SELECT job_id, epoch FROM jobs WHERE status = 'waiting' AND deadline_at <= :now"
    " ORDER BY deadline_at LIMIT :limit"
)
# PostgreSQL runs several reapers, completers and operators at once under READ COMMITTED:
# each takes the row locks of what it is about to change, and a reaper skips rows another
# transaction holds instead of failing its compare-and-set after waiting for them.
_EXPIRED_LEASES_LOCKED = SQL(_EXPIRED_LEASES.sqlite + " FOR UPDATE OF l, j SKIP LOCKED")
_OVERDUE_WAITING_LOCKED = SQL(_OVERDUE_WAITING.sqlite + " FOR UPDATE SKIP LOCKED")
_LOCK_JOB = SQL("SELECT job_id FROM jobs WHERE job_id = :job_id FOR UPDATE")
_SET_STATUS = SQL(
    "UPDATE jobs SET status = :to_status, updated_at = :now, finished_at = :finished,"
    " last_error = COALESCE(:error, last_error) WHERE job_id = :job_id"
    " AND status = :from_status AND epoch = :epoch"
)
# --- PostgreSQL: one statement per transition (Database.folds_transitions) ---------------
#
# On PostgreSQL each statement is a round trip, so the statements of one transition run as a
# single data-modifying WITH statement: the same statements, guards and rows as the separate
# ones SQLite runs (_TAKE_JOB + _INSERT_LEASE + _INSERT_EVENT; _FINISH + _DROP_LEASE +
# _INSERT_EVENT), in the same transaction. A data-modifying CTE runs exactly once whether or
# not anything reads it, and the lease and the event are written only for the row the
# compare-and-set actually changed.

# The claim: the candidate probes read the first :heads rows of each (role, kind) slice WITHOUT
# locks; `pick` then locks only the one row it returns, the first candidate in claim order that
# no concurrent claimer holds (FOR UPDATE SKIP LOCKED; a row another claim took meanwhile fails
# the status recheck). Locking in every probe would hold the head of every slice until commit,
# and a concurrent claimer could be told nothing waits while jobs it could take were untaken.
# Then the take, the lease and the `claimed` event. The event's detail is v.dumps({"attempt":
# n, "expires_at": iso}) spelled in SQL: sorted keys, no spaces; :expires_json is the JSON
# string of the expiry. Always one row: how many candidates the probes found, the picked id
# (NULL when every candidate was held by other claimers), then the taken job (NULLs when the
# compare-and-set took nothing).
_CLAIM_PICK = (
    "SELECT job_id FROM jobs WHERE job_id IN (SELECT job_id FROM cand)"
    " AND status = 'waiting' AND priority <= :maxp AND run_after <= :now"
    " AND (deadline_at IS NULL OR deadline_at > :now)"
    " ORDER BY priority, created_at, job_id LIMIT 1 FOR UPDATE SKIP LOCKED"
)
#: Heads read per slice by a PostgreSQL claim; the next size is tried only when every
#: candidate was held by concurrent claimers.
CLAIM_HEADS = (4, 64, 1024)
_CLAIM_FOLDED = (
    "WITH {probes}, cand AS MATERIALIZED ({union}), pick AS MATERIALIZED ({pick}),"
    " taken AS (UPDATE jobs SET status = 'running', epoch = epoch + 1, attempts = attempts + 1,"
    " effect_started = :f, updated_at = :now WHERE job_id = (SELECT job_id FROM pick)"
    " AND status = 'waiting'"
    " RETURNING job_id, kind, priority, payload_json, attempts, max_attempts, epoch, tenant),"
    " leased AS (INSERT INTO leases (job_id, worker_id, epoch, granted_at, expires_at)"
    " SELECT job_id, :worker, epoch, :now, :expires FROM taken),"
    " claimed AS (INSERT INTO job_events (job_id, at, from_status, to_status, reason,"
    " worker_id, epoch, detail) SELECT job_id, :now, 'waiting', 'running', 'claimed', :worker,"
    " epoch, '{{\"attempt\":' || CAST(attempts AS text) || ',\"expires_at\":' || :expires_json"
    " || '}}' FROM taken)"
    " SELECT (SELECT count(*) FROM cand), pick.job_id, taken.job_id, taken.kind,"
    " taken.priority, taken.payload_json, taken.attempts, taken.max_attempts, taken.epoch,"
    " taken.tenant FROM (SELECT 1) AS one LEFT JOIN pick ON true LEFT JOIN taken ON true"
)
# A running job's end: _FINISH's compare-and-set, the lease dropped, the event recorded only
# for the row it changed. Returns how many rows the compare-and-set changed.
_END_FOLDED = SQL(
    "WITH finished AS (UPDATE jobs SET status = :to_status, result_json = :result,"
    " provenance_json = :provenance, last_error = :error, finished_at = :finished,"
    " run_after = :run_after, updated_at = :now"
    " WHERE job_id = :job_id AND status = 'running' AND epoch = :epoch RETURNING job_id),"
    " dropped AS (DELETE FROM leases WHERE job_id = :job_id AND epoch = :epoch),"
    " ended AS (INSERT INTO job_events (job_id, at, from_status, to_status, reason, worker_id,"
    " epoch, detail) SELECT job_id, :now, 'running', :to_status, :reason, :worker, :epoch,"
    " :detail FROM finished)"
    " SELECT count(*) FROM finished"
)

_JOB_ROW = SQL(
    "SELECT job_id, tenant, kind, required_role, priority, payload_json, status, created_at,"
    " updated_at, run_after, deadline_at, attempts, max_attempts, epoch, idempotency_key,"
    " result_json, provenance_json, last_error, effect_started, cancel_requested, finished_at"
    " FROM jobs WHERE job_id = :job_id"
)
_JOB_COLUMNS = (
    "job_id", "tenant", "kind", "required_role", "priority", "payload_json", "status",
    "created_at", "updated_at", "run_after", "deadline_at", "attempts", "max_attempts", "epoch",
    "idempotency_key", "result_json", "provenance_json", "last_error", "effect_started",
    "cancel_requested", "finished_at",
)


def _name(memo: dict[tuple[str, type, Any], str] | None, value: Any, field: str) -> str:
    """v.name, remembered in `memo` when one is given."""
    if memo is None or not isinstance(value, str):
        return v.name(value, field)
    key = (field, type(value), value)
    checked = memo.get(key)
    if checked is None:
        checked = memo[key] = v.name(value, field)
    return checked


def _spec_list(specs: Any) -> list[Any]:
    """enqueue_many's argument: a list (or other iterable) of JobSpecs or mappings."""
    if isinstance(specs, str | bytes | bytearray | Mapping | JobSpec) or specs is None:
        raise InvalidInput("invalid_input", "specs: give a list of jobs (JobSpec or mapping)",
                           field="specs")
    try:
        return list(specs)
    except TypeError:
        raise InvalidInput("invalid_input", "specs: give a list of jobs (JobSpec or mapping)",
                           field="specs") from None


def _spec(item: Any) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if not isinstance(item, Mapping):
        raise InvalidInput("invalid_input", "specs: each job is a JobSpec or a mapping of its "
                           "fields", field="specs")
    unknown = sorted(str(k) for k in item if k not in JobSpec.__dataclass_fields__)
    if unknown or "kind" not in item:
        raise InvalidInput("invalid_input", "specs: each job needs a kind, and only "
                           f"{', '.join(JobSpec.__dataclass_fields__)}"
                           + (f" (unknown: {', '.join(unknown)})" if unknown else ""),
                           field="specs")
    return JobSpec(**item)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue (the batch API takes many)."""

    kind: str
    payload: Any = None
    priority: int | str | None = None
    role: str | None = None
    tenant: str = DEFAULT_TENANT
    key: str | None = None
    max_attempts: int | None = None
    deadline_s: float | None = None
    delay_s: float = 0.0


class _Checked(NamedTuple):
    """A validated JobSpec, ready to insert (a tuple: a batch builds one per job, and a
    frozen dataclass costs several times as much to construct)."""

    kind: str
    payload_text: str
    priority: int
    role: str | None
    tenant: str
    key: str | None
    max_attempts: int
    #: Relative to the submission time, which is read inside the write transaction.
    deadline_in_us: int | None
    delay_us: int


class Coordinator:
    """The public Python API. Open one per process (it holds a connection pool)."""

    def __init__(self, db: Database, policy: Policy | None = None, *, verify: bool = True):
        self.db = db
        self.policy = policy or Policy()
        self.features: set[str] = set()
        if verify:
            from .migrate import verify_schema

            self.features = verify_schema(db)

    @classmethod
    def open(
        cls,
        target: str | Target | None = None,
        *,
        url: str | None = None,
        policy: Policy | None = None,
        synchronous: str = "full",
        busy_timeout: float = 5.0,
        verify: bool = True,
        migrate: bool = False,
    ) -> Coordinator:
        """Open a coordinator on a SQLite path, a URL (positionally too: any string with
        "://", e.g. "postgresql+psycopg://...", "postgres://...", "sqlite:///path"), or a
        resolved Target. With migrate=True the database (a SQLite file, if missing) is created
        or upgraded to this version's schema first, as `jobcoord migrate` would."""
        if isinstance(target, str) and "://" in target:
            if url is not None:
                raise InvalidInput("invalid_input", "give the URL once: positionally or as "
                                   "url=, not both")
            target, url = None, target
        if isinstance(url, str) and url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://"):]  # the short scheme libpq accepts
        if target is not None and not isinstance(target, str | Target):
            raise InvalidInput("invalid_input", "target: give a SQLite path or a database URL")
        if not isinstance(target, Target):
            target = resolve_target(db=target, url=url)
        if migrate:
            from .migrate import migrate as _migrate

            fresh = Database.open(target, create=True, synchronous=synchronous,
                                  busy_timeout=busy_timeout)
            try:
                _migrate(fresh)
            finally:
                fresh.close()
        db = Database.open(target, synchronous=synchronous, busy_timeout=busy_timeout)
        try:
            return cls(db, policy, verify=verify)
        except BaseException:
            db.close()
            raise

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers ------------------------------------------------------------------------

    def _event(self, conn: Connection, job_id: int, now: int, from_status: str | None,
               to_status: str, reason: str, worker: str | None = None,
               epoch: int | None = None, detail: Mapping[str, Any] | None = None) -> None:
        self.db.execute(conn, _INSERT_EVENT, {
            "job_id": job_id, "now": now, "from_status": from_status, "to_status": to_status,
            "reason": reason, "worker": worker, "epoch": epoch,
            "detail": v.dumps(detail) if detail else None,
        })

    def _lease_seconds(self, lease_s: float | None) -> int:
        value = self.policy.default_lease_s if lease_s is None else lease_s
        return seconds_to_us(v.finite_seconds(value, "lease", 0, self.policy.max_lease_s,
                                       lo_inclusive=False))

    def _check_spec(self, spec: JobSpec,
                    names: dict[tuple[str, type, Any], str] | None = None) -> _Checked:
        """Validate one job. `names` remembers kinds, roles and tenants already checked in
        this batch (a batch repeats a few of them; checking each again is a third of the
        cost of accepting a job)."""
        p = self.policy
        _, payload_text = v.json_value(
            {} if spec.payload is None else spec.payload, "payload",
            max_bytes=p.max_payload_bytes, require_object=True,
        )
        deadline_us = None
        delay_us = seconds_to_us(v.finite_seconds(spec.delay_s, "delay", 0, v.TEN_YEARS_S))
        if spec.deadline_s is not None:
            deadline_us = seconds_to_us(
                v.finite_seconds(spec.deadline_s, "deadline", 0, v.TEN_YEARS_S, lo_inclusive=False))
            if deadline_us <= delay_us:
                # A job that may not start before its deadline could only ever die.
                raise InvalidInput("invalid_input", "deadline: must be later than the delay "
                                   "(no attempt may start at or after the deadline)",
                                   field="deadline")
        return _Checked(
            kind=_name(names, spec.kind, "kind"),
            payload_text=payload_text,
            priority=v.priority(p.default_priority if spec.priority is None else spec.priority),
            role=None if spec.role is None else _name(names, spec.role, "role"),
            tenant=_name(names, spec.tenant, "tenant"),
            key=None if spec.key is None else v.utf8_text(spec.key, "key", max_len=v.MAX_KEY),
            max_attempts=v.whole(
                p.default_max_attempts if spec.max_attempts is None else spec.max_attempts,
                "max_attempts", 1, 100),
            deadline_in_us=deadline_us,
            delay_us=delay_us,
        )

    def _key_differences(self, conn: Connection, existing: Any, c: _Checked) -> list[str]:
        """The submitted fields in which a resubmission with the same key differs from the job
        the key made. Deadline and delay are relative to each submission's own time, so they
        are not compared."""
        differ = [name for name, old, new in (
            ("kind", existing[1], c.kind), ("payload", existing[2], c.payload_text),
            ("priority", existing[3], c.priority), ("role", existing[4], c.role))
            if old != new]
        submitted = existing[5]
        if submitted != c.max_attempts:
            # Raised since by a release or an operator retry? Compare what was submitted.
            recorded = self.db.execute(conn, _SUBMITTED_DETAIL, {"job_id": existing[0]}
                                       ).fetchone()
            shown = _loads(recorded[0]) if recorded is not None else None
            if isinstance(shown, dict) and isinstance(shown.get("max_attempts"), int):
                submitted = shown["max_attempts"]
        if submitted != c.max_attempts:
            differ.append("max_attempts")
        return differ

    def _insert(self, conn: Connection, c: _Checked, now: int, *, after_conflict: bool = False
                ) -> dict[str, Any] | JobcoordError:
        if c.key is not None:
            existing = self.db.execute(conn, _JOB_BY_KEY, {"tenant": c.tenant, "key": c.key}
                                       ).fetchone()
            if existing is not None:
                differ = self._key_differences(conn, existing, c)
                if differ:
                    return Refused(
                        "idempotency_conflict",
                        f"idempotency key {c.key!r} was already used in tenant {c.tenant!r} "
                        f"for job {existing[0]} with a different {', '.join(differ)}",
                        job_id=existing[0], fields=differ,
                    )
                return {"job_id": existing[0], "created": False}
        inserted = self.db.execute(conn, _INSERT_JOB, {
            "tenant": c.tenant, "kind": c.kind, "role": c.role, "priority": c.priority,
            "payload": c.payload_text, "now": now, "run_after": now + c.delay_us,
            "deadline": None if c.deadline_in_us is None else now + c.deadline_in_us,
            "max_attempts": c.max_attempts, "key": c.key, "f": False,
        }).fetchone()
        if inserted is None and not after_conflict:
            # The same key was committed meanwhile: answer as if it had arrived first.
            return self._insert(conn, c, now, after_conflict=True)
        if inserted is None:
            raise JobcoordError("internal_error", f"idempotency key {c.key!r} conflicts with "
                                "a job that cannot be read")
        job_id = inserted[0]
        detail: dict[str, Any] = {"priority": c.priority, "max_attempts": c.max_attempts}
        if c.delay_us:
            detail["run_after"] = iso(now + c.delay_us)
        self._event(conn, job_id, now, None, "waiting", "enqueued", detail=detail)
        return {"job_id": job_id, "created": True}

    def _insert_bulk(self, conn: Connection, checked: Sequence[_Checked], now: int
                     ) -> list[dict[str, Any]]:
        """Insert keyless jobs and their `enqueued` events with two executemany calls."""
        n = len(checked)
        if self.db.is_sqlite:
            # BEGIN IMMEDIATE holds the only write lock: these are the ids SQLite would pick.
            first = self.db.execute(conn, _LAST_JOB_ID, {}).fetchone()[0] + 1
            ids: Sequence[int] = range(first, first + n)
        else:
            ids = sorted(r[0] for r in self.db.execute(conn, _NEXT_JOB_IDS, {"n": n}))
        self.db.execute_many(conn, _INSERT_JOB_AT, [
            {"job_id": job_id, "tenant": c.tenant, "kind": c.kind, "role": c.role,
             "priority": c.priority, "payload": c.payload_text, "now": now,
             "run_after": now + c.delay_us,
             "deadline": None if c.deadline_in_us is None else now + c.deadline_in_us,
             "max_attempts": c.max_attempts, "f": False}
            for job_id, c in zip(ids, checked, strict=True)])
        details: dict[tuple[int, int, int], str] = {}  # the same detail `_insert` records
        events = []
        for job_id, c in zip(ids, checked, strict=True):
            detail = details.get((c.priority, c.delay_us, c.max_attempts))
            if detail is None:
                shown: dict[str, Any] = {"priority": c.priority, "max_attempts": c.max_attempts}
                if c.delay_us:
                    shown["run_after"] = iso(now + c.delay_us)
                detail = details[(c.priority, c.delay_us, c.max_attempts)] = v.dumps(shown)
            events.append({"job_id": job_id, "now": now, "from_status": None,
                           "to_status": "waiting", "reason": "enqueued", "worker": None,
                           "epoch": None, "detail": detail})
        self.db.execute_many(conn, _INSERT_EVENT, events)
        return [{"job_id": job_id, "created": True} for job_id in ids]

    # --- submission ---------------------------------------------------------------------

    def enqueue(self, kind: str, payload: Any = None, *, priority: int | str | None = None,
                role: str | None = None, tenant: str = DEFAULT_TENANT, key: str | None = None,
                max_attempts: int | None = None, deadline_s: float | None = None,
                delay_s: float = 0.0) -> dict[str, Any]:
        """Accept a job. Returns {"job_id", "created"} only after the row is committed.
        The same tenant and idempotency key returns the same job (created False); the same
        key with another kind or payload is refused (idempotency_conflict)."""
        spec = JobSpec(kind, payload, priority, role, tenant, key, max_attempts, deadline_s,
                       delay_s)
        checked = self._check_spec(spec)
        # The clock is read inside the transaction (a busy retry reads it again), so creation
        # times follow commit order.
        return self.db.write(lambda conn: self._insert(conn, checked, now_us()), "enqueue")

    def enqueue_many(self, specs: Iterable[JobSpec | Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Accept many jobs in one transaction: all of them or none."""
        names: dict[tuple[str, type, Any], str] = {}
        checked = [self._check_spec(_spec(s), names) for s in _spec_list(specs)]

        if checked and all(c.key is None for c in checked):
            return self.db.write(lambda conn: self._insert_bulk(conn, checked, now_us()),
                                 "enqueue")

        def _all(conn: Connection) -> list[dict[str, Any]] | JobcoordError:
            out = []
            now = now_us()
            for c in checked:
                res = self._insert(conn, c, now)
                if isinstance(res, JobcoordError):
                    raise res  # roll the whole batch back
                out.append(res)
            return out

        return self.db.write(_all, "enqueue")

    # --- workers ------------------------------------------------------------------------

    def heartbeat(self, worker_id: str, *, roles: Sequence[str] | None = None,
                  readings: Mapping[str, Any] | str | None = None,
                  kinds: Sequence[str] | None = None) -> dict[str, Any]:
        """Record a worker's readings, exactly as received, with the time received."""
        worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
        role_list = [] if roles is None else v.names(roles, "role")
        kind_list = None if kinds is None else v.names(kinds, "kind", empty=_NO_KINDS)
        raw_text, parsed = parse_readings(readings)
        params = {
            "worker": worker_id, "roles": v.dumps(role_list),
            "kinds": None if kind_list is None else v.dumps(kind_list), "raw": raw_text,
            "mem": parsed.memory_used_pct, "temp": parsed.temperature_c,
            "battery": parsed.on_battery, "idle": parsed.user_idle_s,
        }

        def _do(conn: Connection) -> int:
            now = now_us()  # the time received: read under the write lock
            self.db.run(conn, _UPSERT_WORKER, {**params, "now": now})
            return now

        now = self.db.write(_do, "heartbeat")
        gates = evaluate(self.policy, parsed)
        return {"worker_id": worker_id, "roles": role_list, "kinds": kind_list,
                "received_at": iso(now), "readings": _readings_json(parsed),
                "gates": _gates_json(gates)}

    # --- claim --------------------------------------------------------------------------

    def _candidate_sql(self, roles: Sequence[str], kinds: Sequence[str] | None, *,
                       due_only: bool, locked: bool = True) -> tuple[str, dict[str, Any]]:
        """One index probe per (role, kind): each reads only the head of its slice of the
        partial claim index, however many jobs wait for other roles and kinds. `locked`
        False is for diagnosis only: it must neither lock rows nor skip locked ones."""
        params: dict[str, Any] = {f"r{i}": role for i, role in enumerate(roles, 1)}
        if kinds is not None:
            params.update((f"k{j}", kind) for j, kind in enumerate(kinds))
        lock = self.db.lock_clause() if locked else ""
        # The text depends only on the shape, so it is built once per shape, not per claim.
        shape = (len(roles), None if kinds is None else len(kinds), due_only, lock)
        text = _CANDIDATE_TEXT.get(shape)
        if text is None:
            text = _CANDIDATE_TEXT[shape] = self._candidate_text(roles, kinds, due_only, lock)
        return text, params

    @staticmethod
    def _candidate_text(roles: Sequence[str], kinds: Sequence[str] | None, due_only: bool,
                        lock: str) -> str:
        probes, pick = Coordinator._candidate_parts(roles, kinds, due_only, lock)
        return f"WITH {probes} {pick}"

    def _claim_folded_sql(self, roles: Sequence[str], kinds: Sequence[str] | None
                          ) -> tuple[str, dict[str, Any]]:
        """PostgreSQL: the claim's candidate probes, take, lease and event as one statement
        (_CLAIM_FOLDED), built once per shape like the candidate query."""
        params: dict[str, Any] = {f"r{i}": role for i, role in enumerate(roles, 1)}
        if kinds is not None:
            params.update((f"k{j}", kind) for j, kind in enumerate(kinds))
        shape = (len(roles), None if kinds is None else len(kinds), True, " take")
        text = _CANDIDATE_TEXT.get(shape)
        if text is None:
            probes, union = self._candidate_parts(roles, kinds, True, "", limit=":heads",
                                                  union_only=True)
            text = _CANDIDATE_TEXT[shape] = _CLAIM_FOLDED.format(probes=probes, union=union,
                                                                 pick=_CLAIM_PICK)
        return text, params

    @staticmethod
    def _candidate_parts(roles: Sequence[str], kinds: Sequence[str] | None, due_only: bool,
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

    def claim(self, worker_id: str, *, lease_s: float | None = None,
              kinds: Sequence[str] | None = None) -> dict[str, Any]:
        """Give this worker the first eligible waiting job, under a new lease and epoch.

        Returns {"job": {...}, "lease": {...}}, or {"job": None, "reason": CODE, "detail"}
        when nothing can be claimed (the refusal is also recorded on the worker)."""
        worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
        lease_us = self._lease_seconds(lease_s)
        kind_filter = None if kinds is None else v.names(kinds, "kind", empty=_NO_KINDS)
        return self.db.write(
            lambda conn: self._claim(conn, worker_id, lease_us, kind_filter, now_us()), "claim")

    def _refuse(self, conn: Connection, worker_id: str, now: int, code: str, detail: str,
                known_worker: bool = True) -> dict[str, Any]:
        if known_worker:
            self.db.execute(conn, _RECORD_REFUSAL, {"worker": worker_id, "code": code,
                                                    "detail": detail, "now": now})
        return {"job": None, "reason": code, "detail": detail}

    def _claim(self, conn: Connection, worker_id: str, lease_us: int,
               kinds: Sequence[str] | None, now: int) -> dict[str, Any]:
        row = self.db.execute(conn, _WORKER, {"worker": worker_id}).fetchone()
        if row is None:
            return self._refuse(conn, worker_id, now, "heartbeat_missing",
                                f"worker {worker_id} has never sent a heartbeat", False)
        roles = json.loads(row[0])
        if kinds is None and row[1] is not None:
            kinds = json.loads(row[1])
        if kinds is not None and not kinds:
            # Heartbeats refuse an empty list; a row holding one claims nothing, clearly,
            # instead of building a statement with no probe.
            return self._refuse(conn, worker_id, now, "no_matching_role",
                                f"worker {worker_id} handles no kinds (its heartbeat listed "
                                "none)")
        age_s = (now - row[2]) / MICROS if row[2] is not None else None
        if age_s is None or age_s > self.policy.heartbeat_max_age_s:
            return self._refuse(conn, worker_id, now, "heartbeat_stale",
                                f"last heartbeat {age_s:.0f}s ago; the limit is "
                                f"{self.policy.heartbeat_max_age_s:g}s")
        gates = evaluate(self.policy, Readings(row[3], row[4], _bool(row[5]), row[6]))
        if gates.blocks_all:
            code, detail = gates.refusal or ("gated", "the gates refuse every priority")
            return self._refuse(conn, worker_id, now, code, detail)
        expires = now + lease_us
        if self.db.folds_transitions:
            # PostgreSQL: candidate, take, lease and event in one statement (_CLAIM_FOLDED).
            text, params = self._claim_folded_sql(roles, kinds)
            params.update(now=now, maxp=gates.max_priority, f=False, worker=worker_id,
                          expires=expires, expires_json=v.dumps(iso(expires)))
            for heads in CLAIM_HEADS:
                params["heads"] = heads
                found = self.db.execute(conn, SQL.cached(text), params).fetchone()
                # Every candidate held by other claimers, and a slice may hold more: look
                # further down the slices before saying they are all being claimed.
                if found[1] is not None or found[0] < heads:
                    break
            if found[1] is None:
                code, detail = self._why_nothing(conn, roles, kinds, gates, now)
                return self._refuse(conn, worker_id, now, code, detail)
            if found[2] is None:  # the compare-and-set took nothing: defence in depth
                return self._refuse(conn, worker_id, now, "no_waiting_jobs", "lost a race")
            job_id, kind, priority, payload, attempts, max_attempts, epoch, tenant = found[2:]
            # All three happened in that one statement; a fault here still sits inside the
            # open transaction, before its commit.
            faults.point("claim.after_take")
            faults.point("claim.after_lease")
            faults.point("claim.after_event")
        else:
            text, params = self._candidate_sql(roles, kinds, due_only=True)
            params.update(now=now, maxp=gates.max_priority)
            found = self.db.execute(conn, SQL.cached(text), params).fetchone()
            if found is None:
                code, detail = self._why_nothing(conn, roles, kinds, gates, now)
                return self._refuse(conn, worker_id, now, code, detail)
            job = self.db.execute(conn, _TAKE_JOB, {"job_id": found[0], "now": now, "f": False}
                                  ).fetchone()
            if job is None:  # cannot happen under the write lock; the guard is defence in depth
                return self._refuse(conn, worker_id, now, "no_waiting_jobs", "lost a race")
            job_id, kind, priority, payload, attempts, max_attempts, epoch, tenant = job
            faults.point("claim.after_take")
            self.db.execute(conn, _INSERT_LEASE, {"job_id": job_id, "worker": worker_id,
                                                  "epoch": epoch, "now": now,
                                                  "expires": expires})
            faults.point("claim.after_lease")
            self._event(conn, job_id, now, "waiting", "running", "claimed", worker_id, epoch,
                        {"expires_at": iso(expires), "attempt": attempts})
            faults.point("claim.after_event")
        # Checkpoints are written under a lease, so a job's first epoch has none to read.
        checkpoints = [] if epoch == 1 else [
            {"name": r[0], "data": json.loads(r[1]), "epoch": r[2], "worker_id": r[3],
             "updated_at": iso(r[4])}
            for r in self.db.execute(conn, _CHECKPOINTS, {"job_id": job_id})
        ]
        return {
            "job": {"job_id": job_id, "kind": kind, "priority": priority, "tenant": tenant,
                    "payload": json.loads(payload), "attempt": attempts,
                    "max_attempts": max_attempts, "checkpoints": checkpoints},
            "lease": {"worker_id": worker_id, "epoch": epoch, "expires_at": iso(expires),
                      "expires_at_us": expires},
        }

    def _why_nothing(self, conn: Connection, roles: Sequence[str], kinds: Sequence[str] | None,
                     gates: GateDecision, now: int) -> tuple[str, str]:
        if self.db.run_text(conn, "SELECT 1 FROM jobs WHERE status = 'waiting' LIMIT 1"
                            ).first() is None:
            return "no_waiting_jobs", "no job is waiting"
        text, params = self._candidate_sql(roles, kinds, due_only=True, locked=False)
        params.update(now=now, maxp=gates.max_priority)
        if self.db.run_text(conn, text, params).first() is not None:
            # Only on PostgreSQL: the claim skipped rows that concurrent claims hold locked.
            return ("no_waiting_jobs",
                    "every job this worker could run is being claimed by another worker")
        text, params = self._candidate_sql(roles, kinds, due_only=True, locked=False)
        params.update(now=now, maxp=3)
        if gates.refusal and self.db.run_text(conn, text, params).first() is not None:
            return gates.refusal
        text, params = self._candidate_sql(roles, kinds, due_only=False, locked=False)
        params.update(maxp=3)
        if self.db.run_text(conn, text, params).first() is not None:
            return ("no_waiting_jobs",
                    "the waiting jobs this worker could run are scheduled for later or past "
                    "their deadline")
        # Each statement above may see a newer snapshot on PostgreSQL: the jobs seen waiting
        # at first may have been claimed since. Ask again before blaming the role.
        if self.db.run_text(conn, "SELECT 1 FROM jobs WHERE status = 'waiting' LIMIT 1"
                            ).first() is None:
            return "no_waiting_jobs", "no job is waiting"
        serves = f"roles {list(roles)}" if roles else "no role"
        if kinds is not None:
            serves += f" and kinds {list(kinds)}"
        return "no_matching_role", f"jobs are waiting, but none for a worker with {serves}"

    # --- fenced operations on a held lease ----------------------------------------------

    def _lock_job(self, conn: Connection, job_id: int) -> None:
        """Hold the job's row until commit before reading it to decide a change. SQLite needs
        nothing (BEGIN IMMEDIATE already excludes every other writer); on PostgreSQL a
        concurrent reaper, completer or operator waits here, and the read that follows sees
        what it committed, instead of both deciding on the same old row."""
        if not self.db.is_sqlite:
            self.db.run(conn, _LOCK_JOB, {"job_id": job_id})

    def _owned(self, conn: Connection, job_id: int, worker_id: str, epoch: int,
               tenant: str | None, op: str) -> tuple[tuple[Any, ...] | JobcoordError, int]:
        """Check that `worker_id` holds the live lease of `job_id` at `epoch`. Returns the job
        row or the refusal (a requested cancellation is carried out here), and the time the
        decision was made at: read once the job row is locked, so a call that waited for the
        lock (a busy SQLite file, a PostgreSQL row lock) is judged when it writes, not when it
        started (rule 3), and its event is never older than the one it waited for."""
        # On PostgreSQL the read locks the job row (FOR UPDATE OF j): a concurrent reaper,
        # completer or operator holding it is waited for, and the row read is the version it
        # committed. The lease columns come from the statement's snapshot; the only change to
        # a lease that leaves its job row alone is a renewal, which no lock of the job row
        # would wait for anyway. SQLite needs no lock: BEGIN IMMEDIATE excludes every writer.
        owned = _OWNED if self.db.is_sqlite else _OWNED_LOCKED
        row = self.db.execute(conn, owned, {"job_id": job_id}).fetchone()
        now = now_us()
        return self._judge(conn, row, job_id, worker_id, epoch, tenant, op, now), now

    def _judge(self, conn: Connection, row: Any, job_id: int, worker_id: str, epoch: int,
               tenant: str | None, op: str, now: int) -> tuple[Any, ...] | JobcoordError:
        if row is None or (tenant is not None and row[2] != tenant):
            return Refused("job_not_found", f"job {job_id} not found", job_id=job_id)
        status, job_epoch = row[0], row[1]
        if status == "cancelled":
            return Refused("job_cancelled", f"job {job_id} was cancelled; stop working on it",
                           job_id=job_id)
        if status in FINAL_STATUSES:
            return Refused("job_finished", f"job {job_id} is already {status}; the first "
                           "outcome stands", job_id=job_id, status=status,
                           accepted_epoch=job_epoch)
        if epoch != job_epoch:
            return Refused("stale_epoch", f"epoch {epoch} is stale: job {job_id} is at epoch "
                           f"{job_epoch}", job_id=job_id, current_epoch=job_epoch)
        if status != "running" or row[9] is None:
            return Refused("lease_expired", f"the lease on job {job_id} expired and was "
                           f"reaped; the job is {status}", job_id=job_id, status=status)
        if row[9] != worker_id:
            return Refused("not_owner", f"job {job_id} is leased to another worker",
                           job_id=job_id)
        if now >= row[11]:
            return Refused("lease_expired", f"the lease on job {job_id} expired at "
                           f"{iso(row[11])}", job_id=job_id, expired_at=iso(row[11]))
        if _bool(row[3]):
            self._end(conn, job_id, epoch, now, "cancelled", "cancelled", worker_id,
                      detail={"during": op})
            return Refused("job_cancelled", f"job {job_id} was cancelled; stop working on it",
                           job_id=job_id)
        return tuple(row)

    def _end(self, conn: Connection, job_id: int, epoch: int, now: int, to_status: str,
             reason: str, worker: str | None, *, result: str | None = None,
             provenance: str | None = None, error: str | None = None, run_after: int | None = None,
             detail: Mapping[str, Any] | None = None) -> None:
        """Move a running job out of `running`: drop its lease, record the event."""
        final = to_status in FINAL_STATUSES
        params = {
            "job_id": job_id, "epoch": epoch, "to_status": to_status, "result": result,
            "provenance": provenance, "error": error, "finished": now if final else None,
            "run_after": now if run_after is None else run_after, "now": now,
        }
        if self.db.folds_transitions:
            # PostgreSQL: finish, drop lease and event in one statement (_END_FOLDED).
            params.update(reason=reason, worker=worker,
                          detail=v.dumps(detail) if detail else None)
            updated = self.db.execute(conn, _END_FOLDED, params).fetchone()[0]
        else:
            updated = self.db.execute(conn, _FINISH, params).rowcount
        if updated != 1:  # only reachable if a caller skipped _owned: fail loudly
            raise JobcoordError("internal_error", f"job {job_id} changed under its write lock")
        # Fault points are named by the reason: completed.*, failed.*, lease_expired.*, ...
        # On PostgreSQL all three follow the one statement, inside the open transaction.
        faults.point(f"{reason}.after_update")
        if not self.db.folds_transitions:
            self.db.execute(conn, _DROP_LEASE, {"job_id": job_id, "epoch": epoch})
        faults.point(f"{reason}.after_drop_lease")
        if not self.db.folds_transitions:
            self._event(conn, job_id, now, "running", to_status, reason, worker, epoch, detail)
        faults.point(f"{reason}.after_event")

    def _fenced(self, job_id: Any, worker_id: str, epoch: Any, tenant: str | None
                ) -> tuple[int, str, int, str | None]:
        return (
            v.whole(job_id, "job_id", 1, 2**62),
            v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID),
            v.whole(epoch, "epoch", 0, 2**31 - 1),
            v.optional_name(tenant, "tenant"),
        )

    def _reject_event(self, conn: Connection, refusal: JobcoordError, job_id: int,
                      worker: str, epoch: int, now: int, op: str) -> None:
        """A late or stale result is evidence worth keeping: record it without a transition."""
        if refusal.code in ("job_not_found", "job_cancelled"):
            return
        status = self.db.run_text(conn, "SELECT status FROM jobs WHERE job_id = :job_id",
                                  {"job_id": job_id}).scalar()
        self._event(conn, job_id, now, status, status, f"{op}_refused", worker, epoch,
                    {"refusal": refusal.code})

    def _completion(self, job_id: Any, worker_id: str, epoch: Any, result: Any,
                    provenance: Mapping[str, Any] | None, tenant: str | None
                    ) -> tuple[Callable[[Connection], tuple[dict[str, Any] | JobcoordError, int]],
                               str]:
        """Validate a completion before any transaction; return the fenced step that accepts
        it inside one (shared by complete and complete_and_claim) and the worker id."""
        job_id, worker_id, epoch, tenant = self._fenced(job_id, worker_id, epoch,
                                                        tenant)
        _, result_text = v.json_value({} if result is None else result, "result",
                                      max_bytes=self.policy.max_result_bytes,
                                      require_object=False, too_large_code="result_too_large")
        prov_text = None if provenance is None else v.json_value(
            dict(provenance), "provenance", max_bytes=64 * 1024, require_object=True)[1]

        def finish(conn: Connection) -> tuple[dict[str, Any] | JobcoordError, int]:
            owned, now = self._owned(conn, job_id, worker_id, epoch, tenant, "complete")
            if isinstance(owned, JobcoordError):
                self._reject_event(conn, owned, job_id, worker_id, epoch, now, "complete")
                return owned, now
            self._end(conn, job_id, epoch, now, "succeeded", "completed", worker_id,
                      result=result_text, provenance=prov_text)
            return {"job_id": job_id, "status": "succeeded", "epoch": epoch,
                    "finished_at": iso(now)}, now

        return finish, worker_id

    def complete(self, job_id: int, worker_id: str, epoch: int, result: Any = None, *,
                 provenance: Mapping[str, Any] | None = None, tenant: str | None = None
                 ) -> dict[str, Any]:
        """Accept the result of the lease owner at the current epoch, before expiry."""
        finish, _ = self._completion(job_id, worker_id, epoch, result, provenance, tenant)
        return self.db.write(lambda conn: finish(conn)[0], "complete")

    def complete_and_claim(self, job_id: int, worker_id: str, epoch: int, result: Any = None,
                           *, provenance: Mapping[str, Any] | None = None,
                           tenant: str | None = None, lease_s: float | None = None,
                           kinds: Sequence[str] | None = None) -> dict[str, Any]:
        """Complete this worker's job and claim its next one in the same write transaction:
        one commit per job in steady state instead of two.

        The completion is judged exactly like `complete` (same refusals, same events); a
        refused completion raises its refusal and claims nothing. After an accepted
        completion the claim follows every rule of `claim` (heartbeat, gates, order).
        Returns {"completed": <complete's answer>, "next": <claim's answer>}."""
        finish, worker_id = self._completion(job_id, worker_id, epoch, result, provenance,
                                             tenant)
        lease_us = self._lease_seconds(lease_s)
        kind_filter = None if kinds is None else v.names(kinds, "kind", empty=_NO_KINDS)

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            done, now = finish(conn)
            if isinstance(done, JobcoordError):
                return done
            return {"completed": done,
                    "next": self._claim(conn, worker_id, lease_us, kind_filter, now)}

        return self.db.write(_do, "complete_and_claim")

    def fail(self, job_id: int, worker_id: str, epoch: int, error: str, *,
             permanent: bool = False, reason: str = "failed", tenant: str | None = None,
             effect_not_applied: bool = False) -> dict[str, Any]:
        """Report a failed attempt. Retryable failures go back to `waiting` after the
        policy's backoff, until max attempts or the deadline; then (or if permanent) `dead`.

        reason="worker_shutdown" is a release, not a failure of the job: a worker stopping
        gives the job back at once, without backoff, and the job keeps one attempt to run in
        (a deploy or a closed laptop lid must not use up retries). The attempt still counts in
        `attempts` and the event history. Only the policy's `max_releases` releases are free;
        each one past them counts as a normal attempt.

        After the attempt marked an external effect (mark_effect), any end that is not
        permanent (a retryable failure, reason "timeout", a release) makes the job `unknown`
        for `reconcile` (rule 6): the effect is never silently run again. Pass
        effect_not_applied=True only when the worker knows the effect did not happen; the
        normal path is then taken and the event records it."""
        job_id, worker_id, epoch, tenant = self._fenced(job_id, worker_id, epoch, tenant)
        error = v.utf8_text(error, "error", max_len=v.MAX_TEXT)
        reason = v.name(reason, "reason", max_len=40)
        permanent = v.flag(permanent, "permanent")
        effect_not_applied = v.flag(effect_not_applied, "effect_not_applied")

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            owned, now = self._owned(conn, job_id, worker_id, epoch, tenant, "fail")
            if isinstance(owned, JobcoordError):
                self._reject_event(conn, owned, job_id, worker_id, epoch, now, "fail")
                return owned
            attempts, max_attempts, deadline = owned[5], owned[6], owned[7]
            detail: dict[str, Any] = {"error": error, "attempt": attempts}
            if effect_not_applied:
                detail["effect_not_applied"] = True
            effect = _bool(owned[4]) and not effect_not_applied
            backoff_us = seconds_to_us(self.policy.backoff_s(attempts))
            release = reason == "worker_shutdown" and not permanent and not effect
            if release and self.db.execute(conn, _RELEASES, {"job_id": job_id}
                                           ).fetchone()[0] >= self.policy.max_releases:
                release = False  # past the bound: this release counts as an attempt
                detail["releases_exhausted"] = self.policy.max_releases
            if release:
                backoff_us = 0
            if permanent:
                to_status, why = "dead", "permanent failure"
            elif effect:
                to_status, why = "unknown", "an external effect had started"
            elif release and (deadline is None or now < deadline):
                to_status, why = "waiting", None
                if attempts >= max_attempts:
                    self.db.run(conn, _GRANT_ATTEMPT, {"job_id": job_id,
                                                       "max_attempts": attempts + 1})
                    detail["max_attempts"] = max_attempts = attempts + 1
            elif attempts >= max_attempts:
                to_status, why = "dead", f"all {max_attempts} attempts used"
            elif deadline is not None and now + backoff_us >= deadline:
                to_status, why = "dead", "the next attempt would start past the deadline"
            else:
                to_status, why = "waiting", None
                detail["backoff_s"] = backoff_us / MICROS
                detail["run_after"] = iso(now + backoff_us)
            if why and to_status == "unknown":
                detail["because"] = why
            elif why:
                detail["dead_because"] = why
            self._end(conn, job_id, epoch, now, to_status, reason, worker_id, error=error,
                      run_after=now + backoff_us if to_status == "waiting" else now,
                      detail=detail)
            out = {"job_id": job_id, "status": to_status, "attempt": attempts,
                   "max_attempts": max_attempts}
            if to_status == "waiting":
                out["run_after"] = iso(now + backoff_us)
            elif to_status == "unknown":
                out["because"] = why
            else:
                out["dead_because"] = why
            return out

        return self.db.write(_do, "fail")

    def renew(self, job_id: int, worker_id: str, epoch: int, *, lease_s: float | None = None,
              tenant: str | None = None) -> dict[str, Any]:
        """Extend a live lease of this owner and epoch to now + lease_s, never to earlier than
        it already runs (after the clock jumped back, now + lease_s can be before it)."""
        job_id, worker_id, epoch, tenant = self._fenced(job_id, worker_id, epoch,
                                                        tenant)
        lease_us = self._lease_seconds(lease_s)

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            owned, now = self._owned(conn, job_id, worker_id, epoch, tenant, "renew")
            if isinstance(owned, JobcoordError):
                return owned
            # Never shorten: a lease moved before its grant time would break the schema's
            # expiry check and turn a clock step into an internal error.
            expires = max(now + lease_us, owned[11])
            self.db.run(conn, _RENEW, {"job_id": job_id, "epoch": epoch, "worker": worker_id,
                                       "now": now, "expires": expires})
            return {"job_id": job_id, "epoch": epoch, "expires_at": iso(expires),
                    "expires_at_us": expires}

        return self.db.write(_do, "renew")

    def mark_effect(self, job_id: int, worker_id: str, epoch: int, *,
                    tenant: str | None = None) -> dict[str, Any]:
        """Record that this attempt started an external effect it cannot undo. If its lease
        then expires, the job becomes `unknown` instead of running the effect again."""
        job_id, worker_id, epoch, tenant = self._fenced(job_id, worker_id, epoch,
                                                        tenant)

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            owned, now = self._owned(conn, job_id, worker_id, epoch, tenant, "effect")
            if isinstance(owned, JobcoordError):
                return owned
            if not _bool(owned[4]):
                self.db.run(conn, _MARK_EFFECT, {"job_id": job_id, "epoch": epoch, "now": now,
                                                 "t": True})
                self._event(conn, job_id, now, "running", "running", "effect_started",
                            worker_id, epoch)
            return {"job_id": job_id, "epoch": epoch, "effect_started": True}

        return self.db.write(_do, "effect")

    def checkpoint(self, job_id: int, worker_id: str, epoch: int, name: str,
                   data: Any = None, *, tenant: str | None = None) -> dict[str, Any]:
        """Commit step progress under the current epoch; the next attempt's claim returns it."""
        job_id, worker_id, epoch, tenant = self._fenced(job_id, worker_id, epoch,
                                                        tenant)
        name = v.name(name, "name")
        _, data_text = v.json_value({} if data is None else data, "data",
                                    max_bytes=self.policy.max_payload_bytes,
                                    require_object=False, too_large_code="checkpoint_too_large")

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            owned, now = self._owned(conn, job_id, worker_id, epoch, tenant, "checkpoint")
            if isinstance(owned, JobcoordError):
                return owned
            self.db.run(conn, _UPSERT_CHECKPOINT, {"job_id": job_id, "name": name,
                                                   "data": data_text, "epoch": epoch,
                                                   "worker": worker_id, "now": now})
            return {"job_id": job_id, "name": name, "epoch": epoch, "saved_at": iso(now)}

        return self.db.write(_do, "checkpoint")

    # --- recovery -----------------------------------------------------------------------

    def reap(self, *, limit: int = 1000) -> dict[str, Any]:
        """Turn expired leases into `waiting` (or `dead` when attempts or the deadline are
        used up, `unknown` when an external effect had started, `cancelled` when asked), and
        waiting jobs past their deadline into `dead`. Safe from any number of processes: each
        change is a compare-and-set on (status, epoch)."""
        limit = v.whole(limit, "limit", 1, 100_000)
        sqlite = self.db.is_sqlite
        expired_sql = _EXPIRED_LEASES if sqlite else _EXPIRED_LEASES_LOCKED
        overdue_sql = _OVERDUE_WAITING if sqlite else _OVERDUE_WAITING_LOCKED

        def _do(conn: Connection) -> dict[str, Any]:
            counts = {"expired": 0, "waiting": 0, "dead": 0, "unknown": 0, "cancelled": 0,
                      "deadline_dead": 0}
            jobs: list[dict[str, Any]] = []
            # Candidates are chosen with a first reading; the decisions and event times use a
            # second one, taken once their rows are locked (PostgreSQL) -- later, so every
            # chosen lease is still expired, and no event is older than one it waited for.
            expired = self.db.run(conn, expired_sql, {"now": now_us(), "limit": limit}).all()
            now = now_us()
            for (job_id, epoch, worker, expires, effect, attempts, max_attempts, deadline,
                 cancel) in expired:
                if _bool(cancel):
                    to_status, why = "cancelled", "cancelled while running"
                elif _bool(effect):
                    to_status, why = "unknown", "an external effect had started"
                elif attempts >= max_attempts:
                    to_status, why = "dead", f"all {max_attempts} attempts used"
                elif deadline is not None and deadline <= now:
                    to_status, why = "dead", "deadline passed"
                else:
                    to_status, why = "waiting", None
                error = (f"lease expired at {iso(expires)} (worker {worker}, epoch {epoch})"
                         if to_status != "cancelled" else None)
                detail = {"expired_at": iso(expires), "attempt": attempts}
                if why:
                    detail["because"] = why
                self._end(conn, job_id, epoch, now, to_status, "lease_expired", worker,
                          error=error, detail=detail)
                counts["expired"] += 1
                counts[to_status] += 1
                jobs.append({"job_id": job_id, "epoch": epoch, "to": to_status})
            overdue = self.db.run(conn, overdue_sql, {"now": now, "limit": limit}).all()
            now = max(now, now_us())
            for job_id, epoch in overdue:
                swept = self.db.run(conn, _SET_STATUS, {
                    "job_id": job_id, "epoch": epoch, "from_status": "waiting",
                    "to_status": "dead", "now": now, "finished": now,
                    "error": "deadline passed before the job could run"}).rowcount
                if swept != 1:  # claimed meanwhile: no transition, so no event
                    continue
                self._event(conn, job_id, now, "waiting", "dead", "deadline_passed")
                counts["deadline_dead"] += 1
                jobs.append({"job_id": job_id, "epoch": epoch, "to": "dead"})
            return {**counts, "jobs": jobs, "at": iso(now)}

        return self.db.write(_do, "reap")

    # --- operator actions ---------------------------------------------------------------

    def _load(self, conn: Connection, job_id: int, tenant: str | None
              ) -> dict[str, Any] | JobcoordError:
        row = self.db.run(conn, _JOB_ROW, {"job_id": job_id}).first()
        if row is None or (tenant is not None and row[1] != tenant):
            return Refused("job_not_found", f"job {job_id} not found", job_id=job_id)
        return dict(zip(_JOB_COLUMNS, row, strict=True))

    def _operator(self, op: str, job_id: Any, tenant: str | None, fn: Any) -> dict[str, Any]:
        job_id = v.whole(job_id, "job_id", 1, 2**62)
        tenant = v.optional_name(tenant, "tenant")

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            self._lock_job(conn, job_id)
            now = now_us()  # after the row lock: see _owned
            job = self._load(conn, job_id, tenant)
            if isinstance(job, JobcoordError):
                return job
            return fn(conn, job, now)

        return self.db.write(_do, op)

    def cancel(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """waiting -> cancelled at once; running -> the owner's next renew, complete, fail or
        checkpoint is told `job_cancelled` and the job ends `cancelled` (or the reaper ends it
        when the lease runs out)."""

        def _do(conn: Connection, job: dict[str, Any], now: int) -> Any:
            status, epoch = job["status"], job["epoch"]
            if status == "waiting":
                self.db.run(conn, _SET_STATUS, {
                    "job_id": job["job_id"], "epoch": epoch, "from_status": "waiting",
                    "to_status": "cancelled", "now": now, "finished": now, "error": None})
                self._event(conn, job["job_id"], now, "waiting", "cancelled", "cancelled")
                return {"job_id": job["job_id"], "status": "cancelled"}
            if status == "running":
                if not _bool(job["cancel_requested"]):
                    self.db.run_text(conn, "UPDATE jobs SET cancel_requested = :t, updated_at ="
                                     " :now WHERE job_id = :job_id",
                                     {"t": True, "now": now, "job_id": job["job_id"]})
                    self._event(conn, job["job_id"], now, "running", "running",
                                "cancel_requested", epoch=epoch)
                return {"job_id": job["job_id"], "status": "running", "cancel_requested": True}
            if status in FINAL_STATUSES:
                return Refused("job_finished", f"job {job['job_id']} is already {status}",
                               job_id=job["job_id"], status=status)
            return Refused("illegal_transition", f"job {job['job_id']} is {status}; resolve it "
                           "with `jobcoord reconcile`", job_id=job["job_id"], status=status)

        return self._operator("cancel", job_id, tenant, _do)

    def _back_to_waiting(self, conn: Connection, job: dict[str, Any], now: int,
                         reason: str, detail: dict[str, Any]) -> None:
        # Give at least one more attempt, keep every attempt counted (attempts never shrinks).
        max_attempts = max(job["max_attempts"], job["attempts"] + 1)
        deadline = job["deadline_at"]
        if deadline is not None and deadline <= now:
            deadline = None
            detail["deadline_cleared"] = True
        self.db.run_text(
            conn,
            "UPDATE jobs SET status = 'waiting', run_after = :now, updated_at = :now,"
            " finished_at = NULL, effect_started = :f, cancel_requested = :f,"
            " max_attempts = :max_attempts, deadline_at = :deadline"
            " WHERE job_id = :job_id AND status = :status",
            {"now": now, "f": False, "max_attempts": max_attempts, "deadline": deadline,
             "job_id": job["job_id"], "status": job["status"]},
        )
        self._event(conn, job["job_id"], now, job["status"], "waiting", reason,
                    epoch=job["epoch"], detail=detail)

    def retry(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """Operator: dead or unknown -> waiting, with at least one attempt left."""

        def _do(conn: Connection, job: dict[str, Any], now: int) -> Any:
            if job["status"] not in ("dead", "unknown"):
                return Refused("illegal_transition", f"only dead or unknown jobs can be retried;"
                               f" job {job['job_id']} is {job['status']}", job_id=job["job_id"],
                               status=job["status"])
            self._back_to_waiting(conn, job, now, "operator_retry", {})
            return {"job_id": job["job_id"], "status": "waiting"}

        return self._operator("retry", job_id, tenant, _do)

    def reconcile(self, job_id: int, as_status: str, reason: str, *, result: Any = None,
                  tenant: str | None = None) -> dict[str, Any]:
        """Operator: settle an `unknown` job as succeeded (with its result), waiting or dead,
        with the reason recorded."""
        if as_status not in ("succeeded", "waiting", "dead"):
            raise InvalidInput("invalid_input", "--as must be succeeded, waiting or dead")
        reason = v.utf8_text(reason, "reason", max_len=4096)
        if as_status == "succeeded" and result is None:
            raise InvalidInput("invalid_input", "reconciling as succeeded needs --result")
        result_text = None
        if result is not None:
            result_text = v.json_value(result, "result", max_bytes=self.policy.max_result_bytes,
                                       require_object=False, too_large_code="result_too_large")[1]

        def _do(conn: Connection, job: dict[str, Any], now: int) -> Any:
            if job["status"] != "unknown":
                return Refused("illegal_transition", f"only unknown jobs are reconciled; job "
                               f"{job['job_id']} is {job['status']}", job_id=job["job_id"],
                               status=job["status"])
            detail = {"reason": reason}
            if as_status == "waiting":
                self._back_to_waiting(conn, job, now, "reconciled", detail)
            else:
                self.db.run_text(
                    conn,
                    "UPDATE jobs SET status = :to_status, result_json = COALESCE(:result,"
                    " result_json), finished_at = :now, updated_at = :now"
                    " WHERE job_id = :job_id AND status = 'unknown'",
                    {"to_status": as_status, "result": result_text, "now": now,
                     "job_id": job["job_id"]})
                self._event(conn, job["job_id"], now, "unknown", as_status, "reconciled",
                            epoch=job["epoch"], detail=detail)
            return {"job_id": job["job_id"], "status": as_status}

        return self._operator("reconcile", job_id, tenant, _do)

    # --- retention ----------------------------------------------------------------------

    def prune(self, older_than: Any, *, statuses: Sequence[str] | None = None,
              tenant: str | None = None, batch: Any = 500, dry_run: bool = False,
              pause_s: Any = None) -> dict[str, Any]:
        """Delete finished jobs (succeeded, dead, cancelled; `statuses` narrows it) that
        finished more than `older_than` ago (seconds, or "7d", "12h", ...), with their events,
        checkpoints and artifact rows, in write transactions of at most `batch` jobs each,
        resting `pause_s` between them (by default as long as the batch held the write lock),
        so claims never wait long behind a large prune.

        Waiting, running and unknown jobs are never deleted: an unknown job must be settled
        with `reconcile` first. The newest job is kept whatever its age, so no job id is ever
        handed out twice. A pruned job's idempotency key is forgotten (the same key makes a
        new job), and the files its artifact rows named are left where they are."""
        older_s = v.safe_duration(older_than, "older_than", 0, 100 * 365 * 24 * 3600)
        chosen = sorted(FINAL_STATUSES) if statuses is None else v.names(statuses, "status")
        for status in chosen:
            if status == "unknown":
                raise InvalidInput("invalid_input", "status: unknown jobs are never pruned; "
                                   "settle them with `jobcoord reconcile` first",
                                   field="status")
            if status not in FINAL_STATUSES:
                raise InvalidInput("invalid_input", "status: only finished jobs can be pruned "
                                   f"({', '.join(FINAL_STATUSES)}), not {status!r}",
                                   field="status")
        if not chosen:
            raise InvalidInput("invalid_input", "status: name at least one status",
                               field="status")
        tenant = v.optional_name(tenant, "tenant")
        batch = v.whole(batch, "batch", 1, 10_000)
        if pause_s is not None:
            pause_s = v.finite_seconds(pause_s, "pause", 0, 60)
        now = now_us()
        cutoff = now - seconds_to_us(older_s)
        params: dict[str, Any] = {f"s{i}": st for i, st in enumerate(chosen)}
        params.update(cutoff=cutoff, tenant=tenant, limit=batch)
        # The guard is part of every statement, so a job retried or reconciled meanwhile is
        # never deleted; finished_at is set by every transition into a finished status. The
        # newest job always stays: SQLite gives a new row the largest id plus one, so deleting
        # the largest would hand its id (and epoch 1) to the next job, and a late report for
        # the old job could then pass the new one's fence.
        guard = (f"status IN ({', '.join(f':s{i}' for i in range(len(chosen)))})"
                 " AND finished_at < :cutoff AND job_id < (SELECT MAX(job_id) FROM jobs)"
                 + (" AND tenant = :tenant" if tenant else ""))
        out: dict[str, Any] = {
            "dry_run": dry_run, "cutoff": iso(cutoff), "statuses": chosen, "tenant": tenant,
            "jobs": 0, "events": 0, "checkpoints": 0, "artifacts": 0, "keys_released": 0,
            "batches": 0,
        }
        related = [("events", "job_events"), ("checkpoints", "checkpoints")]
        if "artifacts" in self.features:
            related.append(("artifacts", "artifacts"))

        if dry_run:
            def _count(conn: Connection) -> None:
                picked = f"SELECT job_id FROM jobs WHERE {guard}"
                row = self.db.run_text(conn, "SELECT COUNT(*), COUNT(idempotency_key) FROM jobs"
                                       f" WHERE {guard}", params).one()
                out["jobs"], out["keys_released"] = row[0], row[1]
                for key, table in related:
                    out[key] = self.db.run_text(conn, f"SELECT COUNT(*) FROM {table} WHERE"
                                                f" job_id IN ({picked})", params).scalar()

            self.db.read(_count, "prune")
            return out

        pick = (f"SELECT job_id, idempotency_key FROM jobs WHERE {guard} ORDER BY job_id"
                f" LIMIT :limit{self.db.lock_clause()}")

        held_since = [0.0]

        def _one_batch(conn: Connection) -> dict[str, int]:
            held_since[0] = time.monotonic()  # the write lock is ours from here to the commit
            rows = self.db.run_text(conn, pick, params).all()
            if not rows:
                return {"jobs": 0}
            ids = {f"j{i}": r[0] for i, r in enumerate(rows)}
            in_list = ", ".join(f":{k}" for k in ids)
            both = {**params, **ids}
            counts = {key: self.db.run_text(conn, f"SELECT COUNT(*) FROM {table} WHERE job_id"
                                            f" IN ({in_list})", both).scalar()
                      for key, table in related}
            # Events, checkpoints, artifact rows (and any lease) go by ON DELETE CASCADE.
            deleted = self.db.run_text(conn, f"DELETE FROM jobs WHERE job_id IN ({in_list})"
                                       f" AND {guard}", both).rowcount
            if deleted != len(rows):  # the rows are locked or under the write lock
                raise JobcoordError("internal_error", "a job changed while it was pruned")
            counts.update(jobs=deleted, batches=1,
                          keys_released=sum(1 for r in rows if r[1] is not None))
            return counts

        while True:
            # Counted only once a batch has committed (a busy retry runs it again).
            done = self.db.write(_one_batch, "prune")
            for key, n in done.items():
                out[key] += n
            if done["jobs"] < batch:
                return out
            # SQLite hands its write lock to whoever asks first, and a waiting worker's busy
            # handler sleeps between tries (up to 100 ms): back to back, the batches would
            # take the lock again and again before it woke. Resting as long as the batch
            # held the lock leaves it free at least half the time.
            time.sleep(time.monotonic() - held_since[0] if pause_s is None else pause_s)

    # --- reading ------------------------------------------------------------------------

    def jobs(self, *, status: str | None = None, kind: str | None = None,
             tenant: str | None = None, limit: int = 100) -> dict[str, Any]:
        """List jobs, newest first."""
        if status is not None and status not in STATUSES:
            raise InvalidInput("invalid_input", f"status must be one of {', '.join(STATUSES)}")
        kind = v.optional_name(kind, "kind")
        tenant = v.optional_name(tenant, "tenant")
        limit = v.whole(limit, "limit", 1, 10_000)
        where, params = [], {"limit": limit}
        for col, val in (("status", status), ("kind", kind), ("tenant", tenant)):
            if val is not None:
                where.append(f"{col} = :{col}")
                params[col] = val
        text = ("SELECT job_id, tenant, kind, required_role, priority, status, attempts,"
                " max_attempts, epoch, created_at, updated_at, run_after FROM jobs"
                + (" WHERE " + " AND ".join(where) if where else "")
                + " ORDER BY job_id DESC LIMIT :limit")
        rows = self.db.read(lambda conn: self.db.run_text(conn, text, params).all(), "jobs")
        return {"jobs": [
            {"job_id": r[0], "tenant": r[1], "kind": r[2], "role": r[3], "priority": r[4],
             "status": r[5], "attempts": r[6], "max_attempts": r[7], "epoch": r[8],
             "created_at": iso(r[9]), "updated_at": iso(r[10]), "run_after": iso(r[11])}
            for r in rows]}

    def show(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """A job with its lease, full event history, checkpoints and provenance."""
        job_id = v.whole(job_id, "job_id", 1, 2**62)
        tenant = v.optional_name(tenant, "tenant")

        def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
            job = self._load(conn, job_id, tenant)
            if isinstance(job, JobcoordError):
                return job
            lease = self.db.run_text(conn, "SELECT worker_id, epoch, granted_at, expires_at FROM"
                                     " leases WHERE job_id = :job_id", {"job_id": job_id}
                                     ).first()
            events = self.db.run_text(conn, "SELECT event_id, at, from_status, to_status,"
                                      " reason, worker_id, epoch, detail FROM job_events WHERE"
                                      " job_id = :job_id ORDER BY event_id", {"job_id": job_id}
                                      ).all()
            checkpoints = self.db.run(conn, _CHECKPOINTS, {"job_id": job_id}).all()
            artifacts = []
            if "artifacts" in self.features:
                artifacts = self.db.run_text(conn, "SELECT name, location, sha256, size_bytes,"
                                             " media_type, validation_state FROM artifacts"
                                             " WHERE job_id = :job_id ORDER BY name",
                                             {"job_id": job_id}).all()
            return {
                "job": _job_json(job),
                "lease": None if lease is None else {
                    "worker_id": lease[0], "epoch": lease[1], "granted_at": iso(lease[2]),
                    "expires_at": iso(lease[3])},
                "events": [
                    {"event_id": e[0], "at": iso(e[1]), "from": e[2], "to": e[3],
                     "reason": e[4], "worker_id": e[5], "epoch": e[6], "detail": _loads(e[7])}
                    for e in events],
                "checkpoints": [
                    {"name": c[0], "data": json.loads(c[1]), "epoch": c[2], "worker_id": c[3],
                     "updated_at": iso(c[4])} for c in checkpoints],
                "artifacts": [
                    {"name": a[0], "location": a[1], "sha256": a[2], "size": a[3],
                     "media_type": a[4], "validation_state": a[5]} for a in artifacts],
            }

        return self.db.read(_do, "show")

    def _worker_rows(self, conn: Connection) -> list[dict[str, Any]]:
        rows = self.db.run_text(
            conn, "SELECT worker_id, roles_json, kinds_json, heartbeat_at, memory_used_pct,"
            " temperature_c, on_battery, user_idle_s, last_refusal, last_refusal_detail,"
            " last_refusal_at, heartbeat_raw FROM workers ORDER BY worker_id").all()
        return [{"worker_id": r[0], "roles": json.loads(r[1]), "kinds": _loads(r[2]),
                 "heartbeat_at": r[3],
                 "readings": Readings(r[4], r[5], _bool(r[6]), r[7]),
                 "last_refusal": r[8], "last_refusal_detail": r[9], "last_refusal_at": r[10],
                 "heartbeat_raw": r[11]} for r in rows]

    def _worker_gate(self, w: dict[str, Any], now: int) -> tuple[GateDecision, float | None]:
        age = None if w["heartbeat_at"] is None else (now - w["heartbeat_at"]) / MICROS
        if age is None or age > self.policy.heartbeat_max_age_s:
            detail = f"last heartbeat {age:.0f}s ago" if age is not None else "no heartbeat"
            return GateDecision(-1, ("heartbeat_stale", detail)), age
        return evaluate(self.policy, w["readings"]), age

    def workers(self) -> dict[str, Any]:
        """Every worker, its roles, heartbeat age and readings, and whether the gates would
        let it claim now."""
        now = now_us()
        rows = self.db.read(self._worker_rows, "workers")
        out = []
        for w in rows:
            gate, age = self._worker_gate(w, now)
            out.append({
                "worker_id": w["worker_id"], "roles": w["roles"], "kinds": w["kinds"],
                "heartbeat_age_s": None if age is None else round(age, 3),
                "heartbeat_at": iso(w["heartbeat_at"]), "heartbeat_raw": w["heartbeat_raw"],
                "readings": _readings_json(w["readings"]), "gates": _gates_json(gate),
                "last_refusal": None if w["last_refusal"] is None else {
                    "reason": w["last_refusal"], "detail": w["last_refusal_detail"],
                    "at": iso(w["last_refusal_at"])},
            })
        return {"workers": out}

    def explain(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """Why this job is (or is not) being picked up right now."""
        job_id = v.whole(job_id, "job_id", 1, 2**62)
        tenant = v.optional_name(tenant, "tenant")
        now = now_us()

        def _do(conn: Connection) -> Any:
            job = self._load(conn, job_id, tenant)
            if isinstance(job, JobcoordError):
                return job
            ahead = None
            if job["status"] == "waiting":
                role_test = ("required_role IS NULL" if job["required_role"] is None
                             else "required_role = :role")
                # A tenant-scoped caller is told about its own tenant's queue only.
                scope = "" if tenant is None else " AND tenant = :tenant"
                ahead = self.db.run_text(
                    conn, f"SELECT COUNT(*) FROM jobs WHERE status = 'waiting' AND {role_test}"
                    f"{scope} AND (priority < :p OR (priority = :p AND (created_at < :c OR"
                    " (created_at = :c AND job_id < :id))))",
                    {"role": job["required_role"], "p": job["priority"], "tenant": tenant,
                     "c": job["created_at"], "id": job_id}).scalar_one()
            lease = self.db.run_text(conn, "SELECT worker_id, epoch, expires_at FROM leases"
                                     " WHERE job_id = :job_id", {"job_id": job_id}).first()
            return job, ahead, lease, self._worker_rows(conn)

        got = self.db.read(_do, "explain")
        job, ahead, lease, workers = got
        return explain_job(self.policy, job, ahead, lease, workers, now,
                           self._worker_gate)

    def status(self, *, tenant: str | None = None) -> dict[str, Any]:
        """Counts by status, workers, active leases, schema and storage facts. With a tenant,
        the job and lease counts are that tenant's only."""
        from .migrate import current_revisions

        tenant = v.optional_name(tenant, "tenant")
        only = "" if tenant is None else " WHERE j.tenant = :tenant"

        def _do(conn: Connection) -> dict[str, Any]:
            counts = dict.fromkeys(STATUSES, 0)
            for st, n in self.db.run_text(conn, f"SELECT j.status, COUNT(*) FROM jobs j{only}"
                                          " GROUP BY j.status", {"tenant": tenant}).all():
                counts[st] = n
            workers = self.db.run_text(conn, "SELECT COUNT(*) FROM workers").scalar_one()
            leases = self.db.run_text(conn, "SELECT COUNT(*) FROM leases l JOIN jobs j ON"
                                      f" j.job_id = l.job_id{only}", {"tenant": tenant}
                                      ).scalar_one()
            out: dict[str, Any] = {"workers": workers, "active_leases": leases, "jobs": counts,
                                   "tenant": tenant,
                                   "revisions": sorted(current_revisions(self.db, conn)),
                                   "features": sorted(self.features),
                                   "dialect": self.db.dialect}
            if self.db.is_sqlite:
                out["journal_mode"] = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
                sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
                out["synchronous"] = {0: "off", 1: "normal", 2: "full", 3: "extra"}.get(sync)
            else:
                # Measured when the connection opened (db.py): this host against the server.
                offset = conn.info.get("clock_offset_s")
                out["clock_offset_s"] = None if offset is None else round(offset, 6)
            return out

        out = self.db.read(_do, "status")
        if self.db.is_sqlite:
            import sqlite3

            path = self.db.target.sqlite_path or ""
            out["path"] = path
            out["file_size_bytes"] = os.path.getsize(path)
            wal = path + "-wal"
            out["wal_size_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
            out["sqlite_version"] = sqlite3.sqlite_version
            if sqlite3.sqlite_version_info < (3, 51, 3):
                # SQLite 3.7.0 to 3.51.2 can, rarely, corrupt a WAL database when two
                # connections write or checkpoint at the same instant (fixed in 3.51.3).
                out["warnings"] = [
                    f"SQLite {sqlite3.sqlite_version} predates the fix for the WAL-reset bug "
                    "(3.51.3); keep backups with `jobcoord backup` and run `jobcoord check`"]
        out["time"] = iso(now_us())
        return out


# --- helpers ------------------------------------------------------------------------------

READING_RANGES: dict[str, tuple[float, float]] = {
    "memory_used_pct": (0.0, 100.0),
    "temperature_c": (-50.0, 150.0),
    "user_idle_s": (0.0, float(v.TEN_YEARS_S)),
}


def parse_readings(readings: Mapping[str, Any] | str | None) -> tuple[str | None, Readings]:
    """Validate heartbeat readings. Returns the raw text exactly as received (a mapping is
    serialised once) and the parsed values the gates use. Each reading may be absent, null or
    "unknown"."""
    if readings is None:
        return None, Readings()
    if isinstance(readings, str):
        raw = readings
        value, _ = v.json_value(readings, "readings", max_bytes=16 * 1024, require_object=True)
    elif not isinstance(readings, Mapping):
        raise InvalidInput("invalid_input", "readings must be a JSON object (as text) or a "
                           "mapping", field="readings")
    else:
        value, raw = v.json_value(dict(readings), "readings", max_bytes=16 * 1024,
                                  require_object=True)
    parsed: dict[str, Any] = {}
    for key, val in value.items():
        if key not in (*READING_RANGES, "on_battery"):
            raise InvalidInput("invalid_input", f"readings: unknown reading {key!r}; known: "
                               "memory_used_pct, temperature_c, on_battery, user_idle_s",
                               field="readings")
        if val is None or val == "unknown":
            continue
        if key == "on_battery":
            if not isinstance(val, bool):
                raise InvalidInput("invalid_input", "readings: on_battery must be true, false, "
                                   "null or \"unknown\"", field="readings")
            parsed[key] = val
            continue
        lo, hi = READING_RANGES[key]
        if isinstance(val, bool) or not isinstance(val, int | float) or not lo <= val <= hi:
            raise InvalidInput("invalid_input", f"readings: {key} must be a number in "
                               f"{lo:g}..{hi:g}, null or \"unknown\"", field="readings")
        parsed[key] = float(val)
    return raw, Readings(**parsed)


def _bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _readings_json(r: Readings) -> dict[str, Any]:
    return {"memory_used_pct": r.memory_used_pct, "temperature_c": r.temperature_c,
            "on_battery": r.on_battery, "user_idle_s": r.user_idle_s}


def _gates_json(g: GateDecision) -> dict[str, Any]:
    return {"can_claim": not g.blocks_all, "max_priority": g.max_priority,
            "background_allowed": g.max_priority >= 3,
            "refusal": None if g.refusal is None else {"reason": g.refusal[0],
                                                       "detail": g.refusal[1]}}


def _job_json(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": job["job_id"], "tenant": job["tenant"], "kind": job["kind"],
        "role": job["required_role"], "priority": job["priority"], "status": job["status"],
        "payload": json.loads(job["payload_json"]), "result": _loads(job["result_json"]),
        "provenance": _loads(job["provenance_json"]), "attempts": job["attempts"],
        "max_attempts": job["max_attempts"], "epoch": job["epoch"],
        "idempotency_key": job["idempotency_key"], "last_error": job["last_error"],
        "effect_started": bool(job["effect_started"]),
        "cancel_requested": bool(job["cancel_requested"]),
        "created_at": iso(job["created_at"]), "updated_at": iso(job["updated_at"]),
        "run_after": iso(job["run_after"]), "deadline_at": iso(job["deadline_at"]),
        "finished_at": iso(job["finished_at"]),
    }


def explain_job(policy: Policy, job: dict[str, Any], ahead: int | None, lease: Any,
                workers: list[dict[str, Any]], now: int, gate_of: Any) -> dict[str, Any]:
    """The diagnosis an operator would do by hand, in the seed's order: status, schedule,
    deadline, then the workers that could take it (role, kind, heartbeat, gates)."""
    status = job["status"]
    reasons: list[dict[str, str]] = []

    def say(code: str, detail: str) -> None:
        reasons.append({"code": code, "detail": detail})

    out: dict[str, Any] = {"job_id": job["job_id"], "status": status,
                           "priority": job["priority"], "role": job["required_role"],
                           "kind": job["kind"]}
    if status == "running" and lease is None:
        # Never in one snapshot of a consistent database; said plainly rather than asserted.
        say("running", "running, but no lease was found for it (it is ending right now, or "
            "the database needs `jobcoord check`)")
    elif status == "running":
        left = (lease[2] - now) / MICROS
        say("running", f"leased to {lease[0]} at epoch {lease[1]}; the lease "
            + (f"expires in {left:.0f}s" if left > 0 else
               f"expired {-left:.0f}s ago and waits for the reaper"))
    elif status == "unknown":
        say("unknown", "its lease expired after an external effect had started; an operator "
            "must `jobcoord reconcile` it")
    elif status != "waiting":
        say(status, f"the job is {status}: final, nobody will pick it up")
    else:
        if job["run_after"] > now:
            say("scheduled", f"not due until {iso(job['run_after'])} (backoff or delay)")
        if job["deadline_at"] is not None and job["deadline_at"] <= now:
            say("deadline_passed", "its deadline has passed; the reaper will mark it dead")
        # Only the schedule and the deadline stop every worker; a gated worker does not stop
        # another one that is ready.
        blocked = bool(reasons)
        role, kind, bg = job["required_role"], job["kind"], job["priority"]
        able = [w for w in workers if role is None or role in w["roles"]]
        if not able:
            say("no_matching_role", f"no worker has role {role!r}" if role is not None
                else "no worker has sent a heartbeat yet")
        handlers = [w for w in able if w["kinds"] is None or kind in w["kinds"]]
        if able and not handlers:
            say("no_handler", f"no worker with role {role!r} has a handler for kind {kind!r}")
        ready = []
        for w in handlers:
            gate, _age = gate_of(w, now)
            if gate.max_priority >= bg:
                ready.append(w["worker_id"])
            elif gate.refusal is not None:
                say(gate.refusal[0], f"worker {w['worker_id']}: {gate.refusal[1]}")
        if handlers and not ready and not reasons:
            say("gated", "every worker that could run it is gated")
        out["ready_workers"] = ready
        out["jobs_ahead"] = ahead
        if ready and not blocked:
            say("eligible", f"{len(ready)} worker(s) can claim it now; {ahead} job(s) are "
                "ahead of it in the claim order")
    out["claimable_now"] = any(r["code"] == "eligible" for r in reasons)
    out["reasons"] = reasons
    return out


def default_worker_id() -> str:
    """host:pid, unique per process incarnation on one host."""
    return f"{socket.gethostname()}:{os.getpid()}"
