"""How the CLI decides its output mode and its exit on Ctrl-C.

JSON mode is what click parsed for `--json`, never the text "--json" found anywhere in argv:
as the value of an option (`enqueue k --key --json`) it is that value. Only a usage error that
stops parsing falls back to reading argv, and then only where `--json` stands as a flag.
Ctrl-C exits 130 with nothing half-done committed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobcoord.cli import _flag_in_argv
from jobcoord.db import Target, resolve_target
from jobcoord.service import Coordinator
from tests.conftest import dump

REPO = Path(__file__).resolve().parent.parent


def test_json_given_as_an_option_value_is_that_value_not_json_mode(coord: Coordinator,
                                                                   cli) -> None:
    r = cli("enqueue", "k", "--key", "--json")
    assert r.code == 0, (r.out, r.err)
    assert r.out.startswith("job ") and "enqueued" in r.out  # text, as parsed
    job = coord.jobs()["jobs"][0]
    assert coord.show(job["job_id"])["job"]["idempotency_key"] == "--json"
    # The same key again is the same job: the value really was the key.
    again = cli("enqueue", "k", "--key", "--json", "--json")
    assert again.code == 0 and json.loads(again.out)["created"] is False


def test_an_error_after_json_as_a_value_is_reported_as_text(coord: Coordinator, cli) -> None:
    before = dump(coord)
    bad = cli("enqueue", "k", "--key", "--json", "--priority", "9")
    assert bad.code == 2 and bad.out == "", (bad.out, bad.err)
    assert bad.err.startswith("jobcoord: error: priority")
    usage = cli("enqueue", "k", "--key", "--json", "--no-such-flag")
    assert usage.code == 2 and usage.out == "", (usage.out, usage.err)
    assert dump(coord) == before


def test_a_usage_error_with_json_as_a_flag_is_reported_as_json(cli) -> None:
    r = cli("enqueue", "k", "--no-such-flag", "--json")
    assert r.code == 2 and json.loads(r.out)["error"]["code"] == "usage_error"
    r = cli("claim", "w1", "--lease", "--json")  # --json is --lease's value: then bad input
    assert r.code == 2 and r.out == ""


def test_the_argv_fallback_skips_option_values_and_stops_at_double_dash() -> None:
    assert _flag_in_argv(["enqueue", "k", "--json"]) == (True, False)
    assert _flag_in_argv(["enqueue", "k", "--key", "--json"]) == (False, False)
    assert _flag_in_argv(["enqueue", "--", "--json"]) == (False, False)
    assert _flag_in_argv(["--db", "--json", "status"]) == (False, False)
    assert _flag_in_argv(["--debug", "--db", "x.db", "show", "--tenant", "--debug"]
                         ) == (False, True)
    assert _flag_in_argv(["frobnicate", "--json"]) == (True, False)


def _reading_stdin(pid: int) -> bool:
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return "pipe" in wchan or syscall[:2] in (["0", "0x0"], ["63", "0x0"])


def _ctrl_c_once(proc: subprocess.Popen[str], ready: Any, every: float
                 ) -> tuple[str, str]:
    """Ctrl-C (SIGINT) to `proc` once `ready(pid)`, then its output; killed if it lingers."""
    try:
        deadline = time.monotonic() + 30
        while not ready(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
            time.sleep(every)
        os.kill(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ctrl_c_exits_130_and_commits_nothing(sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path or ""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", path, "enqueue", "k", "--payload-file", "-",
         "--json"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        # A suite started in the background ignores SIGINT and its children inherit that;
        # a user's shell would deliver Ctrl-C, so the child gets the default back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out, err = _ctrl_c_once(proc, _reading_stdin, every=0.02)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err and "interrupted" in err
    with Coordinator.open(sqlite_target) as c:
        assert c.jobs()["jobs"] == []


@pytest.mark.parametrize("delay", [0.1, 0.2, 0.3, 0.45, 0.6])
def test_ctrl_c_while_the_command_loads_is_interrupted_exit_130_without_a_traceback(
        tmp_path: Path, delay: float) -> None:
    """A Ctrl-C in a command's first moments (while its modules load, before `main` runs)
    printed a KeyboardInterrupt traceback. Whenever it comes: no traceback; exit 130 once
    Python's own handler is in place (before that, the signal's default ends it)."""
    db = str(tmp_path / "q # 1.db")
    assert subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, "migrate"],
                          capture_output=True).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", db, "worker",
         "--exec", "k=true", "--poll", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    # Once the worker has started (on a quick machine, within the later delays), Ctrl-C is
    # its graceful stop: exit 0 with its summary.
    started = " started " in err or '"started"' in err
    assert proc.returncode in (130, -signal.SIGINT) or (proc.returncode == 0 and started), (
        proc.returncode, err)


def _holding_ctrl_c_back(pid: int) -> bool:
    """The entry point has blocked SIGINT: the command's modules are loading."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(blocked.split()[1], 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["enqueue", "k"]])
