"""The worker runtime: claim, run a handler under a lease, report the outcome with the epoch.

One worker process runs up to `concurrency` jobs at a time. Threads:

- the main thread claims (only the kinds it has handlers for) and handles SIGTERM/SIGINT;
- a ticker thread heartbeats the machine's real readings every `heartbeat_s` and reaps
  expired leases every `reap_s` (any number of workers reaping at once is safe: each change
  is a compare-and-set on status and epoch);
- one thread per running job waits for its handler, renews the lease every lease/3
  (`RENEW_FRACTION`), enforces the wall-clock budget, and reports the outcome.

Handlers (a Python callable in a thread, or a command in its own process group) run outside
every database transaction. Once a renewal is refused (lease expired, stale epoch, job
cancelled, not the owner) the handler is stopped and nothing is reported: the job belongs to
someone else now. A command is stopped with SIGTERM to its process group, then SIGKILL after
`kill_grace_s`; a Python handler sees `ctx.cancelled`.

Outcomes: success -> `complete` with provenance; an exception or non-zero exit -> `fail`,
retried with backoff; `PermanentError` or exit code 65 (`PERMANENT_EXIT_CODE`, sysexits'
EX_DATAERR: the input is wrong, retrying cannot help) -> `fail` permanent (`dead`); timeout
-> `fail` with reason `timeout`; oversized result -> `fail` with reason `result_too_large`;
shutdown after the grace period -> `fail` with reason `worker_shutdown` (always retryable).

Command protocol. The payload is written as JSON to stdin; stdout must be one JSON value, the
result (empty stdout is `{}`). To report provenance, print an envelope instead:
`{"jobcoord_envelope": 1, "result": ..., "provenance": {...}}`. The environment carries
JOBCOORD_JOB_ID, JOBCOORD_EPOCH, JOBCOORD_WORKER, JOBCOORD_ATTEMPT, JOBCOORD_KIND,
JOBCOORD_TENANT, JOBCOORD_CHECKPOINTS_FILE (a file holding a JSON object: checkpoint name ->
data, from earlier attempts), JOBCOORD_CHECKPOINTS (the same JSON, when it is at most 32 KiB)
and JOBCOORD_URL (the database), so the command can run
`jobcoord checkpoint "$JOBCOORD_JOB_ID" --worker "$JOBCOORD_WORKER" --epoch "$JOBCOORD_EPOCH"
--name NAME --data JSON` and `jobcoord effect ...` itself.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from . import __version__
from .app import Cancelled, Context, HandlerSpec, PermanentError, Result
from .clock import iso, now_us
from .errors import (
    DatabaseBusy,
    InvalidInput,
    JobcoordError,
    Refused,
    StorageUnavailable,
)
from .readings import current_readings

#: The lease is renewed after this fraction of its length has passed (every lease/3), so two
#: renewals can fail (a busy database, a slow disk) before the lease runs out.
RENEW_FRACTION = 1.0 / 3.0
#: A command exiting with this code failed permanently: the job goes to `dead`, no retry.
PERMANENT_EXIT_CODE = 65
#: How much of a failing command's stderr is kept in the job's error.
STDERR_TAIL_BYTES = 2000
#: Refusal codes that come from the machine's state (logged as "gate refused").
GATE_CODES = frozenset({"memory_gate", "thermal_gate", "power_gate", "user_active",
                        "heartbeat_stale", "heartbeat_missing"})
#: Checkpoints larger than this reach a command only through JOBCOORD_CHECKPOINTS_FILE.
CHECKPOINTS_ENV_MAX_BYTES = 32 * 1024
#: Exit code after a second SIGTERM/SIGINT (exit at once, leases left to expire).
EXIT_FORCED = 130


@dataclass
class WorkerConfig:
    worker_id: str
    handlers: dict[str, HandlerSpec]
    roles: list[str]
    lease_s: float = 30.0
    heartbeat_s: float = 10.0
    #: Reap expired leases this often (0: never; a dedicated `jobcoord reap --every` does it).
    reap_s: float = 5.0
    poll_s: float = 1.0
    concurrency: int = 1
    #: After SIGTERM/SIGINT, running jobs get this long to finish before they are released.
    grace_s: float = 10.0
    #: A command gets this long between SIGTERM and SIGKILL.
    kill_grace_s: float = 5.0
    readings_override: dict[str, Any] = field(default_factory=dict)
    log_format: str = "text"
    #: Database URL handed to commands (JOBCOORD_URL).
    database_url: str | None = None
    #: Stop after this many jobs were claimed (None: no limit).
    max_jobs: int | None = None
    #: Exit once nothing is running and a claim gets nothing, whatever the reason (no job,
    #: or a gate): a script running the queue dry must not hang on a busy machine.
    burst: bool = False


class Log:
    """One line per decision, on stderr: `text` for people, `json` for machines."""

    def __init__(self, worker_id: str, fmt: str = "text", stream: IO[str] | None = None):
        self.worker_id = worker_id
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        ts = iso(now_us())
        if self.fmt == "json":
            line = json.dumps({"ts": ts, "worker": self.worker_id, "event": event, **fields},
                              default=str)
        else:
            parts = " ".join(f"{k}={_text(v)}" for k, v in fields.items() if v is not None)
            line = f"{ts} {self.worker_id} {event} {parts}".rstrip()
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed log must never stop the work


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    text = str(value)
    return shlex.quote(text) if (" " in text or not text) else text


class _Serialized:
    """Runs coordinator calls on a small fixed set of long-lived threads: handler and job
    threads come and go, and a connection pool keyed by thread must not see them all."""

    def __init__(self, coordinator: Any, threads: int = 2):
        self._c = coordinator
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "jobcoord-db")

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._c, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._pool.submit(method, *args, **kwargs).result()

        return call

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Outcome:
    kind: str  # success | failed | permanent | timeout | too_large | released | lost
    result: Any = None
    provenance: Mapping[str, Any] | None = None
    error: str | None = None
    code: str | None = None


class JobRun:
    """One claimed job: run its handler, keep the lease, report the outcome."""

    def __init__(self, worker: Worker, job: dict[str, Any], lease: dict[str, Any],
                 spec: HandlerSpec, claim_started: float | None = None):
        self.w = worker
        #: When the claim was sent (monotonic): the lease cannot have started before it.
        self.claim_started = time.monotonic() if claim_started is None else claim_started
        self.job = job
        self.job_id: int = job["job_id"]
        self.epoch: int = lease["epoch"]
        self.spec = spec
        self.release_requested = threading.Event()
        self.wake = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.handler_thread: threading.Thread | None = None
        self.checkpoints_file: str | None = None
        self.thread = threading.Thread(target=self._main, name=f"job-{self.job_id}",
                                       daemon=True)
        self.outcome: str | None = None

    def start(self) -> None:
        self.thread.start()

    def release(self) -> None:
        self.release_requested.set()
        self.wake.set()

    # -- the handler, two ways --

    def _start_python(self, ctx: Context) -> Callable[[], _Outcome | None]:
        box: dict[str, _Outcome] = {}
        assert self.spec.fn is not None
        fn = self.spec.fn

        def target() -> None:
            try:
                value = fn(self.job["payload"], ctx)
                if isinstance(value, Result):
                    box["out"] = _Outcome("success", value.value, dict(value.provenance))
                else:
                    box["out"] = _Outcome("success", value, {})
            except Cancelled as e:
                box["out"] = _Outcome("lost", code=e.reason, error=f"handler stopped: {e}")
            except PermanentError as e:
                box["out"] = _Outcome("permanent", error=f"PermanentError: {e}")
            except Exception as e:
                box["out"] = _Outcome("failed", error=f"{type(e).__name__}: {e}")
            finally:
                self.wake.set()

        self.handler_thread = threading.Thread(target=target, name=f"handler-{self.job_id}",
                                               daemon=True)
        self.handler_thread.start()
        return lambda: box.get("out")

    def _command_env(self, ctx: Context) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "JOBCOORD_JOB_ID": str(self.job_id), "JOBCOORD_EPOCH": str(self.epoch),
            "JOBCOORD_WORKER": self.w.config.worker_id, "JOBCOORD_ATTEMPT": str(ctx.attempt),
            "JOBCOORD_KIND": self.spec.kind, "JOBCOORD_TENANT": str(self.job.get("tenant")),
        })
        env.pop("JOBCOORD_CHECKPOINTS", None)
        text = json.dumps(ctx.checkpoints)
        # The file always holds every checkpoint; the variable is a convenience kept small,
        # because one environment string cannot exceed 128 KiB on Linux (exec fails: E2BIG).
        fd, path = tempfile.mkstemp(prefix=f"jobcoord-{self.job_id}-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        self.checkpoints_file = path
        env["JOBCOORD_CHECKPOINTS_FILE"] = path
        if len(text.encode()) <= CHECKPOINTS_ENV_MAX_BYTES:
            env["JOBCOORD_CHECKPOINTS"] = text
        if self.w.config.database_url:
            env["JOBCOORD_URL"] = self.w.config.database_url
        return env

    def _start_command(self, ctx: Context) -> Callable[[], _Outcome | None]:
        assert self.spec.command is not None
        limit = self.w.result_limit(self.spec)
        stdin_bytes = json.dumps(self.job["payload"]).encode()
        # A new session puts the command and its children in their own process group, so
        # stopping the job stops all of them and a signal to the worker's group misses them.
        self.proc = proc = subprocess.Popen(
            list(self.spec.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=self._command_env(ctx), start_new_session=True)
        self.w.children.add(proc)
        out = bytearray()
        tail: collections.deque[bytes] = collections.deque()
        flags = {"too_large": False}

        def feed() -> None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(stdin_bytes)
                proc.stdin.close()
            except OSError:
                pass  # the command does not read its payload, or died: its exit tells

        def read_out() -> None:
            assert proc.stdout is not None
            for chunk in iter(lambda: proc.stdout.read(65536), b""):  # type: ignore[union-attr]
                if len(out) + len(chunk) > limit:
                    flags["too_large"] = True  # keep draining so the command never blocks
                else:
                    out.extend(chunk)

        def read_err() -> None:
            assert proc.stderr is not None
            size = 0
            for chunk in iter(lambda: proc.stderr.read(4096), b""):  # type: ignore[union-attr]
                tail.append(chunk)
                size += len(chunk)
                while size - len(tail[0]) > STDERR_TAIL_BYTES:
                    size -= len(tail.popleft())

        readers = [threading.Thread(target=t, daemon=True) for t in (feed, read_out, read_err)]
        for t in readers:
            t.start()

        def waiter() -> None:
            proc.wait()
            # Whatever the command left behind in its group (a background child holding
            # stdout open) would keep the job from ever finishing: it goes too.
            _kill_group(proc, signal.SIGKILL)
            for t in readers[1:]:
                t.join(5.0)
            self.wake.set()

        threading.Thread(target=waiter, daemon=True).start()

        def poll() -> _Outcome | None:
            if proc.returncode is None or any(t.is_alive() for t in readers[1:]):
                return None
            err = b"".join(tail).decode("utf-8", "replace")[-STDERR_TAIL_BYTES:].strip()
            rc = proc.returncode
            if rc != 0:
                what = (f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}")
                msg = f"command {what}" + (f"; stderr: {err}" if err else "")
                return _Outcome("permanent" if rc == PERMANENT_EXIT_CODE else "failed",
                                error=msg)
            if flags["too_large"]:
                return _Outcome("too_large", error=f"result is larger than {limit} bytes")
            text = out.decode("utf-8", "replace").strip()
            if not text:
                return _Outcome("success", {}, {})
            try:
                value = json.loads(text)
            except ValueError as e:
                return _Outcome("failed", error=f"stdout is not JSON ({e}): {text[:200]}")
            if isinstance(value, dict) and value.get("jobcoord_envelope") == 1:
                prov = value.get("provenance") or {}
                if not isinstance(prov, dict):
                    return _Outcome("failed", error="envelope provenance must be an object")
                return _Outcome("success", value.get("result"), prov)
            return _Outcome("success", value, {})

        return poll

    def _stop_handler(self, ctx: Context, reason: str) -> None:
        ctx.cancel(reason)
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(self.w.config.kill_grace_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()

    # -- the lease loop --

    def _main(self) -> None:
        try:
            self._run()
        except Exception as e:
            # A bug here must not kill the worker silently: say so; the lease then expires
            # and the reaper offers the job again.
            self.w.log("internal_error", job_id=self.job_id, epoch=self.epoch,
                       error=f"{type(e).__name__}: {e}")
            self.w.count("internal_errors")
        finally:
            if self.checkpoints_file is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.checkpoints_file)
            self.w.job_finished()

    def _run(self) -> None:
        w, log = self.w, self.w.log
        cfg = w.config
        started = time.monotonic()
        started_at = iso(now_us())
        lease_s = cfg.lease_s
        renew_every = lease_s * RENEW_FRACTION
        # Measured from before the claim was sent, so the local end is never later than the
        # coordinator's: the worker gives up no later than the lease really ends.
        lease_end = self.claim_started + lease_s
        next_renew = self.claim_started + renew_every
        deadline = started + self.spec.timeout_s
        checkpoints = {c["name"]: c["data"] for c in self.job.get("checkpoints") or []}
        ctx = Context(job_id=self.job_id, epoch=self.epoch, attempt=self.job.get("attempt", 1),
                      kind=self.spec.kind, worker_id=cfg.worker_id, checkpoints=checkpoints,
                      coordinator=w.db, tenant=self.job.get("tenant"), log=log)
        try:
            poll = (self._start_command(ctx) if self.spec.command is not None
                    else self._start_python(ctx))
        except OSError as e:
            outcome: _Outcome | None = _Outcome("failed", error=f"cannot start command: {e}")
            poll = lambda: outcome  # noqa: E731
        result: _Outcome | None = None
        while result is None:
            result = poll()
            if result is not None:
                break
            now = time.monotonic()
            if ctx.cancelled:  # a fenced write from the handler was refused
                self._stop_handler(ctx, ctx.cancel_reason or "cancelled")
                result = _Outcome("lost", code=ctx.cancel_reason)
                break
            if now >= deadline:
                self._stop_handler(ctx, "timeout")
                result = _Outcome("timeout", error=f"wall-clock budget of "
                                  f"{self.spec.timeout_s:g}s exceeded")
                break
            if self.release_requested.is_set():
                self._stop_handler(ctx, "worker_shutdown")
                result = _Outcome("released", error="worker shutting down: the job was "
                                  "released to be retried")
                break
            if now >= next_renew:
                t0 = time.monotonic()
                try:
                    got = w.db.renew(self.job_id, cfg.worker_id, self.epoch, lease_s=lease_s,
                                     tenant=self.job.get("tenant"))
                except Refused as e:
                    log("lease_lost", job_id=self.job_id, epoch=self.epoch, reason=e.code,
                        detail=e.message)
                    self._stop_handler(ctx, e.code)
                    result = _Outcome("lost", code=e.code)
                    break
                except JobcoordError as e:
                    # Busy or unreachable: try again soon, while the lease may still be ours.
                    log("renew_error", job_id=self.job_id, epoch=self.epoch, error=e.code)
                    next_renew = now + min(1.0, renew_every)
                else:
                    lease_end = t0 + lease_s
                    next_renew = t0 + renew_every
                    log("renewed", job_id=self.job_id, epoch=self.epoch,
                        expires_at=got["expires_at"],
                        renew_ms=round((time.monotonic() - t0) * 1000, 1))
                if now >= lease_end:
                    log("lease_lost", job_id=self.job_id, epoch=self.epoch,
                        reason="lease_expired", detail="no renewal got through in time")
                    self._stop_handler(ctx, "lease_expired")
                    result = _Outcome("lost", code="lease_expired")
                    break
            wait = min(next_renew, deadline) - time.monotonic()
            self.wake.wait(max(0.0, min(wait, 1.0)))
            self.wake.clear()
        duration = time.monotonic() - started
        if result.kind == "success" and ctx.cancelled:
            result = _Outcome("lost", code=ctx.cancel_reason)
        self._report(result, duration, started_at, lease_end)
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

    def _report(self, out: _Outcome, duration: float, started_at: str | None,
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
                out = _Outcome("invalid", error=f"the result is not JSON: {e}")
            else:
                if size > limit:
                    out = _Outcome("too_large", error=f"result is {size} bytes, larger than "
                                   f"the {limit} byte budget")
        t0 = time.monotonic()
        while True:
            try:
                self._deliver(out, base, duration, started_at, tenant, t0)
                return
            except InvalidInput as e:
                if out.kind != "success":
                    raise
                # The coordinator refused the result itself (too deep, bad text): the
                # attempt failed like a handler exception would.
                out = _Outcome("invalid", error=f"the result was refused: {e.message}")
            except Refused as e:
                log("report_refused", **base, outcome=out.kind, reason=e.code,
                    detail=e.message)
                w.count("lost")
                return
            except (DatabaseBusy, StorageUnavailable) as e:
                # Keep trying while the lease may still be ours; after that it is moot.
                if time.monotonic() >= lease_end:
                    log("report_error", **base, outcome=out.kind, error=e.code,
                        detail=e.message)
                    w.count("report_errors")
                    return
                log("report_retry", **base, outcome=out.kind, error=e.code)
                time.sleep(0.25)
            except JobcoordError as e:
                log("report_error", **base, outcome=out.kind, error=e.code, detail=e.message)
                w.count("report_errors")
                return

    def _deliver(self, out: _Outcome, base: dict[str, Any], duration: float,
                 started_at: str | None, tenant: str | None, t0: float) -> None:
        w, log, cfg = self.w, self.w.log, self.w.config
        if out.kind == "success":
            prov = w.provenance(self.spec, out.provenance or {}, duration, self.epoch,
                                self.job.get("attempt"), started_at)
            w.db.complete(self.job_id, cfg.worker_id, self.epoch, out.result,
                          provenance=prov, tenant=tenant)
            log("completed", **base, report_ms=_ms(t0))
            w.count("completed")
            return
        reason, permanent = {
            "failed": ("failed", False),
            "invalid": ("invalid_result", False),
            "permanent": ("failed", True),
            "timeout": ("timeout", not self.spec.retry_on_timeout),
            "too_large": ("result_too_large", not self.spec.retry_on_too_large),
            "released": ("worker_shutdown", False),
        }[out.kind]
        error = _clean(out.error or out.kind)
        got = w.db.fail(self.job_id, cfg.worker_id, self.epoch, error, permanent=permanent,
                        reason=reason, tenant=tenant)
        event = "released" if out.kind == "released" else "failed"
        log(event, **base, reason=reason, permanent=permanent, status=got["status"],
            error=error[:500], report_ms=_ms(t0))
        w.count(event)


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


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Worker:
    def __init__(self, coordinator: Any, config: WorkerConfig, log: Log | None = None):
        if not config.handlers:
            raise InvalidInput("invalid_input", "a worker needs at least one handler "
                               "(--app MODULE:APP or --exec KIND=COMMAND)")
        self.coordinator = coordinator
        self.config = config
        self.log = log or Log(config.worker_id, config.log_format)
        # Three: a busy database slowing one renewal must not hold up the others.
        self.db = _Serialized(coordinator, threads=3)
        self.kinds = sorted(config.handlers)
        self.running: dict[int, JobRun] = {}
        self.children: set[subprocess.Popen[bytes]] = set()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.counts: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        self._signals = 0
        self.claimed = 0
        self.host = socket.gethostname()

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
        prov: dict[str, Any] = {
            "worker": self.config.worker_id, "host": self.host, "jobcoord": __version__,
            "python": platform.python_version(), "handler": spec.describe(),
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
        return self.db.heartbeat(self.config.worker_id, roles=self.config.roles,
                                 readings=readings, kinds=self.kinds) | {"sources": sources}

    def _ticker(self) -> None:
        cfg = self.config
        next_hb = time.monotonic() + cfg.heartbeat_s
        next_reap = time.monotonic() + (cfg.reap_s if cfg.reap_s else float("inf"))
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_hb:
                next_hb = now + cfg.heartbeat_s
                try:
                    self.heartbeat()
                except JobcoordError as e:
                    self.log("heartbeat_error", error=e.code, detail=e.message)
                except Exception as e:  # the timer must outlive any one failure
                    self.log("heartbeat_error", error="internal_error",
                             detail=f"{type(e).__name__}: {e}")
            if now >= next_reap:
                next_reap = now + cfg.reap_s
                try:
                    got = self.db.reap(limit=100)
                except JobcoordError as e:
                    self.log("reap_error", error=e.code, detail=e.message)
                except Exception as e:  # the timer must outlive any one failure
                    self.log("reap_error", error="internal_error",
                             detail=f"{type(e).__name__}: {e}")
                else:
                    if got["expired"] or got["deadline_dead"]:
                        self.log("reaped", expired=got["expired"], jobs=got["jobs"])
                        self.count("reaped", got["expired"] + got["deadline_dead"])
            self.stopping.wait(max(0.01, min(next_hb, next_reap) - time.monotonic()))

    # -- signals --

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        if self._signals == 1:
            self.log("shutting_down", signal=signal.Signals(signum).name,
                     grace_s=self.config.grace_s, running=sorted(self.running))
            self.stopping.set()
            self.wake.set()
            return
        self.log("exiting_now", signal=signal.Signals(signum).name, running=sorted(self.running))
        for proc in list(self.children):
            if proc.returncode is None:
                _kill_group(proc, signal.SIGKILL)
        os._exit(EXIT_FORCED)

    # -- the loop --

    def run(self) -> dict[str, Any]:
        cfg = self.config
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        hb = self.heartbeat()
        self.log("started", roles=cfg.roles, kinds=self.kinds, concurrency=cfg.concurrency,
                 lease_s=cfg.lease_s, readings=hb["readings"], gates=hb["gates"],
                 sources=hb["sources"])
        ticker = threading.Thread(target=self._ticker, name="ticker", daemon=True)
        ticker.start()
        last_refusal: str | None = None
        try:
            while not self.stopping.is_set():
                self._collect()
                if cfg.max_jobs is not None and self.claimed >= cfg.max_jobs:
                    if not self.running:
                        break
                    self._pause(cfg.poll_s)
                    continue
                if len(self.running) >= cfg.concurrency:
                    self._pause(cfg.poll_s)
                    continue
                t0 = time.monotonic()
                try:
                    got = self.db.claim(cfg.worker_id, lease_s=cfg.lease_s, kinds=self.kinds)
                except JobcoordError as e:
                    if isinstance(e, InvalidInput | Refused):
                        raise
                    self.log("claim_error", error=e.code, detail=e.message)
                    self._pause(cfg.poll_s)
                    continue
                if got["job"] is None:
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
                    if cfg.burst and not self.running:
                        break
                    self._pause(cfg.poll_s)
                    continue
                last_refusal = None
                job, lease = got["job"], got["lease"]
                spec = cfg.handlers[job["kind"]]
                self.claimed += 1
                self.count("claimed")
                self.log("claimed", job_id=job["job_id"], epoch=lease["epoch"],
                         kind=job["kind"], priority=job["priority"], attempt=job["attempt"],
                         expires_at=lease["expires_at"], claim_ms=_ms(t0),
                         checkpoints=[c["name"] for c in job["checkpoints"]] or None)
                run = JobRun(self, job, lease, spec, claim_started=t0)
                self.running[job["job_id"]] = run
                run.start()
            self._drain()
        finally:
            self.stopping.set()
            self.db.shutdown()
        summary = {"worker_id": cfg.worker_id, "claimed": self.counts["claimed"],
                   "completed": self.counts["completed"], "failed": self.counts["failed"],
                   "released": self.counts["released"], "lost": self.counts["lost"],
                   "gate_refused": self.counts["gate_refused"], "reaped": self.counts["reaped"]}
        self.log("stopped_worker", **summary)
        return summary

    def _pause(self, seconds: float) -> None:
        self.wake.wait(seconds)
        self.wake.clear()

    def _collect(self) -> None:
        for job_id, run in list(self.running.items()):
            if not run.thread.is_alive():
                del self.running[job_id]
                if run.proc is not None:
                    self.children.discard(run.proc)

    def _drain(self) -> None:
        """Give running jobs the grace period, then release what is still running."""
        end = time.monotonic() + self.config.grace_s
        while self.running and time.monotonic() < end:
            self._collect()
            time.sleep(0.02)
        for run in list(self.running.values()):
            run.release()
        for run in list(self.running.values()):
            run.thread.join(self.config.kill_grace_s + 10.0)
        self._collect()

    def job_finished(self) -> None:
        self.wake.set()


def parse_exec(items: tuple[str, ...] | list[str]) -> dict[str, tuple[str, ...]]:
    """`--exec KIND=COMMAND` (repeatable) -> {kind: argv}. The command is split like a shell
    would (quotes respected) but never run through a shell."""
    from . import validate as v

    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        kind, sep, command = item.partition("=")
        if not sep or not command.strip():
            raise InvalidInput("invalid_input", f"--exec must look like KIND='COMMAND ARGS', "
                               f"got {item!r}")
        kind = v.name(kind.strip(), "kind")
        try:
            argv = tuple(shlex.split(command))
        except ValueError as e:
            raise InvalidInput("invalid_input", f"--exec {kind}: {e}") from None
        if kind in out:
            raise InvalidInput("invalid_input", f"--exec: kind {kind!r} given twice")
        out[kind] = argv
    return out


def parse_kind_values(items: tuple[str, ...] | list[str], option: str, lo: float, hi: float
                      ) -> dict[str, float]:
    """`--timeout KIND=SECONDS`-style options."""
    from . import validate as v

    out: dict[str, float] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep:
            raise InvalidInput("invalid_input", f"{option} must look like KIND=VALUE, got "
                               f"{item!r}")
        out[v.name(kind.strip(), "kind")] = v.seconds(value.strip(), option.lstrip("-"), lo, hi,
                                                      lo_inclusive=False)
    return out


def make_config(*, app_spec: str | None, execs: tuple[str, ...], roles: tuple[str, ...],
                worker_id: str | None, lease: Any, concurrency: Any, grace: Any,
                kill_grace: Any, heartbeat_every: Any, reap_every: Any, poll: Any,
                timeouts: tuple[str, ...], max_results: tuple[str, ...],
                readings_override: str | None, log_format: str, max_jobs: Any, burst: bool,
                database_url: str | None, policy: Any) -> WorkerConfig:
    """Validate the `jobcoord worker` options into a WorkerConfig (InvalidInput on any
    mistake, before anything runs)."""
    import dataclasses

    from . import validate as v
    from .app import load_app
    from .readings import parse_override
    from .service import default_worker_id

    handlers: dict[str, HandlerSpec] = {}
    if app_spec is not None:
        handlers.update(load_app(app_spec).handlers)
    for kind, argv in parse_exec(execs).items():
        if kind in handlers:
            raise InvalidInput("invalid_input", f"kind {kind!r} has both a Python handler and "
                               "--exec")
        handlers[kind] = HandlerSpec(kind, None, command=argv)
    if not handlers:
        raise InvalidInput("invalid_input", "give at least one handler: --app MODULE:APP or "
                           "--exec KIND='COMMAND'")
    lease_s = v.seconds(lease, "lease", 0, policy.max_lease_s, lo_inclusive=False)
    hb_s = v.seconds(heartbeat_every, "heartbeat-every", 0.05, 3600.0)
    if hb_s >= policy.heartbeat_max_age_s:
        raise InvalidInput("invalid_input", f"--heartbeat-every must be shorter than the "
                           f"policy's heartbeat_max_age_s ({policy.heartbeat_max_age_s:g}s)")
    for kind, seconds in parse_kind_values(timeouts, "--timeout", 0, v.TEN_YEARS_S).items():
        if kind not in handlers:
            raise InvalidInput("invalid_input", f"--timeout: no handler for kind {kind!r}")
        handlers[kind] = dataclasses.replace(handlers[kind], timeout_s=seconds)
    for kind, size in parse_kind_values(max_results, "--max-result-bytes", 0, 2**40).items():
        if kind not in handlers:
            raise InvalidInput("invalid_input", f"--max-result-bytes: no handler for kind "
                               f"{kind!r}")
        handlers[kind] = dataclasses.replace(handlers[kind], max_result_bytes=int(size))
    all_roles = {v.name(r, "role") for r in roles}
    all_roles |= {h.role for h in handlers.values() if h.role is not None}
    return WorkerConfig(
        worker_id=v.name(worker_id or default_worker_id(), "worker", max_len=v.MAX_WORKER_ID),
        handlers=handlers, roles=sorted(all_roles), lease_s=lease_s, heartbeat_s=hb_s,
        reap_s=v.seconds(reap_every, "reap-every", 0, 3600.0),
        poll_s=v.seconds(poll, "poll", 0.01, 60.0),
        concurrency=v.integer(concurrency, "concurrency", 1, 256),
        grace_s=v.seconds(grace, "grace", 0, 24 * 3600.0),
        kill_grace_s=v.seconds(kill_grace, "kill-grace", 0, 3600.0),
        readings_override=parse_override(readings_override), log_format=log_format,
        database_url=database_url,
        max_jobs=None if max_jobs is None else v.integer(max_jobs, "max-jobs", 1, 2**31),
        burst=burst,
    )
