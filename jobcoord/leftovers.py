"""Temporary files a process killed outright leaves behind, and how a later one tells them
from the files of a process still alive.

A worker's command files (its artifacts directory, its checkpoints file) and a server's
download copies live in the temporary directory and are removed when their run ends; a
process killed by SIGKILL (the OOM killer) cannot remove them, and they may be gigabytes.
A starting process removes them (`sweep`). Each such entry is held, while its owner lives,
by an exclusive `flock` on an open descriptor of it (`hold`): the kernel drops the lock
when the owner dies, however it dies, and a lock means the same in every PID namespace
sharing the directory (a container sharing /tmp with the host), which a PID does not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import time
from collections.abc import Callable

#: The random part of a tempfile.mkdtemp / mkstemp name.
RANDOM = r"[a-z0-9_]{8}"
#: An unheld entry this young whose owner is alive may not be locked yet: left.
YOUNG_S = 60.0


def hold(path: str) -> int | None:
    """An open descriptor of `path` (a file or a directory) with an exclusive flock on it,
    kept until the caller closes it (not inherited by child processes). None when it
    cannot be taken: the entry is then only swept once its owner's PID is gone here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(fds: list[int]) -> None:
    """Close the descriptors `hold` gave (their locks go with them)."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


def pid_alive(found: re.Match[str]) -> bool:
    """Whether the PID an entry's name holds (its group `pid`) is alive here, or not ours to
    judge: a young entry of a live owner may not be locked yet."""
    try:
        os.kill(int(found.group("pid")), 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # another user's process, or a PID no process can have
    return True  # alive, or the PID was reused: left, the safe way


def sweep(directory: str, pattern: re.Pattern[str],
          alive: Callable[[re.Match[str]], bool] = lambda _m: False) -> int:
    """Remove the entries of `directory` whose whole name matches `pattern` (its group
    `dir` matched: a directory of mode 0700, else a regular file of mode 0600, as
    tempfile makes them), owned by this user, that no live process holds (`hold`). The
    lock decides, not a PID (a killed container worker's PID 1 is always alive on the
    host): only an entry younger than YOUNG_S whose owner `alive` vouches for is left
    unheld (made a moment before its owner took the lock). A user's own file that merely
    looks like one is left: its name, type or mode differs. Returns how many were
    removed."""
    removed = 0
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        if found is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            is_dir = found.groupdict().get("dir") is not None
            kind_ok = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
            if (st.st_uid != os.getuid() or not kind_ok
                    or stat.S_IMODE(st.st_mode) != (0o700 if is_dir else 0o600)
                    or (now - st.st_mtime < YOUNG_S and alive(found))):
                continue
        except (OSError, ValueError, OverflowError):
            continue
        fd = hold(entry.path)
        if fd is None:
            continue  # its owner lives (in this PID namespace or another)
        try:
            if is_dir:
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        finally:
            os.close(fd)
        removed += 1
    return removed


def is_real_directory(path: str) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_outdir(directory: str) -> None:
    """Remove a command's artifacts directory, or what the command left in its place (a
    link, a file): rmtree refuses a link and a file, and they were left for ever."""
    if is_real_directory(directory):
        shutil.rmtree(directory, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(directory)
