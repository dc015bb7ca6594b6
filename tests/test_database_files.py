"""Database files: a command never creates a missing database; an unusable file (empty, plain
SQLite, text, newer or older schema, damaged) is refused with its code and left as it was; a
missing or read-only directory is storage unavailable."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import flip_root_page_byte, run_cli

REPO = Path(__file__).resolve().parent.parent


def _fs(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mode, p.read_bytes()) for p in sorted(directory.iterdir())
            if p.is_file()}


@pytest.mark.parametrize("command", [["status"], ["jobs"], ["enqueue", "k"], ["check"]])
def test_a_missing_database_is_not_created(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "missing.db"
    r = run_cli(None, "--db", str(path), *command, "--json")
    assert r.code == 8 and r.json["error"]["code"] == "not_migrated"
    assert "jobcoord migrate" in r.json["error"]["message"]
    assert list(tmp_path.iterdir()) == []
    assert "Traceback" not in r.err


def _error_case(tmp_path: Path, name: str, sqlite_template: str) -> tuple[Path, str, int]:
    db = tmp_path / "q.db"
    if name == "empty_file":
        db.write_bytes(b"")
        return db, "not_migrated", 8
    if name == "plain_sqlite":
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE other (x)")
        conn.commit()
        conn.close()
        return db, "not_migrated", 8
    if name == "text_file":
        db.write_text('{"this": "is json, not a database"}' * 100)
        return db, "database_corrupt", 7
    if name in ("newer", "older"):
        db.write_bytes(Path(sqlite_template).read_bytes())
        if name == "newer":
            conn = sqlite3.connect(db)
            conn.execute("UPDATE alembic_version SET version_num = 'c9999'")
            conn.commit()
            conn.close()
            return db, "schema_newer", 8
        return db, "schema_outdated", 8
    if name == "damaged_pages":
        db.write_bytes(Path(sqlite_template).read_bytes())
        data = bytearray(db.read_bytes())
        for page in range(1, len(data) // 4096):
            data[page * 4096:page * 4096 + 100] = os.urandom(100)
        db.write_bytes(bytes(data))
        return db, "database_corrupt", 7
    raise AssertionError(name)


@pytest.mark.parametrize("case", ["empty_file", "plain_sqlite", "text_file", "newer", "older",
                                  "damaged_pages"])
def test_unusable_databases_are_refused_with_their_code_and_left_unchanged(
        tmp_path: Path, sqlite_template: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, code, exit_code = _error_case(tmp_path, case, sqlite_template)
    if case == "older":  # this code expects a revision the database has not reached yet
        import jobcoord.migrate as m

        monkeypatch.setattr(m, "CORE_REVISIONS", (*m.CORE_REVISIONS, "c9999"))
    before = _fs(tmp_path)
    for command in (["status"], ["enqueue", "k"], ["claim", "w1"]):
        r = run_cli(None, "--db", str(db), *command, "--json")
        assert (r.code, r.json["error"]["code"]) == (exit_code, code), (command, r.out, r.err)
        assert "Traceback" not in r.err
    assert _fs(tmp_path) == before


@pytest.mark.parametrize("damage", ["page", "null"])
def test_a_damaged_schema_revision_table_is_corrupt_exit_7_for_every_command(
        tmp_path: Path, sqlite_template: str, damage: str) -> None:
    """A damaged page of alembic_version read back as NULL revisions: check, status and
    restore crashed (exit 1, TypeError), and migrate said the schema was newer, to upgrade
    jobcoord (exit 8). Every command now says the database is corrupt (exit 7) and changes
    nothing."""
    db = tmp_path / "dam aged #?%.db"
    db.write_bytes(Path(sqlite_template).read_bytes())
    if damage == "page":
        flip_root_page_byte(db, "alembic_version", 4)
    else:  # the same as a hand edit: a NULL revision beside the real one
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE v2 AS SELECT * FROM alembic_version")
        con.execute("DROP TABLE alembic_version")
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32))")
        con.execute("INSERT INTO alembic_version SELECT * FROM v2")
        con.execute("INSERT INTO alembic_version VALUES (NULL)")
        con.execute("DROP TABLE v2")
        con.commit()
        con.close()
    before = _fs(tmp_path)
    for command in (["check"], ["status"], ["migrate"], ["enqueue", "k"],
                    ["backup", str(tmp_path / "bk.db")],
                    ["--db", str(tmp_path / "new.db"), "restore", str(db)]):
        args = command if command[0] == "--db" else ["--db", str(db), *command]
        r = run_cli(None, *args, "--json")
        assert r.code == 7, (command, r.out, r.err)
        assert "Traceback" not in r.err and "TypeError" not in r.out, (command, r.out)
        if command[0] != "--db":  # restore checks the backup's artifacts first
            assert r.json["error"]["code"] == "database_corrupt", (command, r.out)
            assert "alembic_version" in r.json["error"]["message"]
    assert _fs(tmp_path) == before


def test_a_missing_directory_or_a_directory_path_is_unavailable(tmp_path: Path) -> None:
    for path, command in ((tmp_path / "no" / "such" / "q.db", "migrate"),
                          (tmp_path / "no" / "such" / "q.db", "status"),
                          (tmp_path, "migrate"), (tmp_path, "status")):
        r = run_cli(None, "--db", str(path), command, "--json")
        assert r.code == 6, (path, r.out)
        assert r.json["error"]["code"] == "database_unavailable"
    assert list(tmp_path.iterdir()) == []


def test_a_device_or_a_pipe_as_the_database_is_unavailable_and_nothing_is_made_beside_it(
        tmp_path: Path) -> None:
    """`--db /dev/null migrate` failed (exit 6) after SQLite had made `/dev/null-journal`
    beside it, world-writable; `status` there said "run `jobcoord migrate`". A database is
    a regular file: anything else is exit 6 `database_unavailable`, nothing made."""
    import stat

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    paths = [pipe]
    if os.geteuid() == 0:  # a device node of our own (/dev/null's numbers), never /dev's
        device = tmp_path / "null device"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        paths.append(device)
    link = tmp_path / "link to the pipe"
    link.symlink_to(pipe)
    paths.append(link)
    before = sorted(p.name for p in tmp_path.iterdir())
    for path in paths:
        for command in ("migrate", "status"):
            r = run_cli(None, "--db", str(path), command, "--json")
            assert r.code == 6, (path, command, r.out)
            assert r.json["error"]["code"] == "database_unavailable", r.json
            assert "not a regular file" in r.json["error"]["message"], r.json
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_database_path_through_a_regular_file_says_so(tmp_path: Path) -> None:
    """`--db afile/x.db` with `afile` a regular file said "directory afile does not exist"
    of a file that does: exit 6 all the same, saying it is not a directory."""
    (tmp_path / "afile").write_text("x")
    r = run_cli(None, "--db", str(tmp_path / "afile" / "x.db"), "migrate", "--json")
    assert r.code == 6, r.out
    error = r.json["error"]
    assert error["code"] == "database_unavailable", error
    assert "is not a directory" in error["message"] and "does not exist" not in error[
        "message"], error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("command", [["migrate"], ["status"], ["check"], ["jobs"],
                                     ["enqueue", "k"], ["backup", "b.db"]])
def test_a_database_path_whose_links_loop_is_unavailable_for_every_command(
        tmp_path: Path, command: list[str]) -> None:
    """A link loop is no missing database ("run jobcoord migrate" sent the operator to a
    migrate that then failed as unavailable): every command says what it is, exit 6."""
    (tmp_path / "loop.db").symlink_to("loop.db")
    r = run_cli(None, "--db", str(tmp_path / "loop.db"), *command, "--json")
    assert (r.code, r.json["error"]["code"]) == (6, "database_unavailable"), (r.out, r.err)
    assert "symbolic link" in r.json["error"]["message"]
    assert "Traceback" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.db"]


def test_migrate_through_a_link_to_a_new_file_creates_it_private(tmp_path: Path) -> None:
    """--db naming a link to a file not yet made: other commands say no database is there
    (naming the link's target); migrate creates the target 0600 as it creates any new
    database (it was made world-readable, by SQLite, with the umask's mode)."""
    import stat

    link = tmp_path / "q.db"
    link.symlink_to("store/real q#1.db")
    (tmp_path / "store").mkdir()
    r = run_cli(None, "--db", str(link), "status", "--json")
    assert (r.code, r.json["error"]["code"]) == (8, "not_migrated"), (r.out, r.err)
    assert "real q#1.db" in r.json["error"]["message"]
    assert list((tmp_path / "store").iterdir()) == []
    r = run_cli(None, "--db", str(link), "migrate", "--json")
    assert r.code == 0, (r.out, r.err)
    real = tmp_path / "store" / "real q#1.db"
    assert stat.S_IMODE(real.stat().st_mode) == 0o600 and link.is_symlink()
    assert run_cli(None, "--db", str(link), "enqueue", "k", "--json").code == 0


def test_migrate_through_a_link_into_a_missing_directory_is_unavailable(tmp_path: Path
                                                                          ) -> None:
    (tmp_path / "q.db").symlink_to("nowhere/q.db")
    for command in ("migrate", "status"):
        r = run_cli(None, "--db", str(tmp_path / "q.db"), command, "--json")
        assert (r.code, r.json["error"]["code"]) == (6, "database_unavailable"), (r.out, r.err)
        assert "does not exist" in r.json["error"]["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.db"]


def test_migrate_into_a_read_only_directory_is_refused_as_an_unprivileged_user(
        tmp_path: Path) -> None:
    """Root ignores permissions, so the check runs as `nobody`."""
    python = "/usr/bin/python3"
    if not os.path.exists(python) or subprocess.run(["which", "setpriv"],
                                                    capture_output=True).returncode:
        pytest.skip("needs setpriv and a system python3 readable by nobody")
    import tempfile

    # Every parent must be traversable by nobody (pytest's own temp root is not).
    base = Path(tempfile.mkdtemp(prefix="jobcoord-ro-"))
    os.chmod(base, 0o755)
    directory = base / "ro"
    directory.mkdir()
    os.chmod(directory, 0o755)  # owned by root: nobody may not create files here
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {"PYTHONPATH": f"{REPO}:{site}", "PATH": "/usr/bin:/bin"}
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            python, "-c", "import jobcoord.cli, sqlalchemy"],
                           env=env, capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"nobody cannot import jobcoord here: {probe.stderr.strip()[-200:]}")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python,
                        "-m", "jobcoord", "--db", str(directory / "q.db"), "migrate", "--json"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert '"database_readonly"' in r.stdout
    assert "Traceback" not in r.stderr
    assert list(directory.iterdir()) == []
    import shutil

    shutil.rmtree(base)


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_database_file_replaced_or_removed_under_an_open_coordinator_is_refused(
        tmp_path: Path, sqlite_template: str, how: str) -> None:
    """Its kept connections went on reading and writing the old file, deleted now: a
    worker claimed and completed jobs nobody could ever read (every other process saw the
    new file), with no error. Now its next transaction, read or write, is refused as
    `database_replaced` (exit 7, which stops a worker's loop), and the file at the path
    is left as it is."""
    import shutil

    from jobcoord.errors import DatabaseCorrupt
    from jobcoord.runtime import is_fatal
    from jobcoord.service import Coordinator
    from tests.conftest import fresh_sqlite

    target = fresh_sqlite(sqlite_template, str(tmp_path), "q #1 ?x=%20.db")
    path = str(target.sqlite_path)
    with Coordinator.open(target) as coord:
        coord.enqueue("k", {})
        if how == "replaced":
            other = str(tmp_path / "other.db")
            shutil.copy(sqlite_template, other)
            os.replace(other, path)
        else:
            os.remove(path)
        before = _fs(tmp_path)
        for call in (lambda: coord.enqueue("k", {}), lambda: coord.jobs(),
                     lambda: coord.claim("w1")):
            with pytest.raises(DatabaseCorrupt) as e:
                call()
            assert e.value.code == "database_replaced" and path in e.value.message
            assert is_fatal(e.value) and e.value.exit_code == 7
        assert _fs(tmp_path) == before  # nothing written, wherever


