"""Artifacts over HTTP against a real `jobcoord serve`, on SQLite and PostgreSQL: a worker
uploads the files of its live attempt (streamed, the digest it names verified by the server),
readers of the job's tenant download accepted ones, verified before the first byte. Bad
uploads change nothing: no row, no stored object."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobcoord.coordinator import FEATURE_LOOK_S
from jobcoord.db import Target
from jobcoord.errors import StorageUnavailable
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.serve_procs import (
    DroppingProxy,
    Served,
    as_connection_opens,
    db_args,
    jobcoord_argv,
    served,
    terminated,
    token,
    token_file,
    wait_for,
)
from tests.test_artifacts_rules import install, slow_validator_policy

BYTES = b"# report\n" + bytes(range(256)) * 64


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Setup:
    def __init__(self, target: Target, store: str):
        install(target)
        self.target = target
        self.store = store
        self.env = {"JOBCOORD_ARTIFACTS": store}
        self.worker = token(target, "wa", "worker", tenant="alice", worker="wa")
        self.viewer = token(target, "va", "viewer", tenant="alice")
        self.bob = token(target, "vb", "viewer", tenant="bob")
        self.c = Coordinator.open(target)
        self.c.artifacts_dir = store
        self.c.heartbeat("wa", readings={"memory_used_pct": 5})
        self.c.heartbeat("wb", readings={"memory_used_pct": 5})

    def leased(self, worker: str = "wa", tenant: str = "alice", lease_s: float = 300
               ) -> tuple[int, int]:
        job = self.c.enqueue("report", {}, tenant=tenant)["job_id"]
        got = self.c.claim(worker, lease_s=lease_s, tenant=tenant)
        assert got["job"]["job_id"] == job
        return job, got["lease"]["epoch"]

    def objects(self) -> list[str]:
        """Every file in the store but its lock and its records of the databases using
        it: objects, and temporary files of uploads."""
        return sorted(os.path.join(d, f) for d, _, files in os.walk(self.store)
                      for f in files if f != "gc.lock"
                      and os.path.basename(d) != "databases")

    def rows(self, job: int) -> list[dict[str, Any]]:
        return list(self.c.artifacts(job, all_states=True)["artifacts"])


@pytest.fixture
def s(target: Target, tmp_path: Path) -> Iterator[Setup]:
    setup = Setup(target, str(tmp_path / "store dir #?%"))
    yield setup
    setup.c.close()


def report_worker(url: str, token_path: str, *flags: str) -> list[str]:
    """`jobcoord worker` against the server at `url`, running examples/report_cmd.py (it
    writes report.md to its artifacts directory) for kind `report`."""
    return [*jobcoord_argv(), "worker", "--server", url, "--token-file", token_path,
            "--exec", f"report={sys.executable} examples/report_cmd.py",
            "--readings-override", '{"memory_used_pct": 10}', *flags]


def worker_env() -> dict[str, str]:
    """This environment without the artifact store: a remote worker has none of its own."""
    return {k: v for k, v in os.environ.items() if k != "JOBCOORD_ARTIFACTS"}


def put(http: httpx.Client, job: int, name: str, data: Any, epoch: int, **headers: str
        ) -> httpx.Response:
    return http.put(f"/v1/jobs/{job}/artifacts/{name}", params={"epoch": epoch},
                    content=data, headers=headers)


def test_an_upload_is_staged_linked_by_the_completion_and_downloaded_verified(
        s: Setup) -> None:
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env=s.env) as srv, \
            srv.client(s.worker) as w, srv.client(s.viewer) as viewer, \
            srv.client(s.bob) as bob:
        got = put(w, job, "report%20v1.md", BYTES, epoch, **{"X-Content-Digest": digest(BYTES)})
        assert got.status_code == 200, got.text
        staged = got.json()
        assert staged["name"] == "report v1.md" and staged["state"] == "staged"
        assert staged["digest"] == digest(BYTES) and staged["size"] == len(BYTES)
        assert staged["media_type"] == "text/markdown"
        # Not downloadable before its attempt's completion is accepted.
        assert viewer.get(f"/v1/jobs/{job}/artifacts/report%20v1.md").status_code == 404
        assert w.post(f"/v1/jobs/{job}/complete", json={"epoch": epoch}).status_code == 200
        listed = viewer.get(f"/v1/jobs/{job}/artifacts").json()["artifacts"]
        assert [a["name"] for a in listed] == ["report v1.md"]
        down = viewer.get(f"/v1/jobs/{job}/artifacts/report%20v1.md")
        assert down.status_code == 200 and down.content == BYTES
        assert down.headers["X-Content-Digest"] == digest(BYTES)
        # A worker's bytes: downloaded, never sniffed or run as a page of this server.
        assert down.headers["content-disposition"].startswith("attachment")
        assert down.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in down.headers["content-security-policy"]
        # Another tenant's reader: exactly as if the job were not there; a worker: by role.
        other = bob.get(f"/v1/jobs/{job}/artifacts/report%20v1.md")
        assert other.status_code == 404 and other.json()["error"]["code"] == "job_not_found"
        assert bob.get(f"/v1/jobs/{job}/artifacts").status_code == 404
        assert w.get(f"/v1/jobs/{job}/artifacts/report%20v1.md").status_code == 403
    assert [a["state"] for a in s.rows(job)] == ["accepted"]


def test_an_upload_whose_bytes_do_not_match_its_digest_is_422_and_stores_nothing(
        s: Setup) -> None:
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w:
        got = put(w, job, "a.bin", BYTES, epoch, **{"X-Content-Digest": digest(b"other")})
        assert got.status_code == 422, got.text
        assert got.json()["error"]["code"] == "artifact_invalid"
        # The query parameter is the same expectation.
        got = w.put(f"/v1/jobs/{job}/artifacts/a.bin",
                    params={"epoch": epoch, "digest": digest(b"other")}, content=BYTES)
        assert got.status_code == 422
        # Streamed in chunks (no Content-Length): hashed as it arrives, refused all the same.
        got = put(w, job, "a.bin", iter([BYTES[:100], BYTES[100:]]), epoch,
                  **{"X-Content-Digest": digest(b"other")})
        assert got.status_code == 422
    assert s.rows(job) == [] and s.objects() == []


def test_an_upload_into_a_store_gone_while_its_objects_are_named_is_400_and_makes_none(
        s: Setup) -> None:
    """The server's store moved away once rows named its objects: an upload made a new,
    empty one in its place. It is refused, 400 `artifact_store_missing`, no store made."""
    job, epoch = s.leased()
    s.c.put_artifact(job, "wa", epoch, "first.md", BYTES, tenant="alice")
    later, later_epoch = s.leased()
    os.rename(s.store, s.store + ".moved")
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w:
        got = put(w, later, "second.md", b"second", later_epoch,
                  **{"X-Content-Digest": digest(b"second")})
        assert got.status_code == 400, got.text
        assert got.json()["error"]["code"] == "artifact_store_missing", got.text
    assert not os.path.lexists(s.store)
    assert [a["name"] for a in s.rows(later)] == []


def test_a_completion_refused_by_its_artifacts_checks_is_409_the_attempt_failed(
        s: Setup) -> None:
    """A completion whose staged artifact no longer hashes to its digest is a rule's
    refusal (409, as the CLI's exit 4), not an upload's digest mismatch (422): the attempt
    failed, reason `artifact_invalid`, and the job waits for its next attempt."""
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w:
        assert put(w, job, "a.bin", BYTES, epoch,
                   **{"X-Content-Digest": digest(BYTES)}).status_code == 200
        [path] = s.objects()
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:
            f.write(b"X")  # same size, other bytes
        got = w.post(f"/v1/jobs/{job}/complete", json={"epoch": epoch})
        assert got.status_code == 409, got.text
        assert got.json()["error"]["code"] == "artifact_invalid"
    shown = s.c.show(job)
    assert shown["job"]["status"] == "waiting"
    assert shown["events"][-1]["reason"] == "artifact_invalid"


@pytest.mark.parametrize("name", ["%2E%2E", "..%2Fescape", "a%2Fb", "x%00y", "%2E",
                                  "a%5Cb", "%7F", "a%FFb", "%C0%AE%C0%AE", "a%0Ab", "%0D%0A"])
def test_artifact_names_are_refused_like_the_clis_put(s: Setup, name: str) -> None:
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w:
        got = put(w, job, name, BYTES, epoch, **{"X-Content-Digest": digest(BYTES)})
        assert got.status_code == 400, got.text
        assert got.json()["error"]["code"] == "invalid_artifact_name"
    assert s.rows(job) == [] and s.objects() == []


def test_an_upload_without_a_valid_digest_or_epoch_is_400(s: Setup) -> None:
    """Among them: an epoch in the query that is no plain ASCII digits (`1.0`, ` 1`, `+1`,
    `1_0` were read as numbers), and the digest header sent twice (the first was taken)."""
    job, epoch = s.leased()
    good = {"X-Content-Digest": digest(BYTES)}
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w:
        cases: list[tuple[dict[str, Any], Any]] = [
            ({"epoch": epoch}, {}),
            ({"epoch": epoch}, {"X-Content-Digest": "md5:abc"}),
            ({"epoch": epoch, "digest": digest(b"x")}, good),
            ({}, good),
            ({"epoch": "one"}, good),
            *(({"epoch": bad}, good) for bad in (f"{epoch}.0", f" {epoch}", f"+{epoch}",
                                                 f"{epoch}_0", f"{epoch}e0")),
            ({"epoch": epoch}, [("X-Content-Digest", digest(BYTES)),
                                ("X-Content-Digest", digest(b"other"))]),
            ({"epoch": epoch}, [("X-Content-Digest", digest(BYTES)),
                                ("X-Content-Digest", digest(BYTES))]),
        ]
        for params, headers in cases:
            got = w.put(f"/v1/jobs/{job}/artifacts/a.bin", params=params, content=BYTES,
                        headers=headers)
            assert got.status_code == 400, (params, headers, got.text)
            assert "error" in got.json()
    assert s.rows(job) == [] and s.objects() == []


def test_an_upload_over_the_servers_limit_is_413_and_stores_nothing(s: Setup) -> None:
    job, epoch = s.leased()
    big = b"x" * 5000
    with served(s.target, "--reap-every", "0", "--max-artifact-bytes", "4096",
                env=s.env) as srv, srv.client(s.worker) as w:
        declared = put(w, job, "big.bin", big, epoch, **{"X-Content-Digest": digest(big)})
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "artifact_too_large"
        # Chunked, so only the bytes counted as they arrive can tell.
        streamed = put(w, job, "big.bin", iter([big[:3000], big[3000:]]), epoch,
                       **{"X-Content-Digest": digest(big)})
        assert streamed.status_code == 413, streamed.text
        # The JSON body limit does not apply to artifacts: a body over it but under the
        # upload limit is fine.
        small = b"y" * 4096
        assert put(w, job, "ok.bin", small, epoch,
                   **{"X-Content-Digest": digest(small)}).status_code == 200
    assert [a["name"] for a in s.rows(job)] == ["ok.bin"]
    assert len(s.objects()) == 1


def test_an_upload_needs_this_tokens_live_lease_and_epoch(s: Setup) -> None:
    mine, epoch = s.leased()
    others, other_epoch = s.leased("wb", "alice")
    bobs, bob_epoch = s.leased("wa", "bob")  # this worker id, another tenant's job
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w, \
            srv.client(s.viewer) as viewer:
        h = {"X-Content-Digest": digest(BYTES)}
        for job, e in ((others, other_epoch), (bobs, bob_epoch), (mine + 1000, 1)):
            data = f"refused {job}".encode()  # content of its own: would be an object
            got = put(w, job, "a.bin", data, e, **{"X-Content-Digest": digest(data)})
            assert got.status_code == 404, got.text
            assert got.json() == {"error": {"code": "job_not_found", "message":
                                            f"job {job} not found", "details": {"job_id": job}}}
        # An epoch of its own job that it never claimed: as if absent too.
        stale = put(w, mine, "a.bin", b"stale", epoch + 1,
                    **{"X-Content-Digest": digest(b"stale")})
        assert stale.status_code == 404 and stale.json()["error"]["code"] == "job_not_found"
        assert put(w, mine, "a.bin", BYTES, epoch, **h).status_code == 200
        assert put(viewer, mine, "a.bin", BYTES, epoch, **h).status_code == 403
    # Refused before a byte was read: the one object is the accepted upload's.
    assert s.rows(others) == s.rows(bobs) == []
    assert len(s.objects()) == 1


def test_a_corrupted_object_is_never_served(s: Setup) -> None:
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env=s.env) as srv, srv.client(s.worker) as w, \
            srv.client(s.viewer) as viewer:
        assert put(w, job, "a.bin", BYTES, epoch,
                   **{"X-Content-Digest": digest(BYTES)}).status_code == 200
        assert w.post(f"/v1/jobs/{job}/complete", json={"epoch": epoch}).status_code == 200
        [path] = s.objects()
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:
            f.write(b"X")  # same size, other bytes
        got = viewer.get(f"/v1/jobs/{job}/artifacts/a.bin")
        assert got.status_code == 503, got.text
        assert got.json()["error"]["code"] == "artifact_corrupt"
        assert BYTES[1:50] not in got.content


def test_a_remote_worker_uploads_what_its_command_left_in_artifacts_out(
        s: Setup, tmp_path: Path) -> None:
    job = s.c.enqueue("report", {"title": "Remote"}, tenant="alice")["job_id"]
    path = token_file(tmp_path, "worker token", s.worker)
    with served(s.target, "--reap-every", "0", env=s.env) as srv:
        done = subprocess.run(
            [*jobcoord_argv(), "worker", "--server", srv.url, "--token-file", path,
             "--exec", f"report={sys.executable} examples/report_cmd.py",
             "--readings-override", '{"memory_used_pct": 10}', "--burst", "--json"],
            capture_output=True, timeout=60, check=False,
            env={k: v for k, v in os.environ.items() if k != "JOBCOORD_ARTIFACTS"})
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    [a] = s.c.artifacts(job)["artifacts"]
    assert a["name"] == "report.md" and a["state"] == "accepted"
    out = tmp_path / "out.md"
    s.c.get_artifact(job, "report.md", out)
    assert out.read_text().startswith("# Remote")


def test_without_the_artifacts_feature_uploads_are_refused_and_nothing_is_listed(
        target: Target) -> None:
    secret = token(target, "wa", "worker", tenant="alice", worker="wa")
    reader = token(target, "op", "operator", tenant="alice")
    with Coordinator.open(target) as c:
        assert "artifacts" not in c.features
        c.heartbeat("wa", readings={"memory_used_pct": 5})
        job = c.enqueue("report", {}, tenant="alice")["job_id"]
        epoch = c.claim("wa", tenant="alice")["lease"]["epoch"]
    with served(target, "--reap-every", "0") as srv, srv.client(secret) as w, \
            srv.client(reader) as op:
        got = put(w, job, "a.bin", BYTES, epoch, **{"X-Content-Digest": digest(BYTES)})
        assert got.status_code == 409 and got.json()["error"]["code"] == "feature_missing"
        assert op.get(f"/v1/jobs/{job}/artifacts").json() == {"artifacts": []}
        assert op.get(f"/v1/jobs/{job}/artifacts/a.bin").status_code == 404
        assert op.get(f"/v1/jobs/{job + 99}/artifacts").status_code == 404


def test_a_remote_commands_files_without_artifact_storage_fail_the_attempt_at_once(
        target: Target, tmp_path: Path) -> None:
    """The server answers a command's upload `feature_missing` (no artifact storage in its
    database): the job stayed leased until its lease ran out, each attempt the same until
    it was dead. The attempt fails for good at once, saying what heals it."""
    path = token_file(tmp_path, "worker token",
                      token(target, "wa", "worker", tenant="alice", worker="wa"))
    with Coordinator.open(target) as c:
        job = c.enqueue("report", {"title": "Nowhere"}, tenant="alice",
                        max_attempts=3)["job_id"]
        with served(target, "--reap-every", "0") as srv:
            done = subprocess.run(
                [*jobcoord_argv(), "worker", "--server", srv.url, "--token-file", path,
                 "--exec", f"report={sys.executable} examples/report_cmd.py",
                 "--lease", "60", "--burst", "--wait", "0",
                 "--readings-override", '{"memory_used_pct": 10}', "--json"],
                capture_output=True, timeout=90, check=False)
            assert done.returncode == 0, done.stderr.decode()[-2000:]
        shown = c.show(job)["job"]
    assert shown["status"] == "dead" and shown["attempts"] == 1, shown
    assert "migrate --with artifacts" in shown["last_error"], shown["last_error"]


def test_artifacts_installed_while_the_server_runs_are_taken_without_a_restart(
        target: Target, tmp_path: Path) -> None:
    """`migrate --with artifacts` beside a running server: its next upload is taken (it
    answered feature_missing, telling the operator to run the migrate just run, until a
    restart); so does a Coordinator opened before it."""
    secret = token(target, "wa", "worker", tenant="alice", worker="wa")
    env = {"JOBCOORD_ARTIFACTS": str(tmp_path / "store")}
    with Coordinator.open(target) as c:
        c.artifacts_dir = env["JOBCOORD_ARTIFACTS"]
        c.heartbeat("wa", readings={"memory_used_pct": 5})
        job = c.enqueue("report", {}, tenant="alice")["job_id"]
        epoch = c.claim("wa", tenant="alice")["lease"]["epoch"]
        with served(target, "--reap-every", "0", env=env) as srv, srv.client(secret) as w:
            got = put(w, job, "a.bin", BYTES, epoch, **{"X-Content-Digest": digest(BYTES)})
            assert got.status_code == 409 and got.json()["error"]["code"] == "feature_missing"
            install(target)
            # Taken at the server's next look for the feature (FEATURE_LOOK_S after the miss).
            deadline = time.monotonic() + FEATURE_LOOK_S + 5
            while True:
                got = put(w, job, "a.bin", BYTES, epoch,
                          **{"X-Content-Digest": digest(BYTES)})
                if got.status_code != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert got.status_code == 200, got.text
        staged = c.put_artifact(job, "wa", epoch, "b.bin", BYTES, tenant="alice")
        assert staged["state"] == "staged"


def test_artifacts_removed_or_added_beside_a_running_server_never_make_it_answer_500(
        target: Target, tmp_path: Path) -> None:
    """`migrate --without artifacts` beside a running server: /metrics, every job page and
    the artifact routes answered 500 until a restart (the server still took the tables to
    be there), and no `internal_error` said so. Now a call that meets the change is 503
    `schema_changed` at most, the server reads the features again, and the next call is
    answered as on a database without them. And `migrate --with artifacts` beside it shows
    in its /metrics too (its artifact metrics never came)."""
    from tests.conftest import run_cli

    install(target)
    op = token(target, "op", "operator")
    with Coordinator.open(target) as c:
        job = c.enqueue("report", {})["job_id"]
    srv = Served(target, "--reap-every", "0",
                 env={"JOBCOORD_ARTIFACTS": str(tmp_path / "st")}).start()
    assert srv.proc is not None
    with contextlib.ExitStack() as stack:
        stack.callback(srv.stop)
        http = stack.enter_context(srv.client(op))
        assert "jobcoord_artifacts" in http.get("/metrics").text
        assert run_cli(target, "migrate", "--without", "artifacts").code == 0

        def settled(path: str) -> httpx.Response:
            deadline = time.monotonic() + FEATURE_LOOK_S + 5
            while True:
                got = http.get(path)
                assert got.status_code in (200, 503), (path, got.status_code, got.text)
                if got.status_code == 200 or time.monotonic() > deadline:
                    return got
                assert got.json()["error"]["code"] == "schema_changed", got.text
                time.sleep(0.1)

        for path in ("/metrics", f"/v1/jobs/{job}/artifacts", f"/v1/jobs/{job}"):
            assert settled(path).status_code == 200, path
        assert "jobcoord_artifacts" not in http.get("/metrics").text
        assert http.get(f"/v1/jobs/{job}/artifacts").json() == {"artifacts": []}
        assert run_cli(target, "migrate", "--with", "artifacts").code == 0
        deadline = time.monotonic() + FEATURE_LOOK_S + 5
        while "jobcoord_artifacts" not in (text := settled("/metrics").text):
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.2)
        srv.signal(signal.SIGTERM)
        out, err = srv.proc.communicate(timeout=30)
    assert b"internal_error" not in out + err, (out + err).decode()[-3000:]


def test_a_remote_completions_artifact_checks_longer_than_lease_and_timeout_succeed(
        s: Setup, tmp_path: Path) -> None:
    """The server checks an attempt's uploaded artifacts (re-hash, the kind's validator)
    before it answers the completion. A validator longer than the lease let the server's
    reaper take the job back (refused `lease_expired`, run again until dead); one longer
    than the client's 10 s timeout was sent again (checked again) and then reported as an
    error. The server keeps the lease while it checks, and the worker waits for them."""
    policy = slow_validator_policy(tmp_path, 12)
    job = s.c.enqueue("report", {"title": "Checked slowly"}, tenant="alice")["job_id"]
    path = token_file(tmp_path, "worker token", s.worker)
    env = {**s.env, "JOBCOORD_POLICY": str(policy)}
    with served(s.target, "--reap-every", "0.5", env=env) as srv:
        done = subprocess.run(
            report_worker(srv.url, path, "--lease", "3", "--burst", "--wait", "0", "--json",
                          "--log-format", "json"),
            capture_output=True, timeout=90, check=False, env=worker_env())
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    events = [json.loads(line)["event"] for line in done.stderr.decode().splitlines()
              if line.startswith("{")]
    assert "report_retry" not in events and "report_error" not in events, events
    summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert summary["completed"] == 1 and summary["lost"] == 0, summary
    shown = s.c.show(job)
    assert shown["job"]["status"] == "succeeded" and shown["job"]["attempts"] == 1, shown["job"]
    assert [a["state"] for a in s.rows(job)] == ["accepted"]


def test_a_remote_commands_file_over_the_upload_limit_fails_the_attempt_for_good(
        s: Setup, tmp_path: Path) -> None:
    """The server refuses a command's file over --max-artifact-bytes (413): the same
    command leaves it again, so the attempt fails permanently (it was retried, uploading
    up to the limit each time), the error naming the file."""
    job = s.c.enqueue("big", {}, tenant="alice", max_attempts=3)["job_id"]
    cmd = tmp_path / "big.py"
    cmd.write_text("import os, pathlib\n"
                   "out = pathlib.Path(os.environ['JOBCOORD_ARTIFACTS_OUT'])\n"
                   "(out / 'huge.bin').write_bytes(b'x' * 5000)\nprint('{}')\n")
    path = token_file(tmp_path, "worker token", s.worker)
    with served(s.target, "--reap-every", "0", "--max-artifact-bytes", "1000",
                env=s.env) as srv:
        done = subprocess.run(
            [*jobcoord_argv(), "worker", "--server", srv.url, "--token-file", path,
             "--exec", f"big={sys.executable} {cmd}", "--burst", "--wait", "0",
             "--readings-override", '{"memory_used_pct": 10}', "--json"],
            capture_output=True, timeout=90, check=False)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    shown = s.c.show(job)["job"]
    assert shown["status"] == "dead" and shown["attempts"] == 1, shown
    assert "huge.bin" in shown["last_error"] and "jobcoord-w" not in shown["last_error"], shown


def test_a_re_sent_report_never_turns_an_accepted_result_with_artifacts_into_a_failure(
        s: Setup, tmp_path: Path) -> None:
    job = s.c.enqueue("report", {"title": "Lost answer"}, tenant="alice")["job_id"]
    path = token_file(tmp_path, "worker token", s.worker)
    # The server commits the completion and its answer is lost on the way (a network cut):
    # the worker's report is sent again.
    with served(s.target, "--reap-every", "0", env=s.env) as srv:
        proxy = DroppingProxy(srv.port, b"/complete")
        try:
            done = subprocess.run(
                [*jobcoord_argv(), "worker", "--server", f"http://127.0.0.1:{proxy.port}",
                 "--token-file", path,
                 "--exec", f"report={sys.executable} examples/report_cmd.py", "--lease", "120",
                 "--readings-override", '{"memory_used_pct": 10}', "--burst", "--wait", "0",
                 "--json", "--log-format", "json"],
                capture_output=True, timeout=90, check=False,
                env={k: v for k, v in os.environ.items() if k != "JOBCOORD_ARTIFACTS"})
        finally:
            proxy.close()
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    logged = [json.loads(line) for line in done.stderr.decode().splitlines()
              if line.startswith("{")]
    events = [e["event"] for e in logged]
    assert proxy.dropped == 1 and proxy.seen >= 2, (proxy.dropped, proxy.seen)  # sent again
    assert "report_refused" not in events, logged
    summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert summary["completed"] == 1 and summary["lost"] == 0, summary
    shown = s.c.show(job)
    assert shown["job"]["status"] == "succeeded"
    assert shown["job"]["result"] == {"title": "Lost answer"}
    reasons = [e["reason"] for e in shown["events"]]
    assert reasons.count("completed") == 1 and "artifact_refused" not in reasons, reasons
    [a] = s.c.artifacts(job)["artifacts"]
    assert a["name"] == "report.md" and a["state"] == "accepted"


DRAW_APP = '''
from jobcoord.app import App

app = App()


@app.handler("draw", timeout=60)
def draw(payload, ctx):
    ctx.artifact("chart.png", b"\\x89PNG\\r\\n\\x1a\\n")
    ctx.artifact("layout.data", b"{}", media_type="application/vnd.example.layout+json")
    return {"drawn": True}
'''

RENDER_CMD = '''
import json, os, sys
sys.stdin.read()
with open(os.path.join(os.environ["JOBCOORD_ARTIFACTS_OUT"], "report.pdf"), "wb") as f:
    f.write(b"%PDF-1.4\\n%%EOF\\n")
print(json.dumps({"pages": 1}))
'''


def test_a_remote_worker_stages_artifacts_with_the_media_types_a_local_worker_would(
        s: Setup, tmp_path: Path) -> None:
    # Only the media types a local worker gives these artifacts are allowed: a command's file
    # (guessed from its name), a handler's guessed one and a handler's declared one.
    policy = tmp_path / "policy.toml"
    policy.write_text('[artifacts.kinds.render]\nmedia_types = ["application/pdf"]\n'
                      '[artifacts.kinds.draw]\nmedia_types = ["image/png", '
                      '"application/vnd.example.layout+json"]\n')
    code = tmp_path / "code"
    code.mkdir()
    (code / "drawapp.py").write_text(DRAW_APP)
    (code / "render_cmd.py").write_text(RENDER_CMD)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JOBCOORD_ARTIFACTS", "JOBCOORD_POLICY")}
    env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    handlers = ["--app", "drawapp:app",
                "--exec", f"render={sys.executable} {code / 'render_cmd.py'}",
                "--readings-override", '{"memory_used_pct": 10}', "--burst", "--json"]

    def jobs() -> dict[str, int]:
        return {kind: s.c.enqueue(kind, {}, tenant="alice", max_attempts=1)["job_id"]
                for kind in ("render", "draw")}

    local = jobs()
    done = subprocess.run(
        [*jobcoord_argv(), *db_args(s.target), "--policy", str(policy), "worker",
         "--worker-id", "wl", *handlers],
        capture_output=True, timeout=60, check=False, env={**env, **s.env})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    remote = jobs()
    path = token_file(tmp_path, "worker token", s.worker)
    with served(s.target, "--reap-every", "0",
                env={**s.env, "JOBCOORD_POLICY": str(policy)}) as srv, \
            srv.client(s.viewer) as viewer:
        done = subprocess.run(
            [*jobcoord_argv(), "worker", "--server", srv.url, "--token-file", path,
             *handlers], capture_output=True, timeout=60, check=False, env=env)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        stored = {}
        for where, ids in (("local", local), ("remote", remote)):
            for kind, job in ids.items():
                shown = s.c.show(job)["job"]
                assert shown["status"] == "succeeded", (where, shown["last_error"])
                found = s.c.artifacts(job)["artifacts"]
                stored[where, kind] = {a["name"]: a["media_type"] for a in found}
                for a in found:
                    down = viewer.get(f"/v1/jobs/{job}/artifacts/{a['name']}")
                    assert down.status_code == 200, down.text
                    assert down.headers["content-type"].split(";")[0] == a["media_type"]
    assert stored["local", "render"] == {"report.pdf": "application/pdf"}
    assert stored["local", "draw"] == {
        "chart.png": "image/png", "layout.data": "application/vnd.example.layout+json"}
    assert stored["remote", "render"] == stored["local", "render"]
    assert stored["remote", "draw"] == stored["local", "draw"]


def _stalled_upload(url: str, secret: str, job: int, epoch: int, name: str) -> Any:
    """A socket that began an upload of 1 MB and then sends nothing."""
    import socket

    host, port = url.rsplit("//", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"PUT /v1/jobs/{job}/artifacts/{name}?epoch={epoch} HTTP/1.1\r\n"
                 f"Host: x\r\nAuthorization: Bearer {secret}\r\n"
                 f"X-Content-Digest: sha256:{'0' * 64}\r\nContent-Length: 1000000\r\n\r\nx"
                 .encode())
    return sock


def _accepted_big(s: Setup, size: int) -> tuple[int, bytes]:
    """A job of tenant alice with an accepted artifact `big.bin` of `size` random bytes."""
    data = os.urandom(size)
    job, epoch = s.leased()
    s.c.put_artifact(job, "wa", epoch, "big.bin", data, tenant="alice")
    s.c.complete(job, "wa", epoch, tenant="alice")
    return job, data


def _stalled_download(url: str, secret: str, job: int) -> Any:
    """A socket that asked for the job's `big.bin` and then reads nothing (a 4 KiB window)."""
    import socket

    host, port = url.rsplit("//", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET /v1/jobs/{job}/artifacts/big.bin HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {secret}\r\n\r\n".encode())
    return sock


def _whole_answer(sock: Any) -> str:
    """The server's answer on `sock`: its head and its Content-Length of body."""
    sock.settimeout(15)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_stalled_uploads_take_no_thread_from_database_calls(s: Setup) -> None:
    """Uploads that stop sending (more of them than the server has database threads) hold
    no thread a claim, a renewal or a health check needs: any worker token could otherwise
    stop the server for every tenant. Each stalled upload is refused once it has sent nothing
    for --upload-idle seconds, and leaves nothing in the store."""
    import time

    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", "--threads", "2", "--upload-idle", "3",
                env=s.env) as srv, srv.client(s.worker) as http:
        socks = [_stalled_upload(srv.url, s.worker, job, epoch, f"f{i}") for i in range(4)]
        try:
            time.sleep(0.5)
            t0 = time.monotonic()
            assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200
            assert http.post(f"/v1/jobs/{job}/renew", json={"epoch": epoch},
                             timeout=10).status_code == 200
            assert time.monotonic() - t0 < 2.0
            answers = [_whole_answer(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
    # Two (the worker's --threads uploads in flight) stall until refused; the others are
    # refused at once, server_busy.
    refused = sorted((a.split("\r\n", 1)[0], "upload_incomplete" in a, "server_busy" in a)
                     for a in answers)
    assert refused == [("HTTP/1.1 400 Bad Request", True, False)] * 2 + [
        ("HTTP/1.1 503 Service Unavailable", False, True)] * 2, answers
    assert s.objects() == [] and s.rows(job) == []


def test_a_completion_sent_again_after_the_server_was_unreachable_still_waits_for_its_checks(
        s: Setup, tmp_path: Path) -> None:
    """A remote client waits for the server's artifact checks (longer than a call's
    timeout) on a completion of an attempt it uploaded for, but only on the first send:
    sent again after the server could not be reached (a restart), it timed out while the
    server checked (and was sent again, each try checking everything again). It waits on
    every send until the completion is answered."""
    policy = slow_validator_policy(tmp_path, 3)
    env = {**s.env, "JOBCOORD_POLICY": str(policy)}
    job, epoch = s.leased()
    first = Served(s.target, "--reap-every", "0", env=env).start()
    try:
        with RemoteCoordinator(first.url, s.worker, timeout=1.0, retry_s=1.0) as r:
            r.put_artifact(job, "wa", epoch, "a.bin", BYTES)
            first.stop()
            with pytest.raises(StorageUnavailable):
                r.complete(job, "wa", epoch, {"n": 1})
            again = Served(s.target, "--reap-every", "0", env=env, port=first.port).start()
            try:
                got = r.complete(job, "wa", epoch, {"n": 1})
            finally:
                again.stop()
    finally:
        first.stop()
    assert got["status"] == "succeeded", got
    assert [a["state"] for a in s.rows(job)] == ["accepted"]


def test_a_server_stopped_during_a_completions_checks_exits_in_its_grace_deciding_nothing(
        s: Setup, tmp_path: Path) -> None:
    """SIGTERM while a completion's validator ran: the server said `stopped` and closed its
    port, then ran every such check to its end (minutes each) before it exited, with a
    traceback, and their work was lost. The checks end undecided within the stop's grace
    (503 `server_stopping`: the completion is sent again), the validator's group is
    stopped, and the completion sent again to the next server is accepted."""
    from tests.test_worker import gone

    pids = tmp_path / "validator pids"
    checker = tmp_path / "slow check.py"
    checker.write_text(f"import os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')"
                       "\ntime.sleep(120)\n")
    policy = tmp_path / "policy.toml"
    policy.write_text("[artifacts.kinds.report]\nvalidator = "
                      f"[{json.dumps(sys.executable)}, {json.dumps(str(checker))}]\n")
    job, epoch = s.leased()
    srv = Served(s.target, "--reap-every", "0",
                 env={**s.env, "JOBCOORD_POLICY": str(policy)}).start()
    try:
        with srv.client(s.worker) as w:
            got = put(w, job, "a.bin", BYTES, epoch, **{"X-Content-Digest": digest(BYTES)})
            assert got.status_code == 200, got.text
            answers: list[httpx.Response] = []
            sending = threading.Thread(target=lambda: answers.append(w.post(
                f"/v1/jobs/{job}/complete", json={"epoch": epoch, "result": {}}, timeout=60)))
            sending.start()
            wait_for(lambda: pids.exists() and pids.read_text().strip())
            t0 = time.monotonic()
            srv.signal(signal.SIGTERM)
            assert srv.proc is not None and srv.proc.stderr is not None
            code = srv.proc.wait(60)
            took = time.monotonic() - t0
            stderr = srv.proc.stderr.read().decode()
            sending.join(30)
    finally:
        srv.stop()
    assert code == 0 and took < 8, (code, took)
    assert "Traceback" not in stderr, stderr[-3000:]
    [answer] = answers
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "server_stopping"
    [pid] = [int(p) for p in pids.read_text().split()]
    assert wait_for(lambda: gone(pid), 5)
    assert s.c.show(job)["job"]["status"] == "running"
    assert [a["state"] for a in s.rows(job)] == ["staged"]
    with served(s.target, "--reap-every", "0", env=s.env) as again, \
            again.client(s.worker) as w:
        got = w.post(f"/v1/jobs/{job}/complete", json={"epoch": epoch, "result": {}})
        assert got.status_code == 200, got.text
    assert [a["state"] for a in s.rows(job)] == ["accepted"]


@pytest.mark.parametrize("staged", ["here", "before_a_restart"])
@pytest.mark.parametrize("route", ["complete", "completions"])
def test_a_completions_artifact_checks_take_no_thread_from_database_calls(
        s: Setup, tmp_path: Path, route: str, staged: str) -> None:
    """A completion re-hashes its staged artifacts and runs its kind's validator before its
    transaction. On the server's database threads, a slow one (a large file, a slow
    validator) held back every other call: with --threads 1 another worker's renewal
    waited for it, and with large artifacts leases were lost. They run on the transfer
    threads, also when the upload went through the server before it restarted (it only
    remembered its own uploads)."""
    policy = slow_validator_policy(tmp_path, 4)
    other = token(s.target, "wb", "worker", tenant="alice", worker="wb")
    job, epoch = s.leased()
    other_job, other_epoch = s.leased("wb")
    env = {**s.env, "JOBCOORD_POLICY": str(policy)}
    if staged == "before_a_restart":
        with served(s.target, "--reap-every", "0", env=env) as srv, \
                srv.client(s.worker) as w:
            got = put(w, job, "a.bin", BYTES, epoch, **{"X-Content-Digest": digest(BYTES)})
            assert got.status_code == 200, got.text
    with served(s.target, "--reap-every", "0", "--threads", "1", env=env) as srv, \
            srv.client(s.worker) as w, srv.client(other) as wb:
        if staged == "here":
            got = put(w, job, "a.bin", BYTES, epoch,
                      **{"X-Content-Digest": digest(BYTES)})
            assert got.status_code == 200, got.text
        done: list[httpx.Response] = []
        if route == "complete":
            sent = lambda: done.append(w.post(f"/v1/jobs/{job}/complete",  # noqa: E731
                                              json={"epoch": epoch, "result": {}},
                                              timeout=30))
        else:
            sent = lambda: done.append(w.post("/v1/completions", json={  # noqa: E731
                "items": [{"job_id": job, "epoch": epoch, "result": {}}]}, timeout=30))
        completing = threading.Thread(target=sent)
        completing.start()
        time.sleep(1.0)  # the validator is running
        t0 = time.monotonic()
        renewed = wb.post(f"/v1/jobs/{other_job}/renew", json={"epoch": other_epoch},
                          timeout=30)
        waited = time.monotonic() - t0
        completing.join(30)
        assert renewed.status_code == 200, renewed.text
        assert waited < 1.5, f"the renewal waited {waited:.1f} s for the validator"
        [answer] = done
        assert answer.status_code == 200, answer.text
    assert s.c.show(job)["job"]["status"] == "succeeded"
    assert [a["state"] for a in s.rows(job)] == ["accepted"]


@pytest.mark.parametrize("lease_s", [300, 3])
def test_more_completions_checking_artifacts_than_transfer_threads_wait_for_one(
        s: Setup, tmp_path: Path, lease_s: float) -> None:
    """Five completions whose validator runs 4 s, against the four transfer threads of a
    `--threads 1` server: the fifth ran on the database thread, and another worker's
    renewal waited for its validator (503 `server_busy`, then its lease was lost). It waits
    for a transfer thread instead; every one is accepted. Its lease is kept while it waits
    (one of 3 s ran out in the queue, and the completion was refused `lease_expired`)."""
    policy = slow_validator_policy(tmp_path, 4)
    workers = []
    for i in range(6):
        name = f"w{i}"
        secret = token(s.target, name, "worker", tenant="alice", worker=name)
        s.c.heartbeat(name, readings={"memory_used_pct": 5})
        workers.append((secret, *s.leased(worker=name, lease_s=lease_s if i < 5 else 300)))
    env = {**s.env, "JOBCOORD_POLICY": str(policy)}
    with served(s.target, "--reap-every", "0", "--threads", "1", env=env) as srv:
        clients = [srv.client(secret) for secret, _, _ in workers]
        try:
            for http, (_, job, epoch) in zip(clients[:5], workers[:5], strict=True):
                got = put(http, job, "a.bin", BYTES, epoch,
                          **{"X-Content-Digest": digest(BYTES)})
                assert got.status_code == 200, got.text
            answers: list[httpx.Response] = []
            sending = [threading.Thread(target=lambda h=http, j=job, e=epoch: answers.append(
                h.post(f"/v1/jobs/{j}/complete", json={"epoch": e, "result": {}},
                       timeout=60))) for http, (_, job, epoch) in zip(clients[:5], workers[:5],
                                                                       strict=True)]
            for thread in sending:
                thread.start()
            time.sleep(1.0)  # five validators asked for, four running
            _, other_job, other_epoch = workers[5]
            t0 = time.monotonic()
            renewed = clients[5].post(f"/v1/jobs/{other_job}/renew",
                                      json={"epoch": other_epoch}, timeout=30)
            waited = time.monotonic() - t0
            for thread in sending:
                thread.join(60)
        finally:
            for http in clients:
                http.close()
    assert renewed.status_code == 200 and waited < 1.5, (renewed.text, waited)
    assert sorted(a.status_code for a in answers) == [200] * 5, [a.text for a in answers]


def test_a_stalled_upload_is_answered_503_when_the_server_stops(s: Setup) -> None:
    """SIGTERM with an upload waiting for bytes: it is refused at once (503
    `server_stopping`, to be sent again), nothing stored, no traceback; it was cut after the
    grace with a plain-text 500 and a traceback."""
    import signal
    import time

    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env=s.env) as srv:
        sock = _stalled_upload(srv.url, s.worker, job, epoch, "f")
        try:
            time.sleep(0.5)
            t0 = time.monotonic()
            srv.signal(signal.SIGTERM)
            answer = _whole_answer(sock)
            took = time.monotonic() - t0
        finally:
            sock.close()
        assert srv.proc is not None
        _out, err = srv.proc.communicate(timeout=30)
        assert srv.proc.returncode == 0
    assert answer.startswith("HTTP/1.1 503") and "server_stopping" in answer, answer
    assert took < 2.0, took
    assert b"Traceback" not in err, err.decode()[-3000:]
    assert s.objects() == [] and s.rows(job) == []


def test_downloads_stalled_by_their_readers_hold_at_most_twice_the_upload_limit(
        s: Setup, tmp_path: Path) -> None:
    """Each download is copied out of the store, verified, and sent from that copy, which
    stays until it is sent: readers that never read held a full copy each (20 of a 64 MiB
    artifact, 1.25 GiB of temporary files). The copies in flight hold at most twice
    --max-artifact-bytes; a download past that is 503 `server_busy` (Retry-After), and any
    one download is always served."""
    import time

    size = 24 << 20
    job, data = _accepted_big(s, size)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**s.env, "TMPDIR": str(temp)}
    with served(s.target, "--reap-every", "0", "--max-artifact-bytes", str(size),
                env=env) as srv:
        socks = []
        try:
            for _ in range(4):
                socks.append(_stalled_download(srv.url, s.viewer, job))
                time.sleep(0.5)
            staged = sum(f.stat().st_size for f in temp.rglob("*") if f.is_file())
            # Each copy in a directory only this user may enter: the bytes are the tenant's.
            assert {oct(d.stat().st_mode & 0o777) for d in temp.iterdir()} == {"0o700"}
            with srv.client(s.viewer) as viewer:
                busy = viewer.get(f"/v1/jobs/{job}/artifacts/big.bin")
            # The dashboard's download is held to the same bound, and says when to retry.
            from tests.test_dashboard_pages import login

            page, _ = login(srv.url, s.viewer)
            try:
                busy_page = page.get(f"/ui/jobs/{job}/artifacts/big.bin")
            finally:
                page.close()
            assert busy_page.status_code == 503 and busy_page.headers["Retry-After"]
        finally:
            for sock in socks:
                sock.close()
        assert staged <= 2 * size, staged
        assert busy.status_code == 503, busy.status_code
        assert busy.json()["error"]["code"] == "server_busy" and busy.headers["Retry-After"]
        # Once the stalled readers are gone, downloads are served again.
        with srv.client(s.viewer) as viewer:
            got = wait_until(lambda: viewer.get(f"/v1/jobs/{job}/artifacts/big.bin"))
        assert got.content == data
    assert list(temp.iterdir()) == []