def test_a_command_started_with_ctrl_c_ignored_still_stops_on_one_while_it_loads(
        tmp_path: Path, command: list[str]) -> None:
    """A shell script's `jobcoord serve &` starts it with SIGINT ignored. The command
    takes Ctrl-C over as it starts (its own handlers, its exit 130), but one sent while it
    loaded was dropped: held back by the entry point, then discarded as ignored, and serve
    served on, the enqueue committed. Sent at that moment, it stops the command, exit 130,
    with nothing done."""
    db = str(tmp_path / "q # 1.db")
    assert subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, "migrate"],
                          capture_output=True).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", db, *command], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    out, err = _ctrl_c_once(proc, _holding_ctrl_c_back, every=0.001)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "interrupted" in err and "Traceback" not in err, err
    with Coordinator.open(resolve_target(db=db)) as c:
        assert c.jobs()["jobs"] == []


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.3])
def test_ctrl_c_while_a_json_command_loads_prints_its_one_json_error(
        tmp_path: Path, delay: float) -> None:
    """--json promises one JSON object on stdout, an error too: a Ctrl-C while the CLI's
    modules load (before click has read the command line) printed none."""
    db = str(tmp_path / "q # 1.db")
    assert subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, "migrate"],
                          capture_output=True).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", db, "status", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    if proc.returncode == 130:
        assert json.loads(out)["error"]["code"] == "interrupted", (out, err)
    else:  # before Python's handler (killed by the signal), or status had already finished
        assert proc.returncode == -signal.SIGINT or (
            proc.returncode == 0 and "journal_mode" in json.loads(out)), (proc.returncode, out, err)


SIGINT_AT_IMPORT = """
import builtins, os, signal, sys
n, count, real = int(sys.argv[1]), 0, builtins.__import__
def counting(*args, **kwargs):
    global count
    count += 1
    if count == n:
        os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
builtins.__import__ = counting
sys.argv = ["jobcoord", "--db", sys.argv[2], "status", "--json"]
from jobcoord.start import main
main()
"""


