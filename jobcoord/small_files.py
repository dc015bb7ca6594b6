"""Reading the small files a command is pointed at (a policy, a token file) without hanging.

A FIFO opened for reading blocks until some process opens it for writing, which may be
never: opened non-blocking it opens at once, a writer gets a few seconds to come, and a pipe
nobody writes to reads as empty.
A pipe with a writer (`--token-file <(pass show jobcoord)`) is read as it always was."""

from __future__ import annotations

import fcntl
import os
import select
import stat


def read_small(path: str, limit: int, wait_s: float = 5.0) -> tuple[bytes, bool]:
    """At most `limit` + 1 bytes of `path` (the caller refuses more), and whether it is a
    regular file. OSError as open() raises it (IsADirectoryError for a directory)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, os.strerror(21), path)
        if stat.S_ISFIFO(mode):
            # A named pipe whose writer has not opened it yet reads as end of file: give a
            # writer `wait_s` to come (poll answers once one has written or closed).
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(int(wait_s * 1000))
        # Blocking again: a pipe's writer may not have written all of it yet; with no
        # writer at all, a read returns end of file at once.
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), stat.S_ISREG(mode)
    finally:
        os.close(fd)
