"""Core tables: workers, jobs, leases, job_events, checkpoints.

Revision ID: c0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("core",)
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WAITING = sa.text("status = 'waiting'")


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("roles_json", sa.Text(), server_default="[]", nullable=False),
        sa.Column("kinds_json", sa.Text(), nullable=True),
        sa.Column("heartbeat_raw", sa.Text(), nullable=True),
        sa.Column("heartbeat_at", sa.BigInteger(), nullable=True),
        sa.Column("memory_used_pct", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("on_battery", sa.Boolean(), nullable=True),
        sa.Column("user_idle_s", sa.Float(), nullable=True),
        sa.Column("last_refusal", sa.String(40), nullable=True),
        sa.Column("last_refusal_detail", sa.Text(), nullable=True),
        sa.Column("last_refusal_at", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", Id, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("required_role", sa.String(128), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("run_after", sa.BigInteger(), nullable=False),
        sa.Column("deadline_at", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="3", nullable=False),
        sa.Column("epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("provenance_json", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("effect_started", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "status IN ('waiting','running','succeeded','dead','cancelled','unknown')",
            name=op.f("ck_jobs_status"),
        ),
        sa.CheckConstraint("priority BETWEEN 0 AND 3", name=op.f("ck_jobs_priority")),
        sa.CheckConstraint(
            "attempts >= 0 AND max_attempts >= 1", name=op.f("ck_jobs_attempts")
        ),
        sa.CheckConstraint("epoch >= 0", name=op.f("ck_jobs_epoch")),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
        sa.UniqueConstraint(
            "tenant", "idempotency_key", name=op.f("uq_jobs_tenant_idempotency_key")
        ),
    )
    op.create_index(
        "ix_jobs_claim_role",
        "jobs",
        ["required_role", "priority", "created_at", "job_id"],
        sqlite_where=WAITING,
        postgresql_where=WAITING,
    )
    op.create_index(
        "ix_jobs_claim_kind",
        "jobs",
        ["required_role", "kind", "priority", "created_at", "job_id"],
        sqlite_where=WAITING,
        postgresql_where=WAITING,
    )
    op.create_index(
        "ix_jobs_waiting_deadline",
        "jobs",
        ["deadline_at"],
        sqlite_where=sa.text("status = 'waiting' AND deadline_at IS NOT NULL"),
        postgresql_where=sa.text("status = 'waiting' AND deadline_at IS NOT NULL"),
    )
    op.create_index("ix_jobs_status_job_id", "jobs", ["status", "job_id"])
    op.create_index("ix_jobs_tenant_job_id", "jobs", ["tenant", "job_id"])
    op.create_table(
        "leases",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("granted_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("expires_at > granted_at", name=op.f("ck_leases_expiry")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_leases_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_leases")),
    )
    op.create_index("ix_leases_expires_at", "leases", ["expires_at"])
    op.create_table(
        "job_events",
        sa.Column("event_id", Id, autoincrement=True, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_job_events_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id_event_id", "job_events", ["job_id", "event_id"])
    op.create_table(
        "checkpoints",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_checkpoints_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_checkpoints")),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_index("ix_job_events_job_id_event_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_leases_expires_at", table_name="leases")
    op.drop_table("leases")
    for name in (
        "ix_jobs_tenant_job_id",
        "ix_jobs_status_job_id",
        "ix_jobs_waiting_deadline",
        "ix_jobs_claim_kind",
        "ix_jobs_claim_role",
    ):
        op.drop_index(name, table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("workers")
