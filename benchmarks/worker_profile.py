"""Where one worker process's time goes under the `batch` runtime load: PROCS-1 ordinary
`jobcoord worker` processes and one worker run in this process under cProfile on every one
of its threads (the claim loop, the completer, the database threads, each job's threads),
on a fresh SQLite database with JOBS no-op jobs enqueued in one transaction while the
workers wait. Each thread is timed by its own CPU time (`time.thread_time`), so waiting for
a lock, the GIL, a sleep or the disk counts nothing: on a machine shared with other work, CPU
time per job is what can be compared. The profiles of all threads are merged; the top lines
by own time and by cumulative time are printed, with the jobs/s of the whole run (profiled,
so slower).

    python -m benchmarks.worker_profile [--jobs 4000] [--sync normal] [--procs 4]
                                        [--concurrency 8] [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import pstats
import sys
import threading
import time
from typing import Any

from benchmarks._common import Scratch, conditions, migrated_sqlite
from benchmarks.batch import _wait_idle, start_workers, stop_workers


class AllThreads:
    """cProfile on every thread started while it is on (not the calling thread)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _hook(self, *_: Any) -> None:
        sys.setprofile(None)  # this thread's own profiler replaces the hook
        prof = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append(prof)
        prof.enable()

    def start(self) -> None:
        threading.setprofile(self._hook)

    def stop(self) -> pstats.Stats:
        threading.setprofile(None)
        for p in self.profiles:
            p.disable()  # (a profile is only active in its own thread; this ends its use)
        stats = pstats.Stats(self.profiles[0], stream=io.StringIO())
        for p in self.profiles[1:]:
            with contextlib.suppress(TypeError):  # a thread that never ran a profiled call
                stats.add(p)
        return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--sync", default="normal")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    from jobcoord.service import Coordinator, JobSpec
    from jobcoord.worker import Log, Worker, make_config

    print(conditions(args.sync, procs=args.procs, concurrency=args.concurrency))
    with Scratch() as scratch:
        path = scratch.file("profile.db")
        migrated_sqlite(path)
        c = Coordinator.open(path, synchronous=args.sync)
        others = start_workers(path, args.sync, args.procs - 1, args.concurrency)
        mine = Coordinator.open(path, synchronous=args.sync)
        config = make_config(
            app_spec="benchmarks.noop_app:app", execs=(), roles=(), worker_id="profiled",
            lease="60", concurrency=str(args.concurrency), grace="10", kill_grace="5",
            heartbeat_every="5", reap_every="0", poll="1", timeouts=(), max_results=(),
            readings_override=None, log_format="text", max_jobs=None, burst=False,
            database_url=None, policy=mine.policy)
        with open("/dev/null", "w") as sink:
            worker = Worker(mine, config, Log("profiled", "text", sink))
            claims: list[tuple[int, int]] = []
            claim = worker._claim

            def counted(free: int) -> dict[str, Any]:
                got = claim(free)
                claims.append((free, len(got["claimed"])))
                return got

            worker._claim = counted  # type: ignore[method-assign]
            prof = AllThreads()
            prof.start()
            thread = threading.Thread(target=worker.run, name="profiled-worker")
            thread.start()
            try:
                _wait_idle(c, args.procs)
                c.enqueue_many([JobSpec("noop", {"i": i}) for i in range(args.jobs)])
                t0 = time.perf_counter()
                while c.status()["jobs"].get("succeeded", 0) < args.jobs:
                    time.sleep(0.02)
                elapsed = time.perf_counter() - t0
            finally:
                worker.stopping.set()
                worker.wake.set()
                thread.join(60)
                stats = prof.stop()
                stop_workers(others)
                mine.close()
                c.close()
    done = worker.counts["completed"]
    cpu = stats.total_tt  # type: ignore[attr-defined]
    print(f"\n{args.jobs} jobs in {elapsed:.2f}s: {args.jobs / elapsed:.0f} jobs/s; the "
          f"profiled worker completed {done} of them on {len(prof.profiles)} threads, "
          f"{cpu:.2f} s of CPU: {cpu / max(done, 1) * 1e6:.0f} us per job (profiled)\n")
    flushes = worker.completer.flushes if worker.completer is not None else {}
    print(f"groups flushed, by why: {flushes}")
    asked = collections.Counter(free for free, _ in claims)
    got = collections.Counter(n for _, n in claims)
    print(f"claims: {len(claims)}; slots asked for, how often: {dict(sorted(asked.items()))}; "
          f"jobs got, how often: {dict(sorted(got.items()))}\n")
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats(key).print_stats(args.top)
        text = out.getvalue()
        print(text[text.find("   ncalls"):])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
