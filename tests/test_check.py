"""`check`: every broken application invariant is reported, and the exit code is 7."""

from __future__ import annotations

import sqlite3

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.conftest import dump, run_cli
from tests.sample_state import populate
from tests.timeline import IDLE_ON_AC


def test_check_reports_each_broken_invariant_and_exits_7(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    populate(c)
    assert run_cli(sqlite_target, "check", "--full", "--json").code == 0
    raw = sqlite3.connect(sqlite_target.sqlite_path or "", isolation_level=None)
    raw.execute("DELETE FROM leases")  # a running job now has no lease
    raw.execute("UPDATE jobs SET result_json = NULL WHERE status = 'succeeded'")
    raw.close()
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7
    found = {v["invariant"] for v in r.json["violations"]}
    assert {"running_without_lease", "succeeded_without_result"} <= found
    c.close()


def test_check_reports_a_missing_table_and_exits_7(target: Target) -> None:
    """A database at the current revision whose limits or schedules table is gone (dropped
    by hand, a partial restore) is damaged: `check` says so (exit 7) instead of `ok`."""
    from sqlalchemy import text

    c = Coordinator.open(target)
    c.set_limit("llm", 1)
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(text("DROP TABLE limits"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    missing = [v for v in r.json["violations"] if v["invariant"] == "table_missing"]
    assert missing and missing[0]["tables"] == ["limits"]


def test_check_reports_a_schedule_whose_stored_row_is_unreadable_and_exits_7(
        target: Target) -> None:
    """A schedule row damaged by hand (its payload not a JSON object, its time zone unknown)
    would copy the damage into every job it fires: `check` names it (exit 7)."""
    from sqlalchemy import text

    c = Coordinator.open(target)
    c.add_schedule("good", "k", every=60)
    c.add_schedule("badpayload", "k", every=60)
    c.add_schedule("badzone", "k", cron="0 2 * * *", tz="Europe/Berlin")
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(text("UPDATE schedules SET payload_json = 'not json' "
                          "WHERE name = 'badpayload'"))
        conn.execute(text("UPDATE schedules SET tz = 'Nowhere/Zone' WHERE name = 'badzone'"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "schedule_unreadable"]
    assert found and found[0]["schedules"] == ["badpayload", "badzone"]


@pytest.mark.parametrize(("column", "text", "needs"), [
    ("payload_json", "{broken", None), ("needs_json", "nope", "ram_mb=10")])
def test_a_job_whose_stored_json_is_damaged_is_exit_7_naming_it_and_check_reports_it(
        target: Target, column: str, text: str, needs: str | None) -> None:
    """A job's JSON column written by hand: show, explain and claim say which job and which
    column (exit 7, the database is damaged), claim takes nothing, and `check` lists it."""
    from sqlalchemy import text as sql_text

    c = Coordinator.open(target)
    good = c.enqueue("k", {"n": 1}, priority=3)["job_id"]
    bad = c.enqueue("k", {"n": 2}, priority=0, needs=needs)["job_id"]
    c.heartbeat("w1", readings={**IDLE_ON_AC, "memory_available_mb": 1000})
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(sql_text(f"UPDATE jobs SET {column} = :t WHERE job_id = :j"),
                     {"t": text, "j": bad})
    before = dump(c)
    for args in (("show", str(bad)), ("explain", str(bad)), ("claim", "w1")):
        r = run_cli(target, *args, "--json")
        assert r.code == 7, (args, r)
        err = r.json["error"]
        assert err["code"] == "job_unreadable", (args, err)
        assert err["message"].startswith(f"job {bad}: its stored {column} is not valid JSON")
        assert err["details"] == {"job_id": bad, "column": column}
    assert dump(c) == before  # the claim took nothing
    assert run_cli(target, "show", str(good), "--json").code == 0
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "job_unreadable"]
    assert found == [{"invariant": "job_unreadable", "job_ids": [bad],
                      "columns": [{"job_id": bad, "column": column}]}]
    c.close()
