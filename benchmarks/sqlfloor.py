"""The floor under jobcoord's own SQL: the exact statements one claim and one completion
issue (worker row, candidate probe, take, lease, event; fence read, finish, drop lease,
event), replayed on plain `sqlite3` with no Python layer around them, next to the ceiling's
two-statement cycle, in the same run and process count: `two` commits the claim and the
completion separately, `cac` commits a completion with the next claim (complete_and_claim).

It answers "how fast could jobcoord be if its Python cost nothing": the difference between
this line and the ceiling is the price of the schema (a lease row, an event row per
transition and the claim, status and tenant indexes); the difference between this line and
`throughput` is the price of the Python around the statements.

It also counts the WAL frames (4 KiB pages) each cycle writes, one process, automatic
checkpoints off: every frame is written at commit and copied back at the next checkpoint.

    python -m benchmarks.sqlfloor [--procs 1,4] [--sync full,normal] [--jobs N]
                                  [--without-index NAME ...]
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import ceiling
from benchmarks._common import Scratch, conditions, migrated_sqlite, ms, run_processes
from benchmarks.throughput import _fill


def _worker(index: int, barrier: Any, queue: Any, path: str, sync: str,
            autocheckpoint: bool = True, mode: str = "two") -> None:
    from jobcoord.store import statements as s

    con = sqlite3.connect(path, isolation_level=None, timeout=30)
    if not autocheckpoint:
        con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("PRAGMA foreign_keys=ON")
    con.execute(f"PRAGMA synchronous={sync.upper()}")
    worker = f"bench-{index}"
    now = time.time_ns() // 1000
    con.execute("INSERT INTO workers (worker_id, roles_json, heartbeat_at, created_at)"
                " VALUES (?, '[\"gpu\"]', ?, ?)", (worker, now, now))
    probe = s.candidate_text(["gpu"], None, True, "")  # SQLite: no lock clause

    def claim(now: int) -> tuple[int, int] | None:
        """The claim's statements (worker row, probe, take, lease, event), in the open
        transaction."""
        con.execute(s.WORKER.sqlite, {"worker": worker}).fetchone()
        found = con.execute(probe, {"r1": "gpu", "now": now, "maxp": 3}).fetchone()
        if found is None:
            return None
        job = con.execute(s.TAKE_JOB.sqlite, {"job_id": found[0], "now": now, "f": False}
                          ).fetchone()
        epoch = job[6]
        con.execute(s.INSERT_LEASE.sqlite, {"job_id": job[0], "worker": worker,
                                             "epoch": epoch, "now": now,
                                             "expires": now + 45_000_000})
        con.execute(s.INSERT_EVENT.sqlite, {
            "job_id": job[0], "now": now, "from_status": "waiting", "to_status": "running",
            "reason": "claimed", "worker": worker, "epoch": epoch,
            "detail": '{"attempt":1,"expires_at":"2026-11-29T00:00:45Z"}'})
        return job[0], epoch

    def complete(job_id: int, epoch: int, now: int) -> None:
        """The completion's statements (fence read, finish, drop lease, event)."""
        con.execute(s.OWNED.sqlite, {"job_id": job_id}).fetchone()
        con.execute(s.FINISH.sqlite, {
            "job_id": job_id, "epoch": epoch, "to_status": "succeeded",
            "result": '{"ok":true}', "provenance": None, "error": None, "finished": now,
            "run_after": now, "now": now})
        con.execute(s.DROP_LEASE.sqlite, {"job_id": job_id, "epoch": epoch})
        con.execute(s.INSERT_EVENT.sqlite, {
            "job_id": job_id, "now": now, "from_status": "running", "to_status": "succeeded",
            "reason": "completed", "worker": worker, "epoch": epoch, "detail": None})

    lat: list[float] = []
    done = 0
    barrier.wait()
    cpu0 = time.process_time()
    if mode == "two":
        while True:
            now = time.time_ns() // 1000
            t0 = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            got = claim(now)
            con.execute("COMMIT")
            if got is None:
                break
            lat.append(time.perf_counter() - t0)
            con.execute("BEGIN IMMEDIATE")
            complete(*got, now)
            con.execute("COMMIT")
            done += 1
    else:  # cac: the completion and the next claim in one transaction
        now = time.time_ns() // 1000
        con.execute("BEGIN IMMEDIATE")
        got = claim(now)
        con.execute("COMMIT")
        while got is not None:
            now = time.time_ns() // 1000
            t0 = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            complete(*got, now)
            got = claim(now)
            con.execute("COMMIT")
            lat.append(time.perf_counter() - t0)
            done += 1
    con.close()
    queue.put({"index": index, "done": done, "claim_s": lat,
               "cpu_s": time.process_time() - cpu0})


