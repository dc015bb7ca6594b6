"""SQLite file handling outside a Database's transactions: checks and creation of the file
before SQLite opens it, pragmas read on a connection, and helpers for a file's own DB-API
connection (backup, restore)."""

from __future__ import annotations

import errno
import os
import sqlite3
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from ..errors import InvalidInput, SchemaMismatch, StorageUnavailable

if TYPE_CHECKING:
    from .base import Database


def precheck_sqlite_path(path: str, *, create: bool) -> bool:
    """Refuse paths SQLite cannot use, before SQLite touches anything. Returns whether the
    file already exists."""
    if os.path.isdir(path):
        raise StorageUnavailable("database_unavailable", f"{path} is a directory, not a database")
    exists = os.path.exists(path)
    if exists and not os.path.isfile(path):
        # A device, a pipe, a socket (or a link to one): SQLite read it as an empty file
        # and made its -journal beside it (`/dev/null-journal`, world-writable) before the
        # write failed; a pipe's read failed as an I/O error.
        raise StorageUnavailable("database_unavailable", f"{path} is not a regular file (a "
                                 "device, a pipe or a socket); a database is a file")
    named = path
    linked = _link_to_nowhere(path)
    if linked is not None:
        path, named = linked, f"{path} (a symbolic link to {linked})"
    parent = os.path.dirname(path) or "."
    if not exists:
        try:
            os.stat(parent)
        except PermissionError:
            raise StorageUnavailable(
                "database_unavailable", f"cannot reach {named}: permission denied on {parent}"
            ) from None
        except OSError:
            pass
        if not os.path.isdir(parent):
            raise no_directory(parent, f"cannot create {named}")
        if not create:
            raise SchemaMismatch(
                "not_migrated", f"no database at {named}; run `jobcoord migrate` to create it"
            )
        refuse_log_name(path, "the new database")
    return exists


#: The files SQLite keeps beside a database, named after it.
LOG_SUFFIXES = ("-wal", "-shm", "-journal")


def log_of_database(path: str) -> str | None:
    """The SQLite database `path` is named as a log of (`x.db-wal` beside a database file
    `x.db`), or None. Any database's: SQLite finds a log by its name alone, so a file made
    there is replayed onto that database (a -wal, a hot -journal) or taken for its log.
    The suffix in any case (a filesystem that ignores case names the same file). A base
    that is no SQLite file (a directory, a text file) has no log to protect; an empty one
    may be a database in WAL mode whose pages are all in its -wal still."""
    for suffix in LOG_SUFFIXES:
        if path.casefold().endswith(suffix):
            base = path[:-len(suffix)]
            try:
                with open(base, "rb") as f:
                    head = f.read(16)
            except OSError:  # absent, a directory, unreadable: none to protect
                continue
            if head in (b"", b"SQLite format 3\x00"):
                return base
    return None


def refuse_log_name(path: str, what: str) -> None:
    """InvalidInput (exit 2) for a file to be made at another database's log's name."""
    base = log_of_database(path)
    if base is not None:
        raise InvalidInput("invalid_input", f"{what} {path} is named as the log SQLite keeps "
                           f"beside the database {base} (-wal, -shm, -journal); a file there "
                           "would destroy that database's committed work", dest=path)


def _link_to_nowhere(path: str) -> str | None:
    """The file a link to a file not yet made names (that file's directory, whether migrate
    may create it, are the questions then); None when `path` is no such link. A loop is
    unusable."""
    if os.path.exists(path) or not os.path.islink(path):
        return None
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StorageUnavailable(
                "database_unavailable",
                f"cannot open {path}: its symbolic links loop (too many levels)") from None
    return os.path.realpath(path)


def create_private_file(path: str) -> bool:
    """Create an empty database file readable and writable by its owner only (0600).
    Returns whether this call created it (False: it already existed). Through a link to a
    file not yet made, the file it names is created (O_EXCL refuses any link)."""
    path = _link_to_nowhere(path) or path
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except PermissionError as e:
        raise StorageUnavailable(
            "database_readonly", f"cannot create {path}: the directory is not writable"
        ) from e
    except OSError as e:
        code = "database_full" if e.errno == errno.ENOSPC else "database_unavailable"
        raise StorageUnavailable(code, f"cannot create {path}: {e.strerror}") from e
    os.close(fd)
    return True


def sqlite_pragma(db: Database, conn: Connection, pragma: str) -> list[Any]:
    return [row[0] for row in conn.exec_driver_sql(f"PRAGMA {pragma}").all()]


# --- on a file's own DB-API connection (backup, restore: copies no Database has open) -------


def file_quick_check(raw: sqlite3.Connection) -> list[str]:
    """quick_check on a plain sqlite3 connection: ["ok"] when the file is whole."""
    return [r[0] for r in raw.execute("PRAGMA quick_check").fetchall()]


def set_journal_mode(raw: sqlite3.Connection, mode: str) -> str:
    """Switch a plain sqlite3 connection's file to `mode`; the mode it is in afterwards."""
    if mode not in ("wal", "delete"):
        raise ValueError(f"unexpected journal mode {mode!r}")
    return str(raw.execute(f"PRAGMA journal_mode={mode}").fetchone()[0])


def table_columns(raw: sqlite3.Connection, table: str) -> set[str]:
    """The columns of `table` in a plain sqlite3 connection's file (none: no such table)."""
    return {r[0] for r in raw.execute("SELECT name FROM pragma_table_info(?)", (table,))}


def no_directory(parent: str, doing: str | None = None) -> StorageUnavailable:
    """The error for a file's directory that is not there (exit 6: a volume not mounted is
    the common case, and it comes back). Said as it is: "does not exist" of a regular file
    (`backup q.db/b.db`) sent people looking for a directory never meant to be there."""
    # exists, not lexists: a link to nothing where the directory goes is a volume not
    # mounted, whose directory does not exist.
    said = (f"{parent} is not a directory" if os.path.exists(parent)
            else f"directory {parent} does not exist")
    return StorageUnavailable("database_unavailable", f"{doing}: {said}" if doing else said)
