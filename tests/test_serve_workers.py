"""Remote workers: separate `jobcoord worker --server URL --token-file F` processes against a
real `jobcoord serve`, on SQLite and PostgreSQL. Every job succeeds exactly once, no (job,
epoch) is claimed twice, and the invariants hold."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

from jobcoord import tokens
from jobcoord.db import Target
from jobcoord.errors import InvalidInput, JobcoordError
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import as_connection_opens, jobcoord_argv, served, token, token_file
from tests.sql import sql


def start_worker(url: str, secret: str, tmp: str, name: str, *extra: str
                 ) -> subprocess.Popen[bytes]:
    path = token_file(tmp, f"{name}.token", secret)
    argv = [*jobcoord_argv(), "worker", "--server", url, "--token-file", path,
            "--app", "tests.serve_app:app", "--readings-override", '{"memory_used_pct": 10}',
            "--log-format", "json", "--json", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes], timeout: float) -> tuple[dict[str, Any], str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1]), err.decode()


def ledger_violations(c: Coordinator, n_jobs: int) -> list[str]:
    """The exactly-once facts, read through SQL on either database."""
    def _read(conn: Any) -> dict[str, Any]:
        run = sql
        return {
            "status": dict(run(conn, "SELECT status, COUNT(*) FROM jobs GROUP BY status").all()),
            "completed": run(conn, "SELECT job_id, COUNT(*) FROM job_events WHERE reason ="
                             " 'completed' GROUP BY job_id").all(),
            "claims": run(conn, "SELECT job_id, epoch FROM job_events WHERE reason ="
                          " 'claimed'").all(),
            "leases": run(conn, "SELECT COUNT(*) FROM leases").scalar(),
            "epochs": run(conn, "SELECT j.job_id, j.epoch, COUNT(e.event_id) FROM jobs j"
                          " LEFT JOIN job_events e ON e.job_id = j.job_id AND e.reason ="
                          " 'claimed' GROUP BY j.job_id, j.epoch").all(),
        }

    got = c.db.read(_read)
    found = []
    if got["status"] != {"succeeded": n_jobs}:
        found.append(f"statuses: {got['status']}")
    twice = [row for row in got["completed"] if row[1] != 1]
    if twice or len(got["completed"]) != n_jobs:
        found.append(f"completions: {len(got['completed'])} jobs, not once: {twice[:5]}")
    dup = [k for k, n in Counter(map(tuple, got["claims"])).items() if n > 1]
    if dup:
        found.append(f"(job, epoch) claimed twice: {dup[:5]}")
    if got["leases"]:
        found.append(f"{got['leases']} leases left")
    bad = [row for row in got["epochs"] if row[1] != row[2]]
    if bad:
        found.append(f"epoch != claims: {bad[:5]}")
    return found


def log_events(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def run_fleet(target: Target, tmp: str, n_jobs: int, n_workers: int, *extra: str
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every worker's summary, and every line of their logs (`extra`: worker options)."""
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "work", "payload": {"i": i}} for i in range(n_jobs)])
    secrets = [token(target, f"w{i}", "worker", worker=f"w{i}") for i in range(n_workers)]
    with served(target, "--reap-every", "2") as s:
        procs = [start_worker(s.url, secret, tmp, f"w{i}", "--burst", "--wait", "1", *extra)
                 for i, secret in enumerate(secrets)]
        finished = [finish(p, 240) for p in procs]
    summaries = [summary for summary, _ in finished]
    events = [e for _, err in finished for e in log_events(err)]
    with Coordinator.open(target) as c:
        assert not ledger_violations(c, n_jobs), ledger_violations(c, n_jobs)
    if target.sqlite_path:
        from tests.invariants import assert_invariants

        assert_invariants(target.sqlite_path)
    assert sum(s["completed"] for s in summaries) == n_jobs
    assert all(s["lost"] == 0 for s in summaries)
    return summaries, events


def test_remote_workers_run_every_job_exactly_once(target: Target, tmp_path: Any) -> None:
    summaries, events = run_fleet(target, str(tmp_path), 400, 8)
    # The work was spread: more than one worker completed jobs.
    assert sum(1 for s in summaries if s["completed"]) > 1
    # Most jobs were claimed by the completion before them, in the same request.
    via = Counter(e["via"] for e in events if e["event"] == "claimed")
    assert via["completion"] > via["claim"], via


