"""Facts that only PostgreSQL has: row locks with SKIP LOCKED, many real processes claiming
at once, the Alembic history on a populated server database, `check` and `backup` there.

Each case skips, with the reason shown, when JOBCOORD_TEST_PG_URL is unset.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from freezegun import freeze_time
from sqlalchemy import event

from jobcoord import tokens
from jobcoord.db import CORE_REVISIONS, SQL, Database, Target
from jobcoord.errors import JobcoordError
from jobcoord.maintenance import check
from jobcoord.migrate import migrate
from jobcoord.service import Coordinator, JobSpec
from jobcoord.transfer import REPORT_TABLES, canonical, rows_in_order, tables_for
from tests.sql import sql

from .conftest import PG_SKIP, PG_URL, environment, fresh_pg, run_cli
from .pg_procs import claim_once, complete_once
from .procs import run_contention

pytestmark = pytest.mark.skipif(not PG_URL, reason=PG_SKIP)
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def pg(pg_template: str) -> Iterator[Target]:
    with fresh_pg(pg_template) as t:
        yield t


def psql(target: Target) -> psycopg.Connection[Any]:
    """A plain driver connection, so the checks do not go through jobcoord's own code."""
    return psycopg.connect(target.url.replace("postgresql+psycopg://", "postgresql://"),
                           autocommit=True)


def wait_for(condition: Any, what: str, limit_s: float = 60.0) -> None:
    # A bound on waiting for setup to happen, not a timing assertion.
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


# --- the claim ------------------------------------------------------------------------------


def test_the_claim_selects_its_candidate_with_for_update_skip_locked(pg: Target) -> None:
    statements: list[str] = []
    with Coordinator.open(pg) as c:
        c.enqueue("summarize", {"doc": 1}, role="gpu")
        c.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 10}, kinds=["summarize"])
        event.listen(c.db.engine, "before_cursor_execute",
                     lambda _c, _cur, stmt, *_a: statements.append(stmt))
        assert c.claim("w1")["job"] is not None
    (candidate,) = [s for s in statements if s.startswith("WITH")]
    # The probes of the claim index read without locks; only the one row picked from their
    # heads is locked, skipping rows other claimers hold. Each CTE is MATERIALIZED so
    # PostgreSQL evaluates it exactly once (no re-run that locks more rows).
    assert candidate.count("AS MATERIALIZED (") >= 4  # two probes, candidates, pick
    assert candidate.count("FOR UPDATE SKIP LOCKED") == 1
    assert "LIMIT 1 FOR UPDATE SKIP LOCKED)" in candidate
    # The take, the lease and the event are the same statement: one round trip per claim.
    for part in ("UPDATE jobs SET status = 'running'", "INSERT INTO leases",
                 "INSERT INTO job_events"):
        assert part in candidate


def _open_transactions(target: Target) -> list[str]:
    dbname = target.url.rsplit("/", 1)[1]
    with psql(target) as conn:
        return [r[0] for r in conn.execute(
            "SELECT state FROM pg_stat_activity WHERE datname = %s AND application_name ="
            " 'jobcoord' AND state = 'idle in transaction'", (dbname,)).fetchall()]


@contextlib.contextmanager
def paused_claimer(target: Target, tmp: Path) -> Iterator[Any]:
    """A real process that took a job in its claim and stopped inside the transaction,
    holding that row's lock; SIGKILLed on the way out (the server then rolls it back)."""
    with environment(JOBCOORD_FAULT="claim.after_take:sleep=120"):
        a = SPAWN.Process(target=claim_once, args=(target, "wA", str(tmp / "a.json")))
        a.start()
    try:
        wait_for(lambda: len(_open_transactions(target)) == 1, "A to pause inside its claim")
        yield a
    finally:
        if a.is_alive():
            os.kill(a.pid, signal.SIGKILL)
        a.join(timeout=30)
        wait_for(lambda: not _open_transactions(target), "A's session to end")


def claim_in_process(target: Target, tmp: Path) -> dict[str, Any]:
    out = tmp / "b.json"
    b = SPAWN.Process(target=claim_once, args=(target, "wB", str(out)))
    b.start()
    b.join(timeout=60)
    assert b.exitcode == 0
    return json.loads(out.read_text())


