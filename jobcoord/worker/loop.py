"""The worker process (`Worker`): the claim loop and its slots, the heartbeat and reaper timer,
the signals, and the drain at shutdown.

Threads: the main thread claims (only the kinds it has handlers for) and handles
SIGTERM/SIGINT; a ticker thread heartbeats the machine's real readings every `heartbeat_s` and
reaps expired leases every `reap_s` (any number of workers reaping at once is safe: each
change is a compare-and-set on status and epoch); one thread per running job (`run.JobRun`)
and one per Python handler, both reused from `threads.Threads`. A slot is a live run (never
a job id): a Python handler that ignores its stop keeps its slot, and a newer attempt of the
same job claimed meanwhile waits for it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import __version__
from ..app import HandlerSpec
from ..errors import InvalidInput, JobcoordError, Refused
from ..readings import current_readings
from ..runtime import Backoff, describe, is_fatal, stop_on_hangup
from ..store.base import ChangeWaiter
from .clock import LOOP_MAX_WAIT_S, Clock, GapWatch
from .completer import Completer
from .config import WorkerConfig
from .handlers import kill_group
from .log import Log
from .run import JobRun, elapsed_ms
from .threads import Threads, Watch

#: Refusal codes that come from the machine's state (logged as "gate refused").
GATE_CODES = frozenset({"memory_gate", "thermal_gate", "power_gate", "user_active",
                        "heartbeat_stale", "heartbeat_missing"})
#: Exit code after a second SIGTERM/SIGINT (exit at once, leases left to expire).
EXIT_FORCED = 130
#: Longest the claim loop waits for runs that have reported to end before it claims.
ENDING_WAIT_S = 0.05
#: Longest the claim loop waits for more slots to free while fewer than half are free and
#: others are running (one claim for several slots instead of one per slot).
CLAIM_GATHER_S = 0.005


class Outage:
    """One stretch of failed calls to the coordinator (boot clock): when it began, how many
    calls failed, and when a --burst worker has tried long enough (`give_up_s`). Logged as
    it goes and once when a call gets through again."""

    def __init__(self, give_up_s: float):
        self.give_up_s = give_up_s
        self.since: float | None = None  # None while calls get through
        self.errors = 0

    def failed(self, now: float) -> float:
        """A call failed at `now`; how long calls have been failing."""
        if self.since is None:
            self.since = now
        self.errors += 1
        return now - self.since

    def failing(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def over(self, now: float) -> bool:
        """Failing for `give_up_s` or longer."""
        return self.since is not None and now - self.since >= self.give_up_s

    def next_try(self, wait: float, now: float) -> float:
        """`wait`, or less so that the last try falls on the bound, not a backoff later."""
        if self.since is None:
            return wait
        return min(wait, max(0.05, self.since + self.give_up_s - now))

    def end(self, now: float) -> tuple[float, int] | None:
        """A call got through: (seconds failed, errors) of the outage it ends, or None."""
        if self.since is None:
            return None
        ended = (now - self.since, self.errors)
        self.since, self.errors = None, 0
        return ended


#: The Coordinator's calls that move an artifact's bytes (BoundedCalls runs them apart).
TRANSFER_CALLS = frozenset({"put_artifact", "get_artifact"})


class BoundedCalls:
    """The Coordinator's methods, run on a small fixed set of long-lived threads, so one
    worker makes at most `threads` database calls at once whatever its concurrency.

    It once existed because the Coordinator pinned a connection per thread; the Coordinator
    is now safe for any number of threads (one connection per transaction), and it stays for
    the bound: a worker with 256 slots (and the handlers' own checkpoint and effect calls,
    which go through it as `ctx.coordinator`) would otherwise open up to 256 connections at
    once, from every worker, against PostgreSQL's `max_connections` and the coordinator's
    pool, or queue that many writers behind SQLite's one write lock."""

    def __init__(self, coordinator: Any, threads: int = 2, transfer_threads: int = 2):
        self._c = coordinator
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "jobcoord-db")
        #: Calls that move an artifact's bytes, at the pace of a disk or a network, run on
        #: threads of their own: queued on the others, a large upload held the renewals of
        #: every job of the worker back until their leases were lost.
        self._transfers = concurrent.futures.ThreadPoolExecutor(transfer_threads,
                                                                "jobcoord-transfer")

    def _pool_for(self, name: str) -> concurrent.futures.ThreadPoolExecutor:
        return self._transfers if name in TRANSFER_CALLS else self._pool

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._c, name)
        pool = self._pool_for(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return pool.submit(method, *args, **kwargs).result()

        return call

    def submit(self, name: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """The call started on the pool; its future, to be waited for in pieces."""
        return self._pool_for(name).submit(getattr(self._c, name), *args, **kwargs)

    def within(self, seconds: float, name: str, *args: Any, **kwargs: Any) -> Any:
        """The call, waited for at most `seconds` (concurrent.futures.TimeoutError past
        them; the call itself goes on in its thread and its answer is dropped): for a call
        whose answer is worth nothing after a deadline, a renewal past its lease's end."""
        if seconds <= 0:  # nothing sent: its answer could only come too late
            raise concurrent.futures.TimeoutError
        future = self._pool_for(name).submit(getattr(self._c, name), *args, **kwargs)
        return future.result(timeout=seconds)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._transfers.shutdown(wait=False, cancel_futures=True)


class Worker:
    """One worker process. `coordinator` is the Coordinator it was given (read for its policy);
    `calls` is the same Coordinator behind `BoundedCalls`, the way every call is made."""

    def __init__(self, coordinator: Any, config: WorkerConfig, log: Log | None = None, *,
                 clock: Clock | None = None, as_json: bool = False, result_fd: int = 1):
        if not config.handlers:
            raise InvalidInput("invalid_input", "a worker needs at least one handler "
                               "(--app MODULE:APP or --exec KIND=COMMAND)")
        self.coordinator = coordinator
        self.config = config
        self.log = log or Log(config.worker_id, config.log_format)
        self.clock = clock or Clock()
        #: Where the forced exit's JSON line goes: stdout, or the real one the CLI set aside
        #: while handlers' prints go to stderr (cli.output.stdout_for_the_result).
        self.result_fd = result_fd
        #: `--json`: stdout carries JSON Lines only, even when a second signal cuts it short.
        self.as_json = as_json
        # Three threads, not one: a busy database slowing one renewal must not hold up the
        # others.
        self.calls = BoundedCalls(coordinator, threads=3)
        self.kinds = sorted(config.handlers)
        #: Every run whose thread may still be alive. A slot is a live run (its thread lives
        #: until its handler has returned), never a job id: one job can have a settled run
        #: whose handler ignores its stop and a newer run waiting for it.
        self.runs: list[JobRun] = []
        #: Long-lived threads: one runs each job's lease keeper (`JobRun`), the other each
        #: Python handler; a thread per job cost more than a no-op job's claim and completion.
        self.slots = Threads("jobcoord-job")
        self.handler_threads = Threads("jobcoord-handler")
        #: Hands a Python handler called on its run's own thread over to a lease loop when
        #: it runs long (`JobRun._run_inline`).
        self.watch: Watch | None = Watch(self.clock.boot, LOOP_MAX_WAIT_S)
        #: Runs started and not yet over (the slots in use), kept for the completer.
        self.active = 0
        self.children: set[subprocess.Popen[bytes]] = set()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.counts: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        self._signals = 0
        self.claimed = 0
        self.host = socket.gethostname()
        #: An error no retry can heal, seen by the ticker: the worker stops and raises it.
        self.fatal: BaseException | None = None
        #: An error that ends the worker while its coordinator still answers (`stop_after`):
        #: raised once the worker has stopped as a SIGTERM stops it.
        self.exit_error: BaseException | None = None
        #: run() has returned: a timer call still in flight fails as its coordinator closes
        #: (that is the stop, not an error to log after `stopped_worker`).
        self.stopped = False
        #: Claims up to the free slots in one call and completions in groups, when the
        #: coordinator offers batches (both do: over HTTP one request per claim or group).
        #: A remote worker with one slot chains instead: its completion claims the next
        #: job in the same request, one round trip per job where a group of one costs two.
        self.batched = config.batch and all(
            hasattr(coordinator, m) for m in ("claim_many", "complete_many")) and not (
            config.concurrency == 1 and getattr(coordinator, "chained_claims", False))
        self.completer: Completer | None = None
        #: Completes and claims the next job in one call when it would claim next anyway,
        #: when the coordinator offers it as one request (a remote one over HTTP): one round
        #: trip per job instead of two. Batching workers group completions instead.
        self.chained = not self.batched and bool(getattr(coordinator, "chained_claims", False))
        #: Held while a run is started and while the drain picks the runs to release, so a
        #: job claimed with a completion is either released by the drain or by its claimer.
        self._start_lock = threading.RLock()
        db = getattr(coordinator, "db", None)
        self.batch_claims = bool(getattr(db, "batch_claims", True))
        #: The idle wait's hint (opened on first use, in this process).
        self.waiter: ChangeWaiter | None = None
        if self.batched:
            self.completer = Completer(
                self.calls.complete_many, self.calls.complete, group=config.concurrency,
                delay_s=config.flush_delay_s, clock=self.clock.boot,
                on_flush=lambda n, why: self.count(f"flush_{why}"),
                running=lambda: self.active, on_accepted=self._log_completed)
        #: Provenance that is the same for every job this worker runs.
        self._prov_base = {"worker": config.worker_id, "host": self.host,
                           "jobcoord": __version__, "python": platform.python_version()}
        #: Each handler's description, by kind (its spec does not change while it runs).
        self._described: dict[str, dict[str, Any]] = {}

    def _log_completed(self, notes: list[tuple[dict[str, Any], float]]) -> None:
        """A committed group's `completed` lines, in one write, before any of its handlers
        is acknowledged (each note: the run's log fields and when its report began)."""
        if notes:
            self.log.write([self.log.line("completed", **base, report_ms=elapsed_ms(t0))
                            for base, t0 in notes])
            self.count("completed", len(notes))

    def live_runs(self) -> list[JobRun]:
        return [run for run in self.runs if run.thread.is_alive()]

    def live_job_ids(self) -> list[int]:
        return sorted({run.job_id for run in self.live_runs()})

    def count(self, what: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[what] += n

    def result_limit(self, spec: HandlerSpec) -> int:
        policy_limit = int(self.coordinator.policy.max_result_bytes)
        if spec.max_result_bytes is None:
            return policy_limit
        return min(spec.max_result_bytes, policy_limit)

    def provenance(self, spec: HandlerSpec, reported: Mapping[str, Any], duration: float,
                   epoch: int, attempt: int | None, started_at: str | None) -> dict[str, Any]:
        described = self._described.get(spec.kind)
        if described is None:
            described = self._described[spec.kind] = spec.describe()
        prov: dict[str, Any] = {
            **self._prov_base, "handler": dict(described),
            "duration_s": round(duration, 3), "started_at": started_at, "epoch": epoch,
            "attempt": attempt,
        }
        if reported:
            text = json.dumps(dict(reported), default=str)
            # Provenance is stored next to the result and bounded; never fail a job over it.
            prov["reported"] = (json.loads(text) if len(text) <= 32 * 1024 else
                                {"truncated": True, "bytes": len(text)})
        return prov

    # -- timers --

    def heartbeat(self) -> dict[str, Any]:
        readings, sources = current_readings(self.config.readings_override)
        return self.calls.heartbeat(self.config.worker_id, roles=self.config.roles,
                                 readings=readings, kinds=self.kinds) | {"sources": sources}

    def _timer_error(self, what: str, e: BaseException) -> None:
        if self.stopped:
            return
        code, message = describe(e)
        self.log(f"{what}_error", error=code, detail=message)
        if is_fatal(e):
            self.stop_for(e)

    def stop_for(self, e: BaseException) -> None:
        """An error no retry heals (schema, corruption) met beside the claim loop, by a timer
        or a job's report: stop the worker, which raises it (the first, when several)."""
        if self.fatal is None:
            self.fatal = e
        self.stopping.set()
        self.wake.set()

    def stop_after(self, e: BaseException) -> None:
        """An error every later job would meet too, while the coordinator still answers
        (its artifact store gone): stop claiming and stop as a SIGTERM does (the jobs
        running get the grace, then go back), then exit with `e`. Stopped as by a fatal
        error, the client closed under the jobs still running or reporting, the job whose
        report met it among them, and each stayed `running` to its lease's end."""
        if self.exit_error is None:
            self.exit_error = e
        self.stopping.set()
        self.wake.set()

    def _reap_before_leaving(self) -> bool:
        """A burst worker about to leave an empty queue reaps once first (when it reaps at
        all): its reaper timer may not have run yet, and a job whose worker died would stay
        `running` until someone reaps. True when that put jobs back to waiting."""
        if not self.config.reap_s:
            return False  # a remote worker: its server reaps
        return self._reap_once() > 0

    def _reap_once(self) -> int:
        """One reaper pass (the timer's and a leaving burst worker's): logs and counts what
        it reaped and returns how many jobs it put back to waiting. An error is logged, not
        raised: the timer must outlive any error that can heal, and a leaving worker leaves
        anyway (the next worker or reaper will see the jobs)."""
        try:
            got = self.calls.reap(limit=100)
        except Exception as e:
            self._timer_error("reap", e)
            return 0
        if got["expired"] or got["deadline_dead"]:
            self.log("reaped", expired=got["expired"], jobs=got["jobs"])
            self.count("reaped", got["expired"] + got["deadline_dead"])
        return int(got["waiting"])

    def _ticker(self) -> None:
        cfg = self.config
        mono = self.clock.mono
        next_hb = mono() + cfg.heartbeat_s
        next_reap = mono() + (cfg.reap_s if cfg.reap_s else float("inf"))
        gaps = GapWatch(self.clock)
        while not self.stopping.is_set():
            now = mono()
            gap = gaps.check()
            if gap:
                # Back from a suspend: the coordinator has seen no heartbeat for that long
                # and refuses claims as heartbeat_stale until the next one: send it now.
                self.log("clock_gap", gap_s=round(gap, 3), heartbeat="now")
                next_hb = now
            if now >= next_hb:
                next_hb = now + cfg.heartbeat_s
                try:
                    self.heartbeat()
                except Exception as e:  # the timer must outlive any error that can heal
                    self._timer_error("heartbeat", e)
                    next_hb = now + min(cfg.heartbeat_s, 1.0)
            if now >= next_reap:
                next_reap = now + cfg.reap_s
                self._reap_once()
                # Schedules tick on the reaper's timer: any number of workers may tick.
                try:
                    ticked = self.calls.tick_schedules()
                except Exception as e:  # the timer must outlive any error that can heal
                    self._timer_error("schedule_tick", e)
                else:
                    if ticked["fired"] or ticked["missed"] or ticked["queued"]:
                        self.log("schedules_ticked", fired=ticked["fired"],
                                 missed=ticked["missed"],
                                 missed_exact=ticked.get("missed_exact", True),
                                 skipped=ticked["skipped"],
                                 queued=ticked["queued"])
                        if ticked["fired"]:
                            self.wake.set()
            wait = min(next_hb, next_reap, mono() + LOOP_MAX_WAIT_S) - mono()
            self.stopping.wait(max(0.01, wait))

    # -- signals --

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            self.log("shutting_down", signal=name, grace_s=self.config.grace_s,
                     running=self.live_job_ids())
            self.stopping.set()
            self.wake.set()
            # A remote coordinator's claim may be a long-poll of many seconds: cut it short.
            interrupt = getattr(self.coordinator, "interrupt", None)
            if interrupt is not None:
                interrupt()
            return
        running = self.live_job_ids()
        self.log("exiting_now", signal=name, running=running)
        for proc in list(self.children):
            if proc.returncode is None:
                kill_group(proc, signal.SIGKILL)
        if self.as_json:
            # Still one JSON line on stdout, as --json promises, before the forced exit.
            # (Written to the real stdout, which the CLI may have set aside: `result_fd`.)
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                line = json.dumps({
                    "event": "exiting_now", "worker_id": self.config.worker_id,
                    "signal": name, "running": running, "exit_code": EXIT_FORCED}) + "\n"
                os.write(self.result_fd, line.encode())
        os._exit(EXIT_FORCED)

    # -- the loop --

    def run(self) -> dict[str, Any]:
        cfg = self.config
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            # The terminal it runs in closed: its jobs released at once, not left to their
            # leases' end.
            stop_on_hangup(self._on_signal)
        hb = self._first_heartbeat()
        self.log("started", roles=cfg.roles, kinds=self.kinds, concurrency=cfg.concurrency,
                 lease_s=cfg.lease_s, batch=cfg.batch, flush_delay_s=cfg.flush_delay_s,
                 tenant=cfg.tenant, readings=hb.get("readings"), gates=hb.get("gates"),
                 sources=hb.get("sources"))
        from .handlers import sweep_orphans

        swept = sweep_orphans()
        if swept:
            self.log("swept_orphans", removed=swept)
        ticker = threading.Thread(target=self._ticker, name="ticker", daemon=True)
        ticker.start()
        last_refusal: str | None = None
        #: When the claim loop began gathering free slots (boot clock), None when not.
        gather_from: float | None = None
        backoff = Backoff(cfg.poll_s)
        outage = Outage(cfg.give_up_s)
        raised: BaseException | None = None
        try:
            while not self.stopping.is_set():
                self._collect()
                live = self.live_runs()
                if cfg.max_jobs is not None and self.claimed >= cfg.max_jobs:
                    if not live:
                        break
                    self._pause(cfg.poll_s)
                    continue
                if len(live) >= cfg.concurrency:
                    self._pause(cfg.poll_s)
                    continue
                free = cfg.concurrency - len(live)
                if self.batched and self.batch_claims and live:
                    if any(run.ending for run in live):
                        # Runs whose results were just accepted (a group commits together)
                        # free their slots within moments: claim for all of them in one call,
                        # not one call per freed slot. Each ending run wakes the loop; the
                        # pause only bounds the wait.
                        self._pause(ENDING_WAIT_S)
                        continue
                    # A few slots free while others run: gather more for a few milliseconds
                    # (CLAIM_GATHER_S, never longer than the flush delay) before claiming, so
                    # claims (and then groups) stay large instead of one transaction per
                    # freed slot. An idle worker claims at once.
                    now = self.clock.boot()
                    gather = min(cfg.flush_delay_s, CLAIM_GATHER_S)
                    if free < max(1, cfg.concurrency // 2):
                        if gather_from is None:
                            gather_from = now
                        if now - gather_from < gather:
                            self._pause(gather_from + gather - now)
                            continue
                gather_from = None
                t0 = self.clock.boot()
                if cfg.max_jobs is not None:
                    free = min(free, cfg.max_jobs - self.claimed)
                try:
                    got = self._claim(free)
                except Exception as e:
                    if is_fatal(e) or isinstance(e, Refused):
                        raise
                    code, message = describe(e)
                    now = self.clock.boot()
                    failing = outage.failed(now)
                    if cfg.burst and not live and outage.over(now):
                        # Nothing of its own runs and nothing gets through: a burst worker
                        # exits with the error instead of waiting for a coordinator that may
                        # never come back.
                        raise self._give_up(e, failing) from None
                    wait = backoff.next()
                    if cfg.burst:
                        wait = outage.next_try(wait, now)
                    self.log("claim_error", error=code, detail=message,
                             failing_s=round(failing, 3), retry_in_s=round(wait, 3))
                    self._pause(wait)
                    continue
                ended = outage.end(self.clock.boot())
                if ended is not None:
                    self.log("claim_recovered", failed_s=round(ended[0], 3), errors=ended[1])
                backoff.reset()
                if not got["claimed"]:
                    # Keyed on the reason only: the detail carries live readings (memory 86.1%,
                    # 86.3% ...) and would otherwise log a line on every poll.
                    refusal = got["reason"]
                    gate = got["reason"] in GATE_CODES
                    if gate:
                        self.count("gate_refused")
                    if refusal != last_refusal:
                        self.log("gate_refused" if gate else "idle", reason=got["reason"],
                                 detail=got["detail"])
                        last_refusal = refusal
                    if cfg.burst and not live:
                        if self._reap_before_leaving():
                            continue  # jobs of dead workers are waiting again: claim them
                        break
                    self._idle(cfg.poll_s)
                    continue
                last_refusal = None
                claim_ms = elapsed_ms(t0, self.clock)
                self._start_all(got["claimed"], t0, claim_ms, live)
            if self.fatal is None:
                self._drain()
            if self.fatal is None and self.exit_error is not None:
                self.fatal = self.exit_error  # stopped as asked: now its exit
        except BaseException as e:
            raised = e
            raise
        finally:
            self.stopping.set()
            if self.completer is not None:
                self.completer.close()
            if self.waiter is not None:
                self.waiter.close()
            self.calls.shutdown()
            self.slots.close()
            self.handler_threads.close()
            if self.watch is not None:
                self.watch.close()
            failure = raised or self.fatal
            if failure is not None:
                # Stopped by an error (a revoked token, a damaged database): its exit
                # carries the error; the log still ends with what the run did before it.
                self.log("stopped_worker", **self._summary(),
                         error=getattr(failure, "code", type(failure).__name__))
        if self.fatal is not None:
            raise self.fatal
        summary = self._summary()
        self.log("stopped_worker", **summary)
        self.stopped = True
        return summary

    def _summary(self) -> dict[str, Any]:
        """What this run did: its counts."""
        counts = self.counts
        return {"worker_id": self.config.worker_id, "claimed": counts["claimed"],
                "completed": counts["completed"], "failed": counts["failed"],
                "released": counts["released"], "lost": counts["lost"],
                "gate_refused": counts["gate_refused"], "reaped": counts["reaped"]}

    def _claim(self, free: int) -> dict[str, Any]:
        """Claim up to `free` jobs in one call (one job per call without batching): the
        claimed answers, or none and the reason."""
        cfg = self.config
        # The tenant is passed only when set: a worker for every tenant calls as it always did.
        bound = {} if cfg.tenant is None else {"tenant": cfg.tenant}
        if self.batched and self.batch_claims:
            return self.calls.claim_many(cfg.worker_id, free, lease_s=cfg.lease_s,
                                         kinds=self.kinds, **bound)
        got = self.calls.claim(cfg.worker_id, lease_s=cfg.lease_s, kinds=self.kinds, **bound)
        if got["job"] is None:
            return {"claimed": [], "reason": got["reason"], "detail": got["detail"]}
        return {"claimed": [got]}

    def _start(self, job: dict[str, Any], lease: dict[str, Any], t0: float, claim_ms: float,
               live: list[JobRun], via: str = "claim") -> None:
        self._start_all([{"job": job, "lease": lease}], t0, claim_ms, live, via)

    def _start_all(self, claimed: list[dict[str, Any]], t0: float, claim_ms: float,
                   live: list[JobRun], via: str = "claim") -> None:
        """Start the runs of one claim's jobs. Their `claimed` lines are written together,
        before any of them starts (a line per job, one write and flush per batch)."""
        with self._start_lock:
            self.claimed += len(claimed)
            self.count("claimed", len(claimed))
            self.log.write([self.log.line(
                "claimed", job_id=job["job_id"], epoch=lease["epoch"], kind=job["kind"],
                priority=job["priority"], attempt=job["attempt"],
                expires_at=lease["expires_at"], claim_ms=claim_ms, via=via,
                checkpoints=[c["name"] for c in job["checkpoints"]] or None)
                for job, lease in ((one["job"], one["lease"]) for one in claimed)])
            for one in claimed:
                job = one["job"]
                spec = self.config.handlers[job["kind"]]
                earlier = [r for r in live if r.job_id == job["job_id"]]
                run = JobRun(self, job, one["lease"], spec, claim_started=t0,
                             predecessor=earlier[-1] if earlier else None)
                self.runs.append(run)
                with self._count_lock:
                    self.active += 1
                run.start()

    def wants_next(self) -> bool:
        """Whether a run that just succeeded should claim the next job with its completion:
        only when the worker would claim for that slot anyway (not stopping, no --max-jobs
        count to keep exact; the slot is the finishing run's own, never a free one)."""
        return (self.chained and not self.stopping.is_set() and self.fatal is None
                and self.config.max_jobs is None)

    def start_next(self, got: dict[str, Any], t0: float) -> None:
        """Start the job a completion claimed (`got`, a claim's answer), in the finishing
        run's slot; a refusal starts nothing (the claim loop, woken as the run ends, claims
        and hears the gate itself). Claimed just as the worker began stopping, the job is
        released at once, as the drain would."""
        job, lease = got.get("job"), got.get("lease")
        if job is None or lease is None:
            return
        claim_ms = elapsed_ms(t0, self.clock)
        with self._start_lock:
            if not self.stopping.is_set():
                self._start(job, lease, t0, claim_ms, self.live_runs(), via="completion")
                return
        with self._start_lock:
            self.claimed += 1
            self.count("claimed")
        try:
            self.calls.fail(job["job_id"], self.config.worker_id, lease["epoch"],
                            "worker shutting down: the job was released to be retried",
                            reason="worker_shutdown", tenant=job.get("tenant"))
            self.log("released", job_id=job["job_id"], epoch=lease["epoch"],
                     reason="worker_shutdown", claimed_via="completion")
            self.count("released")
        except Exception as e:  # its lease then expires and the reaper offers it again
            code, message = describe(e)
            self.log("report_error", job_id=job["job_id"], epoch=lease["epoch"],
                     outcome="released", error=code, detail=message)

    def _give_up(self, e: BaseException, failing: float) -> BaseException:
        """A --burst worker's end when its coordinator stays out of reach: the log says so,
        and the error (its exit code: 6 for a server or database that cannot be reached, 5
        for one still busy) says how long it was tried."""
        code, message = describe(e)
        self.log("giving_up", error=code, detail=message, failing_s=round(failing, 3),
                 give_up_s=self.config.give_up_s)
        if not isinstance(e, JobcoordError):
            return e
        # A new error of the same class and code: the caught one may be held elsewhere (a
        # client's last error), and its message must stay what happened to that call.
        return type(e)(e.code, f"{e.message} (nothing got through for {failing:.1f}s; a "
                       f"--burst worker gives up after {self.config.give_up_s:g}s)",
                       **e.details)

    def _first_heartbeat(self) -> dict[str, Any]:
        """The first heartbeat, retried like every later one while the database cannot be
        reached (a worker started during a database restart waits for it; a --burst worker
        for at most `give_up_s`)."""
        backoff = Backoff(self.config.poll_s)
        outage = Outage(self.config.give_up_s)
        while True:
            t0 = self.clock.boot()
            try:
                return self.heartbeat()
            except Exception as e:
                if is_fatal(e) or isinstance(e, Refused) or self.stopping.is_set():
                    raise
                outage.failed(t0)
                now = self.clock.boot()
                if self.config.burst and outage.over(now):
                    raise self._give_up(e, outage.failing(now)) from None
                code, message = describe(e)
                wait = backoff.next()
                self.log("heartbeat_error", error=code, detail=message, retry_in_s=wait)
                self.stopping.wait(wait)

    def _idle(self, seconds: float) -> None:
        """Nothing to claim: wait for the store's hint that jobs may have become claimable
        (or a finished job, a signal), at most `seconds` (the poll, still the authority)."""
        if self.waiter is None:
            self.waiter = self.coordinator.db.change_waiter() if hasattr(
                self.coordinator, "db") else ChangeWaiter()
            self.log("waiting_for", hint=self.waiter.mode)
        end = time.monotonic() + seconds
        while not self.stopping.is_set():
            left = end - time.monotonic()
            if left <= 0 or not self.waiter.wait(left, self.wake) or self.wake.is_set():
                break
            # A hint is any commit (on SQLite, also other workers' refusals): look before
            # claiming, so idle workers do not answer each other's refusals with claims.
            if self._claimable():
                break
        self.wake.clear()

    def _claimable(self) -> bool:
        if not hasattr(self.coordinator, "claimable"):
            return True
        try:
            bound = {} if self.config.tenant is None else {"tenant": self.config.tenant}
            return bool(self.calls.claimable(self.config.worker_id, kinds=self.kinds, **bound))
        except Exception:
            return True  # the claim itself will say what is wrong

    def _pause(self, seconds: float) -> None:
        self.wake.wait(seconds)
        self.wake.clear()

    def _collect(self) -> None:
        for run in list(self.runs):
            if not run.thread.is_alive():
                self.runs.remove(run)
                if run.proc is not None:
                    self.children.discard(run.proc)

    def _drain(self) -> None:
        """Give running jobs the grace period, then release what is still running; join
        every run, also the settled ones whose handler has not returned yet."""
        end = time.monotonic() + self.config.grace_s
        while self.live_runs() and time.monotonic() < end:
            self._collect()
            time.sleep(0.02)
        with self._start_lock:  # a run started after this is released by its claimer
            for run in self.live_runs():
                run.release()
        # A completion checking its artifacts (a validator may run for minutes) ends now,
        # undecided: its run releases the job (run.py, `_report`). Only for as long as the
        # runs are joined: a program that ran this worker goes on using its coordinator.
        stopping = bool(self.live_runs())
        if stopping:
            self.coordinator.stop_checks()
        try:
            for run in list(self.runs):
                run.thread.join(self.config.kill_grace_s + 10.0)
        finally:
            if stopping:
                self.coordinator.resume_checks()
        self._collect()
        for run in self.runs:
            if not run.reported:
                # Still trying to report (the coordinator unreachable): the stop goes on
                # without it and closes its client. Its outcome never reached the
                # coordinator: the lease ends and the reaper takes the job back.
                run.abandoned = True
                self.count("lost")
                self.log("report_error", job_id=run.job_id, epoch=run.epoch,
                         error="worker_stopping", detail="the worker stopped while this "
                         "job's report was still being tried; its lease ends and the "
                         "reaper offers the job again")

    def job_finished(self) -> None:
        """A run is over (called after its slot is free)."""
        with self._count_lock:
            self.active -= 1
        self.wake.set()
