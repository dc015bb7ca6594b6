"""Artifact object store throughput: `put` and `copy_to` of a 1 MiB file (many repetitions,
each a distinct file) and of a 1 GiB file, beside `cp` + `sha256sum` of the same file in the
same run, and the peak resident memory of one process doing a 1 GiB put + copy_to.

`put` and `copy_to` each read, hash, write and fsync (the file and its directory); `cp` +
`sha256sum` copies without fsync and hashes the copy. A second yardstick adds `sync FILE`
(an fsync of the copy) between the two, the durable equivalent. Ratio = yardstick time /
jobcoord time (1.0 = as fast; the target is >= 0.8 against `cp` + `sha256sum`). The source
files are freshly written, so they are in the page cache for every contender alike.

    python -m benchmarks.artifacts [--small-reps 200] [--big-mib 1024] [--big-reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks._common import Scratch, conditions, median

MiB = 1 << 20

RSS_CHILD = r"""
import json, os, sys
from jobcoord.artifacts import ObjectStore
src, root, dest = sys.argv[1:4]
store = ObjectStore(root)

def hwm_kib():
    # Peak RSS of this process image. ru_maxrss is not used: it carries over the parent's
    # peak across fork + exec, which would hide any growth below the parent's size.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

before = hwm_kib()
obj = store.put(src)
store.copy_to(obj.digest, dest)
after = hwm_kib()
print(json.dumps({"before_kib": before, "peak_kib": after, "size": obj.size}))
"""


def write_random(path: str, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 4 * MiB)
            f.write(os.urandom(n))
            left -= n


def shell(*cmds: list[str]) -> None:
    for cmd in cmds:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def measure(scratch: Scratch, size: int, reps: int) -> dict[str, list[float]]:
    """Per repetition: put, copy_to, cp+sha256sum, cp+sync+sha256sum, in that order, each on
    a distinct source file for the small size (so every put creates its object)."""
    from jobcoord.artifacts import ObjectStore

    store = ObjectStore(scratch.file(f"store-{size}"))
    times: dict[str, list[float]] = {k: [] for k in ("put", "copy_to", "cp", "cp_sync")}
    sources = [scratch.file(f"src-{size}-{i}") for i in range(reps if size <= 64 * MiB else 1)]
    for src in sources:
        write_random(src, size)
    dest, plain, durable = (scratch.file(f"{n}-{size}") for n in ("dest", "cp", "cpsync"))
    for i in range(reps):
        src = sources[i % len(sources)]
        t0 = time.perf_counter()
        obj = store.put(src)
        t1 = time.perf_counter()
        store.copy_to(obj.digest, dest)
        t2 = time.perf_counter()
        shell(["cp", src, plain], ["sha256sum", plain])
        t3 = time.perf_counter()
        shell(["cp", src, durable], ["sync", durable], ["sha256sum", durable])
        t4 = time.perf_counter()
        assert obj.created, "each repetition must create its object"
        for key, seconds in (("put", t1 - t0), ("copy_to", t2 - t1), ("cp", t3 - t2),
                             ("cp_sync", t4 - t3)):
            times[key].append(seconds)
        for path in (dest, plain, durable):
            os.unlink(path)
        store.remove(obj.digest)
    return times


def peak_rss(scratch: Scratch, size: int) -> dict[str, int]:
    src = scratch.file("rss-src")
    write_random(src, size)
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, src, scratch.file("rss-store"),
                          scratch.file("rss-dest")], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small-reps", type=int, default=200)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--big-reps", type=int, default=3)
    args = ap.parse_args()
    print(conditions(None, chunk="1 MiB", small=f"1 MiB x {args.small_reps}",
                     big=f"{args.big_mib} MiB x {args.big_reps}"))
    print()
    header = (f"{'file':>8} {'op':>8} {'jobcoord MiB/s':>15} {'cp+sha256sum':>13} {'ratio':>6}"
              f" {'cp+sync+sha256sum':>18} {'ratio':>6}")
    print(header)
    with Scratch() as scratch:
        for label, size, reps in (("1 MiB", MiB, args.small_reps),
                                  (f"{args.big_mib} MiB", args.big_mib * MiB, args.big_reps)):
            t = measure(scratch, size, reps)
            mib = size / MiB
            for op in ("put", "copy_to"):
                ours, cp, cp_sync = median(t[op]), median(t["cp"]), median(t["cp_sync"])
                print(f"{label:>8} {op:>8} {mib / ours:>15.1f} {mib / cp:>13.1f} "
                      f"{cp / ours:>6.2f} {mib / cp_sync:>18.1f} {cp_sync / ours:>6.2f}",
                      flush=True)
        rss = peak_rss(scratch, args.big_mib * MiB)
    print()
    print(f"peak RSS of one process doing put + copy_to of {args.big_mib} MiB: "
          f"{rss['peak_kib'] / 1024:.1f} MiB (before the put: {rss['before_kib'] / 1024:.1f} "
          f"MiB, growth {(rss['peak_kib'] - rss['before_kib']) / 1024:.1f} MiB)")


if __name__ == "__main__":
    main()
