"""huey end to end, for the worker-runtime comparison in `benchmarks.batch`: SqliteHuey on a
file, PROCS `huey_consumer` processes x C worker threads, JOBS no-op tasks.

huey is not a jobcoord dependency; install it into the benchmark's own environment only:

    pip install huey

The tasks are enqueued in one transaction while the consumers wait (the same as jobcoord's
`enqueue_many` in the worker run), and jobs/s is counted from that commit until every task's
result is stored (a task returning a value stores it: one write per task, as jobcoord
stores each job's result). Durability: SqliteHuey's storage, WAL, with `PRAGMA synchronous`
set to the same FULL or NORMAL as the jobcoord run (huey's own `fsync` option knows only
FULL and OFF, so a small storage subclass sets the pragma). huey keeps no lease, fence or
event: a task is deleted from its queue when a consumer takes it. Its consumers poll an
empty queue (no wake-up): here every 10 ms at first, backing off to at most 100 ms.

The consumers import `benchmarks.huey_runtime.huey`, configured from the environment
(`JOBCOORD_BENCH_HUEY_DB`, `JOBCOORD_BENCH_HUEY_SYNC`).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DB_ENV = "JOBCOORD_BENCH_HUEY_DB"
SYNC_ENV = "JOBCOORD_BENCH_HUEY_SYNC"
INSTALL = "pip install huey (into the benchmark's environment only)"

try:
    from huey import Huey
    from huey.storage import SqliteStorage
except ImportError:  # the comparison line is skipped with a message
    Huey = None  # type: ignore[assignment,misc]
    SqliteStorage = object  # type: ignore[assignment,misc]


def available() -> bool:
    return Huey is not None


class _Storage(SqliteStorage):  # type: ignore[misc,valid-type]
    """SqliteStorage with `PRAGMA synchronous` set to FULL or NORMAL."""

    def __init__(self, *args: Any, synchronous: str = "full", **kwargs: Any) -> None:
        self._synchronous = synchronous
        super().__init__(*args, **kwargs)

    def _create_connection(self) -> sqlite3.Connection:
        conn = super()._create_connection()
        conn.execute(f"pragma synchronous={self._synchronous}")
        return conn


def make(path: str, sync: str) -> Any:
    return Huey("bench", storage_class=_Storage, filename=path, synchronous=sync)


def noop() -> bool:
    """Does nothing; returns a value so its result is stored (how completion is counted)."""
    return True


huey = make(os.environ[DB_ENV], os.environ.get(SYNC_ENV, "full")) if (
    Huey is not None and os.environ.get(DB_ENV)) else None
noop_task = huey.task(name="noop")(noop) if huey is not None else None


def _results(path: str) -> int:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return int(conn.execute("select count(*) from kv where queue = 'bench'").fetchone()[0])
    finally:
        conn.close()


def runtime(path: str, sync: str, procs: int, threads: int, jobs: int) -> dict[str, Any]:
    """jobs/s of `procs` consumers x `threads` threads on `jobs` no-op tasks."""
    assert Huey is not None
    h = make(path, sync)
    task = h.task(name="noop")(noop)
    env = {**os.environ, DB_ENV: path, SYNC_ENV: sync}
    consumers = [subprocess.Popen(
        [sys.executable, "-m", "huey.bin.huey_consumer", "benchmarks.huey_runtime.huey",
         "-w", str(threads), "-k", "thread", "-d", "0.01", "-m", "0.1", "-C", "-q"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL) for _ in range(procs)]
    try:
        # Ready: one warm-up task per consumer thread has run (every consumer has started
        # and is polling), then the results are cleared.
        for _ in range(procs * threads):
            task()
        end = time.monotonic() + 60
        while _results(path) < procs * threads:
            if time.monotonic() > end or any(p.poll() is not None for p in consumers):
                raise RuntimeError("the huey consumers did not start")
            time.sleep(0.05)
        time.sleep(1.0)
        h.storage.flush_results()
        rows = [(h.name, h.storage.to_blob(h.serialize_task(task.s())), 0)
                for _ in range(jobs)]
        cpu0 = [_cpu_s(p.pid) for p in consumers]
        with h.storage.db(commit=True) as curs:
            curs.executemany("insert into task (queue, data, priority) values (?, ?, ?)", rows)
        t0 = time.perf_counter()
        while _results(path) < jobs:
            if any(p.poll() is not None for p in consumers):
                raise RuntimeError("a huey consumer exited")
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        cpu = sum(_cpu_s(p.pid) for p in consumers) - sum(cpu0)
    finally:
        for p in consumers:
            p.send_signal(signal.SIGINT)
        for p in consumers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        h.storage.close()
    return {"jobs": jobs, "jobs_s": jobs / elapsed, "cpu_us": cpu / jobs * 1e6}


def _cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
