"""The tables as SQLAlchemy Core defines them: the one definition of every column, constraint
and index, read by the models (Alembic, the model-vs-history test, transfer) and by the
statements the stores run.

Core only, no ORM: the claim and complete commands build their statements from these tables
in every process, and the ORM would add ~100 ms to each start. The database itself is created
and changed only by the Alembic history in `alembic/`. Times are integer microseconds since
the epoch, UTC (see clock.py); JSON bodies are stored as text exactly as jobcoord serialised
them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

# Named constraints: SQLite batch migrations need names to find constraints again.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

# 64-bit ids on PostgreSQL; on SQLite only INTEGER PRIMARY KEY aliases the rowid.
Id = BigInteger().with_variant(Integer, "sqlite")


def _waiting(extra: str = "") -> dict[str, object]:
    """A partial index's predicate on both dialects."""
    where = text("status = 'waiting'" + extra)
    return {"sqlite_where": where, "postgresql_where": where}


workers = Table(
    "workers", metadata,
    Column("worker_id", String(200), primary_key=True),
    Column("roles_json", Text, nullable=False, server_default="[]"),
    # Kinds the worker has handlers for; NULL means it takes any kind (a hand-driven claim).
    Column("kinds_json", Text),
    Column("heartbeat_raw", Text),
    Column("heartbeat_at", BigInteger),
    Column("memory_used_pct", Float),
    Column("temperature_c", Float),
    Column("on_battery", Boolean),
    Column("user_idle_s", Float),
    Column("last_refusal", String(40)),
    Column("last_refusal_detail", Text),
    Column("last_refusal_at", BigInteger),
    Column("created_at", BigInteger, nullable=False),
)

jobs = Table(
    "jobs", metadata,
    Column("job_id", Id, primary_key=True, autoincrement=True),
    Column("tenant", String(128), nullable=False),
    Column("kind", String(128), nullable=False),
    Column("required_role", String(128)),
    Column("priority", Integer, nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("run_after", BigInteger, nullable=False),
    Column("deadline_at", BigInteger),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default="3"),
    # The fencing token: increases on every claim of this job.
    Column("epoch", Integer, nullable=False, server_default="0"),
    Column("idempotency_key", String(200)),
    Column("result_json", Text),
    # What produced the result: worker, host, version, handler, duration, model settings.
    Column("provenance_json", Text),
    Column("last_error", Text),
    Column("effect_started", Boolean, nullable=False, server_default=false()),
    Column("cancel_requested", Boolean, nullable=False, server_default=false()),
    Column("finished_at", BigInteger),
    # Declared resource needs, {"NAME": INT} as text; NULL: none (core revision c0006).
    Column("needs_json", Text),
    CheckConstraint(
        "status IN ('waiting','running','succeeded','dead','cancelled','unknown')",
        name="status",
    ),
    CheckConstraint("priority BETWEEN 0 AND 3", name="priority"),
    CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="attempts"),
    CheckConstraint("epoch >= 0", name="epoch"),
    UniqueConstraint("tenant", "idempotency_key"),
    Index("ix_jobs_status_job_id", "status", "job_id"),
    Index("ix_jobs_tenant_job_id", "tenant", "job_id"),
)


def add_partial_indexes() -> None:
    """Attach the jobs table's partial indexes (once), for the models and so for Alembic and
    the model-vs-history test. Not done on import: their `sqlite_where` / `postgresql_where`
    options make SQLAlchemy import both dialects' packages to check them (~30 ms per
    process), and no statement needs an index object."""
    if "ix_jobs_claim_role" in {ix.name for ix in jobs.indexes}:
        return
    c = jobs.c
    # The claim order (priority, then age) per role, over waiting jobs only: a claim reads
    # a few index entries, however many jobs wait for other roles.
    Index("ix_jobs_claim_role", c.required_role, c.priority, c.created_at, c.job_id,
          **_waiting())
    # The same order per (role, kind), for workers that only run the kinds they handle.
    Index("ix_jobs_claim_kind", c.required_role, c.kind, c.priority, c.created_at, c.job_id,
          **_waiting())
    # Role-less waiting jobs alone, in claim order (revision c0002): PostgreSQL does not
    # treat `required_role IS NULL` on the leading column of the two indexes above as an
    # equality that keeps the rest in order, so the role-less probe sorted every waiting
    # job without these.
    Index("ix_jobs_claim_roleless", c.priority, c.created_at, c.job_id,
          **_waiting(" AND required_role IS NULL"))
    Index("ix_jobs_claim_roleless_kind", c.kind, c.priority, c.created_at, c.job_id,
          **_waiting(" AND required_role IS NULL"))
    # The reaper's sweep of waiting jobs whose deadline passed.
    Index("ix_jobs_waiting_deadline", c.deadline_at,
          **_waiting(" AND deadline_at IS NOT NULL"))
    Index("ix_jobs_waiting_needs", c.job_id, **_waiting(" AND needs_json IS NOT NULL"))


