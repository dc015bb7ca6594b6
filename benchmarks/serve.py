"""`jobcoord serve` against the Python API, in one run, on SQLite (FULL durability):

  throughput  claim+complete with 4 worker processes through HTTP (each a RemoteCoordinator
              against one `jobcoord serve`) vs the same 4 processes through the Python API,
              each as two calls per job (complete, then claim), chained (the completion
              claims the next job: `claim_next`, `complete_and_claim`) and in batches
              (claim_many / complete_many of up to --batch jobs), and the ratios (target
              >= 0.5x), like for like and the remote worker's way vs the API's two calls,
              and the server's CPU per job over HTTP;
  pickup      latency from a submission to the handler's start with 8 idle workers
              long-polling (8 processes), each job submitted over HTTP while all 8 wait
              (target p50 <= 5 ms, p99 <= 50 ms on loopback). Measured twice: from the
              job's `created_at` (the time its submission's transaction read, before the
              commit and its fsync: the target's "from submit-commit", a bound above), and
              from just before the submission is sent (with the submission's own round
              trip, token check and transaction);
  memory      the server's resident memory and thread count idle, then with 200 idle
              long-polls open at once (10 s each), its CPU while they wait, and the refused
              claims recorded over them (each a write);
  threads     what the server's write path does without HTTP: 8 threads of one process
              sharing one Coordinator, chained claim+complete, with group commit (the writes
              queued at once share one transaction and one fsync) and with groups of one
              (each write commits alone, as before group commit), rounds interleaved.

    python -m benchmarks.serve [--jobs N] [--pickups N] [--batch N]
                               [--parts throughput,pickup,memory,threads]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import Scratch, conditions, migrated_sqlite, ms, pct, run_processes

READINGS = {"memory_used_pct": 10.0}


def _make_tokens(path: str, specs: list[tuple[str, str, str | None]]) -> list[str]:
    from jobcoord import tokens
    from jobcoord.service import Coordinator

    with Coordinator.open(path) as c:
        return [tokens.create(c.db, name, role, worker=worker)["token"]
                for name, role, worker in specs]


class Server:
    def __init__(self, path: str, *extra: str):
        from jobcoord.cli import cli

        module = "jobcoord" if "serve" in cli.commands else "jobcoord.http"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--db", path, "serve", "--port", "0", "--json",
             *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        event = json.loads(self.proc.stdout.readline())
        self.url = event["url"]

    def status(self) -> dict[str, int]:
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "Threads"):
                    out[key] = int(value.split()[0])
        return out

    def cpu_s(self) -> float:
        """The server process's CPU time so far (user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- throughput -------------------------------------------------------------------------------


def _batch_loop(c: Any, worker: str, batch: int, wait: dict[str, Any]) -> int:
    """claim_many up to `batch`, then complete_many of them, until nothing waits: the same
    loop through either coordinator (`wait`: the remote one's long-poll off)."""
    done = 0
    while True:
        got = c.claim_many(worker, batch, **wait)
        if not got["claimed"]:
            if got.get("reason") == "no_waiting_jobs":
                return done
            c.heartbeat(worker, readings=READINGS)
            continue
        answers = c.complete_many([
            {"job_id": g["job"]["job_id"], "worker_id": worker, "epoch": g["lease"]["epoch"],
             "result": {"ok": True}} for g in got["claimed"]])
        assert answers["refused"] == 0, answers
        done += len(got["claimed"])


def _api_worker(index: int, barrier: Any, queue: Any, path: str, mode: str,
                batch: int = 8) -> None:
    from jobcoord.service import Coordinator

    c = Coordinator.open(path)
    worker = f"api{index}"
    c.heartbeat(worker, readings=READINGS)
    barrier.wait()
    if mode == "batch":
        done = _batch_loop(c, worker, batch, {})
        c.close()
        queue.put({"index": index, "done": done})
        return
    done = 0
    got = c.claim(worker)
    while True:
        if got["job"] is None:
            if got.get("reason") == "no_waiting_jobs":
                break
            # A run slower than the heartbeat's age limit (a loaded machine): beat again.
            c.heartbeat(worker, readings=READINGS)
            got = c.claim(worker)
            continue
        job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
        if mode == "chained":  # one transaction per job: the completion claims the next one
            got = c.complete_and_claim(job, worker, epoch, {"ok": True})["next"]
        else:
            c.complete(job, worker, epoch, {"ok": True})
            got = c.claim(worker)
        done += 1
    c.close()
    queue.put({"index": index, "done": done})


