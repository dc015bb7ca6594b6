"""Core revision c0004: job counts kept by triggers, claim refusal counters, the durable
latency fold and the reports' indexes. A populated c0003 database upgrades in place (its
counts filled, its completed events folded once, every row intact) and downgrades back; the
counts equal a count of the jobs table after every path that writes jobs, on both
databases, also with threads writing at once."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import inspect

from jobcoord.clock import MICROS, iso, now_us
from jobcoord.db import CORE_REVISIONS, Database, Target
from jobcoord.maintenance import check
from jobcoord.metrics import LATENCY_FOLD, Latency
from jobcoord.service import Coordinator
from tests.test_schema_c0002 import (
    Snapshot,
    _alembic,
    _every_status,
    empty_target,
    upgrade_in_place_and_back,
)
from tests.timeline import IDLE_ON_AC

__all__ = ["empty_target"]  # the fixture, imported for this module's tests

NEW_INDEXES = {"ix_jobs_kind_job_id", "ix_jobs_waiting_age", "ix_jobs_finished_at"}
NEW_TABLES = {"job_counts", "claim_refusals", "metric_folds"}


def counted(db: Database) -> dict[tuple[Any, ...], int]:
    """job_counts summed over shards, zeros left out."""
    rows = db.read(lambda conn: conn.exec_driver_sql(
        "SELECT tenant, status, kind, attempts, SUM(n) FROM job_counts"
        " GROUP BY tenant, status, kind, attempts").all())
    return {tuple(r[:4]): int(r[4]) for r in rows if r[4]}


def truth(db: Database) -> dict[tuple[Any, ...], int]:
    rows = db.read(lambda conn: conn.exec_driver_sql(
        "SELECT tenant, status, kind, attempts, COUNT(*) FROM jobs"
        " GROUP BY tenant, status, kind, attempts").all())
    return {tuple(r[:4]): int(r[4]) for r in rows}


def populated_with_completions_at(db: Database, revision: str) -> None:
    """Filled by this code at the head (its statements name every column the head has),
    then taken down to `revision` with every row kept: a job in every status, and
    completions with a worker's provenance, whose latency the upgrade folds once."""
    _alembic(db, "upgrade", CORE_REVISIONS[-1])
    old = Coordinator(db, verify=False)
    _every_status(old)
    old.enqueue_many([{"kind": "timed"} for _ in range(3)])
    old.heartbeat("w9", readings=IDLE_ON_AC)
    for _ in range(3):
        got = old.claim("w9", kinds=["timed"])
        end = now_us() - MICROS // 2
        old.complete(got["job"]["job_id"], "w9", got["lease"]["epoch"], {"ok": 1},
                     provenance={"started_at": iso(end - MICROS), "duration_s": 1.0})
    _alembic(db, "downgrade", revision)
    # An hour old, so settled on PostgreSQL too (no smaller id can still commit).
    db.write(lambda conn: conn.exec_driver_sql(
        "UPDATE job_events SET at = at - 3600000000 WHERE reason = 'completed'"))


def test_c0004_upgrades_a_populated_c0003_database_in_place_and_back(
        empty_target: Target) -> None:
    def upgraded(c: Coordinator, before: Snapshot) -> None:
        db = c.db
        assert counted(db) == truth(db)
        (name, last, state), = db.read(lambda conn: conn.exec_driver_sql(
            "SELECT name, last_event_id, state_json FROM metric_folds").all())
        completed = db.read(lambda conn: conn.exec_driver_sql(
            "SELECT event_id FROM job_events WHERE reason = 'completed'"
            " ORDER BY event_id").scalars().all())
        fold = Latency.from_json(state)
        assert name == LATENCY_FOLD
        assert last == completed[-1] and fold.count == 3 and fold.without == 1

        c.heartbeat("w2", readings=IDLE_ON_AC)
        assert c.claim("w2")["job"] is not None
        assert counted(db) == truth(db)

    def downgraded(db: Database) -> None:
        # No trigger left behind writing to a dropped table: insert, update, delete a job.
        db.write(_insert_update_delete_a_job)

    upgrade_in_place_and_back(empty_target, "c0003", populate=populated_with_completions_at,
                              new_tables=NEW_TABLES, new_indexes=NEW_INDEXES,
                              upgraded=upgraded, downgraded=downgraded)


