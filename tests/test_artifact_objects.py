"""The artifact object store on disk (no database): content addressing, dedup, verified
reads, crash and disk-full behaviour, flat memory, concurrent writers. Real files, real
processes, real signals, a real full filesystem."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobcoord.artifacts import ObjectStore, parse_digest, validate_name
from jobcoord.errors import DatabaseCorrupt, InvalidInput, StorageUnavailable
from tests.test_storage_faults import small_tmpfs

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
MiB = 1 << 20


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def files_under(path: str | Path) -> list[str]:
    """Every regular file below `path` (relative names), [] if it does not exist."""
    found = []
    for dirpath, _dirs, files in os.walk(path):
        found += [os.path.relpath(os.path.join(dirpath, f), path) for f in files]
    return sorted(found)


def python(script: str, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, **kw)


def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return ObjectStore(tmp_path / "store")


# --- content addressing and dedup -----------------------------------------------------------


def test_identical_content_is_stored_once(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 17)  # not a multiple of the chunk size
    first = store.put(data)
    second = store.put(data)
    assert first.created and not second.created
    assert first.digest == second.digest == sha256_of(data)
    assert first.size == second.size == len(data)
    inode = os.stat(first.path).st_ino
    assert [d for d, _, _ in store.iter_objects()] == [first.digest]
    assert os.stat(first.path).st_ino == inode  # the object was not replaced
    other = store.put(b"other bytes")
    assert other.created and other.digest != first.digest
    assert files_under(store.tmp_dir) == []
    rel = os.path.relpath(first.path, store.root).split(os.sep)
    hexdigest = parse_digest(first.digest)
    assert rel == ["objects", "sha256", hexdigest[:2], hexdigest[2:4], hexdigest]
    assert os.stat(first.path).st_mode & 0o777 == 0o400  # objects are read-only


def test_path_bytes_and_file_object_give_the_sha256sum_digest(store: ObjectStore,
                                                              tmp_path: Path) -> None:
    src = tmp_path / "report with spaces.bin"
    data = os.urandom(2 * MiB + 5)
    src.write_bytes(data)
    expected = subprocess.run(["sha256sum", str(src)], capture_output=True, text=True,
                              check=True).stdout.split()[0]
    from_path = store.put(src)
    from_str = store.put(str(src))
    from_bytes = store.put(data)
    with open(src, "rb") as f:
        from_file = store.put(f)
    from_stream = store.put(io.BytesIO(data))
    digests = {o.digest for o in (from_path, from_str, from_bytes, from_file, from_stream)}
    assert digests == {f"sha256:{expected}"}
    assert [o.created for o in (from_path, from_str, from_bytes, from_file, from_stream)] == [
        True, False, False, False, False]
    assert Path(from_path.path).read_bytes() == data
    assert b"".join(store.read(from_path.digest)) == data  # several chunks, verified


def test_empty_content_is_an_object(store: ObjectStore, tmp_path: Path) -> None:
    empty = store.put(b"")
    assert empty.digest == sha256_of(b"") and empty.size == 0
    assert store.verify(empty.digest) == "ok"
    store.copy_to(empty.digest, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b""


def test_store_root_with_spaces_hash_question_percent_and_unicode_works(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "my store #1 ?x=%20 ünïcødé ☃")
    obj = store.put(b"payload")
    assert store.exists(obj.digest) and store.size(obj.digest) == 7
    assert b"".join(store.read(obj.digest)) == b"payload"
    dest = tmp_path / "out #2 ?%20 ☃.bin"
    assert store.copy_to(obj.digest, dest) == 7
    assert dest.read_bytes() == b"payload"
    assert list(store.verify_all()) == [(obj.digest, "ok")]


def test_iter_objects_size_and_remove(store: ObjectStore) -> None:
    assert list(store.iter_objects()) == []  # no store yet: nothing, no error
    objs = [store.put(os.urandom(n)) for n in (1, 1000, MiB + 1)]
    listed = {d: s for d, s, _mtime in store.iter_objects()}
    assert listed == {o.digest: o.size for o in objs}
    assert all(store.size(o.digest) == o.size for o in objs)
    # A stray file in the fan-out is not an object.
    Path(objs[0].path).with_name("notes.txt").write_text("x")
    assert len(list(store.iter_objects())) == 3
    assert store.remove(objs[0].digest) is True
    assert store.remove(objs[0].digest) is False
    assert not store.exists(objs[0].digest)
    with pytest.raises(DatabaseCorrupt) as exc:
        store.size(objs[0].digest)
    assert exc.value.code == "artifact_missing" and exc.value.exit_code == 7


@pytest.mark.parametrize("bad", ["", "sha256:", "sha256:abc", "md5:" + "0" * 64,
                                 "sha256:" + "A" * 64, "0" * 64, "sha256:" + "0" * 65,
                                 "sha256:../../../../etc/passwd", None, 7])
def test_malformed_digest_is_invalid_input(store: ObjectStore, bad: Any) -> None:
    for call in (store.read, store.verify, store.exists, store.remove, store.size):
        with pytest.raises(InvalidInput) as exc:
            call(bad)
        assert exc.value.code == "invalid_digest"


# --- verified reads -------------------------------------------------------------------------


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:  # root writes through the read-only mode
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


CORRUPTIONS = {
    "flipped_byte": lambda p: flip_byte(p, 2 * MiB + 3),
    "truncated": lambda p: os.truncate(p, os.path.getsize(p) - 1),
    "appended": lambda p: open(p, "ab").write(b"x"),  # noqa: SIM115
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_corrupted_object_is_detected_by_verify_read_and_copy_to(store: ObjectStore,
                                                                  tmp_path: Path,
                                                                  damage: str) -> None:
    data = os.urandom(3 * MiB)
    obj = store.put(data)
    CORRUPTIONS[damage](obj.path)
    assert store.verify(obj.digest) == "corrupt"
    assert list(store.verify_all()) == [(obj.digest, "corrupt")]
    with pytest.raises(DatabaseCorrupt) as exc:
        for _chunk in store.read(obj.digest):
            pass
    assert exc.value.code == "artifact_corrupt" and exc.value.exit_code == 7
    dest = tmp_path / "out.bin"
    with pytest.raises(DatabaseCorrupt) as exc:
        store.copy_to(obj.digest, dest)
    assert exc.value.code == "artifact_corrupt"
    assert not dest.exists()
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
    # A file already at the destination is left as it was.
    dest.write_bytes(b"previous")
    with pytest.raises(DatabaseCorrupt):
        store.copy_to(obj.digest, dest)
    assert dest.read_bytes() == b"previous"
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_a_put_of_content_whose_stored_object_is_damaged_heals_the_object(
        store: ObjectStore, damage: str) -> None:
    """The same content put again over a damaged object of its digest: the put's bytes,
    hashed as they arrived, take the object's place. It was linked to the damaged object
    as if stored, and every read of it failed (exit 7) with a good copy just in hand."""
    data = os.urandom(3 * MiB)
    obj = store.put(data)
    CORRUPTIONS[damage](obj.path)
    again = store.put(data)
    assert again.digest == obj.digest and again.size == len(data)
    assert not again.created  # the content was stored before
    assert store.verify(obj.digest) == "ok"
    assert Path(obj.path).read_bytes() == data
    assert os.stat(obj.path).st_mode & 0o777 == 0o400
    assert files_under(store.tmp_dir) == []


def test_read_checks_the_size_the_caller_expects(store: ObjectStore, tmp_path: Path) -> None:
    obj = store.put(b"12345")
    with pytest.raises(DatabaseCorrupt) as exc:
        store.copy_to(obj.digest, tmp_path / "out", expected_size=6)
    assert exc.value.code == "artifact_corrupt"
    assert not (tmp_path / "out").exists()
    assert store.copy_to(obj.digest, tmp_path / "out", expected_size=5) == 5


def test_missing_object_is_detected_by_verify_read_and_copy_to(store: ObjectStore,
                                                               tmp_path: Path) -> None:
    obj = store.put(b"will vanish")
    os.unlink(obj.path)
    never = sha256_of(b"never stored")
    for digest in (obj.digest, never):
        assert store.verify(digest) == "missing"
        assert not store.exists(digest)
        with pytest.raises(DatabaseCorrupt) as exc:
            store.read(digest)
        assert exc.value.code == "artifact_missing" and exc.value.exit_code == 7
        dest = tmp_path / "out.bin"
        with pytest.raises(DatabaseCorrupt) as exc:
            store.copy_to(digest, dest)
        assert exc.value.code == "artifact_missing"
        assert not dest.exists()
    # A store that was never created has no objects either.
    empty = ObjectStore(tmp_path / "nowhere")
    assert empty.verify(never) == "missing"
    assert not os.path.exists(empty.root)


def test_copy_to_a_missing_directory_or_onto_a_directory_is_invalid_input(
        store: ObjectStore, tmp_path: Path) -> None:
    obj = store.put(b"x")
    for dest in (tmp_path / "no" / "such" / "dir" / "out", tmp_path):
        with pytest.raises(InvalidInput):
            store.copy_to(obj.digest, dest)
    assert not (tmp_path / "no").exists()
    # A directory that is there but makes no files (/proc) was said not to exist.
    for dest, why in ((tmp_path / "no" / "out", "does not exist"),
                      (Path("/proc/out"), "is not a directory where a file can be made")):
        with pytest.raises(InvalidInput) as caught:
            store.copy_to(obj.digest, dest)
        assert why in caught.value.message, caught.value.message


def test_copy_to_a_full_filesystem_gives_destination_full_and_leaves_nothing(
        store: ObjectStore) -> None:
    obj = store.put(os.urandom(3 * MiB))
    with small_tmpfs("2m") as mount_dir:
        dest = os.path.join(mount_dir, "out.bin")
        with pytest.raises(StorageUnavailable) as exc:
            store.copy_to(obj.digest, dest)
        assert exc.value.code == "destination_full" and exc.value.exit_code == 6
        assert os.listdir(mount_dir) == []
    assert store.verify(obj.digest) == "ok"


# --- memory ---------------------------------------------------------------------------------


RSS_SCRIPT = r"""
import json, os, sys
from jobcoord.artifacts import ObjectStore
src, root, dest = sys.argv[1:4]
store = ObjectStore(root)