def _http_worker(index: int, barrier: Any, queue: Any, url: str, secret: str,
                 mode: str, batch: int = 8) -> None:
    from jobcoord.http.client import RemoteCoordinator

    r = RemoteCoordinator(url, secret)
    r.heartbeat("-", readings=READINGS)
    barrier.wait()
    if mode == "batch":  # one request per claim of up to `batch`, one per group
        done = _batch_loop(r, "-", batch, {"wait": 0})
        r.close()
        queue.put({"index": index, "done": done})
        return
    done = 0
    got = r.claim("-", wait=0)
    while True:
        if got["job"] is None:
            if got.get("reason", "no_waiting_jobs") == "no_waiting_jobs":
                break
            r.heartbeat("-", readings=READINGS)  # as the API workers above
            got = r.claim("-", wait=0)
            continue
        job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
        if mode == "chained":  # one request per job: `claim_next` on the completion
            got = r.complete_and_claim(job, "-", epoch, {"ok": True})["next"]
        else:
            r.complete(job, "-", epoch, {"ok": True})
            got = r.claim("-", wait=0)
        done += 1
    r.close()
    queue.put({"index": index, "done": done})


def _fill(path: str, n: int) -> None:
    from jobcoord.service import Coordinator

    with Coordinator.open(path) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(n)])


MODES = ("two_calls", "chained", "batch")


def throughput(scratch: Scratch, jobs: int, procs: int = 4, batch: int = 8
               ) -> dict[str, float]:
    """Jobs per second of each way: the Python API and HTTP, each as two calls per job
    (complete, then claim), chained (the completion claims the next job) and in batches
    (claim_many of up to `batch`, then complete_many of them: `POST /v1/claims` with `n`
    and `POST /v1/completions` over HTTP)."""
    out = {}
    for mode in MODES:
        api_db = scratch.file(f"api-{mode}.db")
        migrated_sqlite(api_db, "full")
        _fill(api_db, jobs)
        api_s, api = run_processes(_api_worker, procs, (api_db, mode, batch))
        assert sum(r["done"] for r in api) == jobs
        out[f"api_{mode}"] = jobs / api_s

        http_db = scratch.file(f"http-{mode}.db")
        migrated_sqlite(http_db, "full")
        _fill(http_db, jobs)
        secrets = _make_tokens(http_db, [(f"w{i}", "worker", f"w{i}") for i in range(procs)])
        server = Server(http_db, "--reap-every", "0")
        try:
            cpu = server.cpu_s()
            http_s, http = run_processes(_http_worker_dispatch, procs,
                                         (server.url, secrets, mode, batch))
            cpu = server.cpu_s() - cpu
        finally:
            server.stop()
        assert sum(r["done"] for r in http) == jobs
        out[f"http_{mode}"] = jobs / http_s
        # The server's CPU per job: steadier than the ratio on a shared machine, where the
        # API's fsync-bound rate swings with other processes' disk writes.
        out[f"cpu_{mode}"] = cpu / jobs
    return out


def _http_worker_dispatch(index: int, barrier: Any, queue: Any, url: str,
                          secrets: list[str], mode: str, batch: int) -> None:
    _http_worker(index, barrier, queue, url, secrets[index], mode, batch)


# --- pickup latency ---------------------------------------------------------------------------


def _poller(index: int, barrier: Any, queue: Any, url: str, secrets: list[str],
            n: int) -> None:
    from jobcoord.http.client import RemoteCoordinator

    r = RemoteCoordinator(url, secrets[index])
    r.heartbeat("-", readings=READINGS)
    barrier.wait()
    latencies = []
    picked = []
    while True:
        got = r.claim("-", wait=30)
        if got["job"] is None:
            break
        started = time.time()  # the handler would start here
        payload = got["job"]["payload"]
        if payload.get("stop"):
            r.complete(got["job"]["job_id"], "-", got["lease"]["epoch"], {})
            break
        latencies.append(started - payload["t0"])
        picked.append((got["job"]["job_id"], started))
        r.complete(got["job"]["job_id"], "-", got["lease"]["epoch"], {})
    r.close()
    queue.put({"index": index, "latencies": latencies, "picked": picked})


