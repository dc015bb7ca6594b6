"""Fault points, switched on only by the test suite.

`point("claim.after_take")` does nothing in normal use. A test can make the process pause or
die right there, inside the transaction, to prove that a crash between two statements leaves
either the whole change or none of it. The hot path costs one test of an empty dict.

Nothing here reads the environment: an installed jobcoord cannot be steered into dying or
into unsafe transactions by a variable set in a production process's environment. The test
suite turns the points on in the processes it starts, through a `sitecustomize` module it
puts on their path (tests/fault_site/), which calls `install` and `set_deferred_writes`:

    install("claim.after_lease:kill")            SIGKILL this process at that point
    install("completed.after_update:sleep=3")    sleep 3 seconds there
    install("a:kill,b:sleep=1")                  several points at once
    install("http.complete.after_commit:bug")    raise an unexpected error there (a bug)
    install("artifacts.put:bug=2")               ... only on the second pass through it
    install("write.after_commit:sigint")         a Ctrl-C (SIGINT to this process) there

`await loop_point(name)` is the same on an event loop: its `sleep` leaves the loop idle,
waiting, where `point` would hold it busy.

`set_deferred_writes(True)` makes write transactions on SQLite start with a plain (deferred)
BEGIN instead of BEGIN IMMEDIATE, so the contention tests can prove that they would catch that
regression. store/sqlite.py reads DEFERRED_WRITES when a database is opened.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

_ACTIONS: dict[str, tuple[str, float]] = {}
_PASSES: dict[str, int] = {}  # passes through each point armed with `bug=N`


class FaultBug(RuntimeError):
    """What a `bug` fault point raises: no class of jobcoord's own, like a real bug."""

DEFERRED_WRITES = False


def _parse(spec: str) -> dict[str, tuple[str, float]]:
    actions: dict[str, tuple[str, float]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition(":")
        if action == "kill":
            actions[name] = ("kill", 0.0)
        elif action.startswith("sleep="):
            actions[name] = ("sleep", float(action.removeprefix("sleep=")))
        elif action == "bug":
            actions[name] = ("bug", 0.0)
        elif action == "sigint":
            actions[name] = ("sigint", 0.0)
        elif action.startswith("bug=") and action.removeprefix("bug=").isdigit():
            actions[name] = ("bug_on", float(action.removeprefix("bug=")))
        else:
            raise ValueError(f"fault spec: cannot read {item!r} (use NAME:kill, NAME:bug, "
                             "NAME:bug=PASS, NAME:sigint or NAME:sleep=SECONDS)")
    return actions


def install(spec: str) -> None:
    """Arm the fault points named in `spec` (replacing any armed before); "" disarms all."""
    global _ACTIONS
    _ACTIONS = _parse(spec)
    _PASSES.clear()


def set_deferred_writes(flag: bool) -> None:
    """Start SQLite write transactions with a deferred BEGIN (only to test the tests)."""
    global DEFERRED_WRITES
    DEFERRED_WRITES = bool(flag)


def point(name: str) -> None:
    """A place where a test may pause or kill this process."""
    if not _ACTIONS:
        return
    action = _ACTIONS.get(name)
    if action is None:
        return
    kind, seconds = action
    if kind == "bug_on":
        _PASSES[name] = _PASSES.get(name, 0) + 1
        if _PASSES[name] == int(seconds):
            raise FaultBug(f"fault point {name}: an unexpected error on pass {_PASSES[name]}")
        return
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "sigint":
        # A Ctrl-C exactly here: delivered to this process, handled by its SIGINT handler.
        os.kill(os.getpid(), signal.SIGINT)
    elif kind == "bug":
        raise FaultBug(f"fault point {name}: an unexpected error, as a bug would raise")
    else:
        # SIGKILL, not an exception or sys.exit: no finally block, rollback or atexit runs,
        # exactly like a power switch on this one process.
        os.kill(os.getpid(), signal.SIGKILL)


async def loop_point(name: str) -> None:
    """`point` on an event loop: a `sleep` there lets the loop wait (signals, timers and
    other tasks run meanwhile) instead of blocking it."""
    action = _ACTIONS.get(name) if _ACTIONS else None
    if action is not None and action[0] == "sleep":
        await asyncio.sleep(action[1])
    else:
        point(name)
