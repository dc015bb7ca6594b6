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
from tests.conftest import run_cli


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


def test_claimable_with_a_tenant_counts_only_that_tenants_jobs(target: Target) -> None:
    # What a tenant-bound idle worker asks when a commit wakes it: another tenant's job must
    # not turn into a claim that finds nothing.
    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10})
        bobs = c.enqueue("k", {}, tenant="bob")["job_id"]
        assert c.claimable("w") is True
        assert c.claimable("w", tenant="alice") is False
        c.enqueue("k", {}, tenant="alice")
        assert c.claimable("w", tenant="alice") is True
        assert c.claimable("w", kinds=["other"], tenant="alice") is False
        c.cancel(bobs)
        with pytest.raises(InvalidInput):
            c.claimable("w", tenant="two words")


def test_the_claim_command_with_a_tenant_takes_only_that_tenants_jobs(target: Target) -> None:
    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10})
        bobs = c.enqueue("k", {}, tenant="bob", priority=0)["job_id"]
        alices = c.enqueue("k", {}, tenant="alice")["job_id"]
        got = run_cli(target, "claim", "w", "--tenant", "alice", "--json")
        assert got.code == 0, got.err
        assert got.json["job"]["job_id"] == alices and got.json["job"]["tenant"] == "alice"
        nothing = run_cli(target, "claim", "w", "--tenant", "alice", "--json")
        assert nothing.code == 3 and nothing.json["reason"] == "no_waiting_jobs", nothing
        assert "bob" not in nothing.out
        text = run_cli(target, "claim", "w", "--tenant", "alice")
        assert text.code == 3 and "no job of tenant alice is waiting" in text.out, text
        assert c.show(bobs)["job"]["status"] == "waiting"
        bad = run_cli(target, "claim", "w", "--tenant", "two words", "--json")
        assert bad.code == 2 and bad.json["error"]["code"] == "invalid_input", bad
        assert run_cli(target, "claim", "w", "--json").json["job"]["job_id"] == bobs


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
    # Many tenants' finished-or-waiting jobs, so a tenant index looks selective to a planner,
    # and ahead of them in claim order (older, priority 0) a deep queue of another tenant's.
    return ([JobSpec("work", {"i": i}, tenant="big", priority=0, role="gpu" if i % 2 else None)
             for i in range(4000)]
            + [JobSpec("work", {"i": i}, tenant=f"t{i % 20}") for i in range(3000)]
            + [JobSpec("work", {"i": i}, tenant=f"t{i % 20}", role="gpu")
               for i in range(1000)])


#: Every shape of a tenant-bound claim: without and with a role, without and with kinds.
SHAPES = [(roles, kinds) for roles in ([], ["gpu"]) for kinds in (None, ["work"])]


def test_a_tenant_bound_claim_seeks_to_its_tenant_on_sqlite(sqlite_target: Target) -> None:
    with Coordinator.open(sqlite_target) as c:
        c.enqueue_many(_filler())
        c.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))
        for roles, kinds in SHAPES:
            text, params = c._candidate_sql(roles, kinds, due_only=True, tenant="t3")
            params.update(now=2**62, maxp=3)
            plan = c.db.read(lambda conn, text=text, params=params: [
                r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + text,
                                                    params).all()])
            searches = [p for p in plan if p.startswith(("SEARCH jobs", "SCAN jobs"))]
            # Each probe starts at the tenant's slice of a tenant claim index: the tenant and
            # the role are its first two keys, so no other tenant's job is read. (The other
            # probes are the default tenant's, which a claim for t3 does not run.)
            index = "ix_jobs_claim_tenant_kind" if kinds else "ix_jobs_claim_tenant"
            seeks = [p for p in searches
                     if p.startswith(f"SEARCH jobs USING INDEX {index} (tenant=? AND <expr>=?")]
            assert len(seeks) == len(roles) + 1 and len(searches) == 2 * len(seeks), plan
            # The probes walk in claim order: the only sort is of the few heads.
            assert plan.count("USE TEMP B-TREE FOR ORDER BY") == 1, plan
            got, steps = _run_counting_steps(c, text, params)
            assert len(got) == 1
            # Reading past tenant big's 4,000 jobs would take tens of thousands of steps.
            assert steps < 2000, steps
            # The claim without a tenant keeps the claim indexes it always read.
            text, params = c._candidate_sql(roles, kinds, due_only=True)
            params.update(now=2**62, maxp=3)
            plan = c.db.read(lambda conn, text=text, params=params: [
                r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + text,
                                                    params).all()])
            assert not any("ix_jobs_claim_tenant" in p for p in plan), plan