def pickup(scratch: Scratch, n: int, workers: int = 8) -> tuple[list[float], list[float]]:
    """The latencies from each job's created_at, and from before its submission was sent."""
    import threading

    path = scratch.file("pickup.db")
    migrated_sqlite(path, "full")
    secrets = _make_tokens(path, [(f"w{i}", "worker", f"w{i}") for i in range(workers)])
    (sub,) = _make_tokens(path, [("sub", "submitter", None)])
    server = Server(path, "--reap-every", "0")
    result: dict[str, Any] = {}

    def run() -> None:
        result["out"] = run_processes(_poller, workers, (server.url, secrets, n))

    try:
        thread = threading.Thread(target=run)
        thread.start()
        import httpx

        with httpx.Client(base_url=server.url,
                          headers={"Authorization": f"Bearer {sub}"}) as http:
            time.sleep(2.0)  # every worker is waiting in its long-poll
            for _ in range(n):
                http.post("/v1/jobs", json={"kind": "k", "payload": {"t0": time.time()}})
                time.sleep(0.05)  # the worker completes and long-polls again
            for _ in range(workers):
                http.post("/v1/jobs", json={"kind": "k", "payload": {"stop": True}})
        thread.join(120)
    finally:
        server.stop()
    import sqlite3

    picked = dict(x for r in result["out"][1] for x in r["picked"])
    conn = sqlite3.connect(path)
    try:
        created = dict(conn.execute("SELECT job_id, created_at FROM jobs").fetchall())
    finally:
        conn.close()
    from_commit = [started - created[job] / 1e6 for job, started in picked.items()]
    return from_commit, [x for r in result["out"][1] for x in r["latencies"]]


# --- memory with 200 idle long-polls ------------------------------------------------------------


async def _idle_polls(url: str, secrets: list[str], server: Server) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 limits=httpx.Limits(max_connections=400)) as client:
        for secret in secrets:
            await client.post("/v1/heartbeat", json={"readings": READINGS},
                              headers={"Authorization": f"Bearer {secret}"})
        tasks = [asyncio.create_task(client.post(
            "/v1/claims", json={"wait": 10}, headers={"Authorization": f"Bearer {secret}"}))
            for secret in secrets]
        await asyncio.sleep(2)
        # The polls' steady state: every one waiting (its first claim made), none ending.
        cpu0, t0 = server.cpu_s(), time.monotonic()
        await asyncio.sleep(6)
        during: dict[str, Any] = {**server.status(),
                                  "cpu_pct": (server.cpu_s() - cpu0)
                                  / (time.monotonic() - t0) * 100}
        answers = await asyncio.gather(*tasks)
    assert all(a.status_code == 204 for a in answers), {a.status_code for a in answers}
    return during


def _refused_claims(path: str) -> int:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT coalesce(sum(n), 0) FROM claim_refusals").fetchone()[0])
    finally:
        conn.close()


def memory(scratch: Scratch, n: int = 200) -> dict[str, dict[str, Any]]:
    """The server's RSS and threads with `n` idle long-polls (10 s each), its CPU while they
    wait (from 2 s to 8 s), and the refused claims recorded over the polls (each a write;
    the polls' first and last claims are 2 per poll)."""
    path = scratch.file("memory.db")
    migrated_sqlite(path, "full")
    secrets = _make_tokens(path, [(f"w{i}", "worker", f"w{i}") for i in range(n)])
    server = Server(path, "--reap-every", "0")
    try:
        time.sleep(1)
        idle = server.status()
        during = asyncio.run(_idle_polls(server.url, secrets, server))
    finally:
        server.stop()
    during["refused_claims"] = _refused_claims(path)
    return {"idle": idle, "during": during}


# --- threads sharing one Coordinator: group commit on and off ------------------------------------


def _threads_round(path: str, jobs: int, threads: int, limit: int | None
                   ) -> tuple[float, float]:
    """Jobs/s of `threads` threads chaining complete_and_claim on one Coordinator, and the
    mean number of writes per commit."""
    import threading

    from jobcoord.service import Coordinator

    _fill(path, jobs)
    with Coordinator.open(path) as c:
        group = c.db._group  # type: ignore[attr-defined]
        if limit is not None:
            group.limit = limit
        start = threading.Barrier(threads + 1)
        done = [0] * threads

        def body(i: int) -> None:
            worker = f"t{i}"
            c.heartbeat(worker, readings=READINGS)
            start.wait()
            got = c.claim(worker)
            while got["job"] is not None:
                got = c.complete_and_claim(got["job"]["job_id"], worker,
                                           got["lease"]["epoch"], {"ok": True})["next"]
                done[i] += 1

        pool = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        groups0, calls0 = group.groups, group.calls
        start.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - t0
        assert sum(done) == jobs
        return jobs / elapsed, (group.calls - calls0) / max(1, group.groups - groups0)