def hwm_kib():
    # Peak RSS of this process image. ru_maxrss is not used: it carries over the parent's
    # peak across fork + exec, which would hide any growth below the parent's size.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

# Everything is imported; the measurement starts before the first put, so that the put's
# own buffers count.
before = hwm_kib()
obj = store.put(src)
store.copy_to(obj.digest, dest)
after = hwm_kib()
print(json.dumps({"digest": obj.digest, "size": obj.size, "growth_kib": after - before}))
"""


def make_big_file(path: Path, size: int) -> str:
    """A sparse file of `size` bytes with random blocks scattered through it; its digest."""
    rng = random.Random(size)
    with open(path, "wb") as f:
        f.truncate(size)
        for _ in range(16):
            f.seek(rng.randrange(0, size - MiB))
            f.write(rng.randbytes(64 * 1024))
    res = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
    return "sha256:" + res.stdout.split()[0]


def put_and_copy_to_growth(tmp_path: Path, size: int) -> int:
    src = tmp_path / "big.bin"
    expected = make_big_file(src, size)
    dest = tmp_path / "copy.bin"
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(src), str(tmp_path / "store"),
                          str(dest)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["digest"] == expected and result["size"] == size
    assert dest.stat().st_size == size
    return int(result["growth_kib"])


def test_put_and_copy_to_of_256_mib_keep_memory_flat(tmp_path: Path) -> None:
    growth = put_and_copy_to_growth(tmp_path, 256 * MiB)
    assert growth < 50 * 1024, f"peak RSS grew by {growth} KiB"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_put_and_copy_to_of_1_gib_keep_memory_flat(tmp_path: Path) -> None:
    growth = put_and_copy_to_growth(tmp_path, 1024 * MiB)
    assert growth < 50 * 1024, f"peak RSS grew by {growth} KiB"


# --- crashes and interrupted uploads --------------------------------------------------------


PUT_STDIN = r"""
import sys
from jobcoord.artifacts import ObjectStore
print(ObjectStore(sys.argv[1]).put(sys.stdin.buffer).digest, flush=True)
"""


def temp_files(store: ObjectStore) -> list[str]:
    return [os.path.join(store.tmp_dir, f) for f in files_under(store.tmp_dir)]


def test_sigkill_during_put_leaves_only_a_temp_file_that_clean_temp_removes_after_the_grace(
        store: ObjectStore) -> None:
    # `yes` keeps writing into the pipe: the put never reaches the end of its source.
    feeder = subprocess.Popen(["yes", "artifact bytes"], stdout=subprocess.PIPE)
    try:
        putter = python(PUT_STDIN, store.root, stdin=feeder.stdout, stdout=subprocess.PIPE)
        assert feeder.stdout is not None
        feeder.stdout.close()  # the putter holds the read end now
        try:
            def big_temp() -> list[str]:
                found = temp_files(store) if os.path.isdir(store.tmp_dir) else []
                return [p for p in found if os.path.getsize(p) > 8 * MiB]

            wait_for(big_temp, "the upload to pass 8 MiB")
        finally:
            putter.send_signal(signal.SIGKILL)
            putter.wait(timeout=30)
        assert putter.returncode == -signal.SIGKILL
    finally:
        feeder.kill()
        feeder.wait()
    assert files_under(store.objects_dir) == []
    (temp,) = temp_files(store)
    # Young: it may be an upload in flight; never touched within the grace.
    assert store.clean_temp(older_than_s=3600)["removed"] == 0
    assert os.path.exists(temp)
    past = time.time() - 2 * 3600
    os.utime(temp, (past, past))
    counts = store.clean_temp(older_than_s=3600)
    assert counts["removed"] == 1 and counts["bytes_removed"] > 8 * MiB
    assert temp_files(store) == []
    assert files_under(store.objects_dir) == []
    assert store.put(b"still works").created


def test_clean_temp_never_touches_an_upload_in_flight_even_past_the_grace(
        store: ObjectStore) -> None:
    putter = python(PUT_STDIN, store.root, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert putter.stdin is not None and putter.stdout is not None
    sent = hashlib.sha256()
    try:
        first = os.urandom(2 * MiB)
        putter.stdin.write(first)
        putter.stdin.flush()
        sent.update(first)
        # The putter has read everything so far and waits for more, holding its temp file.
        (temp,) = wait_for(lambda: [p for p in (temp_files(store)
                                                if os.path.isdir(store.tmp_dir) else [])
                                    if os.path.getsize(p) == 2 * MiB], "2 MiB in flight")
        past = time.time() - 10 * 3600
        os.utime(temp, (past, past))  # as if the source had stalled for hours
        counts = store.clean_temp(older_than_s=60)
        assert counts == {"removed": 0, "bytes_removed": 0, "kept_young": 0,
                          "kept_in_flight": 1}
        assert os.path.exists(temp)
        rest = os.urandom(MiB)
        putter.stdin.write(rest)
        sent.update(rest)
        putter.stdin.close()
        digest = putter.stdout.read().decode().strip()
        assert putter.wait(timeout=30) == 0
    finally:
        if putter.poll() is None:
            putter.kill()
            putter.wait()
    assert digest == "sha256:" + sent.hexdigest()
    assert store.verify(digest) == "ok"
    assert temp_files(store) == []


def test_clean_temp_refuses_a_negative_grace(store: ObjectStore) -> None:
    with pytest.raises(InvalidInput):
        store.clean_temp(-1)


def test_max_bytes_stops_reading_and_leaves_nothing(store: ObjectStore) -> None:
    # An endless source: only stopping early can end this put.
    feeder = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        assert feeder.stdout is not None
        with pytest.raises(InvalidInput) as exc:
            store.put(feeder.stdout, max_bytes=3 * MiB)
        assert exc.value.code == "artifact_too_large" and exc.value.exit_code == 2
    finally:
        feeder.kill()
        feeder.wait()
    assert files_under(store.objects_dir) == [] and temp_files(store) == []
    exact = os.urandom(MiB)
    assert store.put(exact, max_bytes=MiB).size == MiB  # the limit itself is allowed
    with pytest.raises(InvalidInput):
        store.put(exact + b"x", max_bytes=MiB)
    assert temp_files(store) == []


# --- bad sources and bad stores -------------------------------------------------------------


def test_source_that_is_a_directory_or_missing_is_invalid_input_naming_it(
        store: ObjectStore, tmp_path: Path) -> None:
    for source in (tmp_path, tmp_path / "no such file.bin"):
        with pytest.raises(InvalidInput) as exc:
            store.put(source)
        assert exc.value.code == "invalid_input"
        assert str(source) in exc.value.message
    with pytest.raises(InvalidInput):
        store.put(io.StringIO("text, not bytes"))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.put(12345)  # type: ignore[arg-type]
    # A closed file object raised ValueError, which no caller catching JobcoordError catches.
    closed = io.BytesIO(b"gone")
    closed.close()
    with pytest.raises(InvalidInput) as exc:
        store.put(closed)
    assert "cannot be read" in exc.value.message, exc.value.message
    assert files_under(store.root) == []


UNREADABLE_SCRIPT = r"""
import json, sys
from jobcoord.artifacts import ObjectStore
from jobcoord.errors import JobcoordError
try:
    ObjectStore(sys.argv[1]).put(sys.argv[2])
