"""Durable schedules: the schedules table and one row per handled (schedule, slot).

Revision ID: c0005
Revises: c0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0005"
down_revision: str | None = "c0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # New tables only: a populated database upgrades in place, nothing else is rewritten.
    op.create_table(
        "schedules",
        sa.Column("schedule_id", Id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("required_role", sa.String(128), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("cron", sa.String(200), nullable=True),
        sa.Column("tz", sa.String(64), nullable=True),
        sa.Column("every_us", sa.BigInteger(), nullable=True),
        sa.Column("window_us", sa.BigInteger(), nullable=True),
        sa.Column("catchup", sa.String(8), nullable=False),
        sa.Column("catchup_max", sa.Integer(), server_default="1", nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("next_slot_at", sa.BigInteger(), nullable=False),
        sa.Column("due_at", sa.BigInteger(), nullable=True),
        sa.Column("queued_slot_at", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("(cron IS NULL) <> (every_us IS NULL)",
                           name=op.f("ck_schedules_when")),
        sa.CheckConstraint("every_us IS NULL OR every_us > 0", name=op.f("ck_schedules_every")),
        sa.CheckConstraint("window_us IS NULL OR window_us > 0",
                           name=op.f("ck_schedules_window")),
        sa.CheckConstraint("catchup IN ('skip','latest','all')",
                           name=op.f("ck_schedules_catchup")),
        sa.CheckConstraint("catchup_max >= 1", name=op.f("ck_schedules_catchup_max")),
        sa.CheckConstraint("overlap IN ('allow','skip','queue_one')",
                           name=op.f("ck_schedules_overlap")),
        sa.CheckConstraint("priority BETWEEN 0 AND 3", name=op.f("ck_schedules_priority")),
        sa.PrimaryKeyConstraint("schedule_id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_schedules_name")),
    )
    op.create_index("ix_schedules_due_at", "schedules", ["due_at"])
    op.create_table(
        "schedule_fires",
        sa.Column("fire_id", Id, autoincrement=True, nullable=False),
        sa.Column("schedule_id", Id, nullable=False),
        sa.Column("slot_at", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("job_id", Id, nullable=True),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.CheckConstraint("outcome IN ('fired','missed','skipped','queued')",
                           name=op.f("ck_schedule_fires_outcome")),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.schedule_id"],
                                name=op.f("fk_schedule_fires_schedule_id_schedules"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"],
                                name=op.f("fk_schedule_fires_job_id_jobs"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("fire_id", name=op.f("pk_schedule_fires")),
        sa.UniqueConstraint("schedule_id", "slot_at",
                            name=op.f("uq_schedule_fires_schedule_id_slot_at")),
    )
    op.create_index("ix_schedule_fires_job_id", "schedule_fires", ["job_id"])
    op.create_index("ix_schedule_fires_schedule_id_outcome_slot_at", "schedule_fires",
                    ["schedule_id", "outcome", "slot_at"])


def downgrade() -> None:
    op.drop_index("ix_schedule_fires_schedule_id_outcome_slot_at", table_name="schedule_fires")
    op.drop_index("ix_schedule_fires_job_id", table_name="schedule_fires")
    op.drop_table("schedule_fires")
    op.drop_index("ix_schedules_due_at", table_name="schedules")
    op.drop_table("schedules")
