"""Artifact rows for the object store: digest, attempt epoch, states and fenced linking.

a0001 gave the `artifacts` table a shape nothing could write (a bare sha256, a
pending/valid/invalid flag, one row per job and name). a0002 brings it to what the store and
fenced linking need:

- `epoch`: the attempt that staged the artifact (rows from a0001 get their job's epoch);
- `digest` (`sha256:<hex>`), `size`, `media_type`, `location` (the store-relative object path);
- `state`: staged -> verified -> accepted | rejected, with a `reason` code;
- `created_at`, `verified_at`;
- unique (job_id, epoch, name): one stage per attempt and name; a partial unique index on
  (job_id, name) among accepted rows: a job's names are unique in its accepted result;
- an index on digest, so gc and backup ask "is this object referenced" without a scan.

The table is rebuilt on both databases the same way: its rows are copied aside into a plain
table, the table is created again with its final constraint names, the rows are copied back
(ids kept) and the copy dropped. Upgrade maps pending -> staged, valid -> accepted,
invalid -> rejected (reason `invalid_before_a0002`); downgrade maps back. A downgrade can hold
only one row per (job, name): the accepted one is kept, else the newest attempt's; the others
(stages of attempts that were never linked) are dropped. Objects on disk are never touched.

Revision ID: a0002
Revises: a0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "a0002"
down_revision: str | None = "a0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
ACCEPTED = sa.text("state = 'accepted'")
COPY = "artifacts_migrating"


def _copy_aside() -> None:
    op.execute(f"CREATE TABLE {COPY} AS SELECT * FROM artifacts")
    op.drop_table("artifacts")


def _fix_sequence() -> None:
    # The rows came back with their ids; a PostgreSQL sequence must continue past them.
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SELECT setval(pg_get_serial_sequence('artifacts', 'artifact_id'), "
                   "COALESCE((SELECT MAX(artifact_id) FROM artifacts), 0) + 1, false)")


def upgrade() -> None:
    _copy_aside()
    op.create_table(
        "artifacts",
        sa.Column("artifact_id", Id, autoincrement=True, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), server_default="staged", nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("verified_at", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("state IN ('staged','verified','accepted','rejected')",
                           name=op.f("ck_artifacts_state")),
        sa.CheckConstraint("size >= 0", name=op.f("ck_artifacts_size")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"],
                                name=op.f("fk_artifacts_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("artifact_id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("job_id", "epoch", "name",
                            name=op.f("uq_artifacts_job_id_epoch_name")),
    )
    op.create_index("uq_artifacts_accepted_name", "artifacts", ["job_id", "name"], unique=True,
                    sqlite_where=ACCEPTED, postgresql_where=ACCEPTED)
    op.create_index("ix_artifacts_digest", "artifacts", ["digest"])
    op.execute(
        "INSERT INTO artifacts (artifact_id, job_id, epoch, name, digest, size, media_type,"
        " state, reason, location, created_at, verified_at)"
        " SELECT a.artifact_id, a.job_id, COALESCE(j.epoch, 0), a.name, 'sha256:' || a.sha256,"
        " a.size_bytes, a.media_type,"
        " CASE a.validation_state WHEN 'valid' THEN 'accepted'"
        "  WHEN 'invalid' THEN 'rejected' ELSE 'staged' END,"
        " CASE a.validation_state WHEN 'invalid' THEN 'invalid_before_a0002' END,"
        " a.location, a.created_at,"
        " CASE a.validation_state WHEN 'valid' THEN a.created_at END"
        f" FROM {COPY} a LEFT JOIN jobs j ON j.job_id = a.job_id")
    op.drop_table(COPY)
    _fix_sequence()


def downgrade() -> None:
    _copy_aside()
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
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"],
                                name=op.f("fk_artifacts_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("artifact_id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("job_id", "name", name=op.f("uq_artifacts_job_id_name")),
    )
    # One row per (job, name): the accepted one, else the newest attempt's stage.
    op.execute(
        "INSERT INTO artifacts (artifact_id, job_id, name, location, sha256, size_bytes,"
        " media_type, validation_state, created_at)"
        " SELECT artifact_id, job_id, name, location,"
        " CASE WHEN digest LIKE 'sha256:%' THEN SUBSTR(digest, 8) ELSE digest END,"
        " size, media_type,"
        " CASE state WHEN 'accepted' THEN 'valid' WHEN 'rejected' THEN 'invalid'"
        "  ELSE 'pending' END, created_at"
        " FROM (SELECT c.*, ROW_NUMBER() OVER (PARTITION BY job_id, name ORDER BY"
        "  CASE state WHEN 'accepted' THEN 0 ELSE 1 END, epoch DESC, artifact_id DESC) AS rn"
        f"  FROM {COPY} c) ranked WHERE rn = 1")
    op.drop_table(COPY)
    _fix_sequence()