def threads_part(scratch: Scratch, jobs: int, threads: int = 8, rounds: int = 3
                 ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"grouped": [], "alone": [], "grouped_size": [],
                                   "alone_size": []}
    for r in range(rounds):
        for name, limit in (("grouped", None), ("alone", 1)):
            path = scratch.file(f"threads-{name}-{r}.db")
            migrated_sqlite(path, "full")
            rate, size = _threads_round(path, jobs, threads, limit)
            out[name].append(rate)
            out[f"{name}_size"].append(size)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--pickups", type=int, default=300)
    parser.add_argument("--parts", default="throughput,pickup,memory,threads")
    parser.add_argument("--batch", type=int, default=8,
                        help="jobs per claim_many / complete_many in the batch mode")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    import fastapi
    import httpx
    import uvicorn

    print(conditions("full", fastapi=fastapi.__version__, uvicorn=uvicorn.__version__,
                     httpx=httpx.__version__))
    with Scratch() as scratch:
        if "throughput" in parts:
            _print_throughput(throughput(scratch, args.jobs, batch=args.batch), args.jobs,
                              args.batch)
        if "pickup" in parts:
            from_commit, lat = pickup(scratch, args.pickups)
            print(f"\npickup      {len(lat)} jobs, 8 idle long-polling workers, "
                  "submit -> handler (targets p50 <= 5 ms, p99 <= 50 ms)")
            for name, got in (("from created_at (in the commit)", from_commit),
                              ("from before the submit request", lat)):
                print(f"  {name:32} p50 {ms(pct(got, 50))} ms   p99 {ms(pct(got, 99))} ms"
                      f"   max {ms(max(got))} ms")
        if "memory" in parts:
            m = memory(scratch)
            print("\nmemory      server process, 200 idle long-polls")
            print(f"  idle        RSS {m['idle']['VmRSS'] / 1024:6.1f} MiB   threads "
                  f"{m['idle']['Threads']}")
            print(f"  200 polls   RSS {m['during']['VmRSS'] / 1024:6.1f} MiB   threads "
                  f"{m['during']['Threads']}   server CPU while they wait "
                  f"{m['during']['cpu_pct']:.1f} % of a core   refused claims recorded "
                  f"{m['during']['refused_claims']} (first and last: 400)")
        if "threads" in parts:
            import statistics

            g = threads_part(scratch, args.jobs)
            grouped, alone = statistics.median(g["grouped"]), statistics.median(g["alone"])
            print(f"\nthreads     {args.jobs} jobs, 8 threads sharing one Coordinator, chained "
                  f"claim+complete, {len(g['grouped'])} rounds each, interleaved (medians)")
            print(f"  group commit      {grouped:8.0f} jobs/s   "
                  f"{statistics.median(g['grouped_size']):.1f} writes per commit")
            print(f"  groups of one     {alone:8.0f} jobs/s   "
                  f"{statistics.median(g['alone_size']):.1f} writes per commit")
            print(f"  ratio {grouped / alone:.2f}x")


def _print_throughput(t: dict[str, float], jobs: int, batch: int) -> None:
    print(f"\nthroughput  {jobs} jobs, 4 processes, claim+complete")
    for name, what in (("two_calls", "complete, then claim"),
                       ("chained", "complete with claim_next / complete_and_claim"),
                       ("batch", f"claim_many / complete_many, up to {batch} per call")):
        print(f"  {what}")
        print(f"    Python API  {t[f'api_{name}']:8.0f} jobs/s")
        print(f"    HTTP        {t[f'http_{name}']:8.0f} jobs/s   ratio "
              f"{t[f'http_{name}'] / t[f'api_{name}']:.2f}x   server CPU "
              f"{ms(t[f'cpu_{name}'])} ms per job")
    print(f"  target >= 0.5x: chained like for like "
          f"{t['http_chained'] / t['api_chained']:.2f}x; batches like for like "
          f"{t['http_batch'] / t['api_batch']:.2f}x; the remote worker's way with several "
          f"slots (batches) vs the API's two calls {t['http_batch'] / t['api_two_calls']:.2f}x")


if __name__ == "__main__":
    main()
