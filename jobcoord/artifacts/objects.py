"""The content-addressed object store: artifact bytes on disk, named by their SHA-256.

Layout under the store root:

    objects/sha256/<2 hex>/<2 hex>/<64 hex>   one file per distinct content, read-only
    tmp/<pid>-<random>.tmp                    uploads in flight (or left by a killed one)

Write path (`put`): stream the source in 1 MiB chunks through hashlib into a new temporary
file (O_CREAT|O_EXCL, mode 0600, flock'ed while in flight), fsync it, then give it its final
name with link(2), which never replaces an existing name (identical content is stored once and
an intact object is never overwritten; a damaged one, found by its size or its hash, is
replaced by the new copy), remove the temporary name and fsync the object's directory.
A crash at any step leaves at most a temporary file, never a half-written object; `clean_temp`
removes such files once they are older than a grace period and no process holds their lock.

Read path (`read`, `copy_to`, `verify`): every read re-hashes the bytes it returns and fails at
the end on a mismatch; `copy_to` writes beside the destination and renames only after the size
and the hash matched.

No database here: artifact rows, states and fenced linking are built on top of this module.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator

from jobcoord.artifacts.files import (
    CHUNK_SIZE,
    Fill,
    ObjectReader,
    Source,
    StoredObject,
    VerifyState,
    corrupt,
    dest_error,
    fsync_dir,
    missing,
    mkdir_once,
    open_source,
    sorted_dirs,
    store_error,
    write_all,
)
from jobcoord.artifacts.names import (
    ALGORITHM,
    HEX_DIGITS,
    MAX_NAME_BYTES,
    format_digest,
    parse_digest,
    validate_name,
)
from jobcoord.errors import DatabaseCorrupt, InvalidInput, StorageUnavailable
from jobcoord.validate import whole

TEMP_SUFFIX = ".tmp"
# link(2) refused by the filesystem itself (not by a name that exists): fall back to rename
# or to a copy.
_NO_LINK = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV})

#: Kept importable from here: the store's callers name them as the store's.
__all__ = ["ALGORITHM", "CHUNK_SIZE", "MAX_NAME_BYTES", "TEMP_SUFFIX", "ObjectReader",
           "ObjectStore", "Source", "StoredObject", "VerifyState", "format_digest",
           "parse_digest", "validate_name"]


# --- the store ------------------------------------------------------------------------------


class ObjectStore:
    """Content-addressed objects under `root` (created on the first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.objects_dir = os.path.join(self.root, "objects", ALGORITHM)
        self.tmp_dir = os.path.join(self.root, "tmp")

    def __repr__(self) -> str:
        return f"ObjectStore({self.root!r})"

    def present(self) -> bool:
        """Whether a store is there: its `objects/` made by a first write. No directory, or
        one without it (an empty one made by hand), holds none. Anything in `objects/`'s
        place (a regular file) is a store that cannot be used (`artifact_store_unavailable`
        where it is), not a mistyped path. A root that is a regular file holds none (a
        mistyped path naming some file: `--artifacts q.db`)."""
        return os.path.lexists(os.path.join(self.root, "objects"))

    def path_of(self, digest: str) -> str:
        """Where the object of `digest` lives (whether or not it exists)."""
        return self._path(parse_digest(digest))

    def _path(self, hexdigest: str) -> str:
        return os.path.join(self.objects_dir, hexdigest[:2], hexdigest[2:4], hexdigest)

    def _ensure_layout(self, create: bool = True) -> None:
        """Create root, objects/sha256 and tmp if needed, each new entry made durable.
        `create=False`: the store must be there already (its `objects/`); gone, it is not
        made again, empty, where the old one was."""
        if not create and not self.present():
            raise self._gone()
        try:
            missing = []
            path = self.root
            while create and os.path.dirname(path) != path:
                try:
                    # One look (a directory made meanwhile by a put beside this one is
                    # never taken for a file).
                    st: os.stat_result | None = os.stat(path)
                except OSError:  # not there (or unreadable: the mkdir below says so)
                    st = None
                if st is not None and stat.S_ISDIR(st.st_mode):
                    break
                if st is not None:
                    # A file where the store's directory (or one above it) goes: no store
                    # is ever made there, however often it is retried (`--artifacts q.db`).
                    # A link to nothing (a volume not mounted) is left to the mkdir: exit 6.
                    raise InvalidInput(
                        "artifact_store_missing", f"no artifact store can be made at "
                        f"{self.root}: {path} is a file, not a directory: is --artifacts "
                        "mistyped? Nothing was made.", store=self.root)
                missing.append(path)
                path = os.path.dirname(path)
            for directory in reversed(missing):  # outermost first, each entry made durable
                if mkdir_once(directory):
                    fsync_dir(os.path.dirname(directory))
            for parent, child in ((self.root, "objects"), (self.root, "tmp"),
                                  (os.path.join(self.root, "objects"), ALGORITHM)):
                if not create and child == "objects":
                    # Gone since the look above, the root with it: the mkdirs of the others
                    # fail (no parent), none of it made again.
                    continue
                if mkdir_once(os.path.join(parent, child)):
                    fsync_dir(parent)
        except OSError as exc:
            raise store_error(exc, self.root, "creating the store directories") from None

    def refuse_broken_layout(self, *, tmp: bool = True) -> None:
        """A store already there, looked at without making anything in it: anything but a
        directory where it keeps `objects/`, `objects/sha256/` or (with `tmp`, for those
        that clean it) `tmp/` is a store that cannot be used (`artifact_store_unavailable`),
        not one whose objects are missing or that holds no temporary file. A link to a
        directory is followed (reads through a linked `objects/` work); a dangling one is
        unavailable. What is not there yet is made by the next write."""
        paths = [os.path.dirname(self.objects_dir), self.objects_dir]
        for path in [*paths, self.tmp_dir] if tmp else paths:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if os.path.islink(path):  # a link to what is gone (a volume unmounted)
                    raise store_error(FileNotFoundError(errno.ENOENT, f"{path} is a link "
                                      "to nothing"), self.root, "looking at its layout") from None
                continue
            except OSError as exc:
                raise store_error(exc, self.root, "looking at its layout") from None
            if not stat.S_ISDIR(st.st_mode):
                raise store_error(OSError(errno.ENOTDIR, f"{path} is not a directory"),
                                  self.root, "looking at its layout")

    def _gone(self) -> InvalidInput:
        return InvalidInput("artifact_store_missing", f"no artifact store at {self.root}: "
                            "it went (moved or deleted) while in use; none is made again")

    def _make_fanout(self, hexdigest: str) -> str:
        """Create objects/sha256/ab/cd as needed; fsync the parent of each new level."""
        level1 = os.path.join(self.objects_dir, hexdigest[:2])
        level2 = os.path.join(level1, hexdigest[2:4])
        if mkdir_once(level1):
            fsync_dir(self.objects_dir)
        if mkdir_once(level2):
            fsync_dir(level1)
        return level2

    # --- writing ----------------------------------------------------------------------------

    def put(self, source: Source, *, max_bytes: int | None = None,
            expected_digest: str | None = None, create: bool = True) -> StoredObject:
        """Store the bytes of `source` (a path, bytes, or a binary file object read to its
        end) and return their object. Identical content is stored once (`created=False`).
        With `expected_digest`, bytes that hash to anything else are refused
        (InvalidInput `artifact_invalid`) and nothing is stored. `create=False`: into the
        store already there only (InvalidInput `artifact_store_missing` if it is gone)."""
        if max_bytes is not None:
            # A whole number: no comparison with NaN is true, so a NaN limit limited nothing.
            max_bytes = whole(max_bytes, "max_bytes", 0, 2**62)
        expected = None if expected_digest is None else parse_digest(expected_digest)

        def mismatch(label: str, actual: str) -> InvalidInput:
            return InvalidInput("artifact_invalid", f"{label} hashes to sha256:{actual}, not "
                                f"the expected {expected_digest}; nothing was stored",
                                expected=expected_digest, actual=format_digest(actual))

        with open_source(source) as (fill, label):
            try:
                self._ensure_layout(create)
                return self._ingest(fill, label=label, max_bytes=max_bytes,
                                    expected_hex=expected, mismatch=mismatch)
            except StorageUnavailable:
                if not create and not self.present():
                    raise self._gone() from None  # it went after the look above
                raise

    def _ingest(self, fill: Fill, *, label: str, max_bytes: int | None = None,
                expected_hex: str | None = None,
                mismatch: Callable[[str, str], Exception] | None = None) -> StoredObject:
        fd, tmp = self._new_temp()
        try:
            try:
                # The lock marks the file as in flight for clean_temp, whatever its age; the
                # kernel drops it when this process dies, however it dies.
                fcntl.flock(fd, fcntl.LOCK_EX)
                hasher = hashlib.sha256()
                buf = memoryview(bytearray(CHUNK_SIZE))
                size = 0
                while True:
                    n = fill(buf)  # source errors arrive as InvalidInput, never OSError
                    if n == 0:
                        break
                    size += n
                    if max_bytes is not None and size > max_bytes:
                        raise InvalidInput("artifact_too_large",
                                           f"{label} is larger than the limit of {max_bytes} "
                                           "bytes", source=label, max_bytes=max_bytes)
                    chunk = buf[:n]
                    hasher.update(chunk)
                    write_all(fd, chunk)
                hexdigest = hasher.hexdigest()
                if expected_hex is not None and hexdigest != expected_hex:
                    if mismatch is not None:  # the caller's expectation, not the store's
                        raise mismatch(label, hexdigest)
                    raise corrupt(format_digest(expected_hex), label,
                                   f"its bytes hash to sha256:{hexdigest}")
                os.fchmod(fd, 0o400)  # objects are immutable
                os.fsync(fd)
                path = self._path(hexdigest)
                created = self._place(tmp, path, hexdigest, size)
            except OSError as exc:
                raise store_error(exc, self.root, f"storing {label}") from None
        finally:
            # Unlink under the lock, then close: clean_temp never sees this file unlocked
            # unless it is already gone.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            os.close(fd)
        return StoredObject(format_digest(hexdigest), size, path, created)

    def _new_temp(self) -> tuple[int, str]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        for _ in range(10):
            tmp = os.path.join(self.tmp_dir,
                               f"{os.getpid()}-{secrets.token_hex(8)}{TEMP_SUFFIX}")
            try:
                return os.open(tmp, flags, 0o600), tmp
            except FileExistsError:
                continue
            except OSError as exc:
                raise store_error(exc, self.root, "creating a temporary file") from None
        raise StorageUnavailable("artifact_store_unavailable",
                                 f"cannot create a unique temporary file in {self.tmp_dir!r}")

    def _place(self, tmp: str, path: str, hexdigest: str, size: int) -> bool:
        """Give the fsynced temporary file its final name unless that name holds an intact
        object (its size, then its hash, checked: a damaged one is replaced); fsync the
        object's directory either way (a concurrent put that created it may not have yet)."""
        directory = self._make_fanout(hexdigest)
        try:
            os.link(tmp, path)  # never replaces an existing name, unlike rename(2)
            created = True
        except FileExistsError:
            created = False
            with contextlib.suppress(FileNotFoundError):  # (gone meanwhile: the caller sees)
                found = os.lstat(path)
                if stat.S_ISLNK(found.st_mode):
                    # A link in the object's place (an object is its own file; the link's
                    # target may change under it): this put's file replaces the link itself.
                    os.rename(tmp, path)
                elif not stat.S_ISREG(found.st_mode):
                    # A directory or a pipe in the object's place: damage, as `get`
                    # and `verify` name it. Taken for an object gc removed meanwhile, every
                    # put of this content was "busy, try again", for ever.
                    raise corrupt(format_digest(hexdigest), path, "not a regular file (a "
                                  "directory or pipe is in its place: move it away)"
                                  ) from None
                elif found.st_size != size or self.verify(format_digest(hexdigest)) == "corrupt":
                    # A damaged object of this content: the bytes just hashed take its place
                    # (rename(2) is atomic; a reader of the old one keeps it open and fails
                    # its own re-hash). Linked to it, every read of what this put stored
                    # failed, with a good copy just in hand.
                    os.rename(tmp, path)
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            # A filesystem without hard links: rename. Between the check and the rename a
            # concurrent put of the same content may land first; the rename then replaces it
            # with identical, fully written bytes.
            created = not os.path.exists(path)
            if created:
                os.rename(tmp, path)
        fsync_dir(directory)
        return created

    # --- reading ----------------------------------------------------------------------------

    def read(self, digest: str, *, expected_size: int | None = None) -> ObjectReader:
        """A verified stream of the object's bytes; DatabaseCorrupt `artifact_missing` now if
        there is no object, `artifact_corrupt` at the end of the stream on a mismatch."""
        hexdigest = parse_digest(digest)
        return ObjectReader(self._path(hexdigest), hexdigest, self.root, expected_size)

    def copy_to(self, digest: str, dest: str | os.PathLike[str], *,
                expected_size: int | None = None, replace: bool = True) -> int:
        """Write the object to `dest` only once its size and hash matched; on any failure
        nothing is written at `dest` and no temporary file is left. A file at `dest` is
        replaced when `replace`; otherwise the copy is linked into place, which fails
        rather than replace a file that appeared since the caller looked (another get to
        the same new file): InvalidInput `destination_exists`. Returns the bytes written."""
        dest_path = os.path.abspath(os.fspath(dest))
        if os.path.isdir(dest_path):
            raise InvalidInput("invalid_input", f"destination {dest_path!r} is a directory",
                               dest=dest_path)
        directory = os.path.dirname(dest_path)
        with self.read(digest, expected_size=expected_size) as reader:
            tmp = os.path.join(directory, f".jobcoord-{secrets.token_hex(8)}{TEMP_SUFFIX}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except (FileNotFoundError, NotADirectoryError):
                # (A directory that is there yet where no file can be made, as /proc: said
                # so, not "does not exist".)
                why = ("is not a directory where a file can be made"
                       if os.path.isdir(directory) else "does not exist")
                raise InvalidInput("invalid_input", f"destination directory {directory!r} "
                                   f"{why}", dest=dest_path) from None
            except OSError as exc:
                raise dest_error(exc, dest_path) from None
            try:
                buf = memoryview(bytearray(CHUNK_SIZE))
                written = 0
                try:
                    while True:
                        n = reader.readinto(buf)  # raises artifact_corrupt at the end
                        if n == 0:
                            break
                        write_all(fd, buf[:n])
                        written += n
                    os.fsync(fd)
                except OSError as exc:
                    raise dest_error(exc, dest_path) from None
                finally:
                    os.close(fd)
                try:
                    if replace:
                        os.replace(tmp, dest_path)
                    else:
                        _place_new(tmp, dest_path)
                    fsync_dir(directory)
                except OSError as exc:
                    raise dest_error(exc, dest_path) from None
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return written

    def verify(self, digest: str) -> VerifyState:
        """Re-hash the stored bytes: "ok", "missing" or "corrupt"."""
        try:
            with self.read(digest) as reader:
                buf = memoryview(bytearray(CHUNK_SIZE))
                while reader.readinto(buf):
                    pass
        except DatabaseCorrupt as exc:
            return "missing" if exc.code == "artifact_missing" else "corrupt"
        return "ok"

    def refuse_linked_layout(self) -> None:
        """Before deleting what `iter_objects` lists (gc, a store's removal): `objects/` or
        `objects/sha256` as a link to a directory elsewhere was listed through, and old
        files there deleted (a linked fan-out directory below is never listed). Reading
        through such a link is left alone."""
        for directory in (os.path.dirname(self.objects_dir), self.objects_dir):
            if os.path.islink(directory):
                raise StorageUnavailable(
                    "artifact_store_unavailable", f"artifact store {self.root!r}: "
                    f"{os.path.relpath(directory, self.root)} is a symbolic link; objects are "
                    "never deleted through one (nothing outside the store is ever deleted): "
                    "put the directory itself there", root=self.root)

    def verify_all(self) -> Iterator[tuple[str, VerifyState]]:
        """(digest, state) for every object in the store."""
        for digest, _size, _mtime in self.iter_objects():
            yield digest, self.verify(digest)

    def exists(self, digest: str) -> bool:
        return os.path.isfile(self.path_of(digest))

    def size(self, digest: str) -> int:
        path = self.path_of(digest)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise missing(digest, path) from None
        return st.st_size

    def iter_objects(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size, mtime) of every object, in digest order. Files that are not where
        their name says (stray files) are not objects and are skipped. No store there: none;
        a store that cannot be listed (its root a regular file, no permission) is
        `artifact_store_unavailable`. Callers that tell "no store there" apart (gc, get,
        verify, backup, a stage: a root that is a regular file is a mistyped path, exit 2)
        look with `present()` before they list."""
        def listed(path: str) -> list[str]:
            try:
                return sorted_dirs(path, 2)
            except OSError as exc:
                raise store_error(exc, self.root, "listing its objects") from None

        for level1 in listed(self.objects_dir):
            for level2 in listed(os.path.join(self.objects_dir, level1)):
                directory = os.path.join(self.objects_dir, level1, level2)
                try:
                    entries = sorted(os.scandir(directory), key=lambda e: e.name)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise store_error(exc, self.root, "listing its objects") from None
                for entry in entries:
                    name = entry.name
                    if (HEX_DIGITS.fullmatch(name) and name[:2] == level1 and name[2:4] == level2
                            and entry.is_file(follow_symlinks=False)):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:  # removed meanwhile
                            continue
                        yield format_digest(name), st.st_size, st.st_mtime

    def remove(self, digest: str) -> bool:
        """Delete the object; False if there was none. The caller decides that nothing
        references it (that is the database side's job)."""
        path = self.path_of(digest)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise store_error(exc, self.root, f"removing {digest}") from None
        fsync_dir(os.path.dirname(path))
        return True

    def clean_temp(self, older_than_s: float, *, dry_run: bool = False) -> dict[str, int]:
        """Remove temporary files left by interrupted uploads: only those last written more
        than `older_than_s` seconds ago and not locked by a live upload. `dry_run`: count
        what would be removed, remove nothing."""
        if isinstance(older_than_s, bool) or not older_than_s >= 0:
            raise InvalidInput("invalid_input",
                               f"the grace must be >= 0 seconds, not {older_than_s!r}")
        counts = {"removed": 0, "bytes_removed": 0, "kept_young": 0, "kept_in_flight": 0}
        try:
            # O_NOFOLLOW, and every step below relative to this descriptor: a link in tmp/'s
            # place (or swapped in meanwhile) is never followed, so nothing outside the
            # store is ever deleted, as a linked fan-out directory under objects/ is not
            # listed. Such a tmp/ is left as it is, nothing in it counted.
            dir_fd = os.open(self.tmp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                             | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return counts
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return counts
            raise store_error(exc, self.root, "listing temporary files") from None
        try:
            return self._clean_temp_in(dir_fd, older_than_s, dry_run, counts)
        finally:
            os.close(dir_fd)

    def _clean_temp_in(self, dir_fd: int, older_than_s: float, dry_run: bool,
                       counts: dict[str, int]) -> dict[str, int]:
        try:
            with os.scandir(dir_fd) as listing:
                entries = list(listing)
        except OSError as exc:
            raise store_error(exc, self.root, "listing temporary files") from None
        now = time.time()
        for entry in entries:
            if not entry.name.endswith(TEMP_SUFFIX) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if now - st.st_mtime < older_than_s:
                    counts["kept_young"] += 1
                    continue
                fd = os.open(entry.name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW,
                             dir_fd=dir_fd)
            except FileNotFoundError:  # the upload finished meanwhile
                continue
            except OSError as exc:
                raise store_error(exc, self.root, "cleaning temporary files") from None
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    counts["kept_in_flight"] += 1
                    continue
                # Still the same file at that name (not a new upload reusing it)?
                try:
                    same = os.stat(entry.name, dir_fd=dir_fd,
                                   follow_symlinks=False).st_ino == st.st_ino
                except FileNotFoundError:
                    continue
                if same:
                    try:
                        if not dry_run:
                            os.unlink(entry.name, dir_fd=dir_fd)
                    except FileNotFoundError:
                        continue
                    counts["removed"] += 1
                    counts["bytes_removed"] += st.st_size
            except OSError as exc:
                raise store_error(exc, self.root, "cleaning temporary files") from None
            finally:
                os.close(fd)
        return counts

    # --- backups ----------------------------------------------------------------------------

    def link_or_copy_into(self, other_root: str | os.PathLike[str], digest: str
                          ) -> StoredObject:
        """Put this store's object into the store at `other_root` (a backup): a hard link
        when both are on one filesystem, a copy with fsync otherwise. The result is re-hashed;
        a corrupt or missing source raises and leaves nothing in the other store."""
        hexdigest = parse_digest(digest)
        digest = format_digest(hexdigest)
        other = ObjectStore(other_root)
        other._ensure_layout()
        src = self._path(hexdigest)
        dst = other._path(hexdigest)
        if os.path.lexists(dst):
            return other._checked(digest, dst, created=False)
        if os.path.islink(src):
            # A link would put bytes outside this store into the other one.
            raise corrupt(digest, src, "a symbolic link, not a file")
        if not os.path.isfile(src):
            raise missing(digest, src)
        try:
            directory = other._make_fanout(hexdigest)
            os.link(src, dst)
            fsync_dir(directory)
        except FileExistsError:
            return other._checked(digest, dst, created=False)
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise store_error(exc, other.root, f"linking {digest}") from None
            with self.read(digest) as reader:
                return other._ingest(reader.readinto, label=src, expected_hex=hexdigest)
        try:
            return other._checked(digest, dst, created=True)
        except DatabaseCorrupt:
            # The link shares the source's (corrupt) bytes: take it out of the other store.
            with contextlib.suppress(OSError):
                os.unlink(dst)
                fsync_dir(os.path.dirname(dst))
            raise

    def _checked(self, digest: str, path: str, *, created: bool) -> StoredObject:
        state = self.verify(digest)
        if state == "missing":
            raise missing(digest, path)
        if state == "corrupt":
            raise corrupt(digest, path, "re-hashing it in the destination store failed")
        return StoredObject(digest, os.stat(path).st_size, path, created)


def _place_new(tmp: str, dest: str) -> None:
    """Give the finished file `tmp` the name `dest`, which must still be free: linked (never
    replaces a name, unlike rename(2)), then `tmp` unlinked. A filesystem without hard
    links is looked at first and renamed: a file appearing between the two is replaced."""
    try:
        os.link(tmp, dest)
    except FileExistsError:
        raise InvalidInput("destination_exists", f"{dest} appeared meanwhile (another "
                           "copy wrote it); nothing was written. Pass --force to replace "
                           "it", dest=dest) from None
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        if os.path.lexists(dest):
            raise InvalidInput("destination_exists", f"{dest} appeared meanwhile; nothing "
                               "was written. Pass --force to replace it", dest=dest) from None
        os.rename(tmp, dest)
        return
    os.unlink(tmp)
