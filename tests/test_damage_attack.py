"""Rows damaged outside jobcoord (a file edited by hand, a broken restore) and requests with a
refused identity, attacked from outside: no command exits 1, no route answers 500, a worker
process keeps running the good jobs, and 401 / 403 come before 400."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.conftest import dump, run_cli
from tests.serve_procs import db_args, jobcoord_argv, served, token
from tests.timeline import IDLE_ON_AC


def _damage(c: Coordinator, statement: str, **params: Any) -> None:
    from sqlalchemy import text

    with c.db.engine.begin() as conn:
        conn.execute(text(statement), params)


def _with_checks_ignored(target: Target, statement: str) -> None:
    """Damage written past the CHECK constraints, as a careless editor or a broken restore
    can on SQLite."""
    import sqlite3

    conn = sqlite3.connect(target.sqlite_path or "")
    conn.execute("PRAGMA ignore_check_constraints = 1")
    conn.executescript(statement)
    conn.close()


def _no_internal_error(target: Target, *args: str) -> Any:
    r = run_cli(target, *args, "--json")
    assert r.code != 1 and "Traceback" not in r.err, (args, r)
    assert "internal_error" not in r.out, (args, r)
    return r


# --- a worker row whose stored JSON parses, but is not what a heartbeat writes ---------------


WRONG_SHAPE = pytest.mark.parametrize(("column", "text"), [
    ("roles_json", "null"), ("roles_json", "5"), ("kinds_json", "7")])


@WRONG_SHAPE
def test_a_worker_row_whose_stored_json_is_not_a_list_is_refused_never_an_internal_error(
        target: Target, column: str, text: str) -> None:
    c = Coordinator.open(target)
    job = c.enqueue("k", {"n": 1}, role="gpu")["job_id"]
    c.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
    c.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)
    _damage(c, f"UPDATE workers SET {column} = :t WHERE worker_id = 'w2'", t=text)
    r = _no_internal_error(target, "claim", "w2")
    assert r.code == 3, r
    assert r.json["reason"] == "heartbeat_stale", r.json
    _no_internal_error(target, "workers")
    assert _no_internal_error(target, "explain", str(job)).code == 0
    r = _no_internal_error(target, "claim", "w1")
    assert r.code == 0 and r.json["job"]["job_id"] == job, r
    c.close()


# --- a waiting job whose payload parses, but is not an object, under a keyed limit ----------


def _keyed_limit_with_a_damaged_first_job(target: Target) -> tuple[Coordinator, int, list[int]]:
    c = Coordinator.open(target)
    c.set_limit("k", 5, key="model")
    bad = c.enqueue("k", {"model": "a"}, priority=0)["job_id"]
    good = [c.enqueue("k", {"model": "b", "n": i}, priority=1)["job_id"] for i in range(3)]
    c.heartbeat("w1", readings=IDLE_ON_AC)
    _damage(c, "UPDATE jobs SET payload_json = '5' WHERE job_id = :j", j=bad)
    return c, bad, good


def test_a_payload_that_is_not_an_object_under_a_keyed_limit_does_not_stop_the_queue(
        target: Target) -> None:
    c, bad, good = _keyed_limit_with_a_damaged_first_job(target)
    r = _no_internal_error(target, "claim", "w1")
    assert r.code == 0, r
    assert r.json["job"]["job_id"] in good
    got = c.claim_many("w1", 5)
    assert {g["job"]["job_id"] for g in got["claimed"]} <= set(good)
    _no_internal_error(target, "explain", str(bad))
    c.close()


def test_a_worker_process_runs_the_good_jobs_past_a_payload_that_is_not_an_object(
        sqlite_target: Target, tmp_path: Any) -> None:
    c, bad, good = _keyed_limit_with_a_damaged_first_job(sqlite_target)
    handler = f"{sys.executable} -c 'import sys; sys.stdout.write(sys.stdin.read())'"
    argv = [*jobcoord_argv(), *db_args(sqlite_target), "worker", "--exec", f"k={handler}",
            "--worker-id", "wp", "--poll", "0.2", "--max-jobs", str(len(good)), "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ))
    try:
        _out, err = proc.communicate(timeout=25)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
    from tests.sql import sql

    statuses = c.db.read(lambda conn: dict(sql(conn, "SELECT job_id, status FROM jobs").all()))
    assert all(statuses[j] == "succeeded" for j in good), (statuses, err.decode()[-800:])
    assert statuses[bad] != "running"
    assert proc.returncode == 0, err.decode()[-800:]
    c.close()


# --- schedules ------------------------------------------------------------------------------


def test_schedule_ls_with_a_damaged_schedule_payload_is_never_an_internal_error(
        target: Target) -> None:
    c = Coordinator.open(target)
    c.add_schedule("good", "k", every=60)
    c.add_schedule("bad", "k", every=60)
    _damage(c, "UPDATE schedules SET payload_json = 'not json' WHERE name = 'bad'")
    before = dump(c)
    r = _no_internal_error(target, "schedule", "ls")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "schedule_unreadable"
    assert r.json["error"]["details"] == {"schedule": "bad", "column": "payload_json"}
    assert dump(c) == before
    # The way out the message names: remove it, and the rest is listed again.
    assert _no_internal_error(target, "schedule", "rm", "bad").code == 0
    r = _no_internal_error(target, "schedule", "ls")
    assert r.code == 0 and [s["name"] for s in r.json["schedules"]] == ["good"], r
    c.close()


# --- SQLite: a value of the wrong type in a time or number column ----------------------------


def _populated(target: Target) -> Coordinator:
    c = Coordinator.open(target)
    c.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
    c.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)
    c.set_limit("k", 3)
    c.add_schedule("s1", "k", every=60)
    running = c.enqueue("k", {"n": 0}, role="gpu", priority=0)["job_id"]
    assert c.claim("w1")["job"]["job_id"] == running
    c.enqueue("k", {"n": 1}, role="gpu", priority=1, deadline_s=3600)
    c.enqueue("k", {"n": 2}, role="gpu", priority=1)
    return c


# (statement, the commands that must not exit 1). Job 1 runs under w1's lease; jobs 2 and 3
# wait (job 2 with a deadline).
WRONG_TYPE_CASES = [
    pytest.param("UPDATE workers SET heartbeat_at = 'abc' WHERE worker_id = 'w2'",
                 [("workers",), ("claim", "w2"), ("explain", "2")], id="heartbeat_at"),
    pytest.param("UPDATE workers SET memory_used_pct = 'abc' WHERE worker_id = 'w2'",
                 [("workers",), ("claim", "w2"), ("explain", "2")], id="memory_used_pct"),
    pytest.param("UPDATE jobs SET run_after = 'abc' WHERE job_id = 3",
                 [("jobs",), ("show", "3")], id="run_after"),
    pytest.param("UPDATE jobs SET created_at = 'abc' WHERE job_id = 3",
                 [("jobs",), ("show", "3")], id="created_at"),
    pytest.param("UPDATE jobs SET deadline_at = 'abc' WHERE job_id = 2",
                 [("show", "2")], id="deadline_at"),
    pytest.param("UPDATE leases SET expires_at = 'zzz'",
                 [("show", "1"), ("explain", "2"), ("limit", "ls")], id="leases.expires_at"),
    pytest.param("UPDATE limits SET concurrency = 'x'",
                 [("claim", "w2"), ("explain", "2")], id="limits.concurrency"),
    pytest.param("UPDATE schedules SET next_slot_at = 'x'",
                 [("schedule", "ls")], id="schedules.next_slot_at"),
    pytest.param("UPDATE job_events SET at = 'x' WHERE job_id = 1",
                 [("show", "1")], id="job_events.at"),
    pytest.param("UPDATE jobs SET run_after = 'soon' WHERE job_id = 2",
                 [("explain", "2"), ("show", "2"), ("jobs",)], id="explain.run_after"),
    pytest.param("UPDATE jobs SET priority = 'abc' WHERE job_id = 2",
                 [("explain", "2"), ("show", "2"), ("jobs",)], id="priority"),
    pytest.param("UPDATE jobs SET priority = X'00ff' WHERE job_id = 2",
                 [("explain", "2"), ("show", "2"), ("jobs",)], id="priority.bytes"),
    pytest.param("UPDATE jobs SET kind = X'6b' WHERE job_id = 3",
                 [("explain", "3"), ("show", "3"), ("jobs",)], id="kind.bytes"),
    pytest.param("UPDATE schedules SET every_us = 'x'",
                 [("schedule", "ls")], id="schedules.every_us"),
]
WRONG_TYPE = pytest.mark.parametrize(("statement", "commands"), WRONG_TYPE_CASES)


@WRONG_TYPE
def test_sqlite_text_in_a_time_or_number_column_is_never_an_internal_error(
        sqlite_target: Target, statement: str, commands: list[tuple[str, ...]]) -> None:
    """A read that meets such a value names the damage (exit 7, `value_of_wrong_type`, from
    the time's rendering) or works around it (a claim: the limit counts as 1, the worker is
    stale); never exit 1."""
    c = _populated(sqlite_target)
    _with_checks_ignored(sqlite_target, statement)
    failures = []
    for args in commands:
        r = run_cli(sqlite_target, *args, "--json")
        if r.code == 1 or "internal_error" in r.out:
            failures.append((args, r.out[:200]))
    assert not failures, failures
    c.close()


def test_reads_of_a_value_of_the_wrong_type_name_the_row_and_column_exit_7(
        sqlite_target: Target) -> None:
    """The typed read boundary: what `check` names, a read refuses the same way (exit 7,
    value_of_wrong_type, the table and column), changing nothing."""
    c = _populated(sqlite_target)
    _with_checks_ignored(sqlite_target, "UPDATE jobs SET priority = 'abc' WHERE job_id = 2")
    before = dump(c)
    for args in (("explain", "2"), ("show", "2"), ("jobs",)):
        r = run_cli(sqlite_target, *args, "--json")
        assert r.code == 7, (args, r)
        assert r.json["error"]["code"] == "value_of_wrong_type", r.json
        assert r.json["error"]["details"] == {"table": "jobs", "column": "priority"}
    assert run_cli(sqlite_target, "show", "3", "--json").code == 0  # the other rows read
    assert dump(c) == before
    c.close()


def test_a_status_jobcoord_never_writes_is_exit_7_on_reads_and_its_own_label_in_metrics(
        sqlite_target: Target) -> None:
    """A job status outside the CHECK constraint's list (SQLite, checks ignored): `show`,
    `explain` and `jobs` are exit 7 `row_breaks_check` naming the column, never a made-up
    diagnosis; `metrics` (exit 0) shows the jobs under that status's own label and in no
    total; `check` names the constraint."""
    c = _populated(sqlite_target)
    _with_checks_ignored(sqlite_target, "UPDATE jobs SET status = 'weird' WHERE job_id = 3")
    for args in (("show", "3"), ("explain", "3"), ("jobs",)):
        r = _no_internal_error(sqlite_target, *args)
        assert r.code == 7 and r.json["error"]["code"] == "row_breaks_check", (args, r)
        assert r.json["error"]["details"] == {"table": "jobs", "column": "status"}
    r = run_cli(sqlite_target, "metrics")
    assert r.code == 0, r
    assert 'jobcoord_jobs{kind="k",status="weird"} 1.0' in r.out
    assert 'jobcoord_jobs_by_status{status="waiting"} 1.0' in r.out  # job 2 only
    r = run_cli(sqlite_target, "check", "--json")
    found = {v["invariant"]: v for v in r.json["violations"]}
    assert {"table": "jobs", "check": "ck_jobs_status", "rows": 1} in found[
        "row_breaks_check"]["checks"], found
    c.close()


def test_metrics_with_a_worker_heartbeat_time_holding_text_shows_it_without_one(
        sqlite_target: Target) -> None:
    """As claims and `workers` treat it: that worker has no heartbeat age; the others do."""
    c = _populated(sqlite_target)
    _damage(c, "UPDATE workers SET heartbeat_at = 'x' WHERE worker_id = 'w2'")
    r = run_cli(sqlite_target, "metrics")
    assert r.code == 0, r
    assert 'jobcoord_worker_heartbeat_age_seconds{worker="w1"}' in r.out
    assert 'jobcoord_worker_heartbeat_age_seconds{worker="w2"}' not in r.out
    assert "jobcoord_workers 2.0" in r.out
    c.close()


def test_metrics_with_a_job_kind_holding_bytes_is_exit_7_naming_it(
        sqlite_target: Target) -> None:
    c = _populated(sqlite_target)
    _damage(c, "UPDATE jobs SET kind = X'6b' WHERE job_id = 3")
    r = run_cli(sqlite_target, "metrics")
    assert r.code == 7 and "its stored kind is bytes" in r.err, r
    c.close()


@pytest.mark.parametrize(("statement", "overview"), [
    ("UPDATE jobs SET status = 'weird' WHERE job_id = 3", 200),
    ("UPDATE jobs SET kind = X'6b' WHERE job_id = 3", 503)])
def test_the_dashboard_overview_over_a_damaged_job_is_never_a_500(
        sqlite_target: Target, statement: str, overview: int) -> None:
    """The overview sums job_counts as `metrics` does: a status jobcoord never writes is in
    no total (the page renders); a kind of the wrong type is a 503 naming it."""
    c = _populated(sqlite_target)
    _with_checks_ignored(sqlite_target, statement)
    secret = token(sqlite_target, "op", "operator")
    with served(sqlite_target) as s:
        http = httpx.Client(base_url=s.url, timeout=30)
        r = http.post("/ui/login", data={"token": secret})
        http.cookies.update(r.cookies)
        pages = {path: http.get(path) for path in ("/ui/", "/ui/jobs", "/ui/workers")}
    assert pages["/ui/"].status_code == overview, pages["/ui/"].text[:300]
    assert all(r.status_code < 500 or r.status_code == 503 for r in pages.values()), {
        p: r.status_code for p, r in pages.items()}
    c.close()


# --- a time past the calendar -----------------------------------------------------------------


INT64_MAX = 2**63 - 1


def test_a_time_past_the_calendar_is_exit_7_time_out_of_range_and_check_names_it(
        target: Target) -> None:
    """A whole number no calendar reaches (year 294247) in a time column: every read that
    renders it is exit 7 `time_out_of_range`, never exit 1; `check` names the column; on
    both databases (PostgreSQL's BIGINT holds it as surely as SQLite's INTEGER)."""
    c = _populated(target)
    assert run_cli(target, "check", "--json").code == 0
    _damage(c, "UPDATE jobs SET created_at = :t WHERE job_id = 3", t=INT64_MAX)
    before = dump(c)
    for args in (("jobs",), ("show", "3"), ("explain", "3")):
        r = _no_internal_error(target, *args)
        assert r.code == 7 and r.json["error"]["code"] == "time_out_of_range", (args, r)
    assert dump(c) == before
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    assert found["time_out_of_range"]["columns"] == [
        {"table": "jobs", "column": "created_at", "rows": 1}], found
    assert "value_of_wrong_type" not in found
    c.close()


def test_a_time_past_the_calendar_is_a_503_over_http_never_a_500(target: Target) -> None:
    c = _populated(target)
    _damage(c, "UPDATE jobs SET created_at = :t WHERE job_id = 3", t=INT64_MAX)
    secret = token(target, "op", "operator")
    with served(target) as s:
        h = {"Authorization": f"Bearer {secret}"}
        answers = {path: httpx.get(s.url + path, headers=h, timeout=30)
                   for path in ("/v1/jobs", "/v1/jobs/3", "/v1/jobs/3/explain")}
        ok = httpx.get(s.url + "/v1/jobs/2", headers=h, timeout=30)
    for path, r in answers.items():
        assert r.status_code == 503, (path, r.status_code, r.text[:300])
        assert r.json()["error"]["code"] == "time_out_of_range", (path, r.text[:300])
    assert ok.status_code == 200, ok.text[:300]
    c.close()


# --- a row breaking a CHECK constraint (written with the checks ignored) -------------------


def test_a_waiting_job_breaking_its_attempts_check_is_set_aside_and_the_queue_runs(
        sqlite_target: Target) -> None:
    """SQLite checks a row's CHECK constraints when an update changes a column they name:
    a waiting job stored with max_attempts 0 failed every claim's update (exit 1), first in
    claim order for every worker. The claim sets it aside as dead, with an event naming
    the constraint, and takes the next job; `check` names the row."""
    c = Coordinator.open(sqlite_target)
    jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(4)]
    c.heartbeat("w1", readings=IDLE_ON_AC)
    _with_checks_ignored(sqlite_target, "UPDATE jobs SET max_attempts = 0 "
                         f"WHERE job_id = {jobs[0]};")
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    assert found["row_breaks_check"]["checks"] == [
        {"table": "jobs", "check": "ck_jobs_attempts", "rows": 1}], found
    r = _no_internal_error(sqlite_target, "claim", "w1")
    assert r.code == 0 and r.json["job"]["job_id"] == jobs[1], r
    shown = c.show(jobs[0])
    assert shown["job"]["status"] == "dead", shown["job"]
    last = shown["events"][-1]
    assert (last["reason"], last["detail"]) == ("job_unreadable",
                                                {"check": "ck_jobs_attempts"}), last
    got = c.claim_many("w1", 5)
    assert [g["job"]["job_id"] for g in got["claimed"]] == jobs[2:]
    c.close()


# --- JSON nested deeper than Python's parser reaches -----------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("column", ["payload_json", "needs_json"])
def test_a_job_whose_stored_json_is_nested_too_deep_is_set_aside_never_an_internal_error(
        target: Target, column: str) -> None:
    """Valid JSON nested 100,000 deep (jobcoord writes at most 64 levels): Python's parser
    raised RecursionError, exit 1 on every claim (the job stayed first), on show, explain
    and check. It is text that does not parse, as any other: the claim sets the job aside,
    reads are exit 7, check names it."""
    c = Coordinator.open(target)
    jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(2)]
    c.heartbeat("w1", readings=IDLE_ON_AC)
    _damage(c, f"UPDATE jobs SET {column} = :deep WHERE job_id = :j", deep=DEEP, j=jobs[0])
    r = _no_internal_error(target, "claim", "w1")
    assert r.code == 0 and r.json["job"]["job_id"] == jobs[1], r
    from sqlalchemy import text

    with c.db.engine.connect() as conn:
        assert conn.execute(text("SELECT status FROM jobs WHERE job_id = :j"),
                            {"j": jobs[0]}).scalar() == "dead"
    for args in (("show", str(jobs[0])), ("explain", str(jobs[0])), ("check",)):
        r = _no_internal_error(target, *args)
        assert r.code in (0, 7), (args, r)
    c.close()


def test_a_worker_row_nested_too_deep_is_refused_as_stale_never_an_internal_error(
        target: Target) -> None:
    c = Coordinator.open(target)
    c.enqueue("k", {})
    c.heartbeat("w1", readings=IDLE_ON_AC)
    _damage(c, "UPDATE workers SET roles_json = :deep", deep=DEEP)
    r = _no_internal_error(target, "claim", "w1")
    assert r.code == 3 and r.json["reason"] == "heartbeat_stale", r
    for args in (("workers",), ("explain", "1"), ("check",), ("metrics",)):
        _no_internal_error(target, *args)
    c.close()


# --- needs and capacity of the wrong shape -------------------------------------------------


@pytest.mark.parametrize("needs", ['{"slots": "x"}', "[1]", '{"slots": -5}', '"slots=1"'])
def test_a_waiting_job_whose_needs_are_misshapen_is_set_aside_and_check_names_it(
        target: Target, needs: str) -> None:
    """Needs that parse but are not what enqueue writes (names to whole amounts 1..2**40)
    failed every claim with a TypeError (exit 1; the job stayed first) and `check` said ok.
    They are damage like text that does not parse: set aside by the claim, named by check."""
    c = Coordinator.open(target)
    jobs = [c.enqueue("k", {"i": 0}, needs={"slots": 1})["job_id"],
            c.enqueue("k2", {"i": 1})["job_id"]]
    c.heartbeat("w1", readings={**IDLE_ON_AC, "capacity": {"slots": 4}})
    _damage(c, "UPDATE jobs SET needs_json = :n WHERE job_id = :j", n=needs, j=jobs[0])
    r = _no_internal_error(target, "check")
    assert r.code == 7, r
    r = _no_internal_error(target, "claim", "w1")
    assert r.code == 0 and r.json["job"]["job_id"] == jobs[1], r
    c.close()


@pytest.mark.parametrize("raw", ['{"capacity": [1]}', '{"gpus": [5]}', '{"gpus": "x"}',
                                 '{"capacity": {"slots": "x"}}'])
def test_a_worker_whose_stored_capacity_is_misshapen_is_stale_never_an_internal_error(
        target: Target, raw: str) -> None:
    c = Coordinator.open(target)
    job = c.enqueue("k", {}, needs={"slots": 1})["job_id"]
    c.heartbeat("w1", readings={**IDLE_ON_AC, "capacity": {"slots": 4}})
    _damage(c, "UPDATE workers SET heartbeat_raw = :r", r=raw)
    r = _no_internal_error(target, "claim", "w1")
    assert r.code == 3 and r.json["reason"] == "heartbeat_stale", r
    _no_internal_error(target, "explain", str(job))
    c.close()


def _fenced_calls(job: int, worker: str, epoch: int) -> list[tuple[str, ...]]:
    """The CLI's fenced calls of one attempt: complete, renew, fail, effect."""
    own = ("--worker", worker, "--epoch", str(epoch))
    return [("complete", str(job), *own), ("renew", str(job), *own),
            ("fail", str(job), *own, "--error", "x"), ("effect", str(job), *own)]


