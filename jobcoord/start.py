"""The `jobcoord` command's entry point: light on purpose (nothing but the standard library
until the CLI is imported), so that a Ctrl-C while the CLI loads ends the command as a
Ctrl-C later does: `jobcoord: interrupted`, exit 130, never a traceback, and with --json
its one JSON error on stdout."""

from __future__ import annotations

# `_signal`, the C module, not `signal`: that one loads enum and more (3 ms) before Ctrl-C is
# held back.
import _signal
import sys


def main() -> None:
    _standard_streams()
    # Ctrl-C is held back while the CLI's modules load: one cut halfway (SQLAlchemy's, say)
    # cannot be loaded again in this process, and reading --json as click reads it needs
    # them. Held for those few tenths of a second, it arrives as the mask is lifted.
    hold = hasattr(_signal, "pthread_sigmask")
    if hold:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})
    if _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN:
        # Started with Ctrl-C ignored (a shell script's `jobcoord serve &`): the command takes
        # it over further on anyway (its own handlers, exit 130), so it does from here. One
        # sent while it loaded was held back, then discarded as ignored: serve served on.
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    try:
        from .cli.main import interrupted_before_parsing
        from .cli.main import main as run
        from .cli.output import AT_RESULT
    except KeyboardInterrupt:  # where Ctrl-C cannot be held back: nothing opened yet
        _result_stands()
        sys.stderr.write("jobcoord: interrupted\n")
        sys.exit(130)
    # Registered before Ctrl-C is let through: its `interrupted` report is an answer too.
    AT_RESULT.append(_result_stands)
    if hold:
        try:
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})
        except KeyboardInterrupt:  # it came while loading; nothing was opened yet
            interrupted_before_parsing(sys.argv[1:])
    # Ctrl-C after a commit is held until the result is printed (or the next write begins).
    from .interrupts import install

    install()
    run()


def _standard_streams() -> None:
    """A standard stream closed when the command started (`>&-`, `2>&-`, a service manager
    that closes them) is opened onto /dev/null: what it would print is dropped, as for a
    reader gone, and the command does its work. Python left `sys.stdout` None there (every
    command ended exit 1 with a traceback, a committed enqueue too), and the first file
    opened (the database) would have taken the free descriptor, and printed output with it."""
    import os

    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        # Open for the process's life, as the stream it stands for.
        setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115


def _result_stands() -> None:
    """Once a command prints its result (or a loop has stopped), the work it reports is
    done (committed, or read): a Ctrl-C from then on can undo nothing, so it ends nothing
    either. It ended the process exit 130 with the `interrupted` error after the result,
    and a script reading either thought nothing was done. So do a SIGTERM or SIGHUP: a
    second one, as a stopped loop exited, ended it exit 143 (129), its clean stop reported
    as a kill. Ignored, they stay so while the interpreter ends. Only the program does
    this; a caller of the CLI in its own process keeps its signals."""
    for signum in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(signum, _signal.SIG_IGN)
