"""Long-running loops: `reap --every` prints JSON Lines and stops cleanly on signals; the
reaper and the worker survive a database restart (a private PostgreSQL cluster, restarted for
real) and a database file that briefly cannot be written (SQLite), and go on working.

Real processes, real signals, a real PostgreSQL server. The shared test server is never
restarted: the restart test starts its own throwaway cluster and always stops it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from jobcoord.service import Coordinator
from tests.test_worker import REPO, wait_for

pytestmark = pytest.mark.timeout(120)
PY = sys.executable


class Loop:
    """A `jobcoord ... reap --every` or `worker` process; stdout lines collected as they come."""

    def __init__(self, db_args: list[str], args: list[str], log: str,
                 nohup: bool = False):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [PY, "-m", "jobcoord", *db_args, *args], cwd=REPO, stdout=subprocess.PIPE,
                stderr=err, stdin=subprocess.DEVNULL,
                # As `nohup` starts it: SIGHUP ignored, which exec keeps.
                preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup
                else None)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode())

    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]

    def stderr(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"exited {self.proc.returncode}: {self.stderr()[-3000:]}")
        return True

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def loops() -> Iterator[list[Loop]]:
    started: list[Loop] = []
    yield started
    for loop in started:
        loop.kill()


def _reaper(loops: list[Loop], db_args: list[str], tmp: Any, every: str = "0.2") -> Loop:
    loop = Loop(db_args, ["reap", "--every", every, "--json"], str(tmp / "reaper.log"))
    loops.append(loop)
    return loop


def _worker(loops: list[Loop], db_args: list[str], tmp: Any) -> Loop:
    loop = Loop(db_args, ["worker", "--worker-id", "w1", "--app", "examples.handlers:app",
                          "--heartbeat-every", "0.3", "--poll", "0.05", "--reap-every", "0",
                          "--log-format", "json", "--json"], str(tmp / "worker.log"))
    loops.append(loop)
    return loop


def _expired_lease(c: Coordinator, lease_s: float = 0.3) -> int:
    """A job claimed by a worker that then vanished: its lease ends in `lease_s`."""
    c.heartbeat("gone", readings={"memory_used_pct": 10.0})
    job = c.enqueue("other_kind", {})["job_id"]
    got = c.claim("gone", lease_s=lease_s, kinds=["other_kind"])
    assert got["job"]["job_id"] == job
    return int(job)


# --- JSON Lines and signals -------------------------------------------------------------------


def test_reap_every_json_prints_one_object_per_pass_even_when_idle(target, coord, loops,
                                                                   tmp_path):
    db_args = (["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url])
    r = _reaper(loops, db_args, tmp_path)
    wait_for(lambda: r.alive() and len(r.lines) >= 3, 15, "three idle passes")
    job = _expired_lease(coord)
    wait_for(lambda: any(o.get("expired") for o in r.objects()), 15, "the pass that reaps")
    assert coord.show(job)["job"]["status"] == "waiting"
    assert r.stop(signal.SIGTERM) == 0
    objects = r.objects()  # every line is exactly one JSON object
    assert all(isinstance(o, dict) and "pass" in o for o in objects)
    assert [o["pass"] for o in objects] == list(range(1, len(objects) + 1))
    assert sum(o.get("expired", 0) for o in objects) == 1


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGHUP, 0)],
                         ids=["ctrl-c", "hangup"])
def test_ctrl_c_or_a_hangup_ends_reap_every_after_the_pass(sqlite_target, loops, tmp_path,
                                                           sig, code):
    """Ctrl-C: exit 130. Its terminal closed (SIGHUP): it died of the signal (129) in the
    middle of whatever it did; it stops as on SIGTERM, the pass under way finished, exit 0."""
    r = _reaper(loops, ["--db", sqlite_target.sqlite_path], tmp_path)
    wait_for(lambda: r.alive() and len(r.lines) >= 2, 15, "two passes")
    assert r.stop(sig) == code
    assert all(isinstance(o, dict) for o in r.objects())
    assert "Traceback" not in r.stderr()


def _stopped_under_a_hail_of_signals(proc: subprocess.Popen[Any], sig: int) -> int:
    """Send `sig`, then again every few milliseconds until the process has exited."""
    proc.send_signal(sig)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.003)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    return proc.wait(10)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130),
                                      (signal.SIGHUP, 0)], ids=["sigterm", "ctrl-c", "hangup"])
def test_signals_after_the_first_never_change_how_reap_every_ends(sqlite_target, loops,
                                                                  tmp_path, sig, code):
    """The loop had stopped and was exiting when a second SIGTERM (a service manager's
    repeated stop, an impatient `kill`) landed: it died of it, exit 143, the stop it had
    made cleanly reported as a kill. A second signal changes nothing once the first is
    taken: the first one's exit code."""
    r = _reaper(loops, ["--db", sqlite_target.sqlite_path], tmp_path)
    wait_for(lambda: r.alive() and len(r.lines) >= 1, 15, "a pass")
    assert _stopped_under_a_hail_of_signals(r.proc, sig) == code, r.stderr()[-2000:]
    assert "Traceback" not in r.stderr()