@pytest.mark.parametrize(("statement", "code", "error"), [
    ("UPDATE leases SET expires_at = 'soon'", 7, "value_of_wrong_type"),
    ("UPDATE jobs SET epoch = 'x'", 4, "stale_epoch"),
], ids=["lease_expiry_text", "job_epoch_text"])
def test_a_lease_expiry_or_job_epoch_holding_text_is_never_an_internal_error(
        sqlite_target: Target, statement: str, code: int, error: str) -> None:
    """A lease's expires_at holding text (SQLite keeps it) was a TypeError, exit 1, for
    complete, renew, fail, effect and checkpoint: now exit 7 naming it. A job's epoch
    holding text is refused as the epoch it does not match (exit 4 stale_epoch); telling
    an epoch ahead from a stale one compared int with str, exit 1."""
    c = Coordinator.open(sqlite_target)
    job = c.enqueue("k", {})["job_id"]
    c.heartbeat("w", readings=IDLE_ON_AC)
    epoch = c.claim("w")["lease"]["epoch"]
    _damage(c, statement)
    for args in _fenced_calls(job, "w", epoch):
        r = _no_internal_error(sqlite_target, *args)
        assert r.code == code and r.json["error"]["code"] == error, (args, r)
    c.close()


def test_retry_and_reconcile_of_a_job_whose_attempts_cannot_grow_are_exit_7(
        target: Target) -> None:
    """attempts at the column's end (2**31 - 1 on both databases; SQLite keeps more) made
    retry and reconcile --as waiting an OverflowError (exit 1)."""
    c = Coordinator.open(target)
    job = c.enqueue("k", {}, max_attempts=1)["job_id"]
    c.heartbeat("w", readings=IDLE_ON_AC)
    epoch = c.claim("w")["lease"]["epoch"]
    c.fail(job, "w", epoch, "x", permanent=True)
    big = 9223372036854775807 if target.sqlite_path else 2147483647
    _damage(c, "UPDATE jobs SET attempts = :a, max_attempts = :a, status = 'unknown' "
            "WHERE job_id = :j", a=big, j=job)
    for args in (("retry", str(job)), ("reconcile", str(job), "--as", "waiting",
                                       "--reason", "checked")):
        r = _no_internal_error(target, *args)
        assert r.code == 7 and r.json["error"]["code"] == "value_out_of_range", (args, r)
    c.close()


