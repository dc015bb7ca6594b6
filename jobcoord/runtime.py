"""Long-running processes: the dedicated reaper loop (the worker runtime builds on this)."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any


def run_reaper(coordinator: Any, interval: float, *, limit: int = 1000,
               as_json: bool = False) -> None:
    """Reap every `interval` seconds until SIGTERM or SIGINT; one line per pass that did
    something."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop.is_set():
        result = coordinator.reap(limit=limit)
        if result["expired"] or result["deadline_dead"]:
            line = json.dumps(result) if as_json else (
                f"reaped {result['expired']} expired lease(s): {result['waiting']} waiting, "
                f"{result['dead']} dead, {result['unknown']} unknown, "
                f"{result['cancelled']} cancelled; {result['deadline_dead']} past deadline")
            print(line, flush=True)
        stop.wait(interval)
