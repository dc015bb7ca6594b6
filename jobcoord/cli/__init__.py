"""The `jobcoord` command: parse, call the coordinator, print. No rules live here.

Every command takes `--json` and then prints exactly one JSON object on stdout; errors become
`{"error": {"code", "message"}}` and the exit code of their class (errors.py; the table in
README.md "Exit codes"). Long-running commands print JSON Lines instead, one object per pass.

Rooms: `main` (the entry point and the one mapping of errors to exit codes), `output` (JSON
mode, text for people, escaping), `group` (the global options and shared ones), and one module
per command group: `storage`, `jobs`, `leases`, `runtime`, `schedules`.
"""

from __future__ import annotations

from ..errors import EXIT_CODES
from .group import cli
from .main import _flag_in_argv, main
from .output import emit, safe_text

__all__ = ["EXIT_CODES", "_flag_in_argv", "cli", "emit", "main", "safe_text"]
