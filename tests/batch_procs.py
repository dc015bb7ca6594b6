"""Bodies of the real processes the batching tests start (spawn context): workers that
claim and complete in batches through the public Python API."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def batch_worker(db: Any, worker_id: str, ledger: str, start: Any, batch: int = 8) -> None:
    """claim_many / complete_many until nothing is waiting; every (job, epoch) this process
    was given and every completion it was told was accepted go to its ledger."""
    from jobcoord.errors import JobcoordError
    from jobcoord.service import Coordinator

    claims: list[list[int]] = []
    completed: list[list[int]] = []
    errors: dict[str, int] = {}
    coord = Coordinator.open(db)
    coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
    start.wait()
    last_beat = time.monotonic()
    while True:
        try:
            if time.monotonic() - last_beat > 10:
                coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
                last_beat = time.monotonic()
            got = coord.claim_many(worker_id, batch, lease_s=60)
            if not got["claimed"]:
                if got["reason"] == "no_waiting_jobs":
                    break
                errors[got["reason"]] = errors.get(got["reason"], 0) + 1
                continue
            items = []
            for one in got["claimed"]:
                job_id, epoch = one["job"]["job_id"], one["lease"]["epoch"]
                claims.append([job_id, epoch])
                items.append({"job_id": job_id, "worker_id": worker_id, "epoch": epoch,
                              "result": {"by": worker_id}})
            done = coord.complete_many(items)
            for item, answer in zip(items, done["results"], strict=True):
                if "error" in answer:
                    code = answer["error"]["code"]
                    errors[code] = errors.get(code, 0) + 1
                else:
                    completed.append([item["job_id"], item["epoch"]])
        except JobcoordError as e:
            errors[e.code] = errors.get(e.code, 0) + 1
        except Exception as e:  # anything else is a finding, never a reason to stop early
            key = f"{type(e).__name__}: {e}"[:200]
            errors[key] = errors.get(key, 0) + 1
    tmp = ledger + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"worker": worker_id, "claims": claims, "completed": completed,
                   "errors": errors}, f)
    os.replace(tmp, ledger)
    coord.close()


def run_batch_contention(db: Any, tmp: Any, n_jobs: int, n_workers: int, batch: int,
                         timeout: float = 300) -> list[dict[str, Any]]:
    """Fill `db` with n_jobs and let n_workers batch_worker processes drain it, released
    together. Returns their ledgers."""
    import multiprocessing
    from pathlib import Path

    from tests.procs import fill

    spawn = multiprocessing.get_context("spawn")
    fill(db, n_jobs)
    start = spawn.Event()
    procs = []
    for i in range(n_workers):
        ledger = str(Path(tmp) / f"batch{i}.json")
        p = spawn.Process(target=batch_worker, args=(db, f"w{i}", ledger, start, batch))
        p.start()
        procs.append((p, ledger))
    start.set()
    for p, _ in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"
    return [json.loads(Path(ledger).read_text()) for _, ledger in procs]
