"""How an idle worker on SQLite waits for another connection's commit: `PRAGMA data_version`,
woken by an inotify watch of the -wal file where Linux offers one."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from urllib.parse import quote

from .sources import ChangeWaiter

#: How often an idle worker reads `PRAGMA data_version` when it has no file notification:
#: a few microseconds each; the wake-up around it costs more, so not more often.
DATA_VERSION_EVERY_S = 0.01
#: With a file notification, data_version is still read this often, in case a commit ever
#: went unnoticed (the -wal file replaced under the watch).
DATA_VERSION_SAFETY_S = 0.25
#: After a write to the -wal file, data_version is read this often for this long: the
#: commit becomes visible once its sync (synchronous=FULL) is done.
AFTER_WRITE_EVERY_S, AFTER_WRITE_WINDOW_S = 0.001, 0.2
#: Longest a wait goes without looking at its interrupt (a signal, a finished job).
WAIT_SLICE_S = 0.1


class DataVersionWaiter(ChangeWaiter):
    """Wakes when another connection (any process) commits to the file: `PRAGMA
    data_version` on a connection of its own changes then. Every commit appends to the -wal
    file, so on Linux the wait blocks on an inotify watch of it (no CPU while idle) and reads
    data_version when it fires; elsewhere, or without the -wal file yet, it reads
    data_version every DATA_VERSION_EVERY_S. The claim's own refusal record writes nothing
    while it repeats (see RECORD_REFUSAL), so an idle worker does not wake itself. Without
    the file it falls back to the plain poll."""

    mode = "data_version"

    def __init__(self, path: str, busy_timeout: float,
                 every_s: float = DATA_VERSION_EVERY_S) -> None:
        self.every_s = every_s
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._watch: int | None = None
        try:
            self._conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True,
                                         timeout=busy_timeout, isolation_level=None,
                                         check_same_thread=False)
            self._version = self._read()
        except sqlite3.Error:
            self.close()
            return
        self._watch_wal()

    def _watch_wal(self) -> None:
        self._watch = _inotify_watch(self._path + "-wal")
        if self._watch is not None:
            self.mode = "wal_notify"

    def _read(self) -> int:
        assert self._conn is not None
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float, interrupt: threading.Event) -> bool:
        if self._conn is None:
            return interrupt.wait(timeout)
        end = time.monotonic() + timeout
        if self._watch is None and os.path.exists(self._path + "-wal"):
            self._watch_wal()
        next_read = fast_until = 0.0
        while True:
            now = time.monotonic()
            if now >= next_read:
                try:
                    version = self._read()
                except sqlite3.Error:
                    self.close()  # the poll from here on
                    return interrupt.wait(max(0.0, end - time.monotonic()))
                if version != self._version:
                    # Compared with the last reading, taken before the claim that found
                    # nothing: a commit made since that claim began is never missed.
                    self._version = version
                    return True
                next_read = now + (self.every_s if self._watch is None
                                   else AFTER_WRITE_EVERY_S if now < fast_until
                                   else DATA_VERSION_SAFETY_S)
            left = end - now
            if left <= 0:
                return False
            if interrupt.is_set():
                return True
            slice_s = min(left, WAIT_SLICE_S, max(0.0, next_read - now))
            if self._watch is None:
                time.sleep(slice_s)
            elif _inotify_wait(self._watch, slice_s):
                # The -wal file was written. A commit's last write comes before its sync
                # and the wal-index update that data_version reads: read it now, then often
                # for a short while, until the commit shows.
                next_read, fast_until = 0.0, time.monotonic() + AFTER_WRITE_WINDOW_S

    def close(self) -> None:
        if self._watch is not None:
            with contextlib.suppress(OSError):
                os.close(self._watch)
        self._watch = None
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None
        self.mode = "poll"


_IN_MODIFY, _IN_ATTRIB, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x2, 0x4, 0x400, 0x800
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000


def _inotify_watch(path: str) -> int | None:
    """An inotify descriptor watching `path` for writes (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    mask = _IN_MODIFY | _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF
    if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
        os.close(fd)
        return None
    return int(fd)


def _inotify_wait(fd: int, timeout: float) -> bool:
    """Block up to `timeout` for an event on the watch; drain it. True if one came."""
    import select

    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return False
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass
    return True
