"""Explain bound to a tenant (the view of a tenant-bound token, or `explain --tenant`) names
no worker from the workers table: a worker row carries no tenant, so any worker may be
another tenant's. Ready workers are counted, gated and short ones are "a worker"; the view
without a tenant (an operator's) names every one, as before."""

from __future__ import annotations

from datetime import timedelta

from tests.conftest import run_cli
from tests.timeline import IDLE_ON_AC, at

WORKERS = ("alice-box", "bob-box", "old-box", "small-box")


def _world(coord, clock):
    coord.heartbeat("old-box", readings=IDLE_ON_AC)
    clock.move_to(at(60) + timedelta(microseconds=1))  # old-box's heartbeat is now stale
    for w in ("alice-box", "bob-box"):
        coord.heartbeat(w, readings={**IDLE_ON_AC, "memory_available_mb": 64000})
    coord.heartbeat("small-box", readings={**IDLE_ON_AC, "memory_available_mb": 100})
    return coord.enqueue("k", {}, tenant="alice", needs="ram_mb=1000")["job_id"]


def test_explain_bound_to_a_tenant_counts_workers_and_names_none(coord, clock):
    job = _world(coord, clock)
    told = coord.explain(job, tenant="alice")
    assert told["ready_workers"] == [] and told["ready_count"] == 2
    assert told["claimable_now"] is True
    codes = {r["code"]: r["detail"] for r in told["reasons"]}
    assert codes["heartbeat_stale"].startswith("a worker that could run it: last heartbeat")
    assert codes["resource_short"].startswith("a worker: ram_mb: needs 1000")
    assert codes["eligible"].startswith("2 worker(s) can claim it now")
    assert not [w for w in WORKERS if w in str(told)], told

    # The operator's view, every tenant's: every worker is named.
    everyone = coord.explain(job)
    assert sorted(everyone["ready_workers"]) == ["alice-box", "bob-box"]
    assert everyone["ready_count"] == 2
    assert all(w in str(everyone) for w in WORKERS), everyone


def test_explain_tenant_from_the_cli_names_no_worker(coord, clock, target):
    job = _world(coord, clock)
    out = run_cli(target, "explain", str(job), "--tenant", "alice")
    assert out.code == 0, out.err
    assert "heartbeat_stale: a worker that could run it" in out.out
    assert not [w for w in WORKERS if w in out.out], out.out
    assert "old-box" in run_cli(target, "explain", str(job)).out
