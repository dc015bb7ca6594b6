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


def _claims_made(c: Coordinator, worker: str) -> int:
    """Claims this worker made that took nothing (each one a counted refusal: a write)."""
    from sqlalchemy import text

    with c.db.engine.connect() as conn:
        return int(conn.execute(text("SELECT coalesce(sum(n), 0) FROM claim_refusals "
                                     "WHERE worker_id = :w"), {"w": worker}).scalar())


def test_a_long_poll_that_cannot_take_the_waiting_job_claims_once_per_wake_not_in_a_loop(
        target: Target) -> None:
    """A job no waiting poll may take (a role none of them has): the poller wakes the polls
    every look; each asks whether it could take a job (a read) and waits again. A poll
    passing the turn on must never wake itself (nor bounce the turn between polls that have
    all looked): that was a busy loop of refused claims, each a write, until the poll's
    time ran out; and each wake-up's claim was a refusal recorded, a write."""
    wa = token(target, "wa", "worker", worker="wa")
    wb = token(target, "wb", "worker", worker="wb")
    with Coordinator.open(target) as c:
        c.enqueue("k", {}, role="gpu")
    with served(target, "--reap-every", "0", "--poll", "0.5") as s, \
            s.client(wa) as a, s.client(wb) as b:
        for client in (a, b):
            client.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 10}})
        threads = [threading.Thread(target=lambda cl=client: cl.post(
            "/v1/claims", json={"wait": 3}, timeout=30)) for client in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    with Coordinator.open(target) as c:
        made = {w: _claims_made(c, w) for w in ("wa", "wb")}
    # The first claim and the last: every wake-up between them (the poller's looks every
    # 0.5 s, the poll's own every two polls) asks with a read whether it could take a job.
    assert all(n <= 2 for n in made.values()), made


def test_wake_ups_kept_while_no_poll_waited_do_not_spin_a_later_poll(target: Target) -> None:
    """Submissions while no poll waits each keep a wake-up for the next poll (a job
    committed during a claim must not wait for the poller). A poll that arrives after 300 of
    them has seen those commits in its first claim: it took them all back at once, one
    claim each round, with a job a limit holds back making every round a refused claim (a
    write), 1,009 in 3 s. A kept wake-up from before a poll's last look is nothing new."""
    wa = token(target, "wa", "worker", worker="wa")
    sub = token(target, "sub", "submitter")
    with Coordinator.open(target) as c:
        c.set_limit("lim", 1)
        c.enqueue("lim", {})
        c.heartbeat("holder", readings={"memory_used_pct": 10})
        assert c.claim("holder", kinds=["lim"])["job"] is not None
        c.enqueue("lim", {})  # held back by the limit: every claim for it is refused
    with served(target, "--reap-every", "0", "--poll", "1") as s, \
            s.client(wa) as a, s.client(sub) as b:
        for _ in range(300):
            assert b.post("/v1/jobs", json={"kind": "k", "role": "gpu"}).status_code == 201
        a.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 10}})
        a.post("/v1/claims", json={"wait": 2}, timeout=30)
    with Coordinator.open(target) as c:
        made = _claims_made(c, "wa")
    # Its first and last claims, and one per look of the poller (every second: the held
    # job is due) or of its own.
    assert made <= 6, made
