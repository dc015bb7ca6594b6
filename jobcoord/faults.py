"""Test-only fault points.

`point("claim.after_take")` does nothing in normal use. When the environment variable
JOBCOORD_FAULT names that point, the process pauses or dies right there, inside the
transaction, so a test can prove that a crash between two statements leaves either the whole
change or none of it. The variable is read once, at import, so the hot path costs one dict
lookup on an empty dict.

    JOBCOORD_FAULT="claim.after_lease:kill"            SIGKILL this process at that point
    JOBCOORD_FAULT="completed.after_update:sleep=3"    sleep 3 seconds there
    JOBCOORD_FAULT="a:kill,b:sleep=1"                  several points at once

JOBCOORD_TEST_DEFERRED_WRITES=1 makes write transactions on SQLite start with a plain
(deferred) BEGIN instead of BEGIN IMMEDIATE. It exists only so the contention tests can prove
that they would catch that regression.
"""

from __future__ import annotations

import os
import signal
import time


def _parse(spec: str) -> dict[str, tuple[str, float]]:
    actions: dict[str, tuple[str, float]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition(":")
        if action == "kill":
            actions[name] = ("kill", 0.0)
        elif action.startswith("sleep="):
            actions[name] = ("sleep", float(action.removeprefix("sleep=")))
        else:
            raise ValueError(f"JOBCOORD_FAULT: cannot read {item!r} (use NAME:kill or "
                             "NAME:sleep=SECONDS)")
    return actions


_ACTIONS = _parse(os.environ.get("JOBCOORD_FAULT", ""))
DEFERRED_WRITES = os.environ.get("JOBCOORD_TEST_DEFERRED_WRITES", "") == "1"


def point(name: str) -> None:
    """A place where a test may pause or kill this process."""
    if not _ACTIONS:
        return
    action = _ACTIONS.get(name)
    if action is None:
        return
    kind, seconds = action
    if kind == "sleep":
        time.sleep(seconds)
    else:
        # SIGKILL, not an exception or sys.exit: no finally block, rollback or atexit runs,
        # exactly like a power switch on this one process.
        os.kill(os.getpid(), signal.SIGKILL)
