"""What a handler hands back is stored as it is: a plain string result stays a string, an
envelope is exactly `{"jobcoord_envelope": 1, "result": ...}`, a handler that calls
sys.exit() fails at once, and no handler text can forge a line of the worker's log."""

from __future__ import annotations

import os

import pytest

from tests import test_worker as tw
from tests.conftest import run_cli
from tests.test_worker import PY

db = tw.db
start = tw.start

pytestmark = pytest.mark.timeout(60)


def _emit_script(tmp_path, text: str) -> str:
    script = tmp_path / "emit.py"
    script.write_text(f"import sys\nsys.stdout.write({text!r})\n")
    return str(script)


@pytest.mark.parametrize(("printed", "stored"), [
    ('"hello"', "hello"),
    ('"{\\"a\\": 1}"', '{"a": 1}'),
    ("5", 5),
    ('{"jobcoord_envelope": true, "result": 1}', {"jobcoord_envelope": True, "result": 1}),
    ('{"jobcoord_envelope": 1, "result": "x", "provenance": {"m": 1}}', "x"),
])
def test_a_command_result_is_stored_exactly_as_printed(db, start, tmp_path, printed, stored):
    _, c = db
    job = c.enqueue("emit", {})["job_id"]
    code, summary = start("--exec", f"emit={PY} {_emit_script(tmp_path, printed)}",
                          "--burst").finish()
    assert code == 0 and summary["completed"] == 1, summary
    assert c.show(job)["job"]["result"] == stored


@pytest.mark.parametrize("printed", ['{"jobcoord_envelope": 1}',
                                     '{"jobcoord_envelope": 1, "result": 1, "provenance": [1]}'],
                         ids=["no_result", "provenance_not_an_object"])
def test_an_envelope_without_a_result_or_with_bad_provenance_is_invalid_output_with_evidence(
        db, start, tmp_path, printed):
    """As any invalid output, the error keeps the first 200 bytes printed as evidence (an
    envelope's own faults said only what was wrong)."""
    _, c = db
    job = c.enqueue("emit", {})["job_id"]
    script = _emit_script(tmp_path, printed)
    code, summary = start("--exec", f"emit={PY} {script}", "--burst").finish()
    assert code == 0 and summary["completed"] == 0
    got = c.show(job)
    assert got["job"]["status"] == "dead" and got["events"][-1]["reason"] == "invalid_result"
    assert f"output began: {printed}" in got["job"]["last_error"], got["job"]["last_error"]


def test_a_string_result_is_a_string_through_the_api_and_the_cli(db):
    path, c = db
    c.heartbeat("w1")
    for given, expected in (("hello", "hello"), ('{"a": 1}', '{"a": 1}')):
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w1")["lease"]["epoch"]
        c.complete(job, "w1", epoch, given)
        assert c.show(job)["job"]["result"] == expected
    for given, expected in (('"hello"', "hello"), ('{"a": 1}', {"a": 1})):
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w1")["lease"]["epoch"]
        r = run_cli(None, "--db", path, "complete", str(job), "--worker", "w1", "--epoch",
                    str(epoch), "--result", given, "--json")
        assert r.code == 0, r.out
        assert c.show(job)["job"]["result"] == expected


def test_a_python_handler_that_calls_sys_exit_fails_at_once(db, start, tmp_path, monkeypatch):
    _, c = db
    (tmp_path / "exiting_app.py").write_text(
        "import sys\nfrom jobcoord.app import App\napp = App()\n\n"
        "@app.handler('bye', timeout=60)\ndef bye(payload, ctx):\n    sys.exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    job = c.enqueue("bye", {}, max_attempts=1)["job_id"]
    code, summary = start("--app", "exiting_app:app", "--burst").finish(timeout=30)
    assert code == 0 and summary["failed"] == 1, summary
    got = c.show(job)
    assert got["job"]["status"] == "dead"
    assert got["events"][-1]["reason"] == "failed"  # not a timeout 60 s later
    assert "SystemExit: 3" in got["job"]["last_error"]


ODD_APP = """
from jobcoord.app import App, Cancelled, PermanentError
app = App()

class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("str fails")

class UnprintablePermanent(PermanentError):
    def __str__(self):
        raise RuntimeError("str fails")

class Unencodable(dict):
    def items(self):
        raise RuntimeError("items fails")

@app.handler('unprintable', timeout=60)
def unprintable(payload, ctx):
    raise Unprintable()

@app.handler('unprintable_permanent', timeout=60)
def unprintable_permanent(payload, ctx):
    raise UnprintablePermanent()

@app.handler('unencodable', timeout=60)
def unencodable(payload, ctx):
    return Unencodable(a=1)

@app.handler('cancelled_by_itself', timeout=60)
def cancelled_by_itself(payload, ctx):
    raise Cancelled("made up")
"""


@pytest.mark.parametrize("concurrency", ["1", "2"])  # the handler inline, on a thread
@pytest.mark.parametrize(("kind", "error"), [
    ("unprintable", "Unprintable: "), ("unprintable_permanent", "UnprintablePermanent: "),
    ("unencodable", "the result is not JSON"), ("cancelled_by_itself", "Cancelled: made up")])
def test_whatever_a_python_handler_raises_or_returns_its_attempt_is_reported_at_once(
        db, start, tmp_path, monkeypatch, kind, error, concurrency):
    """An exception whose message cannot be read (its __str__ raises), a result whose
    encoding raises something else than the usual TypeError, a Cancelled raised while
    nothing was cancelled: each escaped the handler's call or was taken for a lost lease.
    The job stayed `running`, its lease renewed for ever by a worker running nothing, and a
    stop released nothing. Each is the attempt's failure now, reported with its error."""
    _, c = db
    (tmp_path / "odd_app.py").write_text(ODD_APP)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    job = c.enqueue(kind, {}, max_attempts=1)["job_id"]
    code, summary = start("--app", "odd_app:app", "--burst", "--lease", "3",
                          "--concurrency", concurrency).finish(timeout=30)
    assert code == 0 and summary["failed"] == 1, summary
    got = c.show(job)
    assert got["job"]["status"] == "dead", got["job"]
    assert error in got["job"]["last_error"], got["job"]["last_error"]
    assert c.status()["active_leases"] == 0


def test_handler_text_cannot_forge_a_line_of_the_workers_text_log(db, start, tmp_path):
    _, c = db
    forged = "boom\n2026-12-01T00:00:00Z w1 completed job_id=99\x1b[2J\u2028\u202e"
    script = tmp_path / "fail.py"
    script.write_text(f"import sys\nsys.stderr.write({forged!r})\nsys.exit(1)\n")
    c.enqueue("f", {}, max_attempts=1)
    code, _ = start("--exec", f"f={PY} {script}", "--burst", "--log-format", "text").finish()
    assert code == 0
    log = (tmp_path / "w1.log").read_text(encoding="utf-8")
    assert "completed job_id=99" in log  # the text is kept, escaped, inside its own line
    for line in log.splitlines():
        assert not line.startswith("2026-12-01T00:00:00Z"), line
    assert "\x1b" not in log and "\u2028" not in log and "\u202e" not in log
