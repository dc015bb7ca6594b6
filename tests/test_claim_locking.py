"""PostgreSQL claims lock only the row they take.

The claim's per-(role, kind) probes read without locks; only the chosen row is locked (FOR
UPDATE SKIP LOCKED), and when every candidate was locked by other claimers the claim looks at
more heads per slice before it answers that the jobs are being claimed by another worker. So
a concurrent claimer never gets `no_waiting_jobs` while an eligible job it could take is
untaken."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from jobcoord.clock import now_us
from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests import pg_procs
from tests.conftest import fresh_pg
from tests.timeline import IDLE_ON_AC

SPAWN = multiprocessing.get_context("spawn")
KINDS = [f"kind{i}" for i in range(8)]


@pytest.fixture
def pg_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with fresh_pg(request.getfixturevalue("pg_template")) as t:
        yield t


def test_a_claim_in_progress_locks_only_the_row_it_takes(pg_target: Target) -> None:
    a, b = Coordinator.open(pg_target), Coordinator.open(pg_target)
    try:
        for kind in ("x", "y"):  # one job in each slice
            a.enqueue(kind, {})
        for w, c in (("wa", a), ("wb", b)):
            c.heartbeat(w, kinds=["x", "y"], readings=IDLE_ON_AC)
        holding, release = threading.Event(), threading.Event()
        first: list[Any] = []

        def slow_claim(conn: Any) -> None:
            first.append(a._claim(conn, "wa", 60_000_000, None, now_us()))
            holding.set()
            release.wait(30)  # the claim's transaction stays open, its locks held

        t = threading.Thread(target=a.db.write, args=(slow_claim, "claim"))
        t.start()
        try:
            assert holding.wait(30)
            got = b.claim("wb")
            assert got["job"] is not None, got
            assert got["job"]["job_id"] != first[0]["job"]["job_id"]
        finally:
            release.set()
            t.join(30)
    finally:
        a.close()
        b.close()


def test_eight_claimers_never_report_nothing_while_an_untaken_job_waits(pg_target: Target
                                                                         ) -> None:
    """Each round: one waiting job in each of 8 kinds, and 8 claimer processes (each serving
    every kind) claim once, at the same moment. Whatever the interleaving, every claimer can
    take a job: at most 7 others hold one row each."""
    rounds = 15
    barrier = SPAWN.Barrier(9)
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=pg_procs.claim_in_rounds,
                           args=(pg_target.url, f"w{i}", KINDS, rounds, barrier, results))
             for i in range(8)]
    for p in procs:
        p.start()
    refused: list[Any] = []
    taken: list[int] = []
    try:
        with Coordinator.open(pg_target) as c:
            for _ in range(rounds):
                c.enqueue_many([{"kind": kind} for kind in KINDS])
                barrier.wait(120)  # go
                barrier.wait(120)  # every claimer answered
                for _ in range(8):
                    worker, job_id, reason, detail = results.get(timeout=30)
                    if job_id is None:
                        refused.append((worker, reason, detail))
                    else:
                        taken.append(job_id)
    finally:
        for p in procs:
            p.join(60)
    assert [p.exitcode for p in procs] == [0] * 8
    assert not refused, refused[:5]
    assert sorted(taken) == list(range(1, 8 * rounds + 1))
