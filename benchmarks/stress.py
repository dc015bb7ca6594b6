"""Long stress run, by hand: many worker processes drain one SQLite file while some of them
are SIGKILLed and replaced over and over, and a reaper recovers their jobs.

    python benchmarks/stress.py                      # 50,000 jobs, 16 workers, kills
    python benchmarks/stress.py --jobs 5000 --workers 8 --kill-every 0.5

At the end it checks what the test suite checks (every job succeeded, exactly one accepted
completion per job, no (job, epoch) handed out twice, every event sequence legal, integrity
and foreign keys) and prints its numbers and the conditions they were measured under.
Exit status 0 means every check passed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def worker(db: str, worker_id: str, ledger: str, stop_file: str, lease_s: float) -> None:
    """Claim and complete until the stop file appears. Each claim and each accepted
    completion is appended to the ledger as it happens (a SIGKILL loses nothing already
    written: the lines are in the kernel's page cache)."""
    from jobcoord.errors import JobcoordError
    from jobcoord.service import Coordinator

    coord = Coordinator.open(db)
    errors: Counter[str] = Counter()
    while True:  # a new process may wait a long time for its first write under contention
        try:
            coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
            break
        except JobcoordError as e:
            errors[e.code] += 1
    beat = time.monotonic()
    with open(ledger, "a", buffering=1) as out:
        while not os.path.exists(stop_file):
            try:
                if time.monotonic() - beat > 10:
                    coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
                    beat = time.monotonic()
                got = coord.claim(worker_id, lease_s=lease_s)
                if got["job"] is None:
                    time.sleep(0.05)
                    continue
                job_id, epoch = got["job"]["job_id"], got["lease"]["epoch"]
                out.write(f"C {job_id} {epoch}\n")
                coord.complete(job_id, worker_id, epoch, {"by": worker_id})
                out.write(f"A {job_id} {epoch}\n")
            except JobcoordError as e:
                errors[e.code] += 1
                if "database is locked" in e.message:
                    errors["LOCKED_SURFACED"] += 1
        stats = coord.db.stats
        out.write("S " + json.dumps({"busy_retries": stats.busy_retries,
                                     "busy_failures": stats.busy_failures,
                                     "busy_errors": stats.busy_errors,
                                     "errors": dict(errors)}) + "\n")
    coord.close()


def reaper(db: str, stop_file: str, ledger: str) -> None:
    """Reap until the stop file appears. A pass refused as busy is counted and the next pass
    tries again: a background sweep loses nothing by waiting."""
    from jobcoord.errors import DatabaseBusy
    from jobcoord.service import Coordinator

    busy = 0
    with Coordinator.open(db) as coord:
        while not os.path.exists(stop_file):
            try:
                coord.reap()
            except DatabaseBusy:
                busy += 1
            time.sleep(0.2)
        stats = coord.db.stats
    Path(ledger).write_text(json.dumps({"reap_passes_refused_busy": busy,
                                        "busy_retries": stats.busy_retries}))


def sync_cost(work: Path, n: int) -> dict[str, Any]:
    """What synchronous=FULL costs: one process enqueues n jobs, each its own transaction,
    into a fresh file under each setting."""
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate
    from jobcoord.service import Coordinator

    out: dict[str, Any] = {"jobs": n, "python": platform.python_version(),
                           "sqlite": sqlite3.sqlite_version, "cpus": os.cpu_count(),
                           "directory": str(work)}
    for sync in ("full", "normal"):
        db = str(work / f"sync-{sync}.db")
        database = Database.open(resolve_target(db=db), create=True)
        migrate(database)
        database.close()
        with Coordinator.open(db, synchronous=sync) as c:
            t0 = time.perf_counter()
            for i in range(n):
                c.enqueue("work", {"i": i})
            out[f"{sync}_jobs_per_s"] = round(n / (time.perf_counter() - t0), 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--lease", type=float, default=3.0, help="lease seconds (short, so "
                    "killed workers' jobs come back quickly)")
    ap.add_argument("--kill-every", type=float, default=1.0,
                    help="seconds between SIGKILLs of a random worker (0: no kills)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", help="where to put the database (default: a new temp dir)")
    ap.add_argument("--sync-cost", type=int, metavar="N", default=0,
                    help="instead: time N single-job enqueues under synchronous=full and "
                    "normal, and print both rates")
    args = ap.parse_args()
    if args.sync_cost:
        work = Path(args.dir or tempfile.mkdtemp(prefix="jobcoord-sync-"))
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(sync_cost(work, args.sync_cost), indent=2))
        return 0

    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate
    from jobcoord.service import Coordinator, JobSpec
    from tests.invariants import violations

    rng = random.Random(args.seed)
    work = Path(args.dir or tempfile.mkdtemp(prefix="jobcoord-stress-"))
    work.mkdir(parents=True, exist_ok=True)
    db = str(work / "stress.db")
    stop = str(work / "STOP")
    database = Database.open(resolve_target(db=db), create=True)
    migrate(database)
    database.close()
    with Coordinator.open(db) as c:
        for start in range(0, args.jobs, 1000):
            c.enqueue_many([JobSpec("work", {"i": i}, priority=i % 4, max_attempts=20)
                            for i in range(start, min(args.jobs, start + 1000))])

    spawn = multiprocessing.get_context("spawn")
    procs: dict[str, Any] = {}
    serial = 0

    def start_worker() -> None:
        nonlocal serial
        serial += 1
        wid = f"s{serial}"
        p = spawn.Process(target=worker, args=(db, wid, str(work / f"{wid}.ledger"), stop,
                                               args.lease))
        p.start()
        procs[wid] = p

    for _ in range(args.workers):
        start_worker()
    reap_proc = spawn.Process(target=reaper, args=(db, stop, str(work / "reaper.json")))
    reap_proc.start()

    t0 = time.monotonic()
    kills = 0
    next_kill = t0 + args.kill_every if args.kill_every else float("inf")
    check_conn = sqlite3.connect(db, timeout=60)
    while True:
        time.sleep(0.1)
        now = time.monotonic()
        if now >= next_kill:
            victim = rng.choice(sorted(w for w, p in procs.items() if p.is_alive()))
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].join()
            kills += 1
            start_worker()
            next_kill = now + args.kill_every
        done = check_conn.execute("SELECT COUNT(*) FROM jobs WHERE status IN"
                                  " ('succeeded', 'dead')").fetchone()[0]
        if done == args.jobs:
            break
    elapsed = time.monotonic() - t0
    check_conn.close()
    Path(stop).touch()
    for p in [*procs.values(), reap_proc]:
        p.join(timeout=120)

    claims: Counter[tuple[int, int]] = Counter()
    accepted: Counter[int] = Counter()
    stats: Counter[str] = Counter()
    busy_names: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for ledger in work.glob("*.ledger"):
        for line in ledger.read_text().splitlines():
            tag, _, rest = line.partition(" ")
            if tag == "C":
                j, e = map(int, rest.split())
                claims[(j, e)] += 1
            elif tag == "A":
                accepted[int(rest.split()[0])] += 1
            elif tag == "S":
                s = json.loads(rest)
                stats["busy_retries"] += s["busy_retries"]
                stats["busy_failures"] += s["busy_failures"]
                stats["surviving_workers"] += 1
                busy_names.update(s["busy_errors"])
                errors.update(s["errors"])
    conn = sqlite3.connect(db)
    statuses = dict(conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status"))
    completed_events = Counter(r[0] for r in conn.execute(
        "SELECT job_id FROM job_events WHERE reason = 'completed'"))
    reaped = conn.execute("SELECT COUNT(*) FROM job_events WHERE reason = 'lease_expired'"
                          ).fetchone()[0]
    rerun = conn.execute("SELECT COUNT(*) FROM jobs WHERE epoch > 1").fetchone()[0]
    conn.close()
    reaper_stats = json.loads((work / "reaper.json").read_text())
    found = violations(db)
    problems = list(found[:20])
    if statuses != {"succeeded": args.jobs}:
        problems.append(f"statuses {statuses}")
    if any(n > 1 for n in claims.values()):
        problems.append("a (job, epoch) was handed out twice")
    if set(completed_events.values()) != {1} or len(completed_events) != args.jobs:
        problems.append("not exactly one completed event per job")
    if any(n > 1 for n in accepted.values()):
        problems.append("a completion was accepted twice")
    if errors.get("LOCKED_SURFACED"):
        problems.append("'database is locked' reached a caller")
    if stats["surviving_workers"] != args.workers:
        problems.append("a surviving worker did not report")

    print(json.dumps({
        "conditions": {
            "jobs": args.jobs, "workers": args.workers, "lease_s": args.lease,
            "kill_every_s": args.kill_every, "seed": args.seed, "synchronous": "full",
            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(), "database": db,
        },
        "elapsed_s": round(elapsed, 1),
        "jobs_per_s": round(args.jobs / elapsed, 1),
        "workers_killed": kills,
        "leases_reaped": reaped,
        "jobs_run_more_than_once": rerun,
        "accepted_completions": sum(accepted.values()),
        "busy_retries_surviving_workers": stats["busy_retries"],
        "busy_failures_surviving_workers": stats["busy_failures"],
        "busy_errors_by_name": dict(busy_names),
        "worker_errors": dict(errors),
        "reaper": reaper_stats,
        "surviving_workers_reporting": stats["surviving_workers"],
        "problems": problems,
    }, indent=2))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
