"""Checks, backups and restores: recovery is checked, not assumed.

`check` runs SQLite's own check (quick or full) and the application invariants, which hold
on both databases. `backup` uses SQLite's online backup API in a single step (a page-by-page
backup restarts on every write and may never finish under load) into a temporary file, opens
that copy on its own connection and checks it, and only then syncs and renames it into place:
a copy that fails its check never replaces anything, so the last good backup survives a
damaged database. `restore` is
the way back: a backup proven whole becomes a new database, never written over an old one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sqlite3
import stat
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from sqlalchemy import Column, ColumnElement, Table
from sqlalchemy.engine import Connection

from . import faults, leftovers
from . import validate as v
from .errors import (
    DatabaseCorrupt,
    InvalidInput,
    SchemaMismatch,
    StorageUnavailable,
)
from .store import Database, Target, classify, resolve_target
from .store import report_statements as rs
from .store.sqlite import create_private_file, file_quick_check, set_journal_mode
from .store.sqlite_files import LOG_SUFFIXES, no_directory, refuse_log_name
from .store.target import WRITE_ROOM, name_has_room, utf8_path


def _installed_features(db: Database, conn: Connection) -> tuple[set[str], set[str]] | None:
    """The features installed beside the core, and those of them at their newest revision;
    None below the newest core revision: an older one lacks the newer tables, indexes and
    triggers by design (`migrate` adds them); the findings judge what it has."""
    from .migrate import current_revisions, installed_features
    from .store import CORE_REVISIONS, OPTIONAL_REVISIONS

    revisions = current_revisions(db, conn)
    if CORE_REVISIONS[-1] not in revisions:
        return None
    features = set(installed_features(revisions))
    return features, {f for f in features if OPTIONAL_REVISIONS[f][-1] in revisions}


def _expected_tables(features: set[str]) -> list[Table]:
    """The tables of the core and of `features`: the core's own and those jobcoord keeps
    beside them (job_counts, the refusal counters, the metric folds)."""
    from .schema import OPTIONAL_TABLES, metadata

    absent = {t for f, names in OPTIONAL_TABLES.items() if f not in features for t in names}
    return [t for t in metadata.sorted_tables if t.name not in absent]


def _missing_tables(db: Database, conn: Connection, features: set[str]) -> list[str]:
    """The tables of the installed revisions the database lacks (dropped by hand, a partial
    restore): every command that reads one would fail, so `check` must not say ok. A view
    in a table's place is no table (writes to it fail: "cannot modify ... it is a view")."""
    from sqlalchemy import inspect

    tables = set(inspect(conn).get_table_names())  # tables only, views excluded; one read
    return [t.name for t in _expected_tables(features) if t.name not in tables]


def _schema_damage(db: Database, conn: Connection,
                   installed: tuple[set[str], set[str]] | None, *, keys: bool = False
                   ) -> tuple[str, str, list[Any]] | None:
    """What of its revisions' schema the database lacks, as (code, details key, names): the
    tables first ("table_missing"), then the columns ("column_missing"); with `keys`, also
    a primary key, UNIQUE or (PostgreSQL) foreign key missing, or a column jobcoord never
    makes that no insert of its can fill ("schema_damaged": a table made again by hand).
    None when whole, or below the newest core revision (an older one lacks the newer tables
    by design). `installed`: `_installed_features`'s answer."""
    if installed is None:
        return None
    tables = _missing_tables(db, conn, installed[0])
    if tables:
        return "table_missing", "tables", tables
    columns = _missing_columns(conn, installed[1])
    if columns:
        return "column_missing", "columns", columns
    if not keys:
        return None
    gone = [o for o in _missing_objects(db, conn, installed[1])
            if o["type"] in ("primary_key", "unique", "foreign_key")]
    if gone:
        return "schema_damaged", "objects", gone
    extra = _unexpected_columns(conn, installed[1])
    if extra:
        return "schema_damaged", "columns", extra
    unique = _unexpected_unique_indexes(db, conn, installed[1])
    return ("schema_damaged", "indexes", unique) if unique else None


def damage_in(db: Database, conn: Connection, *, keys: bool = False
              ) -> tuple[str, str, list[Any]] | None:
    """`_schema_damage` of the revisions installed, inside the caller's transaction."""
    return _schema_damage(db, conn, _installed_features(db, conn), keys=keys)


def holds_core_table(db: Database, conn: Connection) -> bool:
    """Whether any table of the core is there (a revision recorded over none of them is no
    damaged database but no jobcoord database at all)."""
    return any(db.engine.dialect.has_table(conn, t.name) for t in _expected_tables(set()))


def schema_damage(db: Database, where: str, *, keys: bool = False) -> DatabaseCorrupt | None:
    """The error (exit 7) of a database lacking tables or columns of its revisions (and,
    with `keys`, the rest `_schema_damage` looks for), as `check` names them; None when
    none is found. One read."""
    found = db.read(lambda conn: damage_in(db, conn, keys=keys), "looking at the schema")
    return None if found is None else damage_error(found, where)


def damage_error(found: tuple[str, str, list[Any]], where: str) -> DatabaseCorrupt:
    """The error of `_schema_damage`'s finding."""
    code, key, names = found
    shown = ", ".join(n if isinstance(n, str) else f"{n['table']}.{n['name']}" for n in names)
    if code == "schema_damaged":
        what = (f"lacks its key(s) {shown}" if key == "objects" else
                f"holds unique index(es) jobcoord never makes, which refuse its own "
                f"writes: {shown}" if key == "indexes" else
                f"holds column(s) jobcoord never makes that must not be null: {shown}")
        cause = "a table made again outside jobcoord"
    else:
        what = f"lacks its {'table' if key == 'tables' else 'column'}(s) {shown}"
        cause = "dropped outside jobcoord or a partial restore"
    return DatabaseCorrupt(
        code, f"the database {what} ({where}): {cause}; nothing was changed. `jobcoord "
        "check` names it; restore from a backup", **{key: names})


