"""Accepting work: single `enqueue` calls (one transaction each) and the batch API
(`enqueue_many`, one transaction), on SQLite at FULL and NORMAL and optionally PostgreSQL.

The `raw floor` column is the batch's own two statements (jobs, then their `enqueued`
events) run with plain sqlite3 executemany on prepared parameters: what the batch would cost
if validating and preparing the jobs in Python cost nothing.

    python -m benchmarks.enqueue [--single N] [--batch N] [--sync full,normal] [--pg]
                                 [--repeat R] [--profile]

With --repeat R the batch and its raw floor run R times each, alternating, and the medians
and the median of the per-round ratios are printed (the machine is noisy: read the ratio).
--profile prints cProfile's top lines for one more batch.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sqlite3
import statistics
import time
from typing import Any

from benchmarks._common import (
    Scratch,
    conditions,
    migrated_sqlite,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
)


def _payload(i: int) -> dict[str, Any]:
    return {"document": f"notes/{i:07d}.md", "model": "small"}


def measure(coord: Any, single: int, batch: int) -> dict[str, float]:
    from jobcoord.service import JobSpec

    t0 = time.perf_counter()
    for i in range(single):
        coord.enqueue("summarize", _payload(i), role="gpu")
    single_s = time.perf_counter() - t0
    specs = [JobSpec("summarize", _payload(i), role="gpu") for i in range(batch)]
    t0 = time.perf_counter()
    out = coord.enqueue_many(specs)
    batch_s = time.perf_counter() - t0
    assert len(out) == batch
    return {"single_s": single / single_s if single else 0.0, "batch_s": batch / batch_s}


def raw_floor(path: str, sync: str, n: int) -> float:
    from jobcoord.store import statements

    now = time.time_ns() // 1000
    jobs = [{"job_id": i, "tenant": "default", "kind": "summarize", "role": "gpu",
             "priority": 1, "payload": f'{{"document":"notes/{i:07d}.md","model":"small"}}',
             "now": now, "run_after": now, "deadline": None, "max_attempts": 3, "f": False}
            for i in range(1, n + 1)]
    events = [{"job_id": i, "now": now, "from_status": None, "to_status": "waiting",
               "reason": "enqueued", "worker": None, "epoch": None, "detail": '{"priority":1}'}
              for i in range(1, n + 1)]
    con = sqlite3.connect(path, isolation_level=None)
    con.execute(f"PRAGMA synchronous={sync.upper()}")
    t0 = time.perf_counter()
    con.execute("BEGIN IMMEDIATE")
    con.executemany(statements.INSERT_JOB_AT.sqlite, jobs)
    con.executemany(statements.INSERT_EVENT.sqlite, events)
    con.execute("COMMIT")
    took = time.perf_counter() - t0
    con.close()
    return n / took


def profile_batch(path: str, sync: str, n: int, top: int = 12) -> str:
    """cProfile's top lines (by own time) for one enqueue_many of n jobs."""
    from jobcoord.service import Coordinator, JobSpec

    migrated_sqlite(path)
    specs = [JobSpec("summarize", _payload(i), role="gpu") for i in range(n)]
    with Coordinator.open(path, synchronous=sync) as c:
        prof = cProfile.Profile()
        prof.enable()
        c.enqueue_many(specs)
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--sync", default="full,normal")
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    url = require_pg_url() if args.pg else None
    from jobcoord.service import Coordinator

    syncs = [s for s in args.sync.split(",") if s]
    print(conditions(syncs, single=args.single, batch=args.batch))
    print()
    print(f"{'backend':<10} {'sync':<7} {'single jobs/s':>14} {'batch jobs/s':>13} "
          f"{'raw floor':>10}")
    with Scratch() as scratch:
        for sync in syncs:
            batches, floors = [], []
            for rnd in range(args.repeat):
                path = scratch.file(f"enqueue-{sync}-{rnd}.db")
                migrated_sqlite(path)
                with Coordinator.open(path, synchronous=sync) as c:
                    r = measure(c, args.single if rnd == 0 else 0, args.batch)
                    if rnd == 0:
                        single = r["single_s"]
                floor_path = scratch.file(f"enqueue-floor-{sync}-{rnd}.db")
                migrated_sqlite(floor_path)
                batches.append(r["batch_s"])
                floors.append(raw_floor(floor_path, sync, args.batch))
            batch, floor = statistics.median(batches), statistics.median(floors)
            ratio = statistics.median(b / f for b, f in zip(batches, floors, strict=True))
            print(f"{'sqlite':<10} {sync:<7} {single:>14.0f} {batch:>13.0f} "
                  f"{floor:>10.0f}  batch/floor {ratio:.2f} (median of {args.repeat})",
                  flush=True)
            if args.profile:
                print(profile_batch(scratch.file(f"enqueue-{sync}-profile.db"), sync,
                                    args.batch))
    if args.pg and url:
        from jobcoord.db import Database, resolve_target
        from jobcoord.migrate import migrate

        name = "jobcoord_bench_enqueue"
        db_url = pg_fresh_database(url, name)
        try:
            db = Database.open(resolve_target(url=db_url))
            migrate(db)
            db.close()
            with Coordinator.open(url=db_url) as c:
                r = measure(c, args.single, args.batch)
            print(f"{'postgres':<10} {'on':<7} {r['single_s']:>14.0f} {r['batch_s']:>13.0f}")
        finally:
            pg_drop_database(url, name)


if __name__ == "__main__":
    main()
