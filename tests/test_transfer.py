"""`jobcoord transfer`: a SQLite coordinator moved into PostgreSQL loses nothing.

Every case here needs PostgreSQL (the only target) and skips, with the reason shown, without
JOBCOORD_TEST_PG_URL.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.db import Database, Target
from jobcoord.errors import Refused
from jobcoord.maintenance import check
from jobcoord.metrics import JobcoordCollector
from jobcoord.migrate import migrate
from jobcoord.service import Coordinator
from jobcoord.transfer import canonical, tables_for, transfer
from tests.sql import sql
from tests.timeline import at

from .conftest import PG_SKIP, PG_URL, fresh_pg, fresh_sqlite, run_cli

READY = {"memory_used_pct": 30, "temperature_c": 50, "on_battery": False, "user_idle_s": 900}

pytestmark = pytest.mark.skipif(not PG_URL, reason=PG_SKIP)


@pytest.fixture
def pg(pg_template: str) -> Iterator[Target]:
    with fresh_pg(pg_template) as t:
        yield t


@pytest.fixture
def src(sqlite_template: str, tmp_path: Any) -> Target:
    return fresh_sqlite(sqlite_template, str(tmp_path), "source.db")


def with_artifacts(target: Target) -> None:
    db = Database.open(target)
    try:
        migrate(db, add={"artifacts"})
    finally:
        db.close()


def populate(target: Target) -> dict[str, int]:
    """Jobs in every state, a dead job with its error history, an idempotency key,
    checkpoints, two workers, a limit, a job's declared needs, a refused claim's counter and
    the latency fold. Ends at t=1000 with no live lease (one expired, unreaped)."""
    ids: dict[str, int] = {}
    with Coordinator.open(target) as c, freeze_time(at(0)) as clock:
        c.set_limit("send", 3, key="to")
        c.heartbeat("w1", roles=["gpu"], readings=READY)
        c.heartbeat("w2", roles=["cpu"], readings={"memory_used_pct": 91, "on_battery": True})
        # A schedule whose slots are all found after their 1 s windows: recorded, no job.
        c.add_schedule("digest", "digest", every="1m", window="1s")
        ids["succeeded"] = c.enqueue("summarize", {"doc": "a"}, priority=0, role="gpu")["job_id"]
        ids["dead"] = c.enqueue("embed", {"doc": "b"}, priority=1, role="gpu",
                                max_attempts=2)["job_id"]
        ids["unknown"] = c.enqueue("send", {"to": "x"}, priority=1, role="gpu")["job_id"]
        ids["running"] = c.enqueue("embed", {"doc": "c"}, priority=2, role="gpu")["job_id"]
        ids["cancelled"] = c.enqueue("embed", {"doc": "d"}, priority=3, role="gpu",
                                     needs="ram_mb=100")["job_id"]
        ids["waiting"] = c.enqueue("summarize", {"doc": "é ✓"}, priority=3, role="gpu",
                                   key="order-17", tenant="acme")["job_id"]
        got = c.claim("w1", lease_s=30)["job"]
        assert got["job_id"] == ids["succeeded"]
        c.checkpoint(got["job_id"], "w1", 1, "remote", {"remote_id": "R-17"})
        c.complete(got["job_id"], "w1", 1, {"summary": "ok", "score": 0.1})
        # The dead job: two retryable failures, both kept in its history.
        for attempt in (1, 2):
            clock.tick(60)
            c.heartbeat("w1", roles=["gpu"], readings=READY)
            got = c.claim("w1", lease_s=30)["job"]
            assert got["job_id"] == ids["dead"], got
            c.fail(got["job_id"], "w1", attempt, f"model timeout #{attempt}")
        clock.tick(10)
        got = c.claim("w1", lease_s=30)["job"]
        assert got["job_id"] == ids["unknown"]
        c.checkpoint(got["job_id"], "w1", 1, "sent", {"message_id": "M-1"})
        c.mark_effect(got["job_id"], "w1", 1)
        clock.tick(31)
        c.reap()
        c.heartbeat("w1", roles=["gpu"], readings=READY)
        got = c.claim("w1", lease_s=30)["job"]
        assert got["job_id"] == ids["running"]
        c.cancel(ids["cancelled"])
        clock.tick(100)  # the running job's lease has expired, but nobody reaped it
        ticked = c.tick_schedules()
        assert ticked["fired"] == 0 and ticked["missed"] > 0
        # A refused claim (w2 is on battery, its memory over the gate) is counted, and a
        # scrape folds the settled completion into the durable latency histogram.
        assert c.claim("w2", lease_s=30)["job"] is None
        folded = JobcoordCollector(c.db).snapshot()["latency"]
        assert folded.count + folded.without == 1  # the one completion
        statuses = {k: c.show(v)["job"]["status"] for k, v in ids.items()}
    assert statuses == {k: k for k in ids}, statuses
    return ids


def add_artifact_rows(target: Target, job_id: int) -> None:
    db = Database.open(target)
    try:
        db.write(lambda conn: sql(
            conn, "INSERT INTO artifacts (job_id, epoch, name, location, digest, size,"
            " media_type, state, created_at, verified_at) VALUES (:j, 1, :n, :loc, :sha, :size,"
            " 'application/json', :state, 1, 2)",
            {"j": job_id, "n": "summary", "loc": "objects/sha256/ab/ab/" + "ab" * 32,
             "sha": "sha256:" + "ab" * 32, "size": 12345, "state": "accepted"}))
    finally:
        db.close()


def table_rows(target: Target, features: set[str]) -> dict[str, list[str]]:
    """Every row of every table, canonical and in primary-key order."""
    from jobcoord.transfer import rows_in_order

    db = Database.open(target)
    try:
        return db.read(lambda conn: {
            t.name: [canonical(t, r) for r in rows_in_order(db, conn, t)]
            for t in tables_for(features)})
    finally:
        db.close()


def report_rows(target: Target) -> dict[str, list[tuple[Any, ...]]]:
    """The refused claims' counters and the latency fold, read with plain SQL."""
    db = Database.open(target)
    try:
        return db.read(lambda conn: {
            "claim_refusals": [tuple(r) for r in conn.exec_driver_sql(
                "SELECT worker_id, reason, n, last_at FROM claim_refusals"
                " ORDER BY worker_id, reason").all()],
            "metric_folds": [tuple(r) for r in conn.exec_driver_sql(
                "SELECT name, last_event_id, state_json, updated_at FROM metric_folds"
                " ORDER BY name").all()]})
    finally:
        db.close()


