"""The worker runtime end to end, against the raw single-job ceiling measured in the same run
(benchmarks/ceiling.py, same processes and durability); the pickup latency of idle workers;
and their idle CPU.

  runtime  PROCS `jobcoord worker --concurrency C` processes (no-op Python handler) are
           started and left idle, then JOBS jobs are enqueued in one transaction; jobs/s is
           counted from that commit until every job has succeeded. `batched` is the default
           worker (claim_many up to the free slots, completions in groups), `single` the
           same with --no-batch. The ratio is to the ceiling line above it. On SQLite,
           huey follows (SqliteHuey, PROCS consumers x C threads, the same durability and
           number of tasks: benchmarks/huey_runtime.py; `pip install huey` into the
           benchmark's environment to include it, the line says so when it is missing).
           Worker CPU is the worker (or consumer) processes' user+system time per job.
  pickup   4 idle workers; one job at a time is enqueued, after a random 20-60 ms pause;
           the latency is from the enqueue's return (its commit) to the handler's start
           (the handler stamps time.time()). p50 and p99 over N jobs.
  idle     the CPU each of those 4 idle workers used over 10 s, in % of one core.

  With --remote, the runtime part also runs the same workers through one `jobcoord serve`
  on the same database (`worker --server`, a token each), batched (claims with `n`, groups
  through POST /v1/completions) and single (--no-batch: chained completions), and reports
  the server's CPU per job and the ratio to the local batched workers of the same run.

    python -m benchmarks.batch [--procs 4] [--concurrency 8] [--sync full,normal]
                               [--jobs N] [--pickups 200] [--pg | --pg-only]
                               [--parts runtime,pickup,idle] [--remote]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import ceiling, huey_runtime
from benchmarks._common import (
    Scratch,
    conditions,
    migrated_sqlite,
    ms,
    pct,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
)

REPO = Path(__file__).resolve().parent.parent


def pgqueuer_line(url: Any, procs: int, jobs: int, base: float, sync: str) -> str:
    """pgqueuer's consumer in the same run (benchmarks/pgqueuer_run.py), or why not."""
    from benchmarks.pgqueuer_run import available, pgqueuer_run

    why = available()
    if why:
        return f"{'pgqueuer':<26} skipped: {why}"
    r = pgqueuer_run(url, procs, jobs)
    return (f"{f'pgqueuer {procs} procs':<26} {sync:<7} {jobs:>6} {r['jobs_s']:>8.0f} "
            f"{r['jobs_s'] / base:>6.2f}x")


def _where(target: str, sync: str) -> list[str]:
    if target.startswith("postgresql"):
        return ["--url", target]
    return ["--db", target, "--synchronous", sync]


def start_workers(target: str, sync: str, procs: int, concurrency: int, *extra: str,
                  remote: tuple[str, list[str]] | None = None
                  ) -> list[subprocess.Popen[bytes]]:
    """PROCS worker processes on `target`, or, with `remote` (a server's URL and one token
    file per worker), the same workers through that `jobcoord serve`."""
    out = []
    for i in range(procs):
        where = (_where(target, sync) if remote is None else [])
        via = ([] if remote is None else ["--server", remote[0], "--token-file", remote[1][i]])
        out.append(subprocess.Popen(
            [sys.executable, "-m", "jobcoord", *where, "worker", *via,
             "--worker-id", f"bench-{i}", "--app", "benchmarks.noop_app:app",
             "--concurrency", str(concurrency), "--lease", "60", "--heartbeat-every", "5",
             "--reap-every", "0", "--poll", "1", *extra],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL))
    return out