def test_metrics_with_a_worker_id_holding_bytes_is_exit_7_naming_it(
        sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    c.heartbeat("w", readings=IDLE_ON_AC)
    _damage(c, "UPDATE workers SET worker_id = CAST('w' AS BLOB)")
    r = run_cli(sqlite_target, "metrics")
    assert r.code == 7 and "worker_id" in r.err and "Traceback" not in r.err, r
    c.close()


LEASE_DAMAGE = pytest.mark.parametrize("statement", [
    "UPDATE leases SET epoch = 'x' WHERE job_id = :j",
    "UPDATE leases SET expires_at = expires_at + 0.5 WHERE job_id = :j",
    "INSERT INTO leases (job_id, worker_id, epoch, granted_at, expires_at) "
    "VALUES (:w, 'ghost', 0, 1, 2)",
    "UPDATE leases SET expires_at = 'soon' WHERE job_id = :j",
    "UPDATE leases SET worker_id = X'00ff' WHERE job_id = :j",
    "UPDATE workers SET worker_id = X'00ff'",
], ids=["text_epoch", "real_expiry", "lease_on_a_waiting_job", "text_expiry",
        "lease_worker_bytes", "worker_bytes"])


@LEASE_DAMAGE
def test_a_damaged_lease_never_stops_the_reaper_from_recovering_the_others(
        sqlite_target: Target, statement: str) -> None:
    """A lease row written by hand (a text epoch, a fractional expiry, a lease on a waiting
    job) made every `reap` exit 1 ("changed under its write lock", a TypeError), so no
    expired lease was recovered. The reaper takes only leases that are their running job's
    live one, with whole-number times; `check` names the rest."""
    c = Coordinator.open(sqlite_target)
    jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(3)]
    c.heartbeat("w1", readings=IDLE_ON_AC)
    for _ in range(2):
        c.claim("w1", lease_s=0.2)
    _damage(c, "PRAGMA foreign_keys = OFF")
    _damage(c, statement, j=jobs[0], w=jobs[2])
    time.sleep(0.3)
    r = _no_internal_error(sqlite_target, "reap")
    assert r.code == 0, r
    with c.db.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT status FROM jobs WHERE job_id = :j"),
                            {"j": jobs[1]}).scalar() == "waiting"
    assert _no_internal_error(sqlite_target, "check").code == 7
    for args in (("show", str(jobs[0])), ("explain", str(jobs[0])), ("workers",)):
        r = _no_internal_error(sqlite_target, *args)
        assert r.code in (0, 7), (args, r)
    c.close()