# --- the happy path ---------------------------------------------------------------------


@pytest.mark.parametrize("features", [set(), {"artifacts"}], ids=["core", "with_artifacts"])
def test_transfer_copies_every_row_of_every_table(src: Target, pg: Target,
                                                  features: set[str]) -> None:
    if features:
        with_artifacts(src)
        with_artifacts(pg)
    ids = populate(src)
    if features:
        add_artifact_rows(src, ids["succeeded"])
        # Rows naming objects go with their store: an empty one (its objects lost) here.
        os.makedirs(f"{src.sqlite_path}.artifacts/objects")
    make_tokens(src)
    before = table_rows(src, features)
    reports = report_rows(src)
    assert all(reports.values()), reports
    with freeze_time(at(1000)):
        r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 0, r.out + r.err
    assert report_rows(pg) == reports
    out = r.json
    assert out["verified"] is True
    assert out["features"] == sorted(features)
    after = table_rows(pg, features)
    assert set(after) == {"workers", "jobs", "leases", "job_events", "checkpoints", "tokens",
                          "schedules", "schedule_fires", "limits", "claim_refusals",
                          "metric_folds", *(["artifacts"] if features else [])}
    for name, rows in before.items():
        assert rows, f"{name} should have been populated"
        assert after[name] == rows, name  # row by row, ids and epochs included
        assert out["tables"][name]["rows"] == len(rows)
    # The source is untouched.
    assert table_rows(src, features) == before


def test_every_job_reads_the_same_through_the_api_after_the_move(src: Target,
                                                                 pg: Target) -> None:
    ids = populate(src)
    with freeze_time(at(1000)):
        assert run_cli(src, "transfer", "--to", pg.url).code == 0
        with Coordinator.open(src) as old, Coordinator.open(pg) as new:
            for job_id in ids.values():
                assert new.show(job_id) == old.show(job_id)
            assert new.workers() == old.workers()
            dead = new.show(ids["dead"])
            errors = [e["detail"]["error"] for e in dead["events"] if e["reason"] == "failed"]
            assert errors == ["model timeout #1", "model timeout #2"]
            assert dead["job"]["last_error"] == "model timeout #2"
            assert check(new.db)["ok"]


def make_tokens(target: Target) -> dict[str, str]:
    """A live worker token, a live submitter token and a revoked one: name -> secret."""
    from jobcoord import tokens

    db = Database.open(target)
    try:
        made = {name: tokens.create(db, name, role, tenant=tenant, worker=worker)["token"]
                for name, role, tenant, worker in (
                    ("laptop", "worker", "acme", "laptop"), ("ci", "submitter", "acme", None),
                    ("lost", "viewer", None, None))}
        tokens.revoke(db, "lost")
        return made
    finally:
        db.close()


