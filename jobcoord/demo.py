"""`jobcoord demo`: a small, real run of everything jobcoord promises, in about 15 seconds.

It creates a fresh SQLite database, enqueues a mixed workload (P0 user requests and P3
background jobs for two roles), starts five real worker processes with different roles and
readings, serves the database over HTTP (`jobcoord serve` on a free loopback port) to a sixth
worker that joins with a token as a remote machine would, SIGKILLs the worker running the
longest job in the middle of it, lets the other workers' reapers recover that job, lets the
workers' ticks fire a schedule, stops everything cleanly, and checks and prints the outcome.
The database stays behind to explore with `status`, `jobs`, `show`, `workers`.

The workers report simulated readings (`--readings-override`), so the outcome does not depend
on the machine running the demo; the machine's real readings are printed at the start.

This module is also the demo's handlers: `gpu_app`, `cpu_app` and `scanner_app` (Python) and,
run as `python -m jobcoord.demo index`, the command handler for background indexing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import demo_limit, demo_schedule
from .app import App, Context, Result
from .demo_report import last_line, outcome, report, timestamp

__all__ = ["cpu_app", "gpu_app", "report", "run_demo", "scanner_app"]

# --- the handlers ------------------------------------------------------------------------------

gpu_app = App()
cpu_app = App()
scanner_app = App()  # the remote worker's: a machine with a scanner, joined over HTTP
MODEL = {"model": "demo-summarizer", "model_version": "1.0", "quantization": "q4"}


@gpu_app.handler("summarize", role="gpu", timeout=30)
def summarize(payload: dict[str, Any], ctx: Context) -> Result:
    ctx.sleep(float(payload.get("seconds", 0.3)))  # stands in for the model call
    words = str(payload.get("text", "")).split()
    ctx.artifact("summary.md", f"# Summary\n\n{' '.join(words)}\n".encode(), "text/markdown")
    return Result({"summary": " ".join(words[:6]) + (" ..." if len(words) > 6 else ""),
                   "words": len(words)},
                  provenance={**MODEL, "settings": {"max_words": 6, "temperature": 0.0}})


@gpu_app.handler("embed", role="gpu", timeout=30)
def embed(payload: dict[str, Any], ctx: Context) -> Result:
    # Sleep in small steps: a lost lease or a cancellation stops the work within 0.1 s.
    end = time.monotonic() + float(payload.get("seconds", 0.4))
    while time.monotonic() < end:
        ctx.sleep(0.1)
    notes = str(payload.get("notes", ""))
    return Result({"vectors": max(1, len(notes) // 8), "dim": 384},
                  provenance={"model": "demo-embedder", "model_version": "0.3", "dim": 384})


@cpu_app.handler("extract", role="cpu", timeout=30)
def extract(payload: dict[str, Any], ctx: Context) -> Result:
    ctx.sleep(float(payload.get("seconds", 0.3)))
    text = str(payload.get("text", ""))
    return Result({"dates": [w for w in text.split() if w[:2] == "20" and w[:4].isdigit()]},
                  provenance={"extractor": "demo-regex", "version": "2"})


@scanner_app.handler("ocr", role="scanner", timeout=30)
def ocr(payload: dict[str, Any], ctx: Context) -> Result:
    ctx.sleep(float(payload.get("seconds", 0.2)))
    scan = str(payload.get("scan", ""))
    return Result({"scan": scan, "pages": 1 + len(scan) % 3},
                  provenance={"ocr": "demo-ocr", "version": "1.2"})


def index_command() -> int:
    """The command handler: payload JSON on stdin, a result envelope on stdout."""
    payload = json.load(sys.stdin)
    time.sleep(float(payload.get("seconds", 0.3)))
    folder = str(payload.get("folder", ""))
    print(json.dumps({"jobcoord_envelope": 1,
                      "result": {"folder": folder, "indexed": 10 + len(folder)},
                      "provenance": {"indexer": "demo-indexer", "version": "0.9",
                                     "attempt": os.environ.get("JOBCOORD_ATTEMPT")}}))
    return 0


# --- the workload and the workers -------------------------------------------------------------

LEASE_S = 2.0
LONG_JOB_S = 3.0
DEADLINE_S = 50.0


def _workload() -> list[dict[str, Any]]:
    docs = ["Quarterly report: revenue grew 12 percent while costs held flat",
            "Meeting notes from 2026-03-02 about the new onboarding flow",
            "Support ticket: the export button fails on large spreadsheets",
            "Draft blog post on running language models on home hardware",
            "Paper abstract: sparse attention for long context retrieval",
            "Email thread planning the 2026-05-18 offsite in Lisbon"]
    jobs: list[dict[str, Any]] = []
    for i, text in enumerate(docs):
        jobs.append({"kind": "summarize", "priority": 0, "role": "gpu",
                     "payload": {"text": text, "seconds": 0.3, "request": f"user-{i + 1}"}})
    for text in docs[:4]:
        jobs.append({"kind": "extract", "priority": 0, "role": "cpu",
                     "payload": {"text": text, "seconds": 0.25}})
    archives = ["notes/2023", "notes/2024", "notes/archive-all", "notes/2025", "journal",
                "bookmarks"]
    for name in archives:
        long = name == "notes/archive-all"
        jobs.append({"kind": "embed", "priority": 3, "role": "gpu",
                     "payload": {"notes": name, "seconds": LONG_JOB_S if long else 0.4,
                                 "long": long}})
    for name in ["photos/2024", "photos/2025", "downloads", "projects", "mail"]:
        jobs.append({"kind": "index", "priority": 3, "role": "cpu",
                     "payload": {"folder": name, "seconds": 0.25}})
    for name in ["receipt-0412.png", "contract-p1.png"]:
        jobs.append({"kind": "ocr", "priority": 0, "role": "scanner",
                     "payload": {"scan": name, "seconds": 0.2}})
    return jobs


def _workers() -> list[dict[str, Any]]:
    index = f"index={sys.executable} -m jobcoord.demo index"
    return [
        {"id": "desktop-gpu", "app": "gpu_app", "exec": None,
         "about": "desktop with a GPU, owner away",
         "readings": {"memory_used_pct": 41, "temperature_c": 62, "on_battery": False,
                      "user_idle_s": 1800}},
        {"id": "server-gpu", "app": "gpu_app", "exec": None,
         "about": "home server with a GPU, nobody logged in",
         "readings": {"memory_used_pct": 55, "temperature_c": 58, "on_battery": False,
                      "user_idle_s": 86400}},
        {"id": "server-cpu", "app": "cpu_app", "exec": index,
         "about": "home server, CPU only",
         "readings": {"memory_used_pct": 30, "temperature_c": 51, "on_battery": False,
                      "user_idle_s": 86400}},
        {"id": "desk-cpu", "app": "cpu_app", "exec": index,
         "about": "office PC in use: user requests only",
         "readings": {"memory_used_pct": 48, "temperature_c": 55, "on_battery": False,
                      "user_idle_s": 20}},
        {"id": "laptop", "app": "gpu_app", "exec": index,
         "about": "laptop low on memory, on battery",
         "readings": {"memory_used_pct": 92, "temperature_c": 71, "on_battery": True,
                      "user_idle_s": 5}},
        {"id": "study-pc", "app": "scanner_app", "exec": None, "remote": True,
         "about": "PC with a scanner, over HTTP with a worker token",
         "readings": {"memory_used_pct": 35, "temperature_c": 45, "on_battery": False,
                      "user_idle_s": 600}},
    ]


def _new_directory(directory: str | None) -> str:
    from .errors import InvalidInput

    if directory is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        base = f"jobcoord-demo-{stamp}"
        directory, n = base, 1
        while os.path.exists(directory):
            n += 1
            directory = f"{base}-{n}"
    if os.path.exists(os.path.join(directory, "jobcoord.db")):
        raise InvalidInput("invalid_input", f"{directory} already holds a demo database; "
                           "choose a new --dir (or remove it)")
    try:
        os.makedirs(os.path.join(directory, "logs"), exist_ok=True)
    except OSError as e:
        raise InvalidInput("invalid_input", f"cannot create {directory}: {e.strerror}"
                           ) from None
    return directory


def _spawn(argv: list[str], logs: str, name: str) -> subprocess.Popen[bytes]:
    """A child with stdout in logs/NAME.out and stderr in logs/NAME.log."""
    out = open(os.path.join(logs, f"{name}.out"), "wb")  # noqa: SIM115 - owned by the child
    err = open(os.path.join(logs, f"{name}.log"), "wb")  # noqa: SIM115
    # The demo's outcome must not depend on the user's settings (a policy with other limits).
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCOORD_")}
    try:
        return subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
    finally:
        out.close()
        err.close()


def _start_worker(w: dict[str, Any], db_path: str, logs: str,
                  server: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A local worker on the database file, or (w["remote"]) a remote one: the same runtime
    against `jobcoord serve` with a token, no database in sight."""
    if w.get("remote"):
        assert server is not None
        where = ["worker", "--server", server["url"], "--token-file", server["token_file"],
                 "--wait", "1"]
    else:
        where = ["--db", db_path, "worker", "--worker-id", w["id"], "--reap-every", "0.5",
                 "--poll", "0.2"]
    argv = [sys.executable, "-m", "jobcoord", *where, "--app", f"jobcoord.demo:{w['app']}",
            "--lease", str(LEASE_S), "--heartbeat-every", "1", "--grace", "2",
            "--log-format", "json", "--json", "--readings-override", json.dumps(w["readings"])]
    if w["exec"]:
        argv += ["--exec", w["exec"]]
    return _spawn(argv, logs, w["id"])