def test_a_serve_whose_reap_fails_still_fires_its_schedules(target: Target) -> None:
    """The server's timer reaps, then ticks the schedules. A failed reap (here every one, by
    a fault point) skipped the tick too: no schedule fired while reaping failed."""
    with Coordinator.open(target) as c:
        c.add_schedule("often", "s", every="1s")
    with served(target, "--reap-every", "0.2", env={"JOBCOORD_FAULT": "reap.start:bug"}):
        deadline = time.monotonic() + 10
        fired: list[Any] = []
        while not fired and time.monotonic() < deadline:
            time.sleep(0.2)
            with Coordinator.open(target) as c:
                fired = c.jobs()["jobs"]
    assert fired and {j["kind"] for j in fired} == {"s"}, fired


# --- a damaged schedule ---------------------------------------------------------------------

SCHEDULE_DAMAGE = pytest.mark.parametrize(("what", "statement"), [
    ("cron", "UPDATE schedules SET cron = 'not a cron' WHERE name = 'bad'"),
    ("zero interval", "UPDATE schedules SET cron = NULL, tz = NULL, every_us = 0 "
                      "WHERE name = 'bad'"),
    ("neither", "UPDATE schedules SET cron = NULL, tz = NULL, every_us = NULL "
                "WHERE name = 'bad'"),
    ("window", "UPDATE schedules SET window_us = 9223372036854775807 WHERE name = 'bad'"),
    ("max_attempts", "UPDATE schedules SET max_attempts = -1 WHERE name = 'bad'"),
    # Copied into every job it fired: retried a million times, where an add takes 1..100.
    ("max_attempts too many", "UPDATE schedules SET max_attempts = 1000000 WHERE name = 'bad'"),
    ("priority", "UPDATE schedules SET priority = 9 WHERE name = 'bad'"),
    ("payload", "UPDATE schedules SET payload_json = '[1' WHERE name = 'bad'"),
    ("payload not an object", "UPDATE schedules SET payload_json = '[1]' WHERE name = 'bad'"),
])


