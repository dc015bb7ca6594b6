"""The `jobcoord` command's entry point: light on purpose (nothing but the standard library
until the CLI is imported), so that a Ctrl-C while the CLI loads ends the command as a
Ctrl-C later does: `jobcoord: interrupted`, exit 130, never a traceback, and with --json
its one JSON error on stdout."""

from __future__ import annotations

import signal
import sys


def _interrupted_while_loading() -> None:
    """Nothing has been opened yet, let alone written. Whether --json was asked for is read
    as the CLI reads it, so its modules are loaded first, with Ctrl-C ignored for those
    moments (a module cut halfway is loaded afresh)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from .cli.main import interrupted_before_parsing
    except Exception:  # the CLI cannot load at all: say what can be said without it
        sys.stderr.write("jobcoord: interrupted\n")
        sys.exit(130)
    interrupted_before_parsing(sys.argv[1:])


def main() -> None:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        _interrupted_while_loading()
    run()
