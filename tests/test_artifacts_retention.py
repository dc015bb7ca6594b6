"""Artifact retention and faults: gc never deletes a referenced or young object (also under
concurrent uploads in real processes), SIGKILL during an upload, a full disk. Both databases
where a database is involved."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobcoord.artifacts import ObjectStore
from jobcoord.db import Target
from jobcoord.errors import StorageUnavailable
from jobcoord.service import Coordinator
from tests.test_artifact_objects import REPO, files_under, wait_for
from tests.test_artifacts_rules import ac, install, rows, start, store_dir  # noqa: F401
from tests.test_storage_faults import small_tmpfs

MiB = 1 << 20


def age(path: str, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def where(target: Target) -> list[str]:
    return ["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url]


def jobcoord(target: Target, store: str, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "jobcoord", *where(target), "--artifacts",
                             store, *args], cwd=REPO, **kw)


def test_gc_never_deletes_a_referenced_or_young_object(ac: Coordinator,  # noqa: F811
                                                       store_dir: str) -> None:  # noqa: F811
    store = ObjectStore(store_dir)
    done, e1 = start(ac, "w1")
    accepted = ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    live, e2 = start(ac, "w2")
    staged = ac.put_artifact(live, "w2", e2, "live.bin", b"staged by a live attempt")
    over, e3 = start(ac, "w3")
    ended = ac.put_artifact(over, "w3", e3, "over.bin", b"staged by an attempt that failed")
    ac.fail(over, "w3", e3, "boom", permanent=True)
    orphan = store.put(b"no row names me")  # e.g. a crash between put and the row
    for digest in (accepted["digest"], staged["digest"], ended["digest"]):
        age(store.path_of(digest), 2 * 3600)

    # Young orphan: kept. Dry run: says what would go, changes nothing. (It counted the
    # stage of the attempt that is over as a reference, and said nothing of that object.)
    dry = ac.gc_artifacts(grace_s=3600, dry_run=True)
    assert dry["kept_young"] == 1
    assert rows(ac, over)[0][2] == "staged" and store.exists(ended["digest"])
    first = ac.gc_artifacts(grace_s=3600)
    assert first["stages_ended"] == 1
    assert first["removed"] == [ended["digest"]]  # its attempt is over, the object is old
    assert {**dry, "dry_run": False} == first
    assert store.exists(orphan.digest)
    age(orphan.path, 2 * 3600)
    assert ac.gc_artifacts(grace_s=3600, dry_run=True)["removed"] == [orphan.digest]
    assert store.exists(orphan.digest)
    assert ac.gc_artifacts(grace_s=3600)["removed"] == [orphan.digest]
    assert not store.exists(orphan.digest)
    # Referenced objects stay, however old: the accepted one and the live attempt's stage.
    assert store.exists(accepted["digest"]) and store.exists(staged["digest"])
    assert ac.verify_artifacts()["ok"]
    assert rows(ac, over)[0][2] == "rejected"


CONCURRENT_PUTS = r"""
import sys
from jobcoord.errors import DatabaseBusy
from jobcoord.service import Coordinator
where, store = sys.argv[1], sys.argv[2]
job, epoch, n = map(int, sys.argv[3:6])
c = Coordinator.open(where)
c.artifacts_dir = store
ok = busy = 0
for i in range(n):
    try:
        c.put_artifact(job, "w1", epoch, f"copy-{i}", b"content gc keeps finding old")
        ok += 1
    except DatabaseBusy:
        busy += 1