@SCHEDULE_DAMAGE
def test_a_damaged_schedule_never_stops_the_others_and_ticks_say_it_exit_7(
        target: Target, what: str, statement: str) -> None:
    """One schedule row damaged outside jobcoord made every tick fail (exit 1, in every
    ticker: `reap --every`, `serve`), so no schedule fired. It is passed over and named
    (`unreadable`, exit 7); the others fire. `check` names it too (a max_attempts under 1
    failed every tick, exit 7 "`jobcoord check` names every such row", while check said
    ok)."""
    from sqlalchemy.exc import IntegrityError

    c = Coordinator.open(target)
    c.add_schedule("bad", "k", cron="* * * * *")
    c.add_schedule("good", "g", every="1s")
    try:
        _damage(c, statement)
    except IntegrityError:
        if target.sqlite_path is None:
            c.close()
            pytest.skip("PostgreSQL's CHECK constraints keep this damage out")
        _with_checks_ignored(target, statement + ";")
    _damage(c, "UPDATE schedules SET next_slot_at = :t, due_at = :t",
            t=(int(time.time()) - 30) * 1_000_000)
    r = _no_internal_error(target, "check")
    assert r.code == 7, (what, r)
    assert [v for v in r.json["violations"]
            if "bad" in v.get("schedules", ())  # named, or its table's broken check
            or any(c["table"] == "schedules" for c in v.get("checks", ()))], r.json
    r = _no_internal_error(target, "schedule", "tick")
    assert r.code == 7, (what, r)
    assert [u["name"] for u in r.json["unreadable"]] == ["bad"], r.json
    assert r.json["fired"] >= 1, r.json
    assert {j["kind"] for j in c.jobs()["jobs"]} == {"g"}
    r = _no_internal_error(target, "schedule", "ls")
    assert r.code in (0, 7), (what, r)
    c.close()