def test_remote_workers_with_slots_claim_and_complete_in_batches_exactly_once(
        target: Target, tmp_path: Any) -> None:
    """With several slots a remote worker claims up to its free slots in one request
    (`POST /v1/claims` with `n`) and sends finished jobs' results in groups (`POST
    /v1/completions`), each fenced by its own epoch: every job still succeeds exactly once.
    Jobs claimed together share one claim transaction's time; groups share a completion's."""
    n_jobs = 400
    summaries, _events = run_fleet(target, str(tmp_path), n_jobs, 4, "--concurrency", "8")
    assert sum(1 for s in summaries if s["completed"]) > 1
    with Coordinator.open(target) as c:
        claims, completions = c.db.read(lambda conn: tuple(sql(
            conn, "SELECT COUNT(DISTINCT worker_id || ':' || at), COUNT(*) FROM job_events"
            f" WHERE reason = '{reason}'").one() for reason in ("claimed", "completed")))
    # Fewer transactions than jobs on both sides: batches of more than one job happened.
    assert claims[0] < claims[1] and completions[0] < completions[1], (claims, completions)
    assert completions[1] == n_jobs


@pytest.mark.parametrize("slots", ["1", "4"])
def test_sigterm_cuts_an_idle_remote_workers_long_poll_short(
        target: Target, tmp_path: Any, slots: str) -> None:
    """An idle remote worker sits in a claim long-poll of up to 20 s (the default): SIGTERM
    ends it at once (the poll's connection is shut), the worker stops within moments, and
    a job submitted after is not handed to the poll that went away."""
    import signal
    import time

    secret = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s:
        proc = start_worker(s.url, secret, str(tmp_path), "wa", "--concurrency", slots)
        time.sleep(2.0)  # started, found nothing, polling
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        summary, _err = finish(proc, 30)
        stopped_in = time.monotonic() - t0
        with Coordinator.open(target) as c:
            job = c.enqueue("work", {})["job_id"]
            time.sleep(0.5)
            shown = c.show(job)
    assert stopped_in < 5, stopped_in
    assert summary["worker_id"] == "wa" and summary["claimed"] == 0
    assert shown["job"]["status"] == "waiting" and shown["lease"] is None, shown


def test_interrupt_cuts_a_poll_whose_connection_was_opening_as_it_ran(
        target: Target, tmp_path: Any) -> None:
    """`interrupt` (SIGTERM) cut the poll connections already open; a claim that had looked
    at it and was opening a new connection at that moment was not cut: the stopping worker
    sat out the whole long-poll (20 s here)."""
    import time

    secret = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s, RemoteCoordinator(
            s.url, secret, claim_wait=20) as r:
        r.heartbeat("wa", readings={"memory_used_pct": 5})
        as_connection_opens(r._poll_conns, r.interrupt)
        t0 = time.monotonic()
        got = r.claim("wa")
        took = time.monotonic() - t0
    assert got["job"] is None and got["reason"] == "no_waiting_jobs", got
    assert took < 5, took


@pytest.mark.slow
def test_eight_remote_workers_over_two_thousand_jobs(target: Target, tmp_path: Any) -> None:
    run_fleet(target, str(tmp_path), 2000, 8)


def test_remote_worker_releases_its_job_on_sigterm_and_checkpoints_over_http(
        target: Target, tmp_path: Any) -> None:
    import signal

    from tests.serve_procs import wait_for

    with Coordinator.open(target) as c:
        job = c.enqueue("slow", {"i": 7, "sleep": 60})["job_id"]
    secret = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s:
        proc = start_worker(s.url, secret, str(tmp_path), "wa", "--grace", "0.5")
        with Coordinator.open(target) as c:
            wait_for(lambda: c.show(job)["checkpoints"], timeout=30)
            proc.send_signal(signal.SIGTERM)
            summary, _err = finish(proc, 60)
            shown = c.show(job)
    assert summary["released"] == 1 and summary["worker_id"] == "wa"
    assert shown["job"]["status"] == "waiting"
    assert shown["checkpoints"][0]["data"] == {"i": 7}
    assert shown["events"][-1]["reason"] == "worker_shutdown"
    assert shown["events"][-1]["worker_id"] == "wa"


