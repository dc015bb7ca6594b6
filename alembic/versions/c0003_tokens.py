"""API tokens for the HTTP server: hashed secrets with a role, tenant and worker binding.

Revision ID: c0003
Revises: c0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0003"
down_revision: str | None = "c0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # A new table only: a populated database upgrades in place, nothing else is rewritten.
    op.create_table(
        "tokens",
        sa.Column("token_id", Id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=True),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("role IN ('submitter','worker','viewer','operator')",
                           name=op.f("ck_tokens_role")),
        sa.CheckConstraint("role = 'worker' OR worker_id IS NULL",
                           name=op.f("ck_tokens_worker_binding")),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_tokens_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )


def downgrade() -> None:
    op.drop_table("tokens")