leases = Table(
    "leases", metadata,
    # The job id is the primary key: at most one lease per job, enforced by the schema.
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True),
    # No foreign key to workers: a lease must outlive a worker row an operator removed, so
    # the reaper can still recover the job.
    Column("worker_id", String(200), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("granted_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    CheckConstraint("expires_at > granted_at", name="expiry"),
    Index("ix_leases_expires_at", "expires_at"),
)

job_events = Table(
    "job_events", metadata,
    Column("event_id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), nullable=False),
    Column("at", BigInteger, nullable=False),
    Column("from_status", String(16)),
    Column("to_status", String(16), nullable=False),
    Column("reason", String(40), nullable=False),
    Column("worker_id", String(200)),
    Column("epoch", Integer),
    Column("detail", Text),
    Index("ix_job_events_job_id_event_id", "job_id", "event_id"),
)

checkpoints = Table(
    "checkpoints", metadata,
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("data_json", Text, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("worker_id", String(200), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

# Large results kept outside the database (the optional `artifacts` migration): one row per
# stage of an artifact by one attempt (job, epoch, name); the bytes live in the object store
# under `location`, and the row is written only after the object is stored.
artifacts = Table(
    "artifacts", metadata,
    Column("artifact_id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("name", String(255), nullable=False),
    Column("digest", String(80), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("media_type", String(200), nullable=False),
    Column("state", String(16), nullable=False, server_default="staged"),
    Column("reason", String(64)),
    Column("location", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("verified_at", BigInteger),
    UniqueConstraint("job_id", "epoch", "name"),
    CheckConstraint("state IN ('staged','verified','accepted','rejected')", name="state"),
    CheckConstraint("size >= 0", name="size"),
    # A job's names are unique in its accepted result.
    Index("uq_artifacts_accepted_name", "job_id", "name", unique=True,
          sqlite_where=text("state = 'accepted'"), postgresql_where=text("state = 'accepted'")),
    Index("ix_artifacts_digest", "digest"),
)

# API tokens of the HTTP server (core revision c0003): only the SHA-256 hash of a secret is
# kept; the role, tenant and worker binding are the caller's trusted identity.
tokens = Table(
    "tokens", metadata,
    Column("token_id", Id, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("token_hash", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("tenant", String(128)),
    Column("worker_id", String(200)),
    Column("created_at", BigInteger, nullable=False),
    Column("revoked_at", BigInteger),
    CheckConstraint("role IN ('submitter','worker','viewer','operator')", name="role"),
    CheckConstraint("role = 'worker' OR worker_id IS NULL", name="worker_binding"),
    UniqueConstraint("name"),
    UniqueConstraint("token_hash"),
)

# Concurrency limits (core revision c0006): at most `concurrency` live leases of a kind at
# once, per value of the payload field `key_field` when one is set. Counted from the leases
# inside each claim, never kept as a counter.
limits = Table(
    "limits", metadata,
    Column("kind", String(128), primary_key=True),
    Column("concurrency", Integer, nullable=False),
    Column("key_field", String(128)),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    CheckConstraint("concurrency >= 1", name="concurrency"),
)

CORE_TABLES = ("workers", "jobs", "leases", "job_events", "checkpoints", "limits")
OPTIONAL_TABLES = {"artifacts": ("artifacts",)}