def test_job_counts_equal_the_jobs_table_after_every_path_that_writes_jobs(
        coord: Coordinator) -> None:
    c = coord
    _every_status(c)
    assert counted(c.db) == truth(c.db)
    c.enqueue_many([{"kind": f"b{i % 3}", "tenant": "alice" if i % 2 else "default"}
                    for i in range(500)])                                   # batch insert
    assert counted(c.db) == truth(c.db)
    c.heartbeat("w3", readings=IDLE_ON_AC)
    got = c.claim("w3", lease_s=0.2)
    dead = [j["job_id"] for j in c.jobs(status="dead")["jobs"]]
    c.retry(dead[0])                                                         # dead -> waiting
    unknown = [j["job_id"] for j in c.jobs(status="unknown")["jobs"]]
    c.reconcile(unknown[0], "succeeded", "checked", result={"ok": 1})  # unknown -> done
    c.cancel(c.jobs(status="waiting")["jobs"][0]["job_id"])
    import time

    time.sleep(0.3)
    c.reap()                                                                 # lease expired
    assert c.show(got["job"]["job_id"])["job"]["status"] != "running"
    assert counted(c.db) == truth(c.db)
    c.prune(0, statuses=["succeeded", "cancelled"])                          # batch delete
    assert counted(c.db) == truth(c.db)
    assert sum(counted(c.db).values()) == sum(truth(c.db).values()) > 0


def test_job_counts_stay_exact_with_threads_transitioning_at_once(target: Target) -> None:
    """Four threads sharing one Coordinator claim and complete while another enqueues: on
    PostgreSQL each connection writes its own shard, and the sum stays exact."""
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": f"k{i % 2}"} for i in range(200)])
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                c.heartbeat(f"t{n}", readings=IDLE_ON_AC)
                while True:
                    got = c.claim(f"t{n}")
                    if got["job"] is None:
                        return
                    c.complete(got["job"]["job_id"], f"t{n}", got["lease"]["epoch"], {})
            except BaseException as e:  # reported below
                errors.append(e)

        def feed() -> None:
            try:
                for _ in range(20):
                    c.enqueue_many([{"kind": "k2"} for _ in range(5)])
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        threads.append(threading.Thread(target=feed))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert counted(c.db) == truth(c.db)
        assert sum(counted(c.db).values()) == 300


def test_check_reports_job_counts_that_differ_from_the_jobs(coord: Coordinator) -> None:
    coord.enqueue_many([{"kind": "k"} for _ in range(3)])
    assert check(coord.db)["ok"]
    coord.db.write(lambda conn: conn.exec_driver_sql(
        "UPDATE job_counts SET n = n + 1 WHERE status = 'waiting'"))
    got = check(coord.db)
    assert not got["ok"]
    (found,) = [v for v in got["violations"]
                if v["invariant"] == "job_counts_differ_from_jobs"]
    assert found["keys"] == [{"tenant": "default", "status": "waiting", "kind": "k",
                              "attempts": 0, "kept": 4, "counted": 3}]


def _insert_update_delete_a_job(conn: Any) -> None:
    """A copy of the first job under a new id (no idempotency key), updated, then deleted:
    every kind of write the dropped triggers listened to, at the old revision's columns."""
    cols = [c["name"] for c in inspect(conn).get_columns("jobs")
            if c["name"] not in ("job_id", "idempotency_key")]
    names = ", ".join(cols)
    conn.exec_driver_sql(
        f"INSERT INTO jobs (job_id, {names}) SELECT job_id + 1000000, {names} FROM jobs"
        " WHERE job_id = (SELECT MIN(job_id) FROM jobs)")
    conn.exec_driver_sql("UPDATE jobs SET attempts = attempts + 1, status = 'dead'"
                         " WHERE job_id > 1000000")
    conn.exec_driver_sql("DELETE FROM jobs WHERE job_id > 1000000")