def test_ctrl_c_at_any_import_while_a_json_command_loads_prints_its_one_json_error(
        tmp_path: Path) -> None:
    """The same, placed exactly: a real SIGINT at the Nth import of the command's loading,
    for N every 250 imports until the command runs out of imports (and finishes). One cut
    inside SQLAlchemy's loading left it unloadable, and the JSON error unprinted."""
    db = str(tmp_path / "q # 1.db")
    assert subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, "migrate"],
                          capture_output=True).returncode == 0
    n, cut = 250, 0
    while True:
        proc = subprocess.run([sys.executable, "-c", SIGINT_AT_IMPORT, str(n), db],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:  # the signal was never sent: loading took fewer imports
            break
        assert proc.returncode == 130, (n, proc.returncode, proc.stderr)
        assert json.loads(proc.stdout)["error"]["code"] == "interrupted", (n, proc.stderr)
        assert "Traceback" not in proc.stderr, (n, proc.stderr)
        cut += 1
        n += 250
        assert n < 100_000
    assert cut >= 10  # the loading was cut at many places, not one


def test_the_entry_point_loads_nothing_before_it_holds_ctrl_c_back() -> None:
    """A Ctrl-C before the entry point holds it back ends the process as Python's default
    does (a traceback, no JSON): that window is Python's own start-up only. Importing
    `typing` and `signal` first made it 10 ms longer, and a Ctrl-C there printed no JSON."""
    got = subprocess.run(
        [sys.executable, "-c", "import sys; before = set(sys.modules); import jobcoord.start; "
         "print(' '.join(sorted(set(sys.modules) - before)))"],
        capture_output=True, text=True, check=True)
    assert set(got.stdout.split()) - {"__future__"} == {"jobcoord", "jobcoord.start"}, (
        got.stdout)


ENQUEUE_THEN_SIGINT = """
import os, signal, sys
class Interrupting:
    # Ctrl-C the moment the result has been written: the command's work is done.
    def __init__(self, out): self.out = out
    def write(self, text):
        n = self.out.write(text)
        self.out.flush()
        if "created" in text:
            os.kill(os.getpid(), signal.SIGINT)
        return n
    def __getattr__(self, name): return getattr(self.out, name)
sys.stdout = Interrupting(sys.stdout)
sys.argv = ["jobcoord", "--db", sys.argv[1], "enqueue", "k", "--json"]
from jobcoord.start import main
main()
"""


def test_ctrl_c_after_the_result_is_printed_changes_neither_output_nor_exit(
        tmp_path: Path) -> None:
    """A Ctrl-C just after a command printed its result (the job was created) ended it
    exit 130, with the `interrupted` error after the result: a script reading either would
    think nothing was done. The result stands: exit 0, its one object."""
    db = str(tmp_path / "q # 1.db")
    assert subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, "migrate"],
                          capture_output=True).returncode == 0
    proc = subprocess.run([sys.executable, "-c", ENQUEUE_THEN_SIGINT, db],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    [line] = proc.stdout.splitlines()
    assert json.loads(line)["created"] is True and "Traceback" not in proc.stderr
    with Coordinator.open(db) as c:
        assert len(c.jobs()["jobs"]) == 1


REFUSAL_THEN_SIGINT = """
import os, signal, sys
class CtrlCAtExit:
    # A Ctrl-C while the interpreter shuts down, the refusal printed: it runs as the
    # modules are torn down, after Python has put back the handlers it was given.
    def __init__(self): self.kill, self.pid = os.kill, os.getpid()
    def __del__(self): self.kill(self.pid, signal.SIGINT)
late = CtrlCAtExit()
sys.argv = ["jobcoord", "--db", sys.argv[1], "retry", "1", "--json"]
from jobcoord.start import main
main()
"""


def test_ctrl_c_after_a_refusal_is_printed_changes_neither_output_nor_exit(
        tmp_path: Path) -> None:
    """A refusal is a result too: a Ctrl-C just after `retry` of a waiting job printed its
    `illegal_transition` error killed the process by SIGINT (no exit 4) while stdout held
    the refusal. The refusal stands: exit 4, its one object, the job unchanged."""
    db = str(tmp_path / "q # 1.db")
    with Coordinator.open(db, migrate=True) as c:
        c.enqueue("k", {})
    proc = subprocess.run([sys.executable, "-c", REFUSAL_THEN_SIGINT, db],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    [line] = proc.stdout.splitlines()
    assert json.loads(line)["error"]["code"] == "illegal_transition"
    assert "interrupted" not in proc.stderr and "Traceback" not in proc.stderr
    with Coordinator.open(db) as c:
        assert [j["status"] for j in c.jobs()["jobs"]] == ["waiting"]


def test_ctrl_c_while_a_plain_command_loads_prints_no_json(tmp_path: Path) -> None:
    """The load-time Ctrl-C reads --json as click would: here it is an option's value."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", "--json", "status"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == "" and "interrupted" in err, (
        proc.returncode, out, err)


def test_sigterm_before_the_worker_has_started_ends_it_having_claimed_nothing(
        tmp_path: Path) -> None:
    """docs/worker.md: a SIGTERM before the worker logged `started` ends it as the signal
    does (exit 143, or killed by it), with no summary, and it has claimed nothing: the
    waiting job is untouched, no worker row is written."""
    from jobcoord.service import Coordinator

    db = str(tmp_path / "q # 1.db")
    with Coordinator.open(db, migrate=True) as c:
        job = c.enqueue("k", {})["job_id"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", db, "worker", "--exec", "k=true",
         "--readings-override", '{"memory_used_pct": 10}', "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (143, -signal.SIGTERM), (proc.returncode, out, err)
    assert '"started"' not in err and out == ""
    with Coordinator.open(db) as c:
        shown = c.show(job)
        assert shown["job"]["status"] == "waiting" and shown["job"]["attempts"] == 0
        assert [e["reason"] for e in shown["events"]] == ["enqueued"]
        assert c.workers()["workers"] == []


def _after_commit_sigint(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`jobcoord --db DB ARGS --json` with a real SIGINT delivered the instant each write
    transaction has committed (fault point write.after_commit)."""
    return subprocess.run(
        [sys.executable, "-m", "jobcoord", "--db", db, *args, "--json"], cwd=REPO,
        env={**os.environ, "JOBCOORD_FAULT": "write.after_commit:sigint"},
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_ctrl_c_after_a_commit_is_held_until_the_result_is_printed(
        sqlite_target: Target) -> None:
    """A Ctrl-C between a write's commit and its printed result ended the command exit 130
    saying "the write under way, if any, was rolled back" while the change was made: a
    script that trusted it enqueued the job again, or met job_finished cancelling again.
    Once the commit begins, a Ctrl-C waits for the result: exit 0, its one object, the change
    made once."""
    db = sqlite_target.sqlite_path or ""
    with Coordinator.open(sqlite_target) as c:
        other = c.enqueue("k", {"n": 0})["job_id"]
    got = _after_commit_sigint(db, "enqueue", "k", "--payload", '{"n": 1}')
    assert got.returncode == 0, (got.returncode, got.stdout, got.stderr)
    [line] = got.stdout.splitlines()
    job = json.loads(line)["job_id"]
    got = _after_commit_sigint(db, "cancel", str(other))
    assert got.returncode == 0, (got.returncode, got.stdout, got.stderr)
    assert json.loads(got.stdout)["status"] == "cancelled"
    with Coordinator.open(sqlite_target) as c:
        assert [j["job_id"] for j in c.jobs()["jobs"]] == [job, other]
        assert c.show(other)["job"]["status"] == "cancelled"


def test_ctrl_c_after_a_prune_batch_committed_counts_that_batch(
        sqlite_target: Target) -> None:
    """A Ctrl-C after a prune's batch committed was raised before the batch was counted:
    the answer said one whole batch fewer than were deleted. The Ctrl-C is held until the
    next batch would begin; the answer counts every committed batch, its cutoff as ISO text
    as a whole prune's answer says it."""
    db = sqlite_target.sqlite_path or ""
    with Coordinator.open(sqlite_target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 5})
        for i in range(3):
            c.enqueue("k", {"i": i})
            got = c.claim("w")
            c.complete(got["job"]["job_id"], "w", got["lease"]["epoch"], {})
    got = _after_commit_sigint(db, "prune", "--older-than", "0", "--batch", "1")
    assert got.returncode == 130, (got.returncode, got.stdout, got.stderr)
    error = json.loads(got.stdout)["error"]
    pruned = error["details"]["pruned"]
    with Coordinator.open(sqlite_target) as c:
        left = len(c.jobs()["jobs"])
    assert (pruned["batches"], pruned["jobs"], left) == (1, 1, 2), error
    assert pruned["cutoff"].endswith("Z"), pruned


def _with_reader_gone(args: list[str], tmp_path: Path, timeout: float = 120
                      ) -> tuple[int, str]:
    """Run `jobcoord ARGS` with stdout a pipe whose reader is already gone (`| head -c0`):
    (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    err = tmp_path / "stderr.log"
    with open(err, "wb") as errf:
        try:
            proc = subprocess.run([sys.executable, "-m", "jobcoord", *args], cwd=tmp_path,
                                  stdout=write_end, stderr=errf, timeout=timeout)
        finally:
            os.close(write_end)
    return proc.returncode, err.read_text(encoding="utf-8", errors="replace")


@pytest.mark.parametrize("args,code", [
    (["jobs"], 0),
    (["metrics"], 0),
    (["--help"], 0),
    (["enqueue", "--help"], 0),
    (["retry", "1", "--json"], 4),
    (["demo", "--dir", "the demo"], 0),
])
def test_a_reader_gone_drops_the_output_and_the_exit_code_stands(
        tmp_path: Path, args: list[str], code: int) -> None:
    """`jobcoord metrics | head -c0`, `--help` or `demo` piped into a reader that is gone
    exited 1 (the closed pipe, caught by click, became exit 1) and the demo stopped halfway.
    What cannot be printed is dropped; the command does its work and its exit code stands:
    as for results printed through the one result printer (`jobs`, a refusal)."""
    db = str(tmp_path / "q # 1.db")
    with Coordinator.open(db, migrate=True) as c:
        c.enqueue("k", {})
    got, err = _with_reader_gone(["--db", db, *args], tmp_path)
    assert got == code, err[-3000:]
    assert "Traceback" not in err and "internal" not in err, err[-3000:]
    if args[0] == "demo":  # it ran to the end: its summary is in the database it left
        with Coordinator.open(str(tmp_path / "the demo" / "jobcoord.db")) as d:
            jobs = d.jobs(limit=1000)["jobs"]
        assert jobs and all(j["status"] in ("succeeded", "dead", "cancelled") for j in jobs)


def _jobcoord_with_closed(fds: tuple[int, ...], args: list[str], tmp_path: Path,
                          timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """`jobcoord ARGS` started with the descriptors `fds` closed (`>&-`, `2>&-`); what is
    left open is captured (stderr into a file when only stdout is closed)."""
    return subprocess.run([sys.executable, "-m", "jobcoord", *args], cwd=tmp_path,
                          capture_output=True, timeout=timeout,
                          preexec_fn=lambda: [os.close(fd) for fd in fds])


@pytest.mark.parametrize("fds", [(1,), (2,), (1, 2)], ids=[">&-", "2>&-", ">&- 2>&-"])
@pytest.mark.parametrize("args,code", [
    (["enqueue", "k2", "--json"], 0),
    (["status"], 0),
    (["show", "999", "--json"], 4),
    (["enqueue", ""], 2),
    (["worker", "--exec", "k=true", "--burst", "--json", "--reap-every", "0"], 0),
])
def test_a_closed_standard_stream_changes_neither_the_work_nor_the_exit_code(
        tmp_path: Path, fds: tuple[int, ...], args: list[str], code: int) -> None:
    """Started with stdout or stderr closed (`>&-`, `2>&-`, a service manager's habit), every
    command ended exit 1 with a traceback (Python leaves `sys.stdout` None), a committed
    enqueue included, and a worker died at start. A closed stream is a reader gone: the
    command does its work and its exit code stands; and nothing it opens (the database)
    takes the free descriptor in the stream's place."""
    db = str(tmp_path / "q # 1.db")
    with Coordinator.open(db, migrate=True) as c:
        c.enqueue("k", {})
    before = (tmp_path / "q # 1.db").read_bytes()[:100]
    proc = _jobcoord_with_closed(fds, ["--db", db, *args], tmp_path)
    shown = (proc.stdout + proc.stderr).decode(errors="replace")[-3000:]
    assert proc.returncode == code, shown
    assert b"Traceback" not in proc.stdout + proc.stderr and b"internal" not in proc.stderr
    assert (tmp_path / "q # 1.db").read_bytes()[:100] == before  # the header: SQLite's
    with Coordinator.open(db) as c:
        jobs = {j["kind"]: j["status"] for j in c.jobs()["jobs"]}
    if args[0] == "enqueue" and code == 0:
        assert "k2" in jobs
    if args[0] == "worker":
        assert jobs["k"] == "succeeded"


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["enqueue", "k2", "--json"],
                                  ["metrics"]])
def test_a_full_stdout_is_storage_unavailable_exit_6_never_an_internal_error(
        tmp_path: Path, args: list[str]) -> None:
    """stdout on a full disk (/dev/full): exit 1 as an internal error, and with --json a
    traceback (the error JSON failed on the same stdout). The result could not be written:
    exit 6 with the reason on stderr, whatever the command had done (a committed enqueue
    stays committed and is said so)."""
    db = str(tmp_path / "q # 1.db")
    with Coordinator.open(db, migrate=True) as c:
        c.enqueue("k", {})
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, *args],
                              stdout=full, stderr=subprocess.PIPE, timeout=120)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 6, err[-3000:]
    assert "Traceback" not in err and "internal" not in err, err[-3000:]
    assert err.count("\n") == 1 and "No space left" in err, err


