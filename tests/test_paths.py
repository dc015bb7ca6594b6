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
