"""The two ways to run a handler: a Python callable in a thread, or a command in its own process
group under a shim that dies with the worker and ends with its lease; each returns a poll for
its outcome.

Command protocol. The command runs under `_SHIM`, so it and its process group die with the
worker, and are stopped at the end of the lease the worker last renewed even when the worker
itself is stopped or hung (`LeaseLine`). The payload is written as JSON to stdin; stdout must
be one JSON value, the result (empty stdout is `{}`), validated like `complete --result`. The
command is judged by its own exit; output still held open afterwards by a process outside its
group is read for at most `OUTPUT_DRAIN_S` and reported. To report provenance, print an
envelope instead: `{"jobcoord_envelope": 1, "result": ..., "provenance": {...}}`. The
environment carries
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
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import validate as v
from ..app import Cancelled, Context, PermanentError, Result
from ..errors import InvalidInput, JobcoordError
from ..leftovers import RANDOM, hold, pid_alive, sweep
from .clock import boottime

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

#: The shim starts stopping the command this long before the lease's end it was last told
#: of (at most LEASE_STOP_AHEAD_FRACTION of the lease): the stop is under way before another
#: worker can claim the job, never after.
LEASE_STOP_AHEAD_S = 0.25
LEASE_STOP_AHEAD_FRACTION = 0.1
#: ... and SIGKILLs it by then: the SIGTERM goes `--kill-grace` earlier, at most this
#: fraction of the lease. A command deaf to SIGTERM ran the whole kill grace past the lease's
#: end, beside the next attempt of another worker.
LEASE_STOP_GRACE_FRACTION = 0.25

#: Runs a command handler so that it dies with its worker (Linux). It asks the kernel for
#: SIGHUP when its parent goes (PR_SET_PDEATHSIG, which survives exec) and then checks that
#: its parent is still the worker that started it: a worker that died before the prctl is
#: caught by that check, one that dies after it by the signal. On either, it SIGKILLs its
#: whole process group: the command and everything the command started that stayed in the
#: group. The command itself also gets SIGKILL as its own death signal, in case the shim is
#: killed. The kernel sends the death signal when the parent *thread* exits too (the job
#: thread that started the command); the shim then finds its parent still alive and goes on.
#:
#: It also ends with the lease. A stopped (SIGSTOP) or hung worker neither renews nor stops
#: its command, and a dead-worker check cannot see it: the shim is told over its line (a
#: socket, `LeaseLine`) when the lease ends, at the start and after every renewal, as a time
#: on the machine's boot clock (shared by every process, so the time the line takes does not
#: move the end). When that time passes with no later one told, it says `lease_expired` on
#: the line and stops the whole group the way the worker stops a command whose lease is lost:
#: SIGTERM, then SIGKILL after the kill grace (argv[3]), itself included. The line reaching
#: EOF means the worker is gone (it holds its end until the shim has exited): the group is
#: SIGKILLed then too, which also covers systems without a death signal.
#: The shim holds none of the command's pipes, and exits with the command's own status.
_SHIM = r"""
import ctypes, os, select, signal, sys, time
worker, line, grace, argv = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
os.set_inheritable(line, False)  # the command does not hold the worker's line
boot = getattr(time, "CLOCK_BOOTTIME", None)
def now():
    return time.clock_gettime(boot) if boot is not None else time.monotonic()
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
# The command's exit wakes the wait below (SIGCHLD writes to `woken`), as the line does.
woken, wake = os.pipe()
os.set_blocking(wake, False)
signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
signal.signal(signal.SIGCHLD, lambda *_: None)
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
def wait_for_command(until, fds):
    # The command's status once it exited; None at `until`, or once one of `fds` is readable.
    # poll, not select: the line keeps the worker's descriptor number, which may pass 1023.
    watch = select.poll()
    for fd in (woken, *fds):
        watch.register(fd, select.POLLIN)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        left = None if until is None else until - now()
        if left is not None and left <= 0:
            return None
        ready = [fd for fd, _ in watch.poll(None if left is None else left * 1000)]
        if woken in ready:
            os.read(woken, 4096)
        if line in ready:
            return None
