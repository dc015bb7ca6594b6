"""Where the time of one worker's claim+complete cycle goes: pyinstrument over a single
in-process worker on a fresh SQLite database (pip install pyinstrument to run it).

    python -m benchmarks.profile [--jobs N] [--sync normal|full] [--mode two|cac]
"""

from __future__ import annotations

import argparse
import time

from benchmarks._common import Scratch, conditions, migrated_sqlite
from benchmarks.throughput import RESULT, _fill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--sync", default="normal")
    ap.add_argument("--mode", default="two")
    args = ap.parse_args()
    from pyinstrument import Profiler

    from jobcoord.service import Coordinator

    print(conditions(args.sync, mode=args.mode))
    with Scratch() as scratch:
        path = scratch.file("profile.db")
        migrated_sqlite(path)
        _fill(path, args.jobs)
        c = Coordinator.open(path, synchronous=args.sync)
        c.heartbeat("w", roles=["gpu"])
        profiler = Profiler(interval=0.0002)
        t0 = time.perf_counter()
        profiler.start()
        got = c.claim("w")
        while got["job"] is not None:
            job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
            if args.mode == "two":
                c.complete(job, "w", epoch, RESULT)
                got = c.claim("w")
            else:
                got = c.complete_and_claim(job, "w", epoch, RESULT)["next"]
        profiler.stop()
        elapsed = time.perf_counter() - t0
        c.close()
    print(f"\n{args.jobs} jobs in {elapsed:.2f}s: {args.jobs / elapsed:.0f} jobs/s (profiled)")
    print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
