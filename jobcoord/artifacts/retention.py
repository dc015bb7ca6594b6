"""Artifact retention: gc of the stages whose attempt is over and of the objects no live
row references, and the check before the artifacts feature is removed."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from typing import TYPE_CHECKING, Any

from jobcoord.artifacts.files import store_error
from jobcoord.artifacts.names import parse_digest
from jobcoord.artifacts.objects import ObjectStore
from jobcoord.artifacts.settings import (
    database_identity,
    gc_lock,
    need_feature,
    record_user,
    refuse_a_backups_directory,
    refuse_if_shared,
    store_of,
    store_root,
)
from jobcoord.clock import now_us
from jobcoord.core.common import record_event
from jobcoord.errors import DatabaseCorrupt, InvalidInput, Refused
from jobcoord.store import feature_statements as fs

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from jobcoord.coordinator import Coordinator
    from jobcoord.store import Database

DEFAULT_GRACE_S = 3600.0
#: gc never removes a temporary file younger than this, whatever its grace: an upload creates
#: its file an instant before it locks it (objects.py, clean_temp).
TEMP_MIN_AGE_S = 60.0


# --- retention ------------------------------------------------------------------------------


def referenced_digests(db: Database, conn: Connection) -> set[str]:
    rows = db.run(conn, fs.REFERENCED_DIGESTS).all()
    return {r[0] for r in rows}


def some_referenced(db: Database, action: str) -> list[str]:
    """Some of the objects this database's rows name (fs.OBJECTS_LOOKED_FOR at most; none:
    it names none), for a look at whether a store is its own."""
    return db.read(lambda conn: [r[0] for r in db.run(conn, fs.SOME_REFERENCED).all()],
                   action)


def refuse_missing_store(coord: Coordinator, store: ObjectStore, action: str) -> None:
    """No store at `store.root`: refused (InvalidInput `artifact_store_missing`) when this
    database's rows reference objects, which a store there would hold; a database naming
    none has no store yet, and its first stage makes one."""
    if some_referenced(coord.db, action):
        raise InvalidInput(
            "artifact_store_missing",
            f"no artifact store at {store.root}, yet this database's artifacts reference "
            "objects kept there: is --artifacts mistyped, or the store moved? Nothing was "
            "changed")


def gc_artifacts(coord: Coordinator, *, grace_s: float = DEFAULT_GRACE_S,
                 dry_run: bool = False) -> dict[str, Any]:
    """Reject the stages of attempts that are over (their lease is gone), then delete every
    object no live row references that is older than the grace, and the temporary files of
    uploads that died. Never a referenced object; never a young one (an upload in flight)."""
    need_feature(coord)
    if not isinstance(dry_run, bool):
        raise InvalidInput("invalid_input", "dry_run must be true or false", field="dry_run")
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or not (
            0 <= grace_s <= 10 * 365 * 86400):
        raise InvalidInput("invalid_input", "grace must be 0 s .. 10 years")
    store = store_of(coord)
    refuse_a_backups_directory(store.root, "collected")
    if not store.present():
        # No store there (no directory, or one that never held a store: an empty one made
        # by hand), so nothing to collect; with rows referencing objects, it is the wrong
        # place (a mistyped --artifacts: one letter off another database's store is how
        # objects get deleted). Either way the store is not made here.
        refuse_missing_store(coord, store, "artifact gc")
        return _report(dry_run, 0, [], 0, 0, set(), {"removed": 0, "bytes_removed": 0},
                       store)
    # Before anything changes (the stages below included), and again under the lock.
    refuse_if_shared(store, coord.db)
    store.refuse_broken_layout()
    store.refuse_linked_layout()
    _refuse_unreadable(coord.db.read(lambda conn: referenced_digests(coord.db, conn),
                                     "artifact gc"))
    if dry_run:
        ended = len(coord.db.read(lambda conn: coord.db.run(conn, fs.STALE_STAGES).all(),
                                  "artifact gc"))
    else:
        def _end(conn: Connection) -> int:
            rows = coord.db.run(conn, fs.STALE_STAGES).all()
            if rows:
                now = now_us()
                coord.db.run(conn, fs.END_STALE)
                for r in rows:
                    record_event(coord, conn, r[1], now, r[5], r[5], "artifact_rejected", None,
                                 r[2], {"name": r[3], "digest": r[4], "reason": "attempt_ended"})
            return len(rows)
        ended = coord.db.write(_end, "artifact gc")
    # A dry run counts as gone the stages it would reject (their objects would go).
    referenced = fs.REFERENCED_AFTER_END if dry_run else fs.REFERENCED_DIGESTS

    def _live() -> set[str]:
        live = coord.db.read(lambda conn: {r[0] for r in coord.db.run(conn, referenced).all()},
                             "artifact gc")
        _refuse_unreadable(live)
        return live

    removed, kept_young, freed = [], 0, 0
    with gc_lock(store, exclusive=True, create=False, dry_run=dry_run):  # found there above
        # Under the lock: a database that began to use the store since is recorded by now
        # (it records itself before its first row, holding the lock shared).
        refuse_if_shared(store, coord.db)
        if not dry_run:
            # This one's own record: a database restored here later (or staging here) is
            # then refused gc, as this one is once that one is recorded.
            record_user(store, database_identity(coord.db))
        store.refuse_linked_layout()  # linked since the look above
        candidates = [(d, size) for d, size, _mtime in store.iter_objects()]
        # Read after listing, under the lock: an object listed is either referenced by now
        # or old enough to be nobody's upload in flight.
        live = _live()
        cutoff = time.time() - grace_s
        for digest, size in candidates:
            if digest in live:
                continue
            try:
                mtime = os.stat(store.path_of(digest)).st_mtime
            except FileNotFoundError:
                continue
            if mtime > cutoff:
                kept_young += 1
                continue
            if not dry_run:
                store.remove(digest)
            removed.append(digest)
            freed += size
    temp = store.clean_temp(max(grace_s, TEMP_MIN_AGE_S), dry_run=dry_run)
    return _report(dry_run, ended, removed, freed, kept_young, live, temp, store)


def _report(dry_run: bool, ended: int, removed: list[str], freed: int, kept_young: int,
            live: set[str], temp: dict[str, int], store: ObjectStore) -> dict[str, Any]:
    return {"dry_run": dry_run, "stages_ended": ended, "objects_removed": len(removed),
            "bytes_removed": freed, "kept_young": kept_young, "referenced": len(live),
            "removed": removed, "temp_files_removed": temp["removed"],
            "temp_bytes_removed": temp["bytes_removed"], "store": store.root}


# --- removing the feature -------------------------------------------------------------------


def removal_check(db: Database, conn: Connection, force: bool,
                  store: str | None = None) -> dict[str, int]:
    """Before `migrate --without artifacts`: how many rows, and objects in the store, would be
    left without the feature. Refused (exit 4) when there are any, unless forced. Objects are
    never deleted here (gc owns them; without the feature, remove the directory by hand)."""
    rows, size = db.run(conn, fs.ARTIFACT_TOTALS if _has_new_columns(db, conn)
                        else fs.ARTIFACT_TOTALS_A0001).one()
    objects = object_bytes = 0
    with contextlib.suppress(InvalidInput):  # PostgreSQL without a named store: rows only
        there = ObjectStore(store_root(db, store))
        if there.present():
            # A link to nothing (a volume not mounted) lists as no object: counted none,
            # `--force` dropped the rows saying none was left.
            there.refuse_broken_layout(tmp=False)
        if rows and ((there.present() and not os.path.lexists(there.objects_dir))
                     or (os.path.islink(there.root) and not os.path.exists(there.root))):
            # So do an `objects/` without its `sha256/` (the empty mount point of a volume
            # not mounted) and a store path that is a link to nothing, where rows name
            # objects: as every reader says of them, the store cannot be used.
            raise store_error(FileNotFoundError(
                errno.ENOENT, f"{there.objects_dir} is not there, yet this database's "
                "artifacts are kept there: is its volume not mounted?"), there.root,
                "counting the objects it holds")
        for _digest, n, _mtime in there.iter_objects():
            objects += 1
            object_bytes += n
    if (rows or objects) and not force:
        raise Refused("artifacts_present",
                      f"removing the artifacts feature would drop {rows} artifact rows naming "
                      f"{int(size)} bytes, and leave {objects} objects ({object_bytes} bytes) in "
                      "the store unmanaged; pass --force to go ahead (objects are never deleted "
                      "by a migration)", rows=int(rows), bytes=int(size), objects=objects,
                      object_bytes=object_bytes)
    return {"artifact_rows_dropped": int(rows), "artifact_bytes_unreferenced": int(size),
            "objects_left": objects, "object_bytes_left": object_bytes}


def _has_new_columns(db: Database, conn: Connection) -> bool:
    from sqlalchemy import inspect

    return "digest" in {c["name"] for c in inspect(conn).get_columns("artifacts")}


def _a_digest(digest: object) -> bool:
    try:
        parse_digest(digest)
    except InvalidInput:
        return False
    return True


def _refuse_unreadable(live: set[str]) -> None:
    """A row whose digest is no digest names no object: which object it meant cannot be
    told, so none is known unreferenced (gc deleted the intact object of an accepted
    artifact). Refused before anything changes, and again under the lock."""
    unreadable = sorted((d for d in live if not _a_digest(d)), key=ascii)
    if unreadable:
        raise DatabaseCorrupt(
            "database_corrupt", f"{len(unreadable)} artifact row(s) hold a digest that is no "
            f"digest ({ascii(unreadable[0])[:100]}: changed by hand?); nothing was changed. "
            "`jobcoord check` names them (artifact_unreadable)",
            digests=[ascii(d)[:100] for d in unreadable[:20]])
