"""Long-lived threads for the worker's per-job work (`Threads`), and the handle one piece of
that work leaves behind (`Task`).

Starting a thread per job (two, for a Python handler: its lease keeper and the handler
itself) cost more than a no-op job's whole claim and completion. A `Threads` keeps every
thread it started: finished work puts the thread back on the idle list, and the next piece
of work runs on an idle thread, or on a new one when every thread is busy. It never makes
work wait for a thread: a Python handler that ignores its stop keeps its thread as long as it
runs, exactly as a thread of its own would, and the worker's slot count (not this pool)
decides how much runs at once.
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import threading
from collections.abc import Callable


class Task:
    """One piece of work handed to `Threads`: alive from `submit` until it has returned
    (the subset of `threading.Thread` the worker uses: `is_alive` and `join`)."""

    __slots__ = ("_done", "name", "then")

    def __init__(self, name: str, then: Callable[[], None] | None = None) -> None:
        self.name = name
        self.then = then
        self._done = threading.Event()

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def end(self) -> None:
        """Mark the work returned (for work run by its caller instead of `Threads`)."""
        self._done.set()


class Threads:
    """Daemon threads named `PREFIX-N`, kept after their work returns and reused."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[tuple[Callable[[], None], Task] | None]] = []
        self._started = 0
        self._closed = False

    @property
    def started(self) -> int:
        """How many threads were ever started (each is kept)."""
        return self._started

    def submit(self, fn: Callable[[], None], name: str = "",
               then: Callable[[], None] | None = None) -> Task:
        """Run `fn` on an idle thread (or a new one); the Task is alive until it returned,
        and `then` is called once it is no longer alive."""
        task = Task(name, then)
        self.run(fn, task)
        return task

    def run(self, fn: Callable[[], None], task: Task) -> None:
        """Run `fn` as `task` (made beforehand: alive from its creation). `fn` handles its
        own errors; one that escapes is dropped, the thread lives on."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self._started += 1
                n = self._started
        if inbox is not None:
            inbox.put((fn, task))
        else:
            threading.Thread(target=self._main, args=((fn, task),),
                             name=f"{self.prefix}-{n}", daemon=True).start()

    def close(self) -> None:
        """Let the idle threads end (busy ones end when their work returns)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)

    def _main(self, first: tuple[Callable[[], None], Task]) -> None:
        inbox: queue.SimpleQueue[tuple[Callable[[], None], Task] | None] = queue.SimpleQueue()
        work: tuple[Callable[[], None], Task] | None = first
        while work is not None:
            fn, task = work
            try:
                with contextlib.suppress(BaseException):  # the work reports its own errors
                    fn()
            finally:
                task._done.set()
                if task.then is not None:
                    with contextlib.suppress(BaseException):
                        task.then()
            del fn, task, work  # nothing of a finished job stays referenced by an idle thread
            with self._lock:
                if self._closed:
                    return
                self._idle.append(inbox)
            work = inbox.get()


class Watch:
    """One thread that calls each registered function at its time (unless cancelled first):
    the timer that hands a handler run inline over to a lease keeper when it runs long.
    Times are on `clock` (the worker's boot clock); the thread looks at least every
    `max_wait_s`, so a clock that jumps is noticed within that."""

    def __init__(self, clock: Callable[[], float], max_wait_s: float) -> None:
        self._clock = clock
        self._max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Entry]] = []
        self._seq = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def at(self, when: float, fn: Callable[[], None]) -> Entry:
        entry = Entry(fn)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="jobcoord-watch",
                                                daemon=True)
                self._thread.start()
            self._seq += 1
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (when, self._seq, entry))
            if earliest is None or when < earliest:
                self._cond.notify()
        return entry

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _main(self) -> None:
        while True:
            due: list[Entry] = []
            with self._cond:
                while True:
                    if self._closed:
                        return
                    heap = self._heap
                    while heap and heap[0][2].cancelled:
                        heapq.heappop(heap)
                    now = self._clock()
                    while heap and heap[0][0] <= now:
                        entry = heapq.heappop(heap)[2]
                        if not entry.cancelled:
                            due.append(entry)
                    if due:
                        break
                    wait = heap[0][0] - now if heap else self._max_wait_s
                    self._cond.wait(min(wait, self._max_wait_s))
            for entry in due:
                with contextlib.suppress(BaseException):
                    entry.fn()


class Entry:
    """A function registered with `Watch`; `cancel` before its time and it is never called."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