def test_a_claimer_never_waits_on_the_candidate_another_claimer_holds(pg: Target,
                                                                      tmp_path: Path) -> None:
    with Coordinator.open(pg) as c:
        first = c.enqueue("work", {"n": 1}, priority=0)["job_id"]
        second = c.enqueue("work", {"n": 2}, priority=1)["job_id"]
    with paused_claimer(pg, tmp_path) as a:
        got_b = claim_in_process(pg, tmp_path)
        # B finished while A's transaction is still open: it skipped A's row, never waited.
        assert a.is_alive()
        assert len(_open_transactions(pg)) == 1
        assert got_b["job_id"] == second and got_b["epoch"] == 1
    # A died mid-claim: the server rolled its transaction back, the first job is untouched.
    with Coordinator.open(pg) as c:
        assert c.show(first)["job"]["status"] == "waiting"
        assert c.show(first)["job"]["epoch"] == 0
        assert c.show(first)["lease"] is None
        assert c.show(second)["lease"]["worker_id"] == "wB"
        assert check(c.db)["ok"]


def test_when_every_eligible_job_is_being_claimed_the_reason_says_so(pg: Target,
                                                                    tmp_path: Path) -> None:
    with Coordinator.open(pg) as c:
        only = c.enqueue("work", {"n": 1})["job_id"]
    with paused_claimer(pg, tmp_path):
        got_b = claim_in_process(pg, tmp_path)
    assert got_b["job_id"] is None
    # Not "no_matching_role": the job is one B could run, only another claim holds it.
    assert got_b["reason"] == "no_waiting_jobs"
    with Coordinator.open(pg) as c:
        assert c.show(only)["job"]["status"] == "waiting"


@pytest.mark.parametrize(("op", "point"), [
    ("complete", "completed.after_update"),
    ("complete", "completed.after_event"),
    ("complete_and_claim", "completed.after_event"),
    ("complete_and_claim", "claim.after_take"),
    ("complete_and_claim", "claim.after_event"),
])
def test_a_completer_killed_inside_its_transaction_changes_nothing(pg: Target, tmp_path: Path,
                                                                   op: str, point: str) -> None:
    with Coordinator.open(pg) as c:
        job = c.enqueue("work", {})["job_id"]
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        c.claim("w1", lease_s=300)
        nxt = c.enqueue("work", {"n": "next"})["job_id"]
        before = [c.show(job), c.show(nxt)]
    out = str(tmp_path / "done.json")
    with environment(JOBCOORD_FAULT=f"{point}:kill"):
        p = SPAWN.Process(target=complete_once, args=(pg, "w1", job, 1, out, op))
        p.start()
    p.join(timeout=60)
    assert p.exitcode == -signal.SIGKILL
    wait_for(lambda: not _open_transactions(pg), "the killed session to end")
    with Coordinator.open(pg) as c:
        # Still running under the same lease, the next job still waiting: nothing half-done.
        assert [c.show(job), c.show(nxt)] == before
        assert check(c.db)["ok"]
    p = SPAWN.Process(target=complete_once, args=(pg, "w1", job, 1, out, op))
    p.start()
    p.join(timeout=60)
    done = json.loads(Path(out).read_text())
    assert (done if op == "complete" else done["completed"])["status"] == "succeeded"


def _history(c: Coordinator) -> tuple[list[tuple[Any, ...]], ...]:
    jobs = c.db.read(lambda conn: [tuple(r) for r in sql(
        conn, "SELECT job_id, status, epoch, attempts, max_attempts, effect_started,"
        " updated_at, run_after, finished_at, result_json, provenance_json, last_error"
        " FROM jobs ORDER BY job_id")])
    leases = c.db.read(lambda conn: [tuple(r) for r in sql(
        conn, "SELECT job_id, worker_id, epoch, granted_at, expires_at FROM leases"
        " ORDER BY job_id")])
    events = c.db.read(lambda conn: [tuple(r) for r in sql(
        conn, "SELECT event_id, job_id, at, from_status, to_status, reason, worker_id, epoch,"
        " detail FROM job_events ORDER BY event_id")])
    return jobs, leases, events