def test_tokens_move_with_the_database_hashes_only(src: Target, pg: Target) -> None:
    from jobcoord import tokens

    populate(src)
    made = make_tokens(src)
    with freeze_time(at(1000)):
        assert run_cli(src, "transfer", "--to", pg.url).code == 0
    db = Database.open(pg)
    try:
        # Every secret works as it did, revoked stays revoked; no secret is stored.
        assert tokens.authenticate(db, made["laptop"]) == tokens.Identity(
            "laptop", "worker", "acme", "laptop")
        assert tokens.authenticate(db, made["ci"]).role == "submitter"  # type: ignore[union-attr]
        assert tokens.authenticate(db, made["lost"]) is None
        rows = repr(table_rows(pg, set())["tokens"])
        assert not any(secret in rows for secret in made.values())
        # New tokens continue after the copied ids.
        tokens.create(db, "desktop", "worker", worker="desktop")
        assert [t["name"] for t in tokens.list_tokens(db)["tokens"]] == [
            "ci", "desktop", "laptop", "lost"]
    finally:
        db.close()


def test_acceptance_and_idempotency_contracts_survive_the_move(src: Target, pg: Target) -> None:
    ids = populate(src)
    with freeze_time(at(1000)):
        assert run_cli(src, "transfer", "--to", pg.url).code == 0
    with Coordinator.open(pg) as c, freeze_time(at(1001)):
        again = c.enqueue("summarize", {"doc": "é ✓"}, priority=3, role="gpu", key="order-17",
                          tenant="acme")
        assert again == {"job_id": ids["waiting"], "created": False}
        conflict = run_cli(pg, "enqueue", "summarize", "--payload", '{"doc": "other"}',
                           "--key", "order-17", "--tenant", "acme", "--json")
        assert conflict.code == 4
        assert conflict.json["error"]["code"] == "idempotency_conflict"
        # New ids continue after the copied ones: the sequences were moved on.
        fresh = c.enqueue("summarize", {"doc": "new"}, role="cpu")
        assert fresh["created"] and fresh["job_id"] == max(ids.values()) + 1
        events = c.show(fresh["job_id"])["events"]
        old_max = max(e["event_id"] for j in ids.values() for e in c.show(j)["events"])
        assert events[0]["event_id"] == old_max + 1
        # The expired lease copied from SQLite is reaped on PostgreSQL like any other.
        reaped = c.reap()
        assert [j["job_id"] for j in reaped["jobs"]] == [ids["running"]]
        # Epochs continue: the next claim of that job fences out the old owner.
        c.heartbeat("w9", roles=["gpu"], readings=READY)
        got = c.claim("w9")
        assert got["job"]["job_id"] == ids["running"]
        assert got["lease"]["epoch"] == 2
        assert check(c.db)["ok"]


# --- refusals: each leaves the target as it was -----------------------------------------------


def _count_jobs(target: Target) -> int:
    db = Database.open(target)
    try:
        return db.read(lambda conn: sql(conn, "SELECT COUNT(*) FROM jobs").scalar_one())
    finally:
        db.close()


@pytest.mark.parametrize("way", ["to_postgresql", "back_to_sqlite"])
def test_ctrl_c_after_the_copy_committed_says_it_committed_not_rolled_back(
        src: Target, pg: Target, way: str) -> None:
    """A Ctrl-C after the commit (during the check against the source) printed "the write
    under way was rolled back", exit 130: the target held the whole copy, unchecked, and a
    second transfer was refused as target_not_empty. The answer now says what the target
    holds: committed (details committed: true), check it."""
    import json
    import signal
    import subprocess
    import sys
    import time

    source, target = (src, pg) if way == "to_postgresql" else (pg, src)
    with Coordinator.open(source) as c:
        for i in range(5):
            c.enqueue("k", {"i": i})
    flag = ["--db", source.sqlite_path] if source.sqlite_path else ["--url", source.url]
    to = target.url if target.sqlite_path is None else f"sqlite:///{target.sqlite_path}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", *flag, "transfer", "--to", to, "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "transfer.after_commit:sleep=30"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the copy is committed once the target shows its jobs
            with Coordinator.open(target) as t:
                if t.jobs()["jobs"]:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    error = json.loads(out)["error"]
    assert error["code"] == "interrupted" and error["details"]["committed"] is True, error
    assert "rolled back" not in error["message"] and "jobcoord check" in error["message"]
    with Coordinator.open(target) as t:
        assert len(t.jobs()["jobs"]) == 5