def test_sigterm_stops_a_remote_workers_chained_claims(target: Target, tmp_path: Any
                                                      ) -> None:
    """Jobs claimed with each completion, then SIGTERM: no claim after it, nothing left
    leased, every job either done once or waiting."""
    import signal

    from tests.serve_procs import wait_for

    n = 2000
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "work", "payload": {"i": i}} for i in range(n)])
    secret = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s:
        proc = start_worker(s.url, secret, str(tmp_path), "wa", "--grace", "5")
        with Coordinator.open(target) as c:
            wait_for(lambda: c.db.read(lambda conn: sql(
                conn, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded'").scalar()) >= 50,
                timeout=60)
            proc.send_signal(signal.SIGTERM)
            summary, err = finish(proc, 60)
            counts = c.db.read(lambda conn: dict(sql(
                conn, "SELECT status, COUNT(*) FROM jobs GROUP BY status").all()))
            leases = c.db.read(lambda conn: sql(conn, "SELECT COUNT(*) FROM leases").scalar())
    events = log_events(err)
    names = [e["event"] for e in events]
    stop = names.index("shutting_down")
    assert "claimed" not in names[stop + 1:]
    assert any(e.get("via") == "completion" for e in events[:stop] if e["event"] == "claimed")
    assert leases == 0 and set(counts) <= {"succeeded", "waiting"}, counts
    assert counts["succeeded"] == summary["completed"] < n
    assert summary["claimed"] == summary["completed"] + summary["released"]


def test_a_remote_burst_worker_leaves_an_empty_queue_without_waiting_out_a_long_poll(
        target: Target, tmp_path: Any) -> None:
    """--burst leaves once a claim gets nothing: through a server its claims do not
    long-poll unless --wait is given (it waited the default 20 s before leaving)."""
    import time

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.enqueue("work", {})
    with served(target, "--reap-every", "0") as s:
        t0 = time.monotonic()
        summary, _ = finish(start_worker(s.url, secret, str(tmp_path), "wa", "--burst"), 60)
        took = time.monotonic() - t0
    assert summary["claimed"] == 1 and summary["completed"] == 1, summary
    assert took < 10.0, took


def test_remote_worker_refuses_a_bad_token_setup(target: Target, tmp_path: Any) -> None:
    import subprocess as sp

    viewer = token(target, "v", "viewer")
    wa = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s:
        # An unknown token is bad usage (exit 2), as the wrong role or worker id is, not a
        # rule's refusal (4).
        for secret, extra, code in ((viewer, (), 2), (wa, ("--worker-id", "other"), 2),
                                    ("jct_unknown", (), 2)):
            proc = start_worker(s.url, secret, str(tmp_path), "t", *extra)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == code, err.decode()[-2000:]
            assert "error" in json.loads(out.decode().splitlines()[-1])
        no_file = sp.run([*jobcoord_argv(), "worker", "--server", s.url, "--exec", "k=true",
                          "--json"], capture_output=True, timeout=60, check=False)
        assert no_file.returncode == 2


def test_a_revoked_or_unknown_token_and_a_wrong_server_path_are_exit_2_not_a_refusal(
        target: Target, tmp_path: Any) -> None:
    """A revoked token was exit 4, "refused by a coordinator rule", and a server URL with a
    path the server does not serve was exit 4 saying only "Not Found", as if a job were
    missing. Both are bad usage (exit 2); a worker whose token is revoked mid-job still stops
    its handler at once and completes nothing."""
    with Coordinator.open(target) as c:
        job = c.enqueue("slow", {"sleep": 60})["job_id"]
    wa = token(target, "wa", "worker", worker="wa")
    wb = token(target, "wb", "worker", worker="wb")
    with served(target, "--reap-every", "0") as s:
        with Coordinator.open(target) as c:
            tokens.revoke(c.db, "wb")
        proc = start_worker(s.url, wb, str(tmp_path), "wb")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err.decode()[-2000:]
        error = json.loads(out.decode().splitlines()[-1])["error"]
        assert (error["code"], error["message"]) == ("unauthorized", "unknown or revoked token")
        proc = start_worker(s.url + "/prefix", wa, str(tmp_path), "wa-path")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err.decode()[-2000:]
        error = json.loads(out.decode().splitlines()[-1])["error"]
        assert "check the server URL" in error["message"], error
        # Revoked while its handler runs: a 401 stops the handler, nothing is
        # reported, and the worker exits 2, its log ending with its counts.
        proc = start_worker(s.url, wa, str(tmp_path), "wa", "--lease", "6")
        deadline = time.monotonic() + 60
        with Coordinator.open(target) as c:
            while c.show(job)["job"]["status"] != "running":
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            tokens.revoke(c.db, "wa")
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 2, err.decode()[-2000:]
            # The renewal's 401 (`lease_lost`), or the handler's own first call's, its
            # checkpoint, when the revocation lands before the first renewal (`stopped`).
            lost = [e for e in log_events(err.decode())
                    if e.get("event") in ("lease_lost", "stopped")]
            assert lost and lost[0]["reason"] == "unauthorized", err.decode()[-2000:]
            # Its log still ends with what the run did, and why it stopped.
            last = log_events(err.decode())[-1]
            assert last["event"] == "stopped_worker", err.decode()[-2000:]
            assert (last["claimed"], last["completed"], last["error"]) == (
                1, 0, "unauthorized"), last
            shown = c.show(job)
            assert shown["job"]["status"] == "running" and shown["job"]["result"] is None
            assert not [e for e in shown["events"] if e["reason"] in ("completed", "failed")]


def test_a_job_claimed_by_a_completion_as_the_worker_stops_is_released_at_once(
        target: Target) -> None:
    """The claim went out with the completion, SIGTERM came before its answer: the job is
    given back at once (no handler starts), as the drain would have, and the next chained
    completion claims nothing."""
    import io

    from jobcoord.http.client import RemoteCoordinator
    from jobcoord.worker.config import WorkerConfig
    from jobcoord.worker.log import Log
    from jobcoord.worker.loop import Worker
    from tests.serve_app import app

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("work", {})["job_id"]
    with served(target, "--reap-every", "0") as s, RemoteCoordinator(s.url, secret) as r:
        r.heartbeat("wa", readings={"memory_used_pct": 10}, kinds=["work"])
        config = WorkerConfig(worker_id="wa", handlers=dict(app.handlers), roles=[], batch=False)
        w = Worker(r, config, Log("wa", "json", io.StringIO()))
        assert w.chained and w.wants_next()
        got = r.claim("wa", wait=0)
        w.stopping.set()
        assert not w.wants_next()
        w.start_next(got, w.clock.boot())
        w.calls.shutdown()
        assert w.runs == [] and w.counts["released"] == w.counts["claimed"] == 1
    with Coordinator.open(target) as c:
        shown = c.show(job)
    assert shown["job"]["status"] == "waiting"
    assert shown["events"][-1]["reason"] == "worker_shutdown"


def test_a_remote_worker_never_claims_outside_the_tenant_it_was_given(
        target: Target, tmp_path: Any) -> None:
    """The claim's tenant is the token's: `--tenant` the token cannot keep (an unbound token,
    or one bound to another tenant) is refused before anything is claimed, instead of being
    dropped and every tenant's jobs run."""
    with Coordinator.open(target) as c:
        bobs = c.enqueue("work", {}, tenant="bob")["job_id"]
    unbound = token(target, "wu", "worker", worker="wu")
    alices = token(target, "wa", "worker", worker="wa", tenant="alice")
    with served(target, "--reap-every", "0") as s:
        for secret, tenant in ((unbound, "alice"), (alices, "bob")):
            proc = start_worker(s.url, secret, str(tmp_path), "t", "--burst", "--wait", "0",
                                "--tenant", tenant)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 2, err.decode()[-2000:]
            assert "tenant" in json.loads(out.decode().splitlines()[-1])["error"]["message"]
        proc = start_worker(s.url, alices, str(tmp_path), "t", "--burst", "--wait", "0",
                            "--tenant", "alice")
        summary, err = finish(proc, 60)
        assert summary["claimed"] == 0
        started = next(e for e in log_events(err) if e.get("event") == "started")
        assert started["tenant"] == "alice"
    with Coordinator.open(target) as c:
        assert c.show(bobs)["job"]["status"] == "waiting"


def test_a_remote_claims_tenant_is_checked_against_the_token_which_a_revocation_still_ends(
        target: Target) -> None:
    """RemoteCoordinator.claim and claim_many with a tenant the token does not claim for are
    refused before anything is sent, naming the token's tenant; the identity kept for that
    check never stands in for the token: once revoked, the next claim is refused (401)."""
    with Coordinator.open(target) as c:
        job = c.enqueue("work", {}, tenant="alice")["job_id"]
    alices = token(target, "wa", "worker", worker="wa", tenant="alice")
    unbound = token(target, "wu", "worker", worker="wu")
    with served(target, "--reap-every", "0") as s, RemoteCoordinator(s.url, alices) as wa, \
            RemoteCoordinator(s.url, unbound) as wu:
        wa.heartbeat("wa", readings={"memory_used_pct": 10})
        for claim in (lambda: wa.claim("wa", tenant="bob", wait=0),
                      lambda: wa.claim_many("wa", 2, tenant="bob", wait=0)):
            with pytest.raises(InvalidInput, match="this token claims tenant 'alice''s jobs"):
                claim()
        with pytest.raises(InvalidInput, match="this token claims every tenant's jobs"):
            wu.claim("wu", tenant="alice", wait=0)
        with Coordinator.open(target) as c:
            assert c.show(job)["job"]["status"] == "waiting"
            tokens.revoke(c.db, "wa")
        with pytest.raises(JobcoordError) as refused:
            wa.claim("wa", tenant="alice", wait=0)
        assert refused.value.code == "unauthorized"
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "waiting"


def test_a_remote_worker_keeps_its_batch_flush_and_json_options(
        target: Target, tmp_path: Any) -> None:
    """`--no-batch` and `--flush-delay` are the remote worker's as the local one's (they were
    dropped), and `--json` gives the same last line."""
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "work", "payload": {"i": i}} for i in range(3)])
    with served(target, "--reap-every", "0") as s:
        proc = start_worker(s.url, secret, str(tmp_path), "t", "--burst", "--wait", "0",
                            "--no-batch", "--flush-delay", "0.2", "--concurrency", "2")
        summary, err = finish(proc, 60)
    started = next(e for e in log_events(err) if e.get("event") == "started")
    assert (started["batch"], started["flush_delay_s"]) == (False, 0.2)
    assert summary["completed"] == 3


