"""Counts and indexes for the dashboard and /metrics at scale.

At a million jobs the overview's and the metrics' aggregates scanned every job (seconds).
This revision adds:

- `job_counts`: jobs by (tenant, status, kind, attempts), kept by triggers on `jobs` in the
  same transaction as every insert, transition and delete, by any process and any path
  (submit, claim, complete, reap, cancel, retry, reconcile, prune, transfer). A count is the
  sum of its key's shards. SQLite writes shard 0 (one writer at a time anyway).
  PostgreSQL writes the shard of its backend (pg_backend_pid() % 16), so concurrent
  transitions from different connections do not queue on one hot counter row; each
  trigger's rows are written in key order. Batch inserts and deletes are counted once per
  statement on PostgreSQL (transition tables), once per row on SQLite (no statement
  triggers there).
- `claim_refusals`: claims refused, by worker and reason, written by the refused claim.
- `metric_folds`: durable folds of the events (the result commit latency histogram). An
  upgraded database folds its existing completed events here, once, so no scrape does.
- Indexes: waiting jobs by (tenant, kind, created_at) for the queue age, finished jobs by
  (status, finished_at) (covering the tenant) for the last hour, jobs by (kind, job_id) for
  the jobs page's kind filter, and `lease_expired` events by to_status for the expiry
  counter. None of them leads with a column compared by IS NULL.

A populated database upgrades in place: the counts are filled from the jobs in the same
transaction that creates the triggers (on PostgreSQL the trigger's lock on `jobs` holds
every writer back until it commits; on SQLite the migration holds the write lock).

Revision ID: c0004
Revises: c0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0004"
down_revision: str | None = "c0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WAITING = sa.text("status = 'waiting'")
FINISHED = sa.text("finished_at IS NOT NULL")
EXPIRED = sa.text("reason = 'lease_expired'")
ENTERED = sa.text("to_status IN ('dead', 'unknown') AND from_status IS NOT NULL"
                  " AND from_status <> to_status")
KEY = "shard, tenant, status, kind, attempts"
CHANGED = ("OLD.status IS DISTINCT FROM NEW.status OR OLD.attempts IS DISTINCT FROM "
           "NEW.attempts OR OLD.kind IS DISTINCT FROM NEW.kind OR OLD.tenant IS DISTINCT "
           "FROM NEW.tenant")

SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER jobs_counted_insert AFTER INSERT ON jobs BEGIN
  INSERT INTO job_counts ({KEY}, n)
  VALUES (0, NEW.tenant, NEW.status, NEW.kind, NEW.attempts, 1)
  ON CONFLICT ({KEY}) DO UPDATE SET n = n + 1;
END""",
    f"""CREATE TRIGGER jobs_counted_delete AFTER DELETE ON jobs BEGIN
  INSERT INTO job_counts ({KEY}, n)
  VALUES (0, OLD.tenant, OLD.status, OLD.kind, OLD.attempts, -1)
  ON CONFLICT ({KEY}) DO UPDATE SET n = n - 1;
END""",
    f"""CREATE TRIGGER jobs_counted_update AFTER UPDATE OF tenant, status, kind, attempts
ON jobs WHEN {CHANGED.replace("IS DISTINCT FROM", "IS NOT")} BEGIN
  INSERT INTO job_counts ({KEY}, n)
  VALUES (0, OLD.tenant, OLD.status, OLD.kind, OLD.attempts, -1)
  ON CONFLICT ({KEY}) DO UPDATE SET n = n - 1;
  INSERT INTO job_counts ({KEY}, n)
  VALUES (0, NEW.tenant, NEW.status, NEW.kind, NEW.attempts, 1)
  ON CONFLICT ({KEY}) DO UPDATE SET n = n + 1;
END""",
]

_PG_ADD = f"""ON CONFLICT ({KEY}) DO UPDATE SET n = job_counts.n + EXCLUDED.n"""

PG_FUNCTIONS = [
    # Statement level (transition tables): a batch enqueue or a prune adds one grouped row
    # per key, not one per job.
    f"""CREATE FUNCTION jobcoord_jobs_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO job_counts ({KEY}, n)
    SELECT pg_backend_pid() % 16, tenant, status, kind, attempts, count(*)
      FROM counted_rows GROUP BY tenant, status, kind, attempts
      ORDER BY tenant, status, kind, attempts
    {_PG_ADD};
  ELSE
    INSERT INTO job_counts ({KEY}, n)
    SELECT pg_backend_pid() % 16, tenant, status, kind, attempts, -count(*)
      FROM counted_rows GROUP BY tenant, status, kind, attempts
      ORDER BY tenant, status, kind, attempts
    {_PG_ADD};
  END IF;
  RETURN NULL;
END $$""",
    # Row level, only when a counted column changed (the WHEN of the trigger): a transition
    # moves one job from its old key to its new one, the two rows written in key order.
    f"""CREATE FUNCTION jobcoord_job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO job_counts ({KEY}, n)
  SELECT pg_backend_pid() % 16, m.tenant, m.status, m.kind, m.attempts, m.n
    FROM (VALUES (OLD.tenant, OLD.status, OLD.kind, OLD.attempts, -1),
                 (NEW.tenant, NEW.status, NEW.kind, NEW.attempts, 1))
         AS m (tenant, status, kind, attempts, n)
    ORDER BY m.tenant, m.status, m.kind, m.attempts
  {_PG_ADD};
  RETURN NULL;
END $$""",
]

