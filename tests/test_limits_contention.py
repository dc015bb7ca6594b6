"""Concurrency limits and resource fit under contention, on SQLite and PostgreSQL: real
processes claim at once, and the invariant is checked from the history the database kept.

"At every instant, the live leases of a limited kind are at most its limit (per key value)":
each lease's interval is rebuilt from the job_events rows (granted at its `claimed` event,
live until its end event or its expiry, whichever comes first) and the overlap counted at
every lease's start. Some workers abandon their job (as a killed worker would): its slot must
come free when the lease expires, not before, and never stay taken after.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import random
import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.sql import sql

pytestmark = pytest.mark.timeout(300)

SPAWN = multiprocessing.get_context("spawn")
LEASE_S = 0.5
LIMITS = {"llm": (2, None), "embed": (1, "model")}


def _claimer(url: str, worker: str, start: Any, seed: int) -> None:
    """Claim and hold each job a few ms; one claim in eight is abandoned (left to expire),
    as a worker killed mid-job would leave it. Reaps now and then so abandoned jobs return."""
    from jobcoord.errors import Refused
    from jobcoord.service import Coordinator

    rnd = random.Random(seed)
    with Coordinator.open(url) as c:
        c.heartbeat(worker)
        start.wait()
        idle_since = None
        while True:
            got = c.claim(worker, lease_s=LEASE_S)
            job = got["job"]
            if job is None:
                c.reap()
                if c.status()["jobs"]["waiting"] == 0 and c.status()["jobs"]["running"] == 0:
                    return
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 60:
                    return
                time.sleep(0.01)
                c.heartbeat(worker)
                continue
            idle_since = None
            time.sleep(rnd.uniform(0.002, 0.02))
            if rnd.random() < 0.125:
                continue  # abandoned: the lease must expire before the slot is free
            # A slow machine may let the lease expire first: the fence refuses, as it must.
            with contextlib.suppress(Refused):
                c.complete(job["job_id"], worker, got["lease"]["epoch"], {"ok": True})


def _us(iso_text: str) -> int:
    dt = datetime.fromisoformat(iso_text.replace("Z", "+00:00"))
    return int(dt.timestamp()) * 1_000_000 + dt.microsecond


def lease_intervals(c: Coordinator) -> list[tuple[str, str | None, int, int]]:
    """(kind, key value, granted, end) of every lease ever granted, from job_events: a lease
    lives from its `claimed` event until the job's next event or its expiry."""

    def _read(conn: Any) -> list[Any]:
        return sql(
            conn, "SELECT e.job_id, e.at, e.reason, e.detail, j.kind, j.payload_json "
                  "FROM job_events e JOIN jobs j ON j.job_id = e.job_id "
                  "ORDER BY e.job_id, e.event_id").all()

    out = []
    open_lease: dict[int, tuple[str, str | None, int, int]] = {}
    for job_id, at, reason, detail, kind, payload in c.db.read(_read):
        if job_id in open_lease:
            k, key, granted, expires = open_lease.pop(job_id)
            out.append((k, key, granted, min(at, expires)))
        if reason == "claimed":
            key_field = LIMITS.get(kind, (0, None))[1]
            key = json.loads(payload).get(key_field) if key_field else None
            open_lease[job_id] = (kind, key, at, _us(json.loads(detail)["expires_at"]))
    out.extend(open_lease.values())
    return out


