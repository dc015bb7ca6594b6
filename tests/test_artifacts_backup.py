"""Backup and restore with artifacts: the snapshot and exactly the objects it references, at
one recovery point, every object re-hashed; restore refuses a backup whose manifest and
objects disagree. SQLite (backup and restore are SQLite's; PostgreSQL uses its own tools)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobcoord.artifacts import ObjectStore
from jobcoord.db import Target, resolve_target
from jobcoord.errors import InvalidInput
from jobcoord.service import Coordinator
from tests.conftest import flip_root_page_byte, run_cli
from tests.test_artifact_objects import REPO, wait_for
from tests.test_artifacts_rules import install, sha, start


@pytest.fixture
def sc(sqlite_target: Target, tmp_path: Path) -> Iterator[Coordinator]:
    install(sqlite_target)
    c = Coordinator.open(sqlite_target)
    c.artifacts_dir = str(tmp_path / "store")
    yield c
    c.close()


def cli(target: Target, store: str, *args: str) -> object:
    return run_cli(target, "--artifacts", store, *args)


def test_backup_and_restore_carry_exactly_the_referenced_objects_re_hashed(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    store = sc.artifacts_dir or ""
    a, ea = start(sc, "w1")
    sc.put_artifact(a, "w1", ea, "report.pdf", b"%PDF report")
    sc.put_artifact(a, "w1", ea, "same.bin", b"shared")
    sc.complete(a, "w1", ea, {})
    b, eb = start(sc, "w2")
    sc.put_artifact(b, "w2", eb, "copy.bin", b"shared")  # staged, live: referenced
    orphan = ObjectStore(store).put(b"no row")  # not referenced: not in the backup
    dest = tmp_path / "backup.db"
    r = cli(sqlite_target, store, "backup", str(dest), "--json")
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    out = r.json  # type: ignore[attr-defined]
    assert out["artifacts"]["objects"] == 2 and out["artifacts"]["verified"]
    manifest = json.loads((tmp_path / "backup.db.artifacts" / "manifest.json").read_text())
    assert set(manifest["objects"]) == {sha(b"%PDF report"), sha(b"shared")}
    backup_store = ObjectStore(tmp_path / "backup.db.artifacts")
    assert not backup_store.exists(orphan.digest)
    assert all(s == "ok" for _, s in backup_store.verify_all())

    restored = resolve_target(db=str(tmp_path / "restored.db"))
    new_store = str(tmp_path / "restored-store")
    r = cli(restored, new_store, "restore", str(dest), "--json")
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    assert r.json["artifacts"]["objects"] == 2  # type: ignore[attr-defined]
    with Coordinator.open(restored) as c:
        c.artifacts_dir = new_store
        assert c.verify_artifacts()["ok"]
        c.get_artifact(a, "report.pdf", tmp_path / "out.pdf")
        assert (tmp_path / "out.pdf").read_bytes() == b"%PDF report"


def _within_seconds(seconds: float, call: Any) -> Any:
    """call(), failing the test (not hanging it) when it has not returned in time."""
    import threading

    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(call()), daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"no answer within {seconds} s (blocked)"
    return got[0]


#: Manifests that do not describe this backup, and what the refusal must say of each.
MANIFESTS = {
    "manifest": ('{"format": 1, "rows": 1, "objects": {}}', "not in the manifest"),
    "manifest a list": ("[]", "not a JSON object"),
    "manifest of a newer format": ('{"format": 2, "rows": 1, "objects": {}}', "format 2"),
    "manifest of other rows": (None, "names 7 rows"),
    "manifest size not a number": (None, "size"),
    # An extra key that is no digest was `invalid_digest`, exit 2: a damaged backup, not
    # a mistyped argument.
    "manifest key not a digest": (None, "not a digest"),
    # A FIFO in place of the manifest: restore blocked in open() forever.
    "manifest a fifo": (None, "not a regular file"),
    # A directory: the message named a file descriptor ("Is a directory: 3").
    "manifest a directory": (None, "manifest.json is not a regular file"),
    # true == 1 and 1.0 == 1 in Python: a manifest of another writer's making was read as
    # format 1, and rows 3.0 as 3.
    "manifest format true": (None, "format True"),
    "manifest format a float": (None, "format 1.0"),
    "manifest rows a float": (None, ".0 rows"),
}


@pytest.mark.parametrize("damage", ["flip", "remove", *MANIFESTS])
def test_restore_refuses_a_backup_whose_manifest_and_objects_disagree(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, damage: str) -> None:
    store = sc.artifacts_dir or ""
    a, ea = start(sc, "w1")
    digest = sc.put_artifact(a, "w1", ea, "r.bin", b"precious bytes")["digest"]
    sc.complete(a, "w1", ea, {})
    dest = tmp_path / "backup.db"
    assert cli(sqlite_target, store, "backup", str(dest)).code == 0  # type: ignore
    directory = tmp_path / "backup.db.artifacts"
    path = ObjectStore(directory).path_of(digest)
    if damage == "flip":
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:
            f.write(b"X")
    elif damage == "remove":
        os.unlink(path)
    else:
        text = MANIFESTS[damage][0]
        if text is None:  # the real manifest, one field changed
            real = json.loads((directory / "manifest.json").read_text())
            if damage == "manifest of other rows":
                real["rows"] = 7
            elif damage == "manifest key not a digest":
                real["objects"]["../../etc/passwd"] = 5
            elif damage == "manifest format true":
                real["format"] = True
            elif damage == "manifest format a float":
                real["format"] = 1.0
            elif damage == "manifest rows a float":
                real["rows"] = float(real["rows"])
            else:
                real["objects"][digest] = "fourteen"
            text = json.dumps(real)
        if damage == "manifest a fifo":
            (directory / "manifest.json").unlink()
            os.mkfifo(directory / "manifest.json")
        elif damage == "manifest a directory":
            (directory / "manifest.json").unlink()
            (directory / "manifest.json").mkdir()
        else:
            (directory / "manifest.json").write_text(text)
    restored = resolve_target(db=str(tmp_path / "restored.db"))
    r = _within_seconds(30, lambda: cli(restored, str(tmp_path / "s2"), "restore",
                                        str(dest), "--json"))
    assert r.code == 7, r.out  # type: ignore[attr-defined]
    assert r.json["error"]["code"] == "backup_artifacts_mismatch"  # type: ignore
    if damage in MANIFESTS:
        assert MANIFESTS[damage][1] in r.json["error"]["message"], r.out  # type: ignore
    assert not os.path.exists(restored.sqlite_path or "")
    assert not os.path.exists(tmp_path / "s2" / "objects")


UPLOADER = r"""
import sys
from jobcoord.service import Coordinator
from tests.timeline import IDLE_ON_AC
c = Coordinator.open(sys.argv[1])
c.artifacts_dir = sys.argv[2]
c.heartbeat("up", readings=IDLE_ON_AC)
for i in range(int(sys.argv[3])):
    job = c.enqueue("render", {"i": i})["job_id"]
    got = c.claim("up")
    epoch = got["lease"]["epoch"]
    c.put_artifact(got["job"]["job_id"], "up", epoch, "a.bin", (b"%d " % i) * 50000)
    c.complete(got["job"]["job_id"], "up", epoch, {})
