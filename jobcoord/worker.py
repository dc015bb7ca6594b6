"""The worker runtime: claim, run a handler under a lease, report the outcome with the epoch.

One worker process runs up to `concurrency` jobs at a time. Threads:

- the main thread claims (only the kinds it has handlers for) and handles SIGTERM/SIGINT;
- a ticker thread heartbeats the machine's real readings every `heartbeat_s` and reaps
  expired leases every `reap_s` (any number of workers reaping at once is safe: each change
  is a compare-and-set on status and epoch);
- one thread per running job waits for its handler, renews the lease every lease/3
  (`RENEW_FRACTION`), enforces the wall-clock budget, and reports the outcome. It lives until
  its handler has returned, and a slot is such a live thread (never a job id): a Python
  handler that ignores its stop keeps its slot, and a newer attempt of the same job claimed
  meanwhile waits for it before starting its own handler.

Every loop survives errors that can heal (a database restart, a lost connection, a locked or
unwritable file) with a log line and bounded backoff; `runtime.is_fatal` names the ones that
stop the worker. Local lease timing runs on CLOCK_BOOTTIME (it counts a suspend), the wall
clock is checked against the lease's `expires_at`, and a gap between the clocks (a resume)
makes the worker stop or renew at once and heartbeat at once. The clocks are one `Clock`
object, so a test can move them.

Handlers (a Python callable in a thread, or a command in its own process group) run outside
every database transaction. Once a renewal is refused (lease expired, stale epoch, job
cancelled, not the owner) the handler is stopped and nothing is reported: the job belongs to
someone else now. A command is stopped with SIGTERM to its process group, then SIGKILL after
`kill_grace_s`; a Python handler sees `ctx.cancelled`.

Outcomes: success -> `complete` with provenance; an exception or non-zero exit -> `fail`,
retried with backoff; `PermanentError` or exit code 65 (`PERMANENT_EXIT_CODE`, sysexits'
EX_DATAERR: the input is wrong, retrying cannot help) -> `fail` permanent (`dead`); timeout
-> `fail` with reason `timeout`; oversized result -> `fail` with reason `result_too_large`;
shutdown after the grace period -> `fail` with reason `worker_shutdown` (always retryable);
a command's output that `complete --result` would refuse -> `fail` permanent with reason
`invalid_result`.

Command protocol. The command runs under `_SHIM`, so it and its process group die with the
worker. The payload is written as JSON to stdin; stdout must be one JSON value, the result
(empty stdout is `{}`), validated like `complete --result`. The command is judged by its own
exit; output still held open afterwards by a process outside its group is read for at most
`OUTPUT_DRAIN_S` and reported. To report provenance, print an envelope instead:
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
import selectors
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
from . import validate as v
from .app import Cancelled, Context, HandlerSpec, PermanentError, Result
from .clock import iso, now_us
from .errors import (
    InvalidInput,
    Refused,
)
from .readings import current_readings
from .runtime import Backoff, describe, is_fatal

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
#: After a command exits, how long its output may take to reach EOF once its process group
#: is gone; longer means a process outside the group holds the pipe.
OUTPUT_DRAIN_S = 1.0
#: A job thread and the ticker look at the clocks at least this often (seconds).
LOOP_MAX_WAIT_S = 0.5
#: The wall clock or CLOCK_BOOTTIME running ahead of CLOCK_MONOTONIC by more than this between
#: two looks means the machine was suspended (or its clock stepped): renew or stop at once,
#: and heartbeat at once.
CLOCK_GAP_S = 2.0

#: Runs a command handler so that it dies with its worker (Linux). It asks the kernel for
#: SIGHUP when its parent goes (PR_SET_PDEATHSIG, which survives exec) and then checks that
#: its parent is still the worker that started it: a worker that died before the prctl is
#: caught by that check, one that dies after it by the signal. On either, it SIGKILLs its
#: whole process group: the command and everything the command started that stayed in the
#: group. The command itself also gets SIGKILL as its own death signal, in case the shim is
#: killed. The kernel sends the death signal when the parent *thread* exits too (the job
#: thread that started the command); the shim then finds its parent still alive and goes on.
#: The shim holds none of the command's pipes, and exits with the command's own status.
_SHIM = r"""
import ctypes, os, signal, sys
worker, argv = int(sys.argv[1]), sys.argv[2:]
try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no death signal, the parent check remains
    def prctl(*_):
        return 0