SERVER_START_S = 20.0


def _start_server(db_path: str, logs: str) -> subprocess.Popen[bytes]:
    """`jobcoord serve` on a free loopback port; its `listening` line names the URL."""
    return _spawn([sys.executable, "-m", "jobcoord", "--db", db_path, "serve", "--host",
                   "127.0.0.1", "--port", "0", "--reap-every", "0.5", "--poll", "0.1",
                   "--json"], logs, "server")


def _server_url(proc: subprocess.Popen[bytes], logs: str) -> str:
    """Wait for the server's `listening` line (InvalidInput if it never comes)."""
    from .errors import InvalidInput

    end = time.monotonic() + SERVER_START_S
    path = os.path.join(logs, "server.out")
    while time.monotonic() < end:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "listening":
                    return str(event["url"])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise InvalidInput("server_failed", "jobcoord serve did not start: "
                       + last_line(os.path.join(logs, "server.log")))


def _stop_server(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM: uvicorn finishes the requests in flight and exits."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 10
    for p in procs.values():
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# --- the run ------------------------------------------------------------------------------------


def run_demo(directory: str | None = None, *, echo: Callable[[str], None] | None = None
             ) -> dict[str, Any]:
    from .coordinator import Coordinator
    from .migrate import migrate
    from .readings import read_machine
    from .store import Database, resolve_target

    say = echo or (lambda _text: None)
    started = time.monotonic()
    directory = _new_directory(directory)
    db_path = os.path.abspath(os.path.join(directory, "jobcoord.db"))
    logs = os.path.join(directory, "logs")
    say(f"jobcoord demo: working in {directory}/ (database {db_path})")
    target = resolve_target(db=db_path)
    db = Database.open(target, create=True)
    try:
        migrate(db, add={"artifacts"})  # the summaries' rendered reports are artifacts
    finally:
        db.close()
    real = read_machine()
    say("this machine now: " + ", ".join(f"{k} {v}" for k, v in real.as_heartbeat().items())
        + " (the demo workers report the simulated readings below)")

    coord = Coordinator.open(target)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    killed: dict[str, Any] | None = None
    problems: list[str] = []
    # Started first: it imports the HTTP stack while the jobs are enqueued.
    server_proc = _start_server(db_path, logs)
    server: dict[str, Any] = {}
    try:
        workload = _workload()
        ids = [r["job_id"] for r in coord.enqueue_many(workload)]
        long_id = next(i for i, j in zip(ids, workload, strict=True) if j["payload"].get("long"))
        say(f"enqueued {len(ids)} jobs: P0 user requests (summarize on gpu, extract on cpu) "
            "and P3 background work (embed on gpu, index on cpu)")
        scheduled = demo_schedule.start(coord, say)
        workers = _workers()
        server = _serve(coord, server_proc, directory, logs, say)
        for w in workers:
            procs[w["id"]] = _start_worker(w, db_path, logs, server)
            say(f"started worker {w['id']:<12} pid {procs[w['id']].pid:<7} {w['about']}: "
                + json.dumps(w["readings"]))
        deadline = started + DEADLINE_S
        while time.monotonic() < deadline:
            crashed = [(name, p.returncode) for name, p in procs.items()
                       if p.poll() is not None and (killed is None or name != killed["worker_id"])]
            if server_proc.poll() is not None:
                crashed.append(("server", server_proc.returncode))
            if crashed:
                for name, code in crashed:
                    problems.append(f"worker {name} exited with code {code}: "
                                    + last_line(os.path.join(logs, f"{name}.log")))
                break
            counts = coord.status()["jobs"]
            demo_schedule.watch(coord, scheduled, ids, say)
            if killed is None:
                shown = coord.show(long_id)
                lease = shown["lease"]
                if lease is not None and shown["job"]["status"] == "running":
                    claimed_at = timestamp(shown["events"][-1]["at"])
                    # Kill in the middle of the job, not at its first instant.
                    if time.time() - claimed_at >= LONG_JOB_S / 3:
                        victim = lease["worker_id"]
                        os.kill(procs[victim].pid, signal.SIGKILL)
                        procs[victim].wait()
                        killed = {"worker_id": victim, "job_id": long_id,
                                  "epoch": lease["epoch"],
                                  "at_s": round(time.monotonic() - started, 1)}
                        say(f"SIGKILL worker {victim} at +{killed['at_s']}s while it runs job "
                            f"{long_id} (embed notes/archive-all, epoch {lease['epoch']}); its "
                            f"lease of {LEASE_S:g}s will run out and a reaper will recover it")
            if sum(counts[s] for s in ("succeeded", "dead", "cancelled")) == len(ids):
                break
            time.sleep(0.1)
        else:
            problems.append(f"not every job finished within {DEADLINE_S:g}s")
    finally:
        _stop(procs)  # the remote worker first, while the server still answers it
        server["exit_code"] = _stop_server(server_proc)
    # SIGTERM: serve finishes the requests in flight, says `stopped` and exits 0.
    server["stopped_cleanly"] = (server_proc.returncode == 0
                                 and '"stopped"' in last_line(os.path.join(logs, "server.out")))
    if server.get("url") and not server["stopped_cleanly"]:
        problems.append(f"jobcoord serve did not stop cleanly (exit code "
                        f"{server['exit_code']}): "
                        + last_line(os.path.join(logs, "server.log")))
    try:
        summary = outcome(coord, ids, workers, logs, killed, problems)
        summary["schedule"] = demo_schedule.outcome(coord, scheduled, summary["problems"])
        summary["limit"] = demo_limit.run(coord, say, summary["problems"])
    finally:
        coord.close()
    summary["server"] = server
    summary.update(directory=directory, database=db_path,
                   duration_s=round(time.monotonic() - started, 1))
    summary["ok"] = not summary["problems"]
    return summary


def _serve(coord: Any, proc: subprocess.Popen[bytes], directory: str, logs: str,
           say: Callable[[str], None]) -> dict[str, Any]:
    """The server's URL, and a worker token for the remote worker in a file only the user
    can read (the secret is shown nowhere else)."""
    from . import tokens

    url = _server_url(proc, logs)
    made = tokens.create(coord.db, "study-pc", "worker", worker="study-pc")
    token_file = os.path.join(directory, "study-pc.token")
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(made["token"] + "\n")
    say(f"serving the database at {url} (pid {proc.pid}); worker token 'study-pc' in "
        f"{token_file}")
    return {"url": url, "pid": proc.pid, "token_name": "study-pc", "token_file": token_file}


if __name__ == "__main__":
    if sys.argv[1:] == ["index"]:
        sys.exit(index_command())
    sys.exit("usage: python -m jobcoord.demo index   (the demo's command handler)")