end, told = None, b""
while True:
    status = wait_for_command(end, [line])
    if status is not None:
        break
    if end is not None and now() >= end:
        try:
            os.write(line, b"lease_expired\n")
        except OSError:
            pass
        os.killpg(0, signal.SIGTERM)  # the shim itself ignores it
        wait_for_command(now() + grace, [])
        os.killpg(0, signal.SIGKILL)
    try:
        got = os.read(line, 4096)
    except OSError:
        got = b""
    if not got:
        orphaned()
    *ends, told = (told + got).split(b"\n")
    if ends:
        end = float(ends[-1])
if os.WIFSIGNALED(status):
    # Die of the command's signal, so the worker reads it. SIGKILL's disposition cannot be
    # set (EINVAL): left uncaught, that error made an OOM kill read as "exit code 1".
    if os.WTERMSIG(status) != signal.SIGKILL:
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


def described(e: BaseException) -> str:
    """`Type: message` of what a handler raised, whatever its `__str__` does: one that
    raised escaped the handler's call, and the job stayed leased with nothing running."""
    try:
        text = str(e)
    except BaseException as exc:  # any: the handler's class decides what it raises
        text = f"(its message could not be read: {type(exc).__name__})"
    return f"{type(e).__name__}: {text}"


def call_python(run: JobRun, ctx: Context) -> Outcome:
    """Call the Python handler on this thread and return its outcome; never raises."""
    assert run.spec.fn is not None
    try:
        value = run.spec.fn(run.job["payload"], ctx)
        if isinstance(value, Result):
            reported = value.provenance
            if reported is None:
                return Outcome("success", value.value, {})
            try:
                # What dict() takes is taken (a mapping, pairs, a database row).
                prov = dict(reported)
            except (TypeError, ValueError):
                # Raised here, the worker's own error failed the attempt as if the handler
                # had raised it, and pointed at the handler's code.
                return Outcome("invalid", error="the provenance must be a mapping of names "
                               f"to JSON values, not {type(reported).__name__}")
            return Outcome("success", value.value, prov)
        return Outcome("success", value, {})
    except Cancelled as e:
        if ctx.cancelled:
            reason = ctx.cancel_reason or "cancelled"
            return Outcome("lost", code=reason, error=f"handler stopped: {reason}")
        # Raised by the handler itself, nothing having told it to stop: taken for a lost
        # lease, the attempt was reported by nobody and the job sat leased to its end.
        return Outcome("failed", error=described(e))
    except PermanentError as e:
        return Outcome("permanent", error=described(e))
    except JobcoordError as e:
        if e.code == "feature_missing":
            # (`ctx.artifact` on a database without artifact storage.) Only the operator's
            # migrate heals it: every attempt would run to this point and fail alike.
            return Outcome("permanent", error=f"{described(e)}, then `jobcoord retry` this "
                           "job")
        return Outcome("failed", error=described(e))
    except BaseException as e:
        # sys.exit() or KeyboardInterrupt raised in a handler ends this call, not the
        # worker: the attempt failed, now, instead of holding its slot until the timeout.
        return Outcome("failed", error=described(e))


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
    fd, path = tempfile.mkstemp(prefix=f"jobcoord-w{os.getpid()}-{run.job_id}-",
                                suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    run.checkpoints_file = path
    _held(run, path)
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
    _held(run, run.artifacts_out)
    return env


def _held(run: JobRun, path: str) -> None:
    """Hold `path` while the run lives: a starting worker's sweep leaves it alone, in
    whatever PID namespace it runs (released when the run ends: `JobRun.held`)."""
    fd = hold(path)
    if fd is not None:
        run.held.append(fd)


class LeaseLine:
    """The worker's end of its line to a command's shim: it tells the shim when the lease ends,
    and hears whether the shim stopped the command for it (see _SHIM)."""

    def __init__(self, lease_s: float, grace_s: float = 0.0) -> None:
        """`grace_s`: the kill grace to fit before the lease's end (`start_command`), so the
        shim is told to begin that much earlier; 0 (`run_guarded`'s time limit) begins at
        the end and gives the shim's own grace after it."""
        self.ours, self.theirs = socket.socketpair()
        # A shim that is itself stopped never makes a renewal wait: a line it does not read
        # fills, and the ends that do not fit are dropped (it keeps the earlier end).
        self.ours.setblocking(False)
        self.ahead_s = min(LEASE_STOP_AHEAD_S, lease_s * LEASE_STOP_AHEAD_FRACTION)
        self.grace_s = min(grace_s, lease_s * LEASE_STOP_GRACE_FRACTION)
        # Held while the socket is used or closed: a renewal telling the end while the
        # command's waiter closes the line never writes to a reused descriptor.
        self._lock = threading.Lock()

    def tell(self, left_s: float) -> None:
        """The lease ends in `left_s` seconds: the shim stops the command a little before,
        its SIGKILL (after `grace_s`) too."""
        text = f"{boottime() + left_s - self.ahead_s - self.grace_s:.6f}\n".encode()
        with self._lock, contextlib.suppress(OSError):
            self.ours.send(text)

    def expired(self) -> bool:
        """Whether the shim stopped the command because the lease ended (read once it has
        exited)."""
        with self._lock:
            try:
                said = self.ours.recv(4096)
            except OSError:
                return False
        return said.startswith(b"lease_expired")

    def close(self) -> None:
        with self._lock:
            self.ours.close()
            self.theirs.close()


#: What the shim says on stderr when the program cannot start (it then exits 127).
CANNOT_START = b"cannot start command"


#: How often `run_guarded` looks at its `stop` while its command runs.
GUARD_LOOK_S = 0.2


class GuardStopped(Exception):
    """`run_guarded`'s command was stopped because its caller asked (`stop`)."""


def run_guarded(argv: list[str], timeout_s: float, env: Mapping[str, str],
                grace_s: float = 2.0, stop: threading.Event | None = None
                ) -> tuple[int | None, bytes]:
    """Run `argv` to its end under the shim (see _SHIM), in a process group of its own:
    it and everything it started die with this process however this process dies (a
    plain subprocess outlived a SIGKILLed worker, re-parented to init), and are stopped
    (SIGTERM, then SIGKILL after `grace_s`) after `timeout_s`, or once `stop` is set
    (then GuardStopped is raised). Returns its exit status, None when it was stopped at
    the time limit, and the last 2000 bytes of its output."""
    line = LeaseLine(timeout_s)
    line.tell(timeout_s)
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()),
                 str(line.theirs.fileno()), repr(grace_s), *argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(env),
                start_new_session=True, pass_fds=(line.theirs.fileno(),))
        except BaseException:
            line.close()
            raise
        line.theirs.close()  # the shim's alone: its EOF tells the shim this process is gone
        asked = False
        try:
            while True:
                try:
                    proc.wait(None if stop is None else GUARD_LOOK_S)
                    break
                except subprocess.TimeoutExpired:
                    if stop is not None and stop.is_set() and not asked:
                        asked = True
                        line.tell(0)  # the shim stops the group as at its time limit
        finally:
            kill_group(proc, signal.SIGKILL)  # what it left behind in its group goes too
            stopped = line.expired()
            line.close()
        if asked:
            raise GuardStopped(f"{argv[0]} was stopped: its caller is stopping")
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - 2000))
        said = out.read()
    return (None if stopped else proc.returncode), said


