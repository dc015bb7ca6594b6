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

With `--backlog N`, instead: a claim behind N waiting jobs this worker may not take, the
first in claim order, in one write transaction each (what it holds the SQLite file for):

  limit      N jobs of a kind whose limit of 1 another worker holds
  keyed      the same under a limit per payload field, every job with the held value
  needs      N jobs each needing more ram_mb than the worker reports

Reported per setup: the median claim that finds nothing else (refused), and the median claim
that takes the one job queued behind the N (with how many of the claims took it).

    python -m benchmarks.limits [--jobs N] [--rounds R]
    python -m benchmarks.limits --backlog N [--rounds R]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks._common import Scratch, conditions, median, migrated_sqlite

SETUPS = ("plain", "unrelated", "limited", "needs")
BACKLOGS = ("limit", "keyed", "needs")


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


def _backlog(path: str, setup: str, n: int, rounds: int
             ) -> tuple[list[float], list[float], int]:
    """Seconds per refused claim and per taking claim behind `n` held jobs, and how many of
    the taking claims took the job behind them."""
    from jobcoord.service import Coordinator

    with Coordinator.open(path, synchronous="normal") as c:
        beat = {"memory_available_mb": 1000}
        c.heartbeat("w1", readings=beat)
        if setup == "limit":
            c.set_limit("held", 1)
        elif setup == "keyed":
            c.set_limit("held", 1, key="model")
        item: dict[str, Any] = {"kind": "held", "payload": {"model": "a"}, "priority": 0}
        if setup == "needs":
            item["needs"] = {"ram_mb": 10**6}
        else:
            c.enqueue("held", {"model": "a"}, priority=0)
            assert c.claim("w1", lease_s=3600)["job"] is not None
        for start in range(0, n, 10_000):
            c.enqueue_many([item] * min(10_000, n - start))
        refused: list[float] = []
        taking: list[float] = []
        took = 0
        for _ in range(rounds):
            c.heartbeat("w2", readings=beat)  # outside the clock: never stale
            t0 = time.perf_counter()
            got = c.claim("w2")
            refused.append(time.perf_counter() - t0)
            assert got["job"] is None, got
            free = c.enqueue("free", {}, priority=1)["job_id"]
            t0 = time.perf_counter()
            got = c.claim("w2")
            taking.append(time.perf_counter() - t0)
            if got["job"] is not None and got["job"]["job_id"] == free:
                took += 1
                c.complete(free, "w2", got["lease"]["epoch"], {})
            else:
                c.cancel(free)
        return refused, taking, took


def backlog_main(n: int, rounds: int) -> None:
    print(conditions("normal", backlog=n, rounds=rounds))
    print(f"\n{'setup':<10} {'refused p50 ms':>15} {'taking p50 ms':>14} {'took':>7}")
    with Scratch() as scratch:
        for setup in BACKLOGS:
            path = scratch.file(f"backlog-{setup}.db")
            migrated_sqlite(path, "normal")
            refused, taking, took = _backlog(path, setup, n, rounds)
            print(f"{setup:<10} {median(refused) * 1e3:>15.1f} {median(taking) * 1e3:>14.1f} "
                  f"{took:>3}/{rounds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backlog", type=int, metavar="N",
                    help="measure claims behind N held jobs instead (see above)")
    args = ap.parse_args()
    if args.backlog is not None:
        backlog_main(args.backlog, args.rounds)
        return
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