def test_a_reader_that_reads_nothing_for_the_idle_limit_is_cut_and_its_copy_removed(
        s: Setup, tmp_path: Path) -> None:
    """Two readers that stopped reading held the whole budget of copies in flight until
    they went away, however long: every other reader of a large artifact got 503 meanwhile.
    A download whose reader takes nothing for four times --upload-idle seconds is cut, its
    copy removed and its room given back."""
    import signal
    import time

    size = 8 << 20
    job, data = _accepted_big(s, size)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**s.env, "TMPDIR": str(temp)}
    with served(s.target, "--reap-every", "0", "--max-artifact-bytes", str(size),
                "--upload-idle", "0.5", env=env) as srv:
        socks = []
        try:
            for _ in range(2):
                socks.append(_stalled_download(srv.url, s.viewer, job))
            time.sleep(0.5)
            with srv.client(s.viewer) as viewer:
                assert viewer.get(f"/v1/jobs/{job}/artifacts/big.bin").status_code == 503
                # The idle limit (2 s) passes: both readers are cut, their copies removed.
                deadline = time.monotonic() + 15
                while list(temp.iterdir()) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert list(temp.iterdir()) == []
                got = viewer.get(f"/v1/jobs/{job}/artifacts/big.bin")
            assert got.status_code == 200 and got.content == data
        finally:
            for sock in socks:
                sock.close()
        srv.signal(signal.SIGTERM)
        assert srv.proc is not None
        _out, err = srv.proc.communicate(timeout=30)
    assert b"Traceback" not in err, err.decode()[-3000:]