PR_SET_PDEATHSIG = 1
def orphaned():
    os.killpg(0, signal.SIGKILL)
def on_hup(*_):
    if os.getppid() != worker:
        orphaned()
signal.signal(signal.SIGHUP, on_hup)
signal.signal(signal.SIGTERM, lambda *_: None)
signal.signal(signal.SIGINT, lambda *_: None)
prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
if os.getppid() != worker:
    orphaned()
shim = os.getpid()
pid = os.fork()
if pid == 0:
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != shim:
            os._exit(137)
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE,
                    signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, f"cannot start command {argv[0]!r}: {e.strerror}\n".encode())
    os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
_, status = os.waitpid(pid, 0)
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(shim, os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


class Clock:
    """The clocks a worker reads, in one object so a test can move them (a simulated suspend:
    the wall clock and boot time jump, the monotonic clock does not).

    Local lease and budget timing uses `boot()`, CLOCK_BOOTTIME, which keeps counting while
    the machine is suspended (CLOCK_MONOTONIC stops); the coordinator judges leases by the
    wall clock, which `wall_us()` reads the way the coordinator does."""

    def mono(self) -> float:
        return time.monotonic()

    def boot(self) -> float:
        return _boottime()

    def wall_us(self) -> int:
        return now_us()


def _boottime() -> float:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock_id) if clock_id is not None else time.monotonic()


