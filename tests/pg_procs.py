"""Bodies of the real processes the PostgreSQL tests start (multiprocessing "spawn": a fresh
interpreter, no inherited connections). Each writes what it was told to a JSON file. A
JOBCOORD_FAULT in a process's environment arms its fault points through
tests/fault_site/sitecustomize.py, which the suite puts on every child's path."""

from __future__ import annotations

import json
import os
from typing import Any


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def claim_once(target: Any, worker_id: str, out: str) -> None:
    """Heartbeat, claim one job, record the answer. A JOBCOORD_FAULT in this process's
    environment can hold the claim's transaction open at a pause point."""
    from jobcoord.service import Coordinator

    with Coordinator.open(target) as coord:
        coord.heartbeat(worker_id, readings={"memory_used_pct": 10.0})
        got = coord.claim(worker_id, lease_s=120)
        _write(out, {"job_id": None if got["job"] is None else got["job"]["job_id"],
                     "epoch": None if got["job"] is None else got["lease"]["epoch"],
                     "reason": got.get("reason")})


def complete_once(target: Any, worker_id: str, job_id: int, epoch: int, out: str,
                  op: str = "complete") -> None:
    """Complete one job (op "complete_and_claim": and claim the next in the same
    transaction); a JOBCOORD_FAULT may SIGKILL this process inside the transaction."""
    from jobcoord.errors import JobcoordError
    from jobcoord.service import Coordinator

    with Coordinator.open(target) as coord:
        try:
            got: dict[str, Any] = getattr(coord, op)(job_id, worker_id, epoch,
                                                     {"by": worker_id})
        except JobcoordError as e:
            got = {"error": e.code}
        _write(out, got)



def claim_in_rounds(url: str, worker_id: str, kinds: list[str], rounds: int, barrier: Any,
                    results: Any) -> None:
    """Claim once per round, all claimers at once (the barrier starts each round after the
    test enqueued its jobs, and ends it once every claimer has answered)."""
    from jobcoord.service import Coordinator

    with Coordinator.open(url) as coord:
        coord.heartbeat(worker_id, kinds=kinds, readings={"memory_used_pct": 10.0})
        for _ in range(rounds):
            barrier.wait(60)
            got = coord.claim(worker_id, lease_s=300)
            results.put((worker_id, None if got["job"] is None else got["job"]["job_id"],
                         got.get("reason"), got.get("detail")))
            barrier.wait(60)