def start_server(target: str, sync: str, procs: int, tmp: str
                 ) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    """`jobcoord serve` on `target` (its own durability setting) and a worker token file
    per worker process: the server, its URL and the token files."""
    import json

    from jobcoord import tokens
    from jobcoord.service import Coordinator

    c = (Coordinator.open(url=target) if target.startswith("postgresql")
         else Coordinator.open(target, synchronous=sync))
    try:
        files = []
        for i in range(procs):
            secret = tokens.create(c.db, f"bench-{i}", "worker", worker=f"bench-{i}")["token"]
            path = os.path.join(tmp, f"bench-{i}.token")
            with open(path, "w") as f:
                f.write(secret + "\n")
            os.chmod(path, 0o600)
            files.append(path)
    finally:
        c.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", *_where(target, sync), "serve", "--port", "0",
         "--json", "--reap-every", "0"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert server.stdout is not None
    return server, json.loads(server.stdout.readline())["url"], files


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def _wait_idle(c: Any, procs: int) -> None:
    """Until every worker has sent its heartbeat and tried a claim (so it is waiting)."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        ws = c.workers()["workers"]
        if len(ws) >= procs and all(w["last_refusal"] for w in ws):
            time.sleep(0.3)
            return
        time.sleep(0.1)
    raise RuntimeError("the workers did not start")


def runtime(target: str, sync: str, procs: int, concurrency: int, jobs: int,
            batched: bool, remote: bool = False) -> dict[str, Any]:
    """`remote`: the workers run through one `jobcoord serve` on the target (the server's
    CPU is counted beside the workers')."""
    import tempfile

    from jobcoord.service import Coordinator, JobSpec

    tmp = tempfile.mkdtemp(prefix="jobcoord-bench-")
    server = None
    if remote:
        server, url, files = start_server(target, sync, procs, tmp)
    c = (Coordinator.open(url=target) if target.startswith("postgresql")
         else Coordinator.open(target, synchronous=sync))
    workers = start_workers(target, sync, procs, concurrency,
                            *(() if batched else ("--no-batch",)),
                            remote=None if server is None else (url, files))
    try:
        _wait_idle(c, procs)
        specs = [JobSpec("noop", {"i": i}) for i in range(jobs)]
        cpu0 = [_cpu_s(p.pid) for p in workers]
        server0 = 0.0 if server is None else _cpu_s(server.pid)
        c.enqueue_many(specs)
        t0 = time.perf_counter()
        while c.status()["jobs"].get("succeeded", 0) < jobs:
            if any(p.poll() is not None for p in workers):
                raise RuntimeError("a worker exited")
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        cpu = sum(_cpu_s(p.pid) for p in workers) - sum(cpu0)
        server_cpu = 0.0 if server is None else _cpu_s(server.pid) - server0
    finally:
        stop_workers(workers)
        if server is not None:
            stop_workers([server])
        c.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {"jobs": jobs, "jobs_s": jobs / elapsed, "cpu_us": cpu / jobs * 1e6,
            "server_cpu_us": server_cpu / jobs * 1e6}


def pickup(target: str, sync: str, n: int) -> dict[str, Any]:
    from jobcoord.service import Coordinator

    c = (Coordinator.open(url=target) if target.startswith("postgresql")
         else Coordinator.open(target, synchronous=sync))
    workers = start_workers(target, sync, 4, 1)
    lat: list[float] = []
    cpu: list[float] = []
    rng = random.Random(16)
    try:
        _wait_idle(c, 4)
        for _ in range(n):
            time.sleep(rng.uniform(0.02, 0.06))
            job = c.enqueue("stamp", {})["job_id"]
            committed = time.time()
            while True:
                shown = c.show(job)["job"]
                if shown["status"] == "succeeded":
                    break
                time.sleep(0.002)
            lat.append(shown["result"]["started"] - committed)
        time.sleep(1.0)
        before = [_cpu_s(p.pid) for p in workers]
        t0 = time.monotonic()
        time.sleep(10)
        span = time.monotonic() - t0
        cpu = [(_cpu_s(p.pid) - b) / span * 100 for p, b in zip(workers, before, strict=True)]
    finally:
        stop_workers(workers)
        c.close()
    return {"p50": pct(lat, 50), "p99": pct(lat, 99), "cpu": cpu}


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sqlite_target(scratch: Scratch, name: str) -> str:
    path = scratch.file(name)
    migrated_sqlite(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--sync", default="full,normal")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--pickups", type=int, default=200)
    ap.add_argument("--parts", default="runtime,pickup,idle")
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--pg-only", action="store_true")
    ap.add_argument("--remote", action="store_true",
                    help="also run the workers through one `jobcoord serve` (--server)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    url = require_pg_url() if (args.pg or args.pg_only) else None
    syncs = [] if args.pg_only else [s for s in args.sync.split(",") if s]
    print(conditions(syncs or None, procs=args.procs, concurrency=args.concurrency))
    print()
    targets: list[tuple[str, str]] = [("sqlite", s) for s in syncs]
    if url:
        targets.append(("postgresql", "on"))
    with Scratch() as scratch:
        if "runtime" in parts:
            print(f"{'run':<26} {'sync':<7} {'jobs':>6} {'jobs/s':>8} {'ratio':>7} "
                  f"{'worker cpu us/job':>18}")
            for backend, sync in targets:
                jobs = args.jobs or ceiling.DEFAULT_JOBS[sync if backend == "sqlite"
                                                         else "postgresql"]
                if backend == "sqlite":
                    base = ceiling.sqlite_ceiling(scratch, args.procs, sync, jobs)["jobs_s"]
                    label = "ceiling sqlite3"
                else:
                    base = ceiling.pg_ceiling(url, args.procs, jobs)["jobs_s"]
                    label = "ceiling SKIP LOCKED"
                print(f"{label:<26} {sync:<7} {jobs:>6} {base:>8.0f}", flush=True)
                local = None
                for batched, remote in ((True, False), (False, False), (True, True),
                                        (False, True)):
                    if remote and not args.remote:
                        continue
                    name = ("remote " if remote else "worker ") + (
                        f"{args.procs}x{args.concurrency} "
                        + ("batched" if batched else "single"))
                    r = _run(backend, scratch, url, f"rt-{sync}-{batched}-{remote}.db",
                             lambda t, b=batched, s=sync, j=jobs, rm=remote: runtime(
                                 t, s, args.procs, args.concurrency, j, b, rm))
                    if batched and not remote:
                        local = r["jobs_s"]
                    extra = (f"   server {r['server_cpu_us']:.0f} us/job, "
                             f"{r['jobs_s'] / local:.2f}x the local batched workers"
                             if remote and local else "")
                    print(f"{name:<26} {sync:<7} {jobs:>6} {r['jobs_s']:>8.0f} "
                          f"{r['jobs_s'] / base:>6.2f}x {r['cpu_us']:>18.0f}{extra}",
                          flush=True)
                if backend == "sqlite":
                    name = f"huey {args.procs}x{args.concurrency} threads"
                    if not huey_runtime.available():
                        print(f"{name:<26} {sync:<7} skipped: huey is not installed; "
                              f"{huey_runtime.INSTALL}", flush=True)
                        continue
                    r = huey_runtime.runtime(scratch.file(f"huey-{sync}.db"), sync, args.procs,
                                             args.concurrency, jobs)
                    print(f"{name:<26} {sync:<7} {jobs:>6} {r['jobs_s']:>8.0f} "
                          f"{r['jobs_s'] / base:>6.2f}x {r['cpu_us']:>18.0f}", flush=True)
                if backend == "postgresql":
                    print(pgqueuer_line(url, args.procs, jobs, base, sync), flush=True)
            print()
        if parts & {"pickup", "idle"}:
            print(f"{'pickup (4 idle workers)':<26} {'sync':<7} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'idle CPU % per worker':>22}")
            for backend, sync in targets:
                r = _run(backend, scratch, url, f"pickup-{sync}.db",
                         lambda t, s=sync: pickup(t, s, args.pickups))
                cpu = " ".join(f"{x:.2f}" for x in r["cpu"])
                print(f"{backend:<26} {sync:<7} {ms(r['p50']):>8} {ms(r['p99']):>8} "
                      f"{cpu:>22}", flush=True)


def _run(backend: str, scratch: Scratch, url: str | None, name: str, fn: Any) -> Any:
    if backend == "sqlite":
        return fn(_sqlite_target(scratch, name))
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    assert url is not None
    db_name = "jobcoord_bench_batch"
    db_url = pg_fresh_database(url, db_name)
    try:
        db = Database.open(resolve_target(url=db_url))
        migrate(db)
        db.close()
        return fn(db_url)
    finally:
        pg_drop_database(url, db_name)


if __name__ == "__main__":
    main()