# --- a waiting job whose epoch is at the end of its range -----------------------------------


@pytest.mark.parametrize("claim_many", [False, True], ids=["claim", "claim_many"])
def test_a_waiting_job_whose_epoch_cannot_grow_is_set_aside_and_the_queue_runs(
        target: Target, claim_many: bool) -> None:
    """A claim gives the next attempt epoch + 1. A waiting job stored at the largest epoch
    the schema keeps (2**31 - 1, PostgreSQL's column) failed every claim on PostgreSQL
    (integer out of range, exit 1) and on SQLite was handed out with an epoch no PostgreSQL
    column holds. The claim sets it aside as dead, with an event naming the column, and
    takes the next job."""
    c = Coordinator.open(target)
    jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(3)]
    c.heartbeat("w1", readings=IDLE_ON_AC)
    _damage(c, "UPDATE jobs SET epoch = 2147483647 WHERE job_id = :j", j=jobs[0])
    if claim_many:
        got = c.claim_many("w1", 5)
        assert [g["job"]["job_id"] for g in got["claimed"]] == jobs[1:], got
    else:
        r = _no_internal_error(target, "claim", "w1")
        assert r.code == 0 and r.json["job"]["job_id"] == jobs[1], r
    shown = c.show(jobs[0])
    assert shown["job"]["status"] == "dead", shown["job"]
    last = shown["events"][-1]
    assert (last["reason"], last["detail"]) == ("job_unreadable", {"column": "epoch"}), last
    c.close()