def test_ctrl_c_before_the_copy_committed_says_the_target_is_empty(src: Target,
                                                                  pg: Target) -> None:
    import json
    import signal
    import subprocess
    import sys
    import time

    with Coordinator.open(src) as c:
        c.enqueue("k", {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", src.sqlite_path or "", "transfer", "--to",
         pg.url, "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "transfer.after_empty_check:sleep=30"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # past loading and opening: it sits inside the copy's transaction
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    error = json.loads(out)["error"]
    assert error["details"]["committed"] is False and "rolled back" in error["message"]
    with Coordinator.open(pg) as t:
        assert t.jobs()["jobs"] == []


def test_transfer_refuses_while_a_worker_holds_a_live_lease(src: Target, pg: Target) -> None:
    populate(src)
    with Coordinator.open(src) as c, freeze_time(at(1000)):
        c.heartbeat("w1", roles=["gpu"], readings=READY)
        c.reap()
        held = c.claim("w1", lease_s=60)["job"]
    with freeze_time(at(1030)):
        r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 4, r.out + r.err
    assert r.json["error"]["code"] == "active_leases"
    assert "--allow-active-leases" in r.json["error"]["message"]
    assert _count_jobs(pg) == 0
    # Told to, it copies the lease as it is.
    with freeze_time(at(1030)):
        r = run_cli(src, "transfer", "--to", pg.url, "--allow-active-leases", "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["active_leases_copied"] == 1
    with Coordinator.open(pg) as c:
        assert c.show(held["job_id"])["lease"]["worker_id"] == "w1"


def test_transfer_refuses_a_target_that_already_holds_data(src: Target, pg: Target) -> None:
    populate(src)
    with Coordinator.open(pg) as c:
        c.enqueue("other", {"x": 1})
    before = table_rows(pg, set())
    with freeze_time(at(1000)):
        r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "target_not_empty"
    assert "jobs (1 rows)" in r.json["error"]["message"]
    assert table_rows(pg, set()) == before


def test_transfer_refuses_an_unmigrated_target(src: Target) -> None:
    populate(src)
    with fresh_pg(None) as bare, freeze_time(at(1000)):
        r = run_cli(src, "transfer", "--to", bare.url, "--json")
        assert r.code == 8, r.out + r.err
        assert r.json["error"]["code"] == "not_migrated"
        db = Database.open(bare)
        try:
            tables = db.read(lambda conn: sql(
                conn, "SELECT COUNT(*) FROM information_schema.tables"
                " WHERE table_schema = 'public'").scalar_one())
        finally:
            db.close()
        assert tables == 0


def test_transfer_refuses_a_target_without_the_artifacts_the_source_uses(
        src: Target, pg: Target) -> None:
    with_artifacts(src)
    populate(src)
    with freeze_time(at(1000)):
        r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 8, r.out + r.err
    assert r.json["error"]["code"] == "feature_missing"
    assert "--with artifacts" in r.json["error"]["message"]
    assert _count_jobs(pg) == 0


def test_transfer_refuses_a_sqlite_target(src: Target, tmp_path: Any,
                                          sqlite_template: str) -> None:
    populate(src)
    other = fresh_sqlite(sqlite_template, str(tmp_path), "other.db")
    r = run_cli(src, "transfer", "--to", other.url, "--json")
    assert r.code == 2, r.out + r.err
    assert "must be PostgreSQL" in r.json["error"]["message"]
    assert _count_jobs(other) == 0


def test_transfer_between_two_postgresql_databases_is_refused(pg: Target,
                                                              pg_template: str) -> None:
    with fresh_pg(pg_template) as other:
        r = run_cli(pg, "transfer", "--to", other.url, "--json")
    assert r.code == 2, r.out + r.err
    assert "pg_dump" in r.json["error"]["message"]


@pytest.mark.parametrize("features", [set(), {"artifacts"}], ids=["core", "with_artifacts"])
def test_transfer_back_from_postgresql_into_sqlite_copies_every_row(
        pg: Target, sqlite_template: str, tmp_path: Any, features: set[str]) -> None:
    """The way back: every table row by row, tokens included (hashes only), and a token
    made on PostgreSQL works against the SQLite file."""
    from jobcoord import tokens

    back = fresh_sqlite(sqlite_template, str(tmp_path), "back.db")
    if features:
        with_artifacts(pg)
        with_artifacts(back)
    ids = populate(pg)
    if features:
        add_artifact_rows(pg, ids["succeeded"])
    made = make_tokens(pg)
    before = table_rows(pg, features)
    reports = report_rows(pg)
    assert all(reports.values()), reports
    with freeze_time(at(1000)):
        r = run_cli(pg, "transfer", "--to", back.url, "--json")
    assert r.code == 0, r.out + r.err
    assert report_rows(back) == reports
    assert r.json["verified"] is True
    after = table_rows(back, features)
    assert set(after) == set(before)
    for name, rows in before.items():
        assert rows, f"{name} should have been populated"
        assert after[name] == rows, name
    assert table_rows(pg, features) == before  # the source is untouched
    db = Database.open(back)
    try:
        assert tokens.authenticate(db, made["laptop"]).worker_id == "laptop"  # type: ignore[union-attr]
        assert tokens.authenticate(db, made["lost"]) is None
    finally:
        db.close()
    with Coordinator.open(back) as c, freeze_time(at(1000)):
        for job_id in ids.values():
            assert c.show(job_id)["job"]["status"] in ids  # each job keeps its status
        assert c.enqueue("k", {})["job_id"] > max(ids.values())  # new ids continue
        assert check(c.db)["ok"]


def test_a_write_to_postgresql_during_the_copy_back_is_reported(
        pg: Target, sqlite_template: str, tmp_path: Any) -> None:
    back = fresh_sqlite(sqlite_template, str(tmp_path), "back.db")
    populate(pg)

    def write() -> None:
        with Coordinator.open(pg) as c:
            c.enqueue("late", {})

    with Coordinator.open(pg) as src, freeze_time(at(1000)), pytest.raises(Refused) as e:
        transfer(src.db, src.features, back, after_snapshot=write)
    assert e.value.code == "source_changed"


def test_transfer_to_an_unreachable_server_is_storage_unavailable(src: Target) -> None:
    r = run_cli(src, "transfer", "--to", "postgresql+psycopg://postgres@127.0.0.1:1/x",
                "--json")
    assert r.code == 6, r.out + r.err
    assert r.json["error"]["code"] == "database_unavailable"
    assert "Traceback" not in r.err


# --- the source side: a snapshot, never the write lock -------------------------------------


def test_transfer_reads_the_source_without_its_write_lock(src: Target, pg: Target) -> None:
    populate(src)
    assert src.sqlite_path is not None
    holder = sqlite3.connect(src.sqlite_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process is mid-write
    try:
        with freeze_time(at(1000)):
            r = run_cli(src, "--busy-timeout", "0.2", "transfer", "--to", pg.url, "--json")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.code == 0, r.out + r.err


def test_a_write_to_the_source_during_the_copy_is_reported_not_lost_silently(
        src: Target, pg: Target) -> None:
    ids = populate(src)
    assert src.sqlite_path is not None

    def late_submission() -> None:
        other = sqlite3.connect(src.sqlite_path, isolation_level=None)
        try:
            other.execute("UPDATE workers SET heartbeat_raw = 'late' WHERE worker_id = 'w1'")
        finally:
            other.close()

    source = Coordinator.open(src)
    try:
        with freeze_time(at(1000)), pytest.raises(Exception) as err:
            transfer(source.db, source.features, pg, after_snapshot=late_submission)
    finally:
        source.close()
    assert getattr(err.value, "code", None) == "source_changed"
    # The target holds the snapshot as of the start, complete and consistent.
    assert _count_jobs(pg) == len(ids)
    rows = table_rows(pg, set())
    assert not any("late" in r for r in rows["workers"])


def test_tables_larger_than_one_batch_are_copied_whole(src: Target, pg: Target) -> None:
    from jobcoord.service import JobSpec
    from jobcoord.transfer import BATCH_ROWS

    n = 2 * BATCH_ROWS + 345
    with Coordinator.open(src) as c:
        c.enqueue_many([JobSpec("work", {"i": i}, priority=i % 4, key=f"k{i}")
                        for i in range(n)])
    r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["tables"]["jobs"]["rows"] == n
    assert r.json["next_ids"]["jobs"] == n + 1
    assert table_rows(pg, set()) == table_rows(src, set())


def test_a_damaged_source_is_refused_and_nothing_is_copied(src: Target, pg: Target) -> None:
    with Coordinator.open(src) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i, "pad": "x" * 200}}
                        for i in range(3000)])
    path = src.sqlite_path
    assert path
    with sqlite3.connect(path) as conn:  # everything in the main file, nothing in the -wal
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(path, "r+b") as f:  # a page in the middle of the jobs table's b-tree
        f.seek(100 * page)
        f.write(b"\xa5" * page)
    r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 7, r.out
    assert r.json["error"]["code"] == "database_corrupt"
    with Coordinator.open(pg) as target:
        assert target.status()["jobs"]["waiting"] == 0


