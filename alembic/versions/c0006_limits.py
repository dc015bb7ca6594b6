"""Concurrency limits and declared resource needs: the limits table, jobs.needs_json, and a
partial index that tells a claim at once whether any waiting job declares needs.

Revision ID: c0006
Revises: c0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0006"
down_revision: str | None = "c0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A new table and a nullable column: a populated database upgrades in place (existing
    # jobs declare no needs), nothing else is rewritten.
    op.create_table(
        "limits",
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("key_field", sa.String(128), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("concurrency >= 1", name=op.f("ck_limits_concurrency")),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_limits")),
    )
    op.add_column("jobs", sa.Column("needs_json", sa.Text(), nullable=True))
    where = sa.text("status = 'waiting' AND needs_json IS NOT NULL")
    op.create_index("ix_jobs_waiting_needs", "jobs", ["job_id"],
                    sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    op.drop_index("ix_jobs_waiting_needs", table_name="jobs")
    # In place on both databases (SQLite 3.35+ drops a column itself): a batch copy of jobs
    # would drop the old table, and with foreign keys on that deletes every lease, event and
    # checkpoint by cascade.
    op.execute("ALTER TABLE jobs DROP COLUMN needs_json")
    op.drop_table("limits")