class _GapWatch:
    """Notices a suspend or a clock step between two looks: the wall clock or boot time
    moved much more (or less) than the monotonic clock."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.last = self._read()

    def _read(self) -> tuple[float, float, float]:
        return self.clock.mono(), self.clock.boot(), self.clock.wall_us() / 1e6

    def check(self) -> float:
        """Seconds of the gap since the last look (0.0: none)."""
        now = self._read()
        d_mono, d_boot, d_wall = (b - a for a, b in zip(self.last, now, strict=True))
        self.last = now
        gap = max(d_boot - d_mono, abs(d_wall - d_mono))
        return gap if gap > CLOCK_GAP_S else 0.0


def _read_pipes(sinks: dict[int, Callable[[bytes], None]], stop: threading.Event) -> None:
    """Read the pipes until each reaches EOF, or until `stop`: then take only what is already
    buffered and return without waiting for more."""
    sel = selectors.DefaultSelector()
    for fd in sinks:
        sel.register(fd, selectors.EVENT_READ)
    try:
        rounds = 0
        while sel.get_map():
            stopping = stop.is_set()
            events = sel.select(0 if stopping else 0.1)
            if stopping:
                rounds += 1
                if not events or rounds > 64:
                    return
            for key, _ in events:
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    sinks[key.fd](chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()


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
        # The command starts under a small shim that dies with this worker (see _SHIM).
        self.proc = proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()),
             *self.spec.command],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self._command_env(ctx), start_new_session=True)
        self.w.children.add(proc)
        out = bytearray()
        tail: collections.deque[bytes] = collections.deque()
        flags = {"too_large": False, "held_open": False}
        stop_reading = threading.Event()

        def feed() -> None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(stdin_bytes)
                proc.stdin.close()
            except OSError:
                pass  # the command does not read its payload, or died: its exit tells

        def take_out(chunk: bytes) -> None:
            if len(out) + len(chunk) > limit:
                flags["too_large"] = True  # keep draining so the command never blocks
            else:
                out.extend(chunk)

        def take_err(chunk: bytes) -> None:
            tail.append(chunk)
            size = sum(len(c) for c in tail)
            while size - len(tail[0]) > STDERR_TAIL_BYTES:
                size -= len(tail.popleft())

        def read() -> None:
            # One reader for both pipes, never blocked for long in a read: once the command
            # has exited, a process outside its group may hold the pipes open for ever.
            assert proc.stdout is not None and proc.stderr is not None
            _read_pipes({proc.stdout.fileno(): take_out, proc.stderr.fileno(): take_err},
                        stop_reading)

        reader = threading.Thread(target=read, name=f"read-{self.job_id}", daemon=True)
        threading.Thread(target=feed, daemon=True).start()
        reader.start()

        def waiter() -> None:
            proc.wait()
            # Judged by its own exit. Whatever it left behind in its group (a background
            # child holding stdout open) would keep the job from ever finishing: it goes too.
            _kill_group(proc, signal.SIGKILL)
            reader.join(OUTPUT_DRAIN_S)
            if reader.is_alive():
                # Still open after the whole group is gone: a process that left the group
                # (setsid, a daemon) holds the pipe. Take what was written, stop waiting.
                flags["held_open"] = True
                stop_reading.set()
                reader.join()
            for f in (proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    f.close()  # type: ignore[union-attr]
            self.wake.set()

        done = threading.Thread(target=waiter, name=f"wait-{self.job_id}", daemon=True)
        done.start()

        def poll() -> _Outcome | None:
            if done.is_alive():
                return None
            err = b"".join(tail).decode("utf-8", "replace")[-STDERR_TAIL_BYTES:].strip()
            rc = proc.returncode
            held = ("its output was still held open by a process outside its process group "
                    "(detached with setsid or as a daemon; such a process is not tracked), "
                    "so the output may be incomplete")
            if flags["held_open"]:
                self.w.log("output_held_open", job_id=self.job_id, epoch=self.epoch,
                           detail=f"the command exited ({rc}) but {held}")
            if rc != 0:
                what = (f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}")
                msg = f"command {what}" + (f"; stderr: {err}" if err else "")
                return _Outcome("permanent" if rc == PERMANENT_EXIT_CODE else "failed",
                                error=msg)
            if flags["too_large"]:
                return _Outcome("too_large", error=f"result is larger than {limit} bytes")
            raw = bytes(out).strip()
            if not raw:
                return _Outcome("success", {}, {})
            try:
                # The very validation `complete --result` applies: strict UTF-8, no
                # duplicate keys, no NaN, bounded depth and size.
                value, _ = v.json_value(raw, "the command's output", max_bytes=limit,
                                        require_object=False,
                                        too_large_code="result_too_large")
            except InvalidInput as e:
                evidence = repr(raw[:200])[2:-1]
                msg = f"{e.message}; output began: {evidence}"
                if flags["held_open"]:
                    msg += f"; {held}"
                return _Outcome("invalid_output", error=msg)
            if isinstance(value, dict) and value.get("jobcoord_envelope") == 1:
                prov = value.get("provenance") or {}
                if not isinstance(prov, dict):
                    return _Outcome("invalid_output",
                                    error="envelope provenance must be an object")
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
        cfg, clock = w.config, w.clock
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
        checkpoints = {c["name"]: c["data"] for c in self.job.get("checkpoints") or []}
        ctx = Context(job_id=self.job_id, epoch=self.epoch, attempt=self.job.get("attempt", 1),
                      kind=self.spec.kind, worker_id=cfg.worker_id, checkpoints=checkpoints,
                      coordinator=w.db, tenant=self.job.get("tenant"), log=log)
        gaps = _GapWatch(clock)
        poll: Callable[[], _Outcome | None] | None = None
        waiting_logged = False
        result: _Outcome | None = None
        while result is None:
            if poll is None:
                earlier = self.predecessor
                if earlier is None or not earlier.thread.is_alive():
                    if waiting_logged:
                        log("earlier_handler_returned", job_id=self.job_id, epoch=self.epoch)
                    self.predecessor = None
                    poll = self._start_handler(ctx)
                elif not waiting_logged:
                    # Never two handlers of one job alive in one worker: hold the lease and
                    # start this one only once the earlier one has returned.
                    log("waiting_for_earlier_handler", job_id=self.job_id, epoch=self.epoch,
                        earlier_epoch=earlier.epoch)
                    waiting_logged = True
            if poll is not None:
                result = poll()
                if result is not None:
                    break
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
                result = _Outcome("lost", code="lease_expired")
                break
            if ctx.cancelled:  # a fenced write from the handler was refused
                self._stop_handler(ctx, ctx.cancel_reason or "cancelled")
                result = _Outcome("lost", code=ctx.cancel_reason)
                break
            if now >= deadline:
                self._stop_handler(ctx, "timeout")
                why = (f"wall-clock budget of {self.spec.timeout_s:g}s exceeded"
                       if poll is not None else
                       f"wall-clock budget of {self.spec.timeout_s:g}s exceeded while an "
                       "earlier handler of this job was still running in this worker")
                result = _Outcome("timeout", error=why)
                break
            if self.release_requested.is_set():
                self._stop_handler(ctx, "worker_shutdown")
                result = _Outcome("released", error="worker shutting down: the job was "
                                  "released to be retried")
                break
            if now >= next_renew:
                t0 = clock.boot()
                try:
                    got = w.db.renew(self.job_id, cfg.worker_id, self.epoch, lease_s=lease_s,
                                     tenant=self.job.get("tenant"))
                except Refused as e:
                    log("lease_lost", job_id=self.job_id, epoch=self.epoch, reason=e.code,
                        detail=e.message)
                    self._stop_handler(ctx, e.code)
                    result = _Outcome("lost", code=e.code)
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
                    log("renewed", job_id=self.job_id, epoch=self.epoch,
                        expires_at=got["expires_at"],
                        renew_ms=round((clock.boot() - t0) * 1000, 1))
            if clock.boot() >= lease_end:
                log("lease_lost", job_id=self.job_id, epoch=self.epoch,
                    reason="lease_expired", detail="no renewal got through in time")
                self._stop_handler(ctx, "lease_expired")
                result = _Outcome("lost", code="lease_expired")
                break
            wait = min(next_renew, deadline, lease_end) - clock.boot()
            self.wake.wait(max(0.0, min(wait, LOOP_MAX_WAIT_S)))
            self.wake.clear()
        duration = clock.boot() - started
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

    def _start_handler(self, ctx: Context) -> Callable[[], _Outcome | None]:
        try:
            return (self._start_command(ctx) if self.spec.command is not None
                    else self._start_python(ctx))
        except OSError as e:
            outcome = _Outcome("failed", error=f"cannot start command: {e}")
            return lambda: outcome

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
            except Exception as e:
                code, message = describe(e)
                # Keep trying while the lease may still be ours (a busy, restarting or
                # briefly unreachable database); after that it is moot. Errors no retry can
                # heal end the attempt's report at once.
                if is_fatal(e) or self.w.clock.boot() >= lease_end:
                    log("report_error", **base, outcome=out.kind, error=code, detail=message)
                    w.count("report_errors")
                    return
                log("report_retry", **base, outcome=out.kind, error=code)
                time.sleep(0.25)

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
            # A command's output that `complete --result` would refuse: the same command
            # prints it again, so no retry (the error keeps the evidence).
            "invalid_output": ("invalid_result", True),
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


def _ms(t0: float, clock: Clock | None = None) -> float:
    """Milliseconds since t0 (time.monotonic(), or the boot clock of `clock`)."""
    now = clock.boot() if clock is not None else time.monotonic()
    return round((now - t0) * 1000, 1)


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Worker:
    def __init__(self, coordinator: Any, config: WorkerConfig, log: Log | None = None, *,
                 clock: Clock | None = None, as_json: bool = False):
        if not config.handlers:
            raise InvalidInput("invalid_input", "a worker needs at least one handler "
                               "(--app MODULE:APP or --exec KIND=COMMAND)")
        self.coordinator = coordinator
        self.config = config
        self.log = log or Log(config.worker_id, config.log_format)
        self.clock = clock or Clock()
        #: `--json`: stdout carries JSON Lines only, even when a second signal cuts it short.
        self.as_json = as_json
        # The coordinator's calls, run on three long-lived threads: a busy database slowing
        # one renewal must not hold up the others.
        self.db = _Serialized(coordinator, threads=3)
        self.kinds = sorted(config.handlers)
        #: Every run whose thread may still be alive. A slot is a live run (its thread lives
        #: until its handler has returned), never a job id: one job can have a settled run
        #: whose handler ignores its stop and a newer run waiting for it.
        self.runs: list[JobRun] = []
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

    def _timer_error(self, what: str, e: BaseException) -> None:
        code, message = describe(e)
        self.log(f"{what}_error", error=code, detail=message)
        if is_fatal(e):
            # Cannot heal (schema, corruption): stop the worker, which raises it.
            self.fatal = e
            self.stopping.set()
            self.wake.set()

    def _ticker(self) -> None:
        cfg = self.config
        mono = self.clock.mono
        next_hb = mono() + cfg.heartbeat_s
        next_reap = mono() + (cfg.reap_s if cfg.reap_s else float("inf"))
        gaps = _GapWatch(self.clock)
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
                try:
                    got = self.db.reap(limit=100)
                except Exception as e:  # the timer must outlive any error that can heal
                    self._timer_error("reap", e)
                else:
                    if got["expired"] or got["deadline_dead"]:
                        self.log("reaped", expired=got["expired"], jobs=got["jobs"])
                        self.count("reaped", got["expired"] + got["deadline_dead"])
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
            return
        running = self.live_job_ids()
        self.log("exiting_now", signal=name, running=running)
        for proc in list(self.children):
            if proc.returncode is None:
                _kill_group(proc, signal.SIGKILL)
        if self.as_json:
            # Still one JSON line on stdout, as --json promises, before the forced exit.
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.write(json.dumps({
                    "event": "exiting_now", "worker_id": self.config.worker_id,
                    "signal": name, "running": running, "exit_code": EXIT_FORCED}) + "\n")
                sys.stdout.flush()
        os._exit(EXIT_FORCED)

    # -- the loop --

    def run(self) -> dict[str, Any]:
        cfg = self.config
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        hb = self._first_heartbeat()
        self.log("started", roles=cfg.roles, kinds=self.kinds, concurrency=cfg.concurrency,
                 lease_s=cfg.lease_s, readings=hb.get("readings"), gates=hb.get("gates"),
                 sources=hb.get("sources"))
        ticker = threading.Thread(target=self._ticker, name="ticker", daemon=True)
        ticker.start()
        last_refusal: str | None = None
        backoff = Backoff(cfg.poll_s)
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
                t0 = self.clock.boot()
                try:
                    got = self.db.claim(cfg.worker_id, lease_s=cfg.lease_s, kinds=self.kinds)
                except Exception as e:
                    if is_fatal(e) or isinstance(e, Refused):
                        raise
                    code, message = describe(e)
                    wait = backoff.next()
                    self.log("claim_error", error=code, detail=message, retry_in_s=wait)
                    self._pause(wait)
                    continue
                backoff.reset()
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
                    if cfg.burst and not live:
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
                         expires_at=lease["expires_at"], claim_ms=_ms(t0, self.clock),
                         checkpoints=[c["name"] for c in job["checkpoints"]] or None)
                earlier = [r for r in live if r.job_id == job["job_id"]]
                run = JobRun(self, job, lease, spec, claim_started=t0,
                             predecessor=earlier[-1] if earlier else None)
                self.runs.append(run)
                run.start()
            if self.fatal is None:
                self._drain()
        finally:
            self.stopping.set()
            self.db.shutdown()
        if self.fatal is not None:
            raise self.fatal
        summary = {"worker_id": cfg.worker_id, "claimed": self.counts["claimed"],
                   "completed": self.counts["completed"], "failed": self.counts["failed"],
                   "released": self.counts["released"], "lost": self.counts["lost"],
                   "gate_refused": self.counts["gate_refused"], "reaped": self.counts["reaped"]}
        self.log("stopped_worker", **summary)
        return summary

    def _first_heartbeat(self) -> dict[str, Any]:
        """The first heartbeat, retried like every later one while the database cannot be
        reached (a worker started during a database restart waits for it)."""
        backoff = Backoff(self.config.poll_s)
        while True:
            try:
                return self.heartbeat()
            except Exception as e:
                if is_fatal(e) or isinstance(e, Refused) or self.stopping.is_set():
                    raise
                code, message = describe(e)
                wait = backoff.next()
                self.log("heartbeat_error", error=code, detail=message, retry_in_s=wait)
                self.stopping.wait(wait)

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
        for run in self.live_runs():
            run.release()
        for run in list(self.runs):
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
