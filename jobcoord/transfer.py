"""Move a SQLite coordinator to PostgreSQL, or back, without losing a row.

The source is read in one read transaction (a WAL snapshot: it never takes SQLite's write
lock, so the source stays usable, and every table is read at the same instant). The target is
written in one transaction, after locking its tables and checking that they are empty, so a
failed or refused transfer leaves it exactly as it was. Every row keeps its ids, epochs and
times. Before the target commits, and again afterwards from a fresh connection, each table's
row count and checksum are compared with the source's; the checksum is computed the same way on
both sides over a dialect-independent canonical form of each row.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Boolean, Float, Integer, Table, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from . import faults
from .clock import iso, now_us
from .errors import DatabaseCorrupt, Interrupted, InvalidInput, Refused, SchemaMismatch
from .migrate import verify_schema
from .models import CORE_TABLES, OPTIONAL_TABLES, Base
from .store import Database, Target, classify
from .store import report_statements as rs
from .store.postgresql import PostgresDatabase
from .store.sqlite import SqliteDatabase
from .store.statements import SQL

BATCH_ROWS = 1000


#: Tables kept beside the core ones that a copy must carry too: each refused claim's counter
#: (claim_refusals) and the durable latency fold (metric_folds, up to an event id, which
#: the copied events keep). job_counts is not copied: the target's triggers count the jobs
#: as they are inserted.
REPORT_TABLES = ("claim_refusals", "metric_folds")


def tables_for(features: set[str]) -> list[Table]:
    """Core tables, the report tables, then optional ones, parents before children (foreign
    keys)."""
    names = [*CORE_TABLES, *REPORT_TABLES]
    for feature in sorted(features):
        names.extend(OPTIONAL_TABLES.get(feature, ()))
    return [Base.metadata.tables[n] for n in names]


#: The integers PostgreSQL's `integer` and `bigint` columns keep: -bound <= n < bound.
_INTEGER_BOUND, _BIGINT_BOUND = 2**31, 2**63


def canonical(table: Table, row: Any) -> str:
    """One row as a line of JSON that reads the same from SQLite and PostgreSQL: booleans
    as true/false (SQLite stores 0/1), floats in exact hex, integers as integers, text as is."""
    out: list[Any] = []
    for col, value in zip(table.columns, row, strict=True):
        if value is None:
            out.append(None)
        elif isinstance(col.type, Boolean):
            out.append(bool(value))
        elif isinstance(col.type, Float):
            if type(value) not in (int, float):
                raise _unreadable(table, col.name, value, "not a number")
            out.append(float(value).hex())
        elif isinstance(col.type, Integer):
            if type(value) is not int:
                raise _unreadable(table, col.name, value, "not a whole number")
            bound = _INTEGER_BOUND if type(col.type) is Integer else _BIGINT_BOUND
            if not -bound <= value < bound:
                # Found here, before the target is written: PostgreSQL's refusal mid-copy
                # named no column, and the driver logged its aborted pipeline on stderr.
                raise DatabaseCorrupt(
                    "value_out_of_range", f"{table.name}.{col.name} holds {value}, past what "
                    f"PostgreSQL's column keeps ({-bound} to {bound - 1}; written outside "
                    "jobcoord); nothing was copied", table=table.name, column=col.name)
            out.append(value)
        else:
            if type(value) is not str:
                raise _unreadable(table, col.name, value, "not text")
            if "\x00" in value:
                raise _unreadable(table, col.name, value, "text holding NUL, which "
                                  "PostgreSQL cannot store")
            out.append(value)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _unreadable(table: Table, column: str, value: Any, what: str) -> DatabaseCorrupt:
    """A value SQLite kept that no column of the other database can hold (written outside
    jobcoord): nothing is copied; `check` names such columns."""
    return DatabaseCorrupt("value_of_wrong_type", f"{table.name}.{column} holds "
                           f"{type(value).__name__} {str(value)[:40]!r}: {what} (written "
                           "outside jobcoord); nothing was copied", table=table.name,
                           column=column)


def _ordered(db: Database, table: Table) -> Any:
    # Byte order on both sides: SQLite's BINARY and PostgreSQL's "C" collation agree; a
    # locale collation on the server would order text keys differently and change the hash.
    keys = [c.collate(db.binary_collation()) if not isinstance(c.type, Integer) else c
            for c in table.primary_key.columns]
    return select(table).order_by(*keys)


def rows_in_order(db: Database, conn: Connection, table: Table) -> Iterator[Any]:
    result = conn.execution_options(yield_per=BATCH_ROWS).execute(_ordered(db, table))
    yield from result


def digest(db: Database, conn: Connection, table: Table) -> dict[str, Any]:
    """Row count and SHA-256 over the canonical rows in primary-key order."""
    h = hashlib.sha256()
    n = 0
    for row in rows_in_order(db, conn, table):
        h.update(canonical(table, row).encode())
        h.update(b"\n")
        n += 1
    return {"rows": n, "sha256": h.hexdigest()}


def _check_target_empty(db: Database, conn: Connection, tables: list[Table]) -> None:
    filled = {}
    for t in tables:
        n = conn.execute(select(func.count()).select_from(t)).scalar_one()
        if n:
            filled[t.name] = n
    if filled:
        desc = ", ".join(f"{k} ({v} rows)" for k, v in filled.items())
        raise InvalidInput(
            "target_not_empty",
            f"the target {db.target.display()} already holds data: {desc}; transfer only "
            "fills an empty, freshly migrated database",
            tables=filled,
        )


def _refuse_not_the_sources_store(source: Database, store: Any) -> None:
    """The copy's artifact rows name objects of the source's store, where the new database
    is recorded: through a store that is not the source's (none there, or another
    database's), it was recorded nowhere or there, and a gc from the old database then
    deleted what only the new one named. Refused `artifact_store_missing`, nothing copied."""
    from .artifacts.retention import some_referenced
    from .artifacts.settings import another_databases, not_its_store

    named = some_referenced(source, "transferring")
    if not named:
        return
    wrong = not_its_store(source, store, missing=False) or another_databases(
        source, store, lambda: named)
    if wrong is not None:
        lost = ("" if store.present() else " A store lost for good: make an empty one there "
                f"(the directory {os.path.join(store.root, 'objects')}) and transfer again")
        raise InvalidInput(wrong.code, wrong.message + lost, **wrong.details)


def transfer(source: Database, source_features: set[str], target: Target, *,
             allow_active_leases: bool = False,
             after_snapshot: Callable[[], None] | None = None,
             store: Any = None) -> dict[str, Any]:
    """Copy the whole state of a coordinator into an empty, migrated database of the other
    kind (SQLite into PostgreSQL, or PostgreSQL back into SQLite) and verify it.
    `after_snapshot` runs once the source snapshot is taken (tests use it to write to the
    source mid-copy)."""
    if source.is_sqlite and target.sqlite_path is not None:
        raise InvalidInput("invalid_input", "the target of a transfer from SQLite must be "
                           "PostgreSQL (--to postgresql+psycopg://USER@HOST/DB); to copy a "
                           "SQLite database use `jobcoord backup`")
    if not source.is_sqlite and target.sqlite_path is None:
        raise InvalidInput("invalid_input", "the source is not SQLite and the target is "
                           "PostgreSQL too: a transfer moves between SQLite and PostgreSQL "
                           "(--to sqlite:///PATH); between servers use pg_dump")
    from .maintenance import refuse_damaged_schema

    # Keys too: a source without a key or foreign key holds what the target refuses.
    refuse_damaged_schema(source, "transferring: the source", keys=True)
    dest = Database.open(target)
    try:
        target_features = verify_schema(dest)
        refuse_damaged_schema(dest, "transferring: the target")
        missing = source_features - target_features
        if missing:
            where = "--db PATH" if dest.is_sqlite else "--url ..."
            raise SchemaMismatch(
                "feature_missing",
                f"the source uses {', '.join(sorted(missing))} but the target does not have "
                f"it; run `jobcoord {where} migrate --with "
                f"{' --with '.join(sorted(missing))}` on the target first",
            )
        tables = tables_for(source_features)
        if store is not None and "artifacts" in source_features:
            _refuse_not_the_sources_store(source, store)
        if store is not None and store.present():
            # The copy's artifact rows reference the source's store: the new database is
            # recorded as using it before they commit, so a gc from the old one (a timer
            # still running) is refused instead of deleting what only the new one references.
            from .artifacts.settings import database_identity, record_user

            record_user(store, database_identity(dest))
        try:
            try:
                if isinstance(source, SqliteDatabase):
                    assert isinstance(dest, PostgresDatabase)
                    result = _copy(source, dest, tables, allow_active_leases, after_snapshot)
                else:
                    assert isinstance(source, PostgresDatabase)
                    assert isinstance(dest, SqliteDatabase)
                    result = _copy_back(source, dest, tables, allow_active_leases,
                                        after_snapshot)
            except DBAPIError as e:
                raise classify(e, "transferring") from e
            # Verify again from a fresh connection: what committed is what the source had.
            after = dest.read(lambda conn: {t.name: digest(dest, conn, t) for t in tables},
                              "verifying the target")
        except KeyboardInterrupt:
            raise _interrupted(dest, tables) from None
        _compare(result["tables"], after, "after commit")
    finally:
        dest.close()
    result.update(source=source.target.display(), target=target.display(),
                  features=sorted(source_features), verified=True)
    return result


def _interrupted(dest: Database, tables: list[Table]) -> Interrupted:
    """Ctrl-C during a transfer. The copy is one transaction (already rolled back here if it
    had not committed), so the target holds all of it or nothing: the answer says which, as
    the target shows it. After the commit, the check against the source did not run."""
    try:
        dest.read(lambda conn: _check_target_empty(dest, conn, tables), "after an interrupt")
    except InvalidInput:  # target_not_empty: the copy is there
        return Interrupted(
            "interrupted", "interrupted (Ctrl-C) after the copy was committed: the target "
            "holds the whole copy, but its check against the source did not run; run "
            "`jobcoord check` on the target", committed=True)
    except BaseException:  # a second Ctrl-C, or the target unreachable: say so
        return Interrupted(
            "interrupted", "interrupted (Ctrl-C) as the copy was being committed: whether "
            "the target holds it is unknown; run `jobcoord status` on the target",
            committed=None)
    return Interrupted("interrupted", "interrupted (Ctrl-C); the copy was rolled back and "
                       "the target is empty as it was", committed=False)


def _compare(expected: dict[str, Any], got: dict[str, Any], when: str) -> None:
    bad = {name: {"source": exp, "target": got.get(name)} for name, exp in expected.items()
           if got.get(name) != exp}
    if bad:
        raise DatabaseCorrupt(
            "transfer_mismatch",
            f"verification failed {when}: {', '.join(bad)} differ between source and target",
            tables=bad,
        )


def _copy(source: SqliteDatabase, dest: PostgresDatabase, tables: list[Table],
          allow_active_leases: bool, after_snapshot: Callable[[], None] | None) -> dict[str, Any]:
    now = now_us()
    # A deferred BEGIN: a read snapshot, never the write lock. The same connection reads
    # data_version afterwards, which changes only if another connection committed since.
    with source.engine.connect() as sconn:
        with sconn.begin():
            version = source.data_version(sconn)
            # A damaged page may still read as rows: never copy, and call verified, a source
            # that SQLite's own check finds damaged (the same snapshot is copied next).
            found = source.page_check(sconn)
            if found != ["ok"]:
                raise DatabaseCorrupt(
                    "database_corrupt", f"the source {source.target.display()} failed "
                    f"quick_check ({'; '.join(found[:3])}); nothing was copied. Restore it "
                    "from a backup, then transfer", quick_check=found[:20])
            _refuse_orphans(source, sconn, tables)
            active = source.run(sconn, rs.LIVE_LEASES, {"now": now}).one()
            _refuse_live_leases(active, allow_active_leases)
            source_digests = {t.name: digest(source, sconn, t) for t in tables}
            if after_snapshot is not None:
                after_snapshot()
            with dest.write_engine.begin() as tconn:
                # No coordinator may write to the target while it is being filled, and two
                # transfers into one target must not interleave.
                dest.lock_exclusive(tconn, [t.name for t in tables])
                _check_target_empty(dest, tconn, tables)
                faults.point("transfer.after_empty_check")
                _copy_rows(source, sconn, dest, tconn, tables)
                _refuse_unsound(source, sconn)  # (raised before commit: the target empty)
                sequences = dest.continue_sequences(tconn, [t.name for t in tables])
                inside = {t.name: digest(dest, tconn, t) for t in tables}
                # A mismatch raises here, before commit: the target is left empty.
                _compare(source_digests, inside, "before commit")
            faults.point("transfer.after_commit")
        changed = source.data_version(sconn) != version
        sconn.rollback()
    if changed:
        raise _source_changed()
    return {"tables": source_digests, "next_ids": sequences,
            "active_leases_copied": int(active[0])}


def _refuse_orphans(source: Database, sconn: Connection, tables: list[Table]) -> None:
    """Rows of the copied tables whose job (or other parent) is gone: SQLite keeps them
    (written by its shell, which enforces no foreign keys), so does PostgreSQL with its
    triggers off; the target's foreign keys refused them mid-copy. Of the tables copied
    only: a table of the user's own in the file is not judged."""
    orphans = source.foreign_key_violations(sconn, tables)
    if orphans:
        names = ", ".join(dict.fromkeys(str(row[0]) for row in orphans))
        raise DatabaseCorrupt(
            "database_corrupt", f"the source {source.target.display()} holds rows whose job "
            f"or other parent is gone (in {names}: deleted by hand?), as `jobcoord check` "
            "lists under foreign_key_violations; nothing was copied. Restore it from a "
            "backup, then transfer", foreign_key_violations=orphans[:20])


