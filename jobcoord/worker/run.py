"""One claimed job (`JobRun`): start its handler, keep its lease (renewals, the wall-clock
budget, the clocks), and report its outcome with the epoch."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import faults
from ..app import Context, HandlerSpec
from ..clock import iso
from ..errors import InvalidInput, JobcoordError, Refused, StorageUnavailable
from ..leftovers import release, remove_outdir
from ..runtime import describe, is_fatal
from ..validate import MAX_JSON_DEPTH
from .clock import LOOP_MAX_WAIT_S, Clock, GapWatch
from .handlers import (
    LeaseLine,
    Outcome,
    call_python,
    described,
    kill_group,
    start_command,
    start_python,
)
from .threads import Task

if TYPE_CHECKING:
    from .loop import Worker

#: The lease is renewed after this fraction of its length has passed (every lease/3), so two
#: renewals can fail (a busy database, a slow disk) before the lease runs out.
RENEW_FRACTION = 1.0 / 3.0
#: Between tries of a renewal that failed (busy, unreachable) while no handler runs.
RETRY_S = 0.25
#: How often a late claim's pending renewal looks whether the worker was told to stop.
CONFIRM_LOOK_S = 0.1
#: A command stopped while its lease is still held (its budget spent, the worker stopping)
#: is killed this fraction of the lease (at most REPORT_MARGIN_MAX_S) before the lease's end
#: at the latest, whatever `--kill-grace` says: nothing renews the lease while the worker
#: waits for the command, and its report must land while the lease is its own. (Waiting out
#: the whole grace, the release or timeout was refused, and the reaper offered the job again
#: while the command still ran.)
REPORT_MARGIN = 0.25
REPORT_MARGIN_MAX_S = 1.0
#: How long a stop's release is tried when it cannot be sent (the coordinator unreachable).
RELEASE_REPORT_S = 3.0


class JobRun:
    """One claimed job: run its handler, keep the lease, report the outcome."""

    def __init__(self, worker: Worker, job: dict[str, Any], lease: dict[str, Any],
                 spec: HandlerSpec, claim_started: float | None = None,
                 predecessor: JobRun | None = None):
        self.w = worker
        #: When the claim was sent (boot clock): the lease cannot have started before it.
        self.claim_started = worker.clock.boot() if claim_started is None else claim_started
        self.job = job
        self.job_id: int = job["job_id"]
        self.epoch: int = lease["epoch"]
        #: The lease's end as the coordinator judges it (wall clock, microseconds).
        self.expires_at_us: int | None = lease.get("expires_at_us")
        #: An earlier run of the same job in this worker whose handler may still be alive
        #: (a Python handler ignoring its stop): this run's handler starts only after it.
        self.predecessor = predecessor
        self.spec = spec
        self.release_requested = threading.Event()
        self.wake = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        #: A command's line to its shim, told the lease's end after every renewal.
        self.lease_line: LeaseLine | None = None
        #: A Python handler's task (called on this run's own thread, or on one of the
        #: worker's handler threads), alive until the handler has returned.
        self.handler_thread: Task | None = None
        self.checkpoints_file: str | None = None
        #: Descriptors holding this run's command files (jobcoord.leftovers.hold).
        self.held: list[int] = []
        self.artifacts_out: str | None = None  # a command handler's artifacts directory
        #: Its files are staged under the lease: a report sent again sends only the completion.
        self.artifacts_staged = False
        self.artifacts_done: set[str] = set()  # file names staged so far (never twice)
        self.ctx: Context | None = None  # the handler's context, once made
        #: When this run's chained completion was first sent (boot clock): a report sent
        #: again may be handed the job the first one claimed, whose lease began after it.
        self.chain_sent: float | None = None
        #: Alive from now until the run has reported and its handler has returned: the slot.
        #: The worker is woken once it is over (never before: a woken claim loop must see
        #: the slot free).
        self.thread = Task(f"job-{self.job_id}", then=worker.job_finished)
        self.outcome: str | None = None
        #: The outcome has been reported (or given up on): the run is about to end, unless
        #: its handler is still running.
        self.reported = False
        #: The worker stopped while this run still tried to report (`Worker._drain` waited
        #: its bound): counted lost there, and whatever this thread meets afterwards (its
        #: client closed) is the stop, logged by nobody.
        self.abandoned = False
        #: While a Python handler runs inline: hands it over to a lease loop now.
        self._take_over: Callable[[], None] | None = None

    @property
    def ending(self) -> bool:
        """Reported, with no handler left running: its slot is free within moments."""
        handler = self.handler_thread
        return self.reported and (handler is None or not handler.is_alive())

    def start(self) -> None:
        self.w.slots.run(self._main, self.thread)

    def release(self) -> None:
        self.release_requested.set()
        self.wake.set()
        take_over = self._take_over
        if take_over is not None:
            take_over()

    def _stop_handler(self, ctx: Context, reason: str, lease_end: float | None = None
                      ) -> None:
        """Stop the handler: a Python one is told (`ctx.cancelled`); a command gets SIGTERM,
        then SIGKILL after `--kill-grace`, or sooner when the lease (held still, ending at
        `lease_end` on the boot clock) would end first (REPORT_MARGIN)."""
        ctx.cancel(reason)
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        grace = self.w.config.kill_grace_s
        if lease_end is not None:
            lease_s = self.w.config.lease_s
            margin = min(lease_s * REPORT_MARGIN, REPORT_MARGIN_MAX_S)
            grace = min(grace, max(0.0, lease_end - margin - self.w.clock.boot()))
        kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill_group(proc, signal.SIGKILL)
            proc.wait()


    # -- the lease loop --

    def _main(self) -> None:
        try:
            lease_end = self._lease_confirmed()
            if lease_end is None:
                return
            if self.release_requested.is_set():
                # Told to stop before its handler started: the job goes back unrun. A
                # handler started now would run on beside the job's next attempt once the
                # release has made it claimable (a Python thread cannot be stopped).
                self._report(Outcome("released", error="worker shutting down before the "
                                     "job started: released to be retried"), 0.0, None,
                             lease_end)
                self.reported = True
                return
            if (self.spec.command is None and self.predecessor is None
                    and self.w.watch is not None):
                self._run_inline()
            else:
                self._run()
        except Exception as e:
            if self.abandoned:
                return  # the client closed under it by the stop: counted already
            # A bug here must not kill the worker silently: say so; the lease then expires
            # and the reaper offers the job again.
            self.w.log("internal_error", job_id=self.job_id, epoch=self.epoch,
                       error=f"{type(e).__name__}: {e}")
            self.w.count("internal_errors")
        finally:
            if self.checkpoints_file is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.checkpoints_file)
            if self.artifacts_out is not None:
                remove_outdir(self.artifacts_out)
            release(self.held)

    def _lease_confirmed(self) -> float | None:
        """The lease's local end (boot clock) when the lease can be kept by the usual
        renewals, None when it is lost. A claim answered with less than a renewal's interval
        (a third) of its lease left by the local count, from when the claim was sent (a
        stalled server answering a long-poll on resuming, a slow database), while the
        coordinator's lease began only when it answered: the lease is renewed before any
        handler starts, and the coordinator decides. Nothing runs meanwhile, so the renewal
        is waited for up to a lease (the coordinator's lease, begun before its answer
        arrived, ends before then), unless the worker is told to stop: then the release
        decides, at once. Refused, or never answered, the job is not run and nothing is
        reported (it has moved on, or its lease ends)."""
        w, clock, cfg = self.w, self.w.clock, self.w.config
        start = clock.boot()
        if start < self.claim_started + cfg.lease_s * (1 - RENEW_FRACTION):
            # At least a renewal's interval left: the handler starts, the renewal follows.
            return self.claim_started + cfg.lease_s
        end = start + cfg.lease_s
        while True:
            t0 = clock.boot()
            renewal = w.calls.submit("renew", self.job_id, cfg.worker_id, self.epoch,
                                     lease_s=cfg.lease_s, tenant=self.job.get("tenant"))
            try:
                got = self._answer_unless_stopped(renewal, end)
                if got is None:
                    return end  # told to stop: the release is sent now; this answer is moot
            except concurrent.futures.TimeoutError:
                code, message = "lease_expired", "no renewal confirmed the late claim's lease"
            except Refused as e:
                code, message = e.code, e.message
            except Exception as e:
                code, message = describe(e)
                if not is_fatal(e) and clock.boot() + RETRY_S < end:
                    w.log("renew_error", job_id=self.job_id, epoch=self.epoch, error=code,
                          detail=message)
                    self.release_requested.wait(RETRY_S)
                    continue
            else:
                w.log("lease_confirmed", job_id=self.job_id, epoch=self.epoch,
                      expires_at=got["expires_at"],
                      claim_s=round(start - self.claim_started, 3))
                self.claim_started = t0  # the lease now runs from this renewal
                self.expires_at_us = got.get("expires_at_us", self.expires_at_us)
                return t0 + cfg.lease_s
            w.log("lease_lost", job_id=self.job_id, epoch=self.epoch, reason=code,
                  detail=message)
            self.outcome = "lost"
            w.count("lost")
            self.reported = True
            return None

    def _answer_unless_stopped(self, call: concurrent.futures.Future[Any], end: float
                               ) -> Any:
        """`call`'s answer, waited for until the boot clock reaches `end` (TimeoutError) in
        pieces of CONFIRM_LOOK_S, so that a stop asked meanwhile is seen at once: then None.
        The call's own error is raised."""
        clock = self.w.clock
        while not self.release_requested.is_set():
            left = end - clock.boot()
            if left <= 0:
                raise concurrent.futures.TimeoutError
            with contextlib.suppress(concurrent.futures.TimeoutError):
                return call.result(timeout=min(left, CONFIRM_LOOK_S))
        return None

    def _context(self) -> Context:
        w = self.w
        checkpoints = {c["name"]: c["data"] for c in self.job.get("checkpoints") or []}
        self.ctx = Context(job_id=self.job_id, epoch=self.epoch,
                           attempt=self.job.get("attempt", 1), kind=self.spec.kind,
                           worker_id=w.config.worker_id, checkpoints=checkpoints,
                           coordinator=w.calls, tenant=self.job.get("tenant"), log=w.log)
        return self.ctx

    def _has_artifacts(self) -> bool:
        """Whether this attempt staged artifacts: its completion checks them first, which
        may take minutes (a kind's validator)."""
        return bool(self.artifacts_done) or (self.ctx is not None
                                             and self.ctx.artifacts_staged > 0)

    def _run_inline(self) -> None:
        """A Python handler called on this run's own thread, without a hand-off to a handler
        thread and back (most handlers return long before anything needs watching). Its
        lease is watched all the same: at the first moment the lease loop would have had
        something to do or look at (a renewal, the budget, the lease's end, or its regular
        look every LOOP_MAX_WAIT_S), a handler still running is handed over to the lease
        loop (`_run`), started on a handler thread while the handler goes on here."""
        w, clock, cfg = self.w, self.w.clock, self.w.config
        assert w.watch is not None
        started = clock.boot()
        started_at = iso(clock.wall_us())
        due = min(self.claim_started + cfg.lease_s * RENEW_FRACTION,
                  self.claim_started + cfg.lease_s, started + self.spec.timeout_s,
                  started + LOOP_MAX_WAIT_S)
        ctx = self._context()
        gaps = GapWatch(clock)  # a suspend while the handler runs here is seen by the loop
        box: dict[str, Outcome] = {}
        handler = self.handler_thread = Task(f"handler-{self.job_id}")
        lock = threading.Lock()
        keeper: list[Task] = []

        def keep() -> None:
            try:
                self._run(ctx, lambda: box.get("out"), started, started_at, gaps)
            except Exception as e:  # as in _main
                if self.abandoned:
                    return
                self.w.log("internal_error", job_id=self.job_id, epoch=self.epoch,
                           error=f"{type(e).__name__}: {e}")
                self.w.count("internal_errors")

        def take_over() -> None:
            with lock:
                if handler.is_alive() and not keeper:
                    keeper.append(w.handler_threads.submit(keep, name=f"job-{self.job_id}"))
                    w.count("handed_over")

        entry = w.watch.at(due, take_over)
        self._take_over = take_over  # a release (shutdown) hands over at once
        if self.release_requested.is_set():
            take_over()
        box["out"] = call_python(self, ctx)
        with lock:
            handler.end()
            entry.cancel()
            self._take_over = None
        self.wake.set()
        if keeper:
            keeper[0].join()
        else:
            self._run(ctx, lambda: box.get("out"), started, started_at, gaps)

    def _run(self, ctx: Context | None = None,
             poll: Callable[[], Outcome | None] | None = None,
             started: float | None = None, started_at: str | None = None,
             gaps: GapWatch | None = None) -> None:
        """The lease loop: start the handler (unless `poll` is given: it runs already,
        since `started`), renew, watch the budget and the clocks, stop it when the lease is
        lost or the job cancelled, and report its outcome."""
        w, log = self.w, self.w.log
        cfg, clock = w.config, w.clock
        if started is None:
            started = clock.boot()
            started_at = iso(clock.wall_us())
        lease_s = cfg.lease_s
        renew_every = lease_s * RENEW_FRACTION
        # Measured from before the claim was sent, so the local end is never later than the
        # coordinator's; on CLOCK_BOOTTIME, so a suspend counts; and the wall clock is checked
        # against the lease's own end too: the worker gives up no later than the lease
        # really ends.
        lease_end = self.claim_started + lease_s
        next_renew = self.claim_started + renew_every
        # The budget counts from the claim, including any wait for an earlier handler.
        deadline = started + self.spec.timeout_s
        if ctx is None:
            ctx = self._context()
        if gaps is None:
            gaps = GapWatch(clock)
        waiting_logged = False
        result: Outcome | None = None
        handler_done: float | None = None  # when the handler ended, if its files are staged
        # An outcome decided (a spent budget, a shutdown) while a Python handler told to stop
        # still runs: a thread cannot be stopped from outside, so the lease is kept, renewed,
        # and the outcome reported only once it returned. Settled at once, the job was
        # claimable again (at once when released) beside the handler still running here.
        settle: Outcome | None = None
        settle_since = 0.0
        while result is None:
            if poll is None:
                earlier = self._earlier_alive()
                if earlier is None:
                    if waiting_logged:
                        log("earlier_handler_returned", job_id=self.job_id, epoch=self.epoch)
                    self.predecessor = None
                    poll = self._start_handler(ctx, lease_end)
                elif not waiting_logged:
                    # Never two handlers of one job alive in one worker: hold the lease and
                    # start this one only once the earlier one has returned.
                    log("waiting_for_earlier_handler", job_id=self.job_id, epoch=self.epoch,
                        earlier_epoch=earlier.epoch)
                    waiting_logged = True
            if poll is not None:
                result = poll()
                if result is not None and settle is not None:
                    log("handler_returned_late", job_id=self.job_id, epoch=self.epoch,
                        late_s=round(clock.boot() - settle_since, 3))
                    result = settle
                    break
                if result is not None:
                    staging = None if handler_done is not None else self._staging(result)
                    if staging is None:
                        break
                    # The command's files are staged under the lease, kept renewed meanwhile.
                    handler_done, poll, result = clock.boot(), staging, None
            gap = gaps.check()
            now = clock.boot()
            if gap:
                # Suspended (or the clock stepped): the lease may be over already. Look at
                # the wall clock below, and renew at once if it is not.
                log("clock_gap", job_id=self.job_id, epoch=self.epoch, gap_s=round(gap, 3))
                next_renew = min(next_renew, now)
            if self.expires_at_us is not None and clock.wall_us() >= self.expires_at_us:
                log("lease_lost", job_id=self.job_id, epoch=self.epoch, reason="lease_expired",
                    detail="the wall clock is past the lease's end (suspended, or the clock "
                    "stepped)")
                self._stop_handler(ctx, "lease_expired")
                result = Outcome("lost", code="lease_expired")
                break
            if settle is None and ctx.cancelled:  # a fenced write from the handler was refused
                self._stop_handler(ctx, ctx.cancel_reason or "cancelled")
                result = Outcome("lost", code=ctx.cancel_reason)
                break
            if settle is None and now >= deadline and handler_done is None:
                self._stop_handler(ctx, "timeout", lease_end)
                why = (f"wall-clock budget of {self.spec.timeout_s:g}s exceeded"
                       if poll is not None else
                       f"wall-clock budget of {self.spec.timeout_s:g}s exceeded while an "
                       "earlier handler of this job was still running in this worker")
                result = Outcome("timeout", error=why)
                if not self._thread_still_running():
                    break
                settle, result, settle_since = result, None, clock.boot()
                log("handler_still_running", job_id=self.job_id, epoch=self.epoch,
                    reason="timeout", holding_lease=True)
            if settle is None and self.release_requested.is_set():
                self._stop_handler(ctx, "worker_shutdown", lease_end)
                result = Outcome("released", error="worker shutting down: the job was "
                                  "released to be retried")
                if not self._thread_still_running():
                    break
                settle, result, settle_since = result, None, clock.boot()
                log("handler_still_running", job_id=self.job_id, epoch=self.epoch,
                    reason="worker_shutdown", holding_lease=True)
            if now >= next_renew:
                t0 = clock.boot()
                try:
                    # Waited for only until the lease's end: a call to a server that hears
                    # nothing (a partition) has its own timeout and retries, longer than a
                    # short lease, and the handler must not run on past it meanwhile.
                    got = w.calls.within(lease_end - t0, "renew", self.job_id, cfg.worker_id,
                                         self.epoch, lease_s=lease_s,
                                         tenant=self.job.get("tenant"))
                except concurrent.futures.TimeoutError:
                    log("lease_lost", job_id=self.job_id, epoch=self.epoch,
                        reason="lease_expired", detail="no renewal got through in time (the "
                        "last one is still unanswered)")
                    self._stop_handler(ctx, "lease_expired")
                    result = Outcome("lost", code="lease_expired")
                    break
                except Refused as e:
                    log("lease_lost", job_id=self.job_id, epoch=self.epoch, reason=e.code,
                        detail=e.message)
                    self._stop_handler(ctx, e.code)
                    result = Outcome("lost", code=e.code)
                    break
                except Exception as e:
                    # Busy, unreachable, restarting: try again soon, while the lease may
                    # still be ours (the lease's end below decides).
                    code, message = describe(e)
                    log("renew_error", job_id=self.job_id, epoch=self.epoch, error=code,
                        detail=message)
                    next_renew = clock.boot() + min(1.0, renew_every)
                else:
                    lease_end = t0 + lease_s
                    next_renew = t0 + renew_every
                    self.expires_at_us = got.get("expires_at_us", self.expires_at_us)
                    line = self.lease_line
                    if line is not None:  # the command's shim stops it at the lease's end
                        line.tell(self._lease_left(lease_end))
                    log("renewed", job_id=self.job_id, epoch=self.epoch,
                        expires_at=got["expires_at"],
                        renew_ms=round((clock.boot() - t0) * 1000, 1))
            if clock.boot() >= lease_end:
                log("lease_lost", job_id=self.job_id, epoch=self.epoch,
                    reason="lease_expired", detail="no renewal got through in time")
                self._stop_handler(ctx, "lease_expired")
                result = Outcome("lost", code="lease_expired")
                break
            wait = min(next_renew, deadline if settle is None else next_renew,
                       lease_end) - clock.boot()
            self.wake.wait(max(0.0, min(wait, LOOP_MAX_WAIT_S)))
            self.wake.clear()
        duration = (clock.boot() if handler_done is None else handler_done) - started
        if result.kind == "success" and ctx.cancelled:
            result = Outcome("lost", code=ctx.cancel_reason)
        if result.kind != "lost" and self._lease_left(lease_end) <= 0:
            # The handler returned after the lease's end, seen only now: the process was
            # stopped or suspended, and on resuming the handler's return came before the
            # loop's look at the clocks. The attempt is over; its outcome is discarded, not
            # sent (another worker may hold the job by now).
            log("lease_lost", job_id=self.job_id, epoch=self.epoch, reason="lease_expired",
                detail="the handler returned after the lease's end (the worker was stopped "
                "or suspended meanwhile): its outcome is discarded")
            result = Outcome("lost", code="lease_expired")
        self._report(result, duration, started_at, lease_end)
        self.reported = True
        handler = self.handler_thread
        if handler is not None and handler.is_alive():
            # A Python thread cannot be stopped from outside. Its outcome is settled, but it
            # keeps its slot until it returns, so the worker never runs more handlers at once
            # than --concurrency allows (they may hold a GPU's memory).
            log("handler_still_running", job_id=self.job_id, epoch=self.epoch,
                reason=ctx.cancel_reason)
            t0 = time.monotonic()
            handler.join()
            log("handler_returned_late", job_id=self.job_id, epoch=self.epoch,
                late_s=round(time.monotonic() - t0, 3))

    def _thread_still_running(self) -> bool:
        """Whether a Python handler told to stop has not returned (a command is stopped by
        `_stop_handler` itself, within the lease)."""
        handler = self.handler_thread
        return self.proc is None and handler is not None and handler.is_alive()

    def _staging(self, result: Outcome) -> Callable[[], Outcome | None] | None:
        """A command's success that left files to stage: their staging, begun on a thread
        of its own, as the poll the lease loop waits on, renewing the lease meanwhile (an
        upload may take longer than what is left of the lease: a large file, a slow network
        to the server); it answers `result` once they are staged. None when there is
        nothing to stage. A staging that fails is logged and left to the report, which
        stages the files not staged yet and says what went wrong if it fails too."""
        out = self.artifacts_out
        if result.kind != "success" or out is None or self.artifacts_staged:
            return None
        with contextlib.suppress(OSError), os.scandir(out) as entries:
            if not any(True for _ in entries):
                return None
        w, cfg = self.w, self.w.config
        done = threading.Event()

        def stage() -> None:
            from ..artifacts.rules import stage_outdir

            try:
                stage_outdir(w.calls, out, self.job_id, cfg.worker_id, self.epoch,
                             self.job.get("tenant"), done=self.artifacts_done)
                self.artifacts_staged = True
            except Exception as e:  # the report stages the rest, and says why if it fails
                code, message = describe(e)
                w.log("artifacts_stage_error", job_id=self.job_id, epoch=self.epoch,
                      error=code, detail=message, staged=len(self.artifacts_done))
            finally:
                done.set()
                self.wake.set()

        threading.Thread(target=stage, name=f"jobcoord-stage-{self.job_id}",
                         daemon=True).start()
        return lambda: result if done.is_set() else None

    def _earlier_alive(self) -> JobRun | None:
        """The nearest earlier run of this job in this worker that is still alive (None:
        none): a predecessor that ended without starting its handler (its lease ended while it
        waited) still has its predecessor, whose handler may be running."""
        run = self.predecessor
        while run is not None and not run.thread.is_alive():
            run = run.predecessor  # None once it had started its handler (now returned)
        return run

    def _lease_left(self, lease_end: float) -> float:
        """Seconds until the lease ends: at its local end (`lease_end`, boot clock) or, if
        sooner, at its end by the wall clock the coordinator judges by."""
        clock = self.w.clock
        left = lease_end - clock.boot()
        if self.expires_at_us is not None:
            left = min(left, (self.expires_at_us - clock.wall_us()) / 1e6)
        return left

    def _start_handler(self, ctx: Context, lease_end: float) -> Callable[[], Outcome | None]:
        try:
            return (start_command(self, ctx, self._lease_left(lease_end))
                    if self.spec.command is not None else start_python(self, ctx))
        except OSError as e:
            outcome = Outcome("failed", error=f"cannot start command: {e}")
            return lambda: outcome

    def _report(self, out: Outcome, duration: float, started_at: str | None,
                lease_end: float) -> None:
        w, log = self.w, self.w.log
        base = {"job_id": self.job_id, "epoch": self.epoch, "kind": self.spec.kind,
                "duration_s": round(duration, 3)}
        tenant = self.job.get("tenant")
        self.outcome = out.kind
        if out.kind == "lost":
            # The lease is someone else's now: report nothing, the late result never lands.
            log("stopped", **base, reason=out.code)
            w.count("lost")
            return
        if out.kind == "success":
            limit = w.result_limit(self.spec)
            try:
                size = len(json.dumps(out.result, ensure_ascii=False, allow_nan=False).encode())
            except (TypeError, ValueError) as e:
                out = Outcome("invalid", error=f"the result is not JSON: {e}")
            except RecursionError:
                # Deeper than the encoder can walk (and far deeper than the coordinator
                # takes): the attempt fails like any other result it would refuse.
                out = Outcome("invalid", error="the result was refused: result is nested "
                              f"deeper than {MAX_JSON_DEPTH} levels")
            except Exception as e:
                # The result's own code raised while it was encoded (a mapping whose items()
                # fails): escaped, the attempt was reported by nobody.
                out = Outcome("invalid", error=f"the result is not JSON: {described(e)}")
            else:
                if size > limit:
                    out = Outcome("too_large", error=f"result is {size} bytes, larger than "
                                   f"the {limit} byte budget")
            if out.kind == "success" and out.provenance:
                problem = _provenance_problem(out.provenance)
                if problem is not None:
                    out = Outcome("invalid", error=problem)
        t0 = time.monotonic()
        release_by: float | None = None
        while True:
            try:
                self._deliver(out, base, duration, started_at, tenant, t0, lease_end)
                return
            except NoArtifactStore as e:
                # Only the operator's migrate heals it: every attempt would run the command
                # to its end and fail the same way (it waited out its lease, then did).
                out = Outcome("permanent", error=str(e))
                continue
            except InvalidInput as e:
                if out.kind != "success":
                    raise
                if e.code == "artifact_store_missing":
                    # The coordinator's store is not where this attempt's objects were put
                    # (moved, or a server restarted with another --artifacts): nothing of
                    # the attempt's doing, and every job with files would meet it. The job
                    # goes back with its try (a release), and the worker stops (exit 2).
                    log("report_error", **base, outcome=out.kind, error=e.code,
                        detail=e.message)
                    w.stop_after(e)
                    out = Outcome("released", error=f"not completed: {e.message}")
                    continue
                if e.details.get("command_file") is not None:
                    # A file the command left that no artifact may be: it leaves it again.
                    out = Outcome("invalid_output",
                                  error=f"the command's file was refused: {e.message}")
                    continue
                # The coordinator refused the result itself (too deep, bad text): the
                # attempt failed like a handler exception would.
                out = Outcome("invalid", error=f"the result was refused: {e.message}")
            except Refused as e:
                if e.code == "artifact_invalid":
                    # The completion's checks refused an artifact: the coordinator failed
                    # the attempt (its lease was still ours), as a handler's failure.
                    log("failed", **base, reason=e.code, permanent=False,
                        status=e.details.get("status"), error=e.message[:500],
                        report_ms=elapsed_ms(t0))
                    w.count("failed")
                    return
                log("report_refused", **base, outcome=out.kind, reason=e.code,
                    detail=e.message)
                w.count("lost")
                return
            except Exception as e:
                if self.abandoned:
                    return  # the worker stopped without it: counted lost there
                if (isinstance(e, StorageUnavailable) and e.code == "server_stopping"
                        and self.release_requested.is_set() and out.kind == "success"):
                    # This worker is stopping and its grace ended the completion's artifact
                    # checks, nothing decided: the job goes back, as a handler still running.
                    out = Outcome("released", error="worker shutting down during the "
                                  "completion's artifact checks")
                    continue
                code, message = describe(e)
                # Keep trying while the lease may still be ours (a busy, restarting or
                # briefly unreachable database); after that it is moot. Errors no retry can
                # heal end the attempt's report at once. A stop's release is tried for
                # moments only: it spares the next worker the lease's end, which is all an
                # undelivered one costs (the reaper takes the job back); tried to the end of
                # a long lease, it outlasted the stop's wait for it, and the stop closed its
                # client under it.
                give_up = lease_end
                if out.kind == "released" and self.release_requested.is_set():
                    if release_by is None:
                        release_by = self.w.clock.boot() + RELEASE_REPORT_S
                    give_up = min(lease_end, release_by)
                if is_fatal(e) or self.w.clock.boot() >= give_up:
                    log("report_error", **base, outcome=out.kind, error=code, detail=message)
                    w.count("report_errors")
                    w.count("lost")  # its outcome never reached the coordinator
                    if is_fatal(e):
                        # The next job's report would meet it too: claiming on would take
                        # every job it reaches and lose each one's result.
                        w.stop_for(e)
                    return
                log("report_retry", **base, outcome=out.kind, error=code)
                time.sleep(0.25)

    def _deliver(self, out: Outcome, base: dict[str, Any], duration: float,
                 started_at: str | None, tenant: str | None, t0: float,
                 lease_end: float) -> None:
        w, log, cfg = self.w, self.w.log, self.w.config
        if out.kind == "success":
            prov = w.provenance(self.spec, out.provenance or {}, duration, self.epoch,
                                self.job.get("attempt"), started_at)
            if self.artifacts_out is not None and not self.artifacts_staged:
                # The command's files, staged under the lease once. A report sent again (its
                # completion's answer lost) goes straight to the completion: its answer
                # (`already_accepted`, or the real refusal) decides. Uploading the same files
                # again could only be refused once that completion had committed, which
                # would turn this worker's accepted result into a refusal.
                from ..artifacts.rules import stage_outdir

                try:
                    stage_outdir(w.calls, self.artifacts_out, self.job_id, cfg.worker_id,
                                 self.epoch, tenant, done=self.artifacts_done)
                except JobcoordError as e:
                    if e.code != "feature_missing":
                        raise
                    raise NoArtifactStore(NO_STORE_ERROR) from e
                self.artifacts_staged = True
            faults.point("worker.before_complete")  # (a test moves the store here)
            if w.completer is not None and not self._has_artifacts():
                # (One with artifacts completes on its own: its checks would hold every
                # later group, whose leases nobody renews, behind them.)
                # Acknowledged only once the group holding this result has committed; its
                # `completed` line is written with the group's (`Worker._log_completed`).
                w.completer.complete({"job_id": self.job_id, "worker_id": cfg.worker_id,
                                      "epoch": self.epoch, "result": out.result,
                                      "provenance": prov, "tenant": tenant}, lease_end,
                                     note=(base, t0))
                return
            # One with artifacts claims nothing with its completion: the checks before its
            # answer may outlast this worker's stop, and a job claimed by an answer nobody
            # reads sits leased to nobody until the reaper counts its attempt.
            if w.wants_next() and not self._has_artifacts():
                if self.chain_sent is None:
                    self.chain_sent = w.clock.boot()
                sent = self.chain_sent  # the next lease cannot have started before this
                both = w.calls.complete_and_claim(
                    self.job_id, cfg.worker_id, self.epoch, out.result, provenance=prov,
                    tenant=tenant, lease_s=cfg.lease_s, kinds=w.kinds)
                log("completed", **base, report_ms=elapsed_ms(t0))
                w.count("completed")
                w.start_next(both["next"], sent)
                return
            else:
                w.calls.complete(self.job_id, cfg.worker_id, self.epoch, out.result,
                                 provenance=prov, tenant=tenant)
            log("completed", **base, report_ms=elapsed_ms(t0))
            w.count("completed")
            return
        reason, permanent = {
            "failed": ("failed", False),
            "invalid": ("invalid_result", False),
            # A command's output that `complete --result` would refuse: the same command
            # prints it again, so no retry (the error keeps the evidence).
            "invalid_output": ("invalid_result", True),
            "permanent": ("failed", True),
            "timeout": ("timeout", not self.spec.retry_on_timeout),
            "too_large": ("result_too_large", not self.spec.retry_on_too_large),
            "released": ("worker_shutdown", False),
        }[out.kind]
        error = _clean(out.error or out.kind)
        faults.point("worker.before_fail_report")
        got = w.calls.fail(self.job_id, cfg.worker_id, self.epoch, error, permanent=permanent,
                        reason=reason, tenant=tenant)
        event = "released" if out.kind == "released" else "failed"
        log(event, **base, reason=reason, permanent=permanent, status=got["status"],
            error=error[:500], report_ms=elapsed_ms(t0))
        w.count(event)