except JobcoordError as exc:
    print(json.dumps({"code": exc.code, "exit": exc.exit_code, "message": exc.message}))
"""


@contextlib.contextmanager
def shared_dir() -> Iterator[str]:
    """Outside the private test tree, so that an unprivileged user can reach it."""
    d = tempfile.mkdtemp(prefix="jobcoord-artifacts-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def test_unreadable_source_is_invalid_input_naming_it() -> None:
    """Root reads every file, so the put runs as an unprivileged user."""
    with shared_dir() as d:
        secret = os.path.join(d, "secret #1.bin")
        Path(secret).write_bytes(b"not yours")
        os.chmod(secret, 0o600)
        root = os.path.join(d, "store")
        os.mkdir(root)
        os.chmod(root, 0o777)
        res = subprocess.run([*NOBODY, sys.executable, "-c", UNREADABLE_SCRIPT, root, secret],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        if res.returncode != 0 and "Permission denied" in res.stderr and not res.stdout:
            pytest.skip(f"the interpreter is not usable by an unprivileged user: {res.stderr}")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert (out["code"], out["exit"]) == ("invalid_input", 2)
        assert secret in out["message"]
        assert files_under(root) == []


def test_a_store_root_through_a_regular_file_is_a_mistyped_path_not_a_store_unavailable(
        tmp_path: Path) -> None:
    """The store's directory (or one above it) is a regular file: no store can ever be made
    there, whatever is retried (`--artifacts q.db`, a typo). It was exit 6, which a worker
    retries job after job; it is `artifact_store_missing` (exit 2), as a store root that is
    a regular file is to every other use, and nothing is made. Inside a root that is a
    directory, a file where `objects/` goes is a damaged store: exit 6."""
    blocker = tmp_path / "store # ?%"
    blocker.write_bytes(b"a file where the store directory should be")
    linked = tmp_path / "linked"
    linked.symlink_to(blocker)
    for root in (blocker, blocker / "below", linked, linked / "below"):
        with pytest.raises(InvalidInput) as caught:
            ObjectStore(root).put(b"data")
        assert caught.value.code == "artifact_store_missing" and caught.value.exit_code == 2
        assert str(root) in caught.value.message, caught.value.message
        assert "is a file, not a directory" in caught.value.message, caught.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linked", "store # ?%"]
    # A link to nothing where the root goes (a volume not mounted): unavailable, for now.
    (tmp_path / "gone").symlink_to(tmp_path / "unmounted")
    with pytest.raises(StorageUnavailable) as exc:
        ObjectStore(tmp_path / "gone").put(b"data")
    assert exc.value.code == "artifact_store_unavailable" and exc.value.exit_code == 6
    # Said as it is (it said "exists and is not a directory", naming no path).
    assert f"{tmp_path / 'gone'} is a link to nothing" in exc.value.message, exc.value.message
    # objects/ taken by a file inside an otherwise good root.
    root = tmp_path / "store2"
    root.mkdir()
    (root / "objects").write_bytes(b"")
    with pytest.raises(StorageUnavailable) as exc:
        ObjectStore(root).put(b"data")
    assert exc.value.code == "artifact_store_unavailable"
    assert blocker.read_bytes() == b"a file where the store directory should be"


def test_read_only_store_gives_store_unavailable() -> None:
    with small_tmpfs("1m") as mount_dir:
        store = ObjectStore(mount_dir)
        stored = store.put(b"before")
        subprocess.run(["mount", "-o", "remount,ro", mount_dir], check=True)
        with pytest.raises(StorageUnavailable) as exc:
            store.put(b"after")
        assert exc.value.code == "artifact_store_unavailable"
        assert store.verify(stored.digest) == "ok"  # reading still works


def test_disk_full_during_put_gives_store_full_and_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(4 * MiB))
    with small_tmpfs("2m") as mount_dir:
        store = ObjectStore(os.path.join(mount_dir, "store"))
        small = store.put(b"fits")
        for source in (src, src.read_bytes()):
            with pytest.raises(StorageUnavailable) as exc:
                store.put(source)
            assert exc.value.code == "artifact_store_full" and exc.value.exit_code == 6
            assert [d for d, _, _ in store.iter_objects()] == [small.digest]
            assert temp_files(store) == []
        # Space comes back as soon as the failed upload's bytes are gone.
        assert store.put(os.urandom(MiB)).created
        assert store.verify(small.digest) == "ok"


# --- concurrency ----------------------------------------------------------------------------


def _put_same_content(index: int, root: str, barrier: Any, queue: Any) -> None:
    data = random.Random(12).randbytes(16 * MiB)
    store = ObjectStore(root)
    barrier.wait()
    obj = store.put(data)
    queue.put((index, obj.digest, obj.created))


def test_concurrent_puts_of_the_same_content_store_one_object(store: ObjectStore) -> None:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_put_same_content, args=(i, store.root, barrier, queue))
             for i in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = sha256_of(random.Random(12).randbytes(16 * MiB))
    assert {digest for _, digest, _ in results} == {expected}
    assert sum(created for _, _, created in results) == 1  # link(2) lets exactly one win
    assert [d for d, _, _ in store.iter_objects()] == [expected]
    assert store.verify(expected) == "ok"
    assert temp_files(store) == []


# --- backups --------------------------------------------------------------------------------


def test_link_or_copy_into_hard_links_on_one_filesystem(store: ObjectStore,
                                                        tmp_path: Path) -> None:
    obj = store.put(os.urandom(MiB))
    backup = tmp_path / "backup #1 ☃"
    linked = store.link_or_copy_into(backup, obj.digest)
    assert linked.created and linked.digest == obj.digest
    assert os.stat(linked.path).st_ino == os.stat(obj.path).st_ino
    assert ObjectStore(backup).verify(obj.digest) == "ok"
    again = store.link_or_copy_into(backup, obj.digest)
    assert not again.created


def test_link_or_copy_into_copies_across_filesystems(store: ObjectStore) -> None:
    obj = store.put(os.urandom(MiB + 3))
    with small_tmpfs("4m") as mount_dir:
        copied = store.link_or_copy_into(mount_dir, obj.digest)
        assert copied.created
        assert os.stat(copied.path).st_dev != os.stat(obj.path).st_dev
        assert Path(copied.path).read_bytes() == Path(obj.path).read_bytes()
        assert ObjectStore(mount_dir).verify(obj.digest) == "ok"
        assert temp_files(ObjectStore(mount_dir)) == []


def test_link_or_copy_into_refuses_a_corrupt_or_missing_source(store: ObjectStore,
                                                               tmp_path: Path) -> None:
    bad = store.put(os.urandom(3 * MiB))
    flip_byte(bad.path, 5)
    gone = store.put(b"gone")
    os.unlink(gone.path)
    with small_tmpfs("8m") as mount_dir:
        for target in (str(tmp_path / "same-fs-backup"), mount_dir):
            for digest, code in ((bad.digest, "artifact_corrupt"),
                                 (gone.digest, "artifact_missing")):
                with pytest.raises(DatabaseCorrupt) as exc:
                    store.link_or_copy_into(target, digest)
                assert exc.value.code == code
            other = ObjectStore(target)
            assert list(other.iter_objects()) == [] and temp_files(other) == []


# --- names ----------------------------------------------------------------------------------


BAD_NAMES = {
    "empty": "",
    "dot": ".",
    "dotdot": "..",
    "slash": "a/b",
    "leading_slash": "/etc/passwd",
    "traversal": "../x",
    "backslash": "a\\b",
    "nul": "a\x00b",
    "newline": "report\n.pdf",
    "tab": "a\tb",
    "escape": "\x1b[31mred",
    "del": "a\x7f",
    "c1_control": "a\x85b",
    "too_long_ascii": "a" * 256,
    "too_long_utf8": "é" * 128,  # 256 bytes in UTF-8
    "lone_surrogate": "a\udc80b",
}


@pytest.mark.parametrize("case", sorted(BAD_NAMES))
def test_bad_artifact_names_are_refused(case: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        validate_name(BAD_NAMES[case])
    assert exc.value.code == "invalid_artifact_name" and exc.value.exit_code == 2
    json.dumps(exc.value.to_json())  # the error itself can be printed


def test_non_string_name_is_refused() -> None:
    for bad in (None, b"report.pdf", 7):
        with pytest.raises(InvalidInput):
            validate_name(bad)


@pytest.mark.parametrize("name", ["report.pdf", "rapport été.pdf", "日本語のレポート.txt",
                                  "emoji 👩‍💻.png", "a" * 255, "é" * 127 + "a", "..hidden",
                                  "...", ".env", "with space", "100%#?&.bin"])
def test_good_artifact_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name


def test_every_proof_named_in_docs_artifacts_exists() -> None:
    text = (REPO / "docs" / "artifacts.md").read_text()
    named = set(re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text))
    assert len(named) >= 15, "docs/artifacts.md names too few proofs"
    for path, test in sorted(named):
        source = (REPO / path).read_text()
        assert re.search(rf"^def {test}\(", source, re.M), f"{path}::{test} does not exist"


def test_puts_racing_to_make_a_new_store_never_take_its_directory_for_a_file(
        tmp_path: Path) -> None:
    """Puts beside each other into a store not made yet, some levels deep: one looked at a
    directory as missing, then as there, as another put made it, and refused the path as a
    file (`artifact_store_missing`) where there was none. Every put stores its object."""
    import threading

    for round_ in range(30):
        root = tmp_path / f"r{round_}" / "a" / "b" / "store"
        barrier = threading.Barrier(6)
        errors: list[BaseException] = []

        def put(i: int, root: Path = root, barrier: threading.Barrier = barrier,
                errors: list[BaseException] = errors) -> None:
            barrier.wait()
            try:
                ObjectStore(root).put(f"object {i}".encode())
            except BaseException as exc:  # every failure is the finding
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == [], (round_, errors)
        assert len(list(ObjectStore(root).iter_objects())) == 6