def test_a_source_with_rows_whose_job_is_gone_is_exit_7_and_nothing_is_copied(
        src: Target, pg: Target) -> None:
    """A job deleted by hand leaves its events behind (`check` lists them under
    foreign_key_violations); the transfer copied until PostgreSQL's foreign key refused,
    exit 1 `internal_error` quoting the driver. It is found while the source is read, before
    the target is touched: exit 7 naming the table, the target left empty."""
    with Coordinator.open(src) as c:
        gone = c.enqueue("k", {})["job_id"]
        c.enqueue("k", {})
    path = src.sqlite_path
    assert path
    with sqlite3.connect(path) as conn:  # (a plain connection: foreign keys not enforced)
        # A table of the user's own, never copied, with an orphan of its own: not judged.
        conn.execute("CREATE TABLE mine_parent (id INTEGER PRIMARY KEY)")
        conn.execute("CREATE TABLE mine (b INTEGER REFERENCES mine_parent(id))")
        conn.execute("INSERT INTO mine VALUES (7)")
    with Coordinator.open(src) as c:
        c.show(gone)
    assert run_cli(src, "transfer", "--to", pg.url, "--json").code == 0
    with Coordinator.open(pg) as target:
        assert len(target.jobs()["jobs"]) == 2
        with target.db.engine.begin() as conn:  # (emptied again for the case below)
            for table in ("job_events", "jobs", "job_counts"):
                conn.exec_driver_sql(f"DELETE FROM {table}")
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM jobs WHERE job_id = ?", (gone,))
    r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "database_corrupt", r.json
    assert "job_events" in r.json["error"]["message"], r.json
    assert "mine" not in r.json["error"]["message"], r.json
    assert r.json["error"]["details"]["foreign_key_violations"], r.json
    with Coordinator.open(pg) as target:
        assert target.jobs()["jobs"] == []


