"""What the routes share at run time: the Coordinator, the bounded thread pool its blocking
calls run on, the long-poll wake-ups, and the poller and reaper timers."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .. import faults, tokens
from ..errors import DatabaseBusy, DatabaseCorrupt, JobcoordError, Unauthorized
from ..tokens import Identity
from .bodies import ENVELOPE_BYTES

if TYPE_CHECKING:
    from .deps import Caller

T = TypeVar("T")


#: Live tokens' identities a server keeps (`Server.as_caller`).
KEPT_IDENTITIES = 4096


class _NotAsKept(Exception):
    """The stored token is revoked, or no longer says what the server kept of it. Not a
    JobcoordError: nothing on the way out of the transaction that met it may take it for
    a rule's refusal (an `except Refused` would have answered 404 for a revoked token)."""


class _LiveCheck:
    """A write transaction's first statement for a caller whose identity the server kept:
    the token is still live and still says the same (`Database.guarded`)."""

    def __init__(self, db: Any, digest: str, who: Identity) -> None:
        self.db, self.digest, self.who = db, digest, who
        #: Set once a transaction made the check (on whichever thread led its group).
        self.checked = False
        #: What the stored token said when it was not as kept: revoked (None) or another
        #: identity; the call's answer is then refused whatever `fn` made of it.
        self.stale = False
        self.stored: Identity | None = None

    def __call__(self, conn: Any) -> None:
        stored = tokens.live_identity(self.db, conn, self.digest)
        self.checked = True
        if stored != self.who:
            self.stale, self.stored = True, stored
            raise _NotAsKept()


class Handover:
    """What a long-poll taken by a submission is woken with: the answer of the claim made in
    the submission's own transaction (None when it took nothing: the poll then claims on
    its own, as any woken poll does)."""

    def __init__(self, wake: int) -> None:
        self.answer: asyncio.Future[dict[str, Any] | None] = (
            asyncio.get_running_loop().create_future())
        #: The wake-up it is (see Wakeup.pass_on), for a poll that then finds nothing.
        self.wake = wake

    def give(self, answer: dict[str, Any] | None) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)

#: The payloads one claim's answer may carry at most, counted at the payload limit: a claim
#: for 1,000 jobs of 256 KiB each held over 1 GB in the server while it was answered.
CLAIM_ANSWER_BYTES = 32 * 1024 * 1024

#: The largest artifact upload a server accepts unless told otherwise (`--max-artifact-bytes`).
DEFAULT_MAX_ARTIFACT_BYTES = 1 << 30
#: Seconds an artifact upload may send nothing before it is refused (`serve --upload-idle`).
DEFAULT_UPLOAD_IDLE_S = 30.0
#: Transfer threads (uploads, downloads' copies) for each database thread (`--threads`).
TRANSFER_THREADS_PER_THREAD = 4


