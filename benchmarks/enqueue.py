"""Accepting work: single `enqueue` calls (one transaction each) and the batch API
(`enqueue_many`, one transaction), on SQLite at FULL and NORMAL and optionally PostgreSQL.

The `raw floor` column is the batch's own two statements (jobs, then their `enqueued`
events) run with plain sqlite3 executemany on prepared parameters: what the batch would cost
if validating and preparing the jobs in Python cost nothing.

    python -m benchmarks.enqueue [--single N] [--batch N] [--sync full,normal] [--pg]
"""

from __future__ import annotations

import argparse
import sqlite3
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
    return {"single_s": single / single_s, "batch_s": batch / batch_s}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--sync", default="full,normal")
    ap.add_argument("--pg", action="store_true")
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
            path = scratch.file(f"enqueue-{sync}.db")
            migrated_sqlite(path)
            with Coordinator.open(path, synchronous=sync) as c:
                r = measure(c, args.single, args.batch)
            floor_path = scratch.file(f"enqueue-floor-{sync}.db")
            migrated_sqlite(floor_path)
            floor = raw_floor(floor_path, sync, args.batch)
            print(f"{'sqlite':<10} {sync:<7} {r['single_s']:>14.0f} {r['batch_s']:>13.0f} "
                  f"{floor:>10.0f}", flush=True)
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
