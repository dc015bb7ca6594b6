"""Long-running processes: the dedicated reaper loop (the worker runtime builds on this)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

from .errors import DatabaseBusy


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
        try:
            result = coordinator.reap(limit=limit)
        except DatabaseBusy as e:
            # A sweep loses nothing by waiting: skip this pass (nothing of it was applied)
            # instead of ending the loop that every expired lease depends on.
            print(f"jobcoord: reap pass skipped ({e.code}): {e.message}", file=sys.stderr,
                  flush=True)
            stop.wait(interval)
            continue
        if result["expired"] or result["deadline_dead"]:
            line = json.dumps(result) if as_json else (
                f"reaped {result['expired']} expired lease(s): {result['waiting']} waiting, "
                f"{result['dead']} dead, {result['unknown']} unknown, "
                f"{result['cancelled']} cancelled; {result['deadline_dead']} past deadline")
            print(line, flush=True)
        stop.wait(interval)