print(ok, busy, flush=True)
"""


def test_gc_under_concurrent_uploads_in_a_real_process_never_leaves_a_row_without_its_object(
        ac: Coordinator, target: Target, store_dir: str) -> None:  # noqa: F811
    store = ObjectStore(store_dir)
    job, epoch = start(ac, "w1", lease_s=600)
    # The same content is already stored, old and unreferenced: each upload finds it there
    # (dedup) while gc, with no grace at all, keeps trying to delete it.
    old = store.put(b"content gc keeps finding old")
    age(old.path, 3600)
    putter = subprocess.Popen(
        [sys.executable, "-c", CONCURRENT_PUTS, target.sqlite_path or target.url, store_dir,
         str(job), str(epoch), "300"], cwd=REPO, stdout=subprocess.PIPE)
    passes, orphaned_rows = 0, []
    try:
        while putter.poll() is None:
            ac.gc_artifacts(grace_s=0)
            passes += 1
            # At every moment, every committed row's object is there.
            orphaned_rows += [a["name"] for a in ac.artifacts(job, all_states=True)["artifacts"]
                              if not store.exists(a["digest"])]
    finally:
        out, _ = putter.communicate(timeout=120)
    ok, busy = map(int, out.split())
    assert putter.returncode == 0 and ok + busy == 300 and ok > 0 and passes > 0
    assert orphaned_rows == []
    ac.gc_artifacts(grace_s=0)
    staged = [a for a in ac.artifacts(job, all_states=True)["artifacts"]
              if a["state"] != "rejected"]
    assert len(staged) == ok
    assert ac.verify_artifacts(job)["ok"]  # every row's object is there and whole


def test_a_gc_dry_run_that_is_not_true_or_false_is_invalid_input_and_deletes_nothing(
        ac: Coordinator, tmp_path: Path) -> None:  # noqa: F811
    # dry_run=0 would have deleted and "false" counted: neither is an answer.
    store = ObjectStore(ac.artifacts_dir)
    orphan = store.put(b"no row names me")
    age(orphan.path, 2 * 3600)
    from jobcoord.errors import InvalidInput

    for value in ("false", "no", 0, 1, None):
        with pytest.raises(InvalidInput, match="dry_run must be true or false"):
            ac.gc_artifacts(grace_s=3600, dry_run=value)
    assert store.exists(orphan.digest)


def test_sigkill_during_an_upload_leaves_no_row_no_object_and_gc_cleans_the_temp_file(
        ac: Coordinator, target: Target, store_dir: str) -> None:  # noqa: F811
    store = ObjectStore(store_dir)
    job, epoch = start(ac, "w1", lease_s=600)
    feeder = subprocess.Popen(["yes", "artifact bytes"], stdout=subprocess.PIPE)
    try:
        putter = jobcoord(target, store_dir, "artifact", "put", str(job), "--worker", "w1",
                          "--epoch", str(epoch), "--name", "big.bin", "-",
                          stdin=feeder.stdout, stdout=subprocess.DEVNULL)
        assert feeder.stdout is not None
        feeder.stdout.close()
        try:
            wait_for(lambda: os.path.isdir(store.tmp_dir) and any(
                os.path.getsize(os.path.join(store.tmp_dir, f)) > 8 * MiB
                for f in os.listdir(store.tmp_dir)), "the upload to pass 8 MiB", 60)
        finally:
            putter.send_signal(signal.SIGKILL)
            putter.wait(timeout=30)
        assert putter.returncode == -signal.SIGKILL
    finally:
        feeder.kill()
        feeder.wait()
    assert rows(ac, job) == []
    assert files_under(store.objects_dir) == []
    assert len(os.listdir(store.tmp_dir)) == 1
    assert ac.gc_artifacts(grace_s=3600)["temp_files_removed"] == 0  # young: maybe in flight
    (temp,) = os.listdir(store.tmp_dir)
    age(os.path.join(store.tmp_dir, temp), 2 * 3600)
    dry = ac.gc_artifacts(grace_s=3600, dry_run=True)  # says what it would remove: 0 was said
    assert dry["temp_files_removed"] == 1 and dry["temp_bytes_removed"] > 8 * MiB, dry
    assert os.listdir(store.tmp_dir) == [temp]
    assert ac.gc_artifacts(grace_s=3600)["temp_files_removed"] == 1
    assert os.listdir(store.tmp_dir) == []


def test_disk_full_during_an_upload_is_exit_6_with_nothing_linked(
        ac: Coordinator, target: Target, tmp_path: Path) -> None:  # noqa: F811
    with small_tmpfs("4m") as mount:
        store = os.path.join(mount, "store")
        ac.artifacts_dir = store
        job, epoch = start(ac, "w1", lease_s=600)
        src = tmp_path / "big.bin"
        src.write_bytes(os.urandom(8 * MiB))
        p = jobcoord(target, store, "artifact", "put", str(job), "--worker", "w1", "--epoch",
                     str(epoch), "--name", "big.bin", str(src), "--json",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 6, err
        assert b"artifact_store_full" in out
        assert rows(ac, job) == []
        assert files_under(os.path.join(store, "objects")) == []
        assert os.listdir(os.path.join(store, "tmp")) == []
        ac.complete(job, "w1", epoch, {})
        assert ac.artifacts(job)["artifacts"] == []


def test_a_gc_lock_that_cannot_be_opened_is_the_store_unavailable_with_nothing_changed(
        ac: Coordinator, target: Target, store_dir: str) -> None:  # noqa: F811
    # Something else sits where the lock file goes (here a directory): the store cannot be
    # used, which is exit 6 / HTTP 503 like any other store failure, never a bare traceback.
    job, epoch = start(ac, "w1")
    ObjectStore(store_dir)._ensure_layout()
    os.mkdir(os.path.join(store_dir, "gc.lock"))
    with pytest.raises(StorageUnavailable) as upload:
        ac.put_artifact(job, "w1", epoch, "a.bin", b"bytes")
    assert upload.value.code == "artifact_store_unavailable"
    assert "gc.lock" in str(upload.value)
    with pytest.raises(StorageUnavailable):
        ac.gc_artifacts(grace_s=0)
    p = jobcoord(target, store_dir, "artifact", "gc", "--json", stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 6, (out, err)
    assert b"artifact_store_unavailable" in out and b"Traceback" not in err
    assert rows(ac, job) == []
    # The lock is looked at before the bytes are stored: no object is left with no row
    # (it was, and gc, refused the same lock, never collected it).
    assert files_under(os.path.join(store_dir, "objects")) == []
    os.rmdir(os.path.join(store_dir, "gc.lock"))
    assert ac.gc_artifacts(grace_s=0)["objects_removed"] == 0


def test_a_dry_run_of_gc_on_a_store_that_does_not_exist_creates_nothing(
        ac: Coordinator, tmp_path: Path) -> None:  # noqa: F811
    ac.artifacts_dir = str(tmp_path / "not yet")
    report = ac.gc_artifacts(dry_run=True)
    assert report["objects_removed"] == 0 and report["temp_files_removed"] == 0
    assert not (tmp_path / "not yet").exists()


def test_gc_in_an_empty_directory_is_no_store_there_and_makes_nothing(
        ac: Coordinator, target: Target, tmp_path: Path) -> None:  # noqa: F811
    """An existing directory that holds no store (no `objects/`) is not a store: gc, dry run
    or not, judges it as one that is not there and leaves it empty. It used to make the
    store's layout and its lock inside it, and with rows referencing objects, report them
    as referenced over a store it had never seen."""
    empty = tmp_path / "empty # ?%"
    empty.mkdir()
    for dry in ([], ["--dry-run"]):  # no rows yet: nothing to collect, nothing made
        r = subprocess.run([sys.executable, "-m", "jobcoord", *where(target), "--artifacts",
                            str(empty), "artifact", "gc", "--json", *dry],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert list(empty.iterdir()) == []
    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    for dry in ([], ["--dry-run"]):  # rows reference objects: the wrong place, refused
        r = subprocess.run([sys.executable, "-m", "jobcoord", *where(target), "--artifacts",
                            str(empty), "artifact", "gc", "--json", *dry],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert '"artifact_store_missing"' in r.stdout
        assert list(empty.iterdir()) == []


def test_gc_on_a_store_that_is_not_there_refuses_and_creates_nothing(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """`artifact gc --artifacts` naming a directory that is not there (a typo) made it and
    said ok, `referenced: 3`, over a store it had never seen; the same typo one letter off
    another store is how objects get deleted. A store that is not there while rows of the
    database reference objects is refused (exit 2) and nothing is made or changed."""
    from tests.conftest import dump

    done, e1 = start(ac, "w1")
    kept = ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    typo = str(tmp_path / "stroe # ?%")
    before = dump(ac)
    for dry in ([], ["--dry-run"]):
        r = subprocess.run([sys.executable, "-m", "jobcoord", *where(target), "--artifacts",
                            typo, "artifact", "gc", "--json", *dry],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert '"artifact_store_missing"' in r.stdout and typo in r.stderr
        assert not os.path.exists(typo)
    assert dump(ac) == before
    assert ObjectStore(store_dir).exists(kept["digest"]) and ac.verify_artifacts()["ok"]


def test_gc_never_follows_a_symlinked_tmp_out_of_the_store(
        ac: Coordinator, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """The store's `tmp/` replaced by a link to a directory elsewhere: gc followed it and
    deleted an old `*.tmp` file there, outside the store. A link in `tmp/`'s place is not
    followed (as a linked fan-out directory under `objects/` is not): nothing outside the
    store is ever deleted, and nothing there is counted."""
    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "123-abc.tmp"
    victim.write_bytes(b"somebody else's file")
    age(str(victim), 7 * 86400)
    tmp = Path(store_dir, "tmp")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    tmp.symlink_to(outside)
    for dry in (True, False):
        report = ac.gc_artifacts(grace_s=0, dry_run=dry)
        assert report["temp_files_removed"] == 0, report
    r = subprocess.run([sys.executable, "-m", "jobcoord", *where(ac.db.target), "--artifacts",
                        store_dir, "artifact", "gc", "--grace", "0s", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert victim.read_bytes() == b"somebody else's file"
    assert tmp.is_symlink() and ac.verify_artifacts()["ok"]


@pytest.mark.parametrize("linked", ["objects", "objects/sha256"])
def test_gc_never_deletes_through_a_symlinked_objects_directory(
        ac: Coordinator, store_dir: str, tmp_path: Path, linked: str) -> None:  # noqa: F811
    """`objects/` or `objects/sha256` replaced by a link to a directory elsewhere: gc
    listed through it and deleted an old file there that no row referenced, outside the
    store (only a linked fan-out directory was skipped). gc is refused,
    `artifact_store_unavailable` (exit 6), naming the link; nothing is deleted, and the
    database is not changed first (gc rejected the stages of attempts that were over, and
    recorded its database, before it found the link)."""
    import shutil

    from tests.conftest import dump

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    over, e2 = start(ac, "w2")  # a stage of an attempt that is over: gc would reject it
    ac.put_artifact(over, "w2", e2, "partial.bin", b"half")
    ac.fail(over, "w2", e2, "boom", permanent=True)
    shutil.rmtree(os.path.join(store_dir, "databases"))  # gc would record it again
    inside = Path(store_dir, linked)
    outside = tmp_path / "outside" / Path(linked).name
    shutil.copytree(inside, outside, symlinks=True)
    shutil.rmtree(inside, onerror=lambda f, p, e: (os.chmod(os.path.dirname(p), 0o700), f(p)))
    inside.symlink_to(outside)
    digest = hashlib.sha256(b"somebody else's file").hexdigest()
    fan = outside if linked == "objects/sha256" else outside / "sha256"
    victim = fan / digest[:2] / digest[2:4] / digest
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_bytes(b"somebody else's file")
    age(str(victim), 7 * 86400)
    rows = dump(ac)
    for dry in (True, False):
        with pytest.raises(StorageUnavailable) as caught:
            ac.gc_artifacts(grace_s=0, dry_run=dry)
        assert caught.value.code == "artifact_store_unavailable", caught.value
        assert "symbolic link" in caught.value.message, caught.value.message
    r = subprocess.run([sys.executable, "-m", "jobcoord", *where(ac.db.target), "--artifacts",
                        store_dir, "artifact", "gc", "--grace", "0s", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert victim.read_bytes() == b"somebody else's file"
    assert dump(ac) == rows and not os.path.exists(os.path.join(store_dir, "databases"))
    assert ac.verify_artifacts()["ok"]


def test_gc_in_a_store_whose_objects_is_a_file_is_exit_6_not_no_store(
        ac: Coordinator, store_dir: str) -> None:  # noqa: F811
    """`objects/` replaced by a regular file: gc said "no artifact store at ..., is
    --artifacts mistyped?" (exit 2) of a store that is there; as every other use of it,
    it is `artifact_store_unavailable`, exit 6."""
    import shutil

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    objects = Path(store_dir, "objects")
    shutil.rmtree(objects, onerror=lambda f, p, e: (os.chmod(os.path.dirname(p), 0o700), f(p)))
    objects.write_text("x")
    with pytest.raises(StorageUnavailable) as caught:
        ac.gc_artifacts(grace_s=0)
    assert caught.value.code == "artifact_store_unavailable", caught.value


def test_gc_in_a_store_another_database_uses_is_refused_and_deletes_nothing(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """Two databases sharing one store: gc from one deleted every object only the other's
    rows reference, accepted artifacts included (`artifact verify` on the other: exit 7,
    missing). The store records each database that stages into it (or restores into it);
    gc in a store another database uses is refused, `artifact_store_shared` (exit 4), with
    nothing deleted and nothing changed, from either database, dry run or not."""
    from tests.conftest import dump

    mine, e1 = start(ac, "w1")
    kept = ac.put_artifact(mine, "w1", e1, "kept.bin", b"accepted by the first database")
    ac.complete(mine, "w1", e1, {})
    other_path = tmp_path / "other #1.db"
    from jobcoord.db import resolve_target

    Coordinator.open(str(other_path), migrate=True).close()
    install(resolve_target(db=str(other_path)))
    with Coordinator.open(str(other_path)) as o:
        o.artifacts_dir = store_dir
        theirs, e2 = start(o, "w2")
        their = o.put_artifact(theirs, "w2", e2, "theirs.bin", b"accepted by the other one")
        o.complete(theirs, "w2", e2, {})
    orphan = ObjectStore(store_dir).put(b"nobody's")
    for obj in (kept["digest"], their["digest"], orphan.digest):
        age(ObjectStore(store_dir).path_of(obj), 2 * 3600)
    objects = files_under(os.path.join(store_dir, "objects"))
    before = dump(ac)
    for db_args in (["--db", str(other_path)], where(target)):
        for dry in ([], ["--dry-run"]):
            r = subprocess.run([sys.executable, "-m", "jobcoord", *db_args, "--artifacts",
                                store_dir, "artifact", "gc", "--grace", "0s", "--json", *dry],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
            assert r.returncode == 4, (db_args, r.stdout, r.stderr)
            assert '"artifact_store_shared"' in r.stdout
    from jobcoord.errors import Refused

    with pytest.raises(Refused):
        ac.gc_artifacts(grace_s=0)
    assert files_under(os.path.join(store_dir, "objects")) == objects
    assert dump(ac) == before and ac.verify_artifacts()["ok"]
    r = subprocess.run([sys.executable, "-m", "jobcoord", "--db", str(other_path),
                        "--artifacts", store_dir, "artifact", "verify", "--all", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_a_gc_dry_run_or_a_refused_backup_makes_nothing_in_a_store_already_there(
        ac: Coordinator, target: Target, tmp_path: Path) -> None:  # noqa: F811
    """A store that is there (its `objects/`) but holds nothing else: `artifact gc
    --dry-run`, and a `backup` refused because the objects its rows name are missing, made
    `tmp/` and `objects/sha256/` in it (the lock's look at the layout made what it missed).
    A dry run and a refused command change nothing; the lock a reader or gc takes on a store
    already there needs only its lock file. (The backup is refused as the store unavailable,
    exit 6: an `objects/` without `sha256/` is the mount point of a volume not mounted.)"""
    from tests.conftest import run_cli

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    bare = tmp_path / "bare # ?%"
    (bare / "objects").mkdir(parents=True)

    def made() -> list[str]:
        return sorted(str(p.relative_to(bare)) for p in bare.rglob("*") if p.name != "gc.lock")

    r = run_cli(target, "--artifacts", str(bare), "artifact", "gc", "--dry-run", "--json")
    assert r.code == 0, r
    assert made() == ["objects"]
    if target.sqlite_path:
        r = run_cli(target, "--artifacts", str(bare), "backup", str(tmp_path / "b.db"),
                    "--json")
        assert r.code == 6 and r.json["error"]["code"] == "artifact_store_unavailable", r
        assert made() == ["objects"]


@pytest.mark.parametrize("damage", [b"not json", b"{}", b'{"database": 5}', b"[1]"])
def test_gc_with_this_databases_own_record_damaged_is_refused_and_deletes_nothing(
        ac: Coordinator, store_dir: str, damage: bytes) -> None:  # noqa: F811
    """gc took this database's own record by its file name alone: with its contents
    damaged it ran, where a record it cannot read is one of an unknown database (under any
    other name it is refused, exit 4). Refused `artifact_store_shared`, nothing deleted."""
    from jobcoord.artifacts.settings import _user_file, database_identity
    from jobcoord.errors import Refused

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    orphan = ObjectStore(store_dir).put(b"nobody's")
    age(ObjectStore(store_dir).path_of(orphan.digest), 2 * 3600)
    Path(_user_file(ObjectStore(store_dir), database_identity(ac.db))).write_bytes(damage)
    objects = files_under(os.path.join(store_dir, "objects"))
    for dry in (True, False):
        with pytest.raises(Refused) as caught:
            ac.gc_artifacts(grace_s=0, dry_run=dry)
        assert caught.value.code == "artifact_store_shared", caught.value
    assert files_under(os.path.join(store_dir, "objects")) == objects


def each_refused(target: Target, store: str, job: int, *, reads: bool = True,
                 backup: bool = True, code: int = 6,
                 error: str = "artifact_store_unavailable") -> None:
    """gc (dry run or not), `backup` and, with `reads`, verify and get of `job`'s kept.bin
    through `store`: each refused, exit `code` naming `error`."""
    from tests.conftest import run_cli

    beside = Path(store).parent
    commands = [("artifact", "gc", "--dry-run"), ("artifact", "gc", "--grace", "0s")]
    if reads:
        commands += [("artifact", "verify", "--all"),
                     ("artifact", "get", str(job), "kept.bin", "-o", str(beside / "got.bin"))]
    if backup and target.sqlite_path:
        commands.append(("backup", str(beside / "b.db")))
    for command in commands:
        r = run_cli(target, "--artifacts", store, *command, "--json")
        assert r.code == code, (command, r)
        assert r.json["error"]["code"] == error, (command, r.json)


@pytest.mark.parametrize("entry", ["objects", "objects/sha256", "tmp"])
def test_a_store_with_a_file_in_a_directorys_place_is_unavailable_to_gc_and_backup(
        ac: Coordinator, target: Target, store_dir: str, entry: str) -> None:  # noqa: F811
    """A regular file where the store keeps `objects/` or `objects/sha256/`: the store
    cannot be used (`artifact_store_unavailable`, exit 6), for gc (dry run or not),
    backup, verify and get alike; one where gc cleans `tmp/`, for gc. Nothing in the store
    or the database is changed first (gc recorded its database, and rejected the stages
    of attempts that were over, before it found the file; with `tmp` a file it said ok;
    backup, verify and get said the objects were missing, exit 7: results lost, when the
    store is only damaged in its layout)."""
    import shutil

    from tests.conftest import dump

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    over, e2 = start(ac, "w2")  # a stage of an attempt that is over: gc would reject it
    ac.put_artifact(over, "w2", e2, "partial.bin", b"half")
    ac.fail(over, "w2", e2, "boom", permanent=True)
    shutil.rmtree(os.path.join(store_dir, "databases"))  # gc would record it again
    place = os.path.join(store_dir, entry)
    shutil.rmtree(place)
    Path(place).write_text("not a directory")

    def everything() -> list[tuple[str, int]]:
        return sorted((str(p), p.stat().st_mtime_ns) for p in Path(store_dir).rglob("*"))

    before, rows = everything(), dump(ac)
    # Readers need no tmp/: through it, the objects are not missing
    each_refused(target, store_dir, done, reads=entry != "tmp", backup=entry != "tmp")
    assert everything() == before and dump(ac) == rows
    assert not (Path(store_dir).parent / "got.bin").exists()


def test_a_gc_dry_run_makes_no_lock_file_and_changes_nothing_in_the_store(
        ac: Coordinator, store_dir: str) -> None:  # noqa: F811
    """`--dry-run` changes nothing: it made the store's `gc.lock` when it was not there
    (and the root's mtime with it). A dry run takes the lock only where it is already."""
    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    os.unlink(os.path.join(store_dir, "gc.lock"))

    def everything() -> list[tuple[str, int]]:
        return sorted((str(p), p.stat().st_mtime_ns)
                      for p in [Path(store_dir), *Path(store_dir).rglob("*")])

    before = everything()
    report = ac.gc_artifacts(grace_s=0, dry_run=True)
    assert report["referenced"] == 1 and report["objects_removed"] == 0
    assert everything() == before


def test_a_gc_lock_that_is_a_symbolic_link_is_never_followed_out_of_the_store(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """`gc.lock` replaced by a link to a file that is not there: gc, its dry run and a
    backup created that file outside the store (the lock was opened through the link).
    Refused as a store that cannot be used (exit 6); nothing made outside it."""

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    outside = tmp_path / "outside # ?%"
    outside.mkdir()
    lock = os.path.join(store_dir, "gc.lock")
    os.unlink(lock)
    os.symlink(outside / "made.lock", lock)
    each_refused(target, store_dir, done, reads=False)  # (verify and get take no lock)
    assert list(outside.iterdir()) == []


def test_a_store_root_that_is_a_regular_file_is_no_store_there(
        ac: Coordinator, target: Target, store_dir: str) -> None:  # noqa: F811
    """`--artifacts` naming a regular file (`--artifacts q.db`, a typo) holds no store:
    while the database's rows name objects, gc, verify, get and backup refuse it as a
    mistyped path, `artifact_store_missing` (exit 2), nothing made or changed (a worker
    meeting it gives its job back and stops, as for any store not there)."""
    import shutil

    from tests.conftest import dump

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    shutil.rmtree(store_dir)
    Path(store_dir).write_text("not a store")
    rows = dump(ac)
    each_refused(target, store_dir, done, code=2, error="artifact_store_missing")
    assert Path(store_dir).read_text() == "not a store" and dump(ac) == rows
    assert not (Path(store_dir).parent / "got.bin").exists()


def test_a_store_whose_objects_is_an_empty_directory_is_unavailable_to_readers_not_missing(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """`objects/` an empty directory (the mount point of a volume not mounted): verify,
    get and backup said every object was missing (exit 7, results lost). The store cannot
    be used: exit 6, naming `objects/sha256` not there, nothing changed. gc, which finds
    nothing to delete there, goes on."""
    import shutil

    from tests.conftest import dump, run_cli

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    objects = os.path.join(store_dir, "objects")
    shutil.move(objects, tmp_path / "volume")
    os.mkdir(objects)
    rows = dump(ac)
    beside = Path(store_dir).parent
    for command in (("artifact", "verify", "--all"),
                    ("artifact", "get", str(done), "kept.bin", "-o", str(beside / "got.bin")),
                    *((("backup", str(beside / "b.db")),) if target.sqlite_path else ())):
        r = run_cli(target, "--artifacts", store_dir, *command, "--json")
        assert r.code == 6, (command, r)
        assert r.json["error"]["code"] == "artifact_store_unavailable", (command, r.json)
        assert "sha256 is not there" in r.json["error"]["message"], r.json
    assert dump(ac) == rows and os.listdir(objects) == []
    assert not (beside / "got.bin").exists() and not (beside / "b.db").exists()
    r = run_cli(target, "--artifacts", store_dir, "artifact", "gc", "--json")
    assert r.code == 0 and r.json["objects_removed"] == 0, r
    os.rmdir(objects)
    shutil.move(tmp_path / "volume", objects)  # mounted again: all there
    assert ac.verify_artifacts()["ok"]


def test_a_store_whose_objects_link_to_nothing_is_unavailable_not_missing(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """`objects/` a link to a directory that is gone (a volume not mounted): verify, get
    and backup said every object was missing (exit 7, results lost). The store cannot be
    used: exit 6, nothing changed."""
    import shutil

    from tests.conftest import dump

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    objects = os.path.join(store_dir, "objects")
    volume = tmp_path / "volume # ?%"
    shutil.move(objects, volume)
    os.symlink(volume, objects)
    ac.verify_artifacts()  # read through a link to a directory: it works
    volume.rename(tmp_path / "unmounted")
    rows = dump(ac)
    each_refused(target, store_dir, done)
    assert dump(ac) == rows and os.path.islink(objects)
    # Said to a reader as it is: the store cannot be used (not "cannot be written").
    from tests.conftest import run_cli

    message = run_cli(target, "--artifacts", store_dir, "artifact", "verify", "--all",
                      "--json").json["error"]["message"]
    assert "cannot be used while looking at its layout" in message, message
    assert "is a link to nothing" in message, message


@pytest.mark.parametrize("lock_file", [True, False])
def test_a_store_on_a_read_only_filesystem_can_be_looked_at_backed_up_and_gc_dry_run(
        ac: Coordinator, target: Target, tmp_path: Path, lock_file: bool) -> None:  # noqa: F811
    """A store on a filesystem mounted read-only (a snapshot, a disk remounted after
    errors): the gc dry run, which changes nothing, failed exit 6 because it opened its
    lock file for writing; so did a backup, which only reads the objects. Both open the
    lock file read-only where it is (where it is not, none can be made, and no gc can
    delete there either); verify and get read as ever. gc itself, which deletes, is refused
    exit 6, nothing changed."""
    from tests.conftest import dump, run_cli

    with small_tmpfs("4m") as mount_dir:
        store = os.path.join(mount_dir, "store # ?%")
        ac.artifacts_dir = store
        done, e1 = start(ac, "w1")
        ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
        ac.complete(done, "w1", e1, {})
        orphan = ObjectStore(store).put(b"nobody's")
        age(ObjectStore(store).path_of(orphan.digest), 2 * 3600)
        assert os.path.isfile(os.path.join(store, "gc.lock"))
        if not lock_file:
            os.unlink(os.path.join(store, "gc.lock"))
        subprocess.run(["mount", "-o", "remount,ro", mount_dir], check=True)
        rows_before = dump(ac)
        report = ac.gc_artifacts(grace_s=0, dry_run=True)
        assert report["removed"] == [orphan.digest], report
        for command in (("artifact", "gc", "--dry-run", "--grace", "0s"),
                        ("artifact", "verify", "--all"),
                        ("artifact", "get", str(done), "kept.bin", "-o",
                         str(tmp_path / "got.bin")),
                        *((("backup", str(tmp_path / "b.db")),) if target.sqlite_path
                          else ())):
            r = run_cli(target, "--artifacts", store, *command, "--json")
            assert r.code == 0, (command, r)
        assert (tmp_path / "got.bin").read_bytes() == b"accepted bytes"
        r = run_cli(target, "--artifacts", store, "artifact", "gc", "--grace", "0s", "--json")
        assert r.code == 6 and r.json["error"]["code"] == "artifact_store_unavailable", r
        assert ObjectStore(store).exists(orphan.digest) and dump(ac) == rows_before


def test_a_gc_lock_that_is_a_fifo_is_the_store_unavailable_never_a_hang(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:  # noqa: F811
    """`gc.lock` a fifo: a gc dry run and a backup, which open the lock read-only, waited
    forever for a writer; gc took a lock on the fifo and ran. Each is exit 6
    (`artifact_store_unavailable`), at once, nothing changed."""
    from tests.conftest import dump

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    ac.complete(done, "w1", e1, {})
    lock = os.path.join(store_dir, "gc.lock")
    os.unlink(lock)
    os.mkfifo(lock)
    rows = dump(ac)
    commands = [("artifact", "gc", "--dry-run"), ("artifact", "gc", "--grace", "0s")]
    if target.sqlite_path:
        commands.append(("backup", str(tmp_path / "b # ?%.db")))
    for command in commands:
        r = subprocess.run([sys.executable, "-m", "jobcoord", *where(target), "--artifacts",
                            store_dir, *command, "--json"],
                           cwd=REPO, capture_output=True, text=True, timeout=30)
        assert r.returncode == 6, (command, r.stdout, r.stderr)
        assert '"artifact_store_unavailable"' in r.stdout, (command, r.stdout)
    assert dump(ac) == rows and not (tmp_path / "b # ?%.db").exists()
    assert stat.S_ISFIFO(os.lstat(lock).st_mode)
