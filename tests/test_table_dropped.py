"""A table of the current revision dropped beside jobcoord (by hand, a partial restore): every
command, API call and HTTP request that reads it says the database is damaged and names the
table (exit 7, `table_missing`, HTTP 503), as `check` does, instead of an internal error
(exit 1, 500) quoting the driver; nothing is changed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from jobcoord.db import Target
from jobcoord.errors import DatabaseCorrupt
from jobcoord.service import Coordinator
from tests.conftest import run_cli
from tests.serve_procs import served, token


def _alter(target: Target, statement: str) -> None:
    """Change the schema by hand, as someone beside jobcoord would."""
    c = Coordinator.open(target)
    try:
        with c.db.engine.begin() as conn:
            conn.execute(text(statement))
    finally:
        c.close()


def _drop(target: Target, table: str) -> None:
    _alter(target, f"DROP TABLE {table}")


def _told(r: Any, code: str, key: str, names: list[str]) -> None:
    """The command exited 7 with `code`, naming `names` under `details[key]`, and pointed
    at `check`."""
    assert r.code == 7, r
    error = r.json["error"]
    assert error["code"] == code, error
    assert error["details"][key] == names, error
    assert "check" in error["message"]


def _events(target: Target) -> int:
    with Coordinator.open(target) as c, c.db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM job_events")).scalar_one())


@pytest.mark.parametrize("args", [("token", "ls"), ("token", "revoke", "ci"),
                                  ("token", "create", "new", "--role", "viewer")])
def test_a_token_command_on_a_database_without_its_tokens_table_exits_7_naming_it(
        target: Target, args: tuple[str, ...]) -> None:
    token(target, "ci", "submitter")
    _drop(target, "tokens")
    before = _events(target)
    _told(run_cli(target, *args, "--json"), "table_missing", "tables", ["tokens"])
    assert _events(target) == before


def test_an_api_call_reading_a_dropped_table_raises_table_missing(target: Target) -> None:
    c = Coordinator.open(target)
    try:
        c.set_limit("llm", 1)
        with c.db.engine.begin() as conn:
            conn.execute(text("DROP TABLE limits"))
        with pytest.raises(DatabaseCorrupt) as got:
            c.set_limit("llm", 2)
        assert got.value.code == "table_missing"
        assert got.value.details["tables"] == ["limits"]
        assert got.value.exit_code == 7
        # The rest of the database still answers: a job is submitted and shown.
        job = c.enqueue("k", {})["job_id"]
        assert c.show(job)["job"]["status"] == "waiting"
    finally:
        c.close()


def test_a_server_whose_tokens_table_is_dropped_answers_503_table_missing(
        target: Target) -> None:
    secret = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        assert http.get("/v1/jobs").status_code == 200
        _drop(target, "tokens")
        for method, path, body in [("GET", "/v1/jobs", None),
                                   ("POST", "/v1/jobs", {"kind": "k", "payload": {}})]:
            resp = http.request(method, path, json=body)
            assert resp.status_code == 503, resp.text
            assert resp.json()["error"]["code"] == "table_missing", resp.text
    with Coordinator.open(target) as c:
        assert c.jobs()["jobs"] == []


@pytest.mark.parametrize("table", ["limits", "tokens"])
def test_a_backup_of_a_database_without_a_table_is_exit_7_and_leaves_dest(
        sqlite_target: Target, tmp_path: Any, table: str) -> None:
    """`backup` of a database missing a table said ok (exit 0) and made a copy `restore`
    refuses: a nightly backup reporting success that can never be restored. It is exit 7
    `table_missing` naming the table, and DEST keeps its old bytes (or is not made)."""
    backups = tmp_path / "backups"
    backups.mkdir()
    dest = backups / "b b#?%.db"
    assert run_cli(sqlite_target, "backup", str(dest)).code == 0
    before = dest.read_bytes()
    _drop(sqlite_target, table)
    for args in (("backup", str(dest), "--force"), ("backup", str(backups / "new.db"))):
        r = run_cli(sqlite_target, *args, "--json")
        assert r.code == 7, r
        assert r.json["error"]["code"] == "table_missing", r.json
        assert r.json["error"]["details"]["tables"] == [table]
    assert dest.read_bytes() == before
    assert sorted(p.name for p in backups.iterdir()) == [dest.name]


def test_a_backup_with_artifacts_of_a_database_without_its_artifacts_table_names_it(
        sqlite_target: Target, tmp_path: Any) -> None:
    """It said `database_corrupt`, "cannot read the artifact rows of the backup": the copy
    blamed, not the database backed up."""
    from tests.test_artifacts_rules import install

    install(sqlite_target)
    _drop(sqlite_target, "artifacts")
    r = run_cli(sqlite_target, "backup", str(tmp_path / "b.db"), "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "table_missing", r.json
    assert r.json["error"]["details"]["tables"] == ["artifacts"]
    assert not (tmp_path / "b.db").exists()


def test_a_remote_worker_meeting_a_dropped_table_is_told_it_as_a_local_one_is(
        target: Target, tmp_path: Any) -> None:
    """The server answers 503 `table_missing`, as it answers a busy database: the client
    took it for a storage outage (StorageUnavailable, exit 6) and retried it for its whole
    retry budget; a `--burst` worker exited 6 after 10 s where a local one exits 7 at once.
    A 503 says when its class is one no retry heals: the client raises that class, once."""
    import subprocess
    import sys
    import time

    from jobcoord.http.client import RemoteCoordinator
    from tests.serve_procs import token_file
    from tests.timeline import IDLE_ON_AC

    secret = token(target, "w1", "worker", worker="w1")
    with served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=60.0) as remote:
        remote.heartbeat("w1", readings=IDLE_ON_AC)
        with Coordinator.open(target) as c:
            c.enqueue("k", {})  # a job to claim: the claim writes its lease
        _drop(target, "leases")
        started = time.monotonic()
        with pytest.raises(DatabaseCorrupt) as got:
            remote.claim("w1", wait=0)
        assert time.monotonic() - started < 20  # answered, not retried for 60 s
        assert got.value.code == "table_missing"
        assert got.value.details["tables"] == ["leases"]
        done = subprocess.run(
            [sys.executable, "-m", "jobcoord", "worker", "--server", s.url, "--token-file",
             token_file(tmp_path, "tok", secret), "--exec", "k=cat", "--burst", "--json",
             "--log-format", "json"],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 7, (done.returncode, done.stderr[-2000:])
        assert "table_missing" in done.stdout, done.stdout
        assert "Traceback" not in done.stderr
        # Its log ends with its counts and the error it stopped on.
        last = json.loads([line for line in done.stderr.splitlines()
                           if line.startswith("{")][-1])
        assert (last["event"], last["error"]) == ("stopped_worker", "table_missing"), last


def _drop_column(target: Target, table: str, column: str) -> None:
    _alter(target, f"ALTER TABLE {table} DROP COLUMN {column}")


@pytest.mark.parametrize("args", [("heartbeat", "w1"), ("heartbeat", "w2")])
def test_a_command_reading_a_dropped_column_exits_7_naming_it(
        target: Target, args: tuple[str, ...]) -> None:
    """A column of the current revision dropped by hand: on SQLite `no such column` was an
    internal error (exit 1) quoting the driver, on PostgreSQL `schema_damaged` naming
    nothing. Both say `column_missing` (exit 7) naming the column, as `check` does."""
    assert run_cli(target, "heartbeat", "w1").code == 0
    assert run_cli(target, "enqueue", "k").code == 0
    _drop_column(target, "workers", "created_at")
    before = _events(target)
    _told(run_cli(target, *args, "--json"), "column_missing", "columns",
          ["workers.created_at"])
    assert _events(target) == before


def test_a_server_reading_a_dropped_column_answers_503_column_missing(
        target: Target) -> None:
    secret = token(target, "w1", "worker", worker="w1")
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        assert http.post("/v1/heartbeat", json={}).status_code == 200
        _drop_column(target, "workers", "created_at")
        resp = http.post("/v1/heartbeat", json={})
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "column_missing", resp.text
        assert resp.headers["Jobcoord-Error-Class"] == "DatabaseCorrupt"


def test_a_backup_of_a_database_without_a_column_is_exit_7_and_leaves_dest(
        sqlite_target: Target, tmp_path: Any) -> None:
    """It said ok (exit 0) and made a copy lacking the column: a backup whose every
    restore is as damaged as the database was."""
    dest = tmp_path / "b b#?%.db"
    assert run_cli(sqlite_target, "backup", str(dest)).code == 0
    before = dest.read_bytes()
    _drop_column(sqlite_target, "workers", "created_at")
    for args in (("backup", str(dest), "--force"), ("backup", str(tmp_path / "new.db"))):
        r = run_cli(sqlite_target, *args, "--json")
        assert r.code == 7, r
        assert r.json["error"]["code"] == "column_missing", r.json
        assert r.json["error"]["details"]["columns"] == ["workers.created_at"]
    assert dest.read_bytes() == before
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize("damage", ["DROP TABLE limits", "DROP TABLE jobs",
                                    "ALTER TABLE workers DROP COLUMN created_at"])
def test_migrate_of_a_database_at_its_revision_missing_a_table_or_column_exits_7(
        target: Target, damage: str) -> None:
    """`migrate` said ok (exit 0, `changed: false`) of a database lacking a table of the
    revision it is at, as if it were whole; with `jobs` gone it said the file "holds none of
    its tables" (schema_unknown, exit 8) beside a dozen of them. It cannot make again what
    a revision it is at made: exit 7 naming what is missing, as `check` does, nothing
    changed."""
    from sqlalchemy import inspect

    c = Coordinator.open(target)
    try:
        with c.db.engine.begin() as conn:
            # PostgreSQL keeps the foreign keys: what depends on jobs goes with it.
            conn.execute(text(damage + (" CASCADE" if damage == "DROP TABLE jobs"
                                        and not target.sqlite_path else "")))
        tables = sorted(inspect(c.db.engine).get_table_names())
    finally:
        c.close()
    r = run_cli(target, "migrate", "--json")
    assert r.code == 7, r
    error = r.json["error"]
    if damage.startswith("DROP TABLE"):
        assert error["code"] == "table_missing", error
        assert damage.split()[-1] in error["details"]["tables"]
    else:
        assert error["code"] == "column_missing", error
        assert error["details"]["columns"] == ["workers.created_at"]
    from sqlalchemy import create_engine

    engine = create_engine(target.url)
    try:
        assert sorted(inspect(engine).get_table_names()) == tables
    finally:
        engine.dispose()


def test_a_view_standing_in_a_tables_place_is_that_table_missing(target: Target) -> None:
    """A table renamed and a view of it made under its name (by hand, a tool "fixing" the
    schema): a write to it was an internal error (exit 1, "cannot modify limits because it
    is a view") on SQLite and "cannot reach the database" (exit 6) on PostgreSQL, while
    `check` and `migrate` said ok. A view is no table: exit 7 `table_missing` naming it,
    from the command, `check` and `migrate`, nothing changed."""
    c = Coordinator.open(target)
    try:
        c.set_limit("llm", 1)
        with c.db.engine.begin() as conn:
            conn.execute(text("ALTER TABLE limits RENAME TO limits_real"))
            # DISTINCT: PostgreSQL writes through a plain SELECT * view.
            conn.execute(text("CREATE VIEW limits AS SELECT DISTINCT * FROM limits_real"))
    finally:
        c.close()
    for args in (("limit", "set", "llm", "--concurrency", "2"), ("check",), ("migrate",)):
        r = run_cli(target, *args, "--json")
        assert r.code == 7, (args, r)
        found = r.json["error"] if "error" in r.json else r.json["violations"][0]
        assert found.get("code", found.get("invariant")) == "table_missing", (args, r.json)
        tables = (found["details"]["tables"] if "error" in r.json else found["tables"])
        assert tables == ["limits"], (args, r.json)
    with Coordinator.open(target) as c, c.db.engine.connect() as conn:
        assert conn.execute(text("SELECT concurrency FROM limits_real")).scalar_one() == 1


@pytest.mark.parametrize("table,command", [
    ("limits", ("limit", "set", "llm", "--concurrency", "2")),
    ("workers", ("heartbeat", "w1")),
])
def test_a_table_made_again_without_its_primary_key_is_schema_damaged_naming_it(
        sqlite_target: Target, table: str, command: tuple[str, ...]) -> None:
    """SQLite: a table made again with its columns but not its key (`CREATE TABLE t2 AS
    SELECT * FROM t`, renamed back): every upsert failed as an internal error (exit 1, "ON
    CONFLICT clause does not match any PRIMARY KEY"), and `check` said ok, SQLite naming no
    key. `check` finds it by the key's columns (`schema_object_missing`), and the command
    is exit 7 `schema_damaged` naming it, as PostgreSQL's dropped key is."""
    c = Coordinator.open(sqlite_target)
    try:
        c.set_limit("llm", 1)
        c.heartbeat("w1")
        with c.db.engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE t2 AS SELECT * FROM {table}"))
            conn.execute(text(f"DROP TABLE {table}"))
            conn.execute(text(f"ALTER TABLE t2 RENAME TO {table}"))
    finally:
        c.close()
    r = run_cli(sqlite_target, *command, "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "schema_damaged", r.json
    assert r.json["error"]["details"]["objects"] == [
        {"table": table, "type": "primary_key", "name": f"pk_{table}"}], r.json
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    assert {"table": table, "type": "primary_key", "name": f"pk_{table}"} in (
        found["schema_object_missing"]["objects"]), r.json


def test_a_required_column_jobcoord_never_makes_is_schema_damaged_naming_it(
        target: Target) -> None:
    """A table made again with a column of someone's own that must not be null and has no
    default: every insert failed as an internal error (exit 1, "NOT NULL constraint
    failed: limits.extra") and `check` said ok. `check` names it (`column_unexpected`),
    the command is exit 7 `schema_damaged` naming it; a nullable column of one's own is
    left alone."""
    c = Coordinator.open(target)
    try:
        with c.db.engine.begin() as conn:
            conn.execute(text("ALTER TABLE limits ADD COLUMN note TEXT"))  # one's own, nullable
        c.set_limit("llm", 1)
        assert run_cli(target, "check", "--json").code == 0
        with c.db.engine.begin() as conn:
            conn.execute(text("ALTER TABLE limits ADD COLUMN extra INTEGER"))
            if target.sqlite_path:  # SQLite adds no NOT NULL column without a default
                conn.execute(text("PRAGMA writable_schema = ON"))
                conn.execute(text("UPDATE sqlite_master SET sql = replace(sql, "
                                  "'extra INTEGER', 'extra INTEGER NOT NULL') "
                                  "WHERE name = 'limits'"))
            else:
                conn.execute(text("UPDATE limits SET extra = 0"))
                conn.execute(text("ALTER TABLE limits ALTER COLUMN extra SET NOT NULL"))
    finally:
        c.close()
    r = run_cli(target, "limit", "set", "other", "--concurrency", "2", "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "schema_damaged", r.json
    assert r.json["error"]["details"]["columns"] == ["limits.extra"], r.json
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    assert found["column_unexpected"]["columns"] == ["limits.extra"], r.json


def test_a_worker_whose_report_meets_a_dropped_column_stops_at_once_exit_7(
        target: Target) -> None:
    """A column only completions write, dropped by hand: the worker logged `report_error`
    for each job and went on claiming the next, every job it could reach claimed and lost
    (its result never stored), then exited 0. A report meeting an error no retry heals
    stops the worker as a claim meeting it does: exit 7 naming the column, after the first
    job; the rest stay waiting."""
    for _ in range(3):
        assert run_cli(target, "enqueue", "k").code == 0
    assert run_cli(target, "heartbeat", "w1").code == 0
    _drop_column(target, "jobs", "provenance_json")
    r = run_cli(target, "worker", "--worker-id", "w1", "--exec", "k=cat", "--burst",
                "--json", "--log-format", "json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "column_missing", r.json
    assert r.json["error"]["details"]["columns"] == ["jobs.provenance_json"]
    logged = [json.loads(line) for line in r.err.splitlines() if line.startswith("{")]
    assert [e["event"] for e in logged].count("claimed") == 1, logged
    assert (logged[-1]["event"], logged[-1]["error"]) == ("stopped_worker", "column_missing")
    with Coordinator.open(target) as c:
        assert sorted(j["status"] for j in c.jobs()["jobs"]) == ["running", "waiting", "waiting"]
