"""The object store's file-system steps: stored-object results, its errors, writing and
syncing, the sources a put reads from, and the reader that re-hashes what it returns."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

from jobcoord.artifacts.names import format_digest
from jobcoord.errors import DatabaseCorrupt, InvalidInput, StorageUnavailable

#: Bytes per read and write. Memory per put or read is about one chunk, whatever the size.
CHUNK_SIZE = 1 << 20
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

Source = str | os.PathLike[str] | os.PathLike[bytes] | bytes | bytearray | memoryview | IO[bytes]
VerifyState = Literal["ok", "missing", "corrupt"]
Fill = Callable[[memoryview], int]


# --- results and errors ---------------------------------------------------------------------


@dataclass(frozen=True)
class StoredObject:
    digest: str  # sha256:<hex>
    size: int
    path: str
    created: bool  # False: the same content was already stored


class NotRegularFile(OSError):
    """What `open_regular` found is no regular file (a fifo, a device, a directory)."""


def open_regular(path: str, flags: int, mode: int = 0o600) -> int:
    """`os.open(path, flags)` without ever waiting, keeping only a regular file: anything
    else is closed and refused (NotRegularFile, errno EINVAL). A fifo opened read-only
    waited for a writer for ever (a manifest or a lock file in its place hung restore,
    backup and gc)."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"{path} is not a regular file")
    return fd


def store_error(exc: OSError, root: str, doing: str) -> StorageUnavailable:
    if exc.errno in _FULL:
        return StorageUnavailable("artifact_store_full",
                                  f"artifact store {root!r} is full while {doing}: {exc.strerror}",
                                  root=root, errno=errno.errorcode.get(exc.errno or 0))
    return StorageUnavailable("artifact_store_unavailable",
                              f"artifact store {root!r} cannot be used while {doing}: "
                              f"{exc.strerror or exc}", root=root,
                              errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def missing(digest: str, path: str) -> DatabaseCorrupt:
    return DatabaseCorrupt("artifact_missing", f"artifact object {digest} is missing ({path})",
                           digest=digest, path=path)


def corrupt(digest: str, path: str, why: str) -> DatabaseCorrupt:
    return DatabaseCorrupt("artifact_corrupt", f"artifact object {digest} is corrupt: {why}",
                           digest=digest, path=path)


def flock_within(fd: int, mode: int, wait_s: float, busy: Callable[[], Exception],
                 poll_s: float = 0.01) -> None:
    """Take flock `mode` on `fd`, waiting at most `wait_s` (polled: a blocking flock cannot
    be given a deadline); past it, raise what `busy()` makes."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise busy() from None
            time.sleep(poll_s)


def write_all(fd: int, view: memoryview) -> None:
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_once(path: str) -> bool:
    """Create one directory level; True if this call created it (its parent then needs an
    fsync for the new entry to survive a power cut)."""
    try:
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        if not os.path.isdir(path):
            if not os.path.exists(path):  # a link to nothing: a volume not mounted?
                raise FileNotFoundError(errno.ENOENT, f"{path} is a link to nothing (is its "
                                        "volume not mounted?)") from None
            raise NotADirectoryError(errno.ENOTDIR, f"{path} exists and is not a directory"
                                     ) from None
        return False


# --- sources --------------------------------------------------------------------------------


@contextlib.contextmanager
def open_source(source: Source) -> Iterator[tuple[Fill, str]]:
    """A `fill(buffer) -> bytes read` function over the source, and a label naming it.

    Every error of the source itself (missing, a directory, unreadable, a read that fails) is
    InvalidInput `invalid_input` naming it, so that the store's own errors stay apart."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = memoryview(source)
        if not data.c_contiguous:  # a view with gaps (view[::2]): the bytes it shows
            data = memoryview(data.tobytes())
        data = data.cast("B")
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
        except ValueError:
            # A NUL, or a lone surrogate no file name can be encoded from: no path at all
            # (ValueError and UnicodeEncodeError escaped the API otherwise).
            raise InvalidInput("invalid_input", f"source {label!a} is not a file "
                               "name (a NUL or a lone surrogate in it)",
                               source=ascii(label)) from None
        try:
            yield fill_from(f, label), label
        finally:
            f.close()
        return

    if hasattr(source, "read"):
        label = str(getattr(source, "name", None) or f"<{type(source).__name__}>")
        yield fill_from(source, label), label
        return

    raise InvalidInput("invalid_input", f"cannot store a {type(source).__name__}: give a path, "
                       "bytes or a binary file object", source=type(source).__name__)


def fill_from(f: Any, label: str) -> Fill:
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
        except ValueError as exc:  # e.g. a closed file
            raise InvalidInput("invalid_input", f"source {label!r} cannot be read: {exc}",
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
            # O_NONBLOCK: a FIFO put in an object's place would make the open wait for a
            # writer; opened at once, fstat below refuses it. (No effect on a regular file.)
            # O_NOFOLLOW: an object is its own file, never a link to bytes elsewhere that
            # anyone may change after they were hashed.
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
                               | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            raise missing(self.digest, path) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise corrupt(self.digest, path, "a symbolic link, not a file") from None
            raise store_error(exc, root, f"opening {self.digest}") from None
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise corrupt(self.digest, path, "not a regular file")
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
            raise store_error(exc, self._root, f"reading {self.digest}") from None
        if n == 0:
            self._finish()
            return 0
        self._hash.update(buf[:n])
        self._read += n
        return n

    def _finish(self) -> None:
        self.close()
        if self._expected_size is not None and self._read != self._expected_size:
            raise corrupt(self.digest, self.path,
                           f"{self._read} bytes, expected {self._expected_size}")
        actual = self._hash.hexdigest()
        if actual != self._hex:
            raise corrupt(self.digest, self.path, f"its bytes hash to sha256:{actual}")

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




def dest_error(exc: OSError, dest: str) -> StorageUnavailable:
    full = exc.errno in _FULL
    return StorageUnavailable("destination_full" if full else "destination_unavailable",
                              f"cannot write {dest!r}: {exc.strerror or exc}", dest=dest,
                              errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def sorted_dirs(path: str, width: int) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path)
                      if len(e.name) == width and e.is_dir(follow_symlinks=False)
                      and all(c in "0123456789abcdef" for c in e.name))
    except FileNotFoundError:
        return []