@pytest.mark.parametrize("direction", ["sqlite_to_postgresql", "postgresql_to_sqlite"])
def test_a_source_check_finds_fault_with_is_exit_7_and_nothing_is_copied(
        src: Target, pg: Target, sqlite_template: str, tmp_path: Any, direction: str) -> None:
    """A source `check` finds fault with (here a job whose events were deleted by hand:
    job_without_events) was copied, exit 0, and the target held the damage. The source is
    judged as `check` judges it, in the snapshot copied: exit 7 naming the finding, the
    target left empty."""
    from sqlalchemy import text

    source, target = ((src, pg) if direction == "sqlite_to_postgresql" else
                      (pg, fresh_sqlite(sqlite_template, str(tmp_path), "back.db")))
    with Coordinator.open(source) as c:
        bare = c.enqueue("k", {})["job_id"]
        c.enqueue("k", {})
        with c.db.engine.begin() as conn:
            conn.execute(text("DELETE FROM job_events WHERE job_id = :j"), {"j": bare})
    found = run_cli(source, "check", "--json")
    assert found.code == 7 and "job_without_events" in found.out, found
    r = run_cli(source, "transfer", "--to", target.url, "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "database_corrupt", r.json
    assert "job_without_events" in r.json["error"]["message"], r.json
    with Coordinator.open(target) as t:
        assert t.jobs()["jobs"] == []


def test_a_postgresql_source_without_a_foreign_key_is_exit_7_naming_it(
        pg: Target, sqlite_template: str, tmp_path: Any) -> None:
    """A foreign key dropped by hand on PostgreSQL let a job be deleted under its events;
    `check` said ok and the transfer back copied until SQLite's foreign keys refused, exit 1
    `internal_error` ("FOREIGN KEY constraint failed"). Both name the key: exit 7, and the
    SQLite target is left empty."""
    from sqlalchemy import text

    back = fresh_sqlite(sqlite_template, str(tmp_path), "back.db")
    with Coordinator.open(pg) as c:
        gone = c.enqueue("k", {})["job_id"]
        c.enqueue("k", {})
        with c.db.engine.begin() as conn:
            conn.execute(text("ALTER TABLE job_events DROP CONSTRAINT "
                              "fk_job_events_job_id_jobs"))
            conn.execute(text("DELETE FROM jobs WHERE job_id = :j"), {"j": gone})
    r = run_cli(pg, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "schema_object_missing"]
    assert [o["name"] for o in found["objects"]] == ["fk_job_events_job_id_jobs"], found
    r = run_cli(pg, "transfer", "--to", back.url, "--json")
    assert r.code == 7, r
    assert "fk_job_events_job_id_jobs" in r.json["error"]["message"], r.json
    with Coordinator.open(back) as target:
        assert target.jobs()["jobs"] == []


def test_a_postgresql_source_with_rows_whose_job_is_gone_is_exit_7_and_nothing_is_copied(
        pg: Target, sqlite_template: str, tmp_path: Any) -> None:
    """A job deleted on PostgreSQL with its triggers off (session_replication_role =
    replica, its foreign key still there) left its events: `check` said ok and the transfer
    back copied until SQLite's foreign keys refused, exit 1 `internal_error`. Found in the
    source's snapshot: exit 7 naming the table, the SQLite target left empty."""
    from sqlalchemy import text

    back = fresh_sqlite(sqlite_template, str(tmp_path), "back.db")
    with Coordinator.open(pg) as c:
        gone = c.enqueue("k", {})["job_id"]
        c.enqueue("k", {})
        with c.db.engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text("DELETE FROM jobs WHERE job_id = :j"), {"j": gone})
    r = run_cli(pg, "transfer", "--to", back.url, "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "database_corrupt", r.json
    assert "job_events" in r.json["error"]["message"], r.json
    assert r.json["error"]["details"]["foreign_key_violations"], r.json
    with Coordinator.open(back) as target:
        assert target.jobs()["jobs"] == []


def test_a_sqlite_source_table_made_again_without_its_foreign_key_is_exit_7_naming_it(
        src: Target, pg: Target) -> None:
    """job_events made again by hand without its foreign key, then a job deleted under its
    events: SQLite's foreign_key_check has no key to check, `check` said ok, and the
    transfer copied until PostgreSQL's foreign key refused, exit 1. The key is found
    missing by its columns: exit 7 naming it, the target left empty."""
    from tests.test_check import _without_foreign_key

    with Coordinator.open(src) as c:
        gone = c.enqueue("k", {})["job_id"]
        c.enqueue("k", {})
        statements = _without_foreign_key(c, "job_events")
    path = src.sqlite_path
    assert path
    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)
        conn.execute("DELETE FROM jobs WHERE job_id = ?", (gone,))
    r = run_cli(src, "check", "--json")
    assert r.code == 7, r
    r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 7, r
    assert "fk_job_events_job_id_jobs" in r.json["error"]["message"], r.json
    with Coordinator.open(pg) as target:
        assert target.jobs()["jobs"] == []