def wait_until(get: Any, timeout: float = 20.0) -> Any:
    import time

    end = time.monotonic() + timeout
    while True:
        got = get()
        if got.status_code == 200 or time.monotonic() > end:
            return got
        time.sleep(0.2)


def test_a_stop_with_a_stalled_download_leaves_no_copy_and_no_traceback(
        s: Setup, tmp_path: Path) -> None:
    """A reader that stopped reading is cut when the server's stop has waited its grace: its
    verified copy is removed then too (it stayed in the temporary directory for good), and
    the cut is no traceback in the log."""
    import signal
    import time

    job, _ = _accepted_big(s, 16 << 20)
    temp = tmp_path / "temp"
    temp.mkdir()
    with served(s.target, "--reap-every", "0", env={**s.env, "TMPDIR": str(temp)}) as srv:
        sock = _stalled_download(srv.url, s.viewer, job)
        try:
            time.sleep(1.0)
            assert list(temp.iterdir()), "the download was not in flight"
            srv.signal(signal.SIGTERM)
            assert srv.proc is not None
            _out, err = srv.proc.communicate(timeout=30)
        finally:
            sock.close()
        assert srv.proc.returncode == 0
    assert list(temp.iterdir()) == []
    assert b"Traceback" not in err, err.decode()[-3000:]