def test_a_remote_workers_second_signal_still_prints_one_json_line_and_exits_130(
        target: Target, tmp_path: Any) -> None:
    import signal
    import time

    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("slow", {"sleep": 60})["job_id"]
    with served(target, "--reap-every", "0") as s:
        proc = start_worker(s.url, secret, str(tmp_path), "t", "--grace", "30", "--wait", "1")
        deadline = time.monotonic() + 30
        with Coordinator.open(target) as c:
            while c.show(job)["job"]["status"] != "running":
                assert time.monotonic() < deadline, "never claimed"
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    lines = out.decode().splitlines()
    assert len(lines) == 1, lines
    got = json.loads(lines[0])
    assert got["event"] == "exiting_now" and got["running"] == [job]


def test_a_remote_workers_command_checkpoints_and_marks_its_effect_through_the_server(
        target: Target, tmp_path: Any) -> None:
    """A command under a remote worker reaches the coordinator as docs/worker.md shows
    (`jobcoord checkpoint` / `jobcoord effect` with the JOBCOORD_* variables): the worker
    gives it the server and its token file, never a database (an unrelated JOBCOORD_URL in
    the worker's own environment is not passed on). They failed: no database."""
    import sys

    script = tmp_path / "ck.sh"
    script.write_text(
        "#!/bin/sh\ncat >/dev/null\nset -e\n"
        f"J='{sys.executable} -m jobcoord'\n"
        '$J checkpoint "$JOBCOORD_JOB_ID" --worker "$JOBCOORD_WORKER" '
        '--epoch "$JOBCOORD_EPOCH" --name remote --data \'{"remote_id": "R-17"}\' >&2\n'
        '$J effect "$JOBCOORD_JOB_ID" --worker "$JOBCOORD_WORKER" '
        '--epoch "$JOBCOORD_EPOCH" >&2\n'
        'echo "{\\"url\\": \\"${JOBCOORD_URL:-}\\"}"\n')
    script.chmod(0o755)
    secret = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        job = c.enqueue("ck", {}, max_attempts=1)["job_id"]
    unrelated = tmp_path / "unrelated.db"
    path = token_file(tmp_path, "wa.token", secret)
    with served(target, "--reap-every", "0") as s:
        proc = subprocess.Popen(
            [*jobcoord_argv(), "worker", "--server", s.url, "--token-file", path,
             "--exec", f"ck={script}", "--burst", "--wait", "0", "--json",
             "--readings-override", '{"memory_used_pct": 10}'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "JOBCOORD_URL": f"sqlite:///{unrelated}"})
        summary, err = finish(proc, 120)
    assert summary["completed"] == 1, err[-3000:]
    with Coordinator.open(target) as c:
        shown = c.show(job)
    assert shown["job"]["status"] == "succeeded", err[-3000:]
    assert shown["job"]["result"] == {"url": ""}
    assert shown["checkpoints"][0]["name"] == "remote"
    assert shown["checkpoints"][0]["data"] == {"remote_id": "R-17"}
    assert "effect_started" in [e["reason"] for e in shown["events"]]
    assert not unrelated.exists()


