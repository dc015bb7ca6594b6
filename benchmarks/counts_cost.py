"""What the job counts cost the hot path: claim + complete of no-op jobs through the Python
API, one process, on a database with the c0004 triggers and on the same schema with them
dropped (the yardstick), in alternating rounds of the same run so machine noise falls on
both alike.

    python -m benchmarks.counts_cost [--jobs 2000] [--rounds 5] [--sync normal]
                                     [--backends sqlite,postgresql]

Reports per backend the median microseconds per job (claim + complete) with and without the
triggers, and their ratio. PostgreSQL needs JOBCOORD_BENCH_PG_URL (or JOBCOORD_TEST_PG_URL).
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

TRIGGERS = ("jobs_counted_insert", "jobs_counted_delete", "jobs_counted_update")


def _drop_triggers(c: Any) -> None:
    on = "" if c.db.dialect == "sqlite" else " ON jobs"

    def _do(conn: Any) -> None:
        for name in TRIGGERS:
            conn.exec_driver_sql(f"DROP TRIGGER {name}{on}")

    c.db.write(_do)


def _round(c: Any, jobs: int) -> float:
    """Seconds per job of enqueue-many + claim + complete for `jobs` jobs."""
    c.enqueue_many([{"kind": "noop"} for _ in range(jobs)])
    started = time.perf_counter()
    for _ in range(jobs):
        got = c.claim("w1", lease_s=60)
        c.complete(got["job"]["job_id"], "w1", got["lease"]["epoch"], {"ok": True})
    return (time.perf_counter() - started) / jobs


def measure(targets: dict[str, Any], jobs: int, rounds: int, sync: str) -> dict[str, list]:
    from jobcoord.service import Coordinator

    coords = {label: Coordinator.open(t, synchronous=sync) for label, t in targets.items()}
    try:
        for label, c in coords.items():
            if label == "without counts":
                _drop_triggers(c)
            c.heartbeat("w1", readings=None)
            _round(c, min(200, jobs))  # warm up
        out: dict[str, list[float]] = {label: [] for label in coords}
        for _ in range(rounds):
            for label, c in coords.items():
                c.heartbeat("w1", readings=None)
                out[label].append(_round(c, jobs))
        return out
    finally:
        for c in coords.values():
            c.close()


def report(backend: str, got: dict[str, list[float]]) -> None:
    med = {label: statistics.median(v) * 1e6 for label, v in got.items()}
    print(f"\n{backend}: claim + complete, us per job (median of {len(next(iter(got.values())))}"
          " rounds)")
    for label, us in med.items():
        print(f"  {label:16} {us:9.1f}")
    print(f"  ratio with/without counts: {med['with counts'] / med['without counts']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sync", default="normal", choices=("full", "normal"))
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    print(command_line())
    print(conditions(args.sync))
    from jobcoord.db import resolve_target

    backends = args.backends.split(",")
    with Scratch() as scratch:
        if "sqlite" in backends:
            targets = {}
            for label, name in (("with counts", "with.db"), ("without counts", "without.db")):
                path = scratch.file(name)
                migrated_sqlite(path)
                targets[label] = resolve_target(db=path)
            report(f"SQLite ({args.sync})", measure(targets, args.jobs, args.rounds,
                                                    args.sync))
        if "postgresql" in backends:
            admin = pg_url()
            if admin is None:
                print("PostgreSQL skipped: set JOBCOORD_BENCH_PG_URL")
                return
            stamp = int(time.time())
            names = {"with counts": f"jobcoord_bench_cw_{stamp}",
                     "without counts": f"jobcoord_bench_co_{stamp}"}
            try:
                targets = {}
                for label, name in names.items():
                    url = pg_fresh_database(admin, name)
                    from jobcoord.db import Database
                    from jobcoord.migrate import migrate

                    db = Database.open(resolve_target(url=url))
                    try:
                        migrate(db)
                    finally:
                        db.close()
                    targets[label] = resolve_target(url=url)
                report("PostgreSQL", measure(targets, args.jobs, args.rounds, "full"))
            finally:
                for name in names.values():
                    pg_drop_database(admin, name)


if __name__ == "__main__":
    main()