@pytest.mark.parametrize(("column", "value"), [
    ("created_at", "x"), ("kind", "a\x00b"), ("kind", b"k"), ("priority", 1.5)])
def test_a_source_value_no_postgresql_column_holds_is_exit_7_and_nothing_is_copied(
        src: Target, pg: Target, column: str, value: Any) -> None:
    """Text in a time column, NUL in text, bytes in text, a fraction in a whole number, all
    kept by SQLite when written by hand: the transfer was exit 1 (a ValueError, or the
    driver's refusal mid-copy). It is exit 7 naming the table and column, the target empty."""
    with Coordinator.open(src) as c:
        c.enqueue("k", {})
    path = src.sqlite_path
    assert path
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA ignore_check_constraints = 1")
        conn.execute(f"UPDATE jobs SET {column} = ?", (value,))
    r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "value_of_wrong_type", r.json
    assert r.json["error"]["details"]["column"] == column, r.json
    with Coordinator.open(pg) as target:
        assert target.status()["jobs"].get("waiting", 0) == 0


@pytest.mark.parametrize(("table", "column"), [("jobs", "epoch"), ("leases", "epoch"),
                                             ("jobs", "max_attempts")])
def test_a_source_integer_past_its_postgresql_column_is_exit_7_naming_it(
        src: Target, pg: Target, table: str, column: str) -> None:
    """SQLite keeps any 64-bit integer; PostgreSQL's `integer` column stops at 2**31 - 1.
    An epoch past it (written by hand) failed the transfer mid-copy: exit 7 naming no table,
    column or row, and the driver's "error ignored terminating Pipeline" on stderr. It is
    refused before anything is written, naming the table and column, the target empty."""
    with Coordinator.open(src) as c:
        c.heartbeat("w1")
        c.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(400)])
        c.claim("w1")
    path = src.sqlite_path
    assert path
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {table} SET {column} = 3000000000 WHERE job_id = 1")
    r = run_cli(src, "transfer", "--to", pg.url, "--json", "--allow-active-leases")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "value_out_of_range", r.json
    assert (r.json["error"]["details"]["table"], r.json["error"]["details"]["column"]) == (
        table, column), r.json
    assert "3000000000" in r.json["error"]["message"]
    assert "Pipeline" not in r.err and "ignored" not in r.err, r.err
    with Coordinator.open(pg) as target:
        assert target.status()["jobs"].get("waiting", 0) == 0


def an_accepted_artifact(src: Target, pg: Target, store: str) -> None:
    """Both databases with the artifacts feature; in the source, a job whose artifact was
    accepted into `store`."""
    with_artifacts(src)
    with_artifacts(pg)
    with Coordinator.open(src) as c:
        c.artifacts_dir = store
        c.heartbeat("w")
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w")["lease"]["epoch"]
        c.put_artifact(job, "w", epoch, "f.txt", b"precious bytes")
        c.complete(job, "w", epoch, {})


def test_a_transfer_records_the_new_database_in_the_store_before_it_copies(
        src: Target, pg: Target, tmp_path: Any) -> None:
    """After `transfer` the PostgreSQL database references the store's objects, but the
    store recorded only the SQLite one until PostgreSQL's first put or gc: a gc from the
    old SQLite database (a timer still running) deleted an accepted artifact only
    PostgreSQL still referenced. The transfer records the new database first: that gc is
    refused (`artifact_store_shared`)."""
    store = str(tmp_path / "store")
    an_accepted_artifact(src, pg, store)
    r = run_cli(src, "--artifacts", store, "transfer", "--to", pg.url, "--json")
    assert r.code == 0, r.out + r.err
    with Coordinator.open(src) as c:  # the old database forgets the job: gc would take it
        c.artifacts_dir = store
        c.enqueue("k", {})  # (prune keeps the newest job)
        with freeze_time("2100-01-01"):
            assert c.prune("1d")["jobs"] == 1
    r = run_cli(src, "--artifacts", store, "artifact", "gc", "--grace", "0s", "--json")
    assert r.code == 4 and r.json["error"]["code"] == "artifact_store_shared", r.out
    with Coordinator.open(pg) as c:
        c.artifacts_dir = store
        assert c.verify_artifacts()["ok"]