def test_checkpoint_and_effect_through_a_server_refuse_what_the_token_is_not(
        target: Target, tmp_path: Any) -> None:
    """--server with a token that is not this worker's: exit 2 naming it, nothing saved; a
    lease the token does not hold: 404 as over HTTP (exit 4)."""
    secret = token(target, "wa", "worker", worker="wa")
    viewer = token(target, "v", "viewer")
    with Coordinator.open(target) as c:
        c.heartbeat("wb", readings={"memory_used_pct": 10})
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("wb")["lease"]["epoch"]
    files = {name: token_file(tmp_path, f"{name}.token", value)
             for name, value in (("wa", secret), ("v", viewer))}
    with served(target, "--reap-every", "0") as s:
        def run(token_path: str, *args: str) -> tuple[int, dict[str, Any]]:
            got = subprocess.run(
                [*jobcoord_argv(), "checkpoint", str(job), "--epoch", str(epoch),
                 "--name", "n", "--json", "--server", s.url, "--token-file", token_path,
                 *args], capture_output=True, timeout=60, check=False)
            return got.returncode, json.loads(got.stdout.decode().splitlines()[-1])
        code, out = run(files["v"], "--worker", "wa")
        assert code == 2 and "worker token" in out["error"]["message"], out
        code, out = run(files["wa"], "--worker", "wb")
        assert code == 2 and "'wb'" in out["error"]["message"], out
        code, out = run(files["wa"], "--worker", "wa")
        assert code == 4 and out["error"]["code"] == "job_not_found", out
        code, out = run(files["wa"], "--worker", "wa", "--epoch", "x")
        assert code == 2, out
        # --data is checked as the core checks a local checkpoint's, before it is sent.
        for data in ('{"a": NaN}', '{"a": 1e999}', '{"a": 1, "a": 2}', "[", "[" * 100 + "]" * 100):
            code, out = run(files["wa"], "--worker", "wa", "--data", data)
            assert code == 2 and out["error"]["code"] in (
                "invalid_input", "checkpoint_too_large"), (data[:20], out)
    with Coordinator.open(target) as c:
        assert c.show(job)["checkpoints"] == []