def test_a_server_killed_mid_download_has_its_copy_removed_by_the_next_start(
        s: Setup, tmp_path: Path) -> None:
    """SIGKILL of the server while a download's verified copy is in flight left the copy
    (up to the artifact's size) in the temporary directory for good. The next server
    removes the copies no live server holds, and only those: not another live server's."""
    import signal
    import time

    # Larger than a socket's send buffer may grow (4 MB by default): the copy outlives
    # the answer's first bytes only while the kernel cannot take the rest.
    job, _ = _accepted_big(s, 16 << 20)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**s.env, "TMPDIR": str(temp)}

    with served(s.target, "--reap-every", "0", env=env) as killed:
        sock = _stalled_download(killed.url, s.viewer, job)
        try:
            time.sleep(1.0)
            [left] = list(temp.iterdir())
            killed.signal(signal.SIGKILL)
            assert killed.proc is not None
            killed.proc.wait(10)
        finally:
            sock.close()
    with served(s.target, "--reap-every", "0", env=env) as live:
        sock = _stalled_download(live.url, s.viewer, job)
        try:
            time.sleep(1.0)
            [held] = list(temp.iterdir())
            assert held != left
            with served(s.target, "--reap-every", "0", env=env):
                assert list(temp.iterdir()) == [held]  # the live server's copy is kept
        finally:
            sock.close()