class Wakeup:
    """Wakes long-polls waiting for work, oldest first. Used only from the event loop thread.

    A submission takes the oldest waiter (`take`) and makes its claim in its own
    transaction, or (a delayed job) wakes one waiter (waking all of them would start as many
    claims racing for one job); a waiter that then finds nothing passes the turn on to the
    next one that was already waiting when that wake-up began (`pass_on`): a poll that has
    looked since never gets the turn back, so a job none of them may take ends the chain
    instead of bouncing it between polls (or a lone poll's turn back to itself) in a loop
    of claims. Everything else that may free work for several (the poller, the reaper,
    retries) wakes all.

    A wake-up is a number, larger for each later one (every wait's start takes one too): a
    woken poll is answered with the number of the wake-up that woke it."""

    def __init__(self) -> None:
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        #: The claim each waiting long-poll would make (None: not to be handed a job).
        self._claimants: dict[asyncio.Future[Any], Any] = {}
        #: Set while a long-poll waits (read by the commit watcher's thread).
        self.someone_waits = threading.Event()
        #: Single wake-ups that found nobody waiting (every long-poll was busy claiming), by
        #: number: a waiter whose last look began before one takes it at once, so a job
        #: committed during a claim is not left for the poller. One from before a poll's
        #: last look is nothing new to it.
        self._pending: collections.deque[int] = collections.deque(maxlen=1024)
        #: When each waiting long-poll began waiting (a wake-up number).
        self._since: dict[asyncio.Future[Any], int] = {}
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    @property
    def clock(self) -> int:
        """The latest wake-up's number: a poll that looks now sees every commit that one
        was for."""
        return self._clock

    @property
    def waiters(self) -> int:
        return len(self._waiting)

    def notify(self, n: int | None = None) -> None:
        """Wake `n` waiters (None: all); single wake-ups that find nobody waiting are kept
        for the next waiters."""
        wake = self._tick()
        while self._waiting and (n is None or n > 0):
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(wake)
                if n is not None:
                    n -= 1
        if n:
            self._pending.extend([wake] * min(n, 1024))

    def pass_on(self, wake: int) -> None:
        """A poll woken by `wake` found nothing it may take: wake the oldest poll that was
        already waiting when `wake` began (it has not looked since). Never kept for later:
        every poll that waits now began after the wake-up, so it has looked."""
        for future in self._waiting:
            if self._since.get(future, wake) < wake and not future.done():
                self._waiting.remove(future)
                future.set_result(wake)
                return

    def take(self) -> tuple[Any, Handover] | None:
        """The oldest waiting long-poll that may be handed a job, woken now with a Handover
        (its claimant and the Handover to answer), or None. Taken, it no longer times out
        nor is woken by anyone else: its Handover must be given an answer."""
        for future in self._waiting:
            claimant = self._claimants.get(future)
            if claimant is not None and not future.done():
                handover = Handover(self._tick())
                future.set_result(handover)
                self._waiting.remove(future)
                return claimant, handover
        return None

    async def wait(self, timeout: float, claimant: Any = None,
                   gone: asyncio.Future[Any] | None = None, looked: int = 0
                   ) -> int | Handover:
        """The wake-up's number when woken, 0 when the timeout passed (or `gone` was done
        first: the client went away). With a `claimant` (the claim the long-poll makes), a
        submission may take this waiter: it is then woken with a Handover to await.
        `looked`: the clock when the poll's last look began; a kept single wake-up after it
        is taken at once, older ones are left (another poll may not have looked since)."""
        for wake in self._pending:
            if wake > looked:
                self._pending.remove(wake)
                return wake
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._claimants[future] = claimant
        self._since[future] = self._tick()
        self.someone_waits.set()
        try:
            if gone is None:
                return await asyncio.wait_for(future, timeout)  # type: ignore[no-any-return]
            await asyncio.wait((future, gone), timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if future.done():
                return future.result()  # type: ignore[no-any-return]
            future.cancel()  # timed out, or its client went away: never taken now
            return 0
        except TimeoutError:
            return 0
        finally:
            del self._claimants[future]
            del self._since[future]
            with contextlib.suppress(ValueError):
                self._waiting.remove(future)
            if not self._waiting:
                self.someone_waits.clear()


class Server:
    def __init__(self, coordinator: Any, *, pool_size: int, poll_s: float, reap_every: float,
                 emit: Callable[[dict[str, Any]], None] | None,
                 max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
                 upload_idle_s: float = DEFAULT_UPLOAD_IDLE_S):
        self.c = coordinator
        self.pool_size = pool_size
        self.pool = concurrent.futures.ThreadPoolExecutor(pool_size, "jobcoord-http-db")
        #: Calls given to `pool` and not yet begun, and calls running on it (`_in_pool`).
        self._pool_waiting = 0
        self._pool_running = 0
        self._pool_lock = threading.Lock()
        #: An artifact's bytes move at the client's pace, or not at all (a stalled upload):
        #: on threads of their own, never on one a claim or a renewal waits for. A worker
        #: has at most `pool_size` uploads in flight (`upload_slot`), a quarter of them: one
        #: token's stalled uploads cannot hold every other worker's upload back.
        self.transfer_threads = TRANSFER_THREADS_PER_THREAD * pool_size
        self.transfers = concurrent.futures.ThreadPoolExecutor(
            self.transfer_threads, "jobcoord-http-transfer")
        #: Transfers holding or waiting for a transfer thread (counted on the event loop).
        self.transfers_busy = 0
        self.uploads_per_worker = pool_size
        self._uploads: dict[str, int] = {}
        self.upload_idle_s = upload_idle_s
        #: Set when the server begins to stop: long-polls answer "nothing" (204) at once and
        #: uploads still streaming are refused (503), instead of being cut after the grace.
        self.stopping = threading.Event()
        #: Bytes of downloads' verified copies not yet sent (their readers may never read),
        #: held to twice the upload limit; see `reserve_staging`.
        self.staged_bytes = 0
        self.staging_limit = 2 * max_artifact_bytes
        self._staging_lock = threading.Lock()
        self.poll_s = poll_s
        self.reap_every = reap_every
        self.emit = emit or (lambda _event: None)
        self.wakeup: Wakeup | None = None
        self._looking: asyncio.Future[None] | None = None
        limit = max(coordinator.policy.max_payload_bytes, coordinator.policy.max_result_bytes)
        self.max_body = limit + ENVELOPE_BYTES
        #: The most jobs one claim takes for one request: its answer (every payload, parsed
        #: and encoded again) stays within CLAIM_ANSWER_BYTES at the payload limit.
        self.max_claim_batch = max(1, CLAIM_ANSWER_BYTES
                                   // coordinator.policy.max_payload_bytes)
        self.max_artifact_bytes = max_artifact_bytes
        #: The error that ended serving (the database file replaced or removed), raised by
        #: run_server once the server has stopped; `on_fatal` asks the server to stop.
        self.fatal: JobcoordError | None = None
        self.on_fatal: Callable[[], None] | None = None
        #: Live tokens' identities by their hash (`as_caller`).
        self._identities: dict[str, Identity] = {}

    def lost(self, exc: BaseException) -> None:
        """Stop serving when the database file was replaced or removed under this process:
        its kept connections reach only the old file, so it would answer 503 for ever.
        Exit 7 then, as a worker does, and a service manager starts a server on the file
        now at the path. Other errors heal (busy) or wait for an operator (a schema to
        migrate): those the server survives. Called on the event loop."""
        if (self.fatal is None and isinstance(exc, DatabaseCorrupt)
                and exc.code == "database_replaced"):
            self.fatal = exc
            self.emit({"event": "stopping", "code": exc.code, "message": exc.message})
            if self.on_fatal is not None:
                self.on_fatal()

    async def _in_pool(self, work: Callable[[], T]) -> T:
        """`work` run on the pool, under the database's busy budget (`busy_budget`, the
        server's bound). Behind other calls (every thread taken or calls already queued),
        the budget counts from now, when the call asks for a thread, not from its first
        try: with every thread waiting on a locked database, a call queued behind them
        would otherwise wait its own budget after theirs (24 writes to 8 threads took up to
        15 s, past a client's timeout), and one that waited its whole budget for a thread
        is not tried: 503 `server_busy`, nothing changed. With a thread free when it asked,
        it waited for none: a delay before it began is the whole process stalled (stopped,
        paused, swapped out), and its budget counts from when it begins. It was answered
        `server_busy`, and a long-poll claim answered so lost the job it was to be handed."""
        db = self.c.db
        budget = db.busy_budget
        asked = time.monotonic()
        threads = self.pool_size
        faults.point("http.asked_thread")  # (before the count: a fault here leaks none)
        with self._pool_lock:
            behind = self._pool_waiting + self._pool_running >= threads
            self._pool_waiting += 1

        def run() -> T:
            with self._pool_lock:
                self._pool_waiting -= 1
                self._pool_running += 1
            try:
                if budget is None:
                    return work()
                if behind and time.monotonic() - asked >= budget:
                    raise DatabaseBusy(
                        "server_busy", f"no server thread was free for {budget:g} s (all "
                        f"{threads} were waiting on the database); nothing was changed, "
                        "try again")
                with db.deadline((asked if behind else time.monotonic()) + budget):
                    return work()
            finally:
                with self._pool_lock:
                    self._pool_running -= 1

        def unasked(future: concurrent.futures.Future[T]) -> None:
            if future.cancelled():  # taken back before a thread began it: run never ran
                with self._pool_lock:
                    self._pool_waiting -= 1

        try:
            future = self.pool.submit(run)
        except BaseException:
            with self._pool_lock:
                self._pool_waiting -= 1
            raise
        future.add_done_callback(unasked)
        return await asyncio.wrap_future(future)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._in_pool(functools.partial(fn, *args, **kwargs))

    async def call_as(self, caller: Caller, fn: Callable[..., T], *args: Any,
                      **kwargs: Any) -> T:
        """`fn(identity, *args, **kwargs)` on the pool as the caller (`as_caller`: the
        token's role checked first, 403 and `fn` does not run; its liveness judged on the
        same thread, 401): the route's work and its authentication cost one thread hop,
        not two."""
        return await self._in_pool(lambda: self.as_caller(caller, fn, *args, **kwargs))

    def as_caller(self, caller: Caller, fn: Callable[..., T], *args: Any, **kwargs: Any
                  ) -> T:
        """`fn(identity, *args, **kwargs)` as the caller, on this thread. A token called
        with before has its identity kept (a token's identity never changes; it is only
        revoked), and whether it is still live is judged inside each write transaction `fn`
        begins, first thing (`Database.guarded`): a revoked token's write is refused with
        401 before it changes anything. Its own read transaction cost a worker's request
        more of the server's time than the completion's statements. When `fn` began no
        write (or raised before one), the token is read as before, and 401 or 403 replaces
        its answer or its error. Unknown tokens are never kept."""
        db = self.c.db
        digest = tokens.digest_of(caller.token)
        kept = self._identities.get(digest) if digest is not None else None
        if kept is not None and kept.role not in caller.allowed:
            kept = None  # read: a revoked token is 401 before its role's 403
        if kept is None:
            who = caller.identify(db)  # 401 or 403, and fn does not run
            if digest is not None:
                self._keep(digest, who)
            return fn(who, *args, **kwargs)
        live, outcome = self._checked_run(digest, kept, fn, args, kwargs)
        if not live.stale:
            if not live.checked:  # nothing written: 401 or 403 first, as without a kept one
                self._recheck(caller, digest)
            return outcome()
        # The stored token is not as kept: the write that found so changed nothing.
        self._identities.pop(digest, None)
        if live.stored is None:
            raise Unauthorized("unauthorized", "unknown or revoked token")
        # Live, but saying something else (a database put back from elsewhere): read it
        # again, and act as it says.
        return self.as_caller(caller, fn, *args, **kwargs)

    def _checked_run(self, digest: str, who: Identity, fn: Callable[..., T],
                     args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[_LiveCheck, Callable[[], T]]:
        """`fn(who, *args, **kwargs)` with the token of `digest` judged live first thing in
        each write transaction `fn` begins (`Database.guarded`): the check, and `fn`'s
        outcome (called, it returns `fn`'s result or raises its error). When the check found
        the token stale, what `fn` made of its refused write is no answer: the caller gives
        401 (or reads the token again) instead."""
        live = _LiveCheck(self.c.db, digest, who)
        try:
            with self.c.db.guarded(live):
                result = fn(who, *args, **kwargs)
        except BaseException as e:
            error = e

            def fails() -> T:
                raise error

            return live, fails
        return live, lambda: result

    def _recheck(self, caller: Caller, digest: str) -> None:
        """The token read in a transaction of its own: 401 once it is revoked."""
        try:
            caller.identify(self.c.db)
        except Unauthorized:
            self._identities.pop(digest, None)
            raise

    def _keep(self, digest: str, who: Identity) -> None:
        if len(self._identities) >= KEPT_IDENTITIES:
            self._identities.clear()  # a server with more live tokens reads some again
        self._identities[digest] = who

    async def transfer(self, fn: Callable[..., T], *args: Any, queue: bool = False,
                       **kwargs: Any) -> T:
        """`fn` on the transfer threads (an upload streamed in, a download staged out),
        without a request's busy budget: it may take as long as its bytes take, and each of
        its transactions has a budget of its own (`busy_budget`). With every transfer
        thread taken (uploads whose clients send slowly, each worker within its own cap),
        DatabaseBusy `server_busy` at once, a 503 clients retry: queued, it waited for
        them with no end and no answer. `queue`: wait for a thread instead (a completion
        whose checks must not run on a database thread)."""
        if self.transfers_busy >= self.transfer_threads and not queue:
            raise DatabaseBusy("server_busy", f"all {self.transfer_threads} transfer threads "
                               "are moving artifacts' bytes; try again")
        self.transfers_busy += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.transfers,
                                              functools.partial(fn, *args, **kwargs))
        finally:
            self.transfers_busy -= 1

    async def transfer_as(self, caller: Caller, fn: Callable[..., T], *args: Any,
                          **kwargs: Any) -> T:
        """`call_as` on the transfer threads: the token's lookup and `fn` in one hop;
        queued for a thread when every one is taken."""
        db = self.c.db

        def run() -> T:
            return self.judged(caller.token, caller.identify(db), fn, *args, **kwargs)

        return await self.transfer(run, queue=True)

    def judged(self, token: str, who: Identity, fn: Callable[..., T], *args: Any,
               **kwargs: Any) -> T:
        """`fn(who, *args, **kwargs)` on this thread, `token` (read as `who` before) judged
        live again inside each write transaction `fn` begins: for calls whose work outside
        any transaction takes as long as its bytes (an upload streaming in, a completion's
        artifact checks), a revocation meanwhile is 401 at their commit, nothing recorded."""
        digest = tokens.digest_of(token)
        assert digest is not None  # `who` was read by it
        live, outcome = self._checked_run(digest, who, fn, args, kwargs)
        if not live.stale:
            return outcome()
        self._identities.pop(digest, None)
        raise Unauthorized("unauthorized", "unknown or revoked token")

    def notify(self, n: int | None = None) -> None:
        if self.wakeup is not None:
            self.wakeup.notify(n)

    @contextlib.contextmanager
    def upload_slot(self, worker: str) -> Iterator[None]:
        """One of this worker's uploads in flight, while the block runs; past
        `uploads_per_worker` it is DatabaseBusy `server_busy` (a 503 its client retries)."""
        if self._uploads.get(worker, 0) >= self.uploads_per_worker:
            raise DatabaseBusy("server_busy", f"worker {worker} already has "
                               f"{self.uploads_per_worker} uploads in flight; try again")
        self._uploads[worker] = self._uploads.get(worker, 0) + 1
        try:
            yield
        finally:
            left = self._uploads[worker] - 1
            if left:
                self._uploads[worker] = left
            else:
                del self._uploads[worker]

    def reserve_staging(self, size: int) -> Callable[[], None]:
        """Room for a download's verified copy of `size` bytes, and the function that gives
        it back once the copy is gone. Past `staging_limit` (unless nothing else is held:
        one download is always served) it is DatabaseBusy `server_busy`, a 503 to retry."""
        with self._staging_lock:
            if self.staged_bytes and self.staged_bytes + size > self.staging_limit:
                raise DatabaseBusy("server_busy", f"downloads still being sent hold "
                                   f"{self.staged_bytes} bytes of verified copies; try again")
            self.staged_bytes += size
        released = False

        def release() -> None:
            nonlocal released
            with self._staging_lock:
                if not released:
                    released = True
                    self.staged_bytes -= size
        return release

    def stop_waits(self) -> None:
        """The server begins to stop: every long-poll is woken to answer 204 and uploads
        waiting for bytes give up (see `stopping`)."""
        self.stopping.set()
        self.notify()

    def pass_on(self, wake: int) -> None:
        """A poll woken by `wake` found nothing for it: the next poll that has not looked
        since gets the turn (see Wakeup.pass_on)."""
        if self.wakeup is not None:
            self.wakeup.pass_on(wake)

    def take_waiter(self) -> tuple[Any, Handover] | None:
        """The oldest long-poll a submission may hand its job to (see Wakeup.take)."""
        return None if self.wakeup is None else self.wakeup.take()

    def due_job_exists(self) -> bool:
        """A cheap read: is any waiting job due? Only a hint to wake the long-polls; the claim
        itself decides what is eligible."""
        from ..clock import now_us
        from ..store import report_statements as rs

        db = self.c.db
        return db.read(lambda conn: db.run(conn, rs.DUE_JOB, {"now": now_us()}).first()
                       is not None, "poll")

    def watch_commits(self, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        """On a thread of its own: hear commits by other processes at once, where the store
        can watch for them (SQLite on Linux: an inotify watch of the -wal file, then `PRAGMA
        data_version`, the idle local worker's waiter), instead of at the poller's next
        look. Only while a long-poll waits. A change while this server had a group commit
        of its own is taken for its own (its submissions wake a long-poll themselves) and
        left to the poller, which stays the authority."""
        group = getattr(self.c.db, "_group", None)
        if group is None:
            return
        waiter = self.c.db.change_waiter()
        try:
            if waiter.mode != "wal_notify":
                return  # no file notification: the poller is as good
            assert self.wakeup is not None
            someone_waits = self.wakeup.someone_waits
            own = (group.begun, group.groups)
            while not stop.is_set():
                if not someone_waits.wait(self.poll_s):
                    continue
                if not waiter.wait(self.poll_s, stop) or stop.is_set():
                    continue
                # Ours when a group of ours began or ended since the last change heard, or
                # is under way (begun, not yet counted as ended): a group that began before
                # the last look and committed after it is ours too. Taken for a stranger's,
                # a refused claim's own commit would wake the polls to claim again, and
                # their claims' commits would wake them again.
                now = (group.begun, group.groups)
                if now != own or now[0] != now[1]:
                    own = now
                    continue
                loop.call_soon_threadsafe(self._heard)
        finally:
            waiter.close()

    def _heard(self) -> None:
        if self._looking is None and self.wakeup is not None and self.wakeup.waiters:
            self._looking = asyncio.ensure_future(self._look())

    async def _look(self) -> None:
        try:
            if await self.call(self.due_job_exists):
                self.notify()
        except JobcoordError as e:
            self.lost(e)  # else the database is away: the waiters' own claims will say so
        finally:
            self._looking = None

    async def poller(self) -> None:
        """Jobs committed by other processes (the CLI, another server): looked for once per
        poll interval while someone waits."""
        assert self.wakeup is not None
        while True:
            await asyncio.sleep(self.poll_s)
            if not self.wakeup.waiters:
                continue
            try:
                if await self.call(self.due_job_exists):
                    self.notify()
            except JobcoordError as e:
                self.lost(e)  # else the database is away: the waiters' own claims say so

    async def reaper(self) -> None:
        """Reap on a timer. The errors a loop survives are runtime.py's (a busy or
        restarting database): the pass is skipped and the timer backs off. A fatal one
        (schema, corruption) is said, and the timer keeps trying at the longest backoff, so
        the server answers again once an operator has repaired or migrated the database."""
        from ..runtime import Backoff, describe, is_fatal

        backoff = Backoff(self.reap_every)
        wait = self.reap_every
        while True:
            await asyncio.sleep(wait)
            wait = self.reap_every
            try:
                got = await self.call(self.c.reap, limit=1000)
            except Exception as e:
                code, message = describe(e)
                wait = backoff.next()
                self.emit({"event": "reap_error" if is_fatal(e) else "reap_skipped",
                           "code": code, "message": message, "retry_in_s": wait})
                self.lost(e)
                if self.fatal is not None:
                    return  # serving stops: nothing more to reap or tick
            else:
                backoff.reset()
                if got["expired"] or got["deadline_dead"]:
                    self.emit({"event": "reaped", **got})
                    if got["waiting"]:
                        self.notify()
            # The schedules' own pass: a failed reap must not stop them from firing.
            await self.tick()

    async def tick(self) -> None:
        """Fire the schedules that are due (on the reaper's timer); a failed tick is said
        and the next timer tries again."""
        from ..runtime import describe

        try:
            got = await self.call(self.c.tick_schedules)
        except Exception as e:
            code, message = describe(e)
            self.emit({"event": "schedule_tick_skipped", "code": code, "message": message})
            return
        if got["fired"] or got["missed"] or got["skipped"] or got["queued"]:
            self.emit({"event": "schedules_ticked", **got})
            if got["fired"]:
                self.notify()
