"""Memory of one worker process over a long run: claim+complete 100,000 jobs through the
Python API in one process and print its resident set size every 10,000 jobs. Flat means the
last samples stay within noise of the first one taken after warm-up (no per-job growth in
caches, result objects, connections or event listeners).

    python -m benchmarks.memory [--jobs 100000] [--every 10000] [--mode two|cac] [--sync normal]
"""

from __future__ import annotations

import argparse
import time

from benchmarks._common import Scratch, conditions, migrated_sqlite

RESULT = {"ok": True}


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--mode", default="two", choices=("two", "cac"))
    ap.add_argument("--sync", default="normal")
    args = ap.parse_args()
    from jobcoord.service import Coordinator, JobSpec

    print(conditions(args.sync, jobs=args.jobs, mode=args.mode))
    print()
    print(f"{'jobs done':>10} {'rss KiB':>9} {'vs first':>9} {'jobs/s':>8}")
    with Scratch() as scratch:
        path = scratch.file("memory.db")
        migrated_sqlite(path)
        with Coordinator.open(path, synchronous=args.sync) as c:
            for start in range(0, args.jobs, 10_000):
                c.enqueue_many([JobSpec("summarize", {"n": i}, role="gpu")
                                for i in range(start, min(args.jobs, start + 10_000))])
            c.heartbeat("mem-worker", roles=["gpu"])
            done, first, t0 = 0, None, time.perf_counter()
            got = c.claim("mem-worker")
            while got["job"] is not None:
                job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
                if args.mode == "two":
                    c.complete(job, "mem-worker", epoch, RESULT)
                    got = c.claim("mem-worker")
                else:
                    got = c.complete_and_claim(job, "mem-worker", epoch, RESULT)["next"]
                done += 1
                if done % args.every == 0:
                    c.heartbeat("mem-worker", roles=["gpu"])  # stays fresh for the gates
                    rss = rss_kib()
                    first = first or rss
                    rate = args.every / (time.perf_counter() - t0)
                    print(f"{done:>10,} {rss:>9,} {rss - first:>+9,} {rate:>8.0f}", flush=True)
                    t0 = time.perf_counter()


if __name__ == "__main__":
    main()
