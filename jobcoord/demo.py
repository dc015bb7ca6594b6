"""`jobcoord demo`: a small, real run of everything jobcoord promises, in about 15 seconds.

It creates a fresh SQLite database, enqueues a mixed workload (P0 user requests and P3
background jobs for two roles), starts five real worker processes with different roles and
readings, SIGKILLs the worker running the longest job in the middle of it, lets the other
workers' reapers recover that job, and checks and prints the outcome. The database stays
behind to explore with `status`, `jobs`, `show`, `workers`.

The workers report simulated readings (`--readings-override`), so the outcome does not depend
on the machine running the demo; the machine's real readings are printed at the start.

This module is also the demo's handlers: `gpu_app` and `cpu_app` (Python) and, run as
`python -m jobcoord.demo index`, the command handler for background indexing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .app import App, Context, Result
from .artifacts import rules as artifact_rules

# --- the handlers ------------------------------------------------------------------------------

gpu_app = App()
cpu_app = App()
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


def _start_worker(w: dict[str, Any], db_path: str, logs: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "jobcoord", "--db", db_path, "worker",
            "--worker-id", w["id"], "--app", f"jobcoord.demo:{w['app']}",
            "--lease", str(LEASE_S), "--heartbeat-every", "1", "--reap-every", "0.5",
            "--poll", "0.2", "--grace", "2", "--log-format", "json", "--json",
            "--readings-override", json.dumps(w["readings"])]
    if w["exec"]:
        argv += ["--exec", w["exec"]]
    out = open(os.path.join(logs, f"{w['id']}.out"), "wb")  # noqa: SIM115 - owned by the child
    err = open(os.path.join(logs, f"{w['id']}.log"), "wb")  # noqa: SIM115
    # The demo's outcome must not depend on the user's settings (a policy with other limits).
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCOORD_")}
    try:
        return subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
    finally:
        out.close()
        err.close()


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
    try:
        workload = _workload()
        ids = [r["job_id"] for r in coord.enqueue_many(workload)]
        long_id = next(i for i, j in zip(ids, workload, strict=True) if j["payload"].get("long"))
        say(f"enqueued {len(ids)} jobs: P0 user requests (summarize on gpu, extract on cpu) "
            "and P3 background work (embed on gpu, index on cpu)")
        workers = _workers()
        for w in workers:
            procs[w["id"]] = _start_worker(w, db_path, logs)
            say(f"started worker {w['id']:<12} pid {procs[w['id']].pid:<7} {w['about']}: "
                + json.dumps(w["readings"]))
        deadline = started + DEADLINE_S
        while time.monotonic() < deadline:
            crashed = [(name, p.returncode) for name, p in procs.items()
                       if p.poll() is not None and (killed is None or name != killed["worker_id"])]
            if crashed:
                for name, code in crashed:
                    problems.append(f"worker {name} exited with code {code}: "
                                    + _last_line(os.path.join(logs, f"{name}.log")))
                break
            counts = coord.status()["jobs"]
            if killed is None:
                shown = coord.show(long_id)
                lease = shown["lease"]
                if lease is not None and shown["job"]["status"] == "running":
                    claimed_at = _at(shown["events"][-1]["at"])
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
        _stop(procs)
    try:
        summary = _summarize(coord, ids, workers, logs, killed, problems)
        summary["limit"] = demo_limit(coord, say, summary["problems"])
    finally:
        coord.close()
    summary.update(directory=directory, database=db_path,
                   duration_s=round(time.monotonic() - started, 1))
    summary["ok"] = not summary["problems"]
    return summary


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def _at(iso_text: str) -> float:
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp()


def demo_limit(coord: Any, say: Callable[[str], None], problems: list[str]) -> dict[str, Any]:
    """A concurrency limit holding a second job back: `limit set llm-70b --concurrency 1`,
    two workers claim, the second is refused with explain's words, then gets the job once
    the first finishes."""
    kind = "llm-70b"
    coord.set_limit(kind, 1)
    for w in ("desk-70b", "server-70b"):
        coord.heartbeat(w, kinds=[kind], readings={"memory_used_pct": 30, "on_battery": False,
                                                   "user_idle_s": 900})
    first, second = (coord.enqueue(kind, {"prompt": p})["job_id"] for p in ("a", "b"))
    say(f"limit set {kind} --concurrency 1; enqueued jobs {first} and {second} of that kind")
    held = coord.claim("desk-70b")
    refused = coord.claim("server-70b")
    reasons = coord.explain(second)["reasons"]
    say(f"desk-70b claimed job {held['job']['job_id']}; server-70b was refused: "
        f"{refused.get('reason')}: {refused.get('detail')}")
    for r in reasons:
        say(f"explain {second}: {r['code']}: {r['detail']}")
    coord.complete(held["job"]["job_id"], "desk-70b", held["lease"]["epoch"], {"ok": True})
    after = coord.claim("server-70b")
    say(f"desk-70b completed job {first}; server-70b then claimed job "
        f"{after['job'] and after['job']['job_id']}")
    if after["job"] is not None:
        coord.complete(after["job"]["job_id"], "server-70b", after["lease"]["epoch"], {})
    ok = (refused.get("reason") == "concurrency_limit" and held["job"]["job_id"] == first
          and [r["code"] for r in reasons] == ["concurrency_limit"]
          and after["job"] is not None and after["job"]["job_id"] == second)
    if not ok:
        problems.append("the concurrency limit did not hold the second job back")
    return {"kind": kind, "concurrency": 1, "held_job": first, "held_back_job": second,
            "refusal": {"reason": refused.get("reason"), "detail": refused.get("detail")},
            "explain": reasons, "claimed_after": after["job"] and after["job"]["job_id"]}


def _summarize(coord: Any, ids: list[int], workers: list[dict[str, Any]], logs: str,
               killed: dict[str, Any] | None, problems: list[str]) -> dict[str, Any]:
    ran: dict[str, Counter[str]] = {w["id"]: Counter() for w in workers}
    completions: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    refused_late = 0
    for job_id in ids:
        shown = coord.show(job_id)
        statuses[shown["job"]["status"]] += 1
        for e in shown["events"]:
            if e["reason"] == "completed":
                completions[job_id] += 1
                ran.setdefault(e["worker_id"], Counter())[shown["job"]["kind"]] += 1
            if e["reason"] == "complete_refused":
                refused_late += 1
    if statuses["succeeded"] != len(ids):
        problems.append(f"{statuses['succeeded']} of {len(ids)} jobs succeeded: "
                        f"{dict(statuses)}")
    twice = [j for j, n in completions.items() if n != 1]
    if twice:
        problems.append(f"jobs completed more than once: {twice}")
    recovered = None
    if killed is None:
        problems.append("no worker was killed: the long job never started")
    else:
        shown = coord.show(killed["job_id"])
        events = shown["events"]
        recovered = {"job_id": killed["job_id"], "status": shown["job"]["status"],
                     "attempts": shown["job"]["attempts"], "events": events,
                     "provenance": shown["job"]["provenance"]}
        if not any(e["reason"] == "lease_expired" for e in events):
            problems.append(f"job {killed['job_id']} was not recovered by a reaper")
        finisher = (shown["job"]["provenance"] or {}).get("worker")
        if finisher == killed["worker_id"]:
            problems.append("the killed worker's job was completed by the killed worker")
    by_worker = {w["worker_id"]: w for w in coord.workers()["workers"]}
    out_workers = []
    for w in workers:
        summary = _worker_summary(os.path.join(logs, f"{w['id']}.out"))
        info = by_worker.get(w["id"], {})
        out_workers.append({
            "worker_id": w["id"], "about": w["about"], "roles": info.get("roles"),
            "readings": w["readings"], "ran": dict(ran.get(w["id"], {})),
            "killed": killed is not None and killed["worker_id"] == w["id"],
            "gate_refusals": None if summary is None else summary.get("gate_refused"),
            "gates": _gate_decisions(os.path.join(logs, f"{w['id']}.log")),
        })
    gated = [w for w in out_workers if any(g["reason"] == "memory_gate" for g in w["gates"])]
    if not gated:
        problems.append("no worker was refused by the memory gate")
    return {"jobs": len(ids), "succeeded": statuses["succeeded"],
            "completed_exactly_once": not twice and len(completions) == len(ids),
            "late_results_refused": refused_late, "workers": out_workers, "killed": killed,
            "recovered_job": recovered, "problems": problems,
            "artifact": artifact_rules.first_accepted(coord, ids)}


def _gate_decisions(path: str) -> list[dict[str, str]]:
    """The distinct gate refusals a worker logged (its log is one JSON object a line)."""
    seen: list[dict[str, str]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") == "gate_refused":
                    item = {"reason": entry.get("reason"), "detail": entry.get("detail")}
                    if item not in seen:
                        seen.append(item)
    except OSError:
        pass
    return seen


def _worker_summary(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def report(s: dict[str, Any]) -> list[str]:
    lines = ["", "=== summary ==="]
    if s.get("killed"):
        lines.append(f"worker {s['killed']['worker_id']} was SIGKILLed at +{s['killed']['at_s']}s "
                     f"while running job {s['killed']['job_id']}")
    lines.append(f"{s['succeeded']}/{s['jobs']} jobs succeeded; each completed exactly once: "
                 f"{'yes' if s['completed_exactly_once'] else 'NO'}")
    lines.append("who ran what:")
    for w in s["workers"]:
        ran = ", ".join(f"{k} x{n}" for k, n in sorted(w["ran"].items())) or "nothing"
        note = ""
        if w["killed"]:
            note = "  [SIGKILLed mid-job]"
        for g in w["gates"]:
            note += f"  [gate refused: {g['reason']}: {g['detail']}]"
        if w["gates"] and w["gate_refusals"]:
            note += f" ({w['gate_refusals']} claims refused)"
        lines.append(f"  {w['worker_id']:<12} {ran}{note}")
    rec = s["recovered_job"]
    if rec:
        lines.append(f"recovered job {rec['job_id']} (attempts {rec['attempts']}, now "
                     f"{rec['status']}):")
        t0 = _at(rec["events"][0]["at"])
        for e in rec["events"]:
            who = f" {e['worker_id']}" if e["worker_id"] else ""
            epoch = f" epoch {e['epoch']}" if e["epoch"] is not None else ""
            lines.append(f"  +{_at(e['at']) - t0:5.1f}s  {e['from'] or '-':>8} -> "
                         f"{e['to']:<9} {e['reason']}{who}{epoch}")
    if s.get("limit"):
        lim = s["limit"]
        lines.append(f"limit {lim['kind']} --concurrency {lim['concurrency']}: job "
                     f"{lim['held_back_job']} waited while job {lim['held_job']} ran "
                     f"({lim['refusal']['reason']}), then ran once the slot was free")
    for problem in s["problems"]:
        lines.append(f"PROBLEM: {problem}")
    if s.get("artifact"):
        a = s["artifact"]
        lines.append(f"artifact of job {a['job_id']}: {a['name']} {a['digest']} ({a['size']} "
                     f"bytes); get it: jobcoord --db {s['database']} artifact get {a['job_id']} "
                     f"{a['name']} -o {a['name']}")
    lines.append(f"done in {s['duration_s']}s. Explore the database:")
    db = s["database"]
    job = rec["job_id"] if rec else 1
    for cmd in ("status", "jobs", f"show {job}", "workers", "limit ls"):
        lines.append(f"  jobcoord --db {db} {cmd}")
    lines.append(f"worker logs: {os.path.join(s['directory'], 'logs')}/")
    return lines


if __name__ == "__main__":
    if sys.argv[1:] == ["index"]:
        sys.exit(index_command())
    sys.exit("usage: python -m jobcoord.demo index   (the demo's command handler)")