INTERRUPTED_THEN_SIGTERM = """
import os, signal, sys
class Terminating:
    # A SIGTERM the moment the `interrupted` report is written (a supervisor's follow-up).
    def __init__(self, out): self.out = out
    def write(self, text):
        n = self.out.write(text)
        self.out.flush()
        if "interrupted" in text:
            os.kill(os.getpid(), signal.SIGTERM)
        return n
    def __getattr__(self, name): return getattr(self.out, name)
sys.stderr = Terminating(sys.stderr)
moment, db = sys.argv[1], sys.argv[2]
if moment == "loading":
    import builtins
    real = builtins.__import__
    def counting(*args, count=[0], **kwargs):
        count[0] += 1
        if count[0] == 300:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)
    builtins.__import__ = counting
else:  # running: as the command opens its database
    import jobcoord.coordinator as c
    real_open = c.Coordinator.open.__func__
    def opening(cls, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_open(cls, *args, **kwargs)
    c.Coordinator.open = classmethod(opening)
sys.argv = ["jobcoord", "--db", db, "enqueue", "k", "--json"]
from jobcoord.start import main
main()
"""


@pytest.mark.parametrize("moment", ["loading", "running"])
def test_a_sigterm_after_the_interrupted_report_leaves_exit_130(tmp_path: Path,
                                                                  moment: str) -> None:
    """The `interrupted` report is the command's answer, as a refusal is: a SIGTERM that
    followed it (a supervisor stopping what it had just interrupted) killed the process,
    exit 143, when the Ctrl-C came while the command loaded or ran. It stands: exit 130."""
    db = str(tmp_path / "q # 1.db")
    assert subprocess.run([sys.executable, "-m", "jobcoord", "--db", db, "migrate"],
                          capture_output=True).returncode == 0
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_THEN_SIGTERM, moment, db],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["error"]["code"] == "interrupted", proc.stdout
    assert "jobcoord: interrupted" in proc.stderr and "Traceback" not in proc.stderr
    with Coordinator.open(db) as c:
        assert c.jobs()["jobs"] == []
