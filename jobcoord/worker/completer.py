"""The completer (`Completer`): finished jobs' results gathered into groups and accepted with
one `complete_many` per group, each handler acknowledged only after its group committed.

A group is flushed when it is full, when the first result in it has waited `delay_s`
(a few milliseconds by default), at once when a lease in it ends within `margin_s` (a
result must never lose its lease while it waits in a group), and at once when every run of
the worker that could still add a result has handed its own in (`running`): waiting longer
could only delay those results, never grow the group. One refused item is that job's
answer only; an error of the whole transaction (busy, unreachable) is every item's, and each
job's own retry loop decides what to do with it, as it would with a single `complete`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput, JobcoordError, Refused

#: A lease ending within this many seconds is flushed at once: time for the group's commit
#: (which may wait for the write lock) to land well before the lease's end.
FLUSH_MARGIN_S = 1.0


@dataclass
class Pending:
    """One result waiting in the current group."""

    item: dict[str, Any]
    #: When its lease ends, on `clock` (the worker's boot clock).
    lease_end: float
    #: Handed to `on_accepted` once this result is accepted (the worker's log fields).
    note: Any = None
    future: concurrent.futures.Future[dict[str, Any]] = field(
        default_factory=concurrent.futures.Future)


class Completer:
    """Groups completions for `complete_many(items)`; one thread of its own."""

    def __init__(self, complete_many: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 complete_one: Callable[..., dict[str, Any]], *, group: int, delay_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 margin_s: float = FLUSH_MARGIN_S,
                 on_flush: Callable[[int, str], None] | None = None,
                 running: Callable[[], int] | None = None,
                 on_accepted: Callable[[list[Any]], None] | None = None) -> None:
        self._many = complete_many
        self._one = complete_one
        self.group = max(1, group)
        self.delay_s = delay_s
        self.margin_s = margin_s
        self._clock = clock
        self._on_flush = on_flush
        #: Called with the notes of a group's accepted results after its commit and before
        #: any of their handlers is acknowledged (the worker logs them in one write).
        self._on_accepted = on_accepted
        #: How many runs could hand a result in (the worker's live runs, those already
        #: waiting here included); None: unknown, wait for the group or the delay.
        self._running = running
        self._queue: list[Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        #: Groups flushed, by why: "full", "delay", "lease" (a lease near its end), "all"
        #: (every live run's result is in), "close".
        self.flushes: dict[str, int] = {"full": 0, "delay": 0, "lease": 0, "all": 0,
                                        "close": 0}
        self._thread = threading.Thread(target=self._main, name="completer", daemon=True)
        self._thread.start()

    def complete(self, item: Mapping[str, Any], lease_end: float,
                 note: Any = None) -> dict[str, Any]:
        """Hand one result over and wait until its group committed: complete's answer, or
        the refusal raised as `Refused`, or the group's error raised. When it is accepted,
        `on_accepted` has seen its `note` before this returns."""
        pending = Pending(dict(item), lease_end, note)
        with self._cond:
            if self._closed:
                raise JobcoordError("internal_error", "the completer is closed")
            self._queue.append(pending)
            self._cond.notify()
        answer = pending.future.result()
        if "error" in answer:
            err = answer["error"]
            raise Refused(err["code"], err["message"], **err.get("details", {}))
        return answer

    def close(self) -> None:
        """Flush what waits and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _main(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                why = self._wait_for_group()
                group, self._queue = self._queue[:self.group], self._queue[self.group:]
            try:
                self._flush(group, why)
            except BaseException as e:  # a bug here must not leave a handler waiting
                for p in group:
                    if not p.future.done():
                        p.future.set_exception(e)

    def _wait_for_group(self) -> str:
        """Called holding the lock with a non-empty queue: wait until the group is full, its
        delay is over, a lease in it is near its end, or the completer closes."""
        first = self._clock()
        while True:
            if len(self._queue) >= self.group:
                return "full"
            if self._closed:
                return "close"
            now = self._clock()
            soonest = min(p.lease_end for p in self._queue[:self.group]) - self.margin_s
            if now >= soonest:
                return "lease"
            if now >= first + self.delay_s:
                return "delay"
            if self._running is not None and len(self._queue) >= self._running():
                return "all"
            self._cond.wait(min(first + self.delay_s, soonest) - now)

    def _flush(self, group: list[Pending], why: str) -> None:
        self.flushes[why] += 1
        if self._on_flush is not None:
            self._on_flush(len(group), why)
        answers: list[dict[str, Any] | BaseException]
        try:
            answers = list(self._many([p.item for p in group])["results"])
        except InvalidInput:
            # One item the coordinator refuses as input (a result too deep, bad text) must
            # not refuse the others: each goes on its own, with its own answer or error.
            answers = [self._single(p) for p in group]
        except BaseException as e:  # the whole transaction failed: every item's answer
            for p in group:
                p.future.set_exception(e)
            return
        if self._on_accepted is not None:
            self._on_accepted([p.note for p, a in zip(group, answers, strict=True)
                               if isinstance(a, dict) and "error" not in a])
        for p, answer in zip(group, answers, strict=True):
            if isinstance(answer, BaseException):
                p.future.set_exception(answer)
            else:
                p.future.set_result(answer)

    def _single(self, p: Pending) -> dict[str, Any] | BaseException:
        it = p.item
        try:
            return self._one(it["job_id"], it["worker_id"], it["epoch"], it.get("result"),
                             provenance=it.get("provenance"), tenant=it.get("tenant"))
        except Refused as e:
            return {"job_id": it["job_id"], **e.to_json()}
        except BaseException as e:
            return e