def _transitions(c: Coordinator) -> tuple[list[tuple[Any, ...]], ...]:
    """Every folded transition and its refusals, on a frozen clock."""
    with freeze_time("2026-03-01 09:00:00") as clock:
        a = c.enqueue("work", {"n": 1})["job_id"]
        b = c.enqueue("work", {"n": 2}, priority=0)["job_id"]
        d = c.enqueue("work", {"n": 3}, max_attempts=1)["job_id"]
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        got = c.claim("w1", lease_s=60)
        assert got["job"]["job_id"] == b
        clock.tick(1.5)
        nxt = c.complete_and_claim(b, "w1", 1, {"ok": True}, provenance={"model": "m"},
                                   lease_s=60)["next"]
        assert nxt["job"]["job_id"] == a
        with pytest.raises(JobcoordError):
            c.complete(b, "w1", 1, {"again": 1})
        c.fail(a, "w1", 1, "boom")
        clock.tick(3600)
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        again = c.claim("w1", lease_s=30)
        c.cancel(again["job"]["job_id"])
        with pytest.raises(JobcoordError):
            c.complete(again["job"]["job_id"], "w1", again["lease"]["epoch"], {})
        last = c.claim("w1", lease_s=30)
        assert last["job"]["job_id"] == d
        clock.tick(31)
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        c.reap()
        assert c.claim("w1")["job"] is None
    return _history(c)


def test_folded_transitions_write_exactly_the_rows_of_the_separate_statements(
        pg: Target, sqlite_target: Target) -> None:
    with Coordinator.open(sqlite_target) as c:
        assert not c.db.folds_transitions
        separate = _transitions(c)
    with Coordinator.open(pg) as c:
        assert c.db.folds_transitions
        folded = _transitions(c)
    assert folded == separate
    assert [e[5] for e in folded[2]] == [
        "enqueued", "enqueued", "enqueued", "claimed", "completed", "claimed",
        "complete_refused", "failed", "claimed", "cancel_requested", "cancelled", "claimed",
        "lease_expired"]


def test_the_claim_reads_the_partial_claim_index_on_postgresql(pg: Target) -> None:
    with Coordinator.open(pg) as c:
        c.enqueue_many([JobSpec("work", {"i": i}, role=f"r{i % 50}") for i in range(5000)])
        c.enqueue("work", {}, role="gpu")
        text, params = c._candidate_sql(["gpu"], None, due_only=True)
    params.update(now=2**62, maxp=3)
    with psql(pg) as conn:
        conn.execute("ANALYZE jobs")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN " + SQL(text).postgresql, params).fetchall())
    assert "ix_jobs_claim_role" in plan, plan
    assert "Seq Scan on jobs" not in plan, plan


# --- contention: 8 processes -----------------------------------------------------------------


def _contention(target: Target, tmp: Path, n_jobs: int, n_workers: int = 8,
                batch: int = 0) -> None:
    ledgers = run_contention(target, tmp, n_jobs, n_workers, batch=batch)

    errors: Counter[str] = Counter()
    for led in ledgers:
        errors.update(led["errors"])
    assert not errors, f"workers saw errors: {dict(errors)}"
    claims = Counter((j, e) for led in ledgers for j, e in led["claims"])
    assert [k for k, n in claims.items() if n > 1] == [], "a (job, epoch) was leased twice"
    accepted = Counter(j for led in ledgers for j, _ in led["completed"])
    assert len(accepted) == n_jobs and set(accepted.values()) == {1}
    assert sum(1 for led in ledgers if led["claims"]) > 1, "only one process ever claimed"
    # What the database holds, read with plain SQL.
    with psql(target) as conn:
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status"))
        assert statuses == {"succeeded": n_jobs}
        assert conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM jobs WHERE epoch <> 1").fetchone()[0] == 0
        per_reason = dict(conn.execute(
            "SELECT reason, COUNT(DISTINCT (job_id, epoch)) FROM job_events"
            " WHERE reason IN ('claimed', 'completed') GROUP BY reason"))
        rows = dict(conn.execute(
            "SELECT reason, COUNT(*) FROM job_events WHERE reason IN ('claimed', 'completed')"
            " GROUP BY reason"))
        assert per_reason == rows == {"claimed": n_jobs, "completed": n_jobs}
    with Coordinator.open(target) as c:
        assert check(c.db) == {"foreign_key_violations": [], "violations": [], "ok": True}