def test_one_workers_stalled_uploads_cannot_hold_back_another_workers_upload(
        s: Setup) -> None:
    """A worker has at most --threads uploads in flight (a quarter of the transfer threads):
    past that its next upload is 503 `server_busy` at once, and another worker's upload goes
    through however many the first has stalled (it waited behind them, and a remote worker
    lost its lease)."""
    import time

    other = token(s.target, "wb", "worker", tenant="alice", worker="wb")
    job, epoch = s.leased()
    job_b, epoch_b = s.leased(worker="wb")
    with served(s.target, "--reap-every", "0", "--threads", "1", env=s.env) as srv, \
            srv.client(s.worker) as wa, srv.client(other) as wb:
        sock = _stalled_upload(srv.url, s.worker, job, epoch, "stalled")
        try:
            time.sleep(0.5)
            t0 = time.monotonic()
            busy = put(wa, job, "second.bin", BYTES, epoch,
                       **{"X-Content-Digest": digest(BYTES)})
            took = time.monotonic() - t0
            fine = put(wb, job_b, "b.bin", BYTES, epoch_b,
                       **{"X-Content-Digest": digest(BYTES)})
        finally:
            sock.close()
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "server_busy", busy.text
    assert busy.headers["Retry-After"] and took < 2.0, took
    assert fine.status_code == 200, fine.text
    assert [a["name"] for a in s.rows(job_b)] == ["b.bin"] and s.rows(job) == []


