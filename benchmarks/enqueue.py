"""Accepting work: single `enqueue` calls (one transaction each) and the batch API
(`enqueue_many`, one transaction), on SQLite at FULL and NORMAL and optionally PostgreSQL.

The `raw floor` is the cheapest correct way found to store the same rows with plain sqlite3:
rows prepared before the clock starts (bound by position, 256 rows per INSERT), one BEGIN
IMMEDIATE, one executemany for the jobs and one for their `enqueued` events, COMMIT; the
constants written into the SQL; the same schema (indexes, the job-count trigger), the same
connection settings as jobcoord's (foreign keys on, the same synchronous level), and the
same values (the event's detail as jobcoord records it). It is what the batch would cost
if checking and preparing the jobs in Python cost nothing. `no counts` is that floor on the
same schema without the job-count trigger (what the trigger costs per row); `1 row` is the
floor with one row per INSERT (as executemany of a one-row statement does it): SQLite runs
each INSERT that fires a trigger under a statement journal of the pages it touches, so
one row per statement pays that journal per job.

    python -m benchmarks.enqueue [--single N] [--batch N] [--sync full,normal] [--pg]
                                 [--repeat R] [--profile]

With --repeat R the batch and the floors run R times each, alternating, and the medians
and the median of the per-round ratios are printed (the machine is noisy: read the ratio).
`cpu` ratios compare the process CPU time (user + system) each side took, which another
process's load disturbs less than wall time. --profile prints cProfile's top lines for one
more batch.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sqlite3
import statistics
import time
from itertools import chain
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
    t0, c0 = time.perf_counter(), time.process_time()
    out = coord.enqueue_many(specs)
    batch_s, batch_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert len(out) == batch
    return {"single_s": single / single_s if single else 0.0, "batch_s": batch / batch_s,
            "batch_cpu": batch_cpu}


#: The floor's statements: every constant in the text, every value bound by position.
FLOOR_JOB = (
    "INSERT INTO jobs (job_id, tenant, kind, required_role, priority, payload_json, status, "
    "created_at, updated_at, run_after, deadline_at, attempts, max_attempts, epoch, "
    "idempotency_key, effect_started, cancel_requested, needs_json) VALUES ",
    "(?, ?, ?, ?, ?, ?, 'waiting', ?, ?, ?, NULL, 0, ?, 0, NULL, 0, 0, NULL)")
FLOOR_EVENT = (
    "INSERT INTO job_events (job_id, at, from_status, to_status, reason, worker_id, epoch, "
    "detail) VALUES ", "(?, ?, NULL, 'waiting', 'enqueued', NULL, NULL, ?)")
FLOOR_ROWS = 256


def _insert_rows(con: sqlite3.Connection, stmt: tuple[str, str], rows: list[tuple[Any, ...]],
                 per: int) -> None:
    """`rows` inserted `per` rows per statement (the rows' values one after the other)."""
    head, group = stmt
    whole = len(rows) - len(rows) % per
    if whole:
        con.executemany(head + ", ".join([group] * per),
                        [tuple(chain.from_iterable(rows[i:i + per]))
                         for i in range(0, whole, per)])
    if whole < len(rows):
        con.execute(head + ", ".join([group] * (len(rows) - whole)),
                    tuple(chain.from_iterable(rows[whole:])))


def raw_floor(path: str, sync: str, n: int, *, counts: bool = True,
              per: int = FLOOR_ROWS) -> tuple[float, float]:
    """jobs/s and CPU seconds of the floor on a fresh migrated database at `path`."""
    now = time.time_ns() // 1000
    # The values jobcoord stores for these specs (see the module's docstring).
    jobs = [(i, "default", "summarize", "gpu", 1,
             f'{{"document":"notes/{i:07d}.md","model":"small"}}', now, now, now, 3)
            for i in range(1, n + 1)]
    detail = '{"max_attempts":3,"priority":1}'
    events = [(i, now, detail) for i in range(1, n + 1)]
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA foreign_keys=ON")
    con.execute(f"PRAGMA synchronous={sync.upper()}")
    if not counts:
        con.execute("DROP TRIGGER jobs_counted_insert")
    t0, c0 = time.perf_counter(), time.process_time()
    con.execute("BEGIN IMMEDIATE")
    _insert_rows(con, FLOOR_JOB, jobs, per)
    _insert_rows(con, FLOOR_EVENT, events, per)
    con.execute("COMMIT")
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    con.close()
    return n / took, cpu


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
          f"{'raw floor':>10} {'no counts':>10} {'1 row':>8}  {'batch/floor':>11} "
          f"{'cpu ratio':>9} {'counts cost':>11}")
    with Scratch() as scratch:
        for sync in syncs:
            batches, floors, bare, one_row = [], [], [], []
            cpu_ratios, count_costs = [], []
            for rnd in range(args.repeat):
                path = scratch.file(f"enqueue-{sync}-{rnd}.db")
                migrated_sqlite(path)
                with Coordinator.open(path, synchronous=sync) as c:
                    r = measure(c, args.single if rnd == 0 else 0, args.batch)
                    if rnd == 0:
                        single = r["single_s"]
                floor_path = scratch.file(f"enqueue-floor-{sync}-{rnd}.db")
                migrated_sqlite(floor_path)
                floor, floor_cpu = raw_floor(floor_path, sync, args.batch)
                bare_path = scratch.file(f"enqueue-bare-{sync}-{rnd}.db")
                migrated_sqlite(bare_path)
                nocount, nocount_cpu = raw_floor(bare_path, sync, args.batch, counts=False)
                one_path = scratch.file(f"enqueue-one-{sync}-{rnd}.db")
                migrated_sqlite(one_path)
                one_row.append(raw_floor(one_path, sync, args.batch, per=1)[0])
                batches.append(r["batch_s"])
                floors.append(floor)
                bare.append(nocount)
                # CPU: floor CPU / batch CPU, so that like the jobs/s ratio, 1.0 is the floor.
                cpu_ratios.append(floor_cpu / r["batch_cpu"])
                count_costs.append(floor_cpu / nocount_cpu)
            batch, floor = statistics.median(batches), statistics.median(floors)
            ratio = statistics.median(b / f for b, f in zip(batches, floors, strict=True))
            print(f"{'sqlite':<10} {sync:<7} {single:>14.0f} {batch:>13.0f} "
                  f"{floor:>10.0f} {statistics.median(bare):>10.0f} "
                  f"{statistics.median(one_row):>8.0f}  {ratio:>11.2f} "
                  f"{statistics.median(cpu_ratios):>9.2f} "
                  f"{statistics.median(count_costs):>10.2f}x  (medians of {args.repeat})",
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
