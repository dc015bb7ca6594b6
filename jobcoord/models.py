"""Declarative models: the schema as the ORM sees it, mapped onto the Core tables of
`schema.py`, where every column, constraint and index is defined once.

The database itself is created and changed only by the Alembic history in `alembic/`; a test
proves that history and these models agree. Times are integer microseconds since the epoch,
UTC (see clock.py); JSON bodies are stored as text exactly as jobcoord serialised them.
"""

from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase, Mapped

from . import schema
from .schema import CORE_TABLES as CORE_TABLES
from .schema import NAMING as NAMING
from .schema import OPTIONAL_TABLES as OPTIONAL_TABLES
from .schema import Id as Id
from .states import FINAL_STATUSES as FINAL_STATUSES
from .states import STATUSES as STATUSES

# The schema Alembic and the model-vs-history test compare includes the partial indexes.
schema.add_partial_indexes()


class Base(DeclarativeBase):
    metadata = schema.metadata


class Worker(Base):
    __table__ = schema.workers

    worker_id: Mapped[str]
    roles_json: Mapped[str]
    kinds_json: Mapped[str | None]
    heartbeat_raw: Mapped[str | None]
    heartbeat_at: Mapped[int | None]
    memory_used_pct: Mapped[float | None]
    temperature_c: Mapped[float | None]
    on_battery: Mapped[bool | None]
    user_idle_s: Mapped[float | None]
    last_refusal: Mapped[str | None]
    last_refusal_detail: Mapped[str | None]
    last_refusal_at: Mapped[int | None]
    created_at: Mapped[int]


class Job(Base):
    __table__ = schema.jobs

    job_id: Mapped[int]
    tenant: Mapped[str]
    kind: Mapped[str]
    required_role: Mapped[str | None]
    priority: Mapped[int]
    payload_json: Mapped[str]
    status: Mapped[str]
    created_at: Mapped[int]
    updated_at: Mapped[int]
    run_after: Mapped[int]
    deadline_at: Mapped[int | None]
    attempts: Mapped[int]
    max_attempts: Mapped[int]
    epoch: Mapped[int]
    idempotency_key: Mapped[str | None]
    result_json: Mapped[str | None]
    provenance_json: Mapped[str | None]
    last_error: Mapped[str | None]
    effect_started: Mapped[bool]
    cancel_requested: Mapped[bool]
    finished_at: Mapped[int | None]
    needs_json: Mapped[str | None]


class Lease(Base):
    __table__ = schema.leases

    job_id: Mapped[int]
    worker_id: Mapped[str]
    epoch: Mapped[int]
    granted_at: Mapped[int]
    expires_at: Mapped[int]


class JobEvent(Base):
    __table__ = schema.job_events

    event_id: Mapped[int]
    job_id: Mapped[int]
    at: Mapped[int]
    from_status: Mapped[str | None]
    to_status: Mapped[str]
    reason: Mapped[str]
    worker_id: Mapped[str | None]
    epoch: Mapped[int | None]
    detail: Mapped[str | None]


class Checkpoint(Base):
    __table__ = schema.checkpoints

    job_id: Mapped[int]
    name: Mapped[str]
    data_json: Mapped[str]
    epoch: Mapped[int]
    worker_id: Mapped[str]
    created_at: Mapped[int]
    updated_at: Mapped[int]


class Artifact(Base):
    """Large results kept outside the database (the optional `artifacts` migration).

    One row per stage of an artifact by one attempt (job, epoch, name). The bytes live in the
    object store under `location`; the row is written only after the object is stored."""

    __table__ = schema.artifacts

    artifact_id: Mapped[int]
    job_id: Mapped[int]
    epoch: Mapped[int]
    name: Mapped[str]
    digest: Mapped[str]
    size: Mapped[int]
    media_type: Mapped[str]
    state: Mapped[str]
    reason: Mapped[str | None]
    location: Mapped[str]
    created_at: Mapped[int]
    verified_at: Mapped[int | None]


class Token(Base):
    """An API token of the HTTP server (core revision c0003): only the SHA-256 hash of the
    secret is kept; the role, tenant and worker binding are the caller's trusted identity."""

    __table__ = schema.tokens

    token_id: Mapped[int]
    name: Mapped[str]
    token_hash: Mapped[str]
    role: Mapped[str]
    tenant: Mapped[str | None]
    worker_id: Mapped[str | None]
    created_at: Mapped[int]
    revoked_at: Mapped[int | None]


class Limit(Base):
    """A concurrency limit (core revision c0006): at most `concurrency` live leases of the
    kind at once, per value of the payload field `key_field` when it is set."""

    __table__ = schema.limits

    kind: Mapped[str]
    concurrency: Mapped[int]
    key_field: Mapped[str | None]
    created_at: Mapped[int]
    updated_at: Mapped[int]