def test_reap_every_whose_output_cannot_be_written_says_so_once_and_reaps_on(
        sqlite_target, tmp_path):
    """`reap --every --json > /dev/full`: every pass line was dropped and nothing said so
    (exit 0, stderr empty). The loop every expired lease depends on goes on, as for a reader
    gone, and says once on stderr that its lines cannot be written."""
    err = tmp_path / "reaper.err"
    with open("/dev/full", "w") as full, open(err, "wb") as log:
        proc = subprocess.Popen([PY, "-m", "jobcoord", "--db", sqlite_target.sqlite_path,
                                 "reap", "--every", "0.1", "--json"], cwd=REPO, stdout=full,
                                stderr=log, stdin=subprocess.DEVNULL)
        try:
            with Coordinator.open(sqlite_target) as c:
                job = _expired_lease(c)
                wait_for(lambda: c.show(job)["job"]["status"] == "waiting", 30,
                         "the lease reaped")
            time.sleep(0.5)  # more passes, more lines dropped
        finally:
            code = _stopped_under_a_hail_of_signals(proc, signal.SIGTERM)
    said = err.read_text()
    assert code == 0, said
    assert said.count("cannot write to stdout") == 1, said
    assert "Traceback" not in said


def test_a_worker_takes_a_feature_removed_beside_it_and_completes_on(sqlite_target, loops,
                                                                     tmp_path):
    """`migrate --without artifacts --force` beside a running worker: its completions failed
    for good (the tables it took to be there were gone), each job left to its lease's end,
    until a restart. The call that meets the change is `schema_changed`, which a retry
    heals: the report is sent again and the job succeeds; the worker runs on."""
    from tests.conftest import run_cli
    from tests.test_artifacts_rules import install

    install(sqlite_target)
    w = Loop(["--db", sqlite_target.sqlite_path],
             ["worker", "--exec", "k=cat", "--poll", "0.1", "--reap-every", "0"],
             str(tmp_path / "worker.log"))
    loops.append(w)
    wait_for(lambda: w.alive() and " started " in w.stderr(), 30, "the worker started")
    assert run_cli(sqlite_target, "migrate", "--without", "artifacts", "--force").code == 0
    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("k", {"n": 1})["job_id"]
        wait_for(lambda: w.alive() and c.show(job)["job"]["status"] == "succeeded", 30,
                 "the job completed")
    assert w.stop() == 0, w.stderr()[-3000:]
    assert "report_error" not in w.stderr(), w.stderr()[-3000:]


def test_a_reaper_started_to_outlive_its_terminal_ignores_the_hangup(sqlite_target, loops,
                                                                     tmp_path):
    """`nohup jobcoord reap --every 5`: SIGHUP ignored when it started stays ignored."""
    loop = Loop(["--db", sqlite_target.sqlite_path], ["reap", "--every", "0.2", "--json"],
                str(tmp_path / "reaper.log"), nohup=True)
    loops.append(loop)
    wait_for(lambda: loop.alive() and len(loop.lines) >= 2, 15, "two passes")
    loop.proc.send_signal(signal.SIGHUP)
    seen = len(loop.lines)
    wait_for(lambda: loop.alive() and len(loop.lines) >= seen + 3, 15, "passes after it")
    assert loop.stop(signal.SIGTERM) == 0


