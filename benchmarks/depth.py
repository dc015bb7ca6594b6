"""Claim latency against queue depth: 1,000 / 100,000 / 1,000,000 waiting jobs, most of them
for roles and kinds the claiming worker does not serve.

The worker serves role `gpu` and kind `summarize`. Each database holds 100 jobs it can run
(random priorities, spread over the whole id range); every other job is for role `cpu`,
`npu` or `tpu` (90 %) or for role `gpu` with kind `embed`, which it does not handle (10 %).
The big databases are built fast: a migrated file, then rows batch-inserted with plain
sqlite3 in one transaction (jobs only, no event rows: the claim never reads them).

Each round copies the built file, opens a Coordinator, makes 10 warm-up claims and then 90
timed `claim` calls, each followed by an untimed `complete`; `--rounds` rounds per size.
The ratio column is p99 over the p99 of the smallest database.

    python -m benchmarks.depth [--sizes 1000,100000,1000000] [--rounds 15] [--sync normal]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import time
from typing import Any

from benchmarks._common import Scratch, conditions, migrated_sqlite, ms, pct

SERVED = 100
WARM = 10
OTHER_ROLES = ("cpu", "npu", "tpu")


def build(path: str, size: int, seed: int = 7) -> float:
    """A migrated database with `size` waiting jobs; returns the seconds it took."""
    t0 = time.perf_counter()
    migrated_sqlite(path)
    rng = random.Random(seed)
    now = time.time_ns() // 1000 - 3_600_000_000  # an hour ago: every job is due
    served = set(rng.sample(range(size), SERVED))
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")  # building a scratch file, not accepting work
    con.execute("BEGIN IMMEDIATE")

    def rows() -> Any:
        for i in range(size):
            if i in served:
                role, kind = "gpu", "summarize"
            elif rng.random() < 0.1:
                role, kind = "gpu", "embed"
            else:
                role, kind = rng.choice(OTHER_ROLES), rng.choice(("summarize", "embed", "ocr"))
            yield ("default", kind, role, rng.randrange(4), f'{{"n":{i}}}', now + i, now + i,
                   now + i)

    con.executemany(
        "INSERT INTO jobs (tenant, kind, required_role, priority, payload_json, status,"
        " created_at, updated_at, run_after, attempts, max_attempts, epoch, effect_started,"
        " cancel_requested) VALUES (?, ?, ?, ?, ?, 'waiting', ?, ?, ?, 0, 3, 0, 0, 0)", rows())
    con.execute("COMMIT")
    con.execute("ANALYZE")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return time.perf_counter() - t0


def measure(path: str, sync: str, lat: list[float]) -> None:
    from jobcoord.service import Coordinator

    with Coordinator.open(path, synchronous=sync) as c:
        c.heartbeat("depth-worker", roles=["gpu"], kinds=["summarize"])
        for i in range(SERVED):
            t0 = time.perf_counter()
            got = c.claim("depth-worker")
            elapsed = time.perf_counter() - t0
            job = got["job"]
            assert job is not None and job["kind"] == "summarize", got
            if i >= WARM:
                lat.append(elapsed)
            c.complete(job["job_id"], "depth-worker", got["lease"]["epoch"], {"ok": True})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sync", default="normal")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    print(conditions(args.sync, rounds=f"{args.rounds} x {SERVED - WARM} timed claims"))
    print()
    print(f"{'waiting jobs':>12} {'build s':>8} {'file MB':>8} {'claim p50 ms':>13} "
          f"{'claim p99 ms':>13} {'max ms':>8} {'p99 ratio':>10}")
    base = None
    with Scratch() as scratch:
        for size in sizes:
            built = scratch.file(f"depth-{size}.db")
            took = build(built, size)
            run = scratch.file(f"depth-{size}-run.db")
            lat: list[float] = []
            for _ in range(args.rounds):
                for suffix in ("-wal", "-shm"):
                    if os.path.exists(run + suffix):
                        os.remove(run + suffix)
                shutil.copy(built, run)
                measure(run, args.sync, lat)
            r = {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat)}
            base = base or r["p99"]
            print(f"{size:>12,} {took:>8.1f} {os.path.getsize(built) / 1e6:>8.1f} "
                  f"{ms(r['p50']):>13} {ms(r['p99']):>13} {ms(r['max']):>8} "
                  f"{r['p99'] / base:>9.2f}x", flush=True)
            for p in (built, run):
                os.remove(p)


if __name__ == "__main__":
    main()
