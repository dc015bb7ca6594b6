"""Optional artifact storage: large results kept outside the database, with their hashes.

Revision ID: a0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "a0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("artifacts",)
# Deliberately no depends_on: Alembic would then fold the core row into this branch's row in
# alembic_version. `jobcoord migrate` always brings the core branch up first.
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # A new table only: no existing table is rebuilt, so no row of jobs, leases or events is
    # copied, and no ON DELETE CASCADE can fire.
    op.create_table(
        "artifacts",
        sa.Column("artifact_id", Id, autoincrement=True, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(200), nullable=False),
        sa.Column("validation_state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "validation_state IN ('pending','valid','invalid')",
            name=op.f("ck_artifacts_validation_state"),
        ),
        sa.CheckConstraint("size_bytes >= 0", name=op.f("ck_artifacts_size")),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.job_id"],
            name=op.f("fk_artifacts_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("artifact_id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("job_id", "name", name=op.f("uq_artifacts_job_id_name")),
    )


def downgrade() -> None:
    op.drop_table("artifacts")
