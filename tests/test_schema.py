"""What the schema itself enforces: the constraints refuse what the rules forbid, and the claim
reads its partial index instead of scanning."""

from __future__ import annotations

import sqlite3

import pytest

from jobcoord.db import Target
from jobcoord.maintenance import check
from jobcoord.service import Coordinator


def test_the_claim_reads_the_claim_index_instead_of_scanning(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    for kinds in (None, ["summarize", "embed"]):
        text, params = c._candidate_sql(["gpu", "cpu"], kinds, due_only=True)
        params.update(now=0, maxp=3)
        plan = c.db.read(lambda conn, text=text, params=params: [
            r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + text, params).all()])
        searches = [p for p in plan if "jobs" in p and ("SEARCH" in p or "SCAN" in p)]
        assert searches, plan
        assert all("USING INDEX ix_jobs_claim_" in p for p in searches), plan
        assert not any(p.startswith("SCAN jobs") for p in plan), plan
    c.close()


def test_the_schema_refuses_what_the_rules_forbid(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    c.heartbeat("w1", readings={"user_idle_s": 9999})
    job = c.enqueue("k", {}, key="same")["job_id"]
    c.claim("w1")
    raw = sqlite3.connect(sqlite_target.sqlite_path or "", isolation_level=None)
    raw.execute("PRAGMA foreign_keys=ON")
    bad = [
        "UPDATE jobs SET priority = 4",
        "UPDATE jobs SET priority = 'high'",
        "UPDATE jobs SET status = 'bogus'",
        f"INSERT INTO leases VALUES ({job}, 'w2', 2, 1, 2)",  # a second lease for one job
        "INSERT INTO leases VALUES (999, 'w2', 1, 1, 2)",  # a lease for no job
        "INSERT INTO jobs (tenant, kind, priority, payload_json, status, created_at, updated_at,"
        " run_after, idempotency_key) VALUES ('default', 'k', 1, '{}', 'waiting', 1, 1, 1,"
        " 'same')",
    ]
    for sql in bad:
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute(sql)
    raw.close()
    assert check(c.db)["ok"]
    c.close()
