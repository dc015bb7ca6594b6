"""What a concurrency limit or a declared need costs a claim, against the plain claim measured
in the same run, in one process on one SQLite file (synchronous=normal, so the disk's flush
does not drown the difference).

Each round claims and completes `--jobs` jobs under one setup, rounds interleaved so machine
noise falls on every setup alike:

  plain      no limit, no needs: the one-step claim (the yardstick)
  unrelated  a limit on another kind: the claim checks each candidate (limits read once)
  limited    a limit of 1000 on the claimed kind: holders counted in every claim
  needs      every job declares ram_mb=1 and the worker reports memory_available_mb

Reported: the median per-claim wall time over the rounds, and its ratio to `plain`.

    python -m benchmarks.limits [--jobs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import time

from benchmarks._common import Scratch, conditions, median, migrated_sqlite

SETUPS = ("plain", "unrelated", "limited", "needs")


def _round(path: str, setup: str, jobs: int) -> float:
    """Seconds per claim (claim timed alone; completes outside the clock)."""
    from jobcoord.service import Coordinator

    with Coordinator.open(path, synchronous="normal") as c:
        for kind in [r["kind"] for r in c.limits()["limits"]]:
            c.remove_limit(kind)
        if setup == "unrelated":
            c.set_limit("other", 1)
        elif setup == "limited":
            c.set_limit("work", 1000)
        readings = {"memory_available_mb": 10**6} if setup == "needs" else {}
        c.heartbeat("w1", readings=readings)
        needs = {"ram_mb": 1} if setup == "needs" else None
        c.enqueue_many([{"kind": "work", "needs": needs} for _ in range(jobs)])
        spent = 0.0
        for _ in range(jobs):
            t0 = time.perf_counter()
            got = c.claim("w1")
            spent += time.perf_counter() - t0
            job = got["job"]
            assert job is not None, got
            c.complete(job["job_id"], "w1", got["lease"]["epoch"], {})
        return spent / jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(conditions("normal", jobs=args.jobs, rounds=args.rounds))
    times: dict[str, list[float]] = {s: [] for s in SETUPS}
    with Scratch() as scratch:
        for r in range(args.rounds):
            for setup in SETUPS:
                path = scratch.file(f"{setup}-{r}.db")
                migrated_sqlite(path, "normal")
                times[setup].append(_round(path, setup, args.jobs))
    base = median(times["plain"])
    print(f"\n{'setup':<10} {'claim p50 us':>13} {'ratio':>7}")
    for setup in SETUPS:
        m = median(times[setup])
        print(f"{setup:<10} {m * 1e6:>13.0f} {m / base:>6.2f}x")


if __name__ == "__main__":
    main()
