"""Ctrl-C around commits, for the `jobcoord` command.

Python raises KeyboardInterrupt wherever the main thread happens to be. Before a write
transaction commits, that is harmless: it rolls back, and the command says so (exit 130).
After the commit it is not: the change is made, and a command that then said "interrupted,
rolled back" (exit 130) made a script that trusts it enqueue the job again. So the command
(`start.py`, and only there: a program using the Python API keeps Python's own Ctrl-C)
installs `on_sigint`, and the store tells this module where its write transactions are:

- `committing()`: a write transaction's work is done and its COMMIT follows. A Ctrl-C from
  here on is held, not raised.
- `next_write()`: a write transaction begins. A Ctrl-C held since the last commit is raised
  now, before anything of this transaction runs. `accounted()` does the same where a
  caller has counted what committed and would wait before its next write (a prune between
  two batches stops there, counting the batches that committed).
- The result printed (`cli/output.py` runs the program's hooks): a Ctrl-C from then on is
  ignored; the work it would have interrupted is done and reported.

Loops that handle SIGINT themselves (worker, serve, reap --every) install their own handler;
a Ctrl-C held before they did is dropped, not raised inside them.
"""

from __future__ import annotations

# `_signal`, the C module, as start.py uses it: nothing more is loaded for it.
import _signal
from typing import Any

_held = False
_pending = False


def on_sigint(_signum: int, _frame: Any) -> None:
    """SIGINT's handler while a command runs: Python's KeyboardInterrupt, unless a write
    has committed since the last transaction began."""
    global _pending
    if _held:
        _pending = True
        return
    raise KeyboardInterrupt


def install() -> None:
    _signal.signal(_signal.SIGINT, on_sigint)


def committing() -> None:
    """The write transaction under way will commit next: hold a Ctrl-C from here."""
    global _held
    _held = True


def next_write() -> None:
    """A write transaction begins: raise a Ctrl-C held since the last commit, if this
    module's handler still receives Ctrl-C (another one took over: it is dropped)."""
    accounted()


def accounted() -> None:
    """The caller has taken account of what committed (a prune counted its batch) and may
    wait before its next write: a Ctrl-C held since the commit is raised here, not after
    the wait."""
    global _held, _pending
    _held = False
    if _pending:
        _pending = False
        if _signal.getsignal(_signal.SIGINT) is on_sigint:
            raise KeyboardInterrupt
