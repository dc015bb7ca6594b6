"""The `jobcoord` command's entry point: light on purpose (nothing but the standard library
until the CLI is imported), so that a Ctrl-C while the CLI loads ends the command as a
Ctrl-C later does: `jobcoord: interrupted`, exit 130, never a traceback, and with --json
its one JSON error on stdout."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    # Ctrl-C is held back while the CLI's modules load: one cut halfway (SQLAlchemy's, say)
    # cannot be loaded again in this process, and reading --json as click reads it needs
    # them. Held for those few tenths of a second, it arrives as the mask is lifted.
    hold = hasattr(signal, "pthread_sigmask")
    if hold:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        from .cli.main import interrupted_before_parsing
        from .cli.main import main as run
    except KeyboardInterrupt:  # where Ctrl-C cannot be held back: nothing opened yet
        sys.stderr.write("jobcoord: interrupted\n")
        sys.exit(130)
    if hold:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        except KeyboardInterrupt:  # it came while loading; nothing was opened yet
            interrupted_before_parsing(sys.argv[1:])
    run()