def start_command(run: JobRun, ctx: Context, lease_left_s: float) -> Callable[[], Outcome | None]:
    """Start the command under the shim in its own process group, feed it the payload, read
    its output; the poll returns its outcome once it exited (None while it runs). The lease
    ends in `lease_left_s` seconds: then the shim stops the command, unless told of a later
    end (`run.lease_line`)."""
    assert run.spec.command is not None
    limit = run.w.result_limit(run.spec)
    stdin_bytes = json.dumps(run.job["payload"]).encode()
    line = LeaseLine(run.w.config.lease_s, run.w.config.kill_grace_s)
    # Told before the shim starts: it never runs a moment without the lease's end.
    line.tell(lease_left_s)
    # A new session puts the command and its children in their own process group, so
    # stopping the job stops all of them and a signal to the worker's group misses them.
    # The command starts under a small shim that dies with this worker and ends with the
    # lease (see _SHIM).
    try:
        run.proc = proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()),
             str(line.theirs.fileno()), repr(line.grace_s), *run.spec.command],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=command_env(run, ctx), start_new_session=True,
            pass_fds=(line.theirs.fileno(),))
    except BaseException:
        line.close()
        raise
    line.theirs.close()  # the shim's alone: its EOF tells the shim this worker is gone
    run.lease_line = line
    run.w.children.add(proc)
    out = bytearray()
    tail: collections.deque[bytes] = collections.deque()
    flags = {"too_large": False, "held_open": False, "lease_expired": False}
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
        flags["lease_expired"] = line.expired()
        line.close()
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
        if flags["lease_expired"]:
            # Its shim saw the lease end: whatever the command did, the job may be someone
            # else's now. Nothing is reported, as for any lost lease.
            run.w.log("lease_lost", job_id=run.job_id, epoch=run.epoch,
                      reason="lease_expired", detail="the command was stopped at the lease's "
                      "end: no renewal got through in time (renewals failing, or the worker "
                      "stopped or hung)")
            return Outcome("lost", code="lease_expired")
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

        def invalid(why: str) -> Outcome:
            """Invalid output, with the first 200 bytes printed as the evidence."""
            msg = f"{why}; output began: {repr(raw[:200])[2:-1]}"
            if flags["held_open"]:
                msg += f"; {held}"
            return Outcome("invalid_output", error=msg)

        try:
            # The very validation `complete --result` applies: strict UTF-8, no
            # duplicate keys, no NaN, bounded depth and size.
            value, _ = v.json_value(raw, "the command's output", max_bytes=limit,
                                    require_object=False,
                                    too_large_code="result_too_large")
        except InvalidInput as e:
            return invalid(e.message)
        marker = value.get("jobcoord_envelope") if isinstance(value, dict) else None
        if type(marker) is int and marker == 1:  # exactly 1: `true` is not an envelope
            if "result" not in value:
                return invalid("the envelope has no \"result\"")
            prov = value.get("provenance") or {}
            if not isinstance(prov, dict):
                return invalid("envelope provenance must be an object")
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


