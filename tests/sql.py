"""Raw SQL for tests that look at or bend the stored state directly: a statement with
`:name` parameters run on a connection of `Database.read` / `write`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection


def sql(conn: Connection, statement: str, params: Mapping[str, Any] | None = None) -> Any:
    """Run `statement` in the transaction `conn` is in; SQLAlchemy's result."""
    return conn.execute(text(statement), dict(params) if params else {})
