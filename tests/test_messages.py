"""Error messages say what is true, in plain words: the real size of an oversized file, what a
file given to `restore` or found at --db actually is, numbers refused without Python's
internals, one message whether read as str() or .message, and numbers read as the plain
decimals people type (not Python's literal syntax)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from jobcoord import validate as v
from jobcoord.db import Target, resolve_target
from jobcoord.errors import DatabaseBusy, InvalidInput, JobcoordError, SchemaMismatch
from jobcoord.migrate import _migration_error
from jobcoord.policy import Policy
from jobcoord.service import Coordinator
from tests.conftest import dump, run_cli
from tests.sql import sql

LIMIT = Policy().max_payload_bytes


# --- sizes -----------------------------------------------------------------------------------


def test_an_oversized_payload_file_is_reported_with_its_real_size(coord: Coordinator, cli,
                                                                  tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b'{"x": "' + b"a" * (3 * LIMIT) + b'"}')
    before = dump(coord)
    r = cli("enqueue", "k", "--payload-file", str(big), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "payload_too_large"
    assert r.json["error"]["details"]["size"] == big.stat().st_size
    assert f"is {big.stat().st_size} bytes" in r.json["error"]["message"]
    piped = cli("enqueue", "k", "--payload-file", "-", "--json", stdin=big.read_bytes())
    assert piped.code == 2 and piped.json["error"]["code"] == "payload_too_large"
    message = piped.json["error"]["message"]
    assert f"is more than {LIMIT} bytes" in message and str(LIMIT + 1) not in message
    assert "size" not in piped.json["error"]["details"]
    assert dump(coord) == before


# --- what a file is ------------------------------------------------------------------------


def test_restoring_a_plain_sqlite_file_says_it_is_not_a_jobcoord_backup(tmp_path: Path
                                                                        ) -> None:
    plain = tmp_path / "other.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    r = run_cli(resolve_target(db=str(tmp_path / "new.db")), "restore", str(plain), "--json")
    assert r.code == 8, r.out
    message = r.json["error"]["message"]
    assert "not a jobcoord backup" in message and "migrate" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def _forget_revision(target: Target) -> None:
    c = Coordinator.open(target)
    try:
        c.db.write(lambda conn: sql(conn, "DELETE FROM alembic_version"))
    finally:
        c.close()


def _tables(target: Target) -> Any:
    from sqlalchemy import create_engine, inspect

    if target.sqlite_path:
        conn = sqlite3.connect(target.sqlite_path)
        try:
            return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
        finally:
            conn.close()
    engine = create_engine(target.url)
    try:
        return sorted(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_tables_without_a_recorded_revision_are_named_and_refused_by_every_command(
        target: Target) -> None:
    _forget_revision(target)
    before = _tables(target)
    for command in (["status"], ["enqueue", "k"], ["migrate"]):
        r = run_cli(target, *command, "--json")
        assert r.code == 8, (command, r.out, r.err)
        err = r.json["error"]
        assert err["code"] == "schema_unknown", (command, err)
        assert "no schema revision" in err["message"] and "jobs" in err["message"]
        assert "already exists" not in err["message"]
    assert _tables(target) == before


# --- numbers -----------------------------------------------------------------------------------


def test_a_huge_integer_is_refused_in_plain_words(coord: Coordinator, cli) -> None:
    r = cli("enqueue", "k", "--payload", '{"n": ' + "7" * 5000 + "}", "--json")
    assert r.code == 2, r.out
    message = r.json["error"]["message"]
    assert "5000 digits" in message and "set_int_max_str_digits" not in message
    with pytest.raises(InvalidInput) as caught:
        coord.enqueue("k", {"n": 10**5000})
    assert "set_int_max_str_digits" not in caught.value.message
    assert "digits" in caught.value.message


@pytest.mark.parametrize("spelling", ["5_0", " 5", "5 ", "5e3", "1E2", "0x10", "٣", "²",
                                      "inf", "nan", "+5", "5..0", "", "-", "."])
def test_seconds_are_plain_decimals(spelling: str) -> None:
    with pytest.raises(InvalidInput):
        v.seconds(spelling, "delay", 0, 10**6)


@pytest.mark.parametrize("spelling,value", [("5", 5.0), ("2.5", 2.5), (".5", 0.5),
                                            ("5.", 5.0), ("0", 0.0), ("007", 7.0)])
def test_plain_decimal_seconds_are_accepted(spelling: str, value: float) -> None:
    assert v.seconds(spelling, "delay", 0, 10**6) == value


@pytest.mark.parametrize("spelling", ["5_0", " 5", "+5", "٣", "1e3", "0x10"])
def test_integers_are_plain_decimals(spelling: str) -> None:
    with pytest.raises(InvalidInput):
        v.integer(spelling, "limit", 0, 10**6)


@pytest.mark.parametrize("spelling", [" 2w ", "2 w", "1e3s", "5_0m", "٣d", "+5s"])
def test_durations_are_plain_decimals_with_one_unit(spelling: str) -> None:
    with pytest.raises(InvalidInput):
        v.duration(spelling, "older_than", 0, 10**9)


def test_the_cli_refuses_python_number_syntax_and_changes_nothing(coord: Coordinator, cli
                                                                  ) -> None:
    before = dump(coord)
    for args in (["--delay", "5_0"], ["--delay", "1e3"], ["--deadline", " 60"]):
        r = cli("enqueue", "k", *args, "--json")
        assert r.code == 2 and r.json["error"]["details"]["field"] in ("delay", "deadline")
    assert dump(coord) == before


# --- one message ---------------------------------------------------------------------------


def test_a_busy_error_reads_the_same_as_str_and_message(sqlite_target: Target) -> None:
    blocker = sqlite3.connect(sqlite_target.sqlite_path or "", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with Coordinator.open(sqlite_target, busy_timeout=0.05) as c, \
                pytest.raises(DatabaseBusy) as caught:
            c.enqueue("k", {})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    err = caught.value
    assert "attempts" in err.message  # rewritten after construction by the busy retry
    assert str(err) == err.message


# --- migrate's errors ------------------------------------------------------------------------


def test_migrate_classifies_raw_driver_errors_and_keeps_migration_failed_for_scripts(
        tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # rollback journal: nobody else may even read
    other = sqlite3.connect(path, timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError) as busy:
            other.execute("PRAGMA foreign_keys=OFF").fetchall()
            other.execute("SELECT * FROM sqlite_master").fetchall()
    finally:
        holder.execute("ROLLBACK")
    err = _migration_error(busy.value)
    assert isinstance(err, DatabaseBusy) and err.exit_code == 5, err
    # An error of a migration's own statement is not the database's state: exit 8.
    with pytest.raises(sqlite3.OperationalError) as exists:
        other.execute("CREATE TABLE t (x)")
    other.close()
    holder.close()
    failed = _migration_error(exists.value)
    assert isinstance(failed, SchemaMismatch) and failed.code == "migration_failed"
    assert type(_migration_error(RuntimeError("alembic said no"))) is SchemaMismatch
    assert type(failed) is not JobcoordError
