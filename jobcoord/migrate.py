"""Schema revisions: create, upgrade and downgrade through the Alembic history, and check that
a database matches this code before any other command touches it.

Alembic is imported only here and only when migrating, so everyday commands stay quick.
The core tables are one branch (`alembic/versions`); optional features are branches of their
own (`alembic/artifacts`), applied with `jobcoord migrate --with artifacts`.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .errors import DatabaseBusy, DatabaseCorrupt, InvalidInput, JobcoordError, SchemaMismatch
from .store import CORE_REVISIONS, OPTIONAL_REVISIONS, Database, classify, statements
from .store.sqlite import sqlite_pragma

OPTIONAL_FEATURES = tuple(OPTIONAL_REVISIONS)


def known_revisions() -> set[str]:
    """Every revision this jobcoord's history holds, the core's and each feature's."""
    return set(CORE_REVISIONS).union(*OPTIONAL_REVISIONS.values())


def script_location() -> Path:
    """The migration environment: shipped in the wheel as jobcoord/_alembic, or the
    checkout's top-level alembic/ when running from source."""
    packaged = Path(str(resources.files("jobcoord"))) / "_alembic"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "alembic"
    if (checkout / "env.py").is_file():
        return checkout
    raise JobcoordError("internal_error", "the migration scripts are missing from this install")


def _config(db: Database, conn: Connection, features: set[str]) -> Any:
    from alembic.config import Config

    here = script_location()
    cfg = Config()
    cfg.set_main_option("script_location", str(here))
    cfg.set_main_option("path_separator", "os")
    locations = [str(here / "versions")] + [str(here / f) for f in sorted(features)]
    cfg.set_main_option("version_locations", os.pathsep.join(locations))
    cfg.attributes["connection"] = conn
    cfg.attributes["jobcoord_db"] = db
    return cfg


def current_revisions(db: Database, conn: Connection) -> set[str]:
    if not db.engine.dialect.has_table(conn, "alembic_version"):
        return set()
    rows = db.run(conn, statements.ALEMBIC_VERSIONS).all()
    found = {r[0] for r in rows}
    # A revision is printable ASCII text. Anything else (NULLs, stray bytes) is what a damaged
    # page of the version table reads back as: not a newer schema to upgrade jobcoord for.
    if any(not (isinstance(r, str) and r and r.isascii() and r.isprintable()) for r in found):
        where = db.target.display()
        raise DatabaseCorrupt(
            "database_corrupt", f"{where}: the table of schema revisions (alembic_version) "
            "holds values that are no revision, as a damaged page reads back; restore the "
            "last good backup (`jobcoord restore`)")
    return found


def unversioned_tables(db: Database, conn: Connection) -> list[str]:
    """jobcoord's own tables found in a database that records no revision (alembic_version
    missing or empty): a database whose schema nobody can vouch for."""
    from .models import CORE_TABLES

    return [t for t in CORE_TABLES if db.engine.dialect.has_table(conn, t)]


