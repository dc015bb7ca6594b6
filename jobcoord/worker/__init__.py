"""The worker runtime: claim, run a handler under a lease, report the outcome with the epoch.

One worker process runs up to `concurrency` jobs at a time. Threads:

- the main thread claims (only the kinds it has handlers for) and handles SIGTERM/SIGINT;
- a ticker thread heartbeats the machine's real readings every `heartbeat_s` and reaps
  expired leases every `reap_s` (any number of workers reaping at once is safe: each change
  is a compare-and-set on status and epoch);
- one thread per running job waits for its handler, renews the lease every lease/3
  (`RENEW_FRACTION`), enforces the wall-clock budget, and reports the outcome. A Python
  handler is called on that thread itself; a timer thread (`threads.Watch`) hands one that
  is still running over to the lease loop on another thread at the first moment the loop
  would have anything to do (a renewal, the budget, the lease's end, its look every
  `LOOP_MAX_WAIT_S`; a shutdown's release at once). All of them are long-lived threads
  taken from the worker's `threads.Threads` and given back when the job is over (starting
  two threads per job cost more than a no-op job's claim and completion). A run lives
  until its handler has returned, and a slot is such a live run (never a job id): a Python
  handler that ignores its stop keeps its slot (and its thread), and a newer attempt of the
  same job claimed meanwhile waits for it before starting its own handler;
- a completer thread accepts finished jobs' results in groups (`completer`).

With batches, the claim loop claims up to its free slots in one call; while fewer than half
the slots are free and others run, it waits a few milliseconds for more to free (and for
runs whose group just committed to end) so each claim and each group stays large.

Every loop survives errors that can heal (a database restart, a lost connection, a locked or
unwritable file) with a log line and bounded backoff; `runtime.is_fatal` names the ones that
stop the worker. A `burst` worker whose claims keep failing gives up after `give_up_s` (10 s)
once nothing of its own runs, with the error's exit code. Local lease timing runs on
CLOCK_BOOTTIME (it counts a suspend), the wall clock is checked against the lease's
`expires_at`, and a gap between the clocks (a resume) makes the worker stop or renew at once
and heartbeat at once. The clocks are one `Clock`
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

The command protocol is in `handlers`. The package's rooms: `loop` (the Worker: claim loop,
slots, timers, signals, drain), `run` (JobRun: the lease keeper, renewals, budget,
reporting), `handlers` (a Python callable or a command, and how each is stopped),
`completer` (groups of completions), `threads` (the reused threads), `config`
(WorkerConfig and the `jobcoord worker` options), `log` (Log), `clock` (Clock and the gap
watch). Every name other code imports from `jobcoord.worker` is re-exported here.
"""

from __future__ import annotations

from .clock import CLOCK_GAP_S, LOOP_MAX_WAIT_S, Clock
from .config import WorkerConfig, make_config, parse_exec, parse_kind_values
from .handlers import (
    CHECKPOINTS_ENV_MAX_BYTES,
    OUTPUT_DRAIN_S,
    PERMANENT_EXIT_CODE,
    STDERR_TAIL_BYTES,
)
from .log import Log
from .loop import EXIT_FORCED, GATE_CODES, BoundedCalls, Worker
from .run import MAX_ERROR_CHARS, RENEW_FRACTION, JobRun

__all__ = [
    "CHECKPOINTS_ENV_MAX_BYTES", "CLOCK_GAP_S", "EXIT_FORCED", "GATE_CODES", "LOOP_MAX_WAIT_S",
    "MAX_ERROR_CHARS", "OUTPUT_DRAIN_S", "PERMANENT_EXIT_CODE", "RENEW_FRACTION",
    "STDERR_TAIL_BYTES", "BoundedCalls", "Clock", "JobRun", "Log", "Worker", "WorkerConfig",
    "make_config", "parse_exec", "parse_kind_values",
]