# --- surviving the database ---------------------------------------------------------------


def _completed(worker: Loop, job: int) -> bool:
    with open(worker.log, encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                e = json.loads(line)
                if e.get("event") == "completed" and e.get("job_id") == job:
                    return True
    return False


def _chattr(flag: str, *paths: str) -> None:
    for path in paths:
        if os.path.exists(path):
            subprocess.run(["chattr", flag, path], check=True, capture_output=True)


def test_loops_survive_a_database_file_that_briefly_cannot_be_written(sqlite_target, loops,
                                                                         tmp_path):
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    path = sqlite_target.sqlite_path
    db_args = ["--db", path]
    c = Coordinator.open(sqlite_target)
    try:
        first = c.enqueue("summarize", {"text": "before"})["job_id"]
        w = _worker(loops, db_args, tmp_path)
        r = _reaper(loops, db_args, tmp_path)
        wait_for(lambda: w.alive() and _completed(w, first), 15, "a job before the fault")
        wait_for(lambda: r.alive() and r.lines, 15, "the reaper's first pass")
        stuck = _expired_lease(c, lease_s=0.5)
        # The immutable flag stops writes even through descriptors already open, and stops
        # root too (chmod 000 stops neither): the closest thing to a disk that refuses
        # writes for a while. Reads go on working.
        files = [path, path + "-wal"]
        try:
            _chattr("+i", *files)
            wait_for(lambda: any(o.get("skipped") for o in r.objects()), 15,
                     "a skipped reaper pass")
            time.sleep(2.0)  # the worker's heartbeats fail too, for a while
        finally:
            _chattr("-i", *files)
        wait_for(lambda: r.alive() and w.alive() and
                 c.show(stuck)["job"]["status"] == "waiting", 30, "the reaper to go on")
        after = c.enqueue("summarize", {"text": "after"})["job_id"]
        wait_for(lambda: w.alive() and _completed(w, after), 30, "a job after the fault")
        skipped = [o for o in r.objects() if o.get("skipped")]
        assert skipped[0]["error"]["code"].startswith("database_")
        assert r.stop() == 0 and w.stop() == 0
    finally:
        _chattr("-i", path, path + "-wal")
        c.close()


def _pg_bin() -> str | None:
    root = "/usr/lib/postgresql"
    if not os.path.isdir(root):
        return None
    versions = sorted(os.listdir(root), key=lambda v: int(v) if v.isdigit() else 0)
    for version in reversed(versions):
        if os.path.exists(os.path.join(root, version, "bin", "pg_ctl")):
            return os.path.join(root, version, "bin")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_pg() -> Iterator[tuple[str, Any]]:
    """A throwaway PostgreSQL cluster of this test's own, on a free port; yields its URL and
    a function that restarts it. Always stopped (immediately) at the end."""
    bin_dir = _pg_bin()
    if bin_dir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root, runuser and a PostgreSQL installation")
    base = tempfile.mkdtemp(prefix="jobcoord-pg-")
    data = os.path.join(base, "data")
    shutil.chown(base, "postgres")
    port = _free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    pg_ctl = [*as_pg, f"{bin_dir}/pg_ctl", "-D", data, "-w", "-t", "60", "-o",
              f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"]
    # The server's output goes to a log file, never to a pipe of ours: the server outlives
    # pg_ctl and would hold the pipe open.
    quiet: dict[str, Any] = {"check": True, "stdout": subprocess.DEVNULL,
                             "stderr": subprocess.DEVNULL, "stdin": subprocess.DEVNULL}
    log = ["-l", os.path.join(base, "log")]
    subprocess.run([*as_pg, f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"],
                   **quiet)
    try:
        subprocess.run([*pg_ctl, *log, "start"], **quiet)

        def restart() -> None:
            subprocess.run([*pg_ctl, *log, "-m", "fast", "restart"], **quiet)

        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", restart
    finally:
        subprocess.run([*as_pg, f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "-w",
                        "stop"], **(quiet | {"check": False}))
        shutil.rmtree(base, ignore_errors=True)


def test_loops_survive_a_real_postgresql_restart(private_pg, loops, tmp_path):
    url, restart = private_pg
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    target = resolve_target(url=url)
    db = Database.open(target, create=True)
    migrate(db)
    db.close()
    db_args = ["--url", url]
    c = Coordinator.open(target)
    try:
        first = c.enqueue("summarize", {"text": "before"})["job_id"]
        w = _worker(loops, db_args, tmp_path)
        r = _reaper(loops, db_args, tmp_path)
        wait_for(lambda: w.alive() and _completed(w, first), 20, "a job before the restart")
        wait_for(lambda: r.alive() and r.lines, 20, "the reaper's first pass")
        passes = len(r.lines)
        restart()  # terminates every connection: "terminating connection due to admin..."
        c.close()
        c = Coordinator.open(target)
        after = c.enqueue("summarize", {"text": "after"})["job_id"]
        wait_for(lambda: w.alive() and _completed(w, after), 30, "a job after the restart")
        stuck = _expired_lease(c)
        wait_for(lambda: r.alive() and c.show(stuck)["job"]["status"] == "waiting", 30,
                 "the reaper to reap after the restart")
        assert len(r.lines) > passes
        assert r.stop() == 0 and w.stop() == 0
    finally:
        c.close()


class Wrapped:
    """A Coordinator with some of its calls replaced by a test; the rest pass through."""

    def __init__(self, c: Coordinator) -> None:
        self._c = c

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def in_process_worker(coordinator: Any, handler: Any = None, **config: Any
                      ) -> tuple[Any, io.StringIO]:
    """A worker `w1` of one `summarize` handler (a no-op unless given) on `coordinator`,
    run in this process, and the buffer its JSON log lines go to."""
    from jobcoord.app import App
    from jobcoord.worker.config import WorkerConfig
    from jobcoord.worker.log import Log
    from jobcoord.worker.loop import Worker

    app = App()
    app.handler("summarize")(handler or (lambda _payload, _ctx: {}))
    cfg = WorkerConfig(worker_id="w1", handlers=dict(app.handlers), roles=[], reap_s=0.0,
                       poll_s=0.05, readings_override={"memory_used_pct": 10}, **config)
    log = io.StringIO()
    return Worker(coordinator, cfg, Log("w1", "json", log)), log


def logged_events(log: io.StringIO) -> list[str]:
    return [json.loads(line)["event"] for line in log.getvalue().splitlines()]


def stop_worker(w: Any, runner: threading.Thread) -> None:
    """Stop a worker running on `runner` as its loop would be stopped, and wait for it."""
    w.stopping.set()
    w.wake.set()
    runner.join(20)
    assert not runner.is_alive()


def test_a_burst_worker_gives_up_on_a_database_that_stays_unavailable(sqlite_target):
    """A --burst worker runs the queue dry for a script: its claims failing for `give_up_s`
    with nothing of its own running, it stops with the error (exit 6) instead of waiting for
    a database that may never come back. A worker without --burst keeps trying."""
    from jobcoord.errors import StorageUnavailable

    class Unreachable(Wrapped):
        """The coordinator with its claims failing as an unreachable database's do."""

        def __init__(self, c):
            super().__init__(c)
            self.claims = 0
            # One error object raised again and again, as a client keeping its last error.
            self.error = StorageUnavailable("database_unavailable", "connection refused")

        def _down(self, *_a, **_kw):
            self.claims += 1
            raise self.error

        claim = claim_many = _down

    def worker(c, burst):
        return in_process_worker(Unreachable(c), burst=burst, give_up_s=1.0)

    with Coordinator.open(sqlite_target) as c:
        w, log = worker(c, burst=True)
        down = w.coordinator
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailable) as gave_up:
            w.run()
        took = time.monotonic() - t0
        assert 1.0 <= took < 5.0, took
        assert gave_up.value.exit_code == 6 and "--burst" in gave_up.value.message
        assert gave_up.value.code == "database_unavailable"
        # The worker's own error says it gave up; the error it caught is left as it was.
        assert gave_up.value is not down.error and down.error.message == "connection refused"
        events = logged_events(log)
        assert events.count("claim_error") >= 2, events
        assert events[-2:] == ["giving_up", "stopped_worker"], events  # then its counts

        w, log = worker(c, burst=False)
        runner = threading.Thread(target=w.run, daemon=True)
        runner.start()
        time.sleep(2.0)
        assert runner.is_alive()
        stop_worker(w, runner)
        assert "giving_up" not in log.getvalue()


def test_a_heartbeat_that_fails_after_the_worker_has_stopped_is_not_logged(sqlite_target):
    """A heartbeat still in flight when the worker stops fails once its coordinator is
    closed (a remote client: "the client has been closed"): that failure is the stop itself,
    not an error worth a `heartbeat_error` line after `stopped_worker`."""
    class Closing(Wrapped):
        """The coordinator whose second heartbeat hangs until it is closed, then fails."""

        def __init__(self, c):
            super().__init__(c)
            self.beats = 0
            self.hanging = threading.Event()
            self.closed = threading.Event()

        def heartbeat(self, *args, **kwargs):
            self.beats += 1
            if self.beats == 1:
                return self._c.heartbeat(*args, **kwargs)
            self.hanging.set()
            self.closed.wait(30)
            raise RuntimeError("Cannot send a request, as the client has been closed.")

    with Coordinator.open(sqlite_target) as c:
        closing = Closing(c)
        w, log = in_process_worker(closing, heartbeat_s=0.1)
        runner = threading.Thread(target=w.run, daemon=True)
        runner.start()
        assert closing.hanging.wait(20)
        stop_worker(w, runner)
        closing.closed.set()  # the command closes its coordinator after run() returns
        time.sleep(0.5)
    events = logged_events(log)
    assert events[-1] == "stopped_worker" and "heartbeat_error" not in events, events


def test_a_late_claim_is_released_unrun_when_the_worker_stops_while_its_lease_is_confirmed(
        sqlite_target):
    """A claim answered late is renewed before its handler starts; the worker told to stop
    (SIGTERM) meanwhile hands the job back without ever calling the handler, and without
    waiting out the renewal: a handler started then would run beside the job's next attempt
    (the release has already made it claimable)."""
    called = []

    def summarize(_payload, _ctx):
        called.append(time.monotonic())
        time.sleep(2)
        return {}

    class Late(Wrapped):
        """Claims answered with under a third of the lease left; the first renewal held."""

        def __init__(self, c):
            super().__init__(c)
            self.renewing = threading.Event()
            self.hold = threading.Event()

        def claim_many(self, *args, **kwargs):
            got = self._c.claim_many(*args, **kwargs)
            if got["claimed"]:
                time.sleep(2.2)  # the answer arrives late: 0.8 s of a 3 s lease left
            return got

        def renew(self, *args, **kwargs):
            self.renewing.set()
            self.hold.wait(30)
            return self._c.renew(*args, **kwargs)

    with Coordinator.open(sqlite_target) as c:
        job = c.enqueue("summarize", {}, max_attempts=1)["job_id"]
        late = Late(c)
        w, log = in_process_worker(late, summarize, lease_s=3.0, grace_s=0.5)
        runner = threading.Thread(target=w.run, daemon=True)
        runner.start()
        try:
            assert late.renewing.wait(20), log.getvalue()
            t0 = time.monotonic()
            w._on_signal(signal.SIGTERM, None)
            runner.join(10)
            took = time.monotonic() - t0
        finally:
            late.hold.set()
        assert not runner.is_alive()
        time.sleep(0.5)  # the held renewal answers now: it must change nothing
        shown = c.show(job)
    events = logged_events(log)
    assert called == [], events
    assert shown["job"]["status"] == "waiting" and shown["lease"] is None, (shown, events)
    assert "released" in events and "lease_confirmed" not in events, events
    assert took < 4.0, (took, events)