print("done", flush=True)
"""


def test_a_backup_taken_while_a_worker_uploads_is_consistent(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    store = sc.artifacts_dir or ""
    uploader = subprocess.Popen([sys.executable, "-c", UPLOADER, sqlite_target.sqlite_path
                                 or "", store, "40"], cwd=REPO, stdout=subprocess.PIPE)
    backups, objects = [], []
    try:
        wait_for(lambda: sc.artifacts()["artifacts"], "the first upload", 60)
        while uploader.poll() is None and len(backups) < 6:
            dest = tmp_path / f"b{len(backups)}.db"
            r = cli(sqlite_target, store, "backup", str(dest), "--json")
            assert r.code == 0, r.err  # type: ignore[attr-defined]
            backups.append(dest)
            objects.append(r.json["artifacts"]["objects"])  # type: ignore[attr-defined]
    finally:
        out, _ = uploader.communicate(timeout=120)
    assert uploader.returncode == 0 and out.strip() == b"done"
    assert backups and objects[0] > 0
    for i, dest in enumerate(backups):
        # Each backup is whole: every row it holds has its object, re-hashed.
        restored = resolve_target(db=str(tmp_path / f"r{i}.db"))
        r = cli(restored, str(tmp_path / f"rs{i}"), "restore", str(dest), "--json")
        assert r.code == 0, r.err  # type: ignore[attr-defined]
        with Coordinator.open(restored) as c:
            c.artifacts_dir = str(tmp_path / f"rs{i}")
            assert c.verify_artifacts()["ok"]


def _good_backup_then_a_second_artifact(sc: Coordinator, sqlite_target: Target,
                                        tmp_path: Path) -> tuple[str, Path]:
    """A good backup at DEST, then a second accepted artifact that backup does not hold:
    (the store, DEST)."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    b, eb = start(sc, "w2")
    sc.put_artifact(b, "w2", eb, "second.bin", b"second")
    sc.complete(b, "w2", eb, {})
    return sc.artifacts_dir or "", dest


def test_a_forced_backup_with_artifacts_onto_a_dest_it_cannot_replace_is_exit_6(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """`backup DEST --force` with artifacts onto a DEST the filesystem will not let go (the
    immutable flag: root too is refused) failed exit 1, `unexpected error: PermissionError`
    (without artifacts: exit 6, as documented). It is exit 6 naming DEST, and the last good
    backup stays whole: its database, its objects, nothing beside them."""
    import shutil

    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    store, dest = _good_backup_then_a_second_artifact(sc, sqlite_target, tmp_path)
    before = dest.read_bytes()
    objects = sorted(p.name for p in (tmp_path / "b.db.artifacts").rglob("*"))
    try:
        subprocess.run(["chattr", "+i", str(dest)], check=True, capture_output=True)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"this filesystem keeps no immutable flag: {e.stderr!r}")
    try:
        r = cli(sqlite_target, store, "backup", str(dest), "--force", "--json")
    finally:
        subprocess.run(["chattr", "-i", str(dest)], check=True, capture_output=True)
    assert r.code == 6, (r.code, r.out, r.err)  # type: ignore[attr-defined]
    error = json.loads(r.out)["error"]  # type: ignore[attr-defined]
    assert error["code"] == "destination_unavailable" and str(dest) in error["message"], error
    assert dest.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "b.db.artifacts").rglob("*")) == objects
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "b.db", "b.db.artifacts", "jobcoord.db", "jobcoord.db-shm", "jobcoord.db-wal", "store"]