def test_a_source_whose_store_records_it_under_another_name_is_transferred(
        src: Target, pg: Target, tmp_path: Any) -> None:
    """The source's store holds its objects but records it under another name (the file
    moved with its store) beside another database: it is the source's store, and the
    transfer goes on, recording the new database there."""
    import shutil

    from jobcoord.artifacts import ObjectStore
    from jobcoord.artifacts.settings import record_user, store_users

    store = str(tmp_path / "store")
    an_accepted_artifact(src, pg, store)
    shutil.rmtree(os.path.join(store, "databases"))
    record_user(ObjectStore(store), "sqlite:" + str(tmp_path / "where it was.db"))
    record_user(ObjectStore(store), "sqlite:" + str(tmp_path / "another.db"))
    r = run_cli(src, "--artifacts", store, "transfer", "--to", pg.url, "--json")
    assert r.code == 0, r.out + r.err
    assert len(store_users(ObjectStore(store))) == 3


@pytest.mark.parametrize("store", ["mistyped", "another database's"])
def test_a_transfer_through_a_store_not_the_sources_is_refused_copying_nothing(
        src: Target, pg: Target, tmp_path: Any, store: str) -> None:
    """`transfer` with `--artifacts` mistyped recorded the new database nowhere, or with
    another database's store recorded it there, and said ok: a gc from the old database
    then deleted what only the new one referenced. Refused `artifact_store_missing` (exit
    2), nothing copied, no record written."""
    from jobcoord.artifacts import ObjectStore
    from jobcoord.artifacts.settings import record_user

    an_accepted_artifact(src, pg, str(tmp_path / "store"))
    wrong = str(tmp_path / "stor #?%")
    if store != "mistyped":
        ObjectStore(wrong).put(b"another database's object")
        record_user(ObjectStore(wrong), "sqlite:" + str(tmp_path / "other.db"))
    before = sorted(str(p) for p in tmp_path.rglob("*") if p.name != "gc.lock")
    r = run_cli(src, "--artifacts", wrong, "transfer", "--to", pg.url, "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "artifact_store_missing", r.json
    # Only a store not there can be made again (a store lost for good), not another's.
    assert ("changed. A store lost for good: make an empty one there" in
            r.json["error"]["message"]) == (store == "mistyped"), r.json
    assert sorted(str(p) for p in tmp_path.rglob("*") if p.name != "gc.lock") == before
    with Coordinator.open(pg) as c:
        assert c.jobs()["jobs"] == []
    if store == "mistyped":
        # The advice followed (the store lost for good): an empty one made, the transfer
        # goes ahead. (An `objects/` without `sha256/` was then refused as a volume not
        # mounted, exit 6: the advice led nowhere.)
        os.makedirs(os.path.join(wrong, "objects"))
        r = run_cli(src, "--artifacts", wrong, "transfer", "--to", pg.url, "--json")
        assert r.code == 0, r.out + r.err


@pytest.mark.parametrize("what", ["table", "column"])
@pytest.mark.parametrize("damaged", ["source", "target"])
def test_transfer_refuses_a_database_missing_a_table_naming_it(src: Target, pg: Target,
                                                               damaged: str, what: str) -> None:
    """A table or column dropped by hand in the source or the target: `no such table` was
    an internal error (exit 1) one way and `not_migrated` naming no table (exit 8) the
    other; a column was exit 1 too. It is exit 7 `table_missing` / `column_missing` naming
    it, and nothing is copied."""
    from sqlalchemy import text

    populate(src)
    with Coordinator.open(src if damaged == "source" else pg) as c, \
            c.db.engine.begin() as conn:
        conn.execute(text("DROP TABLE limits" if what == "table"
                          else "ALTER TABLE workers DROP COLUMN created_at"))
    r = run_cli(src, "transfer", "--to", pg.url, "--json")
    assert r.code == 7, r.out + r.err
    assert r.json["error"]["code"] == f"{what}_missing", r.json
    assert r.json["error"]["details"] == (
        {"tables": ["limits"]} if what == "table" else {"columns": ["workers.created_at"]})
    assert damaged in r.json["error"]["message"]
    assert _count_jobs(pg) == 0