@pytest.mark.parametrize("suffix, needle", [
    ("?x=1", "query"), ("#top", "query"), ("/v1", "base address"), ("/v1/", "base address"),
    (":99999", "not a valid URL"), ("", "token"), ("HTTP://[::1", "not a valid URL"),
    ("X:0", "(0)")])
def test_a_server_url_that_cannot_be_the_servers_base_is_exit_2(
        tmp_path: Any, suffix: str, needle: str) -> None:
    """`--server` with a query crashed the worker (exit 1, TypeError), and one ending in /v1
    was exit 4 with only "Not Found": each is exit 2 naming what is wrong, before any call.
    (The last case, a good URL, checks the token next.)"""
    path = tmp_path / "token"
    path.write_text("jct_x y\n")
    for argv in (["checkpoint", "1", "--worker", "w", "--epoch", "1", "--name", "n"],
                 ["worker", "--exec", "k=true"]):
        url = suffix if suffix.startswith("HTTP") else f"http://127.0.0.1:9{suffix}"
        url = "http://127.0.0.1:0" if suffix == "X:0" else url
        got = subprocess.run([*jobcoord_argv(), *argv, "--server", url,
                              "--token-file", str(path), "--json"],
                             capture_output=True, timeout=30, check=False)
        assert got.returncode == 2, got.stderr.decode()[-2000:]
        message = json.loads(got.stdout.decode().splitlines()[-1])["error"]["message"]
        assert needle in message, message


