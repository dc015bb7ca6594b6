"""A claim bound to a tenant takes only that tenant's jobs (the trusted identity of a worker
token): in the Python API, in complete_and_claim's next claim, and still in claim order on the
claim index on both databases."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobcoord.db import SQL, Target
from jobcoord.errors import InvalidInput
from jobcoord.service import Coordinator, JobSpec


def test_a_claim_with_a_tenant_takes_only_that_tenants_jobs(target: Target) -> None:
    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10})
        bobs = c.enqueue("k", {}, tenant="bob", priority=0)["job_id"]
        default = c.enqueue("k", {})["job_id"]  # the default tenant: not alice's either
        alices = [c.enqueue("k", {"i": i}, tenant="alice")["job_id"] for i in range(2)]
        got = c.claim("w", tenant="alice")
        assert got["job"]["job_id"] == alices[0] and got["job"]["tenant"] == "alice"
        # The next claim of the same transaction is bound to the same tenant.
        both = c.complete_and_claim(alices[0], "w", got["lease"]["epoch"], {},
                                    tenant="alice")
        assert both["next"]["job"]["job_id"] == alices[1]
        nothing = c.claim("w", tenant="alice")
        # Told about its own tenant only: other tenants' waiting jobs are as if absent.
        assert nothing["job"] is None and nothing["reason"] == "no_waiting_jobs"
        assert "bob" not in nothing["detail"] and "alice" in nothing["detail"]
        assert c.show(bobs)["job"]["status"] == c.show(default)["job"]["status"] == "waiting"
        # Without a tenant, every tenant's jobs, in claim order.
        assert c.claim("w")["job"]["job_id"] == bobs
        assert c.claim("w")["job"]["job_id"] == default


@pytest.mark.parametrize("checked_by", ["limit", "needs"])
def test_a_tenant_bound_claim_checked_for_limits_or_needs_takes_only_its_tenants_jobs(
        target: Target, checked_by: str) -> None:
    # A defined limit or a waiting job with needs sends the claim down the path that checks
    # candidates one by one: the tenant binds there too.
    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10, "memory_available_mb": 4000})
        if checked_by == "limit":
            c.set_limit("other-kind", 1)
            bobs = c.enqueue("k", {}, tenant="bob", priority=0)["job_id"]
        else:
            bobs = c.enqueue("k", {}, tenant="bob", priority=0, needs="ram_mb=10")["job_id"]
        alices = c.enqueue("k", {}, tenant="alice")["job_id"]
        got = c.claim("w", tenant="alice")
        assert got["job"]["job_id"] == alices
        assert c.claim("w", tenant="alice")["job"] is None
        assert c.show(bobs)["job"]["status"] == "waiting"
        assert c.claim("w")["job"]["job_id"] == bobs


def test_a_claims_tenant_is_checked_like_any_name(target: Target) -> None:
    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10})
        job = c.enqueue("k", {}, tenant="alice")["job_id"]
        for bad in ("", "a\x00b", 7, "x" * 500):
            with pytest.raises(InvalidInput):
                c.claim("w", tenant=bad)  # type: ignore[arg-type]
        assert c.show(job)["job"]["status"] == "waiting"


def _filler() -> list[JobSpec]:
    # Many tenants' finished-or-waiting jobs, so a tenant index looks selective to a planner.
    return ([JobSpec("work", {"i": i}, tenant=f"t{i % 20}") for i in range(3000)]
            + [JobSpec("work", {"i": i}, tenant=f"t{i % 20}", role="gpu")
               for i in range(1000)])


def test_a_tenant_bound_claim_reads_the_claim_index_on_sqlite(sqlite_target: Target) -> None:
    with Coordinator.open(sqlite_target) as c:
        c.enqueue_many(_filler())
        c.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))
        for kinds in (None, ["work"]):
            text, params = c._candidate_sql(["gpu"], kinds, due_only=True, tenant="t3")
            params.update(now=2**62, maxp=3)
            plan = c.db.read(lambda conn, text=text, params=params: [
                r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + text,
                                                    params).all()])
            searches = [p for p in plan if p.startswith(("SEARCH jobs", "SCAN jobs"))]
            assert searches and all("USING INDEX ix_jobs_claim_" in p for p in searches), plan
            # The probes walk in claim order: the only sort is of the few heads.
            assert plan.count("USE TEMP B-TREE FOR ORDER BY") == 1, plan
            got = c.db.read(lambda conn, text=text, params=params:
                            conn.exec_driver_sql(text, params).all())
            assert len(got) == 1


def test_a_tenant_bound_claim_reads_the_claim_index_on_postgresql(pg_target: Target) -> None:
    with Coordinator.open(pg_target) as c:
        c.enqueue_many(_filler())
        statements = [c._candidate_sql(["gpu"], kinds, due_only=True, tenant="t3")
                      for kinds in (None, ["work"])]
        statements += [c._claim_folded_sql(["gpu"], None, "t3")]
    url = pg_target.url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE jobs")
        for text, params in statements:
            params.update(now=2**62, maxp=3, heads=4, f=False, worker="w", expires=1,
                          expires_json='"x"')
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN " + SQL(text).postgresql, params).fetchall())
            assert "ix_jobs_claim_" in plan, plan
            assert "ix_jobs_tenant_job_id" not in plan, plan
            assert "Seq Scan on jobs" not in plan, plan


@pytest.fixture
def pg_target(pg_template: str) -> Any:
    from .conftest import fresh_pg

    with fresh_pg(pg_template) as t:
        yield t


@pytest.mark.parametrize("path", ["set", "limit", "needs"])
def test_a_batch_claim_with_a_tenant_takes_only_that_tenants_jobs(target: Target,
                                                                  path: str) -> None:
    # Without limits or needs the batch is taken as one set; a defined limit or a waiting
    # job with needs sends it down the step-by-step path: the tenant binds on both.
    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10, "memory_available_mb": 4000})
        if path == "limit":
            c.set_limit("other-kind", 1)
        needs = "ram_mb=10" if path == "needs" else None
        bobs = c.enqueue("k", {}, tenant="bob", priority=0, needs=needs)["job_id"]
        default = c.enqueue("k", {}, priority=0)["job_id"]
        alices = [c.enqueue("k", {"i": i}, tenant="alice", priority=p)["job_id"]
                  for i, p in enumerate([2, 1, 2])]
        got = c.claim_many("w", 10, tenant="alice")
        assert [g["job"]["job_id"] for g in got["claimed"]] == [alices[1], alices[0],
                                                                 alices[2]]
        assert {g["job"]["tenant"] for g in got["claimed"]} == {"alice"}
        nothing = c.claim_many("w", 10, tenant="alice")
        assert nothing["claimed"] == [] and nothing["reason"] == "no_waiting_jobs"
        assert "alice" in nothing["detail"] and "bob" not in nothing["detail"]
        assert c.show(bobs)["job"]["status"] == c.show(default)["job"]["status"] == "waiting"
        # Without a tenant, every tenant's jobs, in claim order.
        rest = c.claim_many("w", 10)["claimed"]
        assert [g["job"]["job_id"] for g in rest] == [bobs, default]
        for bad in ("", "a\x00b", 7):
            with pytest.raises(InvalidInput):
                c.claim_many("w", 2, tenant=bad)  # type: ignore[arg-type]


def test_a_batch_claim_reads_the_claim_index_on_sqlite(sqlite_target: Target) -> None:
    from jobcoord.store import statements as s

    with Coordinator.open(sqlite_target) as c:
        c.enqueue_many(_filler())
        c.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))
        for kinds, tenant in ((None, None), (["work"], "t3"), (None, "t3")):
            stmt, params = s.take_many_sql(["gpu"], kinds, tenant)
            params.update(now=2**62, maxp=3, n=32, f=False)
            plan = c.db.read(lambda conn, text=stmt.sqlite, params=params: [
                r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + text,
                                                    params).all()])
            searches = [p for p in plan if p.startswith(("SEARCH jobs", "SCAN jobs"))]
            # The probes walk the claim index; the update finds its rows by their ids.
            probes = [p for p in searches if "job_id=?" not in p]
            assert len(probes) == 2, plan  # the role-less slice and the gpu slice
            assert probes and all("USING INDEX ix_jobs_claim_" in p for p in probes), plan
            assert not any(p.startswith("SCAN jobs") for p in searches), plan


def test_a_batch_claim_reads_the_claim_index_on_postgresql(pg_target: Target) -> None:
    from jobcoord.store import postgresql_statements as ps
    from jobcoord.store import statements as s

    with Coordinator.open(pg_target) as c:
        c.enqueue_many(_filler())
    url = pg_target.url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE jobs")
        for kinds, tenant in ((None, None), (["work"], "t3"), (None, "t3")):
            params = s.role_kind_params(["gpu"], kinds, tenant)
            params.update(now=2**62, maxp=3, heads=128, n=32, f=False, worker="w",
                          expires=1, expires_json='"x"')
            stmt = ps.take_many_folded(["gpu"], kinds, tenant is not None)
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + stmt.postgresql,
                                                        params).fetchall())
            assert "ix_jobs_claim_" in plan, plan
            assert "ix_jobs_tenant_job_id" not in plan, plan
            # The pick and the take find their rows by key, never by reading every job.
            assert plan.count("Index Cond: (job_id = ANY") == 2, plan
            assert "LockRows" in plan, plan
            if kinds is None and tenant is None:
                # (With a kind and a tenant filter this small table's planner may read the
                # 4,000 rows for a probe of 128 heads instead; the pick never does.)
                assert "Seq Scan on jobs" not in plan, plan
