"""Bodies of the real OS processes the contention, crash and power-cut tests start (with the
multiprocessing "spawn" context: a fresh interpreter, no inherited connections).

Each body writes what it saw to a JSON ledger file when it ends, so the parent can compare the
processes' own view (what they were told) with what the database holds.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def one_job(path: str, *, lease_s: float | None = None) -> int:
    """A fresh job for worker w1 (heartbeat sent), claimed under `lease_s` when given."""
    from jobcoord.service import Coordinator

    with Coordinator.open(path) as c:
        c.heartbeat("w1")
        job_id = c.enqueue("work", {})["job_id"]
        if lease_s is not None:
            c.claim("w1", lease_s=lease_s)
    return int(job_id)


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def claim_complete_worker(db_path: str, worker_id: str, ledger: str, start: Any,
                          lease_s: float = 60.0, batch: int = 0) -> None:
    """Claim and complete as fast as possible until nothing is waiting (with `batch`:
    claim_many of that many and complete_many of what it gave)."""
    from jobcoord.errors import JobcoordError
    from jobcoord.service import Coordinator

    claims: list[list[int]] = []
    completed: list[list[int]] = []
    errors: dict[str, int] = {}
    locked_seen = 0
    coord = Coordinator.open(db_path)
    coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
    start.wait()
    last_beat = time.monotonic()
    while True:
        try:
            if time.monotonic() - last_beat > 10:
                coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
                last_beat = time.monotonic()
            if batch:
                _batch_step(coord, worker_id, lease_s, batch, claims, completed, errors)
                if claims and claims[-1] == [0, 0]:
                    claims.pop()
                    break
                continue
            got = coord.claim(worker_id, lease_s=lease_s)
            if got["job"] is None:
                if got["reason"] == "no_waiting_jobs":
                    break
                errors[got["reason"]] = errors.get(got["reason"], 0) + 1
                continue
            job_id, epoch = got["job"]["job_id"], got["lease"]["epoch"]
            claims.append([job_id, epoch])
            coord.complete(job_id, worker_id, epoch, {"by": worker_id, "epoch": epoch})
            completed.append([job_id, epoch])
        except JobcoordError as e:
            errors[e.code] = errors.get(e.code, 0) + 1
            if "database is locked" in e.message:
                locked_seen += 1
        except Exception as e:  # anything else is a finding, never a reason to stop early
            key = f"{type(e).__name__}: {e}"[:200]
            errors[key] = errors.get(key, 0) + 1
            if "database is locked" in str(e):
                locked_seen += 1
    stats = coord.db.stats
    _write(ledger, {"worker": worker_id, "claims": claims, "completed": completed,
                    "errors": errors, "locked_seen": locked_seen,
                    "busy_retries": stats.busy_retries, "busy_failures": stats.busy_failures,
                    "busy_errors": stats.busy_errors, "busy_unwaited": stats.busy_unwaited})
    coord.close()


def _batch_step(coord: Any, worker_id: str, lease_s: float, batch: int,
                claims: list[list[int]], completed: list[list[int]],
                errors: dict[str, int]) -> None:
    """One claim_many and the complete_many of what it gave; [0, 0] appended to `claims`
    when nothing is waiting."""
    got = coord.claim_many(worker_id, batch, lease_s=lease_s)
    if not got["claimed"]:
        if got["reason"] == "no_waiting_jobs":
            claims.append([0, 0])
        else:
            errors[got["reason"]] = errors.get(got["reason"], 0) + 1
        return
    items = []
    for one in got["claimed"]:
        job_id, epoch = one["job"]["job_id"], one["lease"]["epoch"]
        claims.append([job_id, epoch])
        items.append({"job_id": job_id, "worker_id": worker_id, "epoch": epoch,
                      "result": {"by": worker_id, "epoch": epoch}})
    done = coord.complete_many(items)
    for item, answer in zip(items, done["results"], strict=True):
        if "error" in answer:
            code = answer["error"]["code"]
            errors[code] = errors.get(code, 0) + 1
        else:
            completed.append([item["job_id"], item["epoch"]])


def enqueue_with_key(db_path: str, key: str, payload: dict[str, Any], ledger: str,
                     start: Any) -> None:
    """Submit one job with an idempotency key, all processes released at once."""
    from jobcoord.errors import JobcoordError
    from jobcoord.service import Coordinator

    coord = Coordinator.open(db_path)
    start.wait()
    try:
        out: dict[str, Any] = {"ok": coord.enqueue("report", payload, key=key)}
    except JobcoordError as e:
        out = {"error": e.code, "exit": e.exit_code, "job_id": e.details.get("job_id")}
    out["payload"] = payload
    _write(ledger, out)
    coord.close()


def enqueue_writer(db_path: str, ledger: str, synchronous: str = "full") -> None:
    """Enqueue jobs forever (until killed), and claim/complete some of them, appending each
    acknowledged job id to the ledger only after enqueue returned. The ledger is flushed and
    fsynced per line, so a frozen process's ledger is exact."""
    from jobcoord.service import Coordinator

    worker = f"w{os.getpid()}"
    coord = Coordinator.open(db_path, synchronous=synchronous)
    coord.heartbeat(worker, readings={"memory_used_pct": 10.0})
    n = 0
    with open(ledger, "a") as f:
        while True:
            n += 1
            job = coord.enqueue("write", {"n": n, "pad": "x" * (n % 200)})
            f.write(f"{job['job_id']}\n")
            f.flush()
            os.fsync(f.fileno())
            if n % 3 == 0:
                got = coord.claim(worker, lease_s=60)
                if got["job"] is not None and n % 2 == 0:
                    coord.complete(got["job"]["job_id"], worker, got["lease"]["epoch"],
                                   {"n": n})
            if n % 50 == 0:
                coord.heartbeat(worker, readings={"memory_used_pct": 10.0})


def fill(db: Any, n: int) -> None:
    """Enqueue n jobs over four priorities and three tenants, in batches of 1,000."""
    from jobcoord.service import Coordinator, JobSpec

    with Coordinator.open(db) as c:
        specs = [JobSpec("work", {"i": i}, priority=i % 4, tenant=f"t{i % 3}")
                 for i in range(n)]
        for start in range(0, n, 1000):
            c.enqueue_many(specs[start:start + 1000])


def run_contention(db: Any, tmp: Any, n_jobs: int, n_workers: int, timeout: float = 600,
                   batch: int = 0) -> list[dict[str, Any]]:
    """Fill `db` (a SQLite path or a Target) with n_jobs and let n_workers real processes
    drain it with claim_complete_worker (in batches of `batch`, when given), released
    together. Returns their ledgers."""
    import multiprocessing
    from pathlib import Path

    spawn = multiprocessing.get_context("spawn")
    fill(db, n_jobs)
    start = spawn.Event()
    procs = []
    for i in range(n_workers):
        ledger = str(Path(tmp) / f"worker{i}.json")
        p = spawn.Process(target=claim_complete_worker,
                          args=(db, f"w{i}", ledger, start, 60.0, batch))
        p.start()
        procs.append((p, ledger))
    start.set()
    for p, _ in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"
    return [json.loads(Path(ledger).read_text()) for _, ledger in procs]

