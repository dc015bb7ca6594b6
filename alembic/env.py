"""Alembic environment for jobcoord.

`jobcoord migrate` hands over an open connection (already inside its write transaction).
Run from a checkout, `alembic upgrade head` builds the engine with jobcoord's own engine
factory, so SQLite migrations also run under BEGIN IMMEDIATE with the same pragmas. The URL
comes from JOBCOORD_URL, else from `sqlalchemy.url` in alembic.ini.
"""

import os

from alembic import context
from jobcoord.db import Database, resolve_target
from jobcoord.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection):
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite can only change a table by rebuilding it; batch mode does that.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # With BEGIN issued by jobcoord's engine, SQLite DDL is transactional too.
        transactional_ddl=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = os.environ.get("JOBCOORD_URL") or config.get_main_option("sqlalchemy.url")
    db = Database.open(resolve_target(url=url), create=True)
    try:
        with db.write_engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        db.close()


if context.is_offline_mode():
    raise SystemExit("jobcoord migrations run online only: give a database URL")
run_migrations_online()