def test_a_token_file_fifo_nobody_writes_to_is_refused_not_a_hang(tmp_path: Any) -> None:
    fifo = str(tmp_path / "token")
    os.mkfifo(fifo)
    for argv in (["checkpoint", "1", "--worker", "w", "--epoch", "1", "--name", "n"],
                 ["worker", "--exec", "k=true"]):
        got = subprocess.run([*jobcoord_argv(), *argv, "--server", "http://127.0.0.1:9",
                              "--token-file", fifo, "--json"],
                             capture_output=True, timeout=30, check=False)
        assert got.returncode == 2, got.stderr.decode()[-2000:]
        assert "token" in json.loads(got.stdout.decode().splitlines()[-1])["error"]["message"]


@pytest.mark.parametrize("written", [b"", b"jct_part"], ids=["silent", "part"])
def test_a_token_file_fifo_whose_writer_stays_open_is_refused_not_a_hang(
        tmp_path: Any, written: bytes) -> None:
    """A writer that opened the FIFO and writes nothing, or part of a token, and keeps it
    open: the whole read is bounded (5 s), then exit 2 naming the token file."""
    import time

    fifo = str(tmp_path / "token #1 100%")
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer that stays, as long as the test does
    try:
        os.write(writer, written)
        for argv in (["checkpoint", "1", "--worker", "w", "--epoch", "1", "--name", "n"],
                     ["worker", "--exec", "k=true"]):
            start = time.monotonic()
            got = subprocess.run([*jobcoord_argv(), *argv, "--server", "http://127.0.0.1:9",
                                  "--token-file", fifo, "--json"],
                                 capture_output=True, timeout=60, check=False)
            assert time.monotonic() - start < 15
            assert got.returncode == 2, got.stderr.decode()[-2000:]
            error = json.loads(got.stdout.decode().splitlines()[-1])["error"]
            assert error["code"] == "invalid_input" and fifo in error["message"], error
    finally:
        os.close(writer)


def test_a_database_named_on_the_command_line_wins_over_a_server_in_the_environment(
        target: Target, tmp_path: Any) -> None:
    """JOBCOORD_SERVER / JOBCOORD_TOKEN_FILE left in a shell's environment: `jobcoord --db F
    checkpoint ...` writes to F, as an option always wins over the environment; a token
    file in the environment without a server is not this command's mistake."""
    from tests.serve_procs import db_args

    with Coordinator.open(target) as c:
        c.heartbeat("w", readings={"memory_used_pct": 10})
        job = c.enqueue("k", {})["job_id"]
        epoch = c.claim("w")["lease"]["epoch"]
    base = {**os.environ, "JOBCOORD_TOKEN_FILE": str(tmp_path / "no-such-token")}
    for name, env in (("a", {**base, "JOBCOORD_SERVER": "http://127.0.0.1:9"}), ("b", base)):
        got = subprocess.run(
            [*jobcoord_argv(), *db_args(target), "checkpoint", str(job), "--worker", "w",
             "--epoch", str(epoch), "--name", name, "--json"],
            capture_output=True, timeout=60, check=False, env=env)
        assert got.returncode == 0, got.stdout.decode() + got.stderr.decode()[-2000:]
    with Coordinator.open(target) as c:
        assert [cp["name"] for cp in c.show(job)["checkpoints"]] == ["a", "b"]
