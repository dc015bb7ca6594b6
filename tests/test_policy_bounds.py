"""Policy values are bounded, and no arithmetic on times can overflow.

A policy outside the documented bounds is refused when it is loaded (invalid_policy, exit 2,
naming the key), so no value can reach a time computation that overflows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobcoord.errors import InvalidInput
from jobcoord.policy import POLICY_BOUNDS, Policy
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC


def _policy_file(tmp_path: Any, body: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize(("key", "value"), [
    ("max_lease_s", "1e300"),
    ("max_lease_s", str(7 * 86400 + 1)),
    ("retry_base_s", "1e300"),
    ("retry_max_s", "1e300"),
    ("max_payload_bytes", "10000000000000"),
    ("max_result_bytes", str(64 * 1024 * 1024 + 1)),
    ("default_max_attempts", "1001"),
    ("heartbeat_max_age_s", "1e20"),
    ("max_releases", "100000"),
    ("max_memory_pct", "101"),
])
def test_policy_values_outside_their_bounds_are_refused_naming_the_key(coord, cli, tmp_path,
                                                                         key, value):
    path = _policy_file(tmp_path, f"{key} = {value}\n")
    r = cli("--policy", path, "claim", "w1", "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_policy"
    assert key in r.json["error"]["message"]
    with pytest.raises(InvalidInput) as caught:
        Policy.from_toml(path)
    assert caught.value.code == "invalid_policy" and key in caught.value.message


def test_every_policy_setting_has_bounds_and_the_defaults_lie_within_them():
    default = Policy()
    for name, (lo, hi) in POLICY_BOUNDS.items():
        assert lo <= getattr(default, name) <= hi, name
    assert set(POLICY_BOUNDS) >= {f for f in Policy.__dataclass_fields__
                                  if not isinstance(getattr(default, f), bool)}


def test_a_policy_built_in_python_is_bounded_too():
    with pytest.raises(InvalidInput) as caught:
        Policy(max_lease_s=1e300)
    assert caught.value.code == "invalid_policy" and "max_lease_s" in caught.value.message


@pytest.mark.parametrize("lease", ["1e100", "1e12", "inf", "nan"])
def test_a_huge_lease_is_invalid_input_not_an_overflow(coord, cli, lease):
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    r = cli("claim", "w1", "--lease", lease, "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_input"
    assert dump(coord) == before


def test_the_largest_retry_values_allowed_do_not_overflow(target, tmp_path, cli, clock):
    from jobcoord.service import Coordinator

    week = 7 * 86400.0
    coord = Coordinator.open(target, policy=Policy(retry_base_s=week, retry_max_s=week,
                                                   max_lease_s=week, default_lease_s=week))
    try:
        job_id = coord.enqueue("k", {}, max_attempts=50)["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        for _ in range(3):
            got = coord.claim("w1", lease_s=week)
            assert got["job"] is not None, got
            out = coord.fail(job_id, "w1", got["lease"]["epoch"], "again")
            assert out["status"] == "waiting"
            clock.tick(week + 1)
            coord.heartbeat("w1", readings=IDLE_ON_AC)
    finally:
        coord.close()
    path = _policy_file(tmp_path, f"retry_base_s = {week}\nretry_max_s = {week}\n")
    assert Policy.from_toml(path).backoff_s(1000) == week


@pytest.mark.parametrize(("policy", "command"), [
    ("max_lease_s = 1e300\n", ["claim", "w1", "--lease", "1e100"]),
    ("retry_base_s = 1e300\nretry_max_s = 1e300\n",
     ["fail", "1", "--worker", "w1", "--epoch", "1", "--error", "x"]),
    ("max_payload_bytes = 10000000000000\n", ["enqueue", "k", "--payload", "{}"]),
])
def test_the_reported_reproductions_are_refused_as_invalid_policy(coord, cli, tmp_path, policy,
                                                                   command):
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.claim("w1")
    before = dump(coord)
    r = cli("--policy", _policy_file(tmp_path, policy), *command, "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_policy"
    assert dump(coord) == before


@pytest.mark.parametrize(("body", "named"), [
    (b"max_memory_pct = 80\n# caf\xe9\n", "UTF-8"),        # a Latin-1 byte in a comment
    (b"policy = 5\n", "policy"),                           # [policy] must be a table
    (b'policy = "strict"\n', "policy"),
    (b"max_memory_pcnt = 1\n[policy]\nmax_memory_pct = 95\n", "max_memory_pcnt"),
    (b"max_memory_pct = 50\n[policy]\nmax_memory_pct = 95\n", "max_memory_pct"),
])
def test_a_policy_file_that_is_not_a_policy_is_invalid_policy_never_a_crash_or_ignored(
        coord, cli, tmp_path, body, named):
    """Not UTF-8, a `policy` key that is not a table, and settings outside a `[policy]`
    table (a typo, or a value the table would silently override) are invalid_policy (exit
    2) naming what is wrong, with nothing changed; they were exit 1 or silently dropped."""
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    path = tmp_path / "policy.toml"
    path.write_bytes(body)
    r = cli("--policy", str(path), "claim", "w1", "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_policy"
    assert named in r.json["error"]["message"]
    assert dump(coord) == before
    with pytest.raises(InvalidInput) as caught:
        Policy.from_toml(str(path))
    assert caught.value.code == "invalid_policy"


def test_a_policy_fifo_nobody_writes_to_is_invalid_policy_not_a_hang(coord, cli, tmp_path):
    """open() of a FIFO blocks until a writer comes, perhaps never: the policy is opened
    without blocking, and a pipe that gives nothing is refused (exit 2). A pipe with a
    writer (process substitution) is read as a file is."""
    import os
    import threading

    fifo = str(tmp_path / "policy.toml")
    os.mkfifo(fifo)
    r = cli("--policy", fifo, "status", "--json")
    assert r.code == 2 and r.json["error"]["code"] == "invalid_policy", r.out + r.err

    def write() -> None:
        with open(fifo, "w") as f:
            f.write("max_memory_pct = 70\n")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert Policy.from_toml(fifo).max_memory_pct == 70
    finally:
        writer.join(10)


@pytest.mark.parametrize("written", [b"", b"max_memory_pct = 7"], ids=["silent", "part"])
def test_a_policy_fifo_whose_writer_stays_open_is_invalid_policy_not_a_hang(
        tmp_path, written):
    """A writer that opened the FIFO and writes nothing, or part of the policy, and keeps it
    open: the whole read is bounded (5 s), then the policy is refused naming the file."""
    import json
    import os
    import subprocess
    import time

    from tests.serve_procs import jobcoord_argv

    fifo = str(tmp_path / "policy #1 100%.toml")
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer that stays, as long as the test does
    try:
        os.write(writer, written)
        start = time.monotonic()
        got = subprocess.run([*jobcoord_argv(), "--db", str(tmp_path / "q.db"), "--policy",
                              fifo, "status", "--json"], capture_output=True, timeout=60,
                             check=False)
        took = time.monotonic() - start
    finally:
        os.close(writer)
    assert got.returncode == 2, got.stderr.decode()[-2000:]
    error = json.loads(got.stdout.decode().splitlines()[-1])["error"]
    assert error["code"] == "invalid_policy" and fifo in error["message"], error
    assert took < 15, took


@pytest.mark.parametrize(("body", "named"), [
    ("artifacts = false\n", "artifacts"),                  # was skipped: `if not data`
    ("artifacts = []\n", "artifacts"),
    ('artifacts = "strict"\n', "artifacts"),
    ("[artifacts]\nkinds = 5\n", "artifacts.kinds"),       # were exit 1, internal_error
    ('[artifacts]\nkinds = "ab"\n', "artifacts.kinds"),
    ("[artifacts]\nkinds = true\n", "artifacts.kinds"),
    ('[artifacts]\nkinds = [["render", {max_bytes = 5}]]\n', "artifacts.kinds"),  # was dict()
    ("[artifacts.kinds]\nrender = 5\n", "artifacts.kinds.render"),
    ('[artifacts]\nvalidator = "check \\" unterminated"\n', "artifacts.validator"),
    ("[artifacts]\nvalidator = 5\n", "artifacts.validator"),
    ('[artifacts]\nvalidator = {check = "x"}\n', "artifacts.validator"),
    ('[artifacts]\nvalidator = ["check", 5]\n', "artifacts.validator"),
    ('[artifacts]\nvalidator = ""\n', "artifacts.validator"),
    ("[artifacts]\nmedia_types = 5\n", "artifacts.media_types"),
    ('[artifacts]\nmedia_types = "application/pdf"\n', "artifacts.media_types"),
    ('[artifacts]\nmedia_types = {"application/pdf" = 1}\n', "artifacts.media_types"),
    ('[artifacts]\nmax_bytes = "5"\n', "artifacts.max_bytes"),
    ("[artifacts]\nmax_bytes = -1\n", "artifacts.max_bytes"),
    ("[artifacts]\nmax_bytes = 5.0\n", "artifacts.max_bytes"),
    ("[artifacts]\nmax_bytes = true\n", "artifacts.max_bytes"),
    ('[artifacts.kinds.render]\nmax_bytes = "5"\n', "artifacts.kinds.render.max_bytes"),
    ("[artifacts.kinds.render]\nmedia_types = 5\n", "artifacts.kinds.render.media_types"),
    ('[artifacts.kinds.render]\nvalidator = "check \'x"\n', "artifacts.kinds.render.validator"),
    ("[artifacts.kinds.render]\nmax_byte = 5\n", "artifacts.kinds.render.max_byte"),
    ("[artifacts]\nmax_byte = 5\n", "artifacts.max_byte"),
    # A command without a program: every artifact of the kind would fail validator_failed.
    ('[artifacts]\nvalidator = [""]\n', "artifacts.validator"),
    ('[artifacts]\nvalidator = []\n', "artifacts.validator"),
    ('[artifacts]\nvalidator = ["", "--strict"]\n', "artifacts.validator"),
    ('[artifacts]\nvalidator = ["  "]\n', "artifacts.validator"),
    ("[artifacts]\nvalidator = '\"\" --strict'\n", "artifacts.validator"),
    ('[artifacts.kinds.render]\nvalidator = [""]\n', "artifacts.kinds.render.validator"),
])
def test_a_badly_typed_artifacts_setting_is_invalid_policy_naming_its_key(
        coord, cli, tmp_path, body, named):
    """Every `[artifacts]` value is checked for its type and shape: a wrong one is
    invalid_policy (exit 2) naming its key path, with nothing changed; some were exit 1
    (internal_error) and some were accepted or skipped silently."""
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    path = _policy_file(tmp_path, body)
    r = cli("--policy", path, "claim", "w1", "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_policy"
    assert named in r.json["error"]["message"]
    assert dump(coord) == before
    with pytest.raises(InvalidInput) as caught:
        Policy.from_toml(path)
    assert caught.value.code == "invalid_policy"
    assert named in caught.value.message


def test_a_well_typed_artifacts_table_is_still_accepted(tmp_path):
    path = _policy_file(tmp_path, (
        "[artifacts]\nmax_bytes = 100\nvalidator = [\"check\", \"--strict\"]\n"
        "[artifacts.kinds.render]\nmedia_types = [\"application/pdf\", \"image/png\"]\n"
        "validator = \"python 'check pdf.py'\"\n[artifacts.kinds.log]\nmax_bytes = 0\n"
        "[artifacts.kinds.any]\n"))
    settings = Policy.from_toml(path).artifacts
    assert settings.default.max_bytes == 100
    assert settings.default.validator == ("check", "--strict")
    render = settings.for_kind("render")
    assert render.max_bytes == 100
    assert render.media_types == ("application/pdf", "image/png")
    assert render.validator == ("python", "check pdf.py")
    assert settings.for_kind("log").max_bytes == 0
    assert settings.for_kind("any") == settings.default
    assert Policy.from_toml(_policy_file(tmp_path, "max_memory_pct = 80\n")).artifacts \
        .rules == {}


def test_a_validator_without_a_program_is_refused_when_declared_in_python_too():
    """`declare_kind` builds its rule with the same function the policy file's goes through."""
    from jobcoord.artifacts.settings import kind_rule

    for validator in ([""], ["", "x"], '"" x', ["\t"]):
        with pytest.raises(InvalidInput) as caught:
            kind_rule(validator=validator, where="kind 'render'")
        assert caught.value.code == "invalid_policy" and "validator" in caught.value.message
    # An empty argument after the program is an argument.
    assert kind_rule(validator=["check", ""]).validator == ("check", "")


