"""pgqueuer's consumer over no-op jobs on PostgreSQL: the other PostgreSQL queue jobcoord's
worker is compared with, measured in the same run as the SKIP LOCKED ceiling.

pgqueuer is not a dependency: install it in the benchmark's environment
(`pip install pgqueuer`); without it the comparison line says it was skipped.

Each of N processes runs pgqueuer's `QueueManager` (its own dequeue, batch size 10, its own
status log and completion buffers) with one no-op entrypoint, in drain mode, on a fresh
database where all jobs were enqueued before the processes start; the time runs from the
common start to the last process's end.

    python -m benchmarks.pgqueuer_run [--procs 4] [--jobs N]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks import ceiling
from benchmarks._common import (
    conditions,
    libpq_url,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
    run_processes,
)

#: Jobs per pgqueuer dequeue (its default).
BATCH = 10


def available() -> str | None:
    """None when pgqueuer can be imported, else why not (for the skip message)."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError as e:
        return f"pgqueuer is not installed ({e}); `pip install pgqueuer` to compare"
    return None


async def _install_and_fill(url: str, jobs: int) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    conn = await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True)
    try:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        step = 5000
        for start in range(0, jobs, step):
            k = min(jobs, start + step) - start
            await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
    finally:
        await conn.close()


async def _consume(url: str, barrier: Any) -> int:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True)
    done = 0
    try:
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        await qm.run(batch_size=BATCH, mode=QueueExecutionMode.drain)
    finally:
        await conn.close()
    return done


def _worker(index: int, barrier: Any, queue: Any, url: str) -> None:
    cpu0 = time.process_time()
    done = asyncio.run(_consume(url, barrier))
    queue.put({"index": index, "done": done, "claim_s": [],
               "cpu_s": time.process_time() - cpu0})


def pgqueuer_run(base_url: str, procs: int, jobs: int) -> dict[str, Any]:
    """pgqueuer's consumer in `procs` processes over `jobs` no-op jobs: ceiling._summary's
    figures (no claim latency: pgqueuer's dequeue is not timed on its own)."""
    name = f"jobcoord_bench_pgqueuer_{procs}"
    url = pg_fresh_database(base_url, name)
    try:
        asyncio.run(_install_and_fill(url, jobs))
        elapsed, results = run_processes(_worker, procs, (url,))
    finally:
        pg_drop_database(base_url, name)
    return ceiling._summary(elapsed, results, jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    url = require_pg_url()
    jobs = args.jobs or ceiling.DEFAULT_JOBS["postgresql"]
    print(conditions(None, procs=args.procs))
    print()
    base = ceiling.pg_ceiling(url, args.procs, jobs)["jobs_s"]
    print(f"{'ceiling SKIP LOCKED':<26} {jobs:>6} {base:>8.0f}", flush=True)
    why = available()
    if why:
        print(f"{'pgqueuer':<26} skipped: {why}")
        return
    r = pgqueuer_run(url, args.procs, jobs)
    print(f"{'pgqueuer':<26} {jobs:>6} {r['jobs_s']:>8.0f} {r['jobs_s'] / base:>6.2f}x")


if __name__ == "__main__":
    main()