@pytest.mark.parametrize("batch", [0, 16], ids=["single", "batched"])
def test_eight_processes_drain_a_thousand_jobs_exactly_once(pg: Target, tmp_path: Path,
                                                           batch: int) -> None:
    _contention(pg, tmp_path, 1000, batch=batch)


@pytest.mark.slow
def test_eight_processes_drain_five_thousand_jobs_exactly_once(pg: Target,
                                                               tmp_path: Path) -> None:
    _contention(pg, tmp_path, 5000)


def test_a_submission_racing_an_uncommitted_one_with_its_key_gets_that_job(pg: Target) -> None:
    import threading

    other = psql(pg)
    other.autocommit = False
    try:
        # Another coordinator is mid-enqueue: its row (and key) exist, uncommitted.
        job_id = other.execute(
            "INSERT INTO jobs (tenant, kind, priority, payload_json, status, created_at,"
            " updated_at, run_after, attempts, max_attempts, epoch, idempotency_key)"
            " VALUES ('default', 'report', 1, '{}', 'waiting', 1, 1, 1, 0, 3, 0, 'K-2')"
            " RETURNING job_id").fetchone()[0]
        other.execute("INSERT INTO job_events (job_id, at, to_status, reason)"
                      " VALUES (%s, 1, 'waiting', 'enqueued')", (job_id,))
        got: dict[str, Any] = {}

        def submit() -> None:
            with Coordinator.open(pg) as c:
                try:
                    got["ok"] = c.enqueue("report", {}, key="K-2")
                except Exception as e:
                    got["error"] = e

        t = threading.Thread(target=submit)
        t.start()
        dbname = pg.url.rsplit("/", 1)[1]

        def blocked() -> bool:
            with psql(pg) as conn:
                return conn.execute(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s AND"
                    " application_name = 'jobcoord' AND wait_event_type = 'Lock'",
                    (dbname,)).fetchone()[0] == 1

        wait_for(lambda: blocked() or not t.is_alive(), "the submission to reach the key")
        other.commit()
        t.join(timeout=60)
    finally:
        other.close()
    assert got == {"ok": {"job_id": job_id, "created": False}}, got


# --- migrations on a populated server database ------------------------------------------------


def _populate(c: Coordinator) -> list[int]:
    c.set_limit("embed", 2, key="model")  # every core table holds rows, limits too
    tokens.create(c.db, "laptop", "worker", worker="w1")  # and tokens
    c.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 10, "user_idle_s": 9999,
                                               "on_battery": False})
    ids = [c.enqueue("summarize", {"i": i}, priority=i % 4, role="gpu", key=f"k{i}")["job_id"]
           for i in range(6)]
    first = c.claim("w1")["job"]
    c.checkpoint(first["job_id"], "w1", 1, "remote", {"remote_id": "R-17"})
    c.complete(first["job_id"], "w1", 1, {"ok": True})
    second = c.claim("w1")["job"]
    c.fail(second["job_id"], "w1", 1, "boom")
    assert c.claim("w1")["job"] is not None  # stays running, holding a lease
    return ids


def _rows(target: Target, features: set[str]) -> dict[str, list[str]]:
    db = Database.open(target)
    try:
        return db.read(lambda conn: {t.name: [canonical(t, r) for r in rows_in_order(db, conn, t)]
                                     for t in tables_for(features)})
    finally:
        db.close()