def refuse_damaged_schema(db: Database, where: str, *, keys: bool = False) -> None:
    """Before copying a whole database (backup, transfer): a copy without a table or column
    of its revision (with `keys`, a key or foreign key) is no backup (restore refuses it,
    or restores the damage) and no transfer."""
    damage = schema_damage(db, where, keys=keys)
    if damage is not None:
        raise damage


def _missing_columns(conn: Connection, newest: set[str]) -> list[str]:
    """The columns (`table.column`) of the newest revisions the database lacks (dropped by
    hand): check's own statements read them ("no such column" was exit 1), and so do the
    commands. Features below their newest revision have their own revision's columns."""
    from sqlalchemy import inspect

    found = inspect(conn)
    return [f"{t.name}.{c.name}" for t in _expected_tables(newest)
            for have in [{col["name"] for col in found.get_columns(t.name)}]
            for c in t.columns if c.name not in have]


def _unexpected_columns(conn: Connection, newest: set[str]) -> list[str]:
    """The columns (`table.column`) jobcoord never makes that no insert of its can fill (NOT
    NULL, no default), in a table made again by hand: every insert into it fails ("NOT NULL
    constraint failed"). A column of one's own that may be null is left alone."""
    from sqlalchemy import inspect

    found = inspect(conn)
    return [f"{t.name}.{col['name']}" for t in _expected_tables(newest)
            for col in found.get_columns(t.name)
            if col["name"] not in t.columns and not col["nullable"]
            and col.get("default") is None and col.get("autoincrement") is not True]


def _unexpected_triggers(db: Database, conn: Connection) -> list[dict[str, str]]:
    """The triggers on jobcoord's tables it never makes: each changes its rows behind its
    rules (a backup carrying one rewrote every job submitted after its restore), so a
    database holding one is not whole. A table of one's own beside them is left alone."""
    from .schema import COUNTING_TRIGGERS, metadata

    # alembic_version too: a trigger there ran at the next `migrate` (one that deleted
    # every job passed check, backup and restore).
    return [{"table": table, "name": name} for table, name in db.triggers(conn)
            if (table in metadata.tables or table == "alembic_version")
            and name not in COUNTING_TRIGGERS]


def _changed_triggers(db: Database, conn: Connection) -> list[dict[str, str]]:
    """The counting triggers made again by hand under their own names doing other work
    (one that also rewrote every new job's payload passed as jobcoord's own). Compared,
    whitespace aside, with the statements of the revision that made them: on SQLite the
    trigger's own text, on PostgreSQL the function it runs and that function's body (its
    events and WHEN as PostgreSQL prints them back are not compared)."""
    made = db.trigger_texts(conn)
    expected = _revision_trigger_texts().get(db.dialect, {})
    return [{"table": "jobs", "name": name} for name, text in sorted(made.items())
            if name in expected and " ".join(text.split()) != expected[name]]


@functools.cache
def _revision_trigger_texts() -> dict[str, dict[str, str]]:
    """The counting triggers as revision c0004 made them, by dialect and name, whitespace
    collapsed, in the form each store's `trigger_texts` answers: SQLite's statement; on
    PostgreSQL the function's name, a new line, its body. Read from the revision itself,
    never a copy that could drift."""
    import importlib.util

    from .migrate import script_location

    path = script_location() / "versions" / "c0004_counts.py"
    spec = importlib.util.spec_from_file_location("jobcoord_revision_c0004", path)
    assert spec is not None and spec.loader is not None
    revision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(revision)
    bodies = {f.split()[2].split("(")[0]: f.split("$$")[1] for f in revision.PG_FUNCTIONS}
    postgresql = {}
    for statement in revision.PG_TRIGGERS:
        function = statement.split("EXECUTE FUNCTION ")[1].split("(")[0]
        postgresql[statement.split()[2]] = " ".join(f"{function}\n{bodies[function]}".split())
    return {"sqlite": {statement.split()[2]: " ".join(statement.split())
                       for statement in revision.SQLITE_TRIGGERS},
            "postgresql": postgresql}


def _missing_objects(db: Database, conn: Connection, newest: set[str]
                     ) -> list[dict[str, str]]:
    """The indexes, constraints and triggers of the installed revisions the database lacks
    (dropped by hand): an index gone slows claims to a scan, a UNIQUE gone lets two jobs
    share an idempotency key, a counting trigger gone lets job_counts drift from the jobs
    with every change after it. `migrate` does not put them back; a restore from a backup,
    or the statement of the revision that made it, does."""
    from sqlalchemy import ForeignKeyConstraint, PrimaryKeyConstraint, UniqueConstraint

    from .schema import COUNTING_TRIGGERS, add_partial_indexes

    add_partial_indexes()  # attached on demand: without, the partial ones went unlooked for
    # Only the features at their newest revision (`newest`): one below it has the indexes
    # of its own, older revision.
    tables = _expected_tables(newest)
    expected: list[tuple[str, str, str]] = []
    for table in tables:
        expected += sorted((table.name, "index", str(i.name)) for i in table.indexes)
        if db.names_constraint_indexes:
            # A foreign key gone (PostgreSQL) lets a job be deleted under its events: the
            # transfer back into SQLite, which keeps them, failed half way.
            kinds = {PrimaryKeyConstraint: "primary_key", UniqueConstraint: "unique",
                     ForeignKeyConstraint: "foreign_key"}
            expected += sorted((table.name, kinds[type(k)], str(k.name))
                               for k in table.constraints if type(k) in kinds)
    expected += [("jobs", "trigger", name) for name in COUNTING_TRIGGERS]
    present = db.schema_object_names(conn)
    missing = [{"table": t, "type": kind, "name": name} for t, kind, name in expected
               if name not in present]
    if not db.names_constraint_indexes:
        missing += _missing_keys_by_columns(db, conn, tables)
    named = {m["name"] for m in missing}
    missing += [m for m in _foreign_keys_changed(db, conn, tables) if m["name"] not in named]
    return missing


