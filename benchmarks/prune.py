"""`prune` on a large history, and what it costs the workers meanwhile.

Builds a database with `--jobs` succeeded jobs that finished eight days ago (each with its
three events: enqueued, claimed, completed) plus waiting work, then runs a worker process
that claims and completes as fast as it can: first alone (the baseline), then while this
process runs `prune --older-than 7d` with `--batch` jobs per transaction. Prints how long
the prune took, and the worker's claim latency (p50, p99, max) in both phases: the longest
claim during the prune is bounded by one batch, not by the whole prune.

    python -m benchmarks.prune [--jobs 100000] [--batch 500] [--pause S] [--sync normal]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sqlite3
import time
from typing import Any

from benchmarks._common import Scratch, conditions, migrated_sqlite, ms, pct

DAY_US = 86_400_000_000


def build(path: str, jobs: int) -> float:
    """`jobs` succeeded jobs finished eight days ago, with their events; seconds taken."""
    t0 = time.perf_counter()
    migrated_sqlite(path)
    old = time.time_ns() // 1000 - 8 * DAY_US
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")  # building a scratch file, not accepting work
    con.execute("BEGIN IMMEDIATE")
    con.executemany(
        "INSERT INTO jobs (job_id, tenant, kind, priority, payload_json, status, created_at,"
        " updated_at, run_after, attempts, max_attempts, epoch, effect_started,"
        " cancel_requested, result_json, finished_at) VALUES (?, 'default', 'summarize', 1,"
        " '{}', 'succeeded', ?, ?, ?, 1, 3, 1, 0, 0, '{\"ok\":true}', ?)",
        ((i, old + i, old + i, old + i, old + i) for i in range(1, jobs + 1)))
    con.executemany(
        "INSERT INTO job_events (job_id, at, from_status, to_status, reason, worker_id, epoch)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (ev for i in range(1, jobs + 1) for ev in (
            (i, old + i, None, "waiting", "enqueued", None, None),
            (i, old + i, "waiting", "running", "claimed", "w", 1),
            (i, old + i, "running", "succeeded", "completed", "w", 1))))
    con.execute("COMMIT")
    con.close()
    return time.perf_counter() - t0


def _worker(path: str, sync: str, go: Any, phase: Any, queue: Any) -> None:
    """Claim and complete until told to stop; claim latencies per phase."""
    from jobcoord.service import Coordinator, JobSpec

    c = Coordinator.open(path, synchronous=sync)
    lat: dict[int, list[float]] = {0: [], 1: []}
    go.wait()
    while phase.value < 2:
        c.heartbeat("bench", roles=["gpu"])
        for _ in range(50):
            now = phase.value
            t0 = time.perf_counter()
            got = c.claim("bench")
            took = time.perf_counter() - t0
            if got["job"] is None:
                c.enqueue_many([JobSpec("summarize", {"n": i}, role="gpu") for i in range(200)])
                continue
            if now < 2:
                lat[now].append(took)
            c.complete(got["job"]["job_id"], "bench", got["lease"]["epoch"], {"ok": True})
    c.close()
    queue.put(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--sync", default="normal")
    ap.add_argument("--pause", type=float, default=None,
                    help="seconds between batches (default: prune's own, as long as a batch)")
    ap.add_argument("--baseline", type=float, default=3.0, help="seconds of the alone phase")
    args = ap.parse_args()
    from jobcoord.service import Coordinator

    print(conditions(args.sync, jobs=args.jobs, batch=args.batch,
                     pause="as long as each batch" if args.pause is None else args.pause))
    with Scratch() as scratch:
        path = scratch.file("prune.db")
        built = build(path, args.jobs)
        ctx = mp.get_context("spawn")
        go, phase, queue = ctx.Event(), ctx.Value("i", 0), ctx.Queue()
        worker = ctx.Process(target=_worker, args=(path, args.sync, go, phase, queue))
        worker.start()
        c = Coordinator.open(path, synchronous=args.sync)
        go.set()
        time.sleep(args.baseline)
        phase.value = 1
        t0 = time.perf_counter()
        out = c.prune("7d", batch=args.batch, pause_s=args.pause)
        took = time.perf_counter() - t0
        phase.value = 2
        lat = queue.get()
        worker.join()
        c.close()
    if out["jobs"] != args.jobs:
        raise RuntimeError(f"pruned {out['jobs']} of {args.jobs} jobs")
    print(f"\nbuilt {args.jobs:,} finished jobs with {3 * args.jobs:,} events in {built:.1f} s")
    print(f"prune: {out['jobs']:,} jobs and {out['events']:,} events in {out['batches']:,}"
          f" batches, {took:.2f} s ({out['jobs'] / took:,.0f} jobs/s)\n")
    print(f"{'worker claims':<22} {'claims':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, values in (("alone", lat[0]), ("during the prune", lat[1])):
        if values:
            print(f"{name:<22} {len(values):>7} {ms(pct(values, 50)):>8} "
                  f"{ms(pct(values, 99)):>8} {ms(max(values)):>8}")


if __name__ == "__main__":
    main()
