"""The demo's outcome: what every job and worker did, read back from the database and the
workers' logs, checked against what the demo promises, and its human rendering."""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from datetime import datetime
from typing import Any

from . import demo_limit, demo_schedule
from .artifacts import rules as artifact_rules


def last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def timestamp(iso_text: str) -> float:
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp()


def outcome(coord: Any, ids: list[int], workers: list[dict[str, Any]], logs: str,
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
            "remote": bool(w.get("remote")),
            "readings": w["readings"], "ran": dict(ran.get(w["id"], {})),
            "killed": killed is not None and killed["worker_id"] == w["id"],
            "gate_refusals": None if summary is None else summary.get("gate_refused"),
            "gates": _gate_decisions(os.path.join(logs, f"{w['id']}.log")),
        })
    gated = [w for w in out_workers if any(g["reason"] == "memory_gate" for g in w["gates"])]
    if not gated:
        problems.append("no worker was refused by the memory gate")
    if not any(w["ran"] for w in out_workers if w["remote"]):
        problems.append("the remote worker completed nothing over HTTP")
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
        if w.get("remote"):
            note += "  [remote: over HTTP with a token]"
        for g in w["gates"]:
            note += f"  [gate refused: {g['reason']}: {g['detail']}]"
        if w["gates"] and w["gate_refusals"]:
            note += f" ({w['gate_refusals']} claims refused)"
        lines.append(f"  {w['worker_id']:<12} {ran}{note}")
    rec = s["recovered_job"]
    if rec:
        lines.append(f"recovered job {rec['job_id']} (attempts {rec['attempts']}, now "
                     f"{rec['status']}):")
        t0 = timestamp(rec["events"][0]["at"])
        for e in rec["events"]:
            who = f" {e['worker_id']}" if e["worker_id"] else ""
            epoch = f" epoch {e['epoch']}" if e["epoch"] is not None else ""
            lines.append(f"  +{timestamp(e['at']) - t0:5.1f}s  {e['from'] or '-':>8} -> "
                         f"{e['to']:<9} {e['reason']}{who}{epoch}")
    lines.extend(demo_schedule.report(s))
    lines.extend(demo_limit.report(s))
    for problem in s["problems"]:
        lines.append(f"PROBLEM: {problem}")
    if s.get("artifact"):
        a = s["artifact"]
        lines.append(f"artifact of job {a['job_id']}: {a['name']} {a['digest']} ({a['size']} "
                     f"bytes); get it: jobcoord --db {shlex.quote(s['database'])} artifact get "
                     f"{a['job_id']} {shlex.quote(a['name'])} -o {shlex.quote(a['name'])}")
    server = s.get("server") or {}
    if server.get("url"):
        lines.append(f"served at {server['url']}; stopped "
                     + ("cleanly" if server.get("stopped_cleanly") else
                        f"with exit code {server.get('exit_code')}"))
    lines.append(f"done in {s['duration_s']}s. Explore the database:")
    # Quoted for a shell: a --dir with spaces, `#` or `?` must paste as the same path.
    db = shlex.quote(s["database"])
    job = rec["job_id"] if rec else 1
    for cmd in ("status", "jobs", f"show {job}", "workers", "limit ls"):
        lines.append(f"  jobcoord --db {db} {cmd}")
    lines.append(f"worker logs: {os.path.join(s['directory'], 'logs')}/")
    return lines