def _refuse_unsound(source: Database, sconn: Connection) -> None:
    """A source `check` finds fault with (a job without its events, a running job without
    its lease, counts drifted from the jobs): the copy would carry the damage into a
    database that had never held it, exit 0. Judged in the snapshot copied, after the rows
    (whose own findings, a value of the wrong type, name their table and column)."""
    from .maintenance import _invariants

    found = _invariants(source, sconn)
    if found:
        names = ", ".join(dict.fromkeys(v["invariant"] for v in found))
        raise DatabaseCorrupt(
            "database_corrupt", f"the source {source.target.display()} holds what `jobcoord "
            f"check` finds ({names}); nothing was copied. Repair it or restore it from a "
            "backup, then transfer", violations=found[:20])


def _copy_rows(source: Any, sconn: Any, dest: Any, tconn: Any, tables: list[Table]) -> None:
    """Every row of every table, parents first, in batches of BATCH_ROWS."""
    for t in tables:
        insert_row = SQL(t.insert())
        batch: list[dict[str, Any]] = []
        for row in rows_in_order(source, sconn, t):
            batch.append(dict(row._mapping))
            if len(batch) >= BATCH_ROWS:
                dest.run_many(tconn, insert_row, batch)
                batch = []
        if batch:
            dest.run_many(tconn, insert_row, batch)


