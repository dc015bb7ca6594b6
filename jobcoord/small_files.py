"""Reading the small files a command is pointed at (a policy, a token file) without hanging.

A FIFO opened for reading blocks until some process opens it for writing, which may be
never, and a read blocks until its writer writes or closes, which may be never too: a file
that is not a regular one is opened and read without blocking, and the whole read, from
the open to the end of the file, is given `wait_s` (5 s). A writer that has not finished by
then (none came, or it wrote part and keeps the pipe open) gets the read refused
(TimeoutError). A pipe whose writer writes and closes (`--token-file <(pass show
jobcoord)`) is read as a file is."""

from __future__ import annotations

import errno
import os
import select
import stat
import time


def read_small(path: str, limit: int, wait_s: float = 5.0, *, regular_only: bool = False
               ) -> tuple[bytes, bool]:
    """At most `limit` + 1 bytes of `path` (the caller refuses more), and whether it is a
    regular file. OSError as open() raises it (IsADirectoryError for a directory), and
    TimeoutError when a file that is not a regular one was not read to its end within
    `wait_s`. With `regular_only`, a file that is not a regular one is refused unread
    (OSError): one that is read again by its path (a certificate) cannot be a pipe."""
    deadline = time.monotonic() + wait_s
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        regular = stat.S_ISREG(mode)
        if regular_only and not regular:
            raise OSError(errno.EINVAL, "not a regular file", path)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            if not regular:
                # Wait for data or the writer's close, never past the deadline. A named pipe
                # whose writer has not opened it yet answers only once one has written or
                # closed (before that, a read would say end of file).
                wait_ms = (deadline - time.monotonic()) * 1000
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                if wait_ms <= 0 or not poller.poll(max(1, int(wait_ms))):
                    raise TimeoutError(errno.ETIMEDOUT, "not a regular file, and it was not "
                                       f"written to its end within {wait_s:g} s", path)
            try:
                chunk = os.read(fd, min(left, 1 << 16))
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), regular
    finally:
        os.close(fd)


#: Largest certificate or key file read (a chain of a few certificates is some KiB).
MAX_PEM_FILE = 1 << 20


def read_pem(path: str, option: str, *, key: bool = False) -> bytes:
    """The PEM text of the certificate (or, with `key`, the private key) file `path` given
    as `option`, checked before anything uses it: a regular file (the TLS library and a
    remote worker's commands read it again by its path, which a pipe would not give twice),
    at most MAX_PEM_FILE bytes, holding a PEM block of its kind. InvalidInput naming the
    option and the file otherwise."""
    from .errors import InvalidInput

    try:
        data, _ = read_small(path, MAX_PEM_FILE, regular_only=True)
    except OSError as e:
        raise InvalidInput("invalid_input", f"{option} {path}: cannot read it: "
                           f"{e.strerror}") from None
    if len(data) > MAX_PEM_FILE:
        raise InvalidInput("invalid_input", f"{option} {path}: larger than {MAX_PEM_FILE} "
                           "bytes, not a certificate or key file")
    marker = b"PRIVATE KEY-----" if key else b"-----BEGIN CERTIFICATE-----"
    if b"-----BEGIN" not in data or marker not in data:
        what = "private key" if key else "certificate"
        raise InvalidInput("invalid_input", f"{option} {path}: not PEM {what} (no "
                           f"{marker.decode()!r} line)")
    return data
