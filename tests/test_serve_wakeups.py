"""A long-poll hears a commit by another process at once on SQLite (an inotify watch of the
-wal file and `PRAGMA data_version`, as an idle local worker does), not at the server's next
poll."""

from __future__ import annotations

import threading
import time
from typing import Any

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.serve_procs import served, token


def test_a_long_poll_hears_another_process_commit_well_before_the_poll(
        sqlite_target: Target) -> None:
    wa = token(sqlite_target, "wa", "worker", worker="wa")
    # The longest poll there is (1 s); a long-poll also claims again every 2 polls on its
    # own. Without the watch, each pickup below would take up to a second.
    with served(sqlite_target, "--reap-every", "0", "--poll", "1") as s, \
            s.client(wa) as worker, Coordinator.open(sqlite_target) as c:
        worker.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 10}})
        took = []
        for _ in range(5):
            out: dict[str, Any] = {}

            def claim(out: dict[str, Any] = out) -> None:
                resp = worker.post("/v1/claims", json={"wait": 20})
                out.update(body=resp.json(), at=time.monotonic())

            thread = threading.Thread(target=claim)
            thread.start()
            time.sleep(0.5)  # waiting in its long-poll
            assert not out
            committed = time.monotonic()
            job = c.enqueue("k", {})["job_id"]  # another process's commit (the CLI's path)
            thread.join(20)
            assert out["body"]["job"]["job_id"] == job
            took.append(out["at"] - committed)
            c.complete(job, "wa", out["body"]["lease"]["epoch"], {})
        assert max(took) < 0.4, took