def peak_overlap(intervals: list[tuple[int, int]]) -> int:
    """The most intervals [start, end) live at one instant."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))  # an end at t frees before a start at t
    live = peak = 0
    for _, step in points:
        live += step
        peak = max(peak, live)
    return peak


def test_eight_processes_never_exceed_a_limit_at_any_instant(target: Target) -> None:
    with Coordinator.open(target) as c:
        for kind, (n, key) in LIMITS.items():
            c.set_limit(kind, n, key=key)
        specs = ([{"kind": "llm", "payload": {"i": i}} for i in range(40)]
                 + [{"kind": "embed", "payload": {"model": m, "i": i}}
                    for i in range(20) for m in ("small", "large")]
                 + [{"kind": "free", "payload": {"i": i}} for i in range(40)])
        # Attempts enough for the abandoned ones: every job must end succeeded.
        c.enqueue_many([{**spec, "max_attempts": 20} for spec in specs])
        url = target.url
    start = SPAWN.Event()
    procs = [SPAWN.Process(target=_claimer, args=(url, f"w{i}", start, i)) for i in range(8)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    with Coordinator.open(target) as c:
        assert c.status()["jobs"]["succeeded"] == 120
        by: dict[tuple[str, str | None], list[tuple[int, int]]] = defaultdict(list)
        abandoned = 0
        for kind, key, granted, end in lease_intervals(c):
            by[kind, key].append((granted, end))
        for job in c.jobs(kind="llm")["jobs"]:
            abandoned += job["attempts"] > 1
    peaks = {k: peak_overlap(v) for k, v in by.items()}
    assert peaks["llm", None] == 2, peaks  # reached, never passed
    assert peaks["embed", "small"] == 1 and peaks["embed", "large"] == 1, peaks
    # The two keys ran side by side: the limit is per key value, not per kind.
    both = [(s, e) for k in ("small", "large") for s, e in by["embed", k]]
    assert peak_overlap(both) == 2
    # Unlimited work overlapped freely meanwhile.
    assert peaks["free", None] > 2, peaks
    assert abandoned > 0  # some slots were freed by expiry alone


def _gpu_claimer(url: str, worker: str, start: Any, out: Any) -> None:
    from jobcoord.service import Coordinator

    with Coordinator.open(url) as c:
        start.wait()
        taken = []
        for _ in range(20):
            got = c.claim(worker, lease_s=60)
            if got["job"] is not None:
                taken.append(got["job"]["job_id"])
        out.put((worker, taken))


def test_two_workers_never_oversubscribe_their_gpus(target: Target) -> None:
    """Each of two workers has one 16000 MB GPU: of eight 6000 MB jobs, each worker can hold
    two at once, however many claims race; the rest wait."""
    from tests.conftest import environment  # here: the spawned processes import this module
    gpu = {"gpus": [{"memory_free_mb": 16000, "memory_total_mb": 16000,
                     "utilization_pct": 0, "temperature_c": 40}]}
    with Coordinator.open(target) as c:
        for w in ("a", "b"):
            c.heartbeat(w, readings=gpu)
        c.enqueue_many([{"kind": "render", "needs": {"gpu_mem_mb": 6000}} for _ in range(8)])
        url = target.url
    start, out = SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_gpu_claimer, args=(url, w, start, out))
             for w in ("a", "b", "a", "b")]  # two processes per worker id: races on one GPU
    # Each claim pauses between deciding that a job fits and taking it: without the hold
    # on the worker's row, both processes of a worker would fit into the same free memory.
    with environment(JOBCOORD_FAULT="checked.before_take:sleep=0.1"):
        for p in procs:
            p.start()
    start.set()
    got: dict[str, list[int]] = defaultdict(list)
    for _ in procs:
        w, taken = out.get(timeout=60)
        got[w].extend(taken)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(got["a"]) == 2 and len(got["b"]) == 2, dict(got)
    with Coordinator.open(target) as c:
        assert c.status()["jobs"]["running"] == 4
        again = c.claim("a")
        assert again["job"] is None and again["reason"] == "resource_short"
        assert "gpu_mem_mb: needs 6000" in again["detail"]


def test_threads_sharing_one_coordinator_never_exceed_a_limit(target: Target) -> None:
    """Six threads of one process claim through one Coordinator (one pool of connections)."""
    import threading

    with Coordinator.open(target) as c:
        c.set_limit("llm", 2)
        c.enqueue_many([{"kind": "llm", "payload": {"i": i}} for i in range(30)]
                       + [{"kind": "free", "payload": {"i": i}} for i in range(30)])
        errors: list[BaseException] = []

        def run(worker: str) -> None:
            try:
                c.heartbeat(worker)
                while True:
                    got = c.claim(worker, lease_s=30)
                    if got["job"] is None:
                        if got["reason"] == "no_waiting_jobs":
                            return
                        time.sleep(0.005)
                        continue
                    time.sleep(0.02)  # long enough for the slots to fill
                    c.complete(got["job"]["job_id"], worker, got["lease"]["epoch"], {})
            except BaseException as e:  # reported by the test, not lost in the thread
                errors.append(e)

        threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert c.status()["jobs"]["succeeded"] == 60
        llm = [(s, e) for kind, _, s, e in lease_intervals(c) if kind == "llm"]
    assert len(llm) == 30 and peak_overlap(llm) == 2


def _claim_and_hang(url: str, ready: Any) -> None:
    from jobcoord.service import Coordinator

    c = Coordinator.open(url)
    c.heartbeat("doomed")
    got = c.claim("doomed", lease_s=4)
    ready.put(got["job"]["job_id"])
    time.sleep(600)  # killed long before


def test_a_sigkilled_holder_frees_its_slot_when_its_lease_expires_without_a_reaper(
        target: Target) -> None:
    import os
    import signal

    with Coordinator.open(target) as c:
        c.set_limit("llm", 1)
        c.enqueue_many([{"kind": "llm"}, {"kind": "llm"}])
        ready = SPAWN.Queue()
        p = SPAWN.Process(target=_claim_and_hang, args=(target.url, ready))
        p.start()
        held = ready.get(timeout=60)
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        expires = _us(c.show(held)["lease"]["expires_at"])
        c.heartbeat("w2")
        refused = c.claim("w2")
        if time.time() * 1e6 < expires - 200_000:  # still well inside the dead one's lease
            assert refused["reason"] == "concurrency_limit", refused
            assert f"held by job {held} on doomed" in refused["detail"]
        time.sleep(max(0.0, (expires - time.time() * 1e6) / 1e6) + 0.05)
        c.heartbeat("w2")
        got = c.claim("w2")  # no reap ran: the expired lease no longer counts
        assert got["job"] is not None and got["job"]["job_id"] != held
        # The claim ended the expired lease it took the slot of, as the reaper would: a
        # clock stepping back cannot make it live again beside the new holder.
        shown = c.show(held)
        assert shown["job"]["status"] == "waiting", shown["job"]
        assert shown["events"][-1]["reason"] == "lease_expired", shown["events"][-1]


def test_a_limit_lowered_while_a_claim_decides_holds_that_claim_back(target: Target) -> None:
    """A claim read the limits, then (PostgreSQL) waited for or took the kind's limits row
    and judged by what it had read: a limit lowered in between let it take a job the new
    limit no longer allowed, granted after the new limit had committed (2 running under
    `concurrency 1`). It judges by the row it holds. (SQLite: the limit change waits for
    the claim's transaction, so the claim is granted before it.)"""
    import threading

    from jobcoord import faults

    with Coordinator.open(target) as c:
        c.set_limit("k", 2)
        for i in range(3):
            c.enqueue("k", {"i": i})
        for w in ("w1", "w2"):
            c.heartbeat(w, readings={})
        assert c.claim("w1")["job"] is not None
        got: dict[str, Any] = {}
        faults.install("limits.read:sleep=1.5")  # after the claim's read of the limits
        try:
            claimer = threading.Thread(target=lambda: got.update(
                r=c.claim("w2", lease_s=60)))
            claimer.start()
            time.sleep(0.5)
            with Coordinator.open(target) as other:
                other.set_limit("k", 1)
                lowered_us = time.time() * 1e6
            claimer.join(30)
        finally:
            faults.install("")
        r = got["r"]
        if r["job"] is None:
            assert r["reason"] == "concurrency_limit", r
        else:  # granted before the new limit was there: allowed by the limit it replaced
            granted_us = r["lease"]["expires_at_us"] - 60e6
            assert granted_us < lowered_us, (granted_us - lowered_us, r)
        assert target.sqlite_path is not None or r["job"] is None, r
