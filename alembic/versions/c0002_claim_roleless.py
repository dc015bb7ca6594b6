"""Claim indexes for role-less waiting jobs.

PostgreSQL does not treat `required_role IS NULL` on the leading column of ix_jobs_claim_role
and ix_jobs_claim_kind as an equality that keeps the following columns in order, so the
role-less claim probe (the default path: most jobs have no role) read every waiting job and
sorted them. These partial indexes hold role-less waiting jobs alone, in claim order. SQLite
gets them too, so both databases carry the same schema.

Revision ID: c0002
Revises: c0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0002"
down_revision: str | None = "c0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLELESS_WAITING = sa.text("status = 'waiting' AND required_role IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_claim_roleless",
        "jobs",
        ["priority", "created_at", "job_id"],
        sqlite_where=ROLELESS_WAITING,
        postgresql_where=ROLELESS_WAITING,
    )
    op.create_index(
        "ix_jobs_claim_roleless_kind",
        "jobs",
        ["kind", "priority", "created_at", "job_id"],
        sqlite_where=ROLELESS_WAITING,
        postgresql_where=ROLELESS_WAITING,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_claim_roleless_kind", table_name="jobs")
    op.drop_index("ix_jobs_claim_roleless", table_name="jobs")