def _good_backup(sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> Path:
    store = sc.artifacts_dir or ""
    a, ea = start(sc, "w1")
    sc.put_artifact(a, "w1", ea, "r.bin", b"hello")
    sc.complete(a, "w1", ea, {})
    dest = tmp_path / "b.db"
    r = cli(sqlite_target, store, "backup", str(dest), "--json")
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    return dest


def test_a_failed_forced_backup_with_artifacts_keeps_the_last_good_backup(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """The snapshot was put at DEST before the objects were copied; an object failing its
    re-hash then took the snapshot away, and the last good backup's database with it (its
    objects stayed, without a database). Now everything is built beside DEST and put in
    place only once whole: a failure leaves DEST and DEST.artifacts as they were."""
    store = sc.artifacts_dir or ""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    before = dest.read_bytes()
    manifest = (tmp_path / "b.db.artifacts" / "manifest.json").read_bytes()
    for path in Path(store, "objects").rglob("*"):
        if path.is_file():
            path.chmod(0o600)
            path.write_bytes(b"tampered")
    r = cli(sqlite_target, store, "backup", str(dest), "--force", "--json")
    assert r.code == 7, r  # type: ignore[attr-defined]
    assert dest.read_bytes() == before
    assert (tmp_path / "b.db.artifacts" / "manifest.json").read_bytes() == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.db", "b.db.artifacts",
                                                           "jobcoord.db", "jobcoord.db-shm",
                                                           "jobcoord.db-wal", "store"]


@pytest.mark.parametrize("point", ["backup.old_objects_aside", "backup.new_objects_in_place",
                                   "backup.database_in_place"])
@pytest.mark.parametrize("action", ["kill", "bug"])
def test_a_forced_backup_stopped_while_it_puts_its_files_in_place_leaves_a_restorable_backup(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, point: str, action: str
) -> None:
    """The old objects go aside, the new ones in place, then the new database: a process
    killed between two of these left the old DEST beside the new objects (restore: the
    manifest names 2 rows, the database holds 1) or beside none (manifest missing), and an
    error there deleted the old objects for good. The old objects are put back on an error,
    and restore finds them set aside after a kill: DEST always restores whole, the old
    backup until the new database is in place, the new one after."""
    store, dest = _good_backup_then_a_second_artifact(sc, sqlite_target, tmp_path)
    got = subprocess.run(
        [sys.executable, "-m", "jobcoord", "--db", sqlite_target.sqlite_path or "",
         "--artifacts", store, "backup", str(dest), "--force", "--json"],
        env={**os.environ, "JOBCOORD_FAULT": f"{point}:{action}"}, capture_output=True,
        text=True, timeout=120, check=False)
    assert got.returncode == (-9 if action == "kill" else 1), got.stderr[-2000:]
    restored = tmp_path / "restored.db"
    r = run_cli(None, "--db", str(restored), "--artifacts", str(tmp_path / "rs"), "restore",
                str(dest), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    new = point == "backup.database_in_place"
    with Coordinator.open(str(restored)) as c:
        c.artifacts_dir = str(tmp_path / "rs")
        assert len(c.jobs(status="succeeded")["jobs"]) == (2 if new else 1)
        assert c.verify_artifacts()["ok"] is True
    if action == "bug" and not new:  # DEST.artifacts itself is the old backup's again
        manifest = json.loads((tmp_path / "b.db.artifacts" / "manifest.json").read_text())
        assert manifest["rows"] == 1


@pytest.mark.parametrize("point", ["backup.old_objects_aside", "backup.new_objects_in_place",
                                   "backup.database_in_place"])
def test_the_next_backup_to_dest_removes_what_a_killed_one_left_beside_it(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, point: str) -> None:
    """A backup killed while it put its files in place left its staged snapshot
    (`DEST.<token>.tmp`) and the set-aside objects (`DEST.artifacts.<token>.old`) on disk
    for good. The next backup to DEST that succeeds is a whole backup without them: it
    removes them (the directory's backup lock says no other backup holds them)."""
    store, dest = _good_backup_then_a_second_artifact(sc, sqlite_target, tmp_path)
    argv = [sys.executable, "-m", "jobcoord", "--db", sqlite_target.sqlite_path or "",
            "--artifacts", store, "backup", str(dest), "--force", "--json"]
    killed = subprocess.run(argv, env={**os.environ, "JOBCOORD_FAULT": f"{point}:kill"},
                            capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = sorted(n for n in os.listdir(tmp_path) if n.startswith("b.db.")
                  and n != "b.db.artifacts")
    assert left, "the killed backup left nothing to remove"
    other = tmp_path / "b.db.x.1234abcd.tmp"  # another name's, never removed
    other.write_bytes(b"not ours")
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("b.db")) == [
        "b.db", "b.db.artifacts", other.name], left
    r = run_cli(None, "--db", str(tmp_path / "restored.db"), "--artifacts",
                str(tmp_path / "rs"), "restore", str(dest), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]


def test_a_forced_backup_with_artifacts_over_a_file_with_a_wal_beside_it_is_exit_2(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """Without artifacts, a DEST with a -wal beside it is refused (the next open would
    replay that log over the backup); with them, the backup replaced DEST anyway and said
    ok, and the next open read the other database. Refused alike now, nothing written."""
    import sqlite3

    store = sc.artifacts_dir or ""
    dest = tmp_path / "old #1.db"
    other = sqlite3.connect(dest)
    try:
        other.execute("PRAGMA journal_mode=wal")
        other.execute("CREATE TABLE t(x)")
        other.commit()
        files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
        r = cli(sqlite_target, store, "backup", str(dest), "--force", "--json")
        assert r.code == 2 and "destination_not_standalone" in r.out, r  # type: ignore[attr-defined]
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == files
        assert not (tmp_path / "old #1.db.artifacts").exists()
    finally:
        other.close()


def test_a_backup_whose_artifact_directory_would_be_the_live_store_is_exit_2(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """DEST.artifacts the live store itself (or holding it): --force renamed the store aside
    and deleted it, gc.lock and uploads in flight with it, and said ok. Refused now."""
    # The live store at <tmp>/store.db.artifacts: a backup named <tmp>/store.db would put
    # its objects there.
    moved = str(tmp_path / "store.db.artifacts")
    sc.artifacts_dir = moved
    _good_backup(sc, sqlite_target, tmp_path)
    live = sorted(str(p.relative_to(moved)) for p in Path(moved).rglob("*"))
    dest = tmp_path / "store.db"
    dest.write_bytes(b"old")
    for args in ((str(dest), "--force"), (str(dest),), (str(tmp_path / "st.db"), "--force")):
        r = cli(sqlite_target, moved, "backup", *args, "--json")
        if args[0].endswith("st.db"):  # (a name whose objects go elsewhere: fine)
            assert r.code == 0, r  # type: ignore[attr-defined]
            continue
        assert r.code == 2 and "artifact store" in r.out, r  # type: ignore[attr-defined]
    assert dest.read_bytes() == b"old"
    assert sorted(str(p.relative_to(moved)) for p in Path(moved).rglob("*")) == live


@pytest.mark.parametrize("there", ["another database's store", "a directory of one's own"])
def test_a_forced_backup_never_replaces_an_artifact_directory_no_backup_wrote(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, there: str) -> None:
    """DEST.artifacts the live store of another database (its `databases/` record naming
    it), or a directory of the user's own (no manifest): `backup --force` renamed it aside
    and deleted it, exit 0, and the other database's accepted artifacts were gone for good.
    Only a directory a backup wrote (its manifest, no live store's record) is replaced:
    exit 2, both left as they were."""
    _good_backup(sc, sqlite_target, tmp_path)
    taken = tmp_path / "old #1.db.artifacts"
    if there == "another database's store":
        other = resolve_target(db=str(tmp_path / "z.db"))
        Coordinator.open(other, migrate=True).close()
        install(other)
        with Coordinator.open(other) as z:
            z.artifacts_dir = str(taken)
            job, epoch = start(z, "wz")
            z.put_artifact(job, "wz", epoch, "precious.txt", b"precious")
            z.complete(job, "wz", epoch, {})
    else:
        (taken / "notes").mkdir(parents=True)
        (taken / "notes" / "mine.txt").write_bytes(b"mine")
    kept = {str(p.relative_to(taken)): p.read_bytes() for p in taken.rglob("*") if p.is_file()}
    dest = tmp_path / "old #1.db"
    r = cli(sqlite_target, sc.artifacts_dir or "", "backup", str(dest), "--force", "--json")
    assert r.code == 2, r  # type: ignore[attr-defined]
    assert r.json["error"]["details"]["dest"] == str(taken), r  # type: ignore[attr-defined]
    assert not dest.exists()
    assert {str(p.relative_to(taken)): p.read_bytes() for p in taken.rglob("*")
            if p.is_file()} == kept
    if there == "another database's store":
        with Coordinator.open(other) as z:
            z.artifacts_dir = str(taken)
            got = tmp_path / "got.txt"
            z.get_artifact(job, "precious.txt", got)
            assert got.read_bytes() == b"precious"


def test_a_backup_whose_artifact_directory_name_is_taken_by_a_file_is_exit_2(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """DEST.artifacts a regular file: an internal error (NotADirectoryError) that, with
    --force, had already deleted DEST. Now exit 2 before anything is written."""
    store = sc.artifacts_dir or ""
    dest = tmp_path / "d.db"
    dest.write_bytes(b"old")
    (tmp_path / "d.db.artifacts").write_bytes(b"not a directory")
    for args in ((str(dest), "--force"), (str(tmp_path / "e.db"),)):
        if args[0].endswith("e.db"):
            (tmp_path / "e.db.artifacts").write_bytes(b"not a directory")
        r = cli(sqlite_target, store, "backup", *args, "--json")
        assert r.code == 2, (args, r)
    assert dest.read_bytes() == b"old"
    assert not (tmp_path / "e.db").exists()


@pytest.mark.parametrize("table", ["job_counts", "artifacts"])
def test_a_backup_with_a_damaged_page_is_exit_7_for_check_and_restore_never_exit_1(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, table: str) -> None:
    """`check` went on past quick_check's finding to the invariants and crashed on a NULL
    (exit 1, internal_error); `restore` crashed the same way, or on an artifact row's size."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    flip_root_page_byte(dest, table, 8)
    r = run_cli(resolve_target(db=str(dest)), "check", "--json")
    assert r.code == 7, r.out + r.err
    assert r.json["ok"] is False
    restored = tmp_path / "restored.db"
    r = cli(resolve_target(db=str(restored)), str(tmp_path / "new store"), "restore",
            str(dest), "--json")
    assert r.code == 7, r.out + r.err  # type: ignore[attr-defined]
    assert not restored.exists() and not (tmp_path / "new store").exists()


def test_a_fifo_in_place_of_an_object_is_exit_7_for_restore_verify_and_get_never_a_hang(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: restore, `artifact verify` and
    `artifact get` hung for ever on one."""
    from tests.serve_procs import jobcoord_argv

    dest = _good_backup(sc, sqlite_target, tmp_path)
    digest = sha(b"hello")
    for store in (tmp_path / "b.db.artifacts", Path(sc.artifacts_dir or "")):
        path = ObjectStore(store).path_of(digest)
        os.unlink(path)
        os.mkfifo(path)
    [job] = [j["job_id"] for j in sc.jobs()["jobs"]]
    restored = tmp_path / "restored.db"
    for args in (["--db", str(restored), "--artifacts", str(tmp_path / "new store"),
                  "restore", str(dest)],
                 ["--db", sqlite_target.sqlite_path or "", "--artifacts",
                  sc.artifacts_dir or "", "artifact", "verify", "--all"],
                 ["--db", sqlite_target.sqlite_path or "", "--artifacts",
                  sc.artifacts_dir or "", "artifact", "get", str(job), "r.bin", "-o",
                  str(tmp_path / "got.bin")]):
        done = subprocess.run([*jobcoord_argv(), *args, "--json"], capture_output=True,
                              timeout=60, check=False)
        assert done.returncode == 7, (args, done.stdout, done.stderr)
    assert not restored.exists() and not (tmp_path / "got.bin").exists()


def test_artifact_get_never_writes_over_another_databases_wal(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """`artifact get -o other.db-wal --force` put the artifact's bytes in place of a live
    database's log. Exit 2, the log as it was."""
    from tests.test_backup import _live_other_database

    _good_backup(sc, sqlite_target, tmp_path)
    [job] = [j["job_id"] for j in sc.jobs()["jobs"]]
    live = tmp_path / "live.db"
    holder = _live_other_database(live)
    try:
        wal = Path(f"{live}-wal")
        before = wal.read_bytes()
        r = cli(sqlite_target, sc.artifacts_dir or "", "artifact", "get", str(job), "r.bin",
                "-o", str(wal), "--force", "--json")
        assert r.code == 2, (r.out, r.err)  # type: ignore[attr-defined]
        assert wal.read_bytes() == before
    finally:
        holder.close()
    with Coordinator.open(str(live)) as other:
        assert other.status()["jobs"]["waiting"] == 3


def test_an_object_that_is_a_symbolic_link_is_corrupt_and_never_restored_into_a_store(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """A backup whose object was replaced by a link to a file elsewhere (with the right
    bytes) restored: the new store's object was that link, whose bytes anyone could then
    change. An object is its own file: a link is corrupt, for restore, verify, get and the
    next backup, and nothing is restored."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    digest = sha(b"hello")
    outside = tmp_path / "outside file"
    outside.write_bytes(b"hello")
    for store in (tmp_path / "b.db.artifacts", Path(sc.artifacts_dir or "")):
        path = ObjectStore(store).path_of(digest)
        os.unlink(path)
        os.symlink(outside, path)
    [job] = [j["job_id"] for j in sc.jobs()["jobs"]]
    restored = tmp_path / "restored.db"
    for args in (["--db", str(restored), "--artifacts", str(tmp_path / "new store"),
                  "restore", str(dest)],
                 ["--artifacts", sc.artifacts_dir or "", "artifact", "verify", "--all"],
                 ["--artifacts", sc.artifacts_dir or "", "artifact", "get", str(job),
                  "r.bin", "-o", str(tmp_path / "got.bin")],
                 ["--artifacts", sc.artifacts_dir or "", "backup",
                  str(tmp_path / "second.db")]):
        if args[0] != "--db":
            args = ["--db", sqlite_target.sqlite_path or "", *args]
        r = run_cli(None, *args, "--json")
        assert r.code == 7, (args, r.out, r.err)
    assert not restored.exists() and not (tmp_path / "new store").exists()
    assert not (tmp_path / "got.bin").exists() and not (tmp_path / "second.db").exists()
    assert outside.read_bytes() == b"hello"


@pytest.mark.parametrize("point", ["backup.old_objects_aside", "backup.new_objects_in_place"])
def test_a_backup_without_force_never_replaces_a_dest_that_appeared_meanwhile(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, point: str) -> None:
    """Two `backup DEST` at once, neither with --force: both said ok, the second replacing
    the first's file. The one that finds DEST made meanwhile is refused (exit 2
    `destination_exists`), and DEST with its objects is the other's, whole."""
    store = sc.artifacts_dir or ""
    job, epoch = start(sc, "w1")
    sc.put_artifact(job, "w1", epoch, "a.bin", b"mine")
    sc.complete(job, "w1", epoch, {})
    dest = tmp_path / "b #1.db"
    slow = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", sqlite_target.sqlite_path or "",
         "--artifacts", store, "backup", str(dest), "--json"],
        env={**os.environ, "JOBCOORD_FAULT": f"{point}:sleep=3"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # the slow one is past its checks, sleeping before it puts DEST in place
    other = tmp_path / "other.db"
    with Coordinator.open(str(other), migrate=True) as o:
        o.enqueue("other", {})
    r = run_cli(None, "--db", str(other), "backup", str(dest), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    theirs = dest.read_bytes()
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 2, (out, err)
    assert json.loads(out)["error"]["code"] == "destination_exists"
    assert dest.read_bytes() == theirs
    assert not (tmp_path / "b #1.db.artifacts").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "b #1.db", "jobcoord.db", "jobcoord.db-shm", "jobcoord.db-wal", "other.db", "store"]


def _slow_restore(backup: Path, db: Path, *store: str, then: str = ""
                  ) -> subprocess.Popen[str]:
    """`restore` sleeping once its objects are in the store, before its database."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", str(db), *store, "restore", str(backup),
         "--json"], env={**os.environ, "JOBCOORD_FAULT": "restore.objects_placed:sleep=3"
                         + then}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("shared", ["the default store", "an --artifacts store"])
def test_a_refused_restore_never_takes_away_a_store_another_restore_filled_meanwhile(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, shared: str) -> None:
    """Two restores at once, to one database (its `<db>.artifacts`) or to two sharing an
    --artifacts store: the refused one deleted the store it had made, and with it the
    objects of the one that succeeded meanwhile (every row's object missing). The store
    stays with every object the restored database references."""
    backup = _good_backup(sc, sqlite_target, tmp_path)
    if shared == "the default store":
        slow_db = fast_db = tmp_path / "t #1.db"
        store = tmp_path / "t #1.db.artifacts"
        flags: tuple[str, ...] = ()
    else:
        slow_db, fast_db = tmp_path / "f.db", tmp_path / "g.db"
        store = tmp_path / "shared ?%"
        flags = ("--artifacts", str(store))
    # To one file, the slow one finds its database made (refused); to two, it fails as it
    # copies its database in (an error of its own, exit 1), its target still not there.
    slow = _slow_restore(backup, slow_db, *flags,
                         then="" if slow_db == fast_db else ",copy.before_place:bug")
    time.sleep(1.5)  # its objects placed, sleeping before its database
    r = run_cli(None, "--db", str(fast_db), *flags, "restore", str(backup), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == (2 if slow_db == fast_db else 1), (out, err)
    assert json.loads(out)["error"]["code"] == (
        "destination_exists" if slow_db == fast_db else "internal_error")
    assert not slow_db.exists() or slow_db == fast_db
    with Coordinator.open(str(fast_db)) as c:
        c.artifacts_dir = str(store)
        assert c.verify_artifacts()["ok"] is True
        assert len(c.artifacts(1)["artifacts"]) == 1


def test_a_failed_restore_takes_away_the_store_it_made_when_nothing_uses_it(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """Alone, a restore that fails after placing its objects leaves no store behind; one
    refused because its target exists places none."""
    backup = _good_backup(sc, sqlite_target, tmp_path)
    db = tmp_path / "t.db"
    failed = subprocess.run(
        [sys.executable, "-m", "jobcoord", "--db", str(db), "restore", str(backup), "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "restore.objects_placed:bug"},
        capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode == 1, failed.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "b.db", "b.db.artifacts", "jobcoord.db", "jobcoord.db-shm", "jobcoord.db-wal", "store"]
    db.write_bytes(b"")
    r = run_cli(None, "--db", str(db), "restore", str(backup), "--json")
    assert r.code == 2 and "destination_exists" in r.out, r.out  # type: ignore[attr-defined]
    assert not (tmp_path / "t.db.artifacts").exists()
    long = tmp_path / ("R" * 240)  # no room for the names beside it: refused as early
    r = run_cli(None, "--db", str(long), "restore", str(backup), "--json")
    assert r.code == 2 and "bytes" in r.out, r.out  # type: ignore[attr-defined]
    assert not any(p.name.startswith("R") for p in tmp_path.iterdir())


@pytest.mark.parametrize("there", ["absent", "empty"])
def test_a_backup_reads_the_store_and_never_makes_one_where_there_is_none(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, there: str) -> None:
    """A backup only reads the live store. Named where there is no store (a typo, or an
    empty directory), it made one there: the directory, its layout and its lock. With no
    object referenced the backup is taken and nothing is made; with objects referenced it
    is refused, and nothing is made either."""
    wrong = tmp_path / "wrong # ?%"
    if there == "empty":
        wrong.mkdir()

    def left() -> list[str]:
        return sorted(p.name for p in wrong.iterdir()) if wrong.exists() else ["(absent)"]

    before = left()
    r = cli(sqlite_target, str(wrong), "backup", str(tmp_path / "first.db"), "--json")
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    assert r.json["artifacts"]["objects"] == 0  # type: ignore[attr-defined]
    assert left() == before
    a, ea = start(sc, "w1")
    sc.put_artifact(a, "w1", ea, "report.pdf", b"%PDF report")
    sc.complete(a, "w1", ea, {})
    r = cli(sqlite_target, str(wrong), "backup", str(tmp_path / "second.db"), "--json")
    assert r.code != 0 and r.code != 1, (r.code, r.err)  # type: ignore[attr-defined]
    assert left() == before
    assert not (tmp_path / "second.db").exists()


@pytest.mark.parametrize("store", ["RR.db", "RR.db/sub", "RR.db-wal"])
def test_a_restore_whose_store_would_be_its_target_is_refused_before_making_anything(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, store: str) -> None:
    """`restore` to RR.db with `--artifacts RR.db` (or inside it, or at a file SQLite keeps
    beside it): exit 2 "RR.db exists", yet it had made RR.db/ (its gc.lock, objects/) as the
    store before the database's own checks refused the target. Exit 2 means nothing
    changed: the store is checked against the target before any store is made."""
    backup = _good_backup(sc, sqlite_target, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run_cli(None, "--db", str(tmp_path / "RR.db"), "--artifacts", str(tmp_path / store),
                "restore", str(backup), "--json")
    assert r.code == 2, r.out  # type: ignore[attr-defined]
    assert r.json["error"]["code"] == "invalid_input"  # type: ignore[attr-defined]
    assert "RR.db" in r.json["error"]["message"]  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_failed_restore_takes_away_the_directories_it_made_for_its_store(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """A restore failing after it placed its objects took away the store it made, but not
    the directories it had made to hold it (`--artifacts new/deeper/store`)."""
    backup = _good_backup(sc, sqlite_target, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    failed = subprocess.run(
        [sys.executable, "-m", "jobcoord", "--db", str(tmp_path / "t.db"), "--artifacts",
         str(tmp_path / "new" / "deeper" / "store"), "restore", str(backup), "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "restore.objects_placed:bug"},
        capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode == 1, failed.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_two_forced_backups_to_one_dest_at_once_run_one_after_the_other(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """Two `backup DEST --force` at once: both said ok and left DEST unrestorable, the
    first's database beside the second's objects and manifest, and both set-aside
    directories deleted (the last good backup's objects gone). Backups with artifacts into
    one directory now run one at a time: the second waits for the first, then replaces its
    backup whole, and DEST restores."""
    store, dest = _good_backup_then_a_second_artifact(sc, sqlite_target, tmp_path)
    slow = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", sqlite_target.sqlite_path or "",
         "--artifacts", store, "backup", str(dest), "--force", "--json"],
        env={**os.environ, "JOBCOORD_FAULT": "backup.new_objects_in_place:sleep=6"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The slow one has set the old objects aside and is sleeping before its database.
        wait_for(lambda: any(p.name.endswith(".old") for p in tmp_path.iterdir()),
                 "the old objects set aside", 60)
        c, ec = start(sc, "w3")
        sc.put_artifact(c, "w3", ec, "third.bin", b"third")
        sc.complete(c, "w3", ec, {})
        r = cli(sqlite_target, store, "backup", str(dest), "--force", "--json")
        assert r.code == 0, r.out  # type: ignore[attr-defined]
    finally:
        out, err = slow.communicate(timeout=120)
    assert slow.returncode == 0, (out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "b.db", "b.db.artifacts", "jobcoord.db", "jobcoord.db-shm", "jobcoord.db-wal", "store"]
    restored = tmp_path / "restored.db"
    r = run_cli(None, "--db", str(restored), "--artifacts", str(tmp_path / "rs"), "restore",
                str(dest), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    with Coordinator.open(str(restored)) as c:
        c.artifacts_dir = str(tmp_path / "rs")
        assert len(c.jobs(status="succeeded")["jobs"]) == 3  # the second backup's, whole
        assert c.verify_artifacts()["ok"] is True


def test_gc_from_a_database_restored_into_a_shared_store_never_deletes_the_others_artifacts(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """`restore MB.db` into M's store by another database (allowed: "another database
    sharing the store"), then `artifact gc --grace 0s` from it: M's artifact accepted after
    the backup was deleted, and `artifact verify --all` on M said missing (exit 7). The
    restore records its database in the store, and gc there is refused (exit 4,
    `artifact_store_shared`) from either database, nothing deleted."""
    store = sc.artifacts_dir or ""
    backup = _good_backup(sc, sqlite_target, tmp_path)
    b, eb = start(sc, "w2")
    sc.put_artifact(b, "w2", eb, "later.bin", b"accepted after the backup")
    sc.complete(b, "w2", eb, {})
    for path in Path(store, "objects").rglob("*"):
        if path.is_file():
            os.utime(path, (time.time() - 7200, time.time() - 7200))
    r2 = tmp_path / "R2.db"
    r = run_cli(None, "--db", str(r2), "--artifacts", store, "restore", str(backup), "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]
    for db in (str(r2), sqlite_target.sqlite_path or ""):
        r = run_cli(None, "--db", db, "--artifacts", store, "artifact", "gc", "--grace", "0s",
                    "--json")
        assert r.code == 4 and "artifact_store_shared" in r.out, r.out  # type: ignore
    r = cli(sqlite_target, store, "artifact", "verify", "--all", "--json")
    assert r.code == 0, r.out  # type: ignore[attr-defined]


def _stamps(directory: Path) -> list[tuple[str, int]]:
    """Every path under `directory` with its modification time: what "changes nothing"
    compares."""
    return sorted((str(p), p.lstat().st_mtime_ns) for p in directory.rglob("*"))


def _restores(dest: Path, tmp_path: Path, name: str = "r.db") -> None:
    """The backup at `dest` still restores, into a new database and store."""
    r = cli(resolve_target(db=str(tmp_path / name)), str(tmp_path / "rs"), "restore",
            str(dest), "--json")
    assert r.code == 0, r  # type: ignore[attr-defined]


def test_a_restore_into_a_backups_own_artifact_directory_is_exit_2_and_changes_nothing(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """`restore BACKUP --artifacts BACKUP.artifacts` (the backup's directory taken for a
    store): it was restored, the backup's directory made a live store (its database
    recorded, its lock made), and the restored database's prune and gc then deleted the
    backup's objects: the backup no longer restored (exit 7). A directory holding a backup's
    manifest is never a restore's store, nor one under it: exit 2, nothing made anywhere."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    own = tmp_path / "b.db.artifacts"
    other = tmp_path / "other # ?%.db"
    r = cli(sqlite_target, sc.artifacts_dir or "", "backup", str(other), "--json")
    assert r.code == 0, r.err  # type: ignore[attr-defined]

    def tree() -> list[tuple[str, int]]:
        return sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")
                      if "store" not in p.parts[-1] and not p.name.startswith("jobcoord.db"))

    before = tree()
    for store in (own, tmp_path / "other # ?%.db.artifacts", own / "objects"):
        restored = resolve_target(db=str(tmp_path / "r.db"))
        r = cli(restored, str(store), "restore", str(dest), "--json")
        assert r.code == 2, (store, r)  # type: ignore[attr-defined]
        assert "backup" in r.json["error"]["message"], r.json  # type: ignore[attr-defined]
        assert tree() == before and not (tmp_path / "r.db").exists()
    _restores(dest, tmp_path, "r2.db")


def test_gc_in_a_backups_artifact_directory_is_exit_2_and_deletes_nothing(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """`artifact gc --artifacts BACKUP.artifacts` (a backup's directory taken for the live
    store): gc recorded its database there and deleted every object of the backup its
    database no longer names (pruned since: the backup no longer restored). Refused as not
    a store, exit 2, dry run or not; nothing made or deleted."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    own = tmp_path / "b.db.artifacts"
    orphan = ObjectStore(own).put(b"left in the backup's directory")  # no row names it
    os.utime(ObjectStore(own).path_of(orphan.digest), (1, 1))
    before = _stamps(own)
    for dry in ([], ["--dry-run"]):
        r = cli(sqlite_target, str(own), "artifact", "gc", "--grace", "0s", "--json", *dry)
        assert r.code == 2, r  # type: ignore[attr-defined]
        assert "backup" in r.json["error"]["message"], r.json  # type: ignore[attr-defined]
    assert _stamps(own) == before
    _restores(dest, tmp_path)


def test_a_store_under_a_directory_with_a_manifest_not_a_backups_is_collected_and_restored(
        sqlite_target: Target, tmp_path: Path) -> None:
    """Only a backup's manifest marks a backup's directory: any ancestor holding some
    `manifest.json` beside an `objects/` (a web or extension tree, another tool's cache)
    refused gc and restore of every store below it, exit 2, for ever."""
    site = tmp_path / "site # ?%"
    (site / "objects").mkdir(parents=True)
    (site / "manifest.json").write_text('{"name": "an extension", "version": "1.0"}')
    install(sqlite_target)
    c = Coordinator.open(sqlite_target)
    c.artifacts_dir = str(site / "data" / "store")
    try:
        dest = _good_backup(c, sqlite_target, tmp_path)
    finally:
        c.close()
    r = cli(sqlite_target, str(site / "data" / "store"), "artifact", "gc", "--grace", "0s",
            "--json")
    assert r.code == 0, r  # type: ignore[attr-defined]
    r = cli(resolve_target(db=str(tmp_path / "r.db")), str(site / "restored"), "restore",
            str(dest), "--json")
    assert r.code == 0, r  # type: ignore[attr-defined]
    assert ObjectStore(site / "restored").present()


def test_a_store_path_linked_to_a_backups_artifact_directory_is_refused_like_the_directory(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """The refusal looked at the path as typed: a link to the backup's directory (or to a
    directory inside it) passed, and restore and gc used the backup's own directory."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    own = tmp_path / "b.db.artifacts"
    (tmp_path / "link").symlink_to(own)
    (tmp_path / "link in").symlink_to(own / "objects")
    before = _stamps(own)
    for store in (tmp_path / "link", tmp_path / "link in" / "more"):
        restored = resolve_target(db=str(tmp_path / "r.db"))
        r = cli(restored, str(store), "restore", str(dest), "--json")
        assert r.code == 2, (store, r)  # type: ignore[attr-defined]
        assert "backup" in r.json["error"]["message"], r.json  # type: ignore[attr-defined]
        assert not (tmp_path / "r.db").exists()
    r = cli(sqlite_target, str(tmp_path / "link"), "artifact", "gc", "--grace", "0s",
            "--json")
    assert r.code == 2, r  # type: ignore[attr-defined]
    assert _stamps(own) == before


def test_a_stage_into_a_backups_artifact_directory_is_exit_2_and_the_backup_still_restores(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """A worker given the backup's directory for its store staged into it: its database
    recorded there and its lock made, the directory was no longer a backup's, and the
    backup restored no more. Refused, exit 2, nothing stored; the backup restores."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    own = tmp_path / "b.db.artifacts"
    before = _stamps(own)
    sc.artifacts_dir = str(own)
    b, eb = start(sc, "w2")
    with pytest.raises(InvalidInput) as e:
        sc.put_artifact(b, "w2", eb, "second.bin", b"second")
    assert "backup" in str(e.value)
    assert _stamps(own) == before
    src = tmp_path / "x.bin"
    src.write_bytes(b"x")
    r = cli(sqlite_target, str(own), "artifact", "put", str(b), str(src), "--name", "x.bin",
            "--worker", "w2", "--epoch", str(eb), "--json")
    assert r.code == 2, r  # type: ignore[attr-defined]
    assert _stamps(own) == before
    _restores(dest, tmp_path)


def test_a_backup_of_no_objects_is_a_backups_directory_too(
        sqlite_target: Target, tmp_path: Path) -> None:
    """A backup of a database naming no object writes its manifest alone, no `objects/`:
    it was not taken for a backup's directory, a stage made it a live store, and every
    later `backup --force` to that DEST was refused (exit 2). Its manifest (of no object)
    marks it as well: the stage, restore and gc are refused, and the backup is replaced."""
    install(sqlite_target)
    c = Coordinator.open(sqlite_target)
    try:
        c.artifacts_dir = str(tmp_path / "store")
        dest = tmp_path / "b # ?%.db"
        r = cli(sqlite_target, c.artifacts_dir, "backup", str(dest), "--json")
        assert r.code == 0, r  # type: ignore[attr-defined]
        own = Path(f"{dest}.artifacts")
        assert sorted(p.name for p in own.iterdir()) == ["manifest.json"]
        c.artifacts_dir = str(own)
        job, epoch = start(c, "w1")
        with pytest.raises(InvalidInput) as e:
            c.put_artifact(job, "w1", epoch, "x.bin", b"x")
        assert "backup" in str(e.value)
        assert sorted(p.name for p in own.iterdir()) == ["manifest.json"]
        r = cli(sqlite_target, str(own), "artifact", "gc", "--json")
        assert r.code == 2, r  # type: ignore[attr-defined]
        r = cli(sqlite_target, str(tmp_path / "store"), "backup", str(dest), "--force",
                "--json")
        assert r.code == 0, r  # type: ignore[attr-defined]
    finally:
        c.close()


@pytest.mark.parametrize("manifest", ["fifo", "directory", "link to nothing"])
def test_a_backups_directory_whose_manifest_cannot_be_read_is_still_never_collected(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path, manifest: str) -> None:
    """A backup's directory whose `manifest.json` was a fifo, a directory or a link to
    nothing was taken for no backup's: a stage made it a live store and gc deleted the
    backup's objects. A manifest that cannot be read beside `objects/` may be a backup's,
    damaged: refused, exit 2, nothing deleted."""
    _good_backup(sc, sqlite_target, tmp_path)
    own = tmp_path / "b.db.artifacts"
    path = own / "manifest.json"
    path.unlink()
    if manifest == "fifo":
        os.mkfifo(path)
    elif manifest == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "nowhere")
    orphan = ObjectStore(own).put(b"left in the backup's directory")  # no row names it
    os.utime(ObjectStore(own).path_of(orphan.digest), (1, 1))
    before = _stamps(own)
    r = cli(sqlite_target, str(own), "artifact", "gc", "--grace", "0s", "--json")
    assert r.code == 2, r  # type: ignore[attr-defined]
    assert "backup" in r.json["error"]["message"], r.json  # type: ignore[attr-defined]
    assert _stamps(own) == before


def test_a_restore_with_artifacts_into_a_missing_directory_makes_nothing(
        sc: Coordinator, sqlite_target: Target, tmp_path: Path) -> None:
    """A backup with artifacts restored to `nodir/sub/x.db` with the default store made
    the store, its directories with it, and so the database's directory: exit 0, where
    a backup without artifacts is exit 6 saying the directory does not exist. Refused
    alike, before any object is placed; through a regular file, "is not a directory"."""
    dest = _good_backup(sc, sqlite_target, tmp_path)
    (tmp_path / "afile").write_bytes(b"a file")
    (tmp_path / "dang").symlink_to(tmp_path / "unmounted")
    before = _stamps(tmp_path)
    for where, said in (("nodir/sub", "does not exist"), ("afile", "is not a directory"),
                        ("dang", "does not exist")):
        r = run_cli(resolve_target(db=str(tmp_path / where / "x.db")), "restore", str(dest),
                    "--json")
        assert (r.code, r.json["error"]["code"]) == (6, "database_unavailable"), (where, r)
        assert said in r.json["error"]["message"], (where, r.json)
        assert _stamps(tmp_path) == before
