"""Long-running processes: the dedicated reaper loop (`jobcoord reap --every`, which also
ticks the schedules), and the one
place that decides which errors a long-running loop survives. The reaper loop here and the
worker's loops (claim, ticker, job threads) all use `is_fatal` and `Backoff`."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from typing import Any

from .clock import iso, now_us
from .errors import DatabaseCorrupt, InvalidInput, JobcoordError, SchemaMismatch

#: Errors no retry can heal: the schema is not what this code needs, the database is corrupt,
#: or the loop itself asks for something invalid. A loop stops on these, with their exit code.
#: Everything else (a busy or unreachable database, a server restart, a file briefly gone)
#: may heal on its own: a loop logs it, backs off, and goes on.
FATAL_ERRORS: tuple[type[JobcoordError], ...] = (SchemaMismatch, DatabaseCorrupt, InvalidInput)
#: Longest pause between two attempts of a loop whose database keeps failing.
MAX_BACKOFF_S = 15.0
#: Exit code of `reap --every` after SIGINT (Ctrl-C), the shell's convention (128 + 2).
EXIT_INTERRUPTED = 130


def is_fatal(exc: BaseException) -> bool:
    """True when a long-running loop must stop on `exc` (and exit with its exit code). Not
    `schema_changed`: a feature added or removed beside the loop, taken by the time it is
    raised; the same call sent again is answered."""
    return isinstance(exc, FATAL_ERRORS) and getattr(exc, "code", None) != "schema_changed"


def describe(exc: BaseException) -> tuple[str, str]:
    """(code, message) of any error, for a log line or a JSON object."""
    if isinstance(exc, JobcoordError):
        return exc.code, exc.message
    return "internal_error", f"{type(exc).__name__}: {exc}"


class Backoff:
    """Bounded exponential backoff: base, 2*base, 4*base ... at most `cap` seconds; `reset`
    after a success."""

    def __init__(self, base: float, cap: float = MAX_BACKOFF_S):
        self.base = max(0.05, base)
        self.cap = max(self.base, cap)
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return min(self.cap, self.base * 2 ** min(self.failures - 1, 16))

    def reset(self) -> None:
        self.failures = 0


_unwritable_said = False


def _out(line: str) -> None:
    """A pass's line. Output that cannot be written must not stop the loop every expired
    lease depends on: a reader gone drops it, as for every command; any other failure (a
    full disk under `> passes.jsonl`) is said once on stderr, then the lines are dropped
    (they were, silently: exit 0 and nothing said)."""
    global _unwritable_said
    try:
        print(line, flush=True)
    except (OSError, ValueError) as e:
        from .cli.output import drop_output, reader_gone

        drop_output()
        if isinstance(e, OSError) and not reader_gone(e) and not _unwritable_said:
            _unwritable_said = True
            with contextlib.suppress(OSError, ValueError):
                print(f"jobcoord: cannot write to stdout: {e.strerror or e}; reaping goes on, "
                      "its pass lines are dropped", file=sys.stderr, flush=True)


def tick_schedules(coordinator: Any) -> dict[str, Any]:
    """One tick of the schedules from a loop's timer: its counts, or the error that skipped
    it (said on stderr; the next pass ticks again). A fatal error is raised."""
    try:
        got: dict[str, Any] = coordinator.tick_schedules()
    except Exception as e:
        if is_fatal(e):
            raise
        code, message = describe(e)
        print(f"jobcoord: schedule tick skipped ({code}): {message}", file=sys.stderr,
              flush=True)
        return {"error": {"code": code, "message": message}}
    return {k: got[k] for k in ("fired", "missed", "missed_exact", "skipped", "queued")}


def stop_on_hangup(handler: Any) -> Any:
    """The terminal a long-running loop was started in closed (SIGHUP): it stops as on
    SIGTERM, finishing what is under way, instead of dying of the signal (129) in the middle
    of it; unless it was started to outlive its terminal (`nohup`: SIGHUP ignored). Returns
    the handler that was there, to put back."""
    previous = signal.getsignal(signal.SIGHUP)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, handler)
    return previous


def run_reaper(coordinator: Any, interval: float, *, limit: int = 1000,
               as_json: bool = False) -> int:
    """Reap every `interval` seconds until SIGTERM (exit 0) or SIGINT (exit 130), always after
    finishing the pass under way. Text: one line per pass that did something. JSON: JSON
    Lines, exactly one object per pass, also for passes that did nothing or were skipped (so a
    script sees the loop is alive). Returns the exit code; raises on a fatal error."""
    stop = threading.Event()
    interrupted = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT:
            interrupted.set()
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stop_on_hangup(_stop)
    backoff = Backoff(interval)
    passes = 0
    while not stop.is_set():
        passes += 1
        try:
            result = coordinator.reap(limit=limit)
        except Exception as e:
            if is_fatal(e):
                raise
            # A sweep loses nothing by waiting: skip this pass (nothing of it was applied)
            # instead of ending the loop that every expired lease depends on.
            wait = backoff.next()
            code, message = describe(e)
            print(f"jobcoord: reap pass skipped ({code}): {message}; next try in {wait:g}s",
                  file=sys.stderr, flush=True)
            if as_json:
                _out(json.dumps({"pass": passes, "at": iso(now_us()), "skipped": True,
                                 "error": {"code": code, "message": message},
                                 "retry_in_s": wait}))
            stop.wait(wait)
            continue
        backoff.reset()
        ticked = tick_schedules(coordinator)
        if as_json:
            _out(json.dumps({"pass": passes, "at": iso(now_us()), **result,
                             "schedules": ticked}))
        else:
            if result["expired"] or result["deadline_dead"]:
                _out(f"reaped {result['expired']} expired lease(s): {result['waiting']} "
                     f"waiting, {result['dead']} dead, {result['unknown']} unknown, "
                     f"{result['cancelled']} cancelled; {result['deadline_dead']} past "
                     "deadline")
            if any(ticked.get(k) for k in ("fired", "missed", "skipped", "queued")):
                _out(f"schedules: fired {ticked['fired']}, missed {ticked['missed']}"
                     f"{'' if ticked['missed_exact'] else ' or more'}, "
                     f"skipped {ticked['skipped']}, queued {ticked['queued']}")
        stop.wait(interval)
    return EXIT_INTERRUPTED if interrupted.is_set() else 0
