"""Claim latency against queue depth: 1,000 waiting jobs against a large queue (1,000,000 by
default; `--large` for a smaller one), on SQLite and PostgreSQL, for four kinds of worker:
one with no roles and no kinds (takes anything it may), one with roles, one with kinds, one
with both.

The queue is the usual mix: 70 % of the jobs have no role (most work does not need special
hardware), the rest are for role gpu, cpu, npu or tpu; kinds are summarize, embed and ocr;
priorities 0..3; every job is due. The rows are the same on both databases (a fixed formula
of the row number) and are written fast: batch inserts without event rows (the claim never
reads them), then ANALYZE.

For each database, size and worker, a fresh copy of the built database (a file copy on
SQLite, CREATE DATABASE ... TEMPLATE on PostgreSQL) serves 10 warm-up claims and then
`--claims` timed `claim` calls, each followed by an untimed `complete`. The ratio column is
the large queue's p99 over the 1,000-job queue's p99 for the same database and worker.

    python -m benchmarks.depth [--large 1000000] [--claims 200] [--backends sqlite,postgresql]
                               [--sync normal]

PostgreSQL needs JOBCOORD_BENCH_PG_URL (or JOBCOORD_TEST_PG_URL): the URL of an existing
database on the server, used to create and drop the benchmark's own databases.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import time
from typing import Any

from benchmarks._common import (
    Scratch,
    conditions,
    libpq_url,
    migrated_sqlite,
    ms,
    pct,
    pg_admin,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
)

SMALL = 1000
WARM = 10
KINDS = ("summarize", "embed", "ocr")
ROLES = ("gpu", "cpu", "npu", "tpu")
#: The workers measured: (label, roles, kinds).
WORKERS: tuple[tuple[str, list[str] | None, list[str] | None], ...] = (
    ("any", None, None),
    ("roles", ["gpu"], None),
    ("kinds", None, ["summarize"]),
    ("roles+kinds", ["gpu"], ["summarize"]),
)
#: One row per job: the same formula in Python (SQLite) and SQL (PostgreSQL).
_PG_FILL = (
    "INSERT INTO jobs (tenant, kind, required_role, priority, payload_json, status,"
    " created_at, updated_at, run_after, attempts, max_attempts, epoch, effect_started,"
    " cancel_requested)"
    " SELECT 'default', (ARRAY['summarize','embed','ocr'])[1 + mod(i * 7919, 3)],"
    " CASE WHEN mod(i * 31, 10) < 7 THEN NULL"
    " ELSE (ARRAY['gpu','cpu','npu','tpu'])[1 + mod(i, 4)] END, mod(i * 13, 4),"
    " '{\"n\":' || i || '}', 'waiting', %(t0)s + i, %(t0)s + i, %(t0)s + i, 0, 3, 0, false,"
    " false FROM generate_series(1, %(n)s::bigint) AS i"
)


def _row(i: int, t0: int) -> tuple[Any, ...]:
    role = None if (i * 31) % 10 < 7 else ROLES[i % 4]
    return ("default", KINDS[(i * 7919) % 3], role, (i * 13) % 4, f'{{"n":{i}}}',
            t0 + i, t0 + i, t0 + i)


def _t0() -> int:
    return time.time_ns() // 1000 - 3_600_000_000  # an hour ago: every job is due


def build_sqlite(path: str, size: int) -> float:
    started = time.perf_counter()
    migrated_sqlite(path)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")  # building a scratch file, not accepting work
    con.execute("BEGIN IMMEDIATE")
    t0 = _t0()
    con.executemany(
        "INSERT INTO jobs (tenant, kind, required_role, priority, payload_json, status,"
        " created_at, updated_at, run_after, attempts, max_attempts, epoch, effect_started,"
        " cancel_requested) VALUES (?, ?, ?, ?, ?, 'waiting', ?, ?, ?, 0, 3, 0, 0, 0)",
        (_row(i, t0) for i in range(1, size + 1)))
    con.execute("COMMIT")
    con.execute("ANALYZE")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return time.perf_counter() - started


def build_pg(admin_url: str, name: str, size: int) -> tuple[str, float]:
    import psycopg

    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    started = time.perf_counter()
    url = pg_fresh_database(admin_url, name)
    db = Database.open(resolve_target(url=url))
    try:
        migrate(db)
    finally:
        db.close()
    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        con.execute(_PG_FILL, {"t0": _t0(), "n": size})
        con.execute("VACUUM ANALYZE jobs")
    return url, time.perf_counter() - started


def measure(target: str, sync: str, roles: list[str] | None, kinds: list[str] | None,
            claims: int) -> list[float]:
    from jobcoord.service import Coordinator

    lat: list[float] = []
    with Coordinator.open(target, synchronous=sync) as c:
        c.heartbeat("depth-worker", roles=roles, kinds=kinds)
        for i in range(WARM + claims):
            t0 = time.perf_counter()
            got = c.claim("depth-worker")
            elapsed = time.perf_counter() - t0
            job = got["job"]
            assert job is not None, got
            if i >= WARM:
                lat.append(elapsed)
            c.complete(job["job_id"], "depth-worker", got["lease"]["epoch"], {"ok": True})
    return lat


def _report(backend: str, size: int, label: str, took: float, lat: list[float],
            base: dict[tuple[str, str], float]) -> None:
    p99 = pct(lat, 99)
    ratio = p99 / base.setdefault((backend, label), p99)
    print(f"{backend:>10} {size:>10,} {label:>12} {took:>8.1f} {ms(pct(lat, 50)):>9} "
          f"{ms(p99):>9} {ms(max(lat)):>8} {ratio:>7.2f}x", flush=True)


def run_sqlite(sizes: list[int], claims: int, sync: str, base: dict[Any, float]) -> None:
    with Scratch() as scratch:
        for size in sizes:
            built = scratch.file(f"depth-{size}.db")
            took = build_sqlite(built, size)
            for label, roles, kinds in WORKERS:
                run = scratch.file(f"depth-{size}-run.db")
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(run + suffix):
                        os.remove(run + suffix)
                shutil.copy(built, run)
                _report("sqlite", size, label, took, measure(run, sync, roles, kinds, claims),
                        base)
            os.remove(built)


def run_pg(sizes: list[int], claims: int, base: dict[Any, float]) -> None:
    admin = require_pg_url()
    for size in sizes:
        template = f"jobcoord_depth_{size}"
        url, took = build_pg(admin, template, size)
        try:
            for label, roles, kinds in WORKERS:
                copy = f"{template}_run"
                with pg_admin(admin) as a:
                    a.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')
                    a.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{template}"')
                try:
                    run_url = url.rsplit("/", 1)[0] + "/" + copy
                    _report("postgresql", size, label, took,
                            measure(run_url, "full", roles, kinds, claims), base)
                finally:
                    pg_drop_database(admin, copy)
        finally:
            pg_drop_database(admin, template)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large", type=int, default=1_000_000,
                    help="jobs in the large queue (default 1,000,000)")
    ap.add_argument("--claims", type=int, default=200, help="timed claims per worker kind")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--sync", default="normal", help="SQLite synchronous level")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if "postgresql" in backends:
        require_pg_url()  # before any work: a run that silently left it out would be misread
    sizes = [SMALL, args.large]
    print(conditions(args.sync, claims=f"{args.claims} timed claims per worker kind"))
    print()
    print(f"{'database':>10} {'jobs':>10} {'worker':>12} {'build s':>8} {'p50 ms':>9} "
          f"{'p99 ms':>9} {'max ms':>8} {'p99 x':>8}")
    base: dict[tuple[str, str], float] = {}
    if "sqlite" in backends:
        run_sqlite(sizes, args.claims, args.sync, base)
    if "postgresql" in backends:
        run_pg(sizes, args.claims, base)


if __name__ == "__main__":
    main()
