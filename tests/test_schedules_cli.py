"""`jobcoord schedule add|ls|pause|resume|rm|tick` on both databases: the contract's options,
one JSON object per command, documented exit codes (2 bad input, 4 unknown or duplicate
name) with nothing changed, and `schedule ls` / `explain` showing the next fire time and the
last outcome."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.service import Coordinator
from tests.conftest import dump


def test_the_issue_example_adds_a_schedule_and_ls_shows_its_next_fire(cli: Any) -> None:
    with freeze_time("2026-03-02T12:00:00Z"):
        r = cli("schedule", "add", "nightly-index", "--cron", "0 2 * * *", "--tz",
                "Europe/Berlin", "--window", "4h", "reindex", "--payload",
                '{"corpus": "notes"}', "--priority", "P2", "--catchup", "latest",
                "--overlap", "skip", "--json")
        assert r.code == 0, r.err
        assert r.json == {"schedule": "nightly-index", "created": True,
                          "next_fire_at": "2026-03-03T01:00:00Z"}
        ls = cli("schedule", "ls", "--json")
    got = ls.json["schedules"][0]
    assert {k: got[k] for k in ("name", "kind", "cron", "tz", "window_s", "catchup",
                                "overlap", "priority", "payload", "next_fire_at", "last")
            } == {"name": "nightly-index", "kind": "reindex", "cron": "0 2 * * *",
                  "tz": "Europe/Berlin", "window_s": 14400.0, "catchup": "latest",
                  "overlap": "skip", "priority": 2, "payload": {"corpus": "notes"},
                  "next_fire_at": "2026-03-03T01:00:00Z", "last": None}


def test_tick_fires_and_ls_and_explain_show_the_last_outcome_and_next_fire(
        cli: Any, target: Any) -> None:
    with freeze_time("2026-03-02T09:59:00Z") as frozen:
        assert cli("schedule", "add", "hourly", "k", "--every", "1h", "--window", "30m",
                   "--json").code == 0
        frozen.move_to("2026-03-02T10:00:02Z")
        t = cli("schedule", "tick", "--json")
        assert t.code == 0 and t.json["fired"] == 1
        job_id = t.json["schedules"][0]["jobs"][0]
        ls = cli("schedule", "ls")
        assert ls.code == 0
        assert "hourly: k, every 3600s; next 2026-03-02T11:00:00Z; last " \
               f"2026-03-02T10:00:00Z fired (job {job_id} waiting)" in ls.out
        text = cli("explain", str(job_id))
        assert "- fired by schedule hourly for slot 2026-03-02T10:00:00Z, window ends " \
               "2026-03-02T10:30:00Z; next fire 2026-03-02T11:00:00Z; last outcome fired " \
               "(slot 2026-03-02T10:00:00Z)" in text.out
        ex = cli("explain", str(job_id), "--json")
    assert ex.json["schedule"] == {
        "name": "hourly", "slot": "2026-03-02T10:00:00Z",
        "window_ends_at": "2026-03-02T10:30:00Z", "next_fire_at": "2026-03-02T11:00:00Z",
        "paused": False, "last": {"slot": "2026-03-02T10:00:00Z", "outcome": "fired",
                                  "job_id": job_id, "job_status": "waiting",
                                  "at": "2026-03-02T10:00:02Z", "detail": None}}


def test_pause_resume_and_rm(cli: Any) -> None:
    with freeze_time("2026-03-02T09:30:00Z"):
        cli("schedule", "add", "hourly", "k", "--every", "1h")
        p = cli("schedule", "pause", "hourly", "--json")
        assert p.code == 0 and p.json["paused"] is True
        assert "hourly: k, every 3600s; paused; never fired" in cli("schedule", "ls").out
        r = cli("schedule", "resume", "hourly", "--json")
        assert r.code == 0 and r.json["next_fire_at"] == "2026-03-02T10:00:00Z"
        assert cli("schedule", "rm", "hourly", "--json").json == {"schedule": "hourly",
                                                                  "removed": True}
        assert cli("schedule", "ls", "--json").json == {"schedules": []}


BAD = [
    (["--cron", "0 2 * *"], "fields"),
    (["--cron", "0 2 * * *", "--tz", "Mars/Olympus"], "IANA"),
    (["--every", "0"], "outside [1, "),
    (["--every", "-15m"], "not a duration"),
    (["--every", "15m", "--window", "0"], "longer than zero"),
    (["--every", "15m", "--window", "4 hours"], "not a duration"),
    (["--every", "15m", "--catchup", "all:x"], "catchup"),
    (["--every", "15m", "--payload", "[1]"], "payload"),
    (["--every", "15m", "--priority", "P9"], "priority"),
    ([], "exactly one"),
]


@pytest.mark.parametrize(("args", "words"), BAD, ids=[b[1] for b in BAD])
def test_bad_input_exits_2_with_a_clear_message_and_changes_nothing(
        cli: Any, target: Any, args: list[str], words: str) -> None:
    with Coordinator.open(target) as c:
        before = dump(c)
        r = cli("schedule", "add", "nightly", "k", *args, "--json")
        assert r.code == 2, r.out + r.err
        assert r.json["error"]["code"] == "invalid_input" and words in r.json["error"]["message"]
        assert dump(c) == before


def test_a_name_with_spaces_and_signs_is_refused_and_an_unknown_one_exits_4(cli: Any) -> None:
    r = cli("schedule", "add", "x y#?%", "k", "--every", "1h", "--json")
    assert r.code == 2 and r.json["error"]["code"] == "invalid_input"
    for verb in ("pause", "resume", "rm"):
        r = cli("schedule", verb, "nope", "--json")
        assert r.code == 4 and r.json["error"]["code"] == "schedule_not_found"
    assert cli("schedule", "add", "n", "k", "--every", "1h").code == 0
    r = cli("schedule", "add", "n", "k", "--every", "2h", "--json")
    assert r.code == 4 and r.json["error"]["code"] == "schedule_exists"
    assert cli("schedule", "ls", "--json").json["schedules"][0]["every_s"] == 3600.0