def _provenance_problem(reported: Mapping[str, Any]) -> str | None:
    """Why the provenance a handler returned cannot be stored (as Worker.provenance writes
    it), or None. Found at the report, it was an internal error at every try until the
    lease ran out, and the reaper ended the job with no error recorded."""
    try:
        json.dumps(dict(reported), default=str)
    except RecursionError:
        return (f"the provenance was refused: it is nested deeper than {MAX_JSON_DEPTH} "
                "levels")
    except Exception as e:  # a tuple key, a number past the encoder's digits, a bad repr
        return f"the provenance is not JSON: {described(e)}"
    return None


NO_STORE_ERROR = ("the command left files in $JOBCOORD_ARTIFACTS_OUT but this database has "
                  "no artifact storage: run `jobcoord migrate --with artifacts`, then "
                  "`jobcoord retry` this job")


class NoArtifactStore(Exception):
    """A command's files cannot be staged: the database has no artifact storage."""


#: Longest error text kept per attempt (the coordinator's own limit is larger).
MAX_ERROR_CHARS = 4000


def _clean(text: str) -> str:
    """Error text the coordinator accepts whatever a handler raised: valid UTF-8, no NUL,
    bounded (the end of a message usually says the most, so keep both ends)."""
    text = text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")
    if len(text) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2
        text = text[:half] + " [...] " + text[-half:]
    return text


def elapsed_ms(t0: float, clock: Clock | None = None) -> float:
    """Milliseconds since t0 (time.monotonic(), or the boot clock of `clock`)."""
    now = clock.boot() if clock is not None else time.monotonic()
    return round((now - t0) * 1000, 1)