def _run_counting_steps(c: Coordinator, text: str, params: dict[str, Any]
                        ) -> tuple[list[Any], int]:
    """The statement's rows on SQLite, and how many virtual machine steps it took (counted
    by a progress handler every 10 steps)."""
    def _do(conn: Any) -> tuple[list[Any], int]:
        raw = conn.connection.driver_connection
        steps = [0]

        def tick() -> int:
            steps[0] += 10
            return 0

        raw.set_progress_handler(tick, 10)
        try:
            return conn.exec_driver_sql(text, params).all(), steps[0]
        finally:
            raw.set_progress_handler(None, 10)
    return c.db.read(_do)


def test_a_claim_bound_to_the_default_tenant_takes_only_its_jobs(target: Target) -> None:
    # The default tenant's jobs are not in the tenant claim indexes: its claim walks the
    # role claim indexes, still bound to it.
    with Coordinator.open(target) as c:
        c.heartbeat("w", roles=["gpu"], readings={"memory_used_pct": 10})
        theirs = [c.enqueue("k", {}, tenant="bob", priority=0, role=role)["job_id"]
                  for role in (None, "gpu")]
        mine = [c.enqueue("k", {}, role=role)["job_id"] for role in (None, "gpu")]
        for kinds in (None, ["k"]):
            got = c.claim("w", tenant="default", kinds=kinds)["job"]
            assert got is not None and got["tenant"] == "default" and got["job_id"] in mine
        assert c.claim("w", tenant="default")["job"] is None
        assert c.claimable("w", tenant="default") is False
        assert {c.claim("w", tenant="bob")["job"]["job_id"] for _ in theirs} == set(theirs)


def _scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every plan node below `node` (itself included) that reads the jobs table."""
    out = [node] if node.get("Relation Name") == "jobs" else []
    for child in node.get("Plans", []):
        out += _scans(child)
    return out


def test_a_tenant_bound_claim_seeks_to_its_tenant_on_postgresql(pg_target: Target) -> None:
    with Coordinator.open(pg_target) as c:
        c.enqueue_many(_filler())
        statements = [(roles, kinds, c._candidate_sql(roles, kinds, due_only=True,
                                                      tenant="t3"))
                      for roles, kinds in SHAPES]
        statements += [(roles, kinds, c._claim_folded_sql(roles, kinds, "t3"))
                       for roles, kinds in SHAPES]
        untenanted = [c._candidate_sql(roles, kinds, due_only=True) for roles, kinds in SHAPES]
    url = pg_target.url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:  # one transaction, rolled back: the claims take nothing
        conn.execute("ANALYZE jobs")
        for roles, kinds, (text, params) in statements:
            params.update(now=2**62, maxp=3, heads=4, f=False, worker="w",
                          expires=2**62 + 1, expires_json='"x"')
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + SQL(text).postgresql,
                                params).fetchone()[0][0]["Plan"]
            conn.rollback()
            scans = _scans(plan)
            index = "ix_jobs_claim_tenant_kind" if kinds else "ix_jobs_claim_tenant"
            probes = [s for s in scans if s.get("Index Name") == index]
            # One probe per role (and "no role"), each reading at most its `heads` rows of
            # the tenant's own slice: not one of the 4,000 jobs of tenant `big` ahead of them.
            assert len(probes) == len(roles) + 1, plan
            for probe in probes:
                assert probe["Node Type"] == "Index Scan", plan
                assert probe["Index Cond"].startswith("(((tenant)::text = 't3'::text)"), plan
                assert probe["Actual Rows"] <= 4, plan
                assert probe.get("Rows Removed by Filter", 0) == 0, plan
            # Any other read of jobs is of the claimed rows by their id (the update), or a
            # default tenant's probe, never run for t3.
            for other in (s for s in scans if s not in probes and s["Node Type"] != "ModifyTable"):
                assert (("job_id" in other.get("Index Cond", "") and other["Actual Rows"] <= 4)
                        or other["Actual Loops"] == 0), plan
        for text, params in untenanted:
            params.update(now=2**62, maxp=3)
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN " + SQL(text).postgresql, params).fetchall())
            assert "ix_jobs_claim_tenant" not in plan, plan


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
            if tenant is None:
                assert len(probes) == 2, plan  # the role-less slice and the gpu slice
            else:
                # Each slice seeks in its tenant's part of a tenant claim index, beside the
                # probe for the default tenant's jobs (which the tenant indexes leave out;
                # guarded, it runs only for the default tenant).
                assert len(probes) == 4, plan
                assert sum("ix_jobs_claim_tenant" in p for p in probes) == 2, plan
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