def _source_changed() -> Refused:
    return Refused(
        "source_changed",
        "the target holds a verified copy of the source as it was when the transfer began, "
        "but the source accepted writes during the copy, which the target lacks. Stop every "
        "writer (workers, submitters, reapers), recreate and migrate the target, and run "
        "transfer again",
    )


def _refuse_live_leases(active: Any, allow_active_leases: bool) -> None:
    if active[0] and not allow_active_leases:
        raise Refused(
            "active_leases",
            f"{active[0]} job(s) are leased to workers until as late as {iso(active[1])}; "
            "their results would go to the old database. Stop the workers and let the "
            "leases end (then `jobcoord reap`), or pass --allow-active-leases to copy them "
            "as they are",
            active_leases=active[0],
        )


def _copy_back(source: PostgresDatabase, dest: SqliteDatabase, tables: list[Table],
               allow_active_leases: bool, after_snapshot: Callable[[], None] | None
               ) -> dict[str, Any]:
    """PostgreSQL back into SQLite: the source read in one REPEATABLE READ, READ ONLY
    snapshot (every table at the same instant, no lock taken), the target written in one
    BEGIN IMMEDIATE transaction (no other writer meanwhile). SQLite continues ids after the
    largest copied one by itself. Writes to the source during the copy are found by
    reading it again afterwards."""
    now = now_us()
    with source.read_engine.connect() as sconn, sconn.begin():
        _refuse_orphans(source, sconn, tables)
        active = source.run(sconn, rs.LIVE_LEASES, {"now": now}).one()
        _refuse_live_leases(active, allow_active_leases)
        source_digests = {t.name: digest(source, sconn, t) for t in tables}
        if after_snapshot is not None:
            after_snapshot()
        with dest.write_engine.begin() as tconn:
            _check_target_empty(dest, tconn, tables)
            _copy_rows(source, sconn, dest, tconn, tables)
            _refuse_unsound(source, sconn)
            inside = {t.name: digest(dest, tconn, t) for t in tables}
            # A mismatch raises here, before commit: the target is left empty.
            _compare(source_digests, inside, "before commit")
        faults.point("transfer.after_commit")
    now_source = source.read(lambda conn: {t.name: digest(source, conn, t) for t in tables},
                             "reading the source again")
    if now_source != source_digests:
        raise _source_changed()
    return {"tables": source_digests, "next_ids": {}, "active_leases_copied": int(active[0])}