@pytest.mark.parametrize("noticed_by", ["a request", "the reaper"])
def test_serve_whose_database_file_is_replaced_stops_exit_7(
        tmp_path: Path, sqlite_template: str, noticed_by: str) -> None:
    """`jobcoord serve` whose file was replaced answered 503 `database_replaced` to every
    request for as long as it ran (it can never reach the new file through its kept
    connections), its reaper logged the same error at each turn, and SIGTERM ended it exit
    0, so a service manager never restarted it. It stops now, exit 7 as a worker does, on
    the first request or reaper turn that finds the file replaced."""
    import shutil

    from tests.conftest import fresh_sqlite
    from tests.serve_procs import Served, token

    target = fresh_sqlite(sqlite_template, str(tmp_path), "q #1 ?x=%20.db")
    path = str(target.sqlite_path)
    secret = token(target, "sub", "submitter", tenant="t")
    extra = ("--reap-every", "0") if noticed_by == "a request" else ("--reap-every", "0.2")
    s = Served(target, *extra).start()
    try:
        with s.client(secret) as http:
            assert http.post("/v1/jobs", json={"kind": "k", "payload": {}}).status_code == 201
            other = str(tmp_path / "other.db")
            shutil.copy(sqlite_template, other)
            os.replace(other, path)
            if noticed_by == "a request":
                r = http.get("/v1/jobs")
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "database_replaced"
        assert s.proc is not None
        code = s.proc.wait(30)
        assert s.proc.stdout is not None and s.proc.stderr is not None
        err = s.proc.stderr.read().decode()
        assert code == 7, err
        assert "was replaced by another file" in err
        events = [json.loads(line) for line in s.proc.stdout.read().decode().splitlines()]
        assert {"event": "stopping", "code": "database_replaced"}.items() <= events[-3].items()
        assert events[-2] == {"event": "stopped"}
        assert events[-1]["error"]["code"] == "database_replaced"
    finally:
        s.stop()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 601, True, "soon", None])
def test_a_busy_timeout_that_is_no_number_of_seconds_is_refused(
        tmp_path: Path, sqlite_template: str, value: object) -> None:
    """`--busy-timeout nan` was taken (the range check compares false with NaN) and
    `Coordinator.open(busy_timeout=...)` checked nothing: NaN, infinity and -1 each waited
    some small, unsaid time for a locked database. Refused now, exit 2 / InvalidInput."""
    from jobcoord.errors import InvalidInput
    from jobcoord.service import Coordinator
    from tests.conftest import fresh_sqlite

    target = fresh_sqlite(sqlite_template, str(tmp_path), "q.db")
    with pytest.raises(InvalidInput) as e:
        Coordinator.open(target, busy_timeout=value)  # type: ignore[arg-type]
    assert "busy_timeout" in e.value.message
    if isinstance(value, float | int) and not isinstance(value, bool):
        r = run_cli(None, "--db", str(target.sqlite_path), "--busy-timeout", str(value),
                    "status")
        assert r.code == 2, r
