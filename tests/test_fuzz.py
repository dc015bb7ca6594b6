"""Bad input, generated: hypothesis drives every CLI command and the Python API with arbitrary
text (including undecodable bytes as they arrive in argv, lone surrogates, NUL), huge and
non-finite numbers, arbitrary JSON, SQL-looking text, empty and oversized values.

Every call either succeeds or fails with a documented exit code for bad input or a refusal
(never 1, never a traceback), `--json` always prints exactly one JSON object, and the
database passes its checks after every example.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcoord.db import Target
from jobcoord.errors import JobcoordError
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.conftest import run_cli
from tests.invariants import violations

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])

SQLISH = ["1; DROP TABLE jobs;--", "x'); DELETE FROM leases;--", "' OR '1'='1", "%", "_",
          "*", "NULL", "null", "1e3", "0x10", "-0", "+1", " 1", "1 ", "\t", "\n", "\x00",
          "\u202e", "\u200b", "\ud800", "9" * 40, "-9223372036854775809",
          "9223372036854775808", "nan", "inf", "-inf", "1e309", "P9", "p0", "P-1"]
OVERSIZED = ["x" * 300_000, json.dumps({"k": "v" * 300_000}), "[" * 100_000,
             '{"a":' * 5_000 + "1" + "}" * 5_000]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)

# What argv can carry: any text, bytes that are not UTF-8 (Python hands them over as
# surrogate escapes), numbers in every spelling, JSON, SQL-looking and oversized strings.
fuzz_text = st.one_of(
    st.text(max_size=30),
    st.binary(max_size=20).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.integers().map(str),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(repr),
    json_values.map(json.dumps),
    st.sampled_from(SQLISH),
    st.sampled_from(OVERSIZED),
    st.sampled_from(["", "1", "2", "3", "w1", "0", "-1", "default"]),
)

# Arguments that are usually plausible, so that the other arguments' checks are passed and
# each hostile value reaches the code behind them.
huge = st.one_of(
    st.sampled_from([2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.integers(min_value=-(2**70), max_value=2**70),
)
id_text = st.one_of(st.sampled_from(["1", "2", "3", "4"]), huge.map(str), fuzz_text)
worker_text = st.one_of(st.just("w1"), fuzz_text)
epoch_text = st.one_of(st.sampled_from(["0", "1", "2"]), huge.map(str), fuzz_text)

ID_COMMANDS = ["cancel", "retry", "show", "explain"]
FENCED = ["renew", "complete", "fail", "effect", "checkpoint"]
OPTIONS: dict[str, list[str]] = {
    "enqueue": ["--payload", "--payload-file", "--priority", "--role", "--tenant", "--key",
                "--max-attempts", "--deadline", "--delay"],
    "heartbeat": ["--role", "--kind", "--readings"],
    "claim": ["--lease", "--kind"],
    "renew": ["--lease", "--tenant"],
    "complete": ["--result", "--result-file", "--tenant"],
    "fail": ["--error", "--tenant", "--permanent"],
    "effect": ["--tenant"],
    "checkpoint": ["--name", "--data", "--tenant"],
    "reap": ["--limit"],
    "prune": ["--older-than", "--status", "--tenant", "--batch", "--dry-run"],
    "reconcile": ["--as", "--result", "--reason", "--tenant"],
    "jobs": ["--status", "--kind", "--tenant", "--limit"],
    "cancel": ["--tenant"], "retry": ["--tenant"], "show": ["--tenant"],
    "explain": ["--tenant"],
    "backup": ["--force"], "check": ["--full"], "status": [], "workers": [], "restore": [],
    "migrate": ["--with", "--without"],
}
FLAGS = {"--permanent", "--force", "--full", "--dry-run"}
POSITIONAL = {"enqueue": 1, "heartbeat": 1, "claim": 1, "backup": 1, "reconcile": 1,
              "restore": 1,
              **dict.fromkeys(ID_COMMANDS + FENCED, 1)}


@st.composite
def command_lines(draw: Any) -> tuple[list[str], bytes]:
    cmd = draw(st.sampled_from(sorted(OPTIONS)))
    args = [cmd]
    if cmd == "backup":
        # The destination stays inside the test directory; its name is still fuzzed.
        args.append(draw(st.sampled_from(["b.db", "", ".", "b.db", "sub/b.db"])))
    elif cmd in FENCED or cmd in ID_COMMANDS or cmd == "reconcile":
        args.append(draw(id_text))
    elif cmd in ("heartbeat", "claim"):
        args.append(draw(worker_text))
    else:
        args += [draw(fuzz_text) for _ in range(POSITIONAL.get(cmd, 0))]
    if cmd in FENCED:
        for opt, values in (("--worker", worker_text), ("--epoch", epoch_text)):
            if draw(st.integers(0, 9)):  # usually present, sometimes missing
                args += [opt, draw(values)]
    for opt in draw(st.lists(st.sampled_from(OPTIONS[cmd]), max_size=4, unique=True)
                    if OPTIONS[cmd] else st.just([])):
        if opt in FLAGS:
            args.append(opt)
        elif opt.endswith("-file"):
            args += [opt, draw(st.sampled_from(["-", "missing.json", ""]))]
        else:
            args += [opt, draw(fuzz_text)]
    if draw(st.booleans()):
        args.insert(1, "--json")
    if draw(st.integers(0, 19)) == 0:
        args.append(draw(st.sampled_from(["--bogus", "extra", "--json=1"])))
    stdin = draw(st.one_of(st.binary(max_size=64), json_values.map(
        lambda v: json.dumps(v).encode()), st.sampled_from([b"\xff\xfe{", b"{\"a\": NaN}"])))
    return args, stdin


@pytest.fixture
def world(sqlite_target: Target, tmp_path: Path) -> Iterator[Target]:
    """A database with jobs in several states, and the test directory as the working
    directory (relative paths the fuzzer makes stay inside it)."""
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        c.heartbeat("w1")
        for i in range(4):
            c.enqueue("work", {"i": i})
        c.claim("w1")
        got = c.claim("w1")
        c.complete(got["job"]["job_id"], "w1", got["lease"]["epoch"], {"ok": True})
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield sqlite_target
    finally:
        os.chdir(old)


ALLOWED_EXITS = {0, 2, 3, 4}


@FUZZ
@given(line=command_lines())
def test_cli_never_crashes_on_any_input(world: Target, line: tuple[list[str], bytes]) -> None:
    args, stdin = line
    res = run_cli(world, *args, stdin=stdin)
    # A backup into a directory that does not exist is "storage unavailable" (6).
    allowed = ALLOWED_EXITS | ({6} if args[0] == "backup" else set())
    assert res.code in allowed, (args, res.code, res.err[-500:])
    assert "Traceback" not in res.err, (args, res.err[-2000:])
    if "--json" in args and res.out.strip():
        json.loads(res.out)  # exactly one JSON object
    path = world.sqlite_path
    assert path is not None
    assert violations(path) == [], args


# --- the Python API ---------------------------------------------------------------------

anything = st.one_of(
    fuzz_text, st.integers(), st.floats(), st.booleans(), st.none(), st.binary(max_size=8),
    json_values, st.just(float("nan")), st.just(2**64), st.just(-(2**63) - 1),
    st.lists(st.integers(), max_size=3),
)


@st.composite
def api_calls(draw: Any) -> tuple[str, list[Any], dict[str, Any]]:
    name = draw(st.sampled_from(["enqueue", "heartbeat", "claim", "renew", "complete", "fail",
                                 "mark_effect", "checkpoint", "reap", "cancel", "retry",
                                 "reconcile", "jobs", "show", "explain", "prune"]))
    small = st.one_of(st.sampled_from([1, 2, 3, "w1", 0, -1]), anything)
    job = st.one_of(st.sampled_from([1, 2, 3, 4]), huge, anything)
    worker = st.one_of(st.just("w1"), anything)
    epoch = st.one_of(st.sampled_from([0, 1, 2]), huge, anything)
    if name == "enqueue":
        return name, [draw(small), draw(anything)], {
            k: draw(anything) for k in draw(st.lists(st.sampled_from(
                ["priority", "role", "tenant", "key", "max_attempts", "deadline_s",
                 "delay_s"]), max_size=3, unique=True))}
    if name == "heartbeat":
        return name, [draw(small)], {"readings": draw(st.one_of(anything, st.dictionaries(
            st.sampled_from(["memory_used_pct", "temperature_c", "on_battery", "user_idle_s",
                             "x"]), anything, max_size=3)))}
    if name == "claim":
        return name, [draw(small)], {"lease_s": draw(anything)}
    fence = [draw(job), draw(worker), draw(epoch)]
    if name in ("renew", "mark_effect"):
        return name, fence, {}
    if name in ("complete", "fail"):
        return name, [*fence, draw(anything)], {}
    if name == "checkpoint":
        return name, [*fence, draw(anything), draw(anything)], {}
    if name == "reap":
        return name, [], {"limit": draw(anything)}
    if name == "prune":
        return name, [draw(st.one_of(st.sampled_from([0, "1d", "90s"]), anything))], {
            k: draw(st.one_of(anything, st.lists(fuzz_text, max_size=3)))
            for k in draw(st.lists(st.sampled_from(["statuses", "tenant", "batch", "dry_run"]),
                                   max_size=3, unique=True))}
    if name == "reconcile":
        return name, [draw(job), draw(anything), draw(anything)], {"result": draw(anything)}
    if name == "jobs":
        return name, [], {"status": draw(anything), "limit": draw(anything)}
    return name, [draw(job)], {"tenant": draw(st.one_of(st.none(), anything))}


@FUZZ
@given(call=api_calls())
def test_api_accepts_or_refuses_with_a_documented_error(coord: Coordinator,
                                                         call: tuple[str, list[Any],
                                                                     dict[str, Any]]) -> None:
    name, args, kwargs = call
    try:
        getattr(coord, name)(*args, **kwargs)
    except JobcoordError as e:
        assert e.exit_code in ALLOWED_EXITS, (name, args, kwargs, e.code, e.message)
        assert e.code != "internal_error"
        json.dumps(e.to_json())  # every refusal can be reported as JSON
    result = check(coord.db)
    assert result["ok"], (name, result)


# --- extreme numbers where the database would see them ---------------------------------------

boundaries = st.one_of(
    st.sampled_from([0, 1, 2, -1, 2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64,
                     -(2**63), -(2**63) - 1, 10**30]),
    st.integers(),
)
FENCED_API = {"renew": "renew", "complete": "complete", "fail": "fail", "effect": "mark_effect",
              "checkpoint": "checkpoint"}


@settings(FUZZ, max_examples=80)
@given(op=st.sampled_from(sorted(FENCED_API)), job=boundaries, epoch=boundaries,
       lease=st.one_of(boundaries, st.floats()))
def test_fenced_calls_with_extreme_numbers_exit_cleanly(world: Target, op: str, job: int,
                                                         epoch: int, lease: float) -> None:
    """Ids and epochs at and past every integer width, from a plausible worker, so the
    numbers reach the code that binds them into SQL."""
    extra = {"complete": ["--result", "{}"], "fail": ["--error", "e"],
             "checkpoint": ["--name", "n"], "renew": ["--lease", str(lease)]}.get(op, [])
    res = run_cli(world, op, str(job), "--worker", "w1", "--epoch", str(epoch), *extra,
                  "--json")
    assert res.code in ALLOWED_EXITS, (op, job, epoch, res.code, res.err[-500:])
    json.loads(res.out)
    path = world.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        args: list[Any] = [job, "w1", epoch]
        if op == "fail":
            args.append("e")
        if op == "checkpoint":
            args.append("n")
        kwargs = {"lease_s": lease} if op == "renew" else {}
        try:
            getattr(c, FENCED_API[op])(*args, **kwargs)
        except JobcoordError as e:
            assert e.exit_code in ALLOWED_EXITS and e.code != "internal_error", e.message
    assert violations(path) == []
