"""What the tenant claim indexes (core revision c0007) cost the write path: `enqueue` of one
job per call, `enqueue_many` of them all in one call, and claim + complete of no-op jobs,
through the Python API in one process, on a database at the head and on the same schema
with the two indexes dropped (the yardstick), in alternating rounds of the same run so
machine noise falls on both alike. The claims are not
bound to a tenant (the common case, which reads neither index). Jobs of the default tenant
(`--tenant default`, the default) are in neither index; a job of any other tenant
(`--tenant alice`) enters both when it is enqueued and leaves them when it is claimed.

    python -m benchmarks.tenant_index_cost [--jobs 2000] [--rounds 5] [--sync normal]
                                           [--backends sqlite,postgresql] [--tenant T]

Reports per backend the median microseconds per job of each step with and without the
indexes, and their ratio. PostgreSQL needs JOBCOORD_BENCH_PG_URL (or JOBCOORD_TEST_PG_URL).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from ._common import (
    Scratch,
    command_line,
    conditions,
    migrated_sqlite,
    pg_drop_database,
    pg_fresh_database,
    pg_url,
)

INDEXES = ("ix_jobs_claim_tenant", "ix_jobs_claim_tenant_kind")
WITH, WITHOUT = "with indexes", "without"


def _drop_indexes(c: Any) -> None:
    c.db.write(lambda conn: [conn.exec_driver_sql(f"DROP INDEX {name}") for name in INDEXES])


STEPS = ("enqueue", "enqueue_many", "claim+complete")


def _round(c: Any, jobs: int, tenant: str = "default") -> tuple[float, ...]:
    """Seconds per job of enqueue (one call each), of enqueue_many (one call for all) and of
    claim + complete, for `jobs` jobs each way."""
    started = time.perf_counter()
    for i in range(jobs):
        c.enqueue("noop", {"i": i}, role="gpu" if i % 4 == 0 else None, tenant=tenant)
    enqueued = time.perf_counter()
    c.enqueue_many([{"kind": "noop", "payload": {"i": i}, "tenant": tenant,
                     "role": "gpu" if i % 4 == 0 else None} for i in range(jobs)])
    batched = time.perf_counter()
    beats = 0.0
    for i in range(2 * jobs):
        if i % 200 == 0:  # keep the heartbeat fresh on a slow machine; not timed
            t = time.perf_counter()
            c.heartbeat("w1", roles=["gpu"], readings=None)
            beats += time.perf_counter() - t
        got = c.claim("w1", lease_s=60)
        assert got["job"] is not None, got
        c.complete(got["job"]["job_id"], "w1", got["lease"]["epoch"], {"ok": True})
    done = time.perf_counter()
    return ((enqueued - started) / jobs, (batched - enqueued) / jobs,
            (done - batched - beats) / (2 * jobs))


def measure(targets: dict[str, Any], jobs: int, rounds: int, sync: str,
            tenant: str = "default") -> dict[str, dict[str, list[float]]]:
    from jobcoord.service import Coordinator

    coords = {label: Coordinator.open(t, synchronous=sync) for label, t in targets.items()}
    try:
        for label, c in coords.items():
            if label == WITHOUT:
                _drop_indexes(c)
            c.heartbeat("w1", roles=["gpu"], readings=None)
            _round(c, min(200, jobs), tenant)  # warm up
        out: dict[str, dict[str, list[float]]] = {
            step: {label: [] for label in coords} for step in STEPS}
        for r in range(rounds):
            # Each round flips the order, so neither side always runs first.
            for label, c in list(coords.items())[::1 if r % 2 == 0 else -1]:
                c.heartbeat("w1", roles=["gpu"], readings=None)
                for step, took in zip(STEPS, _round(c, jobs, tenant), strict=True):
                    out[step][label].append(took)
        return out
    finally:
        for c in coords.values():
            c.close()


def report(backend: str, got: dict[str, dict[str, list[float]]]) -> None:
    rounds = len(got["enqueue"][WITH])
    print(f"\n{backend}: us per job, median of {rounds} rounds")
    print(f"  {'step':16} {WITH:>13} {WITHOUT:>9} {'ratio':>7}")
    for step, by in got.items():
        med = {label: statistics.median(v) * 1e6 for label, v in by.items()}
        print(f"  {step:16} {med[WITH]:13.1f} {med[WITHOUT]:9.1f} "
              f"{med[WITH] / med[WITHOUT]:7.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sync", default="normal", choices=("full", "normal"))
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--tenant", default="default",
                    help="the jobs' tenant: default (not in the indexes) or any other")
    args = ap.parse_args()
    print(command_line())
    print(conditions(args.sync))
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    backends = args.backends.split(",")
    with Scratch() as scratch:
        if "sqlite" in backends:
            targets = {}
            for label, name in ((WITH, "with.db"), (WITHOUT, "without.db")):
                path = scratch.file(name)
                migrated_sqlite(path)
                targets[label] = resolve_target(db=path)
            report(f"SQLite ({args.sync})", measure(targets, args.jobs, args.rounds,
                                                    args.sync, args.tenant))
        if "postgresql" in backends:
            admin = pg_url()
            if admin is None:
                print("PostgreSQL skipped: set JOBCOORD_BENCH_PG_URL")
                return
            stamp = int(time.time())
            names = {WITH: f"jobcoord_bench_tw_{stamp}", WITHOUT: f"jobcoord_bench_to_{stamp}"}
            try:
                targets = {}
                for label, name in names.items():
                    url = pg_fresh_database(admin, name)
                    db = Database.open(resolve_target(url=url))
                    try:
                        migrate(db)
                    finally:
                        db.close()
                    targets[label] = resolve_target(url=url)
                report("PostgreSQL", measure(targets, args.jobs, args.rounds, "full", args.tenant))
            finally:
                for name in names.values():
                    pg_drop_database(admin, name)


if __name__ == "__main__":
    main()
