"""Storage commands: migrate, status, check, backup, restore, transfer."""

from __future__ import annotations

import contextlib

import click

from .group import Settings, cli, tenant_option
from .output import emit, json_option, safe_text

MIGRATE_BUSY_TIMEOUT_S = 60.0  # migrate's wait for the lock when --busy-timeout is not given


@cli.command()
@click.option("--with", "add", multiple=True, metavar="FEATURE",
              help="Also install an optional feature: artifacts.")
@click.option("--force", is_flag=True, help="--without: drop the feature's rows too.")
@click.option("--without", "remove", multiple=True, metavar="FEATURE",
              help="Remove an optional feature (its tables are dropped).")
@json_option
@click.pass_obj
def migrate(s: Settings, force: bool, add: tuple[str, ...], remove: tuple[str, ...],
            as_json: bool) -> None:
    """Create the database or bring its schema to this version, then quick_check it."""
    from ..migrate import check_features
    from ..migrate import migrate as run_migrate
    from ..store import Database

    check_features(set(add), set(remove), force=force)
    target = s.target()
    # Unless told otherwise, a migration waits longer for the lock (a concurrent migrate,
    # a long write of a running server finishes first); --busy-timeout given bounds it too.
    given = s.busy_timeout_given()
    db = Database.open(target, create=True, synchronous=s.synchronous,
                       busy_timeout=s.busy_timeout if given else MIGRATE_BUSY_TIMEOUT_S)
    # A failed migration is rolled back whole. A new file it created stays behind, empty and
    # unmigrated (any command says "run jobcoord migrate"): deleting it could pull the file
    # from under a concurrent migrate that opened it meanwhile and is about to commit.
    try:
        result = run_migrate(db, add=set(add), remove=set(remove), force=force,
                             artifacts_dir=s.artifacts)
    finally:
        db.close()
    result["database"] = target.display()
    emit(as_json, result)


@cli.command()
@tenant_option
@json_option
@click.pass_obj
def status(s: Settings, tenant: str | None, as_json: bool) -> None:
    """Counts by status, workers, active leases, schema revision and storage facts."""
    emit(as_json, s.coordinator().status(tenant=tenant))


@cli.command()
@click.option("--full", is_flag=True, help="integrity_check instead of quick_check.")
@json_option
@click.pass_obj
def check(s: Settings, full: bool, as_json: bool) -> None:
    """Check storage and the application invariants; exit 7 if anything is wrong."""
    from ..maintenance import check as run_check

    result = run_check(s.coordinator().db, full=full)
    emit(as_json, result, code=0 if result["ok"] else 7)


@cli.command()
@click.argument("dest")
@click.option("--force", is_flag=True, help="Replace DEST if it exists.")
@json_option
@click.pass_obj
def backup(s: Settings, dest: str, force: bool, as_json: bool) -> None:
    """Copy the live database to DEST (online backup API), then check the copy."""
    from ..artifacts import backup as artifact_backup  # objects beside DEST, with a manifest
    from ..maintenance import backup as run_backup

    emit(as_json, artifact_backup.backup(s.coordinator(), dest, force, run_backup))


@cli.command()
@click.argument("backup_file", metavar="BACKUP")
@json_option
@click.pass_obj
def restore(s: Settings, backup_file: str, as_json: bool) -> None:
    """Make the database named by --db, which must not exist yet, from BACKUP.

    BACKUP must be one file written by `backup`; it is checked whole (integrity_check and the
    invariants) before anything is written, and the new database is checked again after."""
    from ..artifacts import backup as artifact_backup  # checked objects first, then the db
    from ..maintenance import restore as run_restore
    from ..store.target import utf8_path

    utf8_path(backup_file, "the backup")
    emit(as_json, artifact_backup.restore(backup_file, s.target(), s.artifacts, run_restore))


@cli.command()
@click.option("--to", "to_url", required=True, metavar="URL",
              help="An empty, migrated database of the other kind: PostgreSQL "
                   "(postgresql+psycopg://user@host/db) from SQLite, SQLite "
                   "(sqlite:///path) from PostgreSQL.")
@click.option("--allow-active-leases", is_flag=True,
              help="Copy even while workers hold live leases (their results would still go "
                   "to the old database).")
@json_option
@click.pass_obj
def transfer(s: Settings, to_url: str, allow_active_leases: bool, as_json: bool) -> None:
    """Copy this coordinator's whole state into PostgreSQL (from SQLite) or SQLite (from
    PostgreSQL) and verify every table."""
    from ..store import resolve_target
    from ..transfer import transfer as run_transfer

    dest = resolve_target(url=to_url)
    c = s.coordinator()
    store = None
    if "artifacts" in c.features:
        from ..artifacts.settings import store_of
        from ..errors import InvalidInput

        with contextlib.suppress(InvalidInput):  # PostgreSQL without --artifacts: none named
            store = store_of(c)
    result = run_transfer(c.db, c.features, dest, allow_active_leases=allow_active_leases,
                          store=store)
    emit(as_json, result, lambda: "\n".join(
        [f"copied {safe_text(result['source'])} to {safe_text(result['target'])}, verified:"]
        + [f"  {name}: {t['rows']} rows, sha256 {t['sha256'][:16]}..."
           for name, t in result["tables"].items()]))
