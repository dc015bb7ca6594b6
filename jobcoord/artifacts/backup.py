"""Backup and restore of artifact objects at the database snapshot's recovery point.

`backup DEST` with the artifacts feature writes:

    DEST                       the database snapshot (maintenance.backup, unchanged)
    DEST.artifacts/objects/... every object a row of THAT snapshot references (hard links
                               where the filesystem allows, verified copies otherwise)
    DEST.artifacts/manifest.json  {"format": 1, "objects": {digest: size}, "rows": n}

The objects are chosen by reading the snapshot itself, after it was written, so they are
exactly what it references: an object written after the snapshot is not in the backup, and
nothing in the backup references an object it lacks. While the backup runs it holds the
store's gc lock shared, so `artifact gc` cannot delete an object between the snapshot and its
copy (uploads hold the same lock shared and go on). Every object is re-hashed in the backup.

`restore` checks the backup's manifest against its objects (each present, its size and hash
right) and against the backup's rows (each referenced digest in the manifest) before anything
is written; then the objects go into the target's store first and the database after, so a
crash during restore never leaves a row without its object.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from typing import Any

from jobcoord import faults
from jobcoord.artifacts.files import NotRegularFile, dest_error, flock_within, open_regular
from jobcoord.artifacts.names import parse_digest
from jobcoord.artifacts.objects import ObjectStore
from jobcoord.artifacts.settings import (
    ENV_STORE,
    LOCK_FILE,
    MANIFEST,
    USERS_DIR,
    gc_lock,
    record_user,
    refuse_a_backups_directory,
    refuse_if_not_its_store,
    sqlite_identity,
    store_of,
)
from jobcoord.errors import DatabaseBusy, DatabaseCorrupt, InvalidInput, StorageUnavailable
from jobcoord.store.sqlite_files import no_directory

SUFFIX = ".artifacts"


def _referenced(sqlite_path: str) -> tuple[dict[str, int], int] | None:
    """{digest: size} of the non-rejected rows of a SQLite database file, and the row count;
    None if it has no artifacts table, or is no database this can read (restore's own checks
    then say what is wrong with it). Opened immutable: nothing is ever written beside it."""
    import sqlite3

    from jobcoord.maintenance import sqlite_uri
    from jobcoord.store import feature_statements as fs
    from jobcoord.store.sqlite import table_columns

    try:
        conn = sqlite3.connect(sqlite_uri(sqlite_path, "ro&immutable=1"), uri=True)
    except sqlite3.Error:
        return None
    try:
        cols = table_columns(conn, "artifacts")
        if not cols:
            return None
        if "digest" not in cols:  # an a0001 table: nothing it names is in the store
            return {}, 0
        rows = conn.execute(fs.LIVE_OBJECTS.sqlite).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    if any(not isinstance(d, str) or not isinstance(s, int) for d, s in rows):
        # (NOT NULL and the column types hold what jobcoord wrote: this is a damaged page.)
        raise DatabaseCorrupt("database_corrupt", f"{sqlite_path}: an artifact row without a "
                              "digest or a byte count: the file is damaged")
    return dict(rows), len(rows)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup(coord: Any, dest: str, force: bool,
           run: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """`run(db, dest, force=)` is maintenance.backup; with the artifacts feature installed
    the objects the snapshot references are copied beside it, with a manifest.

    Everything is built beside DEST under temporary names and put in place only once whole
    (the objects' directory first, then the database that names them): a backup that fails
    at any step leaves DEST and DEST.artifacts as they were; one killed while it puts them
    in place leaves the old objects set aside, where restore finds them."""
    if "artifacts" not in coord.features or not coord.db.is_sqlite:
        return run(coord.db, dest, force=force)
    from jobcoord.maintenance import _within, standalone_destination, writable_destination

    store = store_of(coord)
    final = os.path.abspath(os.fspath(dest)) + SUFFIX
    if _within(final, store.root) or _within(store.root, final):
        # --force would rename the live store aside and delete it: its lock, uploads in
        # flight and every object the snapshot does not name.
        raise InvalidInput("invalid_input", f"the backup's artifact directory {final} is "
                           f"the artifact store {store.root} (or holds it), whose objects "
                           "are never replaced; name another backup", dest=final)
    dest = writable_destination(dest, force=force, database=coord.db.target.sqlite_path,
                                what="the backup", store=store.root)
    standalone_destination(dest)  # (as a backup without artifacts checks it)
    with _one_at_a_time(os.path.dirname(dest)):
        return _backup(coord, dest, force, run, store, final)


#: How long a backup with artifacts waits for another one into the same directory.
DEST_LOCK_WAIT_S = 600.0


@contextlib.contextmanager
def _one_at_a_time(parent: str) -> Iterator[None]:
    """Hold an exclusive flock on DEST's directory for the whole backup. A backup puts
    three names in place one after the other (the old objects aside, the new ones, the
    database): two at once to one DEST interleaved them, each said ok, and DEST was left
    one's database beside the other's objects, both set-aside copies deleted. The lock is
    on the directory itself, so it leaves nothing behind; backups with artifacts into one
    directory run one at a time, the later one waiting (DEST_LOCK_WAIT_S at most, then
    `destination_busy`, exit 5, with nothing changed)."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise no_directory(parent) from None
    except OSError as exc:
        raise StorageUnavailable("database_unavailable", f"directory {parent} cannot be "
                                 f"opened: {exc.strerror or exc}") from None
    try:
        flock_within(fd, fcntl.LOCK_EX, DEST_LOCK_WAIT_S, lambda: DatabaseBusy(
            "destination_busy", f"another backup into {parent} has been under way for "
            f"{DEST_LOCK_WAIT_S:.0f} s; nothing was changed, try again once it is done",
            directory=parent), poll_s=0.05)
        yield
    finally:
        os.close(fd)


def _backup(coord: Any, dest: str, force: bool, run: Callable[..., dict[str, Any]],
            store: ObjectStore, final: str) -> dict[str, Any]:
    """The backup proper, under `_one_at_a_time`: checked again here, as another backup may
    have put DEST in place while this one waited."""
    from jobcoord.maintenance import standalone_destination, writable_destination

    writable_destination(dest, force=force, database=coord.db.target.sqlite_path,
                         what="the backup", store=store.root)
    standalone_destination(dest)
    if os.path.lexists(final):
        if os.path.islink(final) or not os.path.isdir(final) or not _a_backups(final):
            # --force renames it aside and deletes it: only ever what a backup wrote, never
            # another database's live store (its accepted objects) or a directory of one's own.
            raise InvalidInput("invalid_input", f"{final} exists and is not a backup's "
                               "artifact directory (an artifact store in use, or a "
                               "directory no backup wrote); move it away or name another "
                               "backup", dest=final)
        if not force:
            raise InvalidInput("destination_exists", f"{final} already exists; pass --force "
                               "to replace the backup", dest=final)
    token = secrets.token_hex(4)
    staged = f"{dest}.{token}.tmp"
    with gc_lock(store, exclusive=False, reading=True):
        result = run(coord.db, staged, force=False, store=store.root)
        work = f"{final}.{token}.tmp"
        old = f"{final}.{token}.old"
        moved_old = placed_new = replaced = False
        try:
            found = _referenced(staged)
            if found is None:  # the feature is installed: the checked snapshot has the table
                raise DatabaseCorrupt("database_corrupt", "cannot read the artifact rows of "
                                      f"the backup {staged}", backup=dest)
            referenced, nrows = found
            os.mkdir(work, 0o700)
            try:
                linked, copied, size = _copy_objects(store, work, referenced)
            except DatabaseCorrupt as e:
                refuse_if_not_its_store(coord.db, store, found=e)  # the path's fault?
                raise
            manifest = {"format": 1, "database": os.path.basename(dest), "rows": nrows,
                        "objects": {d: referenced[d] for d in sorted(referenced)}}
            with open(os.path.join(work, MANIFEST), "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(work)
            # In place: the old objects aside, the new ones, then the database naming them.
            # Two names cannot change at once: a process killed between these steps leaves
            # the old DEST beside the new objects, or beside none; the old objects wait in
            # `old`, where restore looks for them (`check_backup`).
            if os.path.lexists(final):
                if not force:  # made meanwhile, by another backup to the same DEST
                    raise _appeared(final)
                os.rename(final, old)
                moved_old = True
            faults.point("backup.old_objects_aside")
            try:
                os.rename(work, final)
            except OSError as e:  # a directory made there since (not empty): never replaced
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                raise _appeared(final) from None
            placed_new = True
            faults.point("backup.new_objects_in_place")
            if force:
                os.replace(staged, dest)
            else:
                # Linked, not renamed: a DEST another backup put there meanwhile is refused,
                # never replaced (both said ok, the first's file gone).
                try:
                    os.link(staged, dest)
                except FileExistsError:
                    raise _appeared(dest) from None
                os.unlink(staged)
            replaced = True
            faults.point("backup.database_in_place")
            _fsync_dir(os.path.dirname(dest))
        except BaseException:
            if placed_new and not replaced:
                # The new objects are in place but not the database naming them: back out,
                # so the old database finds its own objects again.
                with contextlib.suppress(OSError):
                    os.rename(final, work)
            shutil.rmtree(work, ignore_errors=True)
            if moved_old and not os.path.lexists(final):
                with contextlib.suppress(OSError):
                    os.rename(old, final)  # the last good backup's objects, back
                moved_old = False
            if not replaced:
                # A snapshot without its objects is not a backup: take it away.
                with contextlib.suppress(OSError):
                    os.unlink(staged)
            failed = sys.exc_info()[1]
            if isinstance(failed, OSError):
                # The filesystem refused a step (DEST immutable, the directory read-only or
                # full): storage, exit 6, as a backup without artifacts says; not a bug.
                raise dest_error(failed, dest) from failed
            raise
        finally:
            if moved_old:
                shutil.rmtree(old, ignore_errors=True)
    _remove_leftovers(dest, final)
    result.update(backup=dest, size_bytes=os.path.getsize(dest))
    result["artifacts"] = {"directory": final, "objects": len(referenced), "bytes": size,
                           "hard_linked": linked, "copied": copied, "rows": nrows,
                           "verified": True}
    return result


def _a_backups(directory: str) -> bool:
    """Whether `directory` is one a backup wrote: its manifest, and none of what a live
    store holds (the record of the databases using it, its lock)."""
    return (os.path.isfile(os.path.join(directory, MANIFEST))
            and not any(os.path.lexists(os.path.join(directory, name))
                        for name in (USERS_DIR, LOCK_FILE)))


def _appeared(path: str) -> InvalidInput:
    return InvalidInput("destination_exists", f"{path} appeared meanwhile (another backup?); "
                        "nothing was replaced", dest=path)


def _copy_objects(store: ObjectStore, work: str, referenced: dict[str, int]
                  ) -> tuple[int, int, int]:
    """Every referenced object into `work`, re-hashed there: (hard linked, copied, bytes)."""
    linked = copied = size = 0
    for digest in sorted(referenced):
        placed = store.link_or_copy_into(work, digest)  # re-hashed in the copy
        if placed.size != referenced[digest]:
            raise DatabaseCorrupt("artifact_corrupt", f"artifact object {digest} is "
                                  f"{placed.size} bytes, its rows say {referenced[digest]}",
                                  digest=digest)
        size += placed.size
        if os.stat(placed.path).st_nlink > 1:
            linked += 1
        else:
            copied += 1
    return linked, copied, size


def check_backup(backup_path: str) -> tuple[dict[str, int], str] | None:
    """Prove a backup's objects whole before a restore: the manifest names every object its
    rows reference, and every object is there with its size and hash. None: the backup has
    no artifact rows (nothing to check)."""
    source = os.path.abspath(backup_path)
    found = _referenced(source) if os.path.isfile(source) else None
    directory = source + SUFFIX
    if found is None or (not found[0] and not os.path.isdir(directory)):
        return None
    referenced, nrows = found
    first: DatabaseCorrupt | None = None
    for candidate in [directory, *_set_aside(directory)]:
        try:
            return _checked(source, candidate, referenced, nrows), candidate
        except DatabaseCorrupt as e:
            first = first or e
    assert first is not None
    raise first


def _remove_leftovers(dest: str, final: str) -> None:
    """After a backup to DEST put DEST and its objects in place, whole: what earlier backups
    to DEST killed midway left beside them (their staged snapshot `DEST.<token>.tmp...`, their
    objects' work directory `DEST.artifacts.<token>.tmp`, the objects they set aside
    `DEST.artifacts.<token>.old`) is of no use any more: restore takes DEST as it is now.
    Under the directory's backup lock, so no backup still running holds any of them."""
    parent = os.path.dirname(dest) or "."
    base, objects = os.path.basename(dest), os.path.basename(final)
    files = re.compile(re.escape(base) + r"\.[0-9a-f]{8}\.tmp.*")
    dirs = re.compile(re.escape(objects) + r"\.[0-9a-f]{8}\.(?:tmp|old)")
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if files.fullmatch(name) and stat.S_ISREG(st.st_mode):
                os.unlink(path)
            elif dirs.fullmatch(name) and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path, ignore_errors=True)


def _set_aside(directory: str) -> list[str]:
    """The objects a forced backup set aside (`DEST.artifacts.<token>.old`) and a process
    killed before it removed them: the objects of the backup DEST may still be, when the
    kill fell between putting the new objects and the new database in place."""
    parent, name = os.path.split(directory)
    aside = re.compile(re.escape(name) + r"\.[0-9a-f]{8}\.old")
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return []
    return [os.path.join(parent, n) for n in sorted(names) if aside.fullmatch(n)
            and os.path.isdir(os.path.join(parent, n))
            and not os.path.islink(os.path.join(parent, n))]


def _checked(source: str, directory: str, referenced: dict[str, int], nrows: int
             ) -> dict[str, int]:
    """The manifest of the objects in `directory`, proven to hold every object of the
    backup `source` (its rows' digests), each whole."""
    def bad(why: str) -> DatabaseCorrupt:
        return DatabaseCorrupt("backup_artifacts_mismatch", f"the backup's artifacts do not "
                               f"match its manifest: {why}; nothing was restored",
                               backup=source)

    try:
        # Only a regular file, never waiting (a FIFO in its place blocked the restore in
        # open() for ever), and looked at before open(), which refuses a directory naming
        # only the descriptor.
        fd = open_regular(os.path.join(directory, MANIFEST), os.O_RDONLY)
        with open(fd, encoding="utf-8") as f:
            manifest = json.load(f)
    except NotRegularFile:
        raise bad(f"{directory}/{MANIFEST} is not a regular file") from None
    except FileNotFoundError:
        raise bad(f"{directory}/{MANIFEST} is missing") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise bad(f"the manifest cannot be read ({exc})") from None
    listed = _listed(manifest, nrows, bad)
    missing = sorted(set(referenced) - set(listed))
    if missing:
        raise bad(f"{len(missing)} objects the rows reference are not in the manifest "
                  f"(first {missing[0]})")
    store = ObjectStore(directory)
    for digest, size in sorted(listed.items()):
        state = store.verify(digest)
        if state != "ok":
            raise bad(f"object {digest} is {state}")
        if store.size(digest) != size or referenced.get(digest, size) != size:
            raise bad(f"object {digest} has the wrong size")
    return listed


def _listed(manifest: Any, nrows: int, bad: Callable[[str], DatabaseCorrupt]
            ) -> dict[str, int]:
    """The manifest's {digest: size}, once it is shown to be one `backup` wrote for this
    very database file (its format, and the number of rows it was written for)."""
    if not isinstance(manifest, dict):
        raise bad(f"the manifest is not a JSON object but {type(manifest).__name__}")
    def whole(value: Any) -> bool:  # a JSON integer: true == 1 and 1.0 == 1 in Python
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(manifest.get("format")) or manifest["format"] != 1:
        raise bad(f"the manifest is of format {manifest.get('format')!r}; this version reads "
                  "format 1")
    if not whole(manifest.get("rows")) or manifest["rows"] != nrows:
        raise bad(f"the manifest names {manifest.get('rows')!r} rows, the backup's database "
                  f"holds {nrows} (a manifest of another backup?)")
    objects = manifest.get("objects")
    if not isinstance(objects, dict):
        raise bad("the manifest's objects are not a JSON object of digest: size")
    for digest, size in objects.items():
        try:
            parse_digest(digest)
        except InvalidInput:
            raise bad(f"the manifest's key {digest[:80]!r} is not a digest") from None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(f"the manifest's size of {digest[:80]!r} is {str(size)[:40]!r}, not a "
                      "byte count")
    return dict(objects)


def _default_store(target: Any) -> str | None:
    return target.sqlite_path + SUFFIX if target.sqlite_path else None


def _outermost_missing(root: str) -> str | None:
    """The outermost directory a store made at `root` creates (`root` itself, or the first
    missing directory above it); None when `root` is there."""
    made = None
    path = root
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        made = path
        path = os.path.dirname(path)
    return made


def _remove_if_only_ours(store: ObjectStore, database: str | None, ours: dict[str, int],
                         made: str, record: str | None) -> None:
    """Delete a store a failed restore made, unless anyone else has used it: another
    restore placed objects of its own there, or found ours there and took them (it touches
    each object it finds, which changes the object's ctime), or a database is at this
    restore's target now. Judged under the gc lock held exclusively: no restore is placing
    objects meanwhile (each holds it shared until its database is in place). Kept, the
    objects are gc's to judge."""
    from jobcoord.maintenance import _within

    lock = os.path.join(store.root, LOCK_FILE)
    with contextlib.suppress(Exception), gc_lock(store, exclusive=True, wait_s=5.0):
        if database is not None and os.path.lexists(database):
            return
        for directory, _, files in os.walk(store.root):
            for name in files:
                path = os.path.join(directory, name)
                if (path not in (lock, record)
                        and os.stat(path).st_ctime_ns != ours.get(path)):
                    return
        shutil.rmtree(store.root, ignore_errors=True)
        # And the directories made to hold it, while empty (another user's files stay).
        path = os.path.dirname(store.root)
        while store.root != made and _within(path, made):
            try:
                os.rmdir(path)
            except OSError:
                break
            if path == made:
                break
            path = os.path.dirname(path)


def restore(backup_file: str, target: Any, explicit_store: str | None,
            run: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """`run(backup, target)` is maintenance.restore. Objects are checked, then placed in the
    target's store, before the database is restored."""
    checked = check_backup(backup_file)
    if checked is None:
        return run(backup_file, target)
    listed, directory = checked
    root = explicit_store or os.environ.get(ENV_STORE) or _default_store(target)
    if not root:
        raise InvalidInput("artifact_store_required", "restoring artifacts needs the store "
                           "directory: pass --artifacts DIR")
    root = os.path.abspath(root)
    refuse_a_backups_directory(root, "restored into")
    if target.sqlite_path:
        from jobcoord.maintenance import _within, refuse_existing
        from jobcoord.store.sqlite_files import LOG_SUFFIXES

        refuse_existing(target.sqlite_path)  # before any object is placed for it
        # And its directory: a default store (`<db>.artifacts`) made there made the
        # missing directories with it, and the restore went on where one without
        # artifacts is refused.
        if not os.path.isdir(os.path.dirname(target.sqlite_path)):
            raise no_directory(os.path.dirname(target.sqlite_path))
        for part in (target.sqlite_path, *(target.sqlite_path + s for s in LOG_SUFFIXES)):
            if _within(root, part):
                # Made there, the store would be a directory at the target's name (or at
                # a file SQLite keeps beside it), and the restore then refused with that
                # directory left behind: refused before anything is made.
                raise InvalidInput("invalid_input", f"the artifact store {root} would be "
                                   f"made at {part} (or inside it), where the restored "
                                   "database goes; name another --artifacts directory",
                                   store=root, restored=target.sqlite_path)
    source = ObjectStore(directory)
    made = _outermost_missing(root)
    store = ObjectStore(root)
    ours: dict[str, int] = {}  # the objects this restore put there: path -> ctime
    record: str | None = None  # this restore's record of its database in the store
    try:
        # Held shared from the first object placed until the database naming them is in
        # place, as an upload holds it until its row: neither gc nor another restore's
        # cleanup below takes them away meanwhile.
        with gc_lock(store, exclusive=False):
            # The restored database uses the store from its first object on: recorded, so
            # that gc from another database sharing the store is refused (and from this
            # one, once it is restored) rather than delete the other's objects.
            record = (record_user(store, sqlite_identity(target.sqlite_path))
                      if target.sqlite_path else None)
            for digest in sorted(listed):
                got = source.link_or_copy_into(root, digest)  # re-hashed in the store
                if got.created:
                    ours[got.path] = os.stat(got.path).st_ctime_ns
                else:
                    # Found there (another restore's, say): touched, so that one's cleanup,
                    # should it fail, sees it in use (and gc's grace starts again).
                    with contextlib.suppress(OSError):  # another user's file: kept anyway
                        os.utime(got.path)
            faults.point("restore.objects_placed")
            result = run(backup_file, target)
    except BaseException:
        # Nothing was restored (the database's own checks refused it, say): a store this
        # restore made goes with it, unless another restore to the same file, or to
        # another sharing the store, put its objects there or took ours meanwhile (deleting
        # the store took them from its restored database). Objects in a store that was
        # there stay for gc to judge.
        if made is not None:
            _remove_if_only_ours(store, target.sqlite_path, ours, made, record)
        raise
    result["artifacts"] = {"store": os.path.abspath(root), "objects": len(listed),
                           "bytes": sum(listed.values()), "verified": True}
    return result
