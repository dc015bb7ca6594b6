"""jobcoord's own claim+complete cycle through the Python API, against the raw ceiling
measured in the same run (benchmarks/ceiling.py) with the same processes and durability.

Each worker process opens a Coordinator, sends one heartbeat, waits on a common barrier and
then loops until the queue is empty:

  two  `claim` then `complete`: two write transactions per job, like the ceiling;
  cac  `complete_and_claim`: the completion and the next claim in one transaction.
  many `claim_many` of BATCH (default 32) then `complete_many` of them: two write
       transactions per batch (claim latency is then per batch).

Claim latency is the wall time of `claim` (for cac: of the combined call). The ratio column
is jobcoord's jobs/s over the ceiling's jobs/s from the line just above it.

    python -m benchmarks.throughput [--procs 1,2,4,8] [--sync full,normal]
                                    [--modes two,cac,many] [--batch 32] [--jobs N]
                                    [--pg | --pg-only]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import ceiling, pgqueuer_run
from benchmarks._common import (
    Scratch,
    conditions,
    migrated_sqlite,
    ms,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
    run_processes,
)

PAYLOAD = {"document": "notes/2026-11-29.md", "model": "small"}
RESULT = {"ok": True}
#: Jobs per claim_many / complete_many in the "many" mode (--batch).
BATCH = 32


def _worker(index: int, barrier: Any, queue: Any, where: str, sync: str, mode: str) -> None:
    from jobcoord.service import Coordinator

    if where.startswith("postgresql"):
        c = Coordinator.open(url=where)
    else:
        c = Coordinator.open(where, synchronous=sync)
    worker = f"bench-{index}"
    c.heartbeat(worker, roles=["gpu"])
    lat: list[float] = []
    done = 0
    barrier.wait()
    cpu0 = time.process_time()
    if mode == "two":
        while True:
            t0 = time.perf_counter()
            got = c.claim(worker)
            lat.append(time.perf_counter() - t0)
            job = got["job"]
            if job is None:
                lat.pop()
                if _drained(c, worker):
                    break
                continue
            c.complete(job["job_id"], worker, got["lease"]["epoch"], RESULT)
            done += 1
    elif mode.startswith("many"):
        size = int(mode[4:] or BATCH)
        while True:
            t0 = time.perf_counter()
            got = c.claim_many(worker, size)
            lat.append(time.perf_counter() - t0)
            if not got["claimed"]:
                lat.pop()
                if _drained(c, worker):
                    break
                continue
            c.complete_many([{"job_id": g["job"]["job_id"], "worker_id": worker,
                              "epoch": g["lease"]["epoch"], "result": RESULT}
                             for g in got["claimed"]])
            done += len(got["claimed"])
    else:
        while True:
            got = c.claim(worker)
            while got["job"] is not None:
                t0 = time.perf_counter()
                both = c.complete_and_claim(got["job"]["job_id"], worker,
                                            got["lease"]["epoch"], RESULT)
                lat.append(time.perf_counter() - t0)
                done += 1
                got = both["next"]
            if _drained(c, worker):
                break
    c.close()
    queue.put({"index": index, "done": done, "claim_s": lat,
               "cpu_s": time.process_time() - cpu0})


def _drained(c: Any, worker: str) -> bool:
    """Whether no job waits any more. On PostgreSQL a claim that found nothing may only have
    met rows other workers were claiming at that instant: not the end of the queue. On a
    loaded machine a long run can outlive the heartbeat sent at its start: send another."""
    if c.status()["jobs"].get("waiting", 0) == 0:
        return True
    c.heartbeat(worker, roles=["gpu"])
    return False


def _fill(where: str, jobs: int, sync: str = "normal") -> None:
    from jobcoord.service import Coordinator, JobSpec

    c = (Coordinator.open(url=where) if where.startswith("postgresql")
         else Coordinator.open(where, synchronous=sync))
    try:
        step = 5000
        for start in range(0, jobs, step):
            c.enqueue_many([JobSpec("summarize", PAYLOAD, role="gpu")
                            for i in range(start, min(jobs, start + step))])
    finally:
        c.close()


def jobcoord_sqlite(scratch: Scratch, procs: int, sync: str, mode: str, jobs: int
                    ) -> dict[str, Any]:
    path = scratch.file(f"jobcoord-{sync}-{procs}-{mode}.db")
    migrated_sqlite(path)
    _fill(path, jobs)
    elapsed, results = run_processes(_worker, procs, (path, sync, mode))
    return ceiling._summary(elapsed, results, jobs)


def jobcoord_pg(base_url: str, procs: int, mode: str, jobs: int) -> dict[str, Any]:
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    name = f"jobcoord_bench_throughput_{procs}"
    url = pg_fresh_database(base_url, name)
    try:
        db = Database.open(resolve_target(url=url))
        migrate(db)
        db.close()
        _fill(url, jobs)
        elapsed, results = run_processes(_worker, procs, (url, "on", mode))
    finally:
        pg_drop_database(base_url, name)
    return ceiling._summary(elapsed, results, jobs)


def _line(what: str, sync: str, n: int, r: dict[str, Any], base: float | None) -> str:
    ratio = f"{r['jobs_s'] / base:.2f}x" if base else ""
    return (f"{what:<20} {sync:<7} {n:>5} {r['jobs']:>7} {r['jobs_s']:>9.0f} "
            f"{ms(r['claim_p50']):>13} {ms(r['claim_p99']):>13} {ratio:>7} {r['cpu_us']:>11.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=ceiling._ints, default=[1, 2, 4, 8])
    ap.add_argument("--sync", default="full,normal")
    ap.add_argument("--modes", default="two,cac")
    ap.add_argument("--batch", type=int, default=BATCH, help="jobs per call in mode many")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per run (default by durability)")
    ap.add_argument("--pg", action="store_true", help="also PostgreSQL (JOBCOORD_BENCH_PG_URL "
                    "or JOBCOORD_TEST_PG_URL)")
    ap.add_argument("--pg-only", action="store_true", help="only PostgreSQL")
    args = ap.parse_args()
    url = require_pg_url() if (args.pg or args.pg_only) else None
    syncs = [] if args.pg_only else [s for s in args.sync.split(",") if s]
    modes = [f"many{args.batch}" if m == "many" else m for m in args.modes.split(",") if m]
    print(conditions(syncs or None, modes=", ".join(modes)))
    print()
    print(f"{'cycle':<20} {'sync':<7} {'procs':>5} {'jobs':>7} {'jobs/s':>9} "
          f"{'claim p50 ms':>13} {'claim p99 ms':>13} {'ratio':>7} {'cpu us/job':>11}")
    with Scratch() as scratch:
        for sync in syncs:
            jobs = args.jobs or ceiling.DEFAULT_JOBS[sync]
            for n in args.procs:
                base = ceiling.sqlite_ceiling(scratch, n, sync, jobs)
                print(_line("ceiling sqlite3", sync, n, base, None), flush=True)
                for mode in modes:
                    r = jobcoord_sqlite(scratch, n, sync, mode, jobs)
                    print(_line(f"jobcoord {mode}", sync, n, r, base["jobs_s"]), flush=True)
    if (args.pg or args.pg_only) and url:
        jobs = args.jobs or ceiling.DEFAULT_JOBS["postgresql"]
        for n in args.procs:
            base = ceiling.pg_ceiling(url, n, jobs)
            print(_line("ceiling SKIP LOCKED", "on", n, base, None), flush=True)
            for mode in modes:
                r = jobcoord_pg(url, n, mode, jobs)
                print(_line(f"jobcoord pg {mode}", "on", n, r, base["jobs_s"]), flush=True)
            why = pgqueuer_run.available()
            if why:
                print(f"{'pgqueuer':<20} skipped: {why}", flush=True)
            else:
                r = pgqueuer_run.pgqueuer_run(url, n, jobs)
                print(_line(f"pgqueuer b{pgqueuer_run.BATCH}", "on", n, r, base["jobs_s"]),
                      flush=True)


if __name__ == "__main__":
    main()
