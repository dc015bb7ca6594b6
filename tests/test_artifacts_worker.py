"""The worker runtime returns artifacts: a Python handler through `ctx.artifact`, a command
handler through files in $JOBCOORD_ARTIFACTS_OUT. Real worker processes, SQLite."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests import test_worker as tw
from tests.test_artifacts_rules import install, slow_validator_policy
from tests.test_worker import PY

db = tw.db
start = tw.start

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("handler", ["python", "command"])
def test_a_handler_returns_an_artifact_linked_to_its_result(db: Any, start: Any,
                                                            sqlite_target: Any,
                                                            tmp_path: Path,
                                                            handler: str) -> None:
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")  # this coordinator opened before the feature was added
    job = c.enqueue("report", {"title": "Quarterly"})["job_id"]
    args = (("--app", "examples.report_app:app") if handler == "python"
            else ("--exec", f"report={PY} examples/report_cmd.py"))
    w = start(*args, "--burst")
    # This worker's own (its pid names them): other processes' workers run jobs with id 1 too.
    pattern = os.path.join(tempfile.gettempdir(), f"jobcoord-w{w.proc.pid}-{job}-artifacts-*")
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1, summary
    [a] = c.artifacts(job)["artifacts"]
    assert a["name"] == "report.md" and a["state"] == "accepted"
    assert a["digest"].startswith("sha256:") and a["size"] > 10
    out = tmp_path / "out.md"
    c.get_artifact(job, "report.md", out)
    assert out.read_text().startswith("# Quarterly")
    reasons = [e["reason"] for e in c.show(job)["events"]]
    assert reasons.index("artifact_staged") < reasons.index("artifact_accepted") \
        < reasons.index("completed")
    # The command's artifacts directory is gone with the attempt.
    assert glob.glob(pattern) == []


def test_a_command_whose_artifacts_take_longer_than_its_lease_to_stage_keeps_its_lease(
        db: Any, start: Any, sqlite_target: Any) -> None:
    """The files a command left are staged after it exits, before the completion: a slow
    upload (a large file, a slow network to the server) took the rest of the lease with no
    renewal, and the accepted result of a job that had run to its end was refused
    `lease_expired` and the job ran again. The lease is renewed while they are staged."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    job = c.enqueue("report", {"title": "Slow"})["job_id"]
    # Each file's staging waits 4 s; the lease is 3 s (renewed every second).
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--lease", "3", "--burst",
              env={"JOBCOORD_FAULT": "artifacts.put:sleep=4"})
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1, summary
    shown = c.show(job)
    assert shown["job"]["status"] == "succeeded" and shown["job"]["attempts"] == 1, shown["job"]
    assert [a["state"] for a in c.artifacts(job)["artifacts"]] == ["accepted"]
    assert w.events("renewed"), "no renewal while the files were staged"


def test_a_worker_whose_store_is_gone_at_its_completion_gives_the_job_back_and_stops(
        db: Any, start: Any, sqlite_target: Any) -> None:
    """The store moved away between the staging of a command's files and its completion
    (restarted elsewhere): the completion is refused `artifact_store_missing`, which the
    worker took as a refused result and failed the attempt (`invalid_result`, a try lost),
    then went on to claim the next job and meet it again. Every job with files would: it
    gives this one back (a release, its try returned) and stops, exit 2. The stop waits for
    that release (held here a second): it closed the worker's client under it, and the job
    stayed `running` to its lease's end."""
    path, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    job = c.enqueue("report", {"title": "Moved"})["job_id"]
    other = c.enqueue("report", {"title": "Next"})["job_id"]
    store = f"{path}.artifacts"
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--burst",
              env={"JOBCOORD_FAULT": "worker.before_complete:sleep=3,"
                   "worker.before_fail_report:sleep=1"})
    deadline = time.monotonic() + 30
    while "artifact_staged" not in [e["reason"] for e in c.show(job)["events"]]:
        assert time.monotonic() < deadline and w.proc.poll() is None
        time.sleep(0.05)
    os.rename(store, store + ".moved")  # during the pause after the staging
    code, _ = w.finish(timeout=40)
    assert code == 2, (code, w.events("failed"), w.events("report_error"))
    shown = c.show(job)
    assert shown["job"]["status"] == "waiting", shown["job"]
    assert shown["events"][-1]["reason"] == "worker_shutdown", shown["events"][-1]
    assert not any(e["reason"] in ("failed", "invalid_result") for e in shown["events"])
    assert c.show(other)["job"]["status"] == "waiting"  # never claimed after it
    assert c.show(other)["job"]["attempts"] == 0


