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

A claim bound to a tenant (`--part tenant`, or both parts by default) is measured the same
way for the four workers: tenant b's 1,000 jobs alone, then the same 1,000 behind
`--ahead` (100,000 by default) older waiting jobs of tenant a, which a claim in claim order
would reach first. The ratio column is then the p99 with tenant a's jobs ahead over the p99
with none; the tenant claim indexes (core revision c0007) keep it near 1.

    python -m benchmarks.depth [--large 1000000] [--claims 200] [--backends sqlite,postgresql]
                               [--sync normal] [--part queue|tenant|all] [--ahead 100000]

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
    " SELECT %(tenant)s, (ARRAY['summarize','embed','ocr'])[1 + mod(i * 7919, 3)],"
    " CASE WHEN mod(i * 31, 10) < 7 THEN NULL"
    " ELSE (ARRAY['gpu','cpu','npu','tpu'])[1 + mod(i, 4)] END, mod(i * 13, 4),"
    " '{\"n\":' || i || '}', 'waiting', %(t0)s + i, %(t0)s + i, %(t0)s + i, 0, 3, 0, false,"
    " false FROM generate_series(%(first)s::bigint, %(n)s::bigint) AS i"
)


def _row(i: int, t0: int, tenant: str = "default") -> tuple[Any, ...]:
    role = None if (i * 31) % 10 < 7 else ROLES[i % 4]
    return (tenant, KINDS[(i * 7919) % 3], role, (i * 13) % 4, f'{{"n":{i}}}',
            t0 + i, t0 + i, t0 + i)


#: The tenant a tenant-bound claim is for, and the tenant whose jobs wait ahead of it.
MINE, OTHER = "b", "a"


def _slices(size: int, ahead: int | None) -> list[tuple[str, int, int]]:
    """(tenant, first row, last row) of each fill: `size` jobs of the default tenant, or for
    the tenant part `ahead` older jobs of tenant a (if any) and then `size` of tenant b."""
    if ahead is None:
        return [("default", 1, size)]
    return ([(OTHER, 1, ahead)] if ahead else []) + [(MINE, ahead + 1, ahead + size)]


def _t0() -> int:
    return time.time_ns() // 1000 - 3_600_000_000  # an hour ago: every job is due


def build_sqlite(path: str, size: int, ahead: int | None = None) -> float:
    started = time.perf_counter()
    migrated_sqlite(path)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")  # building a scratch file, not accepting work
    con.execute("BEGIN IMMEDIATE")
    t0 = _t0()
    for tenant, first, last in _slices(size, ahead):
        con.executemany(
            "INSERT INTO jobs (tenant, kind, required_role, priority, payload_json, status,"
            " created_at, updated_at, run_after, attempts, max_attempts, epoch,"
            " effect_started, cancel_requested)"
            " VALUES (?, ?, ?, ?, ?, 'waiting', ?, ?, ?, 0, 3, 0, 0, 0)",
            (_row(i, t0, tenant) for i in range(first, last + 1)))
    con.execute("COMMIT")
    con.execute("ANALYZE")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return time.perf_counter() - started


def build_pg(admin_url: str, name: str, size: int, ahead: int | None = None
             ) -> tuple[str, float]:
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
        t0 = _t0()
        for tenant, first, last in _slices(size, ahead):
            con.execute(_PG_FILL, {"t0": t0, "tenant": tenant, "first": first, "n": last})
        con.execute("VACUUM ANALYZE jobs")
    return url, time.perf_counter() - started


def measure(target: str, sync: str, roles: list[str] | None, kinds: list[str] | None,
            claims: int, tenant: str | None = None) -> list[float]:
    from jobcoord.service import Coordinator

    lat: list[float] = []
    with Coordinator.open(target, synchronous=sync) as c:
        c.heartbeat("depth-worker", roles=roles, kinds=kinds)
        for i in range(WARM + claims):
            t0 = time.perf_counter()
            got = c.claim("depth-worker", tenant=tenant)
            elapsed = time.perf_counter() - t0
            job = got["job"]
            assert job is not None and (tenant is None or job["tenant"] == tenant), got
            if i >= WARM:
                lat.append(elapsed)
            c.complete(job["job_id"], "depth-worker", got["lease"]["epoch"], {"ok": True})
    return lat


def _report(backend: str, size: int | str, label: str, took: float, lat: list[float],
            base: dict[tuple[str, str], float], part: str = "") -> None:
    p99 = pct(lat, 99)
    ratio = p99 / base.setdefault((backend + part, label), p99)
    shown = f"{size:>10,}" if isinstance(size, int) else f"{size:>10}"
    print(f"{backend:>10} {shown} {label:>12} {took:>8.1f} {ms(pct(lat, 50)):>9} "
          f"{ms(p99):>9} {ms(max(lat)):>8} {ratio:>7.2f}x", flush=True)


def _cases(sizes: list[int], part: str, ahead: int) -> list[tuple[str, int | str, int | None]]:
    """The queues of each part: (part, the jobs column, tenant a's jobs ahead of tenant b's;
    None: an untenanted queue of that size)."""
    out: list[tuple[str, int | str, int | None]] = []
    if part in ("queue", "all"):
        out += [("", size, None) for size in sizes]
    if part in ("tenant", "all"):
        out += [("tenant", "b+0", 0), ("tenant", f"b+{ahead:,}", ahead)]
    return out


def run_sqlite(sizes: list[int], claims: int, sync: str, base: dict[Any, float],
               part: str = "queue", ahead: int = 0) -> None:
    with Scratch() as scratch:
        for kind, size, before in _cases(sizes, part, ahead):
            built = scratch.file(f"depth-{size}.db")
            took = build_sqlite(built, SMALL if before is not None else int(size), before)
            tenant = None if before is None else MINE
            for label, roles, kinds in WORKERS:
                run = scratch.file(f"depth-{size}-run.db")
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(run + suffix):
                        os.remove(run + suffix)
                shutil.copy(built, run)
                _report("sqlite", size, label, took,
                        measure(run, sync, roles, kinds, claims, tenant), base, kind)
            os.remove(built)


def run_pg(sizes: list[int], claims: int, base: dict[Any, float], part: str = "queue",
           ahead: int = 0) -> None:
    admin = require_pg_url()
    for kind, size, before in _cases(sizes, part, ahead):
        template = (f"jobcoord_depth_{size}" if before is None
                    else f"jobcoord_depth_tenant_{before}")
        url, took = build_pg(admin, template, SMALL if before is not None else int(size),
                             before)
        tenant = None if before is None else MINE
        try:
            for label, roles, kinds in WORKERS:
                copy = f"{template}_run"
                with pg_admin(admin) as a:
                    a.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')
                    a.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{template}"')
                try:
                    run_url = url.rsplit("/", 1)[0] + "/" + copy
                    _report("postgresql", size, label, took,
                            measure(run_url, "full", roles, kinds, claims, tenant), base,
                            kind)
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
    ap.add_argument("--part", choices=("queue", "tenant", "all"), default="all",
                    help="the queue-depth rows, the tenant-bound claim's, or both")
    ap.add_argument("--ahead", type=int, default=100_000,
                    help="tenant a's waiting jobs ahead of the tenant-bound claim's")
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
        run_sqlite(sizes, args.claims, args.sync, base, args.part, args.ahead)
    if "postgresql" in backends:
        run_pg(sizes, args.claims, base, args.part, args.ahead)


if __name__ == "__main__":
    main()
