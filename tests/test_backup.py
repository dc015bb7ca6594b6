"""`backup`: an owner-only, consistent copy taken online under a concurrent writer, on its own
connection; it never overwrites without --force and never destroys the last good backup: the
copy is checked before anything is put in place, so a damaged live database leaves the
destination exactly as it was."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobcoord.db import Target, resolve_target
from jobcoord.errors import InvalidInput
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.conftest import run_cli
from tests.test_restore import populated_backup


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damage_table_pages(path: str, table: str) -> None:
    """Overwrite the root page of one table with noise: the schema (and alembic_version)
    still read, so the coordinator opens, but quick_check of any page-for-page copy fails."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)
                        ).fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size + 8)
        f.write(os.urandom(page_size - 8))


def test_backup_force_from_a_damaged_database_keeps_the_last_good_backup(
        sqlite_target: Target, tmp_path: Path) -> None:
    dest = populated_backup(sqlite_target, tmp_path / "nightly.db")
    before = digest(dest)
    damage_table_pages(sqlite_target.sqlite_path or "", "job_events")
    r = run_cli(sqlite_target, "backup", str(dest), "--force", "--json")
    assert r.code == 7, (r.out, r.err)
    assert r.json["error"]["code"] == "database_corrupt"
    assert digest(dest) == before  # the last good backup, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobcoord.db", "nightly.db"]
    new = tmp_path / "restored.db"
    ok = run_cli(resolve_target(db=str(new)), "restore", str(dest), "--json")
    assert ok.code == 0, ok.out + ok.err


# Each damage a whole page-for-page copy carries, which `check` finds and `restore` refuses:
# a backup of it would be a file no restore takes.
_DAMAGE_RESTORE_REFUSES = {
    "trigger_unexpected": ["CREATE TRIGGER evil AFTER INSERT ON jobs BEGIN "
                           "UPDATE jobs SET kind = 'pwned' WHERE job_id = new.job_id; END"],
    "schema_object_missing": ["CREATE TABLE l2 AS SELECT * FROM limits", "DROP TABLE limits",
                              "ALTER TABLE l2 RENAME TO limits"],
    "column_unexpected": ["CREATE TABLE l2 AS SELECT * FROM limits", "DROP TABLE limits",
                          "CREATE TABLE limits (kind TEXT PRIMARY KEY, concurrency INTEGER NOT "
                          "NULL, key_field TEXT, created_at INTEGER NOT NULL, "
                          "updated_at INTEGER NOT NULL, mine TEXT NOT NULL)", "DROP TABLE l2"],
    "job_counts_differ_from_jobs": ["UPDATE job_counts SET n = n + 5"],
    # A job deleted by hand (sqlite3's shell enforces no foreign keys): its events and
    # checkpoint are left pointing at no job. The triggers keep job_counts right.
    "foreign_key_violations": ["DELETE FROM jobs WHERE status = 'succeeded'"],
}


@pytest.mark.parametrize("finding", sorted(_DAMAGE_RESTORE_REFUSES))
def test_backup_writes_only_what_restore_takes_and_force_keeps_the_last_good_backup(
        sqlite_target: Target, tmp_path: Path, finding: str) -> None:
    """A database `check` finds fault with backed up exit 0 (only its pages were checked),
    and `--force` replaced the last good backup with a file `restore` refuses. The copy is
    checked as restore checks it, before it is put in place: exit 7 naming the finding,
    DEST byte for byte as it was, no copy left beside it."""
    dest = populated_backup(sqlite_target, tmp_path / "nightly.db")
    before = digest(dest)
    conn = sqlite3.connect(sqlite_target.sqlite_path or "")
    for statement in _DAMAGE_RESTORE_REFUSES[finding]:
        conn.execute(statement)
    conn.commit()
    conn.close()
    found = run_cli(sqlite_target, "check", "--json")
    assert found.code == 7 and finding in found.out, found
    r = run_cli(sqlite_target, "backup", str(dest), "--force", "--json")
    assert r.code == 7, (r.out, r.err)
    assert r.json["error"]["code"] == "database_corrupt"
    assert finding in r.json["error"]["message"], r.json
    details = r.json["error"]["details"]
    assert (details.get(finding)
            or finding in {v["invariant"] for v in details["violations"]}), details
    assert digest(dest) == before  # the last good backup, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobcoord.db", "nightly.db"]
    r = run_cli(sqlite_target, "backup", str(tmp_path / "other.db"), "--json")
    assert r.code == 7 and not (tmp_path / "other.db").exists(), r
    new = tmp_path / "restored.db"
    ok = run_cli(resolve_target(db=str(new)), "restore", str(dest), "--json")
    assert ok.code == 0, ok.out + ok.err