def test_artifacts_branch_up_and_down_on_a_populated_database_keeps_every_row(
        pg: Target) -> None:
    with Coordinator.open(pg) as c:
        ids = _populate(c)
        # A schedule with a handled slot (its job for a role no worker has, so it waits).
        c.add_schedule("digest", "digest", every="1s", role="nightly", overlap="skip")
        time.sleep(1.1)
        fired = c.tick_schedules()
        assert fired["fired"] == 1
        ids += fired["schedules"][0]["jobs"]
    core = _rows(pg, set())
    assert all(rows for name, rows in core.items() if name not in REPORT_TABLES)
    db = Database.open(pg)
    try:
        assert migrate(db, add={"artifacts"})["features"] == ["artifacts"]
        db.write(lambda conn: sql(
            conn, "INSERT INTO artifacts (job_id, epoch, name, location, digest, size,"
            " media_type, created_at) VALUES (:j, 1, 'out', 'objects/x', :sha, 10, 'text/plain',"
            " 1)", {"j": ids[0], "sha": "sha256:" + "0" * 64}))
        with_artifacts = _rows(pg, {"artifacts"})
        assert with_artifacts["artifacts"]
        assert {k: v for k, v in with_artifacts.items() if k != "artifacts"} == core
        assert migrate(db, remove={"artifacts"}, force=True)["features"] == []
        assert _rows(pg, set()) == core
        assert migrate(db, add={"artifacts"})["features"] == ["artifacts"]
        assert _rows(pg, {"artifacts"}) == {**core, "artifacts": []}
        assert migrate(db)["changed"] is False
    finally:
        db.close()
    with Coordinator.open(pg) as c:
        assert c.features == {"artifacts"}
        assert c.enqueue("more", {})["job_id"] == max(ids) + 1
        assert check(c.db)["ok"]


def test_migrate_creates_the_schema_on_an_empty_server_database(pg_template: str) -> None:
    # The template was itself migrated through the same history; a second run changes nothing
    # and reports the revisions both dialects share.
    with fresh_pg(pg_template) as t:
        r = run_cli(t, "migrate", "--json")
        assert r.code == 0, r.err
        assert r.json["changed"] is False
        assert r.json["revisions"] == [CORE_REVISIONS[-1]]
        assert "quick_check" not in r.json


# --- check and backup -------------------------------------------------------------------------

BREAKS = {
    "running_without_lease": "DELETE FROM leases WHERE job_id = {running}",
    "lease_epoch_differs_from_job": "UPDATE leases SET epoch = epoch + 5 WHERE job_id = {running}",
    "succeeded_without_result": "UPDATE jobs SET result_json = NULL WHERE job_id = {done}",
    "job_without_events": "DELETE FROM job_events WHERE job_id = {waiting}",
    "latest_event_differs_from_status":
        "UPDATE jobs SET status = 'cancelled' WHERE job_id = {waiting}",
}


@pytest.mark.parametrize("invariant", sorted(BREAKS))
def test_check_finds_each_broken_invariant_on_postgresql(pg: Target, invariant: str) -> None:
    with Coordinator.open(pg) as c:
        ids = _populate(c)
        running = c.jobs(status="running")["jobs"][0]["job_id"]
        done = c.jobs(status="succeeded")["jobs"][0]["job_id"]
    assert run_cli(pg, "check", "--json").json == {"foreign_key_violations": [], "violations": [],
                                                   "ok": True}
    waiting = ids[-1]
    with psql(pg) as conn:
        conn.execute(BREAKS[invariant].format(running=running, done=done, waiting=waiting))
    r = run_cli(pg, "check", "--json")
    assert r.code == 7, r.out + r.err
    found = {v["invariant"]: v["job_ids"] for v in r.json["violations"]}
    assert invariant in found
    assert r.json["ok"] is False


