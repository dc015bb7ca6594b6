"""Storage faults made for real: a full filesystem, a file-size limit, read-only files and
directories. Each ends in exit 6 with the documented code and no traceback, and leaves the
database intact."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcoord.db import Target
from jobcoord.errors import StorageUnavailable
from jobcoord.service import Coordinator
from tests.invariants import assert_invariants

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
BIG = json.dumps({"blob": "x" * 200_000})


@pytest.fixture
def big_payload(tmp_path: Path) -> str:
    """A 200 kB payload in a file (too long for one command-line argument)."""
    path = tmp_path / "big.json"
    path.write_text(BIG)
    return str(path)


def jobcoord(db: str, *args: str, prefix: list[str] | None = None,
             preexec: object = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "jobcoord", "--db", db,
                           *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          preexec_fn=preexec)  # type: ignore[arg-type]


def error_of(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    return str(json.loads(res.stdout)["error"]["code"])


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def job_ids(path: str) -> set[int]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT job_id FROM jobs")}
    finally:
        conn.close()


# --- a full disk ------------------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[str]:
    mount_dir = tempfile.mkdtemp(prefix="jobcoord-full-")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount_dir],
                         capture_output=True, text=True)
    if res.returncode != 0:
        os.rmdir(mount_dir)
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}): "
                    "the disk-full case needs CAP_SYS_ADMIN")
    try:
        yield mount_dir
    finally:
        subprocess.run(["umount", "-l", mount_dir], check=False)
        os.rmdir(mount_dir)


def fill_with_ballast(directory: str) -> str:
    """Take every free byte of the filesystem, the way other programs fill a disk."""
    ballast = os.path.join(directory, "ballast")
    with open(ballast, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return ballast


def test_full_disk_gives_database_full_and_keeps_every_earlier_job(sqlite_template: str,
                                                                   big_payload: str) -> None:
    with small_tmpfs("2m") as mount_dir:
        path = os.path.join(mount_dir, "jobcoord.db")
        shutil.copy(sqlite_template, path)
        # A resident process keeps the database open (as running workers do), so its -wal
        # and -shm files exist when the disk fills up.
        with Coordinator.open(path) as c:
            accepted = {c.enqueue("small", {"i": i})["job_id"] for i in range(20)}
            ballast = fill_with_ballast(mount_dir)
            with pytest.raises(StorageUnavailable) as exc:
                for _ in range(20):  # the first may still fit in WAL space already there
                    c.enqueue("big", json.loads(BIG))
            assert exc.value.code == "database_full"
            res = jobcoord(path, "enqueue", "big", "--payload-file", big_payload, "--json")
            assert res.returncode == 6, res.stdout + res.stderr
            assert error_of(res) == "database_full"
            assert accepted <= job_ids(path)
            check = jobcoord(path, "check", "--full", "--json")
            assert check.returncode == 0, check.stdout + check.stderr
            # What the operator does: free space on the disk, then retry.
            os.unlink(ballast)
            retry = jobcoord(path, "enqueue", "big", "--payload-file", big_payload, "--json")
            assert retry.returncode == 0, retry.stdout + retry.stderr
            accepted.add(json.loads(retry.stdout)["job_id"])
        assert_invariants(path)
        # Nobody has it open now: the next command must first create its -shm file.
        ballast = fill_with_ballast(mount_dir)
        res = jobcoord(path, "enqueue", "small", "--json")
        assert res.returncode == 6, res.stdout + res.stderr
        assert error_of(res) == "database_full"
        os.unlink(ballast)
        assert accepted <= job_ids(path)
        assert jobcoord(path, "check", "--full").returncode == 0
        assert_invariants(path)


# --- a file-size limit ------------------------------------------------------------------


def test_file_size_limit_gives_database_io_error(sqlite_target: Target, big_payload: str
                                                 ) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    with Coordinator.open(path) as c:
        job_id = c.enqueue("small", {})["job_id"]
    before = digest(path)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    res = jobcoord(path, "enqueue", "big", "--payload-file", big_payload, "--json", preexec=limit)
    assert res.returncode == 6, res.stdout + res.stderr
    assert error_of(res) == "database_io_error"
    assert digest(path) == before
    assert job_ids(path) == {job_id}
    assert jobcoord(path, "check", "--full").returncode == 0
    assert_invariants(path)


# --- read-only ----------------------------------------------------------------------------


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A directory outside the private test tree, so an unprivileged user can reach it."""
    d = tempfile.mkdtemp(prefix="jobcoord-ro-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def _nobody_can_run_jobcoord() -> str | None:
    res = subprocess.run([*NOBODY, sys.executable, "-c", "import jobcoord.cli"], cwd=REPO,
                         capture_output=True, text=True)
    if res.returncode != 0:
        return f"the interpreter is not usable by an unprivileged user: {res.stderr[-200:]}"
    return None


@pytest.mark.parametrize("directory_writable", [False, True])
def test_read_only_database_gives_database_readonly_and_changes_nothing(
        sqlite_template: str, shared_dir: str, directory_writable: bool) -> None:
    """Root ignores file modes, so the command runs as an unprivileged user."""
    reason = _nobody_can_run_jobcoord()
    if reason:
        pytest.skip(reason)
    path = os.path.join(shared_dir, "jobcoord.db")
    shutil.copy(sqlite_template, path)
    with Coordinator.open(path) as c:
        c.enqueue("small", {})
    os.chmod(path, 0o644)  # readable by others, writable by its owner (root) only
    if directory_writable:
        os.chmod(shared_dir, 0o1777)  # others may create the -wal and -shm files
    before = digest(path)
    for args in (["enqueue", "small", "--json"], ["heartbeat", "w1", "--json"]):
        res = jobcoord(path, *args, prefix=NOBODY)
        assert res.returncode == 6, (args, res.stdout, res.stderr)
        assert error_of(res) == "database_readonly"
        assert "read-only" in res.stderr
    assert digest(path) == before
    assert_invariants(path)
