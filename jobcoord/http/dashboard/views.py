"""How the dashboard shows things: the templates, ages, cut payloads, gate words, worker
rows, the actions a job's status allows."""

from __future__ import annotations

import json
import os
from typing import Any

from ...states import FINAL_STATUSES
from ...text import visible_reordering

#: jobcoord/http, where templates/ and static/ live.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Payload and result text shown on the job page before it is cut.
SHOW_BYTES = 16 * 1024
POLL = "every 3s"


def templates() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
        autoescape=jinja2.select_autoescape(["html"]), finalize=_shown)
    env.filters["age"] = age
    env.filters["num"] = lambda n: f"{n:,}"
    env.globals["poll"] = POLL
    return env


def _shown(value: Any) -> Any:
    """Every value a page shows: data that would reorder the display (U+202E and its kin)
    is written as escapes, as the CLI's text output writes it; markup stays markup."""
    import markupsafe

    if isinstance(value, markupsafe.Markup):
        return markupsafe.Markup(visible_reordering(str(value)))
    if isinstance(value, str):
        return visible_reordering(value)
    return value


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def capped_text(value: Any) -> tuple[str, bool]:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text.encode()) <= SHOW_BYTES:
        return text, False
    return text.encode()[:SHOW_BYTES].decode("utf-8", "ignore"), True


def gate_text(gates: dict[str, Any]) -> str:
    """"on battery, P2/P3 held" -- the words of the refusal and what it holds back."""
    if gates["can_claim"] and gates["max_priority"] >= 3:
        return ""
    reason = gates.get("refusal") or {}
    words = reason.get("detail") or reason.get("reason") or "gated"
    if not gates["can_claim"]:
        return f"{words}: all work held"
    held = "/".join(f"P{p}" for p in range(gates["max_priority"] + 1, 4))
    return f"{words}, {held} held"


def worker_views(workers: list[dict[str, Any]], leases: dict[str, list[dict[str, Any]]],
                 max_age: float) -> list[dict[str, Any]]:
    out = []
    for w in workers:
        gates = w["gates"]
        verdicts = [{"priority": f"P{p}",
                     "ok": gates["can_claim"] and p <= gates["max_priority"]}
                    for p in range(4)]
        heartbeat_age = w["heartbeat_age_s"]
        out.append({**w, "online": heartbeat_age is not None and heartbeat_age <= max_age,
                    "gate_text": gate_text(gates), "verdicts": verdicts,
                    "leases": leases.get(w["worker_id"], [])})
    return out


def actions_for(status: str) -> list[str]:
    if status in ("waiting", "running"):
        return ["cancel"]
    if status == "unknown":
        return ["reconcile", "cancel"]
    if status in FINAL_STATUSES and status != "succeeded":
        return ["retry"]
    return []