def test_a_worker_whose_store_moved_between_jobs_stages_nothing_gives_the_job_back_and_stops(
        db: Any, start: Any, sqlite_target: Any) -> None:
    """The store moved away after a job's files were accepted, before the next job's were
    staged: the next stage made a new, empty store in its place and the worker went on,
    every earlier object missing from it. The stage is refused as the completion is
    (`artifact_store_missing`): no store made, the job given back, the worker stops, exit 2."""
    path, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    first = c.enqueue("report", {"title": "Kept"})["job_id"]
    store = f"{path}.artifacts"
    w = start("--exec", f"report={PY} examples/report_cmd.py")
    deadline = time.monotonic() + 30
    while c.show(first)["job"]["status"] != "succeeded":
        assert time.monotonic() < deadline and w.proc.poll() is None
        time.sleep(0.05)
    os.rename(store, store + ".moved")
    later = c.enqueue("report", {"title": "After the move"})["job_id"]
    code, _ = w.finish(timeout=40)
    assert code == 2, (code, w.events("report_error"), w.events("artifacts_stage_error"))
    assert not os.path.lexists(store)
    shown = c.show(later)
    assert shown["job"]["status"] == "waiting", shown["job"]
    assert not any(e["reason"] in ("failed", "invalid_result", "artifact_staged")
                   for e in shown["events"]), shown["events"]
    assert [e["error"] for e in w.events("report_error")] == ["artifact_store_missing"]


