"""The content-addressed object store: artifact bytes on disk, named by their SHA-256.

Layout under the store root:

    objects/sha256/<2 hex>/<2 hex>/<64 hex>   one file per distinct content, read-only
    tmp/<pid>-<random>.tmp                    uploads in flight (or left by a killed one)

Write path (`put`): stream the source in 1 MiB chunks through hashlib into a new temporary
file (O_CREAT|O_EXCL, mode 0600, flock'ed while in flight), fsync it, then give it its final
name with link(2), which never replaces an existing name (identical content is stored once and
an object is never overwritten), remove the temporary name and fsync the object's directory.
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
import re
import secrets
import stat
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

from jobcoord.errors import DatabaseCorrupt, InvalidInput, StorageUnavailable

ALGORITHM = "sha256"
#: Bytes per read and write. Memory per put or read is about one chunk, whatever the size.
CHUNK_SIZE = 1 << 20
MAX_NAME_BYTES = 255
TEMP_SUFFIX = ".tmp"

_HEX = re.compile(r"[0-9a-f]{64}")
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# link(2) refused by the filesystem itself (not by a name that exists): fall back to rename
# or to a copy.
_NO_LINK = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV})

Source = str | os.PathLike[str] | os.PathLike[bytes] | bytes | bytearray | memoryview | IO[bytes]
VerifyState = Literal["ok", "missing", "corrupt"]
Fill = Callable[[memoryview], int]


# --- digests and names ----------------------------------------------------------------------


def parse_digest(digest: object) -> str:
    """The 64 lowercase hex digits of a `sha256:<hex>` digest; InvalidInput otherwise."""
    if isinstance(digest, str):
        algorithm, sep, hexdigest = digest.partition(":")
        if sep and algorithm == ALGORITHM and _HEX.fullmatch(hexdigest):
            return hexdigest
    raise InvalidInput("invalid_digest",
                       f"not a digest: {ascii(digest)[:100]} (expected sha256:<64 lowercase hex>)",
                       digest=ascii(digest)[:100])


def format_digest(hexdigest: str) -> str:
    return f"{ALGORITHM}:{hexdigest}"


def validate_name(name: object) -> str:
    """An artifact name, unchanged, or InvalidInput `invalid_artifact_name`.

    A name is one path component on every platform the artifact may be written to: not empty,
    not "." or "..", no "/" or "\\", no NUL or other control character, valid UTF-8 (no lone
    surrogates) of at most 255 bytes (the usual file-name limit)."""

    def refuse(why: str) -> InvalidInput:
        shown = ascii(name)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return InvalidInput("invalid_artifact_name", f"invalid artifact name {shown}: {why}",
                            name=shown)

    if not isinstance(name, str):
        raise refuse("a name is a string")
    if name == "":
        raise refuse("it is empty")
    if name in (".", ".."):
        raise refuse("'.' and '..' name directories")
    if "/" in name or "\\" in name:
        raise refuse("it contains a path separator ('/' or '\\')")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise refuse("it contains a lone surrogate (not valid UTF-8)") from None
    for ch in name:
        if unicodedata.category(ch) == "Cc":  # C0 and C1 controls, NUL and DEL included
            raise refuse(f"it contains the control character U+{ord(ch):04X}")
    if len(encoded) > MAX_NAME_BYTES:
        raise refuse(f"it is {len(encoded)} bytes in UTF-8, over {MAX_NAME_BYTES}")
    return name


# --- results and errors ---------------------------------------------------------------------


@dataclass(frozen=True)
class StoredObject:
    digest: str  # sha256:<hex>
    size: int
    path: str
    created: bool  # False: the same content was already stored


def _store_error(exc: OSError, root: str, doing: str) -> StorageUnavailable:
    if exc.errno in _FULL:
        return StorageUnavailable("artifact_store_full",
                                  f"artifact store {root!r} is full while {doing}: {exc.strerror}",
                                  root=root, errno=errno.errorcode.get(exc.errno or 0))
    return StorageUnavailable("artifact_store_unavailable",
                              f"artifact store {root!r} cannot be written while {doing}: "
                              f"{exc.strerror or exc}", root=root,
                              errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def _missing(digest: str, path: str) -> DatabaseCorrupt:
    return DatabaseCorrupt("artifact_missing", f"artifact object {digest} is missing ({path})",
                           digest=digest, path=path)


def _corrupt(digest: str, path: str, why: str) -> DatabaseCorrupt:
    return DatabaseCorrupt("artifact_corrupt", f"artifact object {digest} is corrupt: {why}",
                           digest=digest, path=path)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: str) -> bool:
    """Create one directory level; True if this call created it (its parent then needs an
    fsync for the new entry to survive a power cut)."""
    try:
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory",
                                     path) from None
        return False


# --- sources --------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_source(source: Source) -> Iterator[tuple[Fill, str]]:
    """A `fill(buffer) -> bytes read` function over the source, and a label naming it.

    Every error of the source itself (missing, a directory, unreadable, a read that fails) is
    InvalidInput `invalid_input` naming it, so that the store's own errors stay apart."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = memoryview(source).cast("B")
        pos = 0

        def fill_bytes(buf: memoryview) -> int:
            nonlocal pos
            n = min(len(buf), len(data) - pos)
            buf[:n] = data[pos:pos + n]
            pos += n
            return n

        yield fill_bytes, f"<{len(data)} bytes>"
        return

    if isinstance(source, str | os.PathLike):
        label = os.fsdecode(source)
        try:
            f = open(source, "rb", buffering=0)  # noqa: SIM115 - closed below
        except IsADirectoryError:
            raise InvalidInput("invalid_input", f"source {label!r} is a directory, not a file",
                               source=label) from None
        except FileNotFoundError:
            raise InvalidInput("invalid_input", f"source {label!r} does not exist",
                               source=label) from None
        except OSError as exc:
            raise InvalidInput("invalid_input",
                               f"source {label!r} cannot be opened: {exc.strerror or exc}",
                               source=label) from None
        try:
            yield _fill_from(f, label), label
        finally:
            f.close()
        return

    if hasattr(source, "read"):
        label = str(getattr(source, "name", None) or f"<{type(source).__name__}>")
        yield _fill_from(source, label), label
        return

    raise InvalidInput("invalid_input", f"cannot store a {type(source).__name__}: give a path, "
                       "bytes or a binary file object", source=type(source).__name__)


