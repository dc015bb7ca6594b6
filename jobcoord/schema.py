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
    func,
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
    # The dashboard's jobs page filtered by kind, newest first (c0004). A job's kind never
    # changes, so only an insert or a delete writes it.
    Index("ix_jobs_kind_job_id", "kind", "job_id"),
)


#: The role as the tenant claim indexes key it (c0007): '' for a job without one. A statement
#: must spell it the same way to use them.
TENANT_ROLE = func.coalesce(jobs.c.required_role, text("''"))
#: The rows the tenant claim indexes hold besides waiting: a tenant other than the default
#: one (core.common.DEFAULT_TENANT). A statement must repeat it to use them.
TENANTED = "tenant <> 'default'"


#: The predicate of ix_job_events_dead_unknown, which a statement must repeat to use it.
ENTERED_DEAD_OR_UNKNOWN = ("to_status IN ('dead', 'unknown') AND from_status IS NOT NULL"
                           " AND from_status <> to_status")


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
    # A tenant-bound claim's order (revision c0007): the tenant leads, so the claim seeks
    # to its tenant's first eligible job instead of reading past every other tenant's
    # waiting jobs. The role is keyed as `coalesce(required_role, '')` (no role name is
    # empty): an equality both planners keep the following columns in order after, so the
    # role-less and the role probes share one index, and two indexes serve all four shapes.
    # Jobs of the default tenant are left out: a queue used without tenants writes nothing
    # more, and a claim bound to the default tenant walks the claim indexes above.
    Index("ix_jobs_claim_tenant", c.tenant, TENANT_ROLE, c.priority, c.created_at, c.job_id,
          **_waiting(f" AND {TENANTED}"))
    Index("ix_jobs_claim_tenant_kind", c.tenant, TENANT_ROLE, c.kind, c.priority,
          c.created_at, c.job_id, **_waiting(f" AND {TENANTED}"))
    # The reaper's sweep of waiting jobs whose deadline passed.
    Index("ix_jobs_waiting_deadline", c.deadline_at,
          **_waiting(" AND deadline_at IS NOT NULL"))
    # Queue age per (tenant, kind) (revision c0004): the oldest waiting job of each is the
    # first entry of its slice, an index seek instead of a scan of every waiting job.
    Index("ix_jobs_waiting_age", c.tenant, c.kind, c.created_at, **_waiting())
    # Jobs of each status finished since a time (the overview's last hour), covering the
    # tenant so the count never reads a job row; jobs not finished are not in it. The
    # status leads: a count grouped by status then reads this index in its order, where
    # SQLite would otherwise prefer walking all of ix_jobs_status_job_id to skip a sort.
    finished = text("finished_at IS NOT NULL")
    Index("ix_jobs_finished_at", c.status, c.finished_at, c.tenant,
          sqlite_where=finished, postgresql_where=finished)
    # Leases reaped, by where the job went: the few `lease_expired` events alone.
    expired = text("reason = 'lease_expired'")
    Index("ix_job_events_lease_expired", job_events.c.to_status,
          sqlite_where=expired, postgresql_where=expired)
    # Transitions into dead or unknown (a refusal recorded on a dead job keeps its status
    # and is not one): the jobs that ever died or needed a human, retried since or not.
    entered = text(ENTERED_DEAD_OR_UNKNOWN)
    Index("ix_job_events_dead_unknown", job_events.c.to_status,
          sqlite_where=entered, postgresql_where=entered)
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

# Jobs counted by (tenant, status, kind, attempts) (core revision c0004), kept by triggers
# on `jobs` in the transaction of every insert, transition and delete, whatever process or
# path writes it: the figures of the overview and of /metrics are a sum over this small
# table instead of a scan of every job. A key's count is the sum of its shards: SQLite
# writes shard 0 only (its writers are serialised anyway); PostgreSQL writes the shard of
# its backend, so concurrent transactions do not queue on one hot row. See the revision.
#: The triggers that keep job_counts (created by revision c0004, on `jobs`), same names on
#: both databases: `check` reports one that is gone.
COUNTING_TRIGGERS = ("jobs_counted_insert", "jobs_counted_delete", "jobs_counted_update")

