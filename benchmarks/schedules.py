"""What a schedule tick costs, beside the reaper pass it runs next to on every timer.

Workers, `reap --every` and `serve` tick the schedules each time they reap, so an idle tick
must cost no more than an idle reap. Measured in one run, on a fresh database each:

- `reap()` with nothing to reap: the yardstick (a write transaction with two reads);
- `tick_schedules()` with no schedules, and with `--schedules` schedules none of which is
  due (one read of the due index, no write lock);
- a tick that fires one slot (one schedule due among them), beside `enqueue()` of one job:
  firing is an enqueue plus the slot's row and the schedule's update.

Medians of `--repeat` calls each, and the ratio to the yardstick.

    python -m benchmarks.schedules [--schedules 1000] [--repeat 300] [--pg]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import (
    Scratch,
    conditions,
    median,
    migrated_sqlite,
    ms,
    pg_drop_database,
    pg_fresh_database,
    require_pg_url,
)
from jobcoord.service import Coordinator

HOUR_US = 3_600_000_000


def timed(fn: Callable[[], Any], repeat: int, before: Callable[[], Any] | None = None
          ) -> float:
    """Median seconds of `repeat` calls of fn (after 10 untimed ones); `before` runs untimed
    ahead of each call."""
    times = []
    for i in range(repeat + 10):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if i >= 10:
            times.append(time.perf_counter() - t0)
    return median(times)


def measure(c: Coordinator, n: int, repeat: int) -> list[tuple[str, float, str]]:
    from sqlalchemy import update

    from jobcoord.schema import schedules

    rows: list[tuple[str, float, str]] = []
    reap = timed(lambda: c.reap(), repeat)
    rows.append(("reap(), nothing to reap [yardstick]", reap, "reap"))
    rows.append(("tick, no schedules", timed(c.tick_schedules, repeat), "reap"))
    for i in range(n):
        c.add_schedule(f"s{i}", "k", every="1h", role="nobody", catchup="all:1")
    rows.append((f"tick, {n} schedules, none due", timed(c.tick_schedules, repeat), "reap"))

    enqueue = timed(lambda: c.enqueue("k", {}, role="nobody"), repeat)
    rows.append(("enqueue() of one job [yardstick]", enqueue, "enqueue"))
    now = time.time_ns() // 1000
    slot = now - now % HOUR_US  # this hour's slot, already past
    k = iter(range(n))

    def one_due() -> None:
        # The next schedule's slot of this hour, made due: the timed tick fires just that.
        name = f"s{next(k)}"
        c.db.write(lambda conn: conn.execute(
            update(schedules).where(schedules.c.name == name)
            .values(next_slot_at=slot, due_at=slot)))

    rows.append((f"tick firing one slot ({n} schedules)",
                 timed(c.tick_schedules, repeat, before=one_due), "enqueue"))
    return rows


def report(label: str, rows: list[tuple[str, float, str]]) -> None:
    base = {kind: t for name, t, kind in rows if "[yardstick]" in name}
    print(f"\n{label}")
    print(f"{'what':<44} {'median':>10} {'ratio':>7}")
    for name, t, kind in rows:
        print(f"{name:<44} {ms(t):>10} {t / base[kind]:>6.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--schedules", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=300, help="at most --schedules - 10")
    ap.add_argument("--pg", action="store_true", help="PostgreSQL too")
    args = ap.parse_args()
    print(conditions(schedules=args.schedules, repeat=args.repeat))
    with Scratch() as scratch:
        path = os.path.join(scratch.path, "bench.db")
        migrated_sqlite(path, synchronous="full")
        with Coordinator.open(path) as c:
            report("SQLite (synchronous=full)", measure(c, args.schedules, args.repeat))
    if args.pg:
        url = require_pg_url()
        target = pg_fresh_database(url, "jobcoord_bench_schedules")
        try:
            with Coordinator.open(target, migrate=True) as c:
                report("PostgreSQL", measure(c, args.schedules, args.repeat))
        finally:
            pg_drop_database(url, "jobcoord_bench_schedules")


if __name__ == "__main__":
    main()
