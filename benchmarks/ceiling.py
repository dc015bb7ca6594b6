"""The yardstick: a minimal hand-written claim+complete cycle, with nothing of jobcoord.

SQLite: plain `sqlite3`, WAL, one `BEGIN IMMEDIATE` transaction to claim (one UPDATE ...
RETURNING on a partial index of waiting jobs) and one to complete, N competing processes.
PostgreSQL: plain psycopg, one transaction to claim with `FOR UPDATE SKIP LOCKED`, one to
complete. No lease, epoch, event row or gate: this is what the storage engine allows, and
jobcoord's throughput is reported as a ratio to it, measured in the same run.

    python -m benchmarks.ceiling [--procs 1,2,4,8] [--sync full,normal] [--jobs N] [--pg]
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from typing import Any

from benchmarks._common import (
    Scratch,
    conditions,
    libpq_url,
    ms,
    pct,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
    run_processes,
)

#: Jobs per run by durability: about two seconds of work each on a small machine.
DEFAULT_JOBS = {"full": 6000, "normal": 24000, "postgresql": 12000}

_SQLITE_SCHEMA = (
    "CREATE TABLE jobs (id INTEGER PRIMARY KEY, status TEXT NOT NULL, payload TEXT NOT NULL,"
    " worker TEXT, result TEXT)",
    "CREATE INDEX ix_waiting ON jobs (id) WHERE status = 'waiting'",
)
_SQLITE_CLAIM = (
    "UPDATE jobs SET status = 'running', worker = ? WHERE id = (SELECT id FROM jobs"
    " WHERE status = 'waiting' ORDER BY id LIMIT 1) RETURNING id, payload"
)
_SQLITE_COMPLETE = (
    "UPDATE jobs SET status = 'done', result = ? WHERE id = ? AND status = 'running'"
    " AND worker = ?"
)
_PAYLOAD = '{"document": "notes/2026-11-29.md", "model": "small"}'


def prepare_sqlite(path: str, jobs: int) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    for stmt in _SQLITE_SCHEMA:
        con.execute(stmt)
    con.execute("BEGIN")
    con.executemany("INSERT INTO jobs (status, payload) VALUES ('waiting', ?)",
                    ((_PAYLOAD,) for _ in range(jobs)))
    con.execute("COMMIT")
    con.close()


def _sqlite_worker(index: int, barrier: Any, queue: Any, path: str, sync: str) -> None:
    con = sqlite3.connect(path, isolation_level=None, timeout=30)
    con.execute(f"PRAGMA synchronous={sync.upper()}")
    worker = f"w{index}"
    lat: list[float] = []
    done = 0
    barrier.wait()
    cpu0 = time.process_time()
    while True:
        t0 = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        row = con.execute(_SQLITE_CLAIM, (worker,)).fetchone()
        con.execute("COMMIT")
        lat.append(time.perf_counter() - t0)
        if row is None:
            break
        con.execute("BEGIN IMMEDIATE")
        con.execute(_SQLITE_COMPLETE, ('{"ok": true}', row[0], worker))
        con.execute("COMMIT")
        done += 1
    con.close()
    queue.put({"index": index, "done": done, "claim_s": lat[:-1],
               "cpu_s": time.process_time() - cpu0})


def sqlite_ceiling(scratch: Scratch, procs: int, sync: str, jobs: int) -> dict[str, Any]:
    path = scratch.file(f"ceiling-{sync}-{procs}.db")
    prepare_sqlite(path, jobs)
    elapsed, results = run_processes(_sqlite_worker, procs, (path, sync))
    return _summary(elapsed, results, jobs)


def _summary(elapsed: float, results: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    done = sum(r["done"] for r in results)
    if done != jobs:
        raise RuntimeError(f"{done} jobs completed out of {jobs}")
    lat = [x for r in results for x in r["claim_s"]]
    return {"jobs": done, "seconds": elapsed, "jobs_s": done / elapsed,
            "claim_p50": pct(lat, 50), "claim_p99": pct(lat, 99),
            # CPU per job of the worker processes: steadier than wall time on a busy machine.
            "cpu_us": sum(r["cpu_s"] for r in results) / done * 1e6}


# --- PostgreSQL ---------------------------------------------------------------------------

_PG_CLAIM = (
    "UPDATE jobs SET status = 'running', worker = %s WHERE id = (SELECT id FROM jobs"
    " WHERE status = 'waiting' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
    " RETURNING id, payload"
)
_PG_COMPLETE = (
    "UPDATE jobs SET status = 'done', result = %s WHERE id = %s AND status = 'running'"
    " AND worker = %s"
)


def prepare_pg(url: str, jobs: int) -> None:
    import psycopg

    with psycopg.connect(libpq_url(url)) as con:
        con.execute("CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, status TEXT NOT NULL,"
                    " payload TEXT NOT NULL, worker TEXT, result TEXT)")
        con.execute("CREATE INDEX ix_waiting ON jobs (id) WHERE status = 'waiting'")
        con.execute("INSERT INTO jobs (status, payload) SELECT 'waiting', %s"
                    " FROM generate_series(1, %s)", (_PAYLOAD, jobs))
    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        con.execute("VACUUM ANALYZE jobs")


def _pg_worker(index: int, barrier: Any, queue: Any, url: str) -> None:
    import psycopg

    con = psycopg.connect(libpq_url(url))
    worker = f"w{index}"
    lat: list[float] = []
    done = 0
    barrier.wait()
    cpu0 = time.process_time()
    while True:
        t0 = time.perf_counter()
        row = con.execute(_PG_CLAIM, (worker,), prepare=True).fetchone()
        con.commit()
        lat.append(time.perf_counter() - t0)
        if row is None:
            break
        con.execute(_PG_COMPLETE, ('{"ok": true}', row[0], worker), prepare=True)
        con.commit()
        done += 1
    con.close()
    queue.put({"index": index, "done": done, "claim_s": lat[:-1],
               "cpu_s": time.process_time() - cpu0})


def pg_ceiling(base_url: str, procs: int, jobs: int) -> dict[str, Any]:
    name = f"jobcoord_bench_ceiling_{procs}"
    url = pg_fresh_database(base_url, name)
    try:
        prepare_pg(url, jobs)
        elapsed, results = run_processes(_pg_worker, procs, (url,))
    finally:
        pg_drop_database(base_url, name)
    return _summary(elapsed, results, jobs)


# --- command line -------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--sync", default="full,normal")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per run (default by durability)")
    ap.add_argument("--pg", action="store_true", help="also the PostgreSQL SKIP LOCKED ceiling "
                    "(JOBCOORD_BENCH_PG_URL or JOBCOORD_TEST_PG_URL)")
    args = ap.parse_args()
    url = require_pg_url() if args.pg else None
    syncs = [s for s in args.sync.split(",") if s]
    print(conditions(syncs))
    print()
    print(f"{'backend':<10} {'sync':<7} {'procs':>5} {'jobs':>7} {'jobs/s':>9} "
          f"{'claim p50 ms':>13} {'claim p99 ms':>13} {'cpu us/job':>11}")
    with Scratch() as scratch:
        for sync in syncs:
            for n in args.procs:
                r = sqlite_ceiling(scratch, n, sync, args.jobs or DEFAULT_JOBS[sync])
                print(f"{'sqlite':<10} {sync:<7} {n:>5} {r['jobs']:>7} {r['jobs_s']:>9.0f} "
                      f"{ms(r['claim_p50']):>13} {ms(r['claim_p99']):>13} {r['cpu_us']:>11.0f}",
                      flush=True)
    if args.pg and url:
        for n in args.procs:
            r = pg_ceiling(url, n, args.jobs or DEFAULT_JOBS["postgresql"])
            print(f"{'postgres':<10} {'on':<7} {n:>5} {r['jobs']:>7} {r['jobs_s']:>9.0f} "
                  f"{ms(r['claim_p50']):>13} {ms(r['claim_p99']):>13} {r['cpu_us']:>11.0f}",
                      flush=True)


if __name__ == "__main__":
    main()
