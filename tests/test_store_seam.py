"""The seam between the rules and the databases: the core asks the store for operations and
never asks which database it runs on; each store implements every operation; every fixed
statement names only tables and columns the migrated schema (and so the models) has."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from jobcoord.coordinator import Coordinator
from jobcoord.store import postgresql as pg_store
from jobcoord.store import statements
from jobcoord.store.base import Database
from jobcoord.store.postgresql import PostgresDatabase
from jobcoord.store.sqlite import SqliteDatabase

CORE = Path(__file__).resolve().parent.parent / "jobcoord" / "core"


def test_the_core_never_branches_on_the_database() -> None:
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(CORE.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"is_sqlite|dialect|folds_transitions|sqlite_path", line)]
    assert found == []


def test_each_store_implements_every_operation_the_core_asks_for() -> None:
    asked = [name for name, fn in vars(Database).items() if inspect.isfunction(fn)
             and "raise NotImplementedError" in inspect.getsource(fn)]
    assert {"take_next", "end_running", "lock_for_decision", "allocate_job_ids",
            "read_owned", "expired_leases", "overdue_waiting"} <= set(asked)
    for store in (SqliteDatabase, PostgresDatabase):
        missing = [name for name in asked if getattr(store, name) is getattr(Database, name)]
        assert missing == [], store.__name__


def _fixed_statements() -> dict[str, statements.SQL]:
    found = {name: stmt for name, stmt in vars(statements).items()
             if isinstance(stmt, statements.SQL)}
    found.update({f"postgresql.{name}": stmt for name, stmt in vars(pg_store).items()
                  if isinstance(stmt, statements.SQL)})
    return found


def test_every_fixed_statement_names_only_columns_the_schema_has(coord: Coordinator) -> None:
    """Preparing a statement (EXPLAIN, nothing runs) fails on a table or column the migrated
    schema lacks; a test elsewhere proves that schema is the models'."""
    found = _fixed_statements()
    assert len(found) > 20

    def explain_all(conn: Any) -> list[str]:
        bad = []
        for name, stmt in sorted(found.items()):
            if name.startswith("postgresql.") and coord.db.dialect != "postgresql":
                continue
            # Every parameter NULL but the counts, which PostgreSQL wants as numbers.
            params = {**_names(stmt), "n": 1, "limit": 1, "heads": 1}
            try:
                with conn.begin_nested():
                    conn.exec_driver_sql("EXPLAIN " + stmt.text(coord.db.dialect), params)
            except Exception as e:
                bad.append(f"{name}: {type(e).__name__}: {e}")
        return bad

    assert coord.db.write(explain_all) == []


def _names(stmt: statements.SQL) -> dict[str, Any]:
    return dict.fromkeys(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", stmt.source))


@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection")  # the base's, on SQLite
def test_each_stores_key_columns_are_the_models_keys(target: Any) -> None:
    """`check` finds a key by its columns on a store that does not name its keys' indexes:
    on a whole database each store's answer (its own, and the inspector's the base gives)
    holds every primary key and UNIQUE of the models."""
    from sqlalchemy import PrimaryKeyConstraint, UniqueConstraint

    from jobcoord.schema import metadata

    with Coordinator.open(target) as c, c.db.engine.connect() as conn:
        present = set(c.db.engine.dialect.get_table_names(conn))
        for table in metadata.sorted_tables:
            if table.name not in present:  # a feature not installed
                continue
            for answer in (c.db.key_columns(conn, table.name),
                           Database.key_columns(c.db, conn, table.name)):
                pk, uniques = answer
                for key in table.constraints:
                    columns = frozenset(col.name for col in key.columns)
                    if isinstance(key, PrimaryKeyConstraint):
                        assert pk == columns, (table.name, answer)
                    elif isinstance(key, UniqueConstraint):
                        assert columns in uniques, (table.name, key.name, answer)
