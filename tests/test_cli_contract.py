"""The CLI contract other people's scripts rely on: one JSON object per command with --json,
documented exit codes, `{"error": {"code", "message"}}` on failure, no traceback for a user's
mistake, and bad input for every command refused with exit 2 before anything is written
(every table is compared before and after). SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.db import CORE_REVISIONS, Database, Target, resolve_target
from jobcoord.errors import EXIT_CODES
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC

from .conftest import run_cli

STATUSES = ("waiting", "running", "succeeded", "dead", "cancelled", "unknown")

#: The exit-code table of the CLI contract (README.md "Exit codes"), verbatim.
CONTRACT_EXIT_CODES = """
| 0 | done |
| 1 | unexpected internal error (traceback only with `--debug`) |
| 2 | bad usage or invalid input (nothing was changed) |
| 3 | `claim` found no eligible job (the JSON says why) |
| 4 | refused by a coordinator rule: lease expired, not the owner, stale epoch, job finished, \
job not found or not visible to this tenant, idempotency conflict, illegal transition |
| 5 | database busy: still locked after the bounded retries; try again |
| 6 | storage unavailable: cannot open, read-only, disk full, I/O error |
| 7 | corrupt: not a database, malformed, integrity or invariant check failed |
| 8 | schema mismatch: not migrated, older than the code, or newer than the code |
"""


def one_json_object(out: str) -> dict[str, Any]:
    """stdout must be exactly one JSON object (one line)."""
    assert out.endswith("\n") and out.count("\n") == 1, out
    value = json.loads(out)
    assert isinstance(value, dict), out
    return value


def assert_error(r: Any, exit_code: int, code: str | None = None) -> dict[str, Any]:
    assert r.code == exit_code, (r.code, r.out, r.err)
    body = one_json_object(r.out)
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"code", "message"} <= set(err) <= {"code", "message", "details"}, err
    assert re.fullmatch(r"[a-z][a-z0-9_]*", err["code"]), err
    assert isinstance(err["message"], str) and err["message"], err
    if code is not None:
        assert err["code"] == code, err
    assert "Traceback" not in r.err and "Traceback" not in r.out
    assert r.err.startswith("jobcoord: error: "), r.err
    return err


@pytest.fixture
def world(coord: Coordinator) -> Iterator[dict[str, str]]:
    """Job R running on worker w1 at epoch 1 (45 s lease), job W waiting, under a frozen
    clock so the lease stays live for the whole test."""
    with freeze_time("2026-03-01 09:00:00"):
        running = coord.enqueue("work", {"n": 1}, priority=0)["job_id"]
        coord.heartbeat("w1", roles=["gpu"], readings=IDLE_ON_AC)
        coord.claim("w1")
        waiting = coord.enqueue("work", {"n": 2}, priority=1, role="gpu", key="k-w")["job_id"]
        yield {"R": str(running), "W": str(waiting), "E": "1"}


# --- exit codes --------------------------------------------------------------------------------


def test_exit_code_table_matches_the_contract():
    # (the backslash in row 4 only continues the string: the row is one line)
    design = {int(n): text for n, text in re.findall(r"^\| (\d) \| (.+) \|$",
                                                     CONTRACT_EXIT_CODES, re.M)}
    # 130 (Ctrl-C) is the shell's convention, on top of the contract's own codes.
    assert set(EXIT_CODES) == set(design) | {130} and set(design) == set(range(9))
    assert "illegal transition" in design[4]
    # The same meaning under each number (the code's wording is shorter).
    keywords = {0: "done", 1: "internal", 2: "invalid input", 3: "claim", 4: "refused",
                5: "busy", 6: "storage unavailable", 7: "corrupt", 8: "schema"}
    for number, word in keywords.items():
        assert word in design[number] and word in EXIT_CODES[number], number


def test_each_operator_outcome_has_its_exit_code(coord, cli, world):
    r = cli("show", world["W"], "--json")
    assert r.code == 0 and one_json_object(r.out)["job"]["status"] == "waiting"
    assert_error(cli("enqueue", "work", "--priority", "9", "--json"), 2, "invalid_input")
    coord.heartbeat("w2", roles=["cpu"], readings={"memory_used_pct": 99})
    r = cli("claim", "w2", "--json")
    assert r.code == 3
    assert one_json_object(r.out) == {"job": None, "reason": "memory_gate",
                                      "detail": r.json["detail"]}
    assert r.err == ""
    assert_error(cli("complete", world["R"], "--worker", "w2", "--epoch", "1", "--json"), 4,
                 "not_owner")
    assert_error(cli("show", "424242", "--json"), 4, "job_not_found")
    assert_error(cli("enqueue", "work", "--payload", '{"n": 3}', "--priority", "1", "--role",
                     "gpu", "--key", "k-w", "--json"), 4, "idempotency_conflict")
    assert_error(cli("retry", world["W"], "--json"), 4, "illegal_transition")


def test_a_database_that_is_not_migrated_exits_8(tmp_path):
    target = resolve_target(db=str(tmp_path / "empty.db"))
    Database.open(target, create=True).close()
    assert_error(run_cli(target, "jobs", "--json"), 8)


def test_usage_errors_exit_2_with_a_json_error(coord, cli, world):
    before = dump(coord)
    assert_error(cli("frobnicate", "--json"), 2, "usage_error")
    assert_error(cli("complete", world["R"], "--epoch", "1", "--json"), 2, "usage_error")
    assert_error(cli("enqueue", "--json"), 2, "usage_error")
    assert_error(cli("reconcile", world["R"], "--as", "finished", "--reason", "x", "--json"),
                 2, "usage_error")
    assert_error(cli("claim", "w1", "--no-such-flag", "--json"), 2, "usage_error")
    assert dump(coord) == before


def test_without_json_errors_are_one_line_on_stderr_and_stdout_stays_empty(coord, cli, world):
    r = cli("show", "abc")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("jobcoord: error: job_id") and r.err.count("\n") == 1
    r = cli("complete", world["R"], "--worker", "w9", "--epoch", "1")
    assert r.code == 4 and r.out == "" and "Traceback" not in r.err


# --- every command prints one JSON object -------------------------------------------------------


def test_every_lifecycle_command_prints_exactly_one_json_object(coord, cli, world, tmp_path):
    R, W, E = world["R"], world["W"], world["E"]
    ok = [
        ("status",), ("check",), ("workers",), ("jobs",), ("jobs", "--status", "running"),
        ("show", R), ("explain", W),
        ("heartbeat", "w1", "--role", "gpu", "--readings", json.dumps(IDLE_ON_AC)),
        ("renew", R, "--worker", "w1", "--epoch", E),
        ("checkpoint", R, "--worker", "w1", "--epoch", E, "--name", "step",
         "--data", '{"n": 1}'),
        ("effect", R, "--worker", "w1", "--epoch", E),
        ("complete", R, "--worker", "w1", "--epoch", E, "--result", '{"ok": true}'),
        ("enqueue", "work", "--payload", '{"n": 3}', "--priority", "P2"),
        ("claim", "w1", "--lease", "30"),
        ("fail", W, "--worker", "w1", "--epoch", "1", "--error", "boom", "--permanent"),
        ("retry", W),
        ("cancel", W),
        ("reap",),
    ]
    for args in ok:
        r = cli(*args, "--json")
        assert r.code == 0, (args, r.out, r.err)
        one_json_object(r.out)
    # The claim above took job W (P1 before the P2 job); refusals print one object too.
    r = cli("claim", "nobody", "--json")
    assert r.code == 3 and one_json_object(r.out)["reason"] == "heartbeat_missing"


def test_reconcile_prints_one_json_object(coord, cli):
    with freeze_time("2026-03-01 09:00:00") as clock:
        job_id = coord.enqueue("pay", {})["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        epoch = coord.claim("w1", lease_s=5)["lease"]["epoch"]
        coord.mark_effect(job_id, "w1", epoch)
        clock.tick(6)
        coord.reap()
        r = cli("reconcile", str(job_id), "--as", "succeeded", "--reason", "provider says paid",
                "--result", '{"paid": true}', "--json")
        assert r.code == 0, r.out
        assert one_json_object(r.out) == {"job_id": job_id, "status": "succeeded"}
        assert coord.show(job_id)["job"]["result"] == {"paid": True}


# --- bad input for every command: exit 2 and nothing changes -------------------------------------

BAD_IDS = ["abc", "-1", "0", str(2**63), "1e3", "", "1.0", " ", "0x10", "٣", "²", " 3",
           "--3", "+3"]
BAD_EPOCHS = ["abc", "-1", "1.5", str(2**31), str(2**63), "", "nan", "1e3"]
BAD_LEASES = ["0", "-5", "nan", "inf", "-inf", "1e12", "abc", "", str(12 * 3600 + 1)]
BAD_PRIORITIES = ["-1", "4", "high", "nan", "1.5", "P4", "", "P-1", "p", "²"]
BAD_ATTEMPTS = ["0", "-1", str(10**9), "x", "1.5", "nan", ""]
BAD_SECONDS = ["-1", "nan", "inf", "soon", "", "1e12"]
BAD_NAMES = ["a\x00b", "bad\udcffname", "", "two words", "x');DROP TABLE jobs;--",
             "admin' OR '1'='1", "a" * 201, "tab\tname", "new\nline"]
BAD_JSON_OBJECTS = ["{bad", '{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}',
                    '{"a": 1, "a": 2}', "[" * 100 + "]" * 100, "[1]", "", '"\\ud800"',
                    '{"a": "\\u0000"}'.replace("\\u0000", "\\ud800")]
BAD_JSON = ["{bad", "NaN", '{"a": Infinity}', '{"a": 1, "a": 2}', "[" * 100 + "]" * 100,
            "", '"\\udfff"']


def _cases(ids: dict[str, str]) -> dict[str, list[tuple[str, ...]]]:
    R, E = ids["R"], ids["E"]
    fence = ("--worker", "w1", "--epoch", E)
    fenced = {
        "renew": (),
        "complete": ("--result", "{}"),
        "fail": ("--error", "boom"),
        "effect": (),
        "checkpoint": ("--name", "step"),
    }
    cases: dict[str, list[tuple[str, ...]]] = {}
    for cmd, extra in fenced.items():
        cases[cmd] = (
            [(cmd, bad, *fence, *extra) for bad in BAD_IDS]
            + [(cmd, R, "--worker", "w1", "--epoch", bad, *extra) for bad in BAD_EPOCHS]
            + [(cmd, R, "--worker", bad, "--epoch", E, *extra) for bad in BAD_NAMES]
            + [(cmd, R, *fence, *extra, "--tenant", bad) for bad in BAD_NAMES]
        )
    cases["renew"] += [("renew", R, *fence, "--lease", bad) for bad in BAD_LEASES]
    cases["complete"] += [("complete", R, "--worker", "w1", "--epoch", E, "--result", bad)
                          for bad in BAD_JSON]
    cases["complete"].append(("complete", R, *fence, "--result", "{}", "--result-file", "-"))
    cases["complete"].append(("complete", R, *fence, "--result-file", "/nonexistent/r.json"))
    cases["fail"] += [("fail", R, *fence, "--error", bad) for bad in ("a\x00b", "\udcff")]
    cases["fail"].append(("fail", R, *fence, "--error", "x" * (64 * 1024 + 1)))
    cases["checkpoint"] += [("checkpoint", R, *fence, "--name", bad) for bad in BAD_NAMES]
    cases["checkpoint"] += [("checkpoint", R, *fence, "--name", "s", "--data", bad)
                            for bad in BAD_JSON]
    cases["enqueue"] = (
        [("enqueue", bad) for bad in BAD_NAMES]
        + [("enqueue", "work", "--priority", bad) for bad in BAD_PRIORITIES]
        + [("enqueue", "work", "--max-attempts", bad) for bad in BAD_ATTEMPTS]
        + [("enqueue", "work", "--deadline", bad) for bad in [*BAD_SECONDS, "0"]]
        + [("enqueue", "work", "--delay", bad) for bad in BAD_SECONDS]
        + [("enqueue", "work", "--delay", "60", "--deadline", bad) for bad in ("30", "60")]
        + [("enqueue", "work", "--role", bad) for bad in BAD_NAMES if bad]
        + [("enqueue", "work", "--tenant", bad) for bad in BAD_NAMES]
        + [("enqueue", "work", "--key", bad) for bad in ("a\x00b", "\udcff", "", "k" * 201)]
        + [("enqueue", "work", "--payload", bad) for bad in BAD_JSON_OBJECTS]
        + [("enqueue", "work", "--payload", "{}", "--payload-file", "-"),
           ("enqueue", "work", "--payload-file", "/nonexistent/p.json")]
    )
    cases["heartbeat"] = (
        [("heartbeat", bad) for bad in BAD_NAMES]
        + [("heartbeat", "w9", "--role", bad) for bad in BAD_NAMES]
        + [("heartbeat", "w9", "--kind", bad) for bad in BAD_NAMES]
        + [("heartbeat", "w9", "--readings", bad) for bad in BAD_JSON_OBJECTS]
    )
    cases["claim"] = (
        [("claim", bad) for bad in BAD_NAMES]
        + [("claim", "w1", "--lease", bad) for bad in BAD_LEASES]
        + [("claim", "w1", "--kind", bad) for bad in BAD_NAMES]
        + [("claim", "w1", "--tenant", bad) for bad in BAD_NAMES]
    )
    for cmd in ("cancel", "retry", "show", "explain"):
        cases[cmd] = ([(cmd, bad) for bad in BAD_IDS]
                      + [(cmd, R, "--tenant", bad) for bad in BAD_NAMES])
    cases["reconcile"] = (
        [("reconcile", bad, "--as", "dead", "--reason", "r") for bad in BAD_IDS]
        + [("reconcile", R, "--as", "dead", "--reason", bad) for bad in ("", "a\x00b")]
        + [("reconcile", R, "--as", bad, "--reason", "r") for bad in ("", "done", "DEAD")]
        + [("reconcile", R, "--as", "succeeded", "--reason", "r")]  # needs --result
        + [("reconcile", R, "--as", "succeeded", "--reason", "r", "--result", bad)
           for bad in BAD_JSON]
        + [("reconcile", R, "--as", "dead", "--reason", "r", "--tenant", bad)
           for bad in BAD_NAMES]
    )
    cases["jobs"] = (
        [("jobs", "--status", bad) for bad in ("", "done", "WAITING", "waiting'--")]
        + [("jobs", "--kind", bad) for bad in BAD_NAMES]
        + [("jobs", "--tenant", bad) for bad in BAD_NAMES]
        + [("jobs", "--limit", bad) for bad in ("0", "-1", "abc", "1e3", str(10**6), "")]
    )
    cases["reap"] = [("reap", "--limit", bad) for bad in ("0", "-1", "abc", "1.5", "")]
    cases["status"] = [("status", "--tenant", bad) for bad in BAD_NAMES]
    cases["prune"] = (
        [("prune", "--older-than", bad) for bad in ("", "soon", "-1", "1y", "nan", "1e400")]
        + [("prune", "--older-than", "0", "--status", bad)
           for bad in ("running", "unknown", "waiting", "", "SUCCEEDED")]
        + [("prune", "--older-than", "0", "--batch", bad) for bad in ("0", "abc", "1e6")]
        + [("prune", "--older-than", "0", "--pause", bad) for bad in ("-1", "abc", "61")]
        + [("prune", "--older-than", "0", "--tenant", bad) for bad in BAD_NAMES]
    )
    return cases


COMMANDS = ["renew", "complete", "fail", "effect", "checkpoint", "enqueue", "heartbeat",
            "claim", "cancel", "retry", "show", "explain", "reconcile", "jobs", "reap",
            "status", "prune"]


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_input_exits_2_and_changes_nothing(coord, cli, world, command):
    cases = _cases(world)[command]
    assert len(cases) >= 5
    before = dump(coord)
    for args in cases:
        r = cli(*args, "--json")
        err = assert_error(r, 2)
        assert err["code"] in ("invalid_input", "usage_error", "payload_too_large",
                               "result_too_large", "checkpoint_too_large"), (args, err)
    assert dump(coord) == before


def test_every_command_has_bad_input_cases():
    listed = set(_cases({"R": "1", "W": "2", "E": "1"}))
    assert listed == set(COMMANDS)


def test_refusals_name_the_field_that_was_wrong(cli, world):
    expectations = [
        (("show", "abc"), "job_id"),
        (("renew", world["R"], "--worker", "w1", "--epoch", "x"), "epoch"),
        (("claim", "w1", "--lease", "nan"), "lease"),
        (("enqueue", "work", "--priority", "high"), "priority"),
        (("enqueue", "work", "--max-attempts", "0"), "max_attempts"),
        (("enqueue", "work", "--deadline", "-1"), "deadline"),
        (("enqueue", "work", "--delay", "nan"), "delay"),
        (("enqueue", "a\x00b"), "kind"),
        (("enqueue", "work", "--tenant", "x y"), "tenant"),
        (("enqueue", "work", "--payload", "{bad"), "payload"),
        (("heartbeat", "w1", "--readings", '{"memory_used_pct": 101}'), "readings"),
        (("complete", world["R"], "--worker", "w1", "--epoch", "1", "--result", "{"), "result"),
    ]
    for args, field in expectations:
        message = assert_error(cli(*args, "--json"), 2)["message"]
        assert message.startswith(field) or f"--{field}" in message, (args, message)


# --- data that looks like SQL is only data -------------------------------------------------------


def test_sql_looking_text_is_stored_verbatim_as_data(coord, cli, world):
    evil = "x'); DROP TABLE jobs; --"
    payload = {"q": evil, "t": "'; DELETE FROM leases WHERE '1'='1"}
    r = cli("enqueue", "work", "--payload", json.dumps(payload), "--key", evil, "--json")
    assert r.code == 0, r.out
    job_id = r.json["job_id"]
    r = cli("fail", world["R"], "--worker", "w1", "--epoch", "1", "--error", evil, "--json")
    assert r.code == 0, r.out
    shown = coord.show(job_id)["job"]
    assert shown["payload"] == payload and shown["idempotency_key"] == evil
    assert coord.show(int(world["R"]))["job"]["last_error"] == evil
    assert len(coord.jobs()["jobs"]) == 3
    # The same key again finds the same job: the key is compared as a value.
    again = cli("enqueue", "work", "--payload", json.dumps(payload), "--key", evil, "--json")
    assert again.json == {"job_id": job_id, "created": False}


# --- payload and result files, and stdin ---------------------------------------------------------


def test_payload_and_result_can_come_from_a_file_or_stdin(coord, cli, world, tmp_path):
    payload_file = tmp_path / "payload.json"
    payload_file.write_text('{"doc": "from a file", "n": [1, 2]}')
    r = cli("enqueue", "work", "--payload-file", str(payload_file), "--json")
    assert r.code == 0, r.out
    assert coord.show(r.json["job_id"])["job"]["payload"] == {"doc": "from a file",
                                                              "n": [1, 2]}
    r = cli("enqueue", "work", "--payload-file", "-", "--json",
            stdin='{"doc": "from stdin ✓"}'.encode())
    assert r.code == 0, r.out
    assert coord.show(r.json["job_id"])["job"]["payload"] == {"doc": "from stdin ✓"}

    r = cli("complete", world["R"], "--worker", "w1", "--epoch", "1", "--result-file", "-",
            "--json", stdin=b'{"summary": "done"}')
    assert r.code == 0, r.out
    assert coord.show(int(world["R"]))["job"]["result"] == {"summary": "done"}


def test_result_file_from_disk_is_stored_as_parsed_json(coord, cli, world, tmp_path):
    result_file = tmp_path / "result.json"
    result_file.write_text('[1, {"b": null}]')
    r = cli("complete", world["R"], "--worker", "w1", "--epoch", "1", "--result-file",
            str(result_file), "--json")
    assert r.code == 0, r.out
    assert coord.show(int(world["R"]))["job"]["result"] == [1, {"b": None}]


@pytest.mark.parametrize("data", [b"\xff\xfe{}", b'{"a": "\xc3"}', b"", b"{bad"])
def test_undecodable_or_invalid_stdin_is_refused_and_changes_nothing(coord, cli, world, data):
    before = dump(coord)
    assert_error(cli("enqueue", "work", "--payload-file", "-", "--json", stdin=data), 2)
    assert_error(cli("complete", world["R"], "--worker", "w1", "--epoch", "1",
                     "--result-file", "-", "--json", stdin=data), 2)
    assert dump(coord) == before


def test_status_of_a_new_database_counts_nothing(target: Target) -> None:
    out = run_cli(target, "status", "--json").json
    assert out["workers"] == 0 and out["active_leases"] == 0
    assert out["jobs"] == dict.fromkeys(STATUSES, 0)
    assert out["revisions"] == [CORE_REVISIONS[-1]]
    if target.sqlite_path:
        assert out["journal_mode"] == "wal"
        assert out["file_size_bytes"] > 0
        assert out["synchronous"] == "full"
        old_sqlite = sqlite3.sqlite_version_info < (3, 51, 3)
        assert ("WAL-reset" in " ".join(out.get("warnings", []))) == old_sqlite


def test_every_command_prints_exactly_one_json_object(target: Target) -> None:
    for args in (["status"], ["check"], ["jobs"], ["workers"], ["reap"]):
        r = run_cli(target, *args, "--json")
        assert r.code == 0, (args, r.err)
        assert isinstance(r.json, dict)
        assert r.out.count("\n") == 1