def test_with_every_transfer_thread_stalled_uploads_and_downloads_are_503_at_once(
        s: Setup) -> None:
    """Four workers, each within its own cap, stall four uploads: every transfer thread of
    a `--threads 1` server waits for their bytes. Another worker's upload and any download
    waited behind them with no end and no answer; they are 503 `server_busy` at once (the
    client retries), and go through once a thread is free."""
    import time

    secrets, leased = [], []
    for i in range(5):
        name = f"w{i}"
        secrets.append(token(s.target, name, "worker", tenant="alice", worker=name))
        s.c.heartbeat(name, readings={"memory_used_pct": 5})
        leased.append(s.leased(worker=name))
    done_job, done_epoch = s.leased()
    s.c.put_artifact(done_job, "wa", done_epoch, "ready.bin", BYTES, tenant="alice")
    s.c.complete(done_job, "wa", done_epoch, {}, tenant="alice")
    with served(s.target, "--reap-every", "0", "--threads", "1", env=s.env) as srv, \
            srv.client(secrets[4]) as late, srv.client(s.viewer) as viewer:
        socks = [_stalled_upload(srv.url, secrets[i], *leased[i], "stalled")
                 for i in range(4)]
        try:
            time.sleep(0.5)
            t0 = time.monotonic()
            busy = put(late, leased[4][0], "late.bin", BYTES, leased[4][1],
                       **{"X-Content-Digest": digest(BYTES)})
            fetched = viewer.get(f"/v1/jobs/{done_job}/artifacts/ready.bin", timeout=5)
            took = time.monotonic() - t0
        finally:
            for sock in socks:
                sock.close()
        time.sleep(0.5)
        fine = put(late, leased[4][0], "late.bin", BYTES, leased[4][1],
                   **{"X-Content-Digest": digest(BYTES)})
    for answer in (busy, fetched):
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "server_busy" and answer.headers["Retry-After"]
    assert took < 2.0, took
    assert fine.status_code == 200, fine.text


