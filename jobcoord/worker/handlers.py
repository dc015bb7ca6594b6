"""The two ways to run a handler: a Python callable in a thread, or a command in its own process
group under a shim that dies with the worker; each returns a poll for its outcome.

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
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import validate as v
from ..app import Cancelled, Context, PermanentError, Result
from ..errors import InvalidInput

if TYPE_CHECKING:
    from .run import JobRun

#: A command exiting with this code failed permanently: the job goes to `dead`, no retry.
PERMANENT_EXIT_CODE = 65
#: How much of a failing command's stderr is kept in the job's error.
STDERR_TAIL_BYTES = 2000
#: Checkpoints larger than this reach a command only through JOBCOORD_CHECKPOINTS_FILE.
CHECKPOINTS_ENV_MAX_BYTES = 32 * 1024
#: After a command exits, how long its output may take to reach EOF once its process group
#: is gone; longer means a process outside the group holds the pipe.
OUTPUT_DRAIN_S = 1.0

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


@dataclass
class Outcome:
    """How a handler ended, as the job thread reports it."""

    kind: str  # success | failed | permanent | timeout | too_large | released | lost
    result: Any = None
    provenance: Mapping[str, Any] | None = None
    error: str | None = None
    code: str | None = None


def call_python(run: JobRun, ctx: Context) -> Outcome:
    """Call the Python handler on this thread and return its outcome."""
    assert run.spec.fn is not None
    try:
        value = run.spec.fn(run.job["payload"], ctx)
        if isinstance(value, Result):
            return Outcome("success", value.value, dict(value.provenance))
        return Outcome("success", value, {})
    except Cancelled as e:
        return Outcome("lost", code=e.reason, error=f"handler stopped: {e}")
    except PermanentError as e:
        return Outcome("permanent", error=f"PermanentError: {e}")
    except Exception as e:
        return Outcome("failed", error=f"{type(e).__name__}: {e}")
    except BaseException as e:
        # sys.exit() or KeyboardInterrupt raised in a handler ends this call, not the
        # worker: the attempt failed, now, instead of holding its slot until the timeout.
        return Outcome("failed", error=f"{type(e).__name__}: {e}")


def start_python(run: JobRun, ctx: Context) -> Callable[[], Outcome | None]:
    """Run the Python handler on one of the worker's handler threads; the poll returns its
    outcome once it returned (None while it runs)."""
    box: dict[str, Outcome] = {}

    def target() -> None:
        box["out"] = call_python(run, ctx)

    # The run is woken once the task is over, so a run that sees the outcome also sees the
    # handler returned.
    run.handler_thread = run.w.handler_threads.submit(
        target, name=f"handler-{run.job_id}", then=run.wake.set)
    return lambda: box.get("out")


#: The variables that point a command's `jobcoord checkpoint` / `effect` at a server.
SERVER_ENV = ("JOBCOORD_SERVER", "JOBCOORD_TOKEN_FILE", "JOBCOORD_CA_FILE")


def command_env(run: JobRun, ctx: Context) -> dict[str, str]:
    """The command's environment: the worker's, plus the job's JOBCOORD_* variables."""
    env = dict(os.environ)
    env.update({
        "JOBCOORD_JOB_ID": str(run.job_id), "JOBCOORD_EPOCH": str(run.epoch),
        "JOBCOORD_WORKER": run.w.config.worker_id, "JOBCOORD_ATTEMPT": str(ctx.attempt),
        "JOBCOORD_KIND": run.spec.kind, "JOBCOORD_TENANT": str(run.job.get("tenant")),
    })
    env.pop("JOBCOORD_CHECKPOINTS", None)
    text = json.dumps(ctx.checkpoints)
    # The file always holds every checkpoint; the variable is a convenience kept small,
    # because one environment string cannot exceed 128 KiB on Linux (exec fails: E2BIG).
    fd, path = tempfile.mkstemp(prefix=f"jobcoord-{run.job_id}-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    run.checkpoints_file = path
    env["JOBCOORD_CHECKPOINTS_FILE"] = path
    if len(text.encode()) <= CHECKPOINTS_ENV_MAX_BYTES:
        env["JOBCOORD_CHECKPOINTS"] = text
    # Where the command's own `jobcoord` calls go: this worker's database or server, never
    # one inherited from the worker's environment (another database, or a server beside a
    # local worker's database).
    for name in ("JOBCOORD_URL", *SERVER_ENV):
        env.pop(name, None)
    if run.w.config.database_url:
        env["JOBCOORD_URL"] = run.w.config.database_url
    env.update(run.w.config.server_env)
    # Files the command leaves here are staged as artifacts before its completion is sent.
    from ..artifacts.rules import make_outdir

    run.artifacts_out = env["JOBCOORD_ARTIFACTS_OUT"] = make_outdir(run.job_id)
    return env


def start_command(run: JobRun, ctx: Context) -> Callable[[], Outcome | None]:
    """Start the command under the shim in its own process group, feed it the payload, read
    its output; the poll returns its outcome once it exited (None while it runs)."""
    assert run.spec.command is not None
    limit = run.w.result_limit(run.spec)
    stdin_bytes = json.dumps(run.job["payload"]).encode()
    # A new session puts the command and its children in their own process group, so
    # stopping the job stops all of them and a signal to the worker's group misses them.
    # The command starts under a small shim that dies with this worker (see _SHIM).
    run.proc = proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()),
         *run.spec.command],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=command_env(run, ctx), start_new_session=True)
    run.w.children.add(proc)
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
        read_pipes({proc.stdout.fileno(): take_out, proc.stderr.fileno(): take_err},
                    stop_reading)

    reader = threading.Thread(target=read, name=f"read-{run.job_id}", daemon=True)
    threading.Thread(target=feed, daemon=True).start()
    reader.start()

    def waiter() -> None:
        proc.wait()
        # Judged by its own exit. Whatever it left behind in its group (a background
        # child holding stdout open) would keep the job from ever finishing: it goes too.
        kill_group(proc, signal.SIGKILL)
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
        run.wake.set()

    done = threading.Thread(target=waiter, name=f"wait-{run.job_id}", daemon=True)
    done.start()

    def poll() -> Outcome | None:
        if done.is_alive():
            return None
        err = b"".join(tail).decode("utf-8", "replace")[-STDERR_TAIL_BYTES:].strip()
        rc = proc.returncode
        held = ("its output was still held open by a process outside its process group "
                "(detached with setsid or as a daemon; such a process is not tracked), "
                "so the output may be incomplete")
        if flags["held_open"]:
            run.w.log("output_held_open", job_id=run.job_id, epoch=run.epoch,
                       detail=f"the command exited ({rc}) but {held}")
        if rc != 0:
            what = (f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}")
            msg = f"command {what}" + (f"; stderr: {err}" if err else "")
            return Outcome("permanent" if rc == PERMANENT_EXIT_CODE else "failed",
                            error=msg)
        if flags["too_large"]:
            return Outcome("too_large", error=f"result is larger than {limit} bytes")
        raw = bytes(out).strip()
        if not raw:
            return Outcome("success", {}, {})
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
            return Outcome("invalid_output", error=msg)
        marker = value.get("jobcoord_envelope") if isinstance(value, dict) else None
        if type(marker) is int and marker == 1:  # exactly 1: `true` is not an envelope
            if "result" not in value:
                return Outcome("invalid_output", error="the envelope has no \"result\"")
            prov = value.get("provenance") or {}
            if not isinstance(prov, dict):
                return Outcome("invalid_output",
                                error="envelope provenance must be an object")
            return Outcome("success", value.get("result"), prov)
        return Outcome("success", value, {})

    return poll


def read_pipes(sinks: dict[int, Callable[[bytes], None]], stop: threading.Event) -> None:
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


def kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
