"""Shared pieces of the benchmark scripts: the conditions block every script prints, a
process pool that starts its workers on one barrier, percentiles, and fresh databases.

The benchmarks are run by hand (`python -m benchmarks.<name>` from the checkout); none of
them is part of the test suite, and none asserts anything about time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

PG_URL_ENV = "JOBCOORD_BENCH_PG_URL"


def conditions(durability: str | Sequence[str] | None = None, **extra: Any) -> str:
    """One block naming everything a number depends on, printed before the numbers."""
    import sqlalchemy

    try:
        import psycopg

        pg = psycopg.__version__
    except ImportError:
        pg = "not installed"
    lines = [
        f"date        {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"machine     {platform.machine()} {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"python      {platform.python_version()} ({platform.python_implementation()})",
        f"sqlite      {sqlite3.sqlite_version}",
        f"sqlalchemy  {sqlalchemy.__version__}",
        f"psycopg     {pg}",
    ]
    if durability is not None:
        value = durability if isinstance(durability, str) else ", ".join(durability)
        lines.append(f"synchronous {value}")
    for key, value in extra.items():
        lines.append(f"{key:<11} {value}")
    lines.append(f"command     {command_line()}")
    return "\n".join(lines)


def command_line() -> str:
    """How this script was started, as `python -m benchmarks.NAME ARGS` (no local paths)."""
    script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    return " ".join(["python", "-m", f"benchmarks.{script}", *sys.argv[1:]])


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def run_processes(target: Callable[..., Any], n: int, args: tuple[Any, ...]
                  ) -> tuple[float, list[Any]]:
    """Run `target(index, barrier, queue, *args)` in n fresh processes (spawn: no inherited
    connections). Each must wait on the barrier before its timed work and put one result on
    the queue. Returns the wall time from the barrier's release to the last process's end,
    and the results in process order."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(i, barrier, queue, *args)) for i in range(n)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    results = [queue.get() for _ in procs]
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a benchmark process exited with {p.exitcode}")
    results.sort(key=lambda r: r["index"])
    return elapsed, results


class Scratch:
    """A private temporary directory for the run's database files, removed at exit."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="jobcoord-bench-")

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def migrated_sqlite(path: str, synchronous: str = "normal") -> None:
    """Create a jobcoord database at `path` through the real migration history."""
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    db = Database.open(resolve_target(db=path), create=True, synchronous=synchronous)
    try:
        migrate(db)
    finally:
        db.close()


def pg_url() -> str | None:
    return os.environ.get(PG_URL_ENV) or os.environ.get("JOBCOORD_TEST_PG_URL")


def require_pg_url() -> str:
    """The PostgreSQL URL for a run that asked for PostgreSQL, checked before any work: a run
    that silently left PostgreSQL out would be misread."""
    url = pg_url()
    if not url:
        raise SystemExit(f"PostgreSQL was asked for: set {PG_URL_ENV} (or JOBCOORD_TEST_PG_URL)"
                         " to the URL of an existing database on the server")
    return url


def pg_admin(url: str) -> Any:
    import psycopg

    from jobcoord.db import resolve_target

    return psycopg.connect(resolve_target(url=url).url.replace("postgresql+psycopg://",
                                                               "postgresql://"),
                           autocommit=True)


def pg_fresh_database(url: str, name: str) -> str:
    """Drop and create database `name` on the server of `url`; return its SQLAlchemy URL."""
    from sqlalchemy.engine import make_url

    with pg_admin(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return make_url(url).set(drivername="postgresql+psycopg", database=name
                             ).render_as_string(hide_password=False)


def pg_drop_database(url: str, name: str) -> None:
    with pg_admin(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def libpq_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://")