def _prepare(path: str, jobs: int, without: Sequence[str]) -> None:
    """A migrated, filled database, minus the indexes named in `without` (to measure what each
    index costs the hot path; jobcoord itself always has them all)."""
    migrated_sqlite(path)
    _fill(path, jobs)
    if without:
        con = sqlite3.connect(path, isolation_level=None)
        for name in without:
            con.execute(f'DROP INDEX "{name}"')
        con.close()


class _Inline:
    """The worker's barrier and queue, for running it in this process."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def wait(self) -> None:
        pass

    def put(self, item: Any) -> None:
        self.got.append(item)


def _frames(con: sqlite3.Connection) -> int:
    return int(con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])


def wal_frames_per_job(scratch: Scratch, jobs: int = 1000, without: Sequence[str] = ()
                       ) -> tuple[float, float, float]:
    """WAL frames per job: the ceiling, jobcoord's SQL as two commits, and as cac."""
    path = scratch.file("frames-ceiling.db")
    ceiling.prepare_sqlite(path, jobs)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA wal_autocheckpoint=0")
    for _ in range(jobs):
        con.execute("BEGIN IMMEDIATE")
        row = con.execute(ceiling._SQLITE_CLAIM, ("w",)).fetchone()
        con.execute("COMMIT")
        con.execute("BEGIN IMMEDIATE")
        con.execute(ceiling._SQLITE_COMPLETE, ('{"ok": true}', row[0], "w"))
        con.execute("COMMIT")
    raw = _frames(con) / jobs
    con.close()
    ours = []
    for mode in ("two", "cac"):
        path = scratch.file(f"frames-jobcoord-{mode}.db")
        _prepare(path, jobs, without)
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # also keeps the WAL open
        inline = _Inline()
        _worker(0, inline, inline, path, "normal", autocheckpoint=False, mode=mode)
        ours.append(_frames(con) / jobs)
        con.close()
    return raw, ours[0], ours[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=ceiling._ints, default=[1, 4])
    ap.add_argument("--sync", default="full,normal")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--without-index", action="append", default=[], metavar="NAME",
                    help="drop this index before replaying (repeatable): what it costs")
    args = ap.parse_args()
    syncs = [x for x in args.sync.split(",") if x]
    print(conditions(syncs, **({"dropped": ", ".join(args.without_index)}
                               if args.without_index else {})))
    print()
    print(f"{'cycle':<22} {'sync':<7} {'procs':>5} {'jobs':>7} {'jobs/s':>9} "
          f"{'claim p50 ms':>13} {'ratio':>7} {'cpu us/job':>11}")
    with Scratch() as scratch:
        for sync in syncs:
            jobs = args.jobs or ceiling.DEFAULT_JOBS[sync]
            for n in args.procs:
                base = ceiling.sqlite_ceiling(scratch, n, sync, jobs)
                path = scratch.file(f"floor-{sync}-{n}.db")
                _prepare(path, jobs, args.without_index)
                elapsed, results = run_processes(_worker, n, (path, sync))
                two = ceiling._summary(elapsed, results, jobs)
                path = scratch.file(f"floor-cac-{sync}-{n}.db")
                _prepare(path, jobs, args.without_index)
                elapsed, results = run_processes(_worker, n, (path, sync, True, "cac"))
                cac = ceiling._summary(elapsed, results, jobs)
                for name, x, ratio in (("ceiling sqlite3", base, ""),
                                       ("jobcoord SQL two", two,
                                        f"{two['jobs_s'] / base['jobs_s']:.2f}x"),
                                       ("jobcoord SQL cac", cac,
                                        f"{cac['jobs_s'] / base['jobs_s']:.2f}x")):
                    print(f"{name:<22} {sync:<7} {n:>5} {x['jobs']:>7} {x['jobs_s']:>9.0f} "
                          f"{ms(x['claim_p50']):>13} {ratio:>7} {x['cpu_us']:>11.0f}",
                          flush=True)
        raw, two, cac = wal_frames_per_job(scratch, without=args.without_index)
        print(f"\nWAL frames written per job: ceiling {raw:.1f}, jobcoord SQL two {two:.1f},"
              f" cac {cac:.1f}")


if __name__ == "__main__":
    main()
