"""Explain bound to a tenant (the view of a tenant-bound token, or `explain --tenant`) names
no worker from the workers table: a worker row carries no tenant, so any worker may be
another tenant's. Ready workers are counted, gated and short ones are "a worker"; the view
without a tenant (an operator's) names every one, as before."""

from __future__ import annotations

from datetime import timedelta

from jobcoord.db import SQL
from jobcoord.service import JobSpec
from jobcoord.store import query_statements as qs
from tests.conftest import run_cli
from tests.test_claim_tenant import _run_counting_steps
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


def test_a_tenant_views_jobs_ahead_reads_only_its_tenants_slice(coord):
    # 2,000 waiting jobs of another tenant ahead in claim order, then alice's.
    coord.enqueue_many([JobSpec("k", {"i": i}, tenant="big", priority=0,
                                role="gpu" if i % 2 else None) for i in range(2000)])
    mine = {role: [coord.enqueue("k", {}, tenant="alice", role=role)["job_id"]
                   for _ in range(3)] for role in (None, "gpu")}
    for role, ids in mine.items():
        assert coord.explain(ids[-1], tenant="alice")["jobs_ahead"] == 2
        assert coord.explain(ids[-1])["jobs_ahead"] == 1000 + 2
        text = qs.jobs_ahead(role is not None, True).named(coord.db.dialect)
        params = {"role": role, "p": 3, "c": 2**62, "job_id": 2**62, "tenant": "alice"}
        # The count reads the tenant's slice of a tenant claim index; the default tenant's
        # count (the other read of jobs) does not run for alice.
        if coord.db.dialect == "sqlite":
            plan = coord.db.read(lambda conn, t=text, p=params: [
                r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + t, p).all()])
            reads = [line for line in plan if " jobs" in line]
            assert len(reads) == 2 and reads[0].startswith(
                "SEARCH jobs USING INDEX ix_jobs_claim_tenant (tenant=? AND <expr>=?"), plan
            _, steps = _run_counting_steps(coord, text, params)
            assert steps < 2000, steps  # reading past big's 1,000 would take many thousands
        else:
            plan = coord.db.read(lambda conn, t=text, p=params: [
                r[0] for r in conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, COSTS OFF) " + SQL(t).postgresql, p).all()])
            # Each scan that ran is an index scan whose condition starts with the tenant.
            ran = [i for i, line in enumerate(plan)
                   if "Scan" in line and "never executed" not in line]
            assert ran and all("Index Scan" in plan[i] or "Index Only Scan" in plan[i]
                               for i in ran), plan
            assert all(plan[i + 1].strip().startswith("Index Cond: ((tenant)::text = 'alice'")
                       for i in ran), plan