def _foreign_keys_changed(db: Database, conn: Connection, tables: list[Table]
                          ) -> list[dict[str, str]]:
    """The foreign keys no key of the table's is now, judged by what each is (its columns,
    the table it refers to, its ON DELETE), not its name: a table made again without one
    (SQLite names none) lets a job be deleted under its events, which SQLite's
    foreign_key_check cannot see and a transfer into PostgreSQL refused half way; one
    made again without ON DELETE CASCADE failed `prune`, exit 1."""
    from sqlalchemy import ForeignKeyConstraint

    missing = []
    for table in tables:
        keys = db.foreign_key_columns(conn, table.name)
        missing += [{"table": table.name, "type": "foreign_key", "name": str(k.name)}
                    for k in table.constraints if isinstance(k, ForeignKeyConstraint)
                    and (frozenset(c.name for c in k.columns), k.referred_table.name,
                         (k.ondelete or "NO ACTION").upper()) not in keys]
    return missing


def _unexpected_unique_indexes(db: Database, conn: Connection, newest: set[str]
                               ) -> list[dict[str, str]]:
    """UNIQUE indexes on jobcoord's tables that it never makes (added by hand, or as a
    UNIQUE of a table made again): each refuses jobcoord's own writes its rules allow (a
    job's second event, a second job of a kind). One over the columns of a key of the
    table's (and more) refuses nothing, nor does an index that is not unique: left alone."""
    from sqlalchemy import PrimaryKeyConstraint, UniqueConstraint

    from .schema import add_partial_indexes

    add_partial_indexes()
    found = []
    for table in _expected_tables(newest):
        ours = {str(i.name) for i in table.indexes} | {str(k.name) for k in table.constraints}
        keys = [frozenset(c.name for c in k.columns) for k in table.constraints
                if isinstance(k, PrimaryKeyConstraint | UniqueConstraint) and k.columns]
        for name, columns in sorted(db.unique_indexes(conn, table.name).items()):
            if name in ours or (columns is not None and any(k <= columns for k in keys)):
                continue
            found.append({"table": table.name, "name": name})
    return found


def _changed_checks(db: Database, conn: Connection, newest: set[str]
                    ) -> list[dict[str, str]]:
    """The CHECK constraints of jobcoord's tables not as its revisions made them (a table
    made again by hand): one gone lets a row break a rule every reader relies on; one
    changed or added refuses writes the rules allow, as `row_breaks_check` (exit 7) that
    named no row. By name, and on SQLite, which keeps their text, by text too."""
    from sqlalchemy import CheckConstraint

    found = []
    for table in _expected_tables(newest):
        made = db.check_constraints(conn, table.name)
        ours = {str(k.name): " ".join(str(k.sqltext).split()) for k in table.constraints
                if isinstance(k, CheckConstraint)}
        for name, text in sorted(ours.items()):
            if name not in made:
                found.append({"table": table.name, "name": name, "change": "missing"})
            elif made[name] is not None and made[name] != text:
                found.append({"table": table.name, "name": name, "change": "changed"})
        found += [{"table": table.name, "name": name, "change": "unexpected"}
                  for name in sorted(set(made) - set(ours))]
    return found


def _missing_keys_by_columns(db: Database, conn: Connection, tables: list[Table]
                             ) -> list[dict[str, str]]:
    """SQLite names no key: a table made again without its primary key, a UNIQUE or a
    foreign key (same columns, `CREATE TABLE t2 AS SELECT ...`) is found by the keys'
    columns. Every upsert on
    it failed ("ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint")."""
    from sqlalchemy import PrimaryKeyConstraint, UniqueConstraint

    missing = []
    for table in tables:
        pk, uniques = db.key_columns(conn, table.name)
        for key in table.constraints:
            columns = frozenset(c.name for c in key.columns)
            if isinstance(key, PrimaryKeyConstraint) and columns and columns != pk:
                missing.append({"table": table.name, "type": "primary_key",
                                "name": str(key.name)})
            elif isinstance(key, UniqueConstraint) and columns not in uniques | {pk}:
                missing.append({"table": table.name, "type": "unique", "name": str(key.name)})
    return missing