#: Valid TOML nested deeper than the TOML reader can follow: a top-level value, a value
#: inside [artifacts], a validator inside a kind's table.
DEEP_POLICIES = {
    "top-level value": "max_memory_pct = " + "[" * 500 + "]" * 500 + "\n",
    "artifacts value": "[artifacts]\nmax_bytes = " + "{a=" * 500 + "1" + "}" * 500 + "\n",
    "kind validator": "[artifacts.kinds.render]\nvalidator = " + "[" * 5000 + "]" * 5000 + "\n",
}


@pytest.mark.parametrize("name", sorted(DEEP_POLICIES))
def test_a_policy_nested_too_deep_to_read_is_invalid_policy_never_an_internal_error(
        coord, cli, tmp_path, name):
    """A policy nests a few levels; one nested hundreds deep exhausted the TOML reader's
    recursion: exit 1 internal_error. It is invalid_policy (exit 2) naming the file, with
    nothing changed, through --policy and JOBCOORD_POLICY alike."""
    import os
    import subprocess

    from tests.serve_procs import db_args, jobcoord_argv

    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    path = _policy_file(tmp_path, DEEP_POLICIES[name])
    with pytest.raises(InvalidInput) as caught:
        Policy.from_toml(path)
    assert caught.value.code == "invalid_policy"
    assert "nested too deep" in caught.value.message and path in caught.value.message
    r = cli("--policy", path, "claim", "w1", "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_policy"
    for args, env in ((["--policy", path], {}), ([], {"JOBCOORD_POLICY": path})):
        done = subprocess.run(
            [*jobcoord_argv(), *db_args(coord.db.target), *args, "claim", "w1", "--json"],
            capture_output=True, timeout=60, check=False, env={**os.environ, **env})
        assert done.returncode == 2, done.stdout + done.stderr
        assert json.loads(done.stdout)["error"]["code"] == "invalid_policy", done.stdout
    assert dump(coord) == before


@pytest.mark.parametrize("where", ["top level", "artifacts"])
def test_a_policy_integer_too_long_to_read_is_invalid_policy_never_an_internal_error(
        coord, cli, tmp_path, where):
    """Python refuses to turn more than 4,300 digits into an int (ValueError from the TOML
    reader): that was exit 1 internal_error. It is invalid_policy (exit 2), nothing changed."""
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    value = "9" * 5000
    text = (f"max_memory_pct = {value}\n" if where == "top level"
            else f"[artifacts]\nmax_bytes = {value}\n")
    path = _policy_file(tmp_path, text)
    with pytest.raises(InvalidInput) as caught:
        Policy.from_toml(path)
    assert caught.value.code == "invalid_policy" and path in caught.value.message
    r = cli("--policy", path, "claim", "w1", "--json")
    assert r.code == 2, r.out + r.err
    assert r.json["error"]["code"] == "invalid_policy"
    assert dump(coord) == before


@pytest.mark.parametrize("value", ["1", '"yes"', "1.5"])
def test_a_flag_setting_that_is_not_true_or_false_says_so(tmp_path, value):
    """`background_requires_ac = 1` was refused saying it "must be a non-negative bool"."""
    path = tmp_path / "policy.toml"
    path.write_text(f"[policy]\nbackground_requires_ac = {value}\n")
    with pytest.raises(InvalidInput) as caught:
        Policy.from_toml(str(path))
    assert caught.value.code == "invalid_policy"
    assert "background_requires_ac must be true or false" in caught.value.message, (
        caught.value.message)


def test_an_empty_policy_option_is_refused_and_an_empty_policy_variable_is_no_policy(
        sqlite_target, monkeypatch):
    """`--policy ''` (a variable that was not set, typed into a command) ran with the
    default policy as if none were asked for: exit 2, nothing submitted. An empty
    JOBCOORD_POLICY still means no policy."""
    from jobcoord.service import Coordinator
    from tests.conftest import run_cli

    r = run_cli(sqlite_target, "--policy", "", "enqueue", "k", "--json")
    assert r.code == 2 and r.json["error"]["code"] == "invalid_input", r
    assert "--policy" in r.json["error"]["message"]
    with Coordinator.open(sqlite_target) as c:
        assert c.jobs()["jobs"] == []
    monkeypatch.setenv("JOBCOORD_POLICY", "")
    assert run_cli(sqlite_target, "enqueue", "k", "--json").code == 0