@contextlib.contextmanager
def _stopped_during_checks(s: Setup, tmp_path: Path, job: int, validator_s: float
                           ) -> Iterator[dict[str, Any]]:
    """A server whose `report` validator takes `validator_s`, and a remote worker (`--grace
    1`) sent SIGTERM once `job`'s completion is in its checks; inside, the server still
    runs: how long the worker took to exit after the signal, its exit code, output, and
    when the checks began."""
    policy = slow_validator_policy(tmp_path, validator_s)
    path = token_file(tmp_path, "worker token", s.worker)
    env = {**s.env, "JOBCOORD_POLICY": str(policy)}
    with served(s.target, "--reap-every", "0.5", env=env) as srv:
        worker = subprocess.Popen(
            report_worker(srv.url, path, "--lease", "5", "--grace", "1", "--json"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=worker_env())
        try:
            # The completion is in its checks once its artifact is staged.
            wait_for(lambda: s.rows(job), timeout=30)
        except BaseException:
            worker.kill()
            worker.wait()
            raise
        checks_from = time.monotonic()
        time.sleep(1.0)
        out, err, took = terminated(worker)
        yield {"took": took, "code": worker.returncode, "out": out.decode(),
               "err": err.decode()[-2000:], "checks_from": checks_from}


def test_a_remote_completion_with_artifacts_claims_no_next_job_its_worker_may_never_hear_of(
        s: Setup, tmp_path: Path) -> None:
    """A remote worker stopped while the server checked a completion's artifacts gave up on
    the answer; the completion, sent with `claim_next`, then claimed the next job for a
    worker that had exited: leased to nobody until the reaper took it back, counting the
    attempt (a job of `max_attempts` 1 ended dead, never run). A completion with artifacts
    claims nothing: the worker claims the usual way once it has its answer."""
    first = s.c.enqueue("report", {"title": "Checked slowly"}, tenant="alice")["job_id"]
    second = s.c.enqueue("report", {"title": "Next"}, tenant="alice", max_attempts=1,
                         priority="P3")["job_id"]
    with _stopped_during_checks(s, tmp_path, first, 20):
        wait_for(lambda: s.c.show(first)["job"]["status"] != "running", timeout=60)
        time.sleep(1.0)
        events = s.c.show(second)["events"]
    assert [e["reason"] for e in events if e["reason"] == "claimed"] == [], events
    assert s.c.show(second)["job"]["status"] == "waiting"


@pytest.mark.parametrize("many", [False, True], ids=["complete", "complete_many"])
def test_a_completion_sent_again_after_artifact_changed_waits_for_its_checks(
        s: Setup, tmp_path: Path, many: bool) -> None:
    """`artifact_changed` says: send the completion again. The client forgot, on that
    refusal, that the attempt had uploaded artifacts, and the completion sent again timed
    out during its checks: `server_unreachable` for a result the server then accepted."""
    from jobcoord.errors import Refused

    policy = slow_validator_policy(tmp_path, 3)
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env={**s.env, "JOBCOORD_POLICY": str(policy)}
                ) as srv, RemoteCoordinator(srv.url, s.worker, timeout=1.0, retry_s=1.0) as r:
        r.put_artifact(job, "wa", epoch, "report.md", b"# one\n")
        first: list[Any] = []

        def complete() -> None:
            if many:
                item = {"job_id": job, "worker_id": "wa", "epoch": epoch, "result": {"n": 1}}
                [one] = r.complete_many([item])["results"]
                first.append(one["error"]["code"] if "error" in one else one)
                return
            try:
                first.append(r.complete(job, "wa", epoch, {"n": 1}))
            except Refused as e:
                first.append(e.code)

        t = threading.Thread(target=complete)
        t.start()
        time.sleep(1.0)  # the checks of "# one" run
        r.put_artifact(job, "wa", epoch, "report.md", b"# two\n")
        t.join(30)
        assert first == ["artifact_changed"], first
        if many:
            [again] = r.complete_many([{"job_id": job, "worker_id": "wa", "epoch": epoch,
                                        "result": {"n": 1}}])["results"]
        else:
            again = r.complete(job, "wa", epoch, {"n": 1})
    assert again["status"] == "succeeded", again
    out = tmp_path / "got.md"
    s.c.get_artifact(job, "report.md", out)
    assert out.read_bytes() == b"# two\n"


def test_a_remote_worker_stopped_during_a_completions_checks_exits_in_its_grace_releasing(
        s: Setup, tmp_path: Path) -> None:
    """As a local worker does: a completion still in the server's artifact checks when the
    grace ends is left undecided and its job released (offered again at once); the worker
    sat out the checks past its grace (17 s with `--grace 1`), then left without an answer."""
    job = s.c.enqueue("report", {"title": "Checked slowly"}, tenant="alice")["job_id"]
    with _stopped_during_checks(s, tmp_path, job, 12) as stop:
        assert stop["code"] == 0, stop["err"]
        assert stop["took"] < 6, stop
        events = s.c.show(job)["events"]
        assert events[-1]["reason"] == "worker_shutdown", events
        # The server's checks end later; the completion they were for accepts nothing.
        time.sleep(max(0.0, stop["checks_from"] + 14 - time.monotonic()))
        shown = s.c.show(job)
        assert shown["job"]["status"] == "waiting", shown["events"]
        assert "completed" not in [e["reason"] for e in shown["events"]]
    summary = json.loads(stop["out"].strip().splitlines()[-1])
    assert summary["released"] == 1 and summary["completed"] == 0, summary