def _invariants(db: Database, conn: Connection) -> list[dict[str, Any]]:
    installed = _installed_features(db, conn)
    damage = _schema_damage(db, conn, installed)
    if damage is not None:
        # The invariants' statements may read what is missing: this finding comes alone.
        code, key, missing = damage
        return [{"invariant": code, "job_ids": [], key: missing}]
    violations = []
    objects = [] if installed is None else _missing_objects(db, conn, installed[1])
    if objects:
        violations.append({"invariant": "schema_object_missing", "job_ids": [],
                           "objects": objects[:20]})
    extra = [] if installed is None else _unexpected_columns(conn, installed[1])
    if extra:
        violations.append({"invariant": "column_unexpected", "job_ids": [],
                           "columns": extra[:20]})
    unique = [] if installed is None else _unexpected_unique_indexes(db, conn, installed[1])
    if unique:
        violations.append({"invariant": "index_unexpected", "job_ids": [],
                           "indexes": unique[:20]})
    checks = [] if installed is None else _changed_checks(db, conn, installed[1])
    if checks:
        violations.append({"invariant": "check_changed", "job_ids": [],
                           "checks": checks[:20]})
    foreign = _unexpected_triggers(db, conn)
    if foreign:
        violations.append({"invariant": "trigger_unexpected", "job_ids": [],
                           "triggers": foreign[:20]})
    changed = _changed_triggers(db, conn)
    if changed:
        violations.append({"invariant": "trigger_changed", "job_ids": [],
                           "triggers": changed})
    for name, stmt in rs.INVARIANTS:
        ids = [r[0] for r in db.run(conn, stmt).all()]
        if ids:
            violations.append({"invariant": name, "job_ids": ids})
    damaged = _unreadable_jobs(db, conn)
    if damaged:
        violations.append({"invariant": "job_unreadable",
                           "job_ids": sorted({d["job_id"] for d in damaged})[:20],
                           "columns": damaged[:20]})
    # The findings that name no job: each lists (at most 20 of) what it found under its key.
    for name, key, find in (("value_of_wrong_type", "columns", _wrong_types),
                            ("time_out_of_range", "columns", _times_out_of_range),
                            ("row_breaks_check", "checks", _rows_breaking_checks),
                            ("worker_unreadable", "workers", _unreadable_workers),
                            ("schedule_unreadable", "schedules", _unreadable_schedules),
                            ("artifact_unreadable", "artifacts", _unreadable_artifacts),
                            ("job_counts_differ_from_jobs", "keys", _counts_differ)):
        found = find(db, conn)
        if found:
            violations.append({"invariant": name, "job_ids": [], key: found[:20]})
    return violations


