"""Claim indexes led by the tenant: a claim bound to a tenant seeks to that tenant's first
eligible job in claim order, instead of reading past every other tenant's waiting jobs (the
claim indexes lead with the role and kind, the tenant was a filter on the rows they read).

The role is keyed as `coalesce(required_role, '')`, an equality on both databases after which
the claim order still holds, so one index serves the role-less and the role probes; a second
one adds the kind. Both are partial on waiting jobs of a tenant other than `default`, so a
queue used without tenants pays nothing for them; a claim bound to the default tenant walks
the role claim indexes as before. Nothing is rewritten: a populated database upgrades in
place.

Revision ID: c0007
Revises: c0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "c0007"
down_revision: str | None = "c0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Jobs of the default tenant stay out: a queue used without tenants writes nothing more.
WAITING = sa.text("status = 'waiting' AND tenant <> 'default'")
ROLE = sa.text("coalesce(required_role, '')")


def upgrade() -> None:
    op.create_index("ix_jobs_claim_tenant", "jobs",
                    ["tenant", ROLE, "priority", "created_at", "job_id"],
                    sqlite_where=WAITING, postgresql_where=WAITING)
    op.create_index("ix_jobs_claim_tenant_kind", "jobs",
                    ["tenant", ROLE, "kind", "priority", "created_at", "job_id"],
                    sqlite_where=WAITING, postgresql_where=WAITING)


def downgrade() -> None:
    op.drop_index("ix_jobs_claim_tenant_kind", table_name="jobs")
    op.drop_index("ix_jobs_claim_tenant", table_name="jobs")