def test_backup_on_postgresql_points_to_pg_dump_and_writes_nothing(pg: Target,
                                                                  tmp_path: Path) -> None:
    dest = tmp_path / "copy.db"
    r = run_cli(pg, "backup", str(dest), "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "unsupported"
    assert "pg_dump" in r.json["error"]["message"]
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []


# --- one clock --------------------------------------------------------------------------------


def test_the_coordinators_clock_judges_expiry_not_the_servers(pg: Target) -> None:
    # Frozen years away from the server's clock: had SQL's now() judged, this lease would be
    # long expired at once, and the late completion below would not be refused.
    from freezegun import freeze_time

    with Coordinator.open(pg) as c, freeze_time("2020-05-01 10:00:00") as clock:
        job = c.enqueue("work", {})["job_id"]
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        got = c.claim("w1", lease_s=45)
        assert got["lease"]["expires_at"] == "2020-05-01T10:00:45Z"
        clock.tick(44)
        assert c.renew(job, "w1", 1, lease_s=45)["expires_at"] == "2020-05-01T10:01:29Z"
        clock.tick(46)
        r = run_cli(pg, "complete", str(job), "--worker", "w1", "--epoch", "1", "--json")
        assert r.code == 4 and r.json["error"]["code"] == "lease_expired"
        assert c.reap()["jobs"] == [{"job_id": job, "epoch": 1, "to": "waiting"}]


def test_no_statement_asks_the_server_for_the_time(pg: Target) -> None:
    statements: list[str] = []
    with Coordinator.open(pg) as c:
        event.listen(c.db.engine, "before_cursor_execute",
                     lambda _c, _cur, stmt, *_a: statements.append(stmt.lower()))
        job = c.enqueue("work", {}, key="k")["job_id"]
        c.heartbeat("w1", readings={"memory_used_pct": 10})
        c.claim("w1")
        c.renew(job, "w1", 1)
        c.mark_effect(job, "w1", 1)
        c.checkpoint(job, "w1", 1, "step", {})
        c.fail(job, "w1", 1, "x", effect_not_applied=True)  # back to waiting, to cancel
        c.reap()
        c.cancel(job)
        c.status()
        c.explain(job)
    assert len(statements) > 10
    for word in ("now()", "current_timestamp", "clock_timestamp", "localtimestamp",
                 "transaction_timestamp", "statement_timestamp"):
        assert not [s for s in statements if word in s], word


def test_each_connection_measures_this_hosts_clock_against_the_server(pg: Target) -> None:
    from freezegun import freeze_time

    from jobcoord.db import MAX_CLOCK_SKEW_S

    # A frozen test clock does not trip the check: it reads the system clock itself.
    with freeze_time("2001-01-01"):
        r = run_cli(pg, "status", "--json")
    assert r.code == 0, r.out + r.err
    offset = r.json["clock_offset_s"]
    assert isinstance(offset, float)
    assert abs(offset) <= MAX_CLOCK_SKEW_S


@pytest.mark.parametrize(("offset", "uncertainty", "refused"), [
    (0.0, 0.001, False),
    (0.95, 0.001, False),
    (1.2, 0.3, False),     # maybe within the limit: the round trip was slow, give the benefit
    (1.2, 0.01, True),
    (-30.0, 0.01, True),
    (3600.0, 0.01, True),
])
def test_a_host_clock_beyond_the_skew_limit_is_refused(offset: float, uncertainty: float,
                                                       refused: bool) -> None:
    from jobcoord.db import clock_skew_refusal

    err = clock_skew_refusal(offset, uncertainty, 1.0)
    assert (err is not None) == refused
    if err is not None:
        assert err.exit_code == 6 and err.code == "clock_skew"
        side = "ahead of" if offset < 0 else "behind"
        assert f"{abs(offset):.3f}s {side} the database server's" in err.message


@pytest.mark.parametrize("value", ["abc", "-1", "1e9"])
def test_an_unreadable_skew_limit_is_bad_input(pg: Target, value: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBCOORD_MAX_CLOCK_SKEW", value)
    r = run_cli(pg, "status", "--json")
    assert r.code == 2, r.out + r.err
    assert "JOBCOORD_MAX_CLOCK_SKEW" in r.json["error"]["message"]


def test_an_interrupt_during_a_statement_is_raised_as_the_interrupt_not_a_storage_error(
        pg: Target) -> None:
    """Ctrl-C while a statement ran: the driver was left mid-command, the rollback failed
    ("another command is already in progress") and the caller got StorageUnavailable
    `database_unavailable` (exit 6) instead of KeyboardInterrupt (exit 130), about one
    interrupted call in eight. Nothing was committed; the interrupt is what is raised, and
    the connection is not used again."""
    from jobcoord.service import Coordinator

    with Coordinator.open(pg) as c:
        def interrupted(conn: Any) -> None:
            conn.exec_driver_sql("INSERT INTO workers (worker_id, created_at) VALUES ('ghost', 0)")
            # A statement sent and not yet answered, as when Ctrl-C lands in its wait.
            conn.connection.driver_connection.pgconn.send_query(b"SELECT pg_sleep(0.2)")
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            c.db.write(interrupted)
        assert c.enqueue("k", {})["created"]
        assert [w["worker_id"] for w in c.workers()["workers"]] == []
