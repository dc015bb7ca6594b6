"""Power cut: crash images taken while writers run, then damaged the way a power cut damages
them.

A crash image is the database file plus its -wal as they are on disk at one instant. Copying
them while a writer is active is not such an image (the copy itself tears pages), so every
writer is frozen with SIGSTOP for the copy and resumed after it.

A power cut can additionally lose or tear what was never synced. With synchronous=FULL every
commit syncs the WAL before `enqueue` returns, so only bytes after the last commit frame can
be lost: damaging that tail must keep every acknowledged job. Damage further back (but after
the frames already copied into the database file by a checkpoint, which were synced before
being copied) models what synchronous=NORMAL may lose: the image must still open as a
consistent earlier state, with no torn job.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import struct
import time
from pathlib import Path

import pytest

from jobcoord.db import Target
from tests.invariants import violations
from tests.procs import enqueue_writer

pytestmark = pytest.mark.timeout(300)

SPAWN = multiprocessing.get_context("spawn")
WAL_HEADER = 32
FRAME_HEADER = 24


def _checksum(data: bytes, big_endian: bool, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack((">" if big_endian else "<") + f"{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_layout(wal: bytes) -> tuple[int, int]:
    """(page size, byte offset just past the last valid commit frame), following SQLite's
    own rules: salts must match the header and the running checksum must agree."""
    magic, _version, page_size, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I",
                                                                           wal[:WAL_HEADER])
    assert magic in (0x377F0682, 0x377F0683)
    big = bool(magic & 1)
    s = _checksum(wal[:24], big, 0, 0)
    assert s == (c0, c1), "WAL header checksum"
    frame = FRAME_HEADER + page_size
    end_commit = WAL_HEADER
    pos = WAL_HEADER
    while pos + frame <= len(wal):
        _pgno, commit, fs1, fs2, f0, f1 = struct.unpack(">6I", wal[pos:pos + FRAME_HEADER])
        if (fs1, fs2) != (salt1, salt2):
            break
        s = _checksum(wal[pos:pos + 8], big, *s)
        s = _checksum(wal[pos + FRAME_HEADER:pos + frame], big, *s)
        if s != (f0, f1):
            break
        pos += frame
        if commit:
            end_commit = pos
    return page_size, end_commit


def backfilled(shm: bytes) -> int:
    """Frames a checkpoint may already have copied into the database file.

    WalCkptInfo.nBackfill (offset 96) is only advanced when a checkpoint finishes; while one
    is under way the database file already holds pages up to nBackfillAttempted (offset 128),
    which SQLite sets after syncing the WAL and before copying. A frozen image can catch a
    checkpoint half done, so the synced floor is the larger of the two."""
    if len(shm) < 132:
        return 0
    n_backfill = struct.unpack("=I", shm[96:100])[0]
    attempted = struct.unpack("=I", shm[128:132])[0]
    return int(max(n_backfill, attempted))


def frozen_image(writers: list[multiprocessing.process.BaseProcess], db: str, dest: Path,
                 ledgers: list[Path]) -> tuple[Path, bytes, set[int]]:
    """Freeze every writer, copy db and -wal (and read -shm), note the acknowledged jobs,
    resume. Returns (copied db path, -shm bytes, acknowledged job ids)."""
    for w in writers:
        assert w.pid is not None
        os.kill(w.pid, signal.SIGSTOP)
    try:
        time.sleep(0.05)  # a stopped process is stopped; this only lets the signal land
        shutil.copy(db, dest)
        if os.path.exists(db + "-wal"):
            shutil.copy(db + "-wal", str(dest) + "-wal")
        shm = Path(db + "-shm").read_bytes() if os.path.exists(db + "-shm") else b""
        acked = {int(x) for led in ledgers if led.exists()
                 for x in led.read_text().split()}
    finally:
        for w in writers:
            assert w.pid is not None
            os.kill(w.pid, signal.SIGCONT)
    return dest, shm, acked


def job_ids(path: Path) -> set[int]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT job_id FROM jobs")}
    finally:
        conn.close()


def damaged_copy(image: Path, dest: Path, offset: int, how: str, rng: random.Random) -> Path:
    shutil.copy(image, dest)
    wal = bytearray(Path(str(image) + "-wal").read_bytes())
    if how == "truncate":
        wal = wal[:offset]
    elif how == "scribble":
        n = min(64, max(1, len(wal) - offset))
        wal[offset:offset + n] = rng.randbytes(n)
    else:  # a torn, half-written frame after everything else
        wal += rng.randbytes(rng.randrange(1, 4096))
    Path(str(dest) + "-wal").write_bytes(bytes(wal))
    return dest


def test_frozen_images_and_damaged_wal_tails_keep_every_acknowledged_job(
        sqlite_target: Target, tmp_path: Path) -> None:
    path = sqlite_target.sqlite_path
    assert path is not None
    ledgers = [tmp_path / f"ledger{i}" for i in range(4)]
    writers = [SPAWN.Process(target=enqueue_writer, args=(path, str(led), "full"))
               for led in ledgers]
    for w in writers:
        w.start()
    # Start-up (a fresh interpreter each) can be slow on a loaded machine: wait until every
    # writer has acknowledged work before the first freeze.
    deadline = time.monotonic() + 120
    while not all(led.exists() and led.stat().st_size > 0 for led in ledgers):
        assert time.monotonic() < deadline, "the writers did not start"
        assert all(w.is_alive() for w in writers), "a writer died"
        time.sleep(0.1)
    rng = random.Random(20261129)
    lost_if_normal: list[int] = []
    images = 0
    try:
        for snap in range(3):
            time.sleep(1.0 + 0.5 * snap)
            image, shm, acked = frozen_image(writers, path, tmp_path / f"img{snap}.db",
                                             ledgers)
            assert acked, "the writers acknowledged nothing before the freeze"
            wal = Path(str(image) + "-wal").read_bytes()
            page_size, end_commit = wal_layout(wal)
            synced_floor = WAL_HEADER + backfilled(shm) * (FRAME_HEADER + page_size)

            # The crash image itself: a process crash at that instant.
            intact = tmp_path / f"intact{snap}.db"
            damaged = damaged_copy(image, intact, len(wal), "truncate", rng)
            assert violations(str(damaged)) == []
            assert acked <= job_ids(damaged)
            images += 1

            # Power cut, synchronous=FULL: only the unsynced tail can be lost or torn.
            for k in range(6):
                how = ("truncate", "scribble", "torn")[k % 3]
                offset = rng.randrange(end_commit, len(wal) + 1)
                if how == "scribble" and offset >= len(wal):
                    how = "torn"
                img = damaged_copy(image, tmp_path / f"tail{snap}_{k}.db", offset, how, rng)
                assert violations(str(img)) == [], (snap, k, how, offset)
                assert acked <= job_ids(img), (snap, k, how, offset)
                images += 1

            # Damage to synced commits (what synchronous=NORMAL can lose): an earlier,
            # consistent state; jobs are a prefix of the acknowledged ones.
            if end_commit > synced_floor:
                for k in range(6):
                    how = ("truncate", "scribble")[k % 2]
                    offset = rng.randrange(synced_floor, end_commit)
                    img = damaged_copy(image, tmp_path / f"deep{snap}_{k}.db", offset, how, rng)
                    assert violations(str(img)) == [], (snap, k, how, offset)
                    ids = job_ids(img)
                    assert ids == set(range(1, len(ids) + 1)), "not a prefix of the history"
                    lost_if_normal.append(len(acked - ids))
                    images += 1
    finally:
        for w in writers:
            w.kill()
            w.join(timeout=30)
    print(f"\npower cut: {images} images checked; deep damage lost "
          f"{lost_if_normal} acknowledged jobs per image (the synchronous=NORMAL risk)")
    assert images >= 3 * 7
