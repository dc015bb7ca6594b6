"""Wall time of one `jobcoord` command, as a shell loop pays it: a fresh interpreter, imports,
opening the database, one transaction, JSON out. Prints the median and p90 of `--runs`
invocations of `claim` and `complete`, next to the interpreter's own start-up and the bare
import of SQLAlchemy's engine (the floor any command that opens a database pays).

    python -m benchmarks.cli [--runs 30] [--importtime]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks._common import Scratch, conditions, median, ms, pct

# An installed package runs from cached bytecode (pip compiles it at install time). With
# PYTHONDONTWRITEBYTECODE set, every call of an editable checkout would compile jobcoord's
# modules again (about 30 ms here), which no installed copy pays: the children may write it.
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith("JOBCOORD_") and k != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: Sequence[str], expect: Sequence[int] = (0,)) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    elapsed = time.perf_counter() - t0
    if done.returncode not in expect:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr}")
    return elapsed, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--importtime", action="store_true",
                    help="also print the slowest imports of one `claim` (python -X importtime)")
    args = ap.parse_args()
    py = sys.executable
    print(conditions("full (the CLI default)", runs=args.runs,
                     bytecode="cached (written by a first warm-up call)"))
    print()
    with Scratch() as scratch:
        db = scratch.file("cli.db")
        jc = [py, "-m", "jobcoord", "--db", db]
        wall([*jc, "migrate"])
        wall([*jc, "enqueue", "summarize", "--payload", '{"doc": 1}'])
        for i in range(args.runs):
            wall([*jc, "enqueue", "summarize", "--payload", json.dumps({"doc": i})])
        wall([*jc, "heartbeat", "cli-worker"])
        rows: dict[str, list[float]] = {"python -c pass": [], "import sqlalchemy.engine": [],
                                        "jobcoord claim": [], "jobcoord complete": []}
        for _ in range(args.runs):
            rows["python -c pass"].append(wall([py, "-c", "pass"])[0])
            rows["import sqlalchemy.engine"].append(
                wall([py, "-c", "import sqlalchemy.engine"])[0])
            took, out = wall([*jc, "claim", "cli-worker", "--json"])
            rows["jobcoord claim"].append(took)
            got = json.loads(out)
            took, _ = wall([*jc, "complete", str(got["job"]["job_id"]), "--worker", "cli-worker",
                            "--epoch", str(got["lease"]["epoch"]), "--result", '{"ok": true}',
                            "--json"])
            rows["jobcoord complete"].append(took)
        print(f"{'invocation':<26} {'median ms':>10} {'p90 ms':>8}")
        for name, values in rows.items():
            print(f"{name:<26} {ms(median(values)):>10} {ms(pct(values, 90)):>8}")
        if args.importtime:
            done = subprocess.run([py, "-X", "importtime", *jc[1:], "claim", "cli-worker"],
                                  capture_output=True, text=True, env=ENV)
            lines = [ln for ln in done.stderr.splitlines() if ln.startswith("import time:")
                     and "|" in ln and not ln.split("|")[1].strip().startswith("cumulative")]
            top = sorted(lines, key=lambda ln: -int(ln.split("|")[1]))[:15]
            print("\nslowest imports of one claim (cumulative us):")
            for ln in top:
                _, cumulative, name = ln.split("|")
                print(f"  {int(cumulative):>9}  {name.rstrip()}")


if __name__ == "__main__":
    main()