job_counts = Table(
    "job_counts", metadata,
    Column("shard", Integer, primary_key=True),
    Column("tenant", String(128), primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("kind", String(128), primary_key=True),
    Column("attempts", Integer, primary_key=True),
    Column("n", BigInteger, nullable=False),
)

# Claims refused, by worker and reason (c0004): a counter row updated in the refused
# claim's own transaction, one row per worker so workers never wait on each other's.
claim_refusals = Table(
    "claim_refusals", metadata,
    Column("worker_id", String(200), primary_key=True),
    Column("reason", String(40), primary_key=True),
    Column("n", BigInteger, nullable=False),
    Column("last_at", BigInteger, nullable=False),
)

# Durable folds of the events into metrics (c0004): e.g. the result commit latency
# histogram up to an event id, so no process re-reads every completed job at its first
# scrape. A fold is a function of the events it has read; it is advanced by compare-and-set.
metric_folds = Table(
    "metric_folds", metadata,
    Column("name", String(64), primary_key=True),
    Column("last_event_id", BigInteger, nullable=False),
    Column("state_json", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
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

# Durable schedules (core revision c0005): what to enqueue and when. `next_slot_at` is the
# first slot not yet handled; `due_at` is when a tick must look at the schedule next (NULL
# while paused), so a tick with nothing due is one read of this index.
schedules = Table(
    "schedules", metadata,
    Column("schedule_id", Id, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("kind", String(128), nullable=False),
    Column("required_role", String(128)),
    Column("priority", Integer, nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    # Exactly one of cron (with its IANA zone) and every_us says when the slots are.
    Column("cron", String(200)),
    Column("tz", String(64)),
    Column("every_us", BigInteger),
    Column("window_us", BigInteger),
    Column("catchup", String(8), nullable=False),
    Column("catchup_max", Integer, nullable=False, server_default="1"),
    Column("overlap", String(16), nullable=False),
    Column("paused", Boolean, nullable=False, server_default=false()),
    Column("next_slot_at", BigInteger, nullable=False),
    Column("due_at", BigInteger),
    # queue_one: the slot held back until the previous fire's job has finished.
    Column("queued_slot_at", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    CheckConstraint("(cron IS NULL) <> (every_us IS NULL)", name="when"),
    CheckConstraint("every_us IS NULL OR every_us > 0", name="every"),
    CheckConstraint("window_us IS NULL OR window_us > 0", name="window"),
    CheckConstraint("catchup IN ('skip','latest','all')", name="catchup"),
    CheckConstraint("catchup_max >= 1", name="catchup_max"),
    CheckConstraint("overlap IN ('allow','skip','queue_one')", name="overlap"),
    CheckConstraint("priority BETWEEN 0 AND 3", name="priority"),
    UniqueConstraint("name"),
    Index("ix_schedules_due_at", "due_at"),
)

# One row per handled slot of a schedule: fired (with its job), missed, skipped or queued.
# The unique (schedule, slot) key is what makes firing idempotent across processes: the row
# is inserted in the transaction that inserts the job, so a second ticker's insert of the
# same slot does nothing, and it inserts no job.
schedule_fires = Table(
    "schedule_fires", metadata,
    Column("fire_id", Id, primary_key=True, autoincrement=True),
    Column("schedule_id", Id, ForeignKey("schedules.schedule_id", ondelete="CASCADE"),
           nullable=False),
    Column("slot_at", BigInteger, nullable=False),
    Column("outcome", String(16), nullable=False),
    # Kept when a prune deletes the job: the slot stays handled.
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="SET NULL")),
    Column("at", BigInteger, nullable=False),
    Column("detail", Text),
    CheckConstraint("outcome IN ('fired','missed','skipped','queued')", name="outcome"),
    UniqueConstraint("schedule_id", "slot_at"),
    Index("ix_schedule_fires_job_id", "job_id"),
    # The last slot that made a job (overlap), however many skipped slots came after it.
    Index("ix_schedule_fires_schedule_id_outcome_slot_at", "schedule_id", "outcome",
          "slot_at"),
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

#: Every table of the core revisions, parents before children (transfer copies them in this
#: order).
CORE_TABLES = ("workers", "jobs", "leases", "job_events", "checkpoints", "tokens", "schedules",
               "schedule_fires", "limits")
OPTIONAL_TABLES = {"artifacts": ("artifacts",)}