def test_stop_checks_cuts_a_completion_whose_connection_was_opening_as_it_ran(
        s: Setup, tmp_path: Path) -> None:
    """`stop_checks` cut the connections already open; a completion that had looked at it
    and was opening a new connection at that moment was not cut: it sat out the server's
    whole checks (20 s here) past the worker's grace, and could be accepted then."""
    policy = slow_validator_policy(tmp_path, 20)
    job, epoch = s.leased()
    with served(s.target, "--reap-every", "0", env={**s.env, "JOBCOORD_POLICY": str(policy)}
                ) as srv, RemoteCoordinator(srv.url, s.worker, retry_s=1.0) as r:
        r.put_artifact(job, "wa", epoch, "report.md", b"# one\n")
        as_connection_opens(r._checked_conns, r.stop_checks)
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailable) as e:
            r.complete(job, "wa", epoch, {"n": 1})
        took = time.monotonic() - t0
    assert e.value.code == "server_stopping", e.value
    assert took < 5, took


def test_a_download_with_a_bad_range_is_sent_whole_and_one_past_the_end_is_a_json_416(
        s: Setup) -> None:
    """A malformed Range (`bytes=abc`, `bytes=3-1`) was a plain-text 400, and one past the
    end a plain-text 416 with no body: not the API's JSON error. A malformed Range is
    ignored as HTTP allows (200, the whole artifact); one past the end is 416
    `range_not_satisfiable` in the JSON shape, with `Content-Range: bytes */SIZE`."""
    job, epoch = s.leased()
    s.c.put_artifact(job, "wa", epoch, "r.bin", BYTES, tenant="alice")
    s.c.complete(job, "wa", epoch, {}, tenant="alice")
    path = f"/v1/jobs/{job}/artifacts/r.bin"
    with served(s.target, "--reap-every", "0", env=s.env) as srv, \
            srv.client(s.viewer) as viewer:
        for bad in ("bytes=abc", "bytes=3-1", "lines=1-2", "bytes=", "bytes=+1-2",
                    "bytes=1_0-20", "bytes = 0-5", "bytes= 0-5", "bytes=0x1-2"):
            got = viewer.get(path, headers={"Range": bad})
            assert got.status_code == 200 and got.content == BYTES, (bad, got.text[:200])
        part = viewer.get(path, headers={"Range": "bytes=2-5"})
        assert part.status_code == 206 and part.content == BYTES[2:6]
        past = viewer.get(path, headers={"Range": f"bytes={len(BYTES)}-"})
        assert past.status_code == 416, past.text
        assert past.json()["error"]["code"] == "range_not_satisfiable"
        assert past.headers["Content-Range"] == f"bytes */{len(BYTES)}"
        # An If-Range that does not match: the Range is ignored (200, whole), past the
        # end or not.
        for wanted in (f"bytes={len(BYTES)}-", "bytes=2-5"):
            got = viewer.get(path, headers={"Range": wanted, "If-Range": '"zzz"'})
            assert got.status_code == 200 and got.content == BYTES, (wanted, got.text[:200])
        # A set with one part past the end: the parts inside are sent (HTTP: a set is
        # satisfiable when any of its ranges is); it was 416.
        some = viewer.get(path, headers={"Range": f"bytes=0-1, {len(BYTES) + 5}-, -0"})
        assert some.status_code == 206 and some.content == BYTES[0:2], some.text[:200]
        huge = viewer.get(path, headers={"Range": "bytes=" + "9" * 5000 + "-"})
        assert huge.status_code == 416
        same = viewer.get(path, headers={"Range": "bytes=2-5", "If-Range": part.headers["ETag"]})
        assert same.status_code == 206 and same.content == BYTES[2:6]
        # Both answers are in the API's description, as a client generated from it expects.
        doc = viewer.get("/openapi.json").json()
        declared = doc["paths"]["/v1/jobs/{job_id}/artifacts/{name}"]["get"]["responses"]
        assert "206" in declared and "416" in declared, sorted(declared)
        assert declared["416"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}


def _revoke(target: Target, name: str) -> None:
    done = subprocess.run([*jobcoord_argv(), *db_args(target), "token", "revoke", name],
                          capture_output=True, check=False)
    assert done.returncode == 0, done.stderr


def test_an_upload_whose_token_is_revoked_while_its_bytes_arrive_is_401_and_records_nothing(
        s: Setup) -> None:
    """The token is read before the first byte; an upload still streaming when it is
    revoked was staged (200, its row and event committed after the revocation). The
    token is judged again in the transaction that records the row: 401, no row, no event
    (the bytes stored meanwhile are an unreferenced object, for gc)."""
    job, epoch = s.leased()
    data = b"x" * 4096
    go_on = threading.Event()

    def body() -> Iterator[bytes]:
        yield data[:100]
        assert go_on.wait(30)
        yield data[100:]

    answer: dict[str, Any] = {}
    events = len(s.c.show(job)["events"])
    with served(s.target, "--reap-every", "0", env=s.env) as srv, \
            srv.client(s.worker) as http:
        sending = threading.Thread(target=lambda: answer.update(r=put(
            http, job, "late.bin", body(), epoch, **{"X-Content-Digest": digest(data)})))
        sending.start()
        time.sleep(1.0)  # the upload is under way: its token was read, its bytes arrive
        _revoke(s.target, "wa")
        go_on.set()
        sending.join(30)
    assert answer["r"].status_code == 401, answer["r"].text
    assert s.rows(job) == []
    assert len(s.c.show(job)["events"]) == events


def test_a_completion_whose_token_is_revoked_while_its_artifacts_are_checked_is_401(
        s: Setup, tmp_path: Path) -> None:
    """A completion of an attempt that uploaded runs its checks (re-hash, the kind's
    validator) before its transaction, on a transfer thread, its token read before them.
    Revoked while they ran, it was accepted (and with `claim_next` leased the revoked
    worker a new job). The token is judged again in the completion's transaction: 401,
    nothing accepted, nothing claimed."""
    # The validator says it began, then waits until the token is revoked: the revocation
    # falls inside the checks however slowly this machine starts the revoking process.
    began, revoked = tmp_path / "began", tmp_path / "revoked"
    checker = tmp_path / "gated check.py"
    checker.write_text(f"import os, time\nopen({str(began)!r}, 'w').close()\n"
                       f"end = time.monotonic() + 60\n"
                       f"while not os.path.exists({str(revoked)!r}) and time.monotonic() < end:"
                       f"\n    time.sleep(0.05)\n")
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[artifacts.kinds.report]\nvalidator = "
                      f"[{json.dumps(sys.executable)}, {json.dumps(str(checker))}]\n")
    env = {**s.env, "JOBCOORD_POLICY": str(policy)}
    job, epoch = s.leased()
    other = s.c.enqueue("report", {}, tenant="alice")["job_id"]
    answer: dict[str, Any] = {}
    with served(s.target, "--reap-every", "0", env=env) as srv, \
            srv.client(s.worker) as http:
        assert put(http, job, "a.bin", BYTES, epoch,
                   **{"X-Content-Digest": digest(BYTES)}).status_code == 200
        sending = threading.Thread(target=lambda: answer.update(r=http.post(
            f"/v1/jobs/{job}/complete", json={"epoch": epoch, "result": {},
                                              "claim_next": True})))
        sending.start()
        wait_for(began.exists, 60)  # the validator runs
        _revoke(s.target, "wa")
        revoked.touch()
        sending.join(60)
    assert answer["r"].status_code == 401, answer["r"].text
    assert s.c.show(job)["job"]["status"] == "running"
    assert s.c.show(other)["job"]["status"] == "waiting"
    assert [a["state"] for a in s.rows(job)] == ["staged"]
