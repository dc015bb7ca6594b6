"""Declarative models: the schema as the code sees it.

The database itself is created and changed only by the Alembic history in `alembic/`; a test
proves that history and these models agree. Times are integer microseconds since the epoch,
UTC (see clock.py); JSON bodies are stored as text exactly as jobcoord serialised them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints: SQLite batch migrations need names to find constraints again.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Defined beside the service's hot path; re-exported here for the schema and its readers.
from .states import FINAL_STATUSES as FINAL_STATUSES  # noqa: E402
from .states import STATUSES as STATUSES  # noqa: E402

# 64-bit ids on PostgreSQL; on SQLite only INTEGER PRIMARY KEY aliases the rowid.
Id = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Worker(Base):
    __tablename__ = "workers"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    roles_json: Mapped[str] = mapped_column(Text, nullable=False, server_default="[]")
    # Kinds the worker has handlers for; NULL means it takes any kind (a hand-driven claim).
    kinds_json: Mapped[str | None] = mapped_column(Text)
    heartbeat_raw: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[int | None] = mapped_column(BigInteger)
    memory_used_pct: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    on_battery: Mapped[bool | None] = mapped_column(Boolean)
    user_idle_s: Mapped[float | None] = mapped_column(Float)
    last_refusal: Mapped[str | None] = mapped_column(String(40))
    last_refusal_detail: Mapped[str | None] = mapped_column(Text)
    last_refusal_at: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('waiting','running','succeeded','dead','cancelled','unknown')",
            name="status",
        ),
        CheckConstraint("priority BETWEEN 0 AND 3", name="priority"),
        CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="attempts"),
        CheckConstraint("epoch >= 0", name="epoch"),
        UniqueConstraint("tenant", "idempotency_key"),
        # The claim order (priority, then age) per role, over waiting jobs only: a claim reads
        # a few index entries, however many jobs wait for other roles.
        Index(
            "ix_jobs_claim_role",
            "required_role",
            "priority",
            "created_at",
            "job_id",
            sqlite_where=text("status = 'waiting'"),
            postgresql_where=text("status = 'waiting'"),
        ),
        # The same order per (role, kind), for workers that only run the kinds they handle.
        Index(
            "ix_jobs_claim_kind",
            "required_role",
            "kind",
            "priority",
            "created_at",
            "job_id",
            sqlite_where=text("status = 'waiting'"),
            postgresql_where=text("status = 'waiting'"),
        ),
        # Role-less waiting jobs alone, in claim order (revision c0002): PostgreSQL does not
        # treat `required_role IS NULL` on the leading column of the two indexes above as an
        # equality that keeps the rest in order, so the role-less probe sorted every waiting
        # job without these.
        Index(
            "ix_jobs_claim_roleless",
            "priority",
            "created_at",
            "job_id",
            sqlite_where=text("status = 'waiting' AND required_role IS NULL"),
            postgresql_where=text("status = 'waiting' AND required_role IS NULL"),
        ),
        Index(
            "ix_jobs_claim_roleless_kind",
            "kind",
            "priority",
            "created_at",
            "job_id",
            sqlite_where=text("status = 'waiting' AND required_role IS NULL"),
            postgresql_where=text("status = 'waiting' AND required_role IS NULL"),
        ),
        # The reaper's sweep of waiting jobs whose deadline passed.
        Index(
            "ix_jobs_waiting_deadline",
            "deadline_at",
            sqlite_where=text("status = 'waiting' AND deadline_at IS NOT NULL"),
            postgresql_where=text("status = 'waiting' AND deadline_at IS NOT NULL"),
        ),
        Index("ix_jobs_status_job_id", "status", "job_id"),
        Index("ix_jobs_tenant_job_id", "tenant", "job_id"),
    )

    job_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128), nullable=False)
    kind: Mapped[str] = mapped_column(String(128), nullable=False)
    required_role: Mapped[str | None] = mapped_column(String(128))
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    payload_json: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    updated_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    run_after: Mapped[int] = mapped_column(BigInteger, nullable=False)
    deadline_at: Mapped[int | None] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="3")
    # The fencing token: increases on every claim of this job.
    epoch: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    result_json: Mapped[str | None] = mapped_column(Text)
    # What produced the result: worker, host, version, handler, duration, model settings.
    provenance_json: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    effect_started: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    cancel_requested: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=false()
    )
    finished_at: Mapped[int | None] = mapped_column(BigInteger)


class Lease(Base):
    __tablename__ = "leases"
    __table_args__ = (
        CheckConstraint("expires_at > granted_at", name="expiry"),
        Index("ix_leases_expires_at", "expires_at"),
    )

    # The job id is the primary key: at most one lease per job, enforced by the schema.
    job_id: Mapped[int] = mapped_column(
        Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    # No foreign key to workers: a lease must outlive a worker row an operator removed, so the
    # reaper can still recover the job.
    worker_id: Mapped[str] = mapped_column(String(200), nullable=False)
    epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    granted_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    expires_at: Mapped[int] = mapped_column(BigInteger, nullable=False)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_event_id", "job_id", "event_id"),)

    event_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(
        Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), nullable=False
    )
    at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(String(40), nullable=False)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    epoch: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[str | None] = mapped_column(Text)


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    job_id: Mapped[int] = mapped_column(
        Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    data_json: Mapped[str] = mapped_column(Text, nullable=False)
    epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    worker_id: Mapped[str] = mapped_column(String(200), nullable=False)
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    updated_at: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Artifact(Base):
    """Large results kept outside the database (the optional `artifacts` migration).

    One row per stage of an artifact by one attempt (job, epoch, name). The bytes live in the
    object store under `location`; the row is written only after the object is stored."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("job_id", "epoch", "name"),
        CheckConstraint("state IN ('staged','verified','accepted','rejected')", name="state"),
        CheckConstraint("size >= 0", name="size"),
        # A job's names are unique in its accepted result.
        Index("uq_artifacts_accepted_name", "job_id", "name", unique=True,
              sqlite_where=text("state = 'accepted'"),
              postgresql_where=text("state = 'accepted'")),
        Index("ix_artifacts_digest", "digest"),
    )

    artifact_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(
        Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), nullable=False
    )
    epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    digest: Mapped[str] = mapped_column(String(80), nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    media_type: Mapped[str] = mapped_column(String(200), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default="staged")
    reason: Mapped[str | None] = mapped_column(String(64))
    location: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    verified_at: Mapped[int | None] = mapped_column(BigInteger)


CORE_TABLES = ("workers", "jobs", "leases", "job_events", "checkpoints")
OPTIONAL_TABLES = {"artifacts": ("artifacts",)}


class Token(Base):
    """An API token of the HTTP server (core revision c0003): only the SHA-256 hash of the
    secret is kept; the role, tenant and worker binding are the caller's trusted identity."""

    __tablename__ = "tokens"
    __table_args__ = (
        CheckConstraint("role IN ('submitter','worker','viewer','operator')", name="role"),
        CheckConstraint("role = 'worker' OR worker_id IS NULL", name="worker_binding"),
        UniqueConstraint("name"),
        UniqueConstraint("token_hash"),
    )

    token_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    tenant: Mapped[str | None] = mapped_column(String(128))
    worker_id: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)