def test_a_worker_whose_store_path_is_a_regular_file_gives_its_first_job_back_and_stops(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """`--artifacts` naming a regular file (a typo) on a database naming no object yet: the
    first stage could not make the store and said exit 6, unavailable, which the worker
    retries; every job with files met it again, a try lost each time. No store is ever
    made there: `artifact_store_missing`, the job given back, the worker stops, exit 2."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    typo = tmp_path / "q # ?%.db"
    typo.write_bytes(b"not a store")
    job = c.enqueue("report", {"title": "Typo"})["job_id"]
    w = start("--exec", f"report={PY} examples/report_cmd.py",
              global_args=("--artifacts", str(typo)))
    code, _ = w.finish(timeout=40)
    assert code == 2, (code, w.events("report_error"), w.events("artifacts_stage_error"))
    assert typo.read_bytes() == b"not a store"
    shown = c.show(job)
    assert shown["job"]["status"] == "waiting", shown["job"]
    assert shown["events"][-1]["reason"] == "worker_shutdown", shown["events"][-1]
    assert not any(e["reason"] in ("failed", "invalid_result", "artifact_staged")
                   for e in shown["events"]), shown["events"]
    assert [e["error"] for e in w.events("report_error")] == ["artifact_store_missing"]


def test_a_worker_stopped_by_its_store_gone_lets_its_other_running_jobs_end_as_a_sigterm_would(
        db: Any, start: Any, sqlite_target: Any) -> None:
    """Beside the job whose completion met the store gone, another job of the worker's
    still runs: the worker stops as a SIGTERM stops it (the grace, then a release), exit 2.
    Stopped as by a fatal error, its client closed under that job, whose completion then
    failed: the job stayed `running` to its lease's end (30 s here)."""
    path, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    job = c.enqueue("report", {"title": "Moved"})["job_id"]
    slow = c.enqueue("slow", {})["job_id"]
    store = f"{path}.artifacts"
    w = start("--exec", f"report={PY} examples/report_cmd.py",
              "--exec", "slow=sh -c 'cat >/dev/null; sleep 5; echo {}'",
              "--concurrency", "2", "--burst",
              env={"JOBCOORD_FAULT": "worker.before_complete:sleep=2"})
    deadline = time.monotonic() + 30
    while "artifact_staged" not in [e["reason"] for e in c.show(job)["events"]]:
        assert time.monotonic() < deadline and w.proc.poll() is None
        time.sleep(0.05)
    assert c.show(slow)["job"]["status"] == "running"
    os.rename(store, store + ".moved")
    code, _ = w.finish(timeout=40)
    assert code == 2, (code, w.events("report_error"))
    assert c.show(job)["job"]["status"] == "waiting"
    shown = c.show(slow)
    assert shown["job"]["status"] == "succeeded", (shown["events"], w.events())


def test_a_completions_artifact_checks_longer_than_the_lease_keep_the_lease(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """A completion re-hashes the attempt's artifacts and runs the kind's validator before
    its transaction, after the worker's lease loop has ended: a validator (or a re-hash)
    longer than the lease let the worker's own reaper take the job back, the completion was
    refused `lease_expired`, and the job ran again until it was dead. The coordinator keeps
    the lease while it checks."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    policy = slow_validator_policy(tmp_path, 5)
    job = c.enqueue("report", {"title": "Checked slowly"})["job_id"]
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--lease", "3", "--burst",
              "--reap-every", "0.5", env={"JOBCOORD_POLICY": str(policy)})
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1, summary
    shown = c.show(job)
    assert shown["job"]["status"] == "succeeded" and shown["job"]["attempts"] == 1, shown["job"]
    assert [a["state"] for a in c.artifacts(job)["artifacts"]] == ["accepted"]


def test_a_commands_file_the_store_refuses_fails_the_attempt_permanently_naming_it(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """A file no artifact may be (a newline in its name, or over the kind's size) is the
    command's output refused, as a result `complete` would refuse: the same command leaves
    it again, so the attempt fails permanently (it was retried, uploading it each time),
    and the error names the file, not a temporary path removed right after."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    job = c.enqueue("bad", {}, max_attempts=3)["job_id"]
    cmd = tmp_path / "bad.py"
    cmd.write_text("import os, pathlib\n"
                   "out = pathlib.Path(os.environ['JOBCOORD_ARTIFACTS_OUT'])\n"
                   "(out / 'line\\nbreak.txt').write_text('x')\n"
                   "print('{}')\n")
    w = start("--exec", f"bad={PY} {cmd}", "--burst")
    code, summary = w.finish()
    assert code == 0, summary
    shown = c.show(job)["job"]
    assert shown["status"] == "dead" and shown["attempts"] == 1, shown
    assert "line\\nbreak.txt" in shown["last_error"], shown["last_error"]
    assert "jobcoord-w" not in shown["last_error"], shown["last_error"]


@pytest.mark.parametrize("handler", ["command", "python"])
def test_artifacts_on_a_database_without_artifact_storage_fail_the_attempt_at_once(
        db: Any, start: Any, handler: str) -> None:
    """A command left files, and this database has no artifact storage: its staging was
    refused `feature_missing`, the report gave up, and the job stayed leased until its lease
    ran out, each attempt the same until it was dead, nothing saying why (a Python
    handler's `ctx.artifact` failed each attempt, retried). Nothing but the operator's
    `migrate --with artifacts` heals it: the attempt fails for good at once, saying so
    (`retry` runs it again once migrated)."""
    _, c = db
    assert "artifacts" not in c.features
    job = c.enqueue("report", {"title": "Nowhere to keep it"}, max_attempts=3)["job_id"]
    args = (("--app", "examples.report_app:app") if handler == "python"
            else ("--exec", f"report={PY} examples/report_cmd.py"))
    w = start(*args, "--lease", "60", "--burst")
    code, summary = w.finish()
    assert code == 0, summary
    shown = c.show(job)["job"]
    assert shown["status"] == "dead" and shown["attempts"] == 1, shown
    assert "migrate --with artifacts" in shown["last_error"], shown["last_error"]
    assert [e["reason"] for e in c.show(job)["events"]][-1] == "failed"


def test_a_completion_refused_by_the_validator_is_counted_and_logged_as_a_failed_attempt(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """The kind's validator refused the artifact: the coordinator failed the attempt
    (`artifact_invalid`), but the worker logged a refused report and counted the job
    `lost`, as if another worker had it now."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[artifacts.kinds.report]\nvalidator = ["{PY}", "-c", '
                      '"import sys; sys.exit(3)"]\n')
    job = c.enqueue("report", {"title": "Refused"}, max_attempts=1)["job_id"]
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--burst",
              env={"JOBCOORD_POLICY": str(policy)})
    code, summary = w.finish()
    assert code == 0, summary
    assert summary["failed"] == 1 and summary["lost"] == 0, summary
    [failed] = w.events("failed")
    assert failed["reason"] == "artifact_invalid" and failed["job_id"] == job, failed
    assert c.show(job)["job"]["status"] == "dead"


def test_a_batched_workers_other_completions_keep_their_leases_during_artifact_checks(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """A batched worker completes in groups: a job without artifacts, done while another
    job's completion checked its artifacts (a validator longer than the lease), waited for
    those checks with its lease unrenewed; it ran out, the reaper took the job, and its
    result was refused (a job of one attempt ended dead although it had succeeded)."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    policy = slow_validator_policy(tmp_path, 6)
    checked = c.enqueue("report", {"title": "Checked slowly"})["job_id"]
    quick = c.enqueue("quick", {}, max_attempts=1)["job_id"]
    w = start("--exec", f"report={PY} examples/report_cmd.py",
              "--exec", f"quick={PY} -c 'import time; time.sleep(1); print(1)'",
              "--concurrency", "2", "--lease", "3", "--burst", "--reap-every", "0.5",
              env={"JOBCOORD_POLICY": str(policy)})
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 2, summary
    for job in (checked, quick):
        shown = c.show(job)["job"]
        assert shown["status"] == "succeeded" and shown["attempts"] == 1, shown


def shell_validator_policy(tmp_path: Path, script: str) -> Path:
    """A policy file whose `report` kind is checked by this shell script."""
    checker = tmp_path / "check.sh"
    checker.write_text(script)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[artifacts.kinds.report]\nvalidator = ["sh", "{checker}"]\n')
    return policy


def test_a_validator_and_its_children_die_with_a_worker_killed_during_the_checks(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """A kind's validator runs while the completion checks the artifacts. A worker
    SIGKILLed meanwhile left it (and what it started) running on, re-parented to init,
    for as long as it cared to run."""
    import signal
    import time

    from tests.test_worker import gone

    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    pids = tmp_path / "pids"
    policy = shell_validator_policy(tmp_path, f"sleep 120 &\necho $$ $! > '{pids}'\nwait\n")
    c.enqueue("report", {"title": "Checked"})
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--burst",
              env={"JOBCOORD_POLICY": str(policy)})
    deadline = time.monotonic() + 20
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the validator did not start"
        time.sleep(0.05)
    assert w.proc is not None
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait(10)
    left = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 5
    while not all(gone(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert all(gone(p) for p in left), left
    finally:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_staging_that_fails_half_way_stages_only_the_rest_in_the_report(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """The staging beside the lease loop failed on its second file; the report stages what
    is left and says so. The first file, already staged, is not uploaded again."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    job = c.enqueue("three", {})["job_id"]
    cmd = tmp_path / "three.py"
    cmd.write_text("import os, pathlib\n"
                   "out = pathlib.Path(os.environ['JOBCOORD_ARTIFACTS_OUT'])\n"
                   "for n in 'abc':\n    (out / f'{n}.txt').write_text(n * 100)\n"
                   "print('{}')\n")
    w = start("--exec", f"three={PY} {cmd}", "--burst",
              env={"JOBCOORD_FAULT": "artifacts.put:bug=2"})
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1, summary
    staged = [e["detail"]["name"] for e in c.show(job)["events"]
              if e["reason"] == "artifact_staged"]
    assert staged == ["a.txt", "b.txt", "c.txt"], staged
    assert sorted(a["name"] for a in c.artifacts(job)["artifacts"]) == ["a.txt", "b.txt",
                                                                       "c.txt"]
    [failed] = w.events("artifacts_stage_error")
    assert failed["job_id"] == job and failed["staged"] == 1, failed


def test_a_running_commands_files_are_held_against_any_sweep(
        db: Any, start: Any, tmp_path: Path) -> None:
    """While a command runs, its worker holds a lock on its artifacts directory and its
    checkpoints file: a sweep of another PID namespace, where the worker's PID means
    nothing, finds them held and leaves them."""
    import fcntl
    import time

    _, c = db
    temp = tmp_path / "temp"
    temp.mkdir()
    c.enqueue("slow", {})
    w = start("--exec", f"slow={PY} -c 'import time; time.sleep(8)'", "--burst",
              env={"TMPDIR": str(temp)})
    deadline = time.monotonic() + 15
    while len(list(temp.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    entries = sorted(temp.iterdir())
    assert len(entries) == 2, entries
    for entry in entries:
        fd = os.open(entry, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1, summary
    assert list(temp.iterdir()) == []


def test_a_workers_start_sweeps_what_a_killed_worker_left_in_the_temporary_directory(
        db: Any, start: Any, tmp_path: Path) -> None:
    """A worker SIGKILLed while its command ran (or its files were staged) left the
    command's artifacts directory and checkpoints file for good (hundreds of MB). A worker
    starting removes those of this user that no live worker holds, and nothing else: not a
    live worker's whose PID means nothing here (another PID namespace sharing the
    directory: it removed those, and their job succeeded without its artifacts), nor a
    user's own files that merely look like a worker's (it removed a whole directory)."""
    import fcntl
    import subprocess
    import sys
    import time

    temp = tmp_path / "temp"
    temp.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, check=True, text=True).stdout.strip()

    def made(name: str, is_dir: bool, mode: int | None = None) -> Path:
        path = temp / name
        if is_dir:
            path.mkdir()
            (path / "big.bin").write_bytes(b"x" * 1000)
        else:
            path.write_text("{}")
        path.chmod(mode if mode is not None else (0o700 if is_dir else 0o600))
        return path

    made(f"jobcoord-w{gone}-7-artifacts-abc_1234", True)  # a killed worker's: removed
    made(f"jobcoord-w{gone}-7-xyz12345.json", False)  # removed
    alive = made(f"jobcoord-w{os.getpid()}-8-artifacts-def12345", True)  # young: kept
    # Unheld for minutes, its PID alive (a killed container worker's PID 1 is): removed.
    stale = made(f"jobcoord-w{os.getpid()}-10-artifacts-pqr12345", True)
    os.utime(stale, (time.time() - 120, time.time() - 120))
    # A live worker of another PID namespace: its PID is gone here, its lock is not.
    elsewhere = made(f"jobcoord-w{gone}-9-artifacts-ghi12345", True)
    held = os.open(elsewhere, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    kept = [alive, elsewhere,
            temp / "jobcoord-report.txt",  # not a worker's
            made(f"jobcoord-w{gone}-1-my-thesis", True),  # a user's, named alike
            made(f"jobcoord-w{gone}-2-artifacts-jkl12345", True, 0o755),  # not mkdtemp's
            made(f"jobcoord-w{gone}-3-mno12345.json", False, 0o644)]  # not mkstemp's
    kept[2].write_text("keep")
    # A remote worker's spooled upload: removed when unheld for minutes; kept when young
    # (its worker may not have locked it yet) or held.
    spooled = made("jobcoord-upload-stu12345", False)
    os.utime(spooled, (time.time() - 120, time.time() - 120))
    kept.append(made("jobcoord-upload-vwx12345", False))
    spooling = made("jobcoord-upload-yz012345", False)
    os.utime(spooling, (time.time() - 120, time.time() - 120))
    kept.append(spooling)
    # Named by its worker's PID: a young one of a killed worker is removed at once (a
    # worker restarted within the minute left it for its whole life), a live one's kept.
    made(f"jobcoord-upload-{gone}-ab123456", False)
    kept.append(made(f"jobcoord-upload-{os.getpid()}-cd123456", False))
    held_spool = os.open(spooling, os.O_RDONLY)
    fcntl.flock(held_spool, fcntl.LOCK_EX)
    try:
        w = start("--exec", f"report={PY} examples/report_cmd.py", "--burst",
                  env={"TMPDIR": str(temp)})
        code, summary = w.finish()
    finally:
        os.close(held)
        os.close(held_spool)
    assert code == 0, summary
    assert sorted(p.name for p in temp.iterdir()) == sorted(p.name for p in kept)
    assert w.events("swept_orphans")[0]["removed"] == 5



def test_slow_uploads_never_hold_back_the_renewals_of_the_workers_jobs(
        db: Any, start: Any, sqlite_target: Any) -> None:
    """A worker's database calls run on a few threads (a bound on its connections); its
    uploads ran there too, so four jobs' slow uploads held every renewal back and each
    lease was lost. Uploads run on threads of their own."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    jobs = [c.enqueue("report", {"title": f"t{i}"})["job_id"] for i in range(4)]
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--lease", "3",
              "--concurrency", "4", "--burst", env={"JOBCOORD_FAULT": "artifacts.put:sleep=4"})
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 4, summary
    for job in jobs:
        shown = c.show(job)["job"]
        assert shown["status"] == "succeeded" and shown["attempts"] == 1, shown


def test_a_remote_workers_spooled_upload_is_held_while_it_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload from a stream is spooled to a temporary file: held while the upload lives
    (a starting worker's sweep leaves it), removed after."""
    import fcntl
    import io

    from jobcoord.http import client

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with client._spooled(io.BytesIO(b"x" * 10)) as (_chunks, _digest, size):
        [spool] = list(tmp_path.iterdir())
        assert size == 10 and spool.name.startswith(f"{client.SPOOL_PREFIX}{os.getpid()}-")
        fd = os.open(spool, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert list(tmp_path.iterdir()) == []


def test_a_worker_stopped_during_a_completions_artifact_checks_exits_in_its_grace_releasing_the_job(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path) -> None:
    """SIGTERM while a completion's validator runs (here for a minute): the worker stayed
    for the whole validator, whatever its --grace, then its report failed with an internal
    error ("cannot schedule new futures after shutdown") and the job stayed running until
    its lease ran out. The checks get the grace, then end undecided, their validator
    stopped: the job is released (`worker_shutdown`, run again at once), the worker gone."""
    import signal
    import time

    from tests.test_worker import gone

    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    pids = tmp_path / "pids"
    policy = shell_validator_policy(tmp_path, f"echo $$ > '{pids}'\nsleep 60\n")
    job = c.enqueue("report", {"title": "Checked"})["job_id"]
    w = start("--exec", f"report={PY} examples/report_cmd.py", "--grace", "1",
              "--kill-grace", "1", "--lease", "120", env={"JOBCOORD_POLICY": str(policy)})
    deadline = time.monotonic() + 20
    while not (pids.exists() and pids.read_text().strip()):
        assert time.monotonic() < deadline, "the validator did not start"
        time.sleep(0.05)
    validator = int(pids.read_text())
    t0 = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    code, _summary = w.finish(timeout=40)
    took = time.monotonic() - t0
    assert code == 0, w.events()
    assert took < 15, took  # the grace (1 s), not the validator's minute
    [released] = w.events("released")
    assert released["job_id"] == job and released["reason"] == "worker_shutdown", released
    assert not w.events("report_error"), w.events("report_error")
    shown = c.show(job)["job"]
    assert shown["status"] == "waiting" and shown["attempts"] == 1, shown
    assert c.artifacts(job)["artifacts"] == []
    deadline = time.monotonic() + 5
    while not gone(validator) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(validator)


@pytest.mark.parametrize("replaced_by", ["a link to another directory", "a file"])
def test_a_command_that_replaces_its_artifacts_directory_stages_nothing_from_elsewhere(
        db: Any, start: Any, sqlite_target: Any, tmp_path: Path, replaced_by: str) -> None:
    """A command that replaced $JOBCOORD_ARTIFACTS_OUT with a link to another directory had
    that directory's files staged and accepted as its artifacts (links are not followed,
    the docs say), and the link (or a file put in its place) was left in the temporary
    directory for ever. Nothing is staged from elsewhere now, and what the command left in
    the directory's place is removed with the attempt."""
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")
    outside = tmp_path / "outside #1"
    outside.mkdir()
    (outside / "key.txt").write_text("TOPSECRET")
    script = tmp_path / "swap.py"
    swap = (f"os.symlink({str(outside)!r}, out)" if replaced_by.startswith("a link")
            else "open(out, 'w').write('x')")
    script.write_text("import os, shutil, sys\nsys.stdin.read()\n"
                      "out = os.environ['JOBCOORD_ARTIFACTS_OUT']\nshutil.rmtree(out)\n"
                      f"{swap}\nprint('{{}}')\n")
    job = c.enqueue("swap", {})["job_id"]
    w = start("--exec", f"swap={PY} {script}", "--burst")
    # This worker's own (its pid names them): other processes' workers run jobs with id 1 too.
    pattern = os.path.join(tempfile.gettempdir(), f"jobcoord-w{w.proc.pid}-{job}-artifacts-*")
    code, summary = w.finish()
    assert code == 0 and summary["completed"] == 1, summary
    assert c.artifacts(job)["artifacts"] == []
    assert (outside / "key.txt").read_text() == "TOPSECRET"
    assert [p for p in glob.glob(pattern) if os.path.lexists(p)] == []