def _fill_from(f: Any, label: str) -> Fill:
    readinto = getattr(f, "readinto", None)

    def fill(buf: memoryview) -> int:
        try:
            if readinto is not None:
                n = readinto(buf)
            else:
                data = f.read(len(buf))
                if isinstance(data, str):
                    raise InvalidInput("invalid_input",
                                       f"source {label!r} is open in text mode; open it 'rb'",
                                       source=label)
                n = len(data)
                buf[:n] = data
        except OSError as exc:
            raise InvalidInput("invalid_input",
                               f"source {label!r} cannot be read: {exc.strerror or exc}",
                               source=label) from None
        except TypeError as exc:  # e.g. readinto of a text stream
            raise InvalidInput("invalid_input", f"source {label!r} is not a binary stream: {exc}",
                               source=label) from None
        if n is None:
            raise InvalidInput("invalid_input", f"source {label!r} is non-blocking; give a "
                               "blocking stream", source=label)
        return int(n)

    return fill


# --- reading --------------------------------------------------------------------------------


class ObjectReader:
    """A verified stream of one object's bytes.

    Iterate for chunks (or call `readinto`); the bytes are hashed as they go and, at the end,
    a size or digest mismatch raises DatabaseCorrupt `artifact_corrupt`. A consumer that must
    not act on unverified bytes writes them somewhere temporary first (as `copy_to` does)."""

    def __init__(self, path: str, hexdigest: str, root: str,
                 expected_size: int | None = None) -> None:
        self.digest = format_digest(hexdigest)
        self.path = path
        self._hex = hexdigest
        self._root = root
        self._expected_size = expected_size
        self._hash = hashlib.sha256()
        self._read = 0
        self._done = False
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise _missing(self.digest, path) from None
        except OSError as exc:
            raise _store_error(exc, root, f"opening {self.digest}") from None
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise _corrupt(self.digest, path, "not a regular file")
        except BaseException:
            os.close(self._fd)
            raise
        #: Size on disk when opened (unverified until the stream ends).
        self.size = st.st_size

    def readinto(self, buf: memoryview) -> int:
        if self._done:
            return 0
        try:
            n = os.readv(self._fd, [buf])
        except OSError as exc:
            self.close()
            raise _store_error(exc, self._root, f"reading {self.digest}") from None
        if n == 0:
            self._finish()
            return 0
        self._hash.update(buf[:n])
        self._read += n
        return n

    def _finish(self) -> None:
        self.close()
        if self._expected_size is not None and self._read != self._expected_size:
            raise _corrupt(self.digest, self.path,
                           f"{self._read} bytes, expected {self._expected_size}")
        actual = self._hash.hexdigest()
        if actual != self._hex:
            raise _corrupt(self.digest, self.path, f"its bytes hash to sha256:{actual}")

    def __iter__(self) -> Iterator[bytes]:
        buf = bytearray(CHUNK_SIZE)
        view = memoryview(buf)
        while True:
            n = self.readinto(view)
            if n == 0:
                return
            yield bytes(view[:n])

    def close(self) -> None:
        if not self._done:
            self._done = True
            os.close(self._fd)

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the store ------------------------------------------------------------------------------