def test_backup_from_a_damaged_database_leaves_no_damaged_copy_behind(
        sqlite_target: Target, tmp_path: Path) -> None:
    populated_backup(sqlite_target, tmp_path / "first.db")
    damage_table_pages(sqlite_target.sqlite_path or "", "job_events")
    r = run_cli(sqlite_target, "backup", str(tmp_path / "second.db"), "--json")
    assert r.code == 7, (r.out, r.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.db", "jobcoord.db"]


def test_backup_force_refuses_a_destination_with_a_wal_beside_it(sqlite_target: Target,
                                                                  tmp_path: Path) -> None:
    """A database file whose -wal (and -shm) lie beside it, left by a process killed with
    SIGKILL or still open in another: replacing the file alone lets the next open replay the
    old database's log onto the backup's pages (a silent mix of both, or the old database
    back). Refused, exit 2, every file left as it was."""
    with Coordinator.open(sqlite_target) as c:
        c.enqueue("from_source", {})
    dest = tmp_path / "old.db"
    code = (
        "import os, sys\n"
        "from jobcoord.service import Coordinator\n"
        f"c = Coordinator.open({str(dest)!r}, migrate=True)\n"
        "c.enqueue_many([{'kind': 'old_bulk', 'payload': {'i': i}} for i in range(200)])\n"
        "os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    wal = Path(f"{dest}-wal")
    assert wal.exists()
    before = {p.name: digest(p) for p in tmp_path.iterdir()}
    r = run_cli(sqlite_target, "backup", str(dest), "--force", "--json")
    assert r.code == 2, (r.out, r.err)
    assert r.json["error"]["code"] == "destination_not_standalone", r.json
    assert f"{dest}-wal" in r.json["error"]["message"]
    assert {p.name: digest(p) for p in tmp_path.iterdir()} == before
    with Coordinator.open(str(dest)) as old:  # still the old database, whole
        assert old.status()["jobs"]["waiting"] == 200, old.status()


def test_backup_refuses_to_overwrite_without_force(sqlite_target: Target, tmp_path: Path
                                                   ) -> None:
    dest = tmp_path / "backup.db"
    dest.write_bytes(b"precious")
    r = run_cli(sqlite_target, "backup", str(dest), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "destination_exists"
    assert dest.read_bytes() == b"precious"
    r = run_cli(sqlite_target, "backup", str(dest), "--force", "--json")
    assert r.code == 0, r.err
    assert r.json["quick_check"] == ["ok"]
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600


def test_backup_under_a_concurrent_writer_is_a_consistent_copy(sqlite_target: Target,
                                                               tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from jobcoord.service import Coordinator\n"
        "c = Coordinator.open(sys.argv[1])\n"
        "deadline = time.monotonic() + 20\n"
        "while time.monotonic() < deadline:\n"
        "    c.enqueue('k', {'pad': 'x' * 500})\n"
    ), path], stdout=subprocess.DEVNULL)
    try:
        c = Coordinator.open(sqlite_target)
        while c.status()["jobs"]["waiting"] < 200:  # the writer is well under way
            time.sleep(0.05)
        copies = []
        for i in range(3):
            dest = tmp_path / f"b{i}.db"
            r = run_cli(sqlite_target, "backup", str(dest), "--json")
            assert r.code == 0, r.err
            copies.append(dest)
        assert writer.poll() is None  # still writing while every backup was taken
    finally:
        writer.terminate()
        writer.wait(30)
    for dest in copies:
        conn = sqlite3.connect(dest)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()
        copy_target = resolve_target(db=str(dest))
        assert check(Coordinator.open(copy_target).db, full=True)["ok"]
    c.close()


def test_backup_and_writer_threads_share_no_connection(sqlite_target: Target,
                                                       tmp_path: Path) -> None:
    """The backup reads on its own connection: a write transaction held open elsewhere in the
    process neither blocks it nor leaks into the copy."""
    c = Coordinator.open(sqlite_target)
    c.enqueue("k", {"committed": True})
    held = threading.Event()
    release = threading.Event()

    def hold_open_write() -> None:
        with c.db.write_engine.connect() as conn:
            tx = conn.begin()
            conn.exec_driver_sql("INSERT INTO workers (worker_id, created_at) VALUES ('x', 1)")
            held.set()
            release.wait(10)
            tx.rollback()

    t = threading.Thread(target=hold_open_write)
    t.start()
    held.wait(10)
    r = run_cli(sqlite_target, "backup", str(tmp_path / "b.db"), "--json")
    release.set()
    t.join()
    assert r.code == 0, r.err
    copy = sqlite3.connect(tmp_path / "b.db")
    assert copy.execute("SELECT COUNT(*) FROM jobs").fetchone() == (1,)
    assert copy.execute("SELECT COUNT(*) FROM workers").fetchone() == (0,)
    copy.close()
    c.close()


def test_backup_refuses_the_databases_own_wal_shm_and_journal_as_destination(
        sqlite_target: Target, tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    assert path
    holder = sqlite3.connect(path)  # keeps the -wal and -shm in use, as a running worker does
    holder.execute("SELECT 1 FROM jobs").fetchall()
    try:
        for _ in range(3):
            assert run_cli(sqlite_target, "enqueue", "k", "--json").code == 0
        os.link(path + "-wal", str(tmp_path / "hardlink-to-wal"))
        for dest in (path + "-wal", path + "-shm", path + "-journal",
                     str(tmp_path / "hardlink-to-wal")):
            r = run_cli(sqlite_target, "backup", dest, "--force", "--json")
            assert r.code == 2, (dest, r.out)
            assert "beside it" in r.json["error"]["message"]
        assert run_cli(sqlite_target, "status", "--json").json["jobs"]["waiting"] == 3
    finally:
        holder.close()


def _live_other_database(path: Path) -> sqlite3.Connection:
    """Another jobcoord database with three committed jobs still in its -wal, held open as a
    running worker holds it (so nothing checkpoints the log into the file)."""
    with Coordinator.open(str(path), migrate=True) as other:
        holder = sqlite3.connect(str(path))
        holder.execute("SELECT 1 FROM jobs").fetchall()
        for _ in range(3):
            other.enqueue("other_work", {})
    assert Path(f"{path}-wal").exists()
    return holder


def test_backup_refuses_another_databases_wal_shm_and_journal_as_destination(
        sqlite_target: Target, tmp_path: Path) -> None:
    """`backup live.db-wal --force` from another database replaced the -wal of a database
    in use with a database file: live.db lost the jobs its log held, exit 0. A name ending
    in -wal, -shm or -journal beside an existing file is that file's log: exit 2, nothing
    written, and the same for `artifact get -o` (one rule for every file a command puts)."""
    Coordinator.open(sqlite_target).close()
    live = tmp_path / "live db #1.db"
    holder = _live_other_database(live)
    try:
        before = {p.name: digest(p) for p in tmp_path.iterdir() if p.is_file()}
        for suffix in ("-wal", "-shm", "-journal"):
            dest = f"{live}{suffix}"
            r = run_cli(sqlite_target, "backup", dest, "--force", "--json")
            assert r.code == 2, (dest, r.out, r.err)
            assert r.json["error"]["code"] == "invalid_input", r.json
            assert str(live) in r.json["error"]["message"], r.json
        assert {p.name: digest(p) for p in tmp_path.iterdir() if p.is_file()} == before
        assert not Path(f"{live}-journal").exists()
        with Coordinator.open(str(live)) as other:
            assert other.status()["jobs"]["waiting"] == 3, other.status()
    finally:
        holder.close()
    # A name that merely ends so, with no SQLite file of the shorter name beside it (none,
    # a directory, a text file), is a file like any other.
    (tmp_path / "nightly").mkdir()
    (tmp_path / "notes").write_text("a text file\n")
    for lone in ("lone-wal", "nightly-journal", "notes-shm"):
        assert run_cli(sqlite_target, "backup", str(tmp_path / lone), "--json").code == 0, lone
        Coordinator.open(str(tmp_path / lone)).close()


def test_restore_and_a_new_database_never_take_another_databases_log_name(
        sqlite_target: Target, tmp_path: Path) -> None:
    """`--db live.db-journal restore b.db` made a database at that name (exit 0), and the
    next open of live.db took it for a hot journal and deleted it; `migrate` there made one
    the same. Refused, exit 2, nothing made, in any case of the suffix."""
    with Coordinator.open(sqlite_target) as c:
        c.enqueue("k", {})
    good = tmp_path / "b.db"
    assert run_cli(sqlite_target, "backup", str(good), "--json").code == 0
    live = tmp_path / "live.db"
    holder = _live_other_database(live)
    try:
        for suffix in ("-journal", "-wal", "-WAL"):
            name = f"{live}{suffix}"
            before = Path(name).read_bytes() if Path(name).exists() else None
            # (The -wal the holder keeps is there: migrate opens it, no database, exit 7.)
            for args, code in ((("restore", str(good)), 2),
                               (("migrate",), 7 if before is not None else 2)):
                r = run_cli(Target(url=f"sqlite:///{name}", sqlite_path=name), *args, "--json")
                assert r.code == code, (name, args, r)
                if code == 2:
                    assert "named as the log" in r.json["error"]["message"], r.json
                assert (Path(name).read_bytes() if Path(name).exists() else None) == before
            if before is None:
                with pytest.raises(InvalidInput):
                    Coordinator.open(name, migrate=True)
                assert not Path(name).exists()
    finally:
        holder.close()
    with Coordinator.open(str(live)) as other:
        assert other.status()["jobs"]["waiting"] == 3


def test_backup_force_never_replaces_a_fifo_or_a_device(sqlite_target: Target,
                                                        tmp_path: Path) -> None:
    """`backup DEST --force` put a regular file in place of a FIFO (and, run as root, of
    /dev/null). Anything but a regular file is exit 2 and stays what it was."""
    Coordinator.open(sqlite_target).close()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    r = run_cli(sqlite_target, "backup", str(fifo), "--force", "--json")
    assert r.code == 2, r
    assert fifo.is_fifo()
    # (Never aimed at a real device here: should the rule break, a test run as root would
    # replace it.)


def test_a_backup_without_force_never_replaces_a_dest_that_appeared_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `backup DEST` at once without --force both said ok: the copy was renamed over
    DEST whatever had appeared there since the check. The later one is refused (exit 2
    `destination_exists`) and DEST is the other's, whole; its temporary copy is gone.
    The later one never removes the earlier's live copy as a killed backup's (it holds
    it: here even the grace for a copy just made is taken away)."""
    import json

    from jobcoord import leftovers

    monkeypatch.setattr(leftovers, "YOUNG_S", 0.0)

    db, other = tmp_path / "q #1.db", tmp_path / "other.db"
    for path, kind in ((db, "mine"), (other, "theirs")):
        with Coordinator.open(str(path), migrate=True) as c:
            c.enqueue(kind, {})
    dest = tmp_path / "b ?%.db"
    slow = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", str(db), "backup", str(dest), "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "copy.before_place:sleep=3"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # checked and copied, sleeping before it puts the copy in place
    r = run_cli(None, "--db", str(other), "backup", str(dest), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    theirs = digest(dest)
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 2, (out, err)
    assert json.loads(out)["error"]["code"] == "destination_exists"
    assert digest(dest) == theirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b ?%.db", "other.db", "q #1.db"]


def test_a_copy_left_by_a_killed_backup_is_removed_by_the_next_one(tmp_path: Path) -> None:
    """A backup SIGKILLed after its copy was written left `DEST.tmp-<pid>` beside DEST, as
    large as the database, for good: no later backup ever looked at it. The next backup
    to DEST removes a copy no live backup holds (a live one's is left: the test above)."""
    import json

    db = tmp_path / "q #1.db"
    with Coordinator.open(str(db), migrate=True) as c:
        c.enqueue("k", {"x": "y" * 10_000})
    dest = tmp_path / "b ?%.db"
    killed = subprocess.run(
        [sys.executable, "-m", "jobcoord", "--db", str(db), "backup", str(dest), "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "copy.before_place:kill"},
        capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("b ?%.db.tmp-")]
    assert left, sorted(p.name for p in tmp_path.iterdir())  # what the kill leaves
    # A kill during the copy leaves SQLite's journal beside it too (made here by hand:
    # that moment is too short to aim a signal at), removed once its copy is gone.
    journal = tmp_path / f"{left[0]}-journal"
    journal.write_bytes(b"\0" * 512)
    journal.chmod(0o600)
    # A file of the user's own that merely looks like one is kept (its mode is not 0600).
    mine = tmp_path / "b ?%.db.tmp-1"
    mine.write_text("mine")
    mine.chmod(0o644)
    theirs = tmp_path / "b ?%.db.tmp-2-wal"
    theirs.write_text("theirs")
    theirs.chmod(0o644)
    r = run_cli(None, "--db", str(db), "backup", str(dest), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    assert json.loads(r.out)["ok"]  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["q #1.db", "b ?%.db", "b ?%.db.tmp-1", "b ?%.db.tmp-2-wal"])


def test_file_names_with_no_room_for_the_names_beside_them_are_refused_up_front(
        tmp_path: Path) -> None:
    """A backup or restore to a name of 238-245 bytes failed exit 1 (internal_error: its
    temporary file's `-wal` name was too long), and a database named 250 bytes was created
    empty by `migrate` before SQLite found no room for its journal. Each is refused before
    anything is written: exit 2, naming the limit."""
    import json

    db = tmp_path / "q.db"
    with Coordinator.open(str(db), migrate=True) as c:
        c.enqueue("k", {})
    backup = tmp_path / "b.db"
    assert run_cli(None, "--db", str(db), "backup", str(backup), "--json").code == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    for args in (("--db", str(db), "backup", str(tmp_path / ("L" * 240))),
                 ("--db", str(tmp_path / ("R" * 240)), "restore", str(backup)),
                 ("--db", str(tmp_path / ("M" * 250)), "migrate")):
        r = run_cli(None, *args, "--json")
        assert r.code == 2, (args[-1], r.out)  # type: ignore[attr-defined]
        error = json.loads(r.out)["error"]  # type: ignore[attr-defined]
        assert error["code"] == "invalid_input" and "bytes" in error["message"], error
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    # A name with room to spare still works.
    fits = tmp_path / ("F" * 200)
    assert run_cli(None, "--db", str(db), "backup", str(fits), "--json").code == 0