def test_a_sqlite_epoch_at_the_integer_limit_never_becomes_a_float(
        sqlite_target: Target) -> None:
    """SQLite turns 2**63 - 1 + 1 into a float: the claim handed out `epoch
    9.223372036854776e+18` and every read of the job was exit 7 after it."""
    c = Coordinator.open(sqlite_target)
    jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(2)]
    c.heartbeat("w1", readings=IDLE_ON_AC)
    _damage(c, "UPDATE jobs SET epoch = 9223372036854775807 WHERE job_id = :j", j=jobs[0])
    got = c.claim("w1")
    assert got["job"]["job_id"] == jobs[1] and got["lease"]["epoch"] == 1, got
    assert c.show(jobs[0])["job"]["status"] == "dead"
    c.close()


# --- over HTTP --------------------------------------------------------------------------------


def test_the_dashboard_workers_page_with_a_damaged_worker_row_is_not_a_500(
        target: Target) -> None:
    c = Coordinator.open(target)
    c.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
    c.heartbeat("w2", roles=["gpu"], readings=IDLE_ON_AC)
    _damage(c, "UPDATE workers SET roles_json = 'null' WHERE worker_id = 'w2'")
    secret = token(target, "op", "operator")
    with served(target) as s:
        http = httpx.Client(base_url=s.url, timeout=30)
        r = http.post("/ui/login", data={"token": secret})
        http.cookies.update(r.cookies)
        r = http.get("/ui/workers")
        assert r.status_code < 500, r.text[:300]
        r = httpx.get(s.url + "/v1/workers", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text[:300]
    c.close()


#: Bodies every route refuses as invalid input (400): not JSON, NaN, not an object.
BAD_BODIES = (b"{bad", b'{"a": NaN}', b"[1]")
#: The routes that look their token up in their own pool call.
CALLER_ROUTES = ("/v1/jobs", "/v1/heartbeat", "/v1/claims", "/v1/jobs/1/renew",
                 "/v1/jobs/1/complete", "/v1/jobs/1/fail", "/v1/jobs/1/effect",
                 "/v1/jobs/1/checkpoint")


def test_a_refused_token_with_an_invalid_body_is_401_or_403_before_400(
        target: Target) -> None:
    c = Coordinator.open(target)
    c.enqueue("k", {"n": 1})
    viewer = token(target, "view", "viewer")
    before = dump(c)
    wrong = []
    with served(target) as s:
        for path in CALLER_ROUTES:
            for body in BAD_BODIES:
                for secret, want in (("jct_unknown", 401), (viewer, 403)):
                    r = httpx.post(s.url + path, content=body, timeout=30, headers={
                        "Authorization": f"Bearer {secret}",
                        "Content-Type": "application/json"})
                    if r.status_code != want:
                        wrong.append((path, body, want, r.status_code,
                                      json.loads(r.text)["error"]["code"]))
    assert dump(c) == before
    assert not wrong, wrong[:6]
    c.close()


def test_a_refused_submission_while_a_long_poll_waits_hands_nothing_out(
        target: Target) -> None:
    """Held: an unknown, a viewer's and a revoked token's submission while a worker's
    long-poll waits are 401 / 403 / 401, create no job, and the poll waits out its time with
    nothing; the next good submission goes to it. The token is judged before a poll is
    taken: the poll is not woken to claim for a refused request."""
    import threading

    from sqlalchemy import text

    c = Coordinator.open(target)
    worker = token(target, "wk", "worker", worker="w1")
    viewer = token(target, "view", "viewer")
    revoked = token(target, "gone", "submitter")
    good = token(target, "sub", "submitter")
    from jobcoord import tokens

    tokens.revoke(c.db, "gone")
    # The long-poll claims at its start and its end; between them it asks with a read.
    with served(target, "--poll", "1") as s:
        wh = {"Authorization": f"Bearer {worker}"}
        assert httpx.post(s.url + "/v1/heartbeat", json={"readings": IDLE_ON_AC}, headers=wh,
                          timeout=30).status_code == 200
        got: dict[str, Any] = {}

        def poll() -> None:
            t = time.monotonic()
            r = httpx.post(s.url + "/v1/claims", json={"wait": 3}, headers=wh, timeout=30)
            got["poll"] = (time.monotonic() - t, r.status_code)

        th = threading.Thread(target=poll)
        th.start()
        time.sleep(0.5)
        for secret, want in (("jct_unknown", 401), (viewer, 403), (revoked, 401),
                             ("x" * 5000, 401)):
            r = httpx.post(s.url + "/v1/jobs", json={"kind": "k"}, timeout=30,
                           headers={"Authorization": f"Bearer {secret}"})
            assert r.status_code == want, (secret[:10], r.text)
        th.join(30)
        assert got["poll"][1] == 204 and got["poll"][0] >= 2.5, got
        assert c.jobs()["jobs"] == []
        # A refused token never reaches a poll: no claim was made for it (each would be a
        # write, one per unauthenticated request).
        with c.db.engine.connect() as conn:
            claims = conn.execute(text("SELECT coalesce(sum(n), 0) FROM claim_refusals "
                                       "WHERE worker_id = 'w1'")).scalar()
        assert claims <= 2, claims
        r = httpx.post(s.url + "/v1/jobs", json={"kind": "k"}, timeout=30,
                       headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 201, r.text
    c.close()


def test_http_claims_past_a_payload_that_is_not_an_object_are_never_a_500(
        target: Target) -> None:
    c, bad, good = _keyed_limit_with_a_damaged_first_job(target)
    worker = token(target, "wk", "worker", worker="w1")
    operator = token(target, "op", "operator")
    # The long-poll claims at its start and its end; between them it asks with a read.
    with served(target, "--poll", "1") as s:
        wh = {"Authorization": f"Bearer {worker}"}
        assert httpx.post(s.url + "/v1/heartbeat", json={"readings": IDLE_ON_AC}, headers=wh,
                          timeout=30).status_code == 200
        answers = [httpx.post(s.url + "/v1/claims", json=body, headers=wh, timeout=30)
                   for body in ({}, {"wait": 1})]
        explain = httpx.get(f"{s.url}/v1/jobs/{bad}/explain", timeout=30,
                            headers={"Authorization": f"Bearer {operator}"})
    assert [r.status_code for r in answers] == [200, 200], [r.text[:200] for r in answers]
    assert {r.json()["job"]["job_id"] for r in answers} <= set(good)
    assert explain.status_code < 500, explain.text[:200]
    c.close()


@WRONG_TYPE
def test_check_names_each_sqlite_column_holding_a_value_of_the_wrong_type(
        sqlite_target: Target, statement: str, commands: list[tuple[str, ...]]) -> None:
    """What the commands above cannot read yet, `check` finds and names (exit 7)."""
    c = _populated(sqlite_target)
    assert run_cli(sqlite_target, "check", "--json").code == 0
    _with_checks_ignored(sqlite_target, statement)
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "value_of_wrong_type"]
    table, column = statement.split()[1], statement.split()[3]
    # (A trigger may copy the value on: job_counts keeps a job's kind too.)
    assert found and {"table": table, "column": column} in [
        {k: f[k] for k in ("table", "column")} for f in found[0]["columns"]], found
    c.close()
