"""The demo's concurrency limit: a second job held back with explain's words, then run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run(coord: Any, say: Callable[[str], None], problems: list[str]) -> dict[str, Any]:
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


def report(s: dict[str, Any]) -> list[str]:
    lim = s.get("limit")
    if not lim:
        return []
    return [f"limit {lim['kind']} --concurrency {lim['concurrency']}: job "
            f"{lim['held_back_job']} waited while job {lim['held_job']} ran "
            f"({lim['refusal']['reason']}), then ran once the slot was free"]
