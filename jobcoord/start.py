"""The `jobcoord` command's entry point: light on purpose (nothing but the standard library
until the CLI is imported), so that a Ctrl-C while the CLI loads ends the command as a
Ctrl-C later does: `jobcoord: interrupted`, exit 130, never a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        # Nothing has been opened yet, let alone written.
        sys.stderr.write("jobcoord: interrupted\n")
        sys.exit(130)
    run()