class ObjectStore:
    """Content-addressed objects under `root` (created on the first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.objects_dir = os.path.join(self.root, "objects", ALGORITHM)
        self.tmp_dir = os.path.join(self.root, "tmp")

    def __repr__(self) -> str:
        return f"ObjectStore({self.root!r})"

    def path_of(self, digest: str) -> str:
        """Where the object of `digest` lives (whether or not it exists)."""
        return self._path(parse_digest(digest))

    def _path(self, hexdigest: str) -> str:
        return os.path.join(self.objects_dir, hexdigest[:2], hexdigest[2:4], hexdigest)

    def _ensure_layout(self) -> None:
        """Create root, objects/sha256 and tmp if needed, each new entry made durable."""
        try:
            missing = []
            path = self.root
            while not os.path.isdir(path) and os.path.dirname(path) != path:
                missing.append(path)
                path = os.path.dirname(path)
            for directory in reversed(missing):  # outermost first, each entry made durable
                if _mkdir(directory):
                    _fsync_dir(os.path.dirname(directory))
            for parent, child in ((self.root, "objects"), (self.root, "tmp"),
                                  (os.path.join(self.root, "objects"), ALGORITHM)):
                if _mkdir(os.path.join(parent, child)):
                    _fsync_dir(parent)
        except OSError as exc:
            raise _store_error(exc, self.root, "creating the store directories") from None

    def _make_fanout(self, hexdigest: str) -> str:
        """Create objects/sha256/ab/cd as needed; fsync the parent of each new level."""
        level1 = os.path.join(self.objects_dir, hexdigest[:2])
        level2 = os.path.join(level1, hexdigest[2:4])
        if _mkdir(level1):
            _fsync_dir(self.objects_dir)
        if _mkdir(level2):
            _fsync_dir(level1)
        return level2

    # --- writing ----------------------------------------------------------------------------

    def put(self, source: Source, *, max_bytes: int | None = None,
            expected_digest: str | None = None) -> StoredObject:
        """Store the bytes of `source` (a path, bytes, or a binary file object read to its
        end) and return their object. Identical content is stored once (`created=False`).
        With `expected_digest`, bytes that hash to anything else are refused
        (InvalidInput `artifact_invalid`) and nothing is stored."""
        if max_bytes is not None and (isinstance(max_bytes, bool) or max_bytes < 0):
            raise InvalidInput("invalid_input", f"max_bytes must be >= 0, not {max_bytes!r}")
        expected = None if expected_digest is None else parse_digest(expected_digest)

        def mismatch(label: str, actual: str) -> InvalidInput:
            return InvalidInput("artifact_invalid", f"{label} hashes to sha256:{actual}, not "
                                f"the expected {expected_digest}; nothing was stored",
                                expected=expected_digest, actual=format_digest(actual))

        with _open_source(source) as (fill, label):
            self._ensure_layout()
            return self._ingest(fill, label=label, max_bytes=max_bytes, expected_hex=expected,
                                mismatch=mismatch)

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
                    _write_all(fd, chunk)
                hexdigest = hasher.hexdigest()
                if expected_hex is not None and hexdigest != expected_hex:
                    if mismatch is not None:  # the caller's expectation, not the store's
                        raise mismatch(label, hexdigest)
                    raise _corrupt(format_digest(expected_hex), label,
                                   f"its bytes hash to sha256:{hexdigest}")
                os.fchmod(fd, 0o400)  # objects are immutable
                os.fsync(fd)
                path = self._path(hexdigest)
                created = self._place(tmp, path, hexdigest)
            except OSError as exc:
                raise _store_error(exc, self.root, f"storing {label}") from None
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
                raise _store_error(exc, self.root, "creating a temporary file") from None
        raise StorageUnavailable("artifact_store_unavailable",
                                 f"cannot create a unique temporary file in {self.tmp_dir!r}")

    def _place(self, tmp: str, path: str, hexdigest: str) -> bool:
        """Give the fsynced temporary file its final name unless that name exists; fsync the
        object's directory either way (a concurrent put that created it may not have yet)."""
        directory = self._make_fanout(hexdigest)
        try:
            os.link(tmp, path)  # never replaces an existing name, unlike rename(2)
            created = True
        except FileExistsError:
            created = False
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            # A filesystem without hard links: rename. Between the check and the rename a
            # concurrent put of the same content may land first; the rename then replaces it
            # with identical, fully written bytes.
            created = not os.path.exists(path)
            if created:
                os.rename(tmp, path)
        _fsync_dir(directory)
        return created

    # --- reading ----------------------------------------------------------------------------

    def read(self, digest: str, *, expected_size: int | None = None) -> ObjectReader:
        """A verified stream of the object's bytes; DatabaseCorrupt `artifact_missing` now if
        there is no object, `artifact_corrupt` at the end of the stream on a mismatch."""
        hexdigest = parse_digest(digest)
        return ObjectReader(self._path(hexdigest), hexdigest, self.root, expected_size)

    def copy_to(self, digest: str, dest: str | os.PathLike[str], *,
                expected_size: int | None = None) -> int:
        """Write the object to `dest` (replacing a file there) only once its size and hash
        matched; on any failure nothing is written at `dest` and no temporary file is left.
        Returns the number of bytes written."""
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
                raise InvalidInput("invalid_input", f"destination directory {directory!r} "
                                   "does not exist", dest=dest_path) from None
            except OSError as exc:
                raise _dest_error(exc, dest_path) from None
            try:
                buf = memoryview(bytearray(CHUNK_SIZE))
                written = 0
                try:
                    while True:
                        n = reader.readinto(buf)  # raises artifact_corrupt at the end
                        if n == 0:
                            break
                        _write_all(fd, buf[:n])
                        written += n
                    os.fsync(fd)
                except OSError as exc:
                    raise _dest_error(exc, dest_path) from None
                finally:
                    os.close(fd)
                try:
                    os.replace(tmp, dest_path)
                    _fsync_dir(directory)
                except OSError as exc:
                    raise _dest_error(exc, dest_path) from None
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
            raise _missing(digest, path) from None
        return st.st_size

    def iter_objects(self) -> Iterator[tuple[str, int, float]]:
        """(digest, size, mtime) of every object, in digest order. Files that are not where
        their name says (stray files) are not objects and are skipped."""
        for level1 in _sorted_dirs(self.objects_dir, 2):
            for level2 in _sorted_dirs(os.path.join(self.objects_dir, level1), 2):
                directory = os.path.join(self.objects_dir, level1, level2)
                try:
                    entries = sorted(os.scandir(directory), key=lambda e: e.name)
                except FileNotFoundError:
                    continue
                for entry in entries:
                    name = entry.name
                    if (_HEX.fullmatch(name) and name[:2] == level1 and name[2:4] == level2
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
            raise _store_error(exc, self.root, f"removing {digest}") from None
        _fsync_dir(os.path.dirname(path))
        return True

    def clean_temp(self, older_than_s: float) -> dict[str, int]:
        """Remove temporary files left by interrupted uploads: only those last written more
        than `older_than_s` seconds ago and not locked by a live upload."""
        if isinstance(older_than_s, bool) or not older_than_s >= 0:
            raise InvalidInput("invalid_input",
                               f"the grace must be >= 0 seconds, not {older_than_s!r}")
        counts = {"removed": 0, "bytes_removed": 0, "kept_young": 0, "kept_in_flight": 0}
        try:
            entries = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            return counts
        except OSError as exc:
            raise _store_error(exc, self.root, "listing temporary files") from None
        now = time.time()
        for entry in entries:
            if not entry.name.endswith(TEMP_SUFFIX) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if now - st.st_mtime < older_than_s:
                    counts["kept_young"] += 1
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:  # the upload finished meanwhile
                continue
            except OSError as exc:
                raise _store_error(exc, self.root, "cleaning temporary files") from None
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    counts["kept_in_flight"] += 1
                    continue
                # Still the same file at that name (not a new upload reusing it)?
                try:
                    same = os.stat(entry.path, follow_symlinks=False).st_ino == st.st_ino
                except FileNotFoundError:
                    continue
                if same:
                    try:
                        os.unlink(entry.path)
                    except FileNotFoundError:
                        continue
                    counts["removed"] += 1
                    counts["bytes_removed"] += st.st_size
            except OSError as exc:
                raise _store_error(exc, self.root, "cleaning temporary files") from None
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
        if not os.path.isfile(src):
            raise _missing(digest, src)
        try:
            directory = other._make_fanout(hexdigest)
            os.link(src, dst)
            _fsync_dir(directory)
        except FileExistsError:
            return other._checked(digest, dst, created=False)
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise _store_error(exc, other.root, f"linking {digest}") from None
            with self.read(digest) as reader:
                return other._ingest(reader.readinto, label=src, expected_hex=hexdigest)
        try:
            return other._checked(digest, dst, created=True)
        except DatabaseCorrupt:
            # The link shares the source's (corrupt) bytes: take it out of the other store.
            with contextlib.suppress(OSError):
                os.unlink(dst)
                _fsync_dir(os.path.dirname(dst))
            raise

    def _checked(self, digest: str, path: str, *, created: bool) -> StoredObject:
        state = self.verify(digest)
        if state == "missing":
            raise _missing(digest, path)
        if state == "corrupt":
            raise _corrupt(digest, path, "re-hashing it in the destination store failed")
        return StoredObject(digest, os.stat(path).st_size, path, created)


def _dest_error(exc: OSError, dest: str) -> StorageUnavailable:
    full = exc.errno in _FULL
    return StorageUnavailable("destination_full" if full else "destination_unavailable",
                              f"cannot write {dest!r}: {exc.strerror or exc}", dest=dest,
                              errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def _sorted_dirs(path: str, width: int) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path)
                      if len(e.name) == width and e.is_dir(follow_symlinks=False)
                      and all(c in "0123456789abcdef" for c in e.name))
    except FileNotFoundError:
        return []
