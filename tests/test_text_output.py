"""Text output cannot be forged by data: every text rendering of the CLI escapes control
characters (C0, DEL, C1, the Unicode line and paragraph separators, bidi overrides) that come
from data, so a payload, a result, an error or a name can never start a line of its own,
move the cursor, recolour the terminal or reorder what is shown. JSON output stays JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

from freezegun import freeze_time

from jobcoord.cli import safe_text
from jobcoord.service import Coordinator
from tests.timeline import IDLE_ON_AC

#: What must never reach a terminal from data.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u061c"
                    "\u202a-\u202e\u2066-\u2069]")
FORGED = {
    "note": "hi\nstatus: succeeded",
    "cr": "x\rstatus: dead",
    "esc": "\x1b[2K\x1b[1Astatus: succeeded",
    "ls": "a\u2028status: succeeded",
    "ps": "b\u2029c",
    "c1": "\x85status: succeeded\x9b",
    "bidi": "\u202edeecus\u2066\u2069",
    "del": "\x7f",
    "key\nstatus": "succeeded",
}


def assert_clean(text: str, real_lines: int | None = None) -> None:
    assert not UNSAFE.search(text), repr(text)
    # No line starts with a forged top-level field.
    assert sum(1 for line in text.splitlines() if line.startswith("status:")) <= 1, text


def test_show_escapes_a_payload_that_tries_to_forge_a_status_line(coord: Coordinator, cli
                                                                  ) -> None:
    job = coord.enqueue("work", FORGED)["job_id"]
    r = cli("show", str(job))
    assert r.code == 0, r.err
    assert_clean(r.out)
    assert "status: waiting" in r.out.splitlines()[1:] or any(
        line.strip() == "status: waiting" for line in r.out.splitlines())
    assert "hi\\nstatus: succeeded" in r.out  # shown, escaped, not dropped
    # JSON output carries the data exactly.
    j = cli("show", str(job), "--json")
    assert json.loads(j.out)["job"]["payload"] == FORGED


def test_every_text_rendering_of_data_is_escaped(coord: Coordinator, cli, tmp_path: Path
                                                 ) -> None:
    with freeze_time("2026-03-01 09:00:00"):
        job = coord.enqueue("work", FORGED)["job_id"]
        assert_clean(cli("jobs").out)
        assert_clean(cli("explain", str(job)).out)
        assert_clean(cli("status").out)
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        claimed = cli("claim", "w1")
        assert claimed.code == 0
        assert_clean(claimed.out)
        assert_clean(cli("workers").out)
        done = cli("fail", str(job), "--worker", "w1", "--epoch", "1", "--error",
                   "boom\nstatus: succeeded\x1b[0m\u2028", "--permanent")
        assert done.code == 0, done.err
        assert_clean(done.out)
        assert_clean(cli("show", str(job)).out)
        assert_clean(cli("explain", str(job)).out)


def test_error_messages_on_stderr_escape_the_data_they_echo(cli, tmp_path: Path) -> None:
    missing = str(tmp_path / "no\nstatus: succeeded\u2028\x1b[1A.json")
    r = cli("enqueue", "work", "--payload-file", missing)
    assert r.code == 2 and r.out == ""
    assert r.err.count("\n") == 1 and not UNSAFE.search(r.err.rstrip("\n")), repr(r.err)
    j = cli("enqueue", "work", "--payload-file", missing, "--json")
    assert missing in json.loads(j.out)["error"]["message"]  # JSON: the data as it is
    bad = cli("enqueue", "work", "--payload", '{"a": "\u2028"')  # invalid JSON
    assert bad.code == 2 and not UNSAFE.search(bad.err.rstrip("\n")), repr(bad.err)


def test_safe_text_escapes_each_class_and_keeps_ordinary_text() -> None:
    assert safe_text("héllo wörld 名前 ✓") == "héllo wörld 名前 ✓"
    assert safe_text("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert safe_text("\x00\x1b\x7f\x85\x9b") == "\\x00\\x1b\\x7f\\x85\\x9b"
    assert safe_text("\u2028\u2029\u202e\u2066\u200f") == "\\u2028\\u2029\\u202e\\u2066\\u200f"
