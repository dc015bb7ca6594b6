"""Dashboard pages and /metrics against a large database: server time per page.

Builds a database of `--jobs` jobs (1,000,000 by default): 30 % waiting, 60 % succeeded (each
with a worker provenance and a `completed` event), 5 % dead, 3 % cancelled, 1 % unknown,
1 % running; kinds summarize, embed, ocr, transcribe; tenants default, alice; one
`enqueued` event per job. Then starts a real `jobcoord serve` on 127.0.0.1, logs in as an
operator and times, on loopback, each of: the overview, its live fragment, the jobs page
(first page, a filtered page, the next page by keyset), and a /metrics scrape (the first,
cold one reported apart), each against yardsticks timed in the same run: GET /healthz (an
HTTP round trip reading nothing), a `SELECT 1` and one plain `SELECT COUNT(*) FROM jobs`.
The ratio line divides each page's p50 by the COUNT(*)'s. Reports p50 and p90 over
`--repeat` requests each.

    python -m benchmarks.dashboard [--jobs 1000000] [--repeat 20] [--backends sqlite,postgresql]

PostgreSQL needs JOBCOORD_BENCH_PG_URL (or JOBCOORD_TEST_PG_URL).
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import time
from typing import Any

from ._common import (
    Scratch,
    command_line,
    conditions,
    libpq_url,
    pct,
    pg_drop_database,
    pg_fresh_database,
    pg_url,
)

KINDS = ("summarize", "embed", "ocr", "transcribe")
INSERT_JOB = (
    "INSERT INTO jobs (job_id, tenant, kind, required_role, priority, payload_json, status,"
    " created_at, updated_at, run_after, attempts, max_attempts, epoch, effect_started,"
    " cancel_requested, provenance_json, finished_at, last_error)"
    " VALUES ({p})")
INSERT_EVENT = ("INSERT INTO job_events (job_id, at, from_status, to_status, reason, worker_id,"
                " epoch) VALUES ({p})")


def _status(i: int) -> str:
    r = (i * 7919) % 100
    if r < 30:
        return "waiting"
    if r < 90:
        return "succeeded"
    if r < 95:
        return "dead"
    if r < 98:
        return "cancelled"
    if r < 99:
        return "unknown"
    return "running"


def _rows(n: int, t0: int) -> Any:
    """(job row, events) per job; times in microseconds, one job per 10 ms before t0."""
    for i in range(1, n + 1):
        status = _status(i)
        created = t0 - (n - i) * 10_000
        final = status in ("succeeded", "dead", "cancelled")
        finished = created + 2_000_000 if final else None
        prov = None
        if status == "succeeded":
            started = created + 500_000
            prov = json.dumps({"started_at": _iso(started), "duration_s": 1.0,
                               "worker": "w1"})
        attempts = 0 if status == "waiting" else 1 + i % 3
        job = (i, "alice" if i % 5 == 0 else "default", KINDS[i % 4], None, i % 4,
               f'{{"n":{i}}}', status, created, finished or created, created, attempts, 3,
               attempts, status == "unknown", False, prov, finished,
               "boom" if status == "dead" else None)
        events = [(i, created, None, "waiting", "enqueued", None, None)]
        if status == "succeeded":
            events.append((i, created + 1_600_000, "running", "succeeded", "completed", "w1",
                           attempts))
        yield job, events


def _iso(us: int) -> str:
    from jobcoord.clock import iso

    return str(iso(us))


#: The jobs are loaded into a database at this revision, then upgraded to the head the way
#: a deployment gets there (the upgrade fills the counts and folds the completed events).
LOAD_AT = "c0003"


def _at_revision(db_args: tuple[str, str], revision: str | None) -> float:
    """Migrate to `revision` (None: the head); returns the seconds it took."""
    from alembic import command
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import _config, migrate

    target = (resolve_target(db=db_args[1]) if db_args[0] == "--db"
              else resolve_target(url=db_args[1]))
    db = Database.open(target, create=True, synchronous="normal")
    started = time.perf_counter()
    try:
        if revision is None:
            migrate(db)
        else:
            with db.write_engine.connect() as conn, conn.begin():
                command.upgrade(_config(db, conn, set()), revision)
    finally:
        db.close()
    return time.perf_counter() - started


def build_sqlite(path: str, n: int) -> float:
    started = time.perf_counter()
    _at_revision(("--db", path), LOAD_AT)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")
    con.execute("BEGIN IMMEDIATE")
    t0 = time.time_ns() // 1000
    jobs_sql = INSERT_JOB.format(p=", ".join("?" * 18))
    events_sql = INSERT_EVENT.format(p=", ".join("?" * 7))
    batch_j: list[Any] = []
    batch_e: list[Any] = []
    for job, events in _rows(n, t0):
        batch_j.append(job)
        batch_e.extend(events)
        if len(batch_j) >= 20_000:
            con.executemany(jobs_sql, batch_j)
            con.executemany(events_sql, batch_e)
            batch_j, batch_e = [], []
    con.executemany(jobs_sql, batch_j)
    con.executemany(events_sql, batch_e)
    con.execute("COMMIT")
    con.close()
    UPGRADE["SQLite"] = _at_revision(("--db", path), None)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("ANALYZE")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return time.perf_counter() - started


#: Seconds the upgrade from LOAD_AT to the head took, by backend.
UPGRADE: dict[str, float] = {}


def build_pg(admin: str, name: str, n: int) -> tuple[str, float]:
    import psycopg


    started = time.perf_counter()
    url = pg_fresh_database(admin, name)
    _at_revision(("--url", url), LOAD_AT)
    t0 = time.time_ns() // 1000
    with psycopg.connect(libpq_url(url)) as con, con.cursor() as cur:
        with cur.copy("COPY jobs (job_id, tenant, kind, required_role, priority, payload_json,"
                      " status, created_at, updated_at, run_after, attempts, max_attempts,"
                      " epoch, effect_started, cancel_requested, provenance_json, finished_at,"
                      " last_error) FROM STDIN") as copy:
            for job, _events in _rows(n, t0):
                copy.write_row(job)
        with cur.copy("COPY job_events (job_id, at, from_status, to_status, reason,"
                      " worker_id, epoch) FROM STDIN") as copy:
            for _job, events in _rows(n, t0):
                for e in events:
                    copy.write_row(e)
        cur.execute("SELECT setval(pg_get_serial_sequence('jobs', 'job_id'), %s)", (n,))
        con.commit()
    UPGRADE["PostgreSQL"] = _at_revision(("--url", url), None)
    with psycopg.connect(libpq_url(url), autocommit=True) as con:
        con.execute("VACUUM ANALYZE")
    return url, time.perf_counter() - started


def measure(db_args: list[str], repeat: int) -> dict[str, Any]:
    import httpx

    from jobcoord import tokens
    from jobcoord.db import Database, resolve_target
    from jobcoord.service import Coordinator

    target = (resolve_target(db=db_args[1]) if db_args[0] == "--db"
              else resolve_target(url=db_args[1]))
    with Coordinator.open(target) as c:
        secret = tokens.create(c.db, f"bench{time.time_ns()}", "operator")["token"]
    argv = [sys.executable, "-m", "jobcoord.http", *db_args, "serve", "--port", "0",
            "--json", "--reap-every", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    yard = Database.open(target)
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["url"]
        out: dict[str, Any] = {}
        with httpx.Client(base_url=url, timeout=600) as http:
            r = http.post("/ui/login", data={"token": secret})
            http.cookies.update(r.cookies)
            first = http.get("/ui/jobs?status=waiting").text
            before = re.search(r"before=(\d+)", first)
            # Yardsticks measured in the same run: an HTTP round trip that reads nothing,
            # a database round trip, and one plain count of the jobs table.
            out["yardstick: GET /healthz"] = _times(repeat, lambda: http.get("/healthz"))
            out["yardstick: SELECT 1"] = _times(repeat, lambda: yard.read(
                lambda conn: conn.exec_driver_sql("SELECT 1").scalar()))
            out["yardstick: SELECT COUNT(*) FROM jobs"] = _times(
                max(3, repeat // 3), lambda: yard.read(lambda conn: conn.exec_driver_sql(
                    "SELECT COUNT(*) FROM jobs").scalar()))
            pages = {
                "overview": "/ui/", "overview live fragment": "/ui/overview/live",
                "jobs, first page": "/ui/jobs",
                "jobs, status=waiting&kind=embed": "/ui/jobs?status=waiting&kind=embed",
                "jobs, next page (keyset)": "/ui/jobs?status=waiting"
                + (f"&before={before.group(1)}" if before else ""),
                "job page": "/ui/jobs/1",
            }
            t = time.perf_counter()
            got = http.get("/metrics", headers={"Authorization": f"Bearer {secret}"})
            assert got.status_code == 200, got.text[:200]
            out["/metrics (first, cold)"] = [time.perf_counter() - t]
            pages_and_metrics = [*pages.items(), ("/metrics (warm)", "/metrics")]
            for label, path in pages_and_metrics:
                times = []
                for _ in range(repeat):
                    t = time.perf_counter()
                    resp = http.get(path, headers={"Authorization": f"Bearer {secret}"})
                    times.append(time.perf_counter() - t)
                    assert resp.status_code == 200, (label, resp.status_code, resp.text[:300])
                out[label] = times
        return out
    finally:
        yard.close()
        proc.terminate()
        proc.wait(30)


def _times(repeat: int, fn: Any) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def report(backend: str, n: int, build_s: float, results: dict[str, Any]) -> None:
    print(f"\n{backend}, {n:,} jobs (built in {build_s:.1f} s, of which the upgrade from "
          f"{LOAD_AT} to the head {UPGRADE.get(backend, 0):.1f} s)")
    print(f"  {'page':38} {'p50 ms':>9} {'p90 ms':>9} {'n':>4}")
    for label, times in results.items():
        print(f"  {label:38} {pct(times, 50) * 1000:9.1f} {pct(times, 90) * 1000:9.1f}"
              f" {len(times):4}")
    count = pct(results["yardstick: SELECT COUNT(*) FROM jobs"], 50)
    print("  p50 / p50 of one COUNT(*) of jobs: " + ", ".join(
        f"{label} {pct(times, 50) / count:.3f}" for label, times in results.items()
        if not label.startswith("yardstick")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    print(command_line())
    print(conditions())
    backends = args.backends.split(",")
    with Scratch() as scratch:
        if "sqlite" in backends:
            path = scratch.file("dash.db")
            took = build_sqlite(path, args.jobs)
            report("SQLite", args.jobs, took, measure(["--db", path], args.repeat))
        if "postgresql" in backends:
            admin = pg_url()
            if admin is None:
                print("PostgreSQL skipped: set JOBCOORD_BENCH_PG_URL")
                return
            name = f"jobcoord_bench_dash_{int(time.time())}"
            url, took = build_pg(admin, name, args.jobs)
            try:
                report("PostgreSQL", args.jobs, took, measure(["--url", url], args.repeat))
            finally:
                pg_drop_database(admin, name)


if __name__ == "__main__":
    main()
