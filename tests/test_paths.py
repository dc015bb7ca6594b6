"""Paths are data: every command that takes a file path works on exactly that file, whatever
characters its name holds (spaces, `#`, `?`, `%`, non-ASCII, a leading `-`). SQLite opens
files through `file:` URIs, where `#`, `?` and `%` mean something; an unquoted path once made
`backup 'b#1.db'` check a new empty file `b` instead of the copy, and report it fine."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from jobcoord.maintenance import _check_copy
from tests.conftest import run_cli

NAMES = ["a b.db", "b#1.db", "c?mode=rwc.db", "d%20e.db", "ünï€ 名.db", "-x.db"]


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


@pytest.mark.parametrize("name", NAMES)
def test_every_command_that_takes_a_path_uses_exactly_that_file(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"./{name}"  # relative, so a leading '-' reaches the command as typed

    def jc(*args: str, on: str = db) -> dict:
        r = run_cli(None, "--db", on, *args, "--json")
        assert r.code == 0, (args, r.code, r.out, r.err)
        assert "Traceback" not in r.err
        return r.json

    assert jc("migrate")["quick_check"] == ["ok"]
    assert _files(tmp_path) <= {name, name + "-wal", name + "-shm"}
    job = jc("enqueue", "embed", "--payload", '{"n": 1}')["job_id"]
    assert jc("status")["jobs"]["waiting"] == 1
    assert jc("check")["ok"] is True
    backup = f"./backup {name}"
    made = jc("backup", backup)
    assert made["ok"] is True and made["quick_check"] == ["ok"]
    assert os.path.basename(made["backup"]) == f"backup {name}"
    # The copy that was checked is the copy that was written: a real database with the job.
    conn = sqlite3.connect(tmp_path / f"backup {name}")
    assert conn.execute("SELECT job_id FROM jobs").fetchall() == [(job,)]
    conn.close()
    restored = f"./restored {name}"
    assert jc("restore", backup, on=restored)["jobs"] == {"waiting": 1}
    assert jc("status", on=restored)["jobs"]["waiting"] == 1
    # Nothing else was created: no file named after a truncated path, no temporary left.
    stray = _files(tmp_path) - {n + s for n in (name, f"backup {name}", f"restored {name}")
                                for s in ("", "-wal", "-shm")}
    assert stray == set()
    assert oct(os.stat(tmp_path / f"backup {name}").st_mode & 0o777) == "0o600"


def test_a_copy_that_cannot_be_opened_is_storage_not_corrupt(tmp_path: Path) -> None:
    from jobcoord.errors import StorageUnavailable

    with pytest.raises(StorageUnavailable):
        _check_copy(str(tmp_path / "no such dir" / "b#1.db"))
    assert _files(tmp_path) == set()


@pytest.mark.parametrize("args", [
    ("--db", "u\udcff.db", "migrate"),
    ("--db", "u\udcff.db", "status"),
    ("--db", "ok.db", "backup", "bk\udcff.db"),
    ("--db", "r\udcff.db", "restore", "ok.db"),
    ("--db", "r.db", "restore", "bk\udcff.db"),
], ids=["migrate", "status", "backup-dest", "restore-target", "restore-source"])
def test_a_database_path_that_is_not_utf8_is_invalid_input_exit_2(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    """A byte that is not UTF-8 in a database's path (a name made on a Latin-1 system) was
    an internal error (exit 1, UnicodeEncodeError) in migrate, status, backup and restore:
    the path goes into a database URL. It is refused, nothing made."""
    import json
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "jobcoord", "--db", "ok.db", "migrate"],
                   cwd=tmp_path, check=True, capture_output=True)
    if "bk\udcff.db" in args and args[2] == "restore":
        os.link(tmp_path / "ok.db", os.fsencode(str(tmp_path)) + b"/bk\xff.db")
    before = sorted(os.listdir(os.fsencode(str(tmp_path))))
    got = subprocess.run([sys.executable, "-m", "jobcoord", *[os.fsencode(a) for a in args],
                          "--json"], cwd=tmp_path, capture_output=True, text=True)
    assert got.returncode == 2, (got.returncode, got.stdout, got.stderr)
    error = json.loads(got.stdout)["error"]
    assert error["code"] == "invalid_input" and "UTF-8" in error["message"], error
    assert sorted(os.listdir(os.fsencode(str(tmp_path)))) == before


def test_the_python_api_refuses_a_database_path_with_a_lone_surrogate(tmp_path: Path) -> None:
    from jobcoord.errors import InvalidInput
    from jobcoord.service import Coordinator

    with pytest.raises(InvalidInput):
        Coordinator.open(str(tmp_path / "\ud800.db"), migrate=True)
    assert os.listdir(tmp_path) == []
