"""The worker's log: one line per decision on stderr, as text for people or JSON for machines."""

from __future__ import annotations

import json
import shlex
import sys
import threading
from typing import IO, Any

from ..clock import iso, now_us
from ..text import safe_text


class Log:
    """One line per decision, on stderr: `text` for people, `json` for machines."""

    def __init__(self, worker_id: str, fmt: str = "text", stream: IO[str] | None = None):
        self.worker_id = worker_id
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        self.write([self.line(event, **fields)])

    def line(self, event: str, **fields: Any) -> str:
        """One decision's line, not yet written (see `write`)."""
        ts = iso(now_us())
        if self.fmt == "json":
            return json.dumps({"ts": ts, "worker": self.worker_id, "event": event, **fields},
                              default=str)
        parts = " ".join(f"{k}={_text(v)}" for k, v in fields.items() if v is not None)
        return f"{ts} {safe_text(self.worker_id)} {event} {parts}".rstrip()

    def write(self, lines: list[str]) -> None:
        """Several decisions taken together (a claimed batch, a committed group) in one write
        and one flush: each line is still on disk before the work it announces goes on, at a
        fraction of a flush per line."""
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        with self._lock:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed log must never stop the work


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)  # ensure_ascii: every control char escaped
    # Escaped first: a handler's error text must never start a line of its own (a forged
    # `completed` decision) or move the terminal's cursor.
    text = safe_text(value)
    return shlex.quote(text) if (" " in text or not text) else text