def _foreign_objects(db: Database, conn: Connection, revisions: set[str]) -> list[str]:
    """What a SQLite file holds that jobcoord never makes: another program's tables and
    views, or (with neither) the user_version or application_id it set. Empty for a
    jobcoord database, a newer jobcoord's (an unknown revision beside jobcoord's tables:
    schema_newer says so) and an empty file. Another program's Alembic history (an unknown
    revision and none of jobcoord's tables) is another program's database too."""
    known = known_revisions()
    if revisions and (revisions <= known or unversioned_tables(db, conn)):
        return []
    from .schema import metadata

    ours = {*metadata.tables, "alembic_version"}
    rows = conn.exec_driver_sql(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite_%' ORDER BY name")
    found = [f"{kind} {name}" for kind, name in rows if name not in ours]
    if revisions:  # unknown revisions beside none of jobcoord's tables: another history
        found.append(f"alembic_version {', '.join(sorted(revisions))[:80]}")
    if not found:
        for pragma in ("user_version", "application_id"):
            value = conn.exec_driver_sql(f"PRAGMA {pragma}").scalar()
            if value:
                found.append(f"{pragma} {value}")
    return found


def _unknown_schema(db: Database, tables: list[str]) -> SchemaMismatch:
    return SchemaMismatch(
        "schema_unknown",
        f"{db.target.display()} holds jobcoord tables ({', '.join(tables)}) but records no "
        "schema revision (its alembic_version table is missing or empty), so which version "
        "its tables are is unknown. jobcoord neither uses nor migrates such a database: "
        "restore it from a backup (`jobcoord restore`), or move it away and run `jobcoord "
        "migrate` to start a new one",
        tables=tables,
    )


def _unknown_revisions(db: Database, unknown: set[str], tables: list[str]) -> SchemaMismatch:
    """Revisions this jobcoord does not know: a newer jobcoord's, beside jobcoord's tables;
    another program's Alembic history, beside none of them (it was told to upgrade
    jobcoord)."""
    shown = ", ".join(sorted(unknown))[:200]
    if not tables:
        return SchemaMismatch(
            "foreign_database",
            f"{db.target.display()} is another program's database (its Alembic history is at "
            f"revision {shown} and it holds none of jobcoord's tables); point jobcoord at its "
            "own database. jobcoord wrote nothing to it", revisions=sorted(unknown)[:20])
    return SchemaMismatch(
        "schema_newer",
        f"the database is at revision {shown}, newer than this jobcoord understands; "
        "upgrade jobcoord")


def installed_features(revisions: set[str]) -> set[str]:
    return {f for f, revs in OPTIONAL_REVISIONS.items() if revisions & set(revs)}


def verify_schema(db: Database) -> set[str]:
    """Raise SchemaMismatch unless the database is at exactly this code's revisions.
    Returns the optional features installed."""
    known = known_revisions()

    def _read(conn: Connection) -> tuple[set[str], list[str]]:
        revisions = current_revisions(db, conn)
        return revisions, ([] if revisions <= known and revisions
                           else unversioned_tables(db, conn))

    revisions, tables = db.read(_read, "reading the schema version")
    unknown = revisions - known
    if unknown:
        raise _unknown_revisions(db, unknown, tables)
    orphans = [] if revisions else tables
    core = revisions & set(CORE_REVISIONS)
    if not core and orphans:
        raise _unknown_schema(db, orphans)
    if not core:
        raise SchemaMismatch(
            "not_migrated",
            f"{db.target.display()} is not a migrated jobcoord database; run `jobcoord migrate`",
        )
    (rev,) = core
    if rev != CORE_REVISIONS[-1]:
        raise SchemaMismatch(
            "schema_outdated",
            f"the database is at revision {rev}, this jobcoord expects {CORE_REVISIONS[-1]}; "
            "back it up, then run `jobcoord migrate`",
        )
    for feature, revs in OPTIONAL_REVISIONS.items():
        have = revisions & set(revs)
        if have and have != {revs[-1]}:
            raise SchemaMismatch(
                "schema_outdated",
                f"the {feature} tables are at an older revision; run `jobcoord migrate`",
            )
    return installed_features(revisions)


def _is_driver_error(e: BaseException) -> bool:
    """A database driver's error, wrapped by SQLAlchemy or raw (a PRAGMA on the DB-API
    connection raises sqlite3's own)."""
    if isinstance(e, DBAPIError):
        return True
    import sqlite3

    return isinstance(e, sqlite3.Error) or type(e).__module__.split(".")[0] == "psycopg"


def _migration_error(e: BaseException) -> JobcoordError:
    """What a failed migration run tells the operator. A driver error that SQLite's error name
    or PostgreSQL's SQLSTATE classifies keeps its class (busy: exit 5, storage: 6, corrupt:
    7); anything else came from inside a migration script: migration_failed (exit 8)."""
    if _is_driver_error(e):
        err = classify(e, "migrating")
        if isinstance(err, DatabaseBusy):  # the lock was not had within the busy timeout
            return DatabaseBusy(err.code, f"{err.message}; the migration was rolled back, "
                                "nothing was changed, try again", **err.details)
        if type(err) is not JobcoordError:  # classified, not the catch-all internal error
            return err
    return SchemaMismatch("migration_failed", f"migration failed and was rolled back: "
                          f"{getattr(e, 'orig', None) or e}")


def check_features(add: set[str], remove: set[str], *, force: bool = False) -> None:
    """The optional features a migrate names, checked before any file is opened (a refused
    migrate of a new path left an empty file behind). `force` belongs to a removal."""
    if force and not remove:
        raise InvalidInput("invalid_input", "--force goes with --without FEATURE (it drops "
                           "the feature's rows too); alone it does nothing")
    for feature in add | remove:
        if feature not in OPTIONAL_FEATURES:
            raise InvalidInput(
                "invalid_input",
                f"unknown optional feature {feature!r}; known: {', '.join(OPTIONAL_FEATURES)}",
            )
    if add & remove:
        raise InvalidInput("invalid_input", "cannot add and remove the same feature")


def migrate(
    db: Database, *, add: set[str] | None = None, remove: set[str] | None = None,
    force: bool = False, artifacts_dir: str | None = None,
) -> dict[str, Any]:
    """Bring the core schema to its newest revision, add or remove optional features, and
    run `PRAGMA quick_check` afterwards (SQLite)."""
    add = set(add or ())
    remove = set(remove or ())
    check_features(add, remove, force=force)
    from alembic import command

    before: set[str] = set()
    removed: dict[str, int] = {}  # what `--without artifacts` dropped

    def _upgrade(conn: Connection) -> None:
        nonlocal before
        before = current_revisions(db, conn)
        if db.is_sqlite:
            # Read under the write lock, before anything is written: a file is one program's
            # database, and a mistyped --db must not make another's ours (nor may a program
            # creating its tables as migrate starts find jobcoord's beside them).
            foreign = _foreign_objects(db, conn, before)
            if foreign:
                raise SchemaMismatch(
                    "foreign_database",
                    f"{db.target.display()} is another program's database (it holds what "
                    f"jobcoord never makes: {', '.join(foreign[:10])}); migrate creates or "
                    "upgrades only a jobcoord database or an empty file. jobcoord wrote "
                    "nothing to it",
                    tables=[f.split(" ", 1)[1] for f in foreign[:50]
                            if f.startswith("table ")])
        known = known_revisions()
        if before - known:
            raise _unknown_revisions(db, before - known, unversioned_tables(db, conn))
        if not before:
            orphans = unversioned_tables(db, conn)
            if orphans:  # creating the tables again would fail half-way ("already exists")
                raise _unknown_schema(db, orphans)
        elif before & set(CORE_REVISIONS):
            from .maintenance import damage_error, damage_in, holds_core_table

            if not holds_core_table(db, conn):
                # A revision recorded over no tables: said to be migrated, it was left so
                # (`changed: false`) and every other command failed on the missing tables.
                raise SchemaMismatch(
                    "schema_unknown",
                    f"{db.target.display()} records jobcoord revision "
                    f"{', '.join(sorted(before))} but holds none of its tables: restore it "
                    "from a backup, or move it away and run `jobcoord migrate` to start a "
                    "new one")
            # Some of its tables or columns dropped by hand (a partial restore): migrate
            # cannot make again what a revision it is at made, and said ok (exit 0).
            damage = damage_in(db, conn)
            if damage is not None:
                raise damage_error(damage, "migrating")
            if not db.engine.dialect.has_table(conn, "jobs"):  # an older revision's
                raise damage_error(("table_missing", "tables", ["jobs"]), "migrating")
        features = (installed_features(before) | add) - remove
        cfg = _config(db, conn, features | remove)
        for feature in sorted(remove):
            if installed_features(before) & {feature}:
                from .artifacts.retention import removal_check
                removed.update(removal_check(db, conn, force, artifacts_dir))  # unless force
                command.downgrade(cfg, f"{feature}@base")
        command.upgrade(cfg, "core@head")
        for feature in sorted(features):
            command.upgrade(cfg, f"{feature}@head")

    # One write transaction for the whole run: the version is read under the write lock, so a
    # second concurrent `migrate` waits, then finds nothing left to do.
    try:
        with db.write_engine.connect() as conn, db.migration_transaction(conn):
            _upgrade(conn)
    except JobcoordError:
        raise
    except Exception as e:
        raise _migration_error(e) from e
    # WAL only now, once the file has proved to be jobcoord's (switching is a write, and a
    # refused file must be left byte for byte as it was); a migrate that finds nothing to do
    # leaves WAL on as it was.
    db.prepare_for_migration()
    after = db.read(lambda conn: current_revisions(db, conn))
    result: dict[str, Any] = {
        "revisions_before": sorted(before),
        "revisions": sorted(after),
        "features": sorted(installed_features(after)),
        "changed": before != after,
        **({"removed": removed} if removed else {}),
    }
    if db.is_sqlite:
        result["quick_check"] = db.read(lambda c: sqlite_pragma(db, c, "quick_check"))
        result["journal_mode"] = db.read(lambda c: sqlite_pragma(db, c, "journal_mode"))[0]
    return result