#: The command files of a worker run, named for the worker process that owns them:
#: jobcoord-w<pid>-<job>-artifacts-<random>/ and jobcoord-w<pid>-<job>-<random>.json.
_OWNED = re.compile(
    rf"jobcoord-w(?P<pid>\d+)-\d+-(?:(?P<dir>artifacts-){RANDOM}|{RANDOM}\.json)")


#: A remote worker's upload spooled from a stream (jobcoord.http.client._spooled).
#: A remote worker's spooled upload (`http.client._spooled`); one made before its name held
#: its worker's PID has none.
_SPOOLED = re.compile(rf"jobcoord-upload-(?:(?P<pid>\d+)-)?{RANDOM}")


def sweep_orphans(directory: str | None = None) -> int:
    """Remove the commands' files and checkpoints, and the spooled uploads, that a worker
    process killed outright (SIGKILL, the OOM killer) left in the temporary directory:
    those of this user that no live worker holds (see jobcoord.leftovers). Its runs
    removed them as they ended; nothing else would, and a command's artifacts may be
    gigabytes. Returns how many were removed."""
    directory = directory or tempfile.gettempdir()
    # A young unheld entry may be one a live worker has not locked yet: left, unless the
    # PID it names is gone.
    return (sweep(directory, _OWNED, pid_alive)
            + sweep(directory, _SPOOLED,
                    lambda found: found.group("pid") is None or pid_alive(found)))