PG_TRIGGERS = [
    "CREATE TRIGGER jobs_counted_insert AFTER INSERT ON jobs REFERENCING NEW TABLE AS"
    " counted_rows FOR EACH STATEMENT EXECUTE FUNCTION jobcoord_jobs_counted()",
    "CREATE TRIGGER jobs_counted_delete AFTER DELETE ON jobs REFERENCING OLD TABLE AS"
    " counted_rows FOR EACH STATEMENT EXECUTE FUNCTION jobcoord_jobs_counted()",
    "CREATE TRIGGER jobs_counted_update AFTER UPDATE OF tenant, status, kind, attempts ON"
    f" jobs FOR EACH ROW WHEN ({CHANGED}) EXECUTE FUNCTION jobcoord_job_moved()",
]


def upgrade() -> None:
    op.create_table(
        "job_counts",
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("shard", "tenant", "status", "kind", "attempts",
                                name=op.f("pk_job_counts")),
    )
    op.create_table(
        "claim_refusals",
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("last_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "reason", name=op.f("pk_claim_refusals")),
    )
    op.create_table(
        "metric_folds",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_metric_folds")),
    )
    op.create_index("ix_jobs_kind_job_id", "jobs", ["kind", "job_id"])
    op.create_index("ix_jobs_waiting_age", "jobs", ["tenant", "kind", "created_at"],
                    sqlite_where=WAITING, postgresql_where=WAITING)
    op.create_index("ix_jobs_finished_at", "jobs", ["status", "finished_at", "tenant"],
                    sqlite_where=FINISHED, postgresql_where=FINISHED)
    op.create_index("ix_job_events_lease_expired", "job_events", ["to_status"],
                    sqlite_where=EXPIRED, postgresql_where=EXPIRED)
    op.create_index("ix_job_events_dead_unknown", "job_events", ["to_status"],
                    sqlite_where=ENTERED, postgresql_where=ENTERED)
    if op.get_context().dialect.name == "sqlite":
        for trigger in SQLITE_TRIGGERS:
            op.execute(trigger)
    else:
        for statement in [*PG_FUNCTIONS, *PG_TRIGGERS]:
            op.execute(statement)
    # The jobs already there, counted in the transaction that made the triggers.
    op.execute(f"INSERT INTO job_counts ({KEY}, n) SELECT 0, tenant, status, kind, attempts,"
               " COUNT(*) FROM jobs GROUP BY tenant, status, kind, attempts")
    _fold_existing_completions()


def _fold_existing_completions() -> None:
    """Fold the completed events already there into the latency histogram's durable state,
    so the first scrape after the upgrade reads only what is new."""
    from jobcoord.clock import now_us
    from jobcoord.metrics import LATENCY_FOLD, fold_rows, settled_horizon_us
    from jobcoord.store.base import Database
    from jobcoord.store.sqlite import SqliteDatabase

    conn = op.get_bind()
    store = SqliteDatabase if op.get_context().dialect.name == "sqlite" else Database
    now = now_us()
    state, cursor, horizon = None, 0, settled_horizon_us(store.events_settle_s, now)
    while True:
        rows = conn.execute(sa.text(
            "SELECT e.event_id, e.at, j.provenance_json FROM job_events e"
            " JOIN jobs j ON j.job_id = e.job_id WHERE e.reason = 'completed'"
            " AND e.event_id > :cursor ORDER BY e.event_id LIMIT 5000"),
            {"cursor": cursor}).all()
        state, cursor, done = fold_rows(state, cursor, rows, horizon)
        if done or len(rows) < 5000:
            break
    if state is not None:
        conn.execute(sa.text(
            "INSERT INTO metric_folds (name, last_event_id, state_json, updated_at)"
            " VALUES (:name, :cursor, :state, :now)"),
            {"name": LATENCY_FOLD, "cursor": cursor, "state": state.to_json(), "now": now})


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        for name in ("jobs_counted_insert", "jobs_counted_delete", "jobs_counted_update"):
            op.execute(f"DROP TRIGGER {name}")
    else:
        for name in ("jobs_counted_insert", "jobs_counted_delete", "jobs_counted_update"):
            op.execute(f"DROP TRIGGER {name} ON jobs")
        op.execute("DROP FUNCTION jobcoord_jobs_counted()")
        op.execute("DROP FUNCTION jobcoord_job_moved()")
    op.drop_index("ix_job_events_dead_unknown", table_name="job_events")
    op.drop_index("ix_job_events_lease_expired", table_name="job_events")
    op.drop_index("ix_jobs_finished_at", table_name="jobs")
    op.drop_index("ix_jobs_waiting_age", table_name="jobs")
    op.drop_index("ix_jobs_kind_job_id", table_name="jobs")
    op.drop_table("metric_folds")
    op.drop_table("claim_refusals")
    op.drop_table("job_counts")