def _unreadable_jobs(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """The job columns whose stored JSON does not parse (a row changed by hand): show,
    claim and explain of such a job fail with exit 7 until it is repaired or removed."""
    from sqlalchemy import inspect

    from .errors import DatabaseCorrupt
    from .validate import CHECKPOINT_DATA, EVENT_DETAIL, JOB_JSON_COLUMNS, stored_json

    present = {c["name"] for c in inspect(conn).get_columns("jobs")}
    columns = tuple(c for c in JOB_JSON_COLUMNS if c in present)  # needs_json: c0006 on
    # (job, column) pairs in the order found, each once (a job has many events).
    bad: dict[tuple[int, str], None] = {}
    def rows() -> Iterator[tuple[int, str, str | None]]:  # streamed, never all in memory
        for job_id, *texts in db.run(conn, rs.job_json_rows(columns)):
            yield from ((job_id, column, text) for column, text in zip(columns, texts,
                                                                       strict=True))
        for stmt, column in ((rs.CHECKPOINT_JSON_ROWS, CHECKPOINT_DATA),
                             (rs.EVENT_DETAIL_ROWS, EVENT_DETAIL)):
            yield from ((job_id, column, text) for job_id, text in db.run(conn, stmt))

    for job_id, column, text in rows():
        try:
            stored_json(text, job_id, column)  # the same judgement every read makes
        except DatabaseCorrupt:
            bad[(job_id, column)] = None
    return sorted(({"job_id": j, "column": c} for j, c in bad), key=lambda d: d["job_id"])


def _wrong_types(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """SQLite only: columns holding a value of another type than they were declared with
    (text written by hand into a time or a count; SQLite keeps it where PostgreSQL refuses
    it). Commands reading such a row fail until it is repaired; this names where it is."""
    if db.dialect != "sqlite":
        return []
    from sqlalchemy import Boolean, Float, Integer, String, func

    def bad(table: Table, col: Column[Any]) -> ColumnElement[bool] | None:
        if isinstance(col.type, Boolean | Integer):
            allowed: tuple[str, ...] = ("integer", "null")
        elif isinstance(col.type, Float):
            allowed = ("integer", "real", "null")
        elif isinstance(col.type, String):
            allowed = ("text", "null")
        else:
            return None
        return func.typeof(col).not_in(allowed)

    return [{"table": t.name, "column": c.name, "rows": n}
            for t, c, n in _per_column(db, conn, bad)]


def _per_column(db: Database, conn: Connection,
                bad: Callable[[Table, Column[Any]], ColumnElement[bool] | None]
                ) -> list[tuple[Table, Column[Any], int]]:
    """For each table of the model the database has, one pass counting per column the rows
    where `bad(table, column)` holds (columns it gives None for are not counted): the
    (table, column, rows) found."""
    from sqlalchemy import case, func, select
    from sqlalchemy import inspect as inspect_db

    from .schema import metadata

    present = set(inspect_db(conn).get_table_names())
    found = []
    for table in metadata.sorted_tables:
        if table.name not in present:
            continue  # an optional feature not installed
        have = {c["name"] for c in inspect_db(conn).get_columns(table.name)}
        checked = [(col, cond) for col in table.columns if col.name in have
                   for cond in (bad(table, col),) if cond is not None]
        if not checked:
            continue
        counts = conn.execute(select(*(
            func.coalesce(func.sum(case((cond, 1), else_=0)), 0) for _, cond in checked))
            .select_from(table)).one()
        found += [(table, col, int(n)) for (col, _), n in zip(checked, counts, strict=True)
                  if n]
    return found


def _times_out_of_range(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """Time columns holding a whole number past the calendar (year 10000 on, or before year
    1): written outside jobcoord (every time it writes is near now); no command can render
    such a row. On SQLite only integers are judged here (text is value_of_wrong_type)."""
    from sqlalchemy import Integer, and_, func, or_

    from .stored import MAX_TIME_US, MIN_TIME_US, is_time

    def bad(table: Table, col: Column[Any]) -> ColumnElement[bool] | None:
        if not (isinstance(col.type, Integer) and is_time(col.name)):
            return None
        outside = or_(col < MIN_TIME_US, col > MAX_TIME_US)
        return and_(func.typeof(col) == "integer", outside) if db.is_sqlite else outside

    return [{"table": t.name, "column": c.name, "rows": n}
            for t, c, n in _per_column(db, conn, bad)]


def _rows_breaking_checks(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """Rows breaking one of their table's CHECK constraints (SQLite keeps a row written with
    its checks ignored; PostgreSQL never does): the next update of such a job fails, so a
    claim sets a waiting one aside as dead; this names every one, by constraint."""
    from sqlalchemy import CheckConstraint, case, func, literal_column, select
    from sqlalchemy import inspect as inspect_db

    from .schema import metadata

    present = set(inspect_db(conn).get_table_names())
    found = []
    for table in metadata.sorted_tables:
        checks = sorted((c for c in table.constraints if isinstance(c, CheckConstraint)),
                        key=lambda c: str(c.name))
        if table.name not in present or not checks:
            continue
        have = {c["name"] for c in inspect_db(conn).get_columns(table.name)}
        # A check naming a column this revision lacks is not installed yet.
        checks = [c for c in checks if all(n in have for n in _names_in(str(c.sqltext), table))]
        if not checks:
            continue
        counts = conn.execute(select(*(
            func.coalesce(func.sum(case((literal_column(f"NOT ({c.sqltext})"), 1),
                                        else_=0)), 0) for c in checks))
            .select_from(table)).one()
        found += [{"table": table.name, "check": str(c.name), "rows": int(n)}
                  for c, n in zip(checks, counts, strict=True) if n]
    return found


def _names_in(sqltext: str, table: Table) -> list[str]:
    """The table's column names a CHECK's text mentions."""
    import re

    words = set(re.findall(r"[a-z_]+", sqltext))
    return [c.name for c in table.columns if c.name in words]


def _unreadable_workers(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """Workers whose stored JSON does not parse (a row changed by hand): each claims nothing
    (refused as stale) until its next heartbeat rewrites the row."""
    from .core.workers import unreadable_column

    bad = []
    for worker_id, *texts in db.run(conn, rs.WORKER_JSON_ROWS):
        column = unreadable_column(texts)
        if column is not None:
            bad.append({"worker_id": worker_id, "column": column})
    return bad


def _unreadable_artifacts(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """Artifact rows whose digest is no digest (changed by hand: its letters' case, a
    character gone): the row names no object, so `get` and `verify` cannot find its
    bytes, and `gc` could not tell the object was referenced and deleted it."""
    from sqlalchemy import inspect, select

    from .artifacts.names import parse_digest
    from .errors import InvalidInput
    from .schema import artifacts

    if not db.engine.dialect.has_table(conn, "artifacts"):
        return []  # the feature is not installed
    if "digest" not in {c["name"] for c in inspect(conn).get_columns("artifacts")}:
        return []  # its first revision (a backup of it restores; `migrate` follows)
    bad = []
    for job_id, name, digest in conn.execute(
            select(artifacts.c.job_id, artifacts.c.name, artifacts.c.digest)
            .order_by(artifacts.c.artifact_id)):
        try:
            parse_digest(digest)
        except InvalidInput:
            bad.append({"job_id": job_id, "name": name, "digest": ascii(digest)[:100]})
    return bad


def _unreadable_schedules(db: Database, conn: Connection) -> list[str]:
    """Schedules a tick passes over as written outside jobcoord (a payload that is not a
    JSON object, a max_attempts under 1, a cron or zone that no longer parses, slots or a
    window past the calendar): each fire would copy the damage into a new job, or fail.
    Judged by the tick's own rule (`core.schedules.unreadable`), at the time now."""
    from .clock import now_us
    from .core.schedules import unreadable

    if not db.engine.dialect.has_table(conn, "schedules"):
        return []  # a database before revision c0005
    now = now_us()
    return [row[1] for row in db.run(conn, rs.SCHEDULE_ROWS).all()
            if unreadable(row, now) is not None]


def _counts_differ(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """The keys where job_counts (kept by triggers) and a count of the jobs disagree: the
    dashboard and /metrics show job_counts. A database not yet at revision c0004 has none to
    compare (`check` runs before `migrate` too)."""
    if not db.engine.dialect.has_table(conn, "job_counts"):
        return []
    kept: dict[tuple[Any, ...], int] = {}
    for *key, n in db.run(conn, rs.JOB_COUNTS).all():
        kept[tuple(key)] = int(n)
    counted = {tuple(key): int(n) for *key, n in db.run(conn, rs.JOBS_BY_COUNT_KEY).all()}
    return [{"tenant": k[0], "status": k[1], "kind": k[2], "attempts": k[3],
             "kept": kept.get(k, 0), "counted": counted.get(k, 0)}
            for k in sorted(set(kept) | set(counted), key=repr)
            if kept.get(k, 0) != counted.get(k, 0)]


def check(db: Database, *, full: bool = False) -> dict[str, Any]:
    """Storage check plus application invariants. `ok` is False on any finding."""
    out: dict[str, Any] = {}
    pragma = "integrity_check" if full else "quick_check"
    found = db.read(lambda conn: db.integrity_check(conn, full=full), pragma)
    if found is not None:
        rows, fks = found
        out[pragma] = rows[:20]
        storage_ok = rows == ["ok"]
    else:  # PostgreSQL checks its own pages; its keys hold unless triggers were off
        # Its statements name the keys' columns: after a table or column found missing
        # (the invariants report it alone), not run.
        fks = db.read(lambda conn: [] if damage_in(db, conn) is not None
                      else db.foreign_key_violations(conn), "checking foreign keys")
        storage_ok = True
    out["foreign_key_violations"] = fks[:20]
    storage_ok = storage_ok and not fks
    try:
        out["violations"] = db.read(lambda conn: _invariants(db, conn), "checking invariants")
    except (TypeError, ValueError, ArithmeticError) as e:
        if storage_ok:
            raise  # a bug of the checks themselves, not the database's
        # Damaged pages hold values no row of jobcoord's has (a NULL where none can be):
        # the storage check said so already; the invariants cannot be read past them.
        out["violations"] = [{"invariant": "unreadable_past_damage", "job_ids": [],
                              "error": f"{type(e).__name__}: {e}"[:500]}]
    out["ok"] = storage_ok and not out["violations"]
    return out


def backup(db: Database, dest: str, *, force: bool = False, store: str | None = None
           ) -> dict[str, Any]:
    """Copy the live database to `dest` with the online backup API, then check the copy.
    `store`: the artifact store's directory, which the copy never goes into."""
    if not db.is_sqlite:
        raise InvalidInput(
            "unsupported",
            "backup copies SQLite files; back up PostgreSQL with its own tools (pg_dump, "
            "pg_basebackup or continuous archiving)",
        )
    source = db.target.sqlite_path
    assert source is not None
    dest = writable_destination(dest, force=force, database=source, what="the backup",
                                store=store)
    utf8_path(dest, "the backup destination")
    standalone_destination(dest)
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise no_directory(parent)
    refuse_damaged_schema(db, "backing up")
    # The copy should stand alone: one file, no -wal beside it. It is checked before it is
    # put in place (a damaged copy raises here and DEST keeps its old bytes).
    # Renamed over DEST only with --force: without, linked, so a DEST another backup made
    # meanwhile is refused rather than replaced.
    copy_check = _copy_into_place(sqlite_uri(source, "ro"), dest, journal_mode="delete",
                                  replace=force, what="backing up", vet=_restore_takes)
    return {"source": source, "backup": dest, "size_bytes": os.path.getsize(dest),
            "quick_check": copy_check, "ok": True}


def _restore_takes(copy_path: str, dest: str) -> None:
    """Refuse a backup's copy that `restore` would refuse: its pages are whole (quick_check),
    but `check`'s application invariants find fault with it (a trigger of someone's on
    `jobs`, a table made again without its key, job_counts drifted from the jobs), or rows
    point at a job that is gone (foreign_key_check, as `check` and `restore` run it). Such a
    file is no backup, and with --force it would have replaced the last good one. Read from
    the copy, one snapshot: what is put in place is what was judged."""
    copy = Database.open(resolve_target(db=copy_path), frozen=True)
    try:
        found, orphans = copy.read(lambda conn: (_invariants(copy, conn),
                                                 copy.foreign_key_violations(conn)),
                                   "checking the copy")
    finally:
        copy.close()
    if found or orphans:
        kept = _left_as_it_was(dest)
        names = ", ".join(dict.fromkeys(
            [v["invariant"] for v in found] + (["foreign_key_violations"] if orphans else [])))
        raise DatabaseCorrupt(
            "database_corrupt", f"backing up: the database holds what `jobcoord check` finds "
            f"({names}) and `restore` would refuse a copy of it; {kept}. Run `jobcoord check` "
            "and repair the database, or restore it from the last good backup",
            violations=found[:20], foreign_key_violations=orphans[:20])


def _left_as_it_was(dest: str) -> str:
    """What a refused copy says of its destination, which it never touched."""
    return (f"{dest} was left as it was" if os.path.lexists(dest)
            else f"nothing was written at {dest}")


def standalone_destination(dest: str) -> None:
    """Refuse a backup's DEST with a -wal, -shm or -journal beside it: the log of the
    database that was at DEST (its process killed, or still running), which the next open
    would replay onto the backup's pages, a silent mix of the two."""
    log = _beside(dest)
    if log is not None:
        raise InvalidInput(
            "destination_not_standalone",
            f"{log} lies beside {dest}: the file is a database whose log is still there (a "
            "process using it was killed, or still runs), and replacing the file alone would "
            f"mix that log into the backup. Stop whatever uses {dest} and move it away with "
            "the files beside it, or back up to a new path", dest=dest)


def writable_destination(dest: str | os.PathLike[str], *, force: bool, database: str | None,
                         what: str, store: str | None = None) -> str:
    """The absolute path a command may put a file at (`backup`, `artifact get -o`): never the
    database or a file SQLite keeps beside it, never inside the artifact store (`store`),
    never a directory or anything but a regular file (a device, a FIFO: --force would have
    put a regular file in place of /dev/null), and an existing file only with `force`.
    Bad: InvalidInput (exit 2), nothing written."""
    named_as = os.fspath(dest) if isinstance(dest, os.PathLike) else dest
    if not isinstance(named_as, str):  # None, a number, a file object, bytes: a TypeError
        raise InvalidInput("invalid_input", f"{what} destination must be a file name as text, "
                           f"not {v.shown(named_as, 60)}", field="dest")
    dest = os.path.abspath(named_as)
    try:
        named = b"\0" not in os.fsencode(dest)
    except UnicodeEncodeError:  # a lone surrogate: no file name can hold it
        named = False
    if not named:  # (else ValueError and UnicodeEncodeError escaped the API)
        raise InvalidInput("invalid_input", f"{what} destination {dest!a} is not a file "
                           "name (a NUL or a lone surrogate in it)", dest=ascii(dest))
    name_has_room(dest, WRITE_ROOM, f"{what} destination")
    if database is not None and _is_part_of(dest, database):
        raise InvalidInput("invalid_input", f"{what} destination {dest} is the database "
                           "itself or one of the files SQLite keeps beside it (-wal, -shm, "
                           "-journal); writing there would destroy committed work", dest=dest)
    refuse_log_name(dest, f"{what} destination")
    if store is not None and _within(dest, store):
        raise InvalidInput("invalid_input", f"{what} destination {dest} is inside the "
                           f"artifact store {store}, whose objects are never replaced",
                           dest=dest)
    if os.path.isdir(dest):
        raise InvalidInput("invalid_input", f"{dest} is a directory; name the file", dest=dest)
    if os.path.lexists(dest):
        if not os.path.isfile(dest):
            raise InvalidInput("invalid_input", f"{dest} exists and is not a regular file (a "
                               "device, a pipe, a socket or a broken link); name a file",
                               dest=dest)
        if not force:
            raise InvalidInput("destination_exists", f"{dest} already exists; pass --force "
                               "to replace it", dest=dest)
    return dest


def sqlite_uri(path: str, mode: str) -> str:
    """A `file:` URI naming exactly `path`: unquoted, `#` would end the path, `?` start the
    options and `%` begin an escape, so SQLite would open (or create) another file."""
    return f"file:{quote(os.fsencode(path))}?mode={mode}"  # bytes: any name the system has


def _within(path: str, directory: str) -> bool:
    """Whether `path` lies inside `directory`, both with every link resolved."""
    inner, outer = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([inner, outer]) == outer


def _is_part_of(dest: str, source: str) -> bool:
    """Whether `dest` is the database file or one of its -wal, -shm, -journal files, by name
    or by identity (a link to one of them). The files beside it are named after the file
    SQLite opens: the database reached through a link keeps its -wal beside its target."""
    parts = [base + suffix for base in dict.fromkeys((source, os.path.realpath(source)))
             for suffix in ("", *LOG_SUFFIXES)]
    if dest in parts or os.path.realpath(dest) in {os.path.realpath(p) for p in parts}:
        return True
    for part in parts:  # a hard link to one of them
        with contextlib.suppress(OSError):
            if os.path.samefile(part, dest):
                return True
    return False


def _check_copy(path: str) -> list[str]:
    """quick_check of a copy on its own read-only connection. A copy that cannot be opened or
    read is a storage problem (StorageUnavailable, exit 6), not a damaged copy; a copy that is
    not a database at all is reported as a finding, like any damage."""
    try:
        # immutable: the copy is a closed file no other connection knows about, so no locks
        # are needed, and SQLite leaves no -wal or -shm beside it.
        conn = sqlite3.connect(sqlite_uri(path, "ro&immutable=1"), uri=True)
        try:
            return file_quick_check(conn)
        finally:
            conn.close()
    except sqlite3.Error as e:
        err = classify(e, "checking the copy")
        if isinstance(err, DatabaseCorrupt):
            return [err.message]
        raise err from e


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _beside(path: str) -> str | None:
    """The first of the files SQLite keeps beside a database (-wal, -shm, -journal) that
    exists beside `path`, or None: a file with one of them is not a database by itself."""
    return next((path + s for s in LOG_SUFFIXES if os.path.lexists(path + s)), None)


def refuse_existing(dest: str) -> None:
    """A restore's target: nothing there, no database and no file SQLite keeps beside one,
    not named as another database's log, and room in its name for the files put beside
    it."""
    name_has_room(dest, WRITE_ROOM, "the restore target")
    refuse_log_name(dest, "the restore target")
    for path in (dest, *(dest + suffix for suffix in LOG_SUFFIXES)):
        if os.path.lexists(path):
            raise InvalidInput(
                "destination_exists",
                f"{path} exists; restore never writes over a database. Stop every worker and "
                f"submitter using {dest}, move it away with any -wal and -shm beside it, then "
                "restore; or restore to a new path and point them at that")


def restore(backup_path: str, target: Target) -> dict[str, Any]:
    """Make a new database at `target` from a backup file, once the backup is proven whole.

    Restore never writes over anything: a database that may be open elsewhere must not be
    replaced under its connections, and a -wal left beside a path belongs to the file that
    was there. So the target and any -wal, -shm or -journal beside it must not exist. The
    backup must be one self-contained file (what `backup` writes; copies of a live database's
    files with a -wal beside them may be torn), pass integrity_check and the application
    invariants, and be at a revision this jobcoord knows. It is copied with the backup API
    into a temporary file next to the target, switched to WAL like every migrated database,
    quick-checked, synced, linked into place (which fails rather than replace a file that
    appeared meanwhile), then opened."""
    from .migrate import verify_schema

    if target.sqlite_path is None:
        raise InvalidInput("unsupported", "restore makes SQLite files; restore PostgreSQL with "
                           "its own tools (pg_restore, or the server's point-in-time recovery)")
    dest = target.sqlite_path
    utf8_path(backup_path, "the backup")
    source = os.path.abspath(backup_path)
    if source == dest:
        raise InvalidInput("invalid_input", "the backup and the restore target are one file")
    if os.path.isdir(source):
        raise InvalidInput("invalid_input", f"{source} is a directory; name the backup file")
    if not os.path.isfile(source):
        there = os.path.lexists(source)
        raise InvalidInput("invalid_input", f"{source} is not a regular file (a pipe, a "
                           "device, a socket or a broken link); name the backup file" if there
                           else f"no backup file at {source}")
    log = _beside(source)
    if log is not None:
        raise InvalidInput(
            "backup_not_standalone",
            f"{log} lies beside the backup, so the file alone is not the whole database: it "
            "looks like a copy of a live database's files, which may be torn. Restore from a "
            "file written by `jobcoord backup`")
    refuse_existing(dest)
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise no_directory(parent)

    # 1. The backup: whole, a jobcoord database, every invariant holding.
    src_db = Database.open(resolve_target(db=source), frozen=True)
    try:
        try:
            features = verify_schema(src_db)
        except SchemaMismatch as e:
            if e.code == "not_migrated":
                # Advice to migrate would be advice to write into the backup: say what it is.
                raise SchemaMismatch(
                    "not_migrated", f"{source} is not a jobcoord backup (it holds no jobcoord "
                    "schema); nothing was restored. Restore from a file written by "
                    "`jobcoord backup`") from e
            if e.code != "schema_outdated":  # an older backup restores; `migrate` follows
                raise
            features = set()
        found = check(src_db, full=True)
    finally:
        src_db.close()
    if not found["ok"]:
        raise DatabaseCorrupt(
            "database_corrupt", f"the backup {source} failed its checks; nothing was restored",
            integrity_check=found.get("integrity_check"), violations=found["violations"])

    # 2. The copy: WAL like every migrated database, quick-checked, then linked into place.
    # It is the backup page for page, which passed integrity_check and every invariant: the
    # quick_check (as `backup` runs on its copies) catches a write that went wrong on the
    # way, without checking the same rows twice.
    copy_check = _copy_into_place(sqlite_uri(source, "ro&immutable=1"), dest,
                                  journal_mode="wal", replace=False, what="restoring")
    db = Database.open(target)  # as the coordinator opens it
    try:
        counts = dict(db.read(lambda conn: db.run(conn, rs.JOBS_BY_STATUS).all(),
                              "counting jobs"))
    finally:
        db.close()
    return {"restored": dest, "from": source, "size_bytes": os.path.getsize(dest),
            "features": sorted(features), "jobs": counts,
            "integrity_check": found["integrity_check"], "quick_check": copy_check, "ok": True}


def _copy_into_place(source_uri: str, dest: str, *, journal_mode: str, replace: bool,
                     what: str, vet: Callable[[str, str], None] | None = None) -> list[str]:
    """Copy a database with the online backup API, in one step, into a temporary file beside
    `dest`; set its journal mode, quick_check the copy, sync it and put it in place: renamed
    over `dest` when `replace`, otherwise linked, which fails rather than replace a file that
    appeared meanwhile. `vet(copy, dest)`, when given, judges the checked copy further and
    raises to keep it out of place. Returns the quick_check rows (["ok"]).

    Nothing is put in place before the copy passed its check: a damaged copy raises
    DatabaseCorrupt and `dest` is exactly what it was. A failure leaves no temporary file
    behind."""
    parent = os.path.dirname(dest)
    _sweep_killed_copies(dest)
    tmp = f"{dest}.tmp-{os.getpid()}"
    create_private_file(tmp)
    # Held while this copy lives: the next copy to `dest` removes one nobody holds (a
    # process killed outright left it, as large as the database). flock, never SQLite's
    # own fcntl locks: this descriptor is closed only after SQLite's are.
    held = [fd] if (fd := leftovers.hold(tmp)) is not None else []
    try:
        src = sqlite3.connect(source_uri, uri=True, timeout=30)
        try:
            # A plain path, not a URI: sqlite3.connect without uri=True never parses it.
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)  # pages=-1: the whole database in one step
                mode = set_journal_mode(dst, journal_mode)
            finally:
                dst.close()  # the last connection: a -wal is checkpointed and removed
        finally:
            src.close()
        if mode != journal_mode:
            raise StorageUnavailable("wal_unsupported", f"the filesystem under {parent} "
                                     f"refused journal_mode={journal_mode} (it stayed {mode})")
        found = _check_copy(tmp)
        if found != ["ok"]:
            kept = _left_as_it_was(dest)
            raise DatabaseCorrupt(
                "database_corrupt", f"{what}: the copy failed quick_check, so the source "
                f"database is damaged; {kept}: {found[:3]}", quick_check=found[:20])
        if vet is not None:
            vet(tmp, dest)
        _sync(tmp)
        faults.point("copy.before_place")
        if replace:
            os.replace(tmp, dest)
        else:
            os.link(tmp, dest)
            _unlink(tmp)
        _sync(parent)
    except FileExistsError:
        _unlink_with_sidecars(tmp)
        raise InvalidInput("destination_exists", f"{dest} appeared meanwhile; nothing was "
                           "replaced") from None
    except sqlite3.Error as e:
        _unlink_with_sidecars(tmp)
        raise classify(e, what) from e
    except OSError as e:
        _unlink_with_sidecars(tmp)
        raise StorageUnavailable("database_io_error", f"{what} failed: {e.strerror}") from e
    except BaseException:
        _unlink_with_sidecars(tmp)
        raise
    finally:
        leftovers.release(held)
    return found


def _sweep_killed_copies(dest: str) -> None:
    """Remove the temporary copies (`DEST.tmp-<pid>`, 0600) that a backup or restore to
    `dest` killed outright left beside it and no live one holds, then the journal files
    beside a copy that is gone (SQLite's, of a copy killed mid-way)."""
    parent, base = os.path.split(dest)
    name = re.escape(base) + r"\.tmp-(?P<pid>\d+)"
    leftovers.sweep(parent or ".", re.compile(name), leftovers.pid_alive)
    beside = re.compile(name + "(?:" + "|".join(re.escape(s) for s in LOG_SUFFIXES) + ")")
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent or "."):
            found = beside.fullmatch(entry.name)
            if found is None or os.path.lexists(
                    os.path.join(parent, base + ".tmp-" + found.group("pid"))):
                continue
            st = entry.stat(follow_symlinks=False)
            # SQLite makes them as its database is (0600); anything else is the user's.
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() \
                    and stat.S_IMODE(st.st_mode) == 0o600:
                _unlink(entry.path)


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_with_sidecars(path: str) -> None:
    for p in (path, *(path + suffix for suffix in LOG_SUFFIXES)):
        _unlink(p)
