"""The demo's schedule: one the workers fire on their own timers, watched and reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SCHEDULE = "digest-every-second"


def start(coord: Any, say: Callable[[str], None]) -> dict[str, Any]:
    """A schedule the workers fire on their own timers (they tick with their reaper)."""
    got = coord.add_schedule(SCHEDULE, "extract", every="1s", role="cpu", priority=0,
                             payload={"text": "scheduled digest of 2026-03-02", "seconds": 0.1},
                             window="20s", overlap="skip")
    say(f"added schedule {SCHEDULE}: extract every 1s on a cpu worker, window 20s, overlap "
        f"skip; next fire at {got['next_fire_at']} (the workers' ticks fire it)")
    return {"jobs": []}


def watch(coord: Any, scheduled: dict[str, Any], ids: list[int],
          say: Callable[[str], None]) -> None:
    """Once the schedule has fired, pause it and wait for the jobs it made like the rest."""
    if scheduled["jobs"]:
        return

    def fired() -> list[int]:
        return sorted(j["job_id"] for j in coord.jobs(kind="extract", limit=1000)["jobs"]
                      if j["job_id"] not in ids)

    if not fired():
        return
    coord.pause_schedule(SCHEDULE)
    # Every job it fired before the pause took hold (a second slot may have fired meanwhile).
    scheduled["jobs"] = fired()
    ids.extend(scheduled["jobs"])
    shown = coord.explain(scheduled["jobs"][0])["schedule"]
    say(f"schedule {SCHEDULE} fired job {scheduled['jobs'][0]} for slot {shown['slot']} "
        "(a worker's tick); paused it")


def outcome(coord: Any, scheduled: dict[str, Any], problems: list[str]
            ) -> dict[str, Any] | None:
    if not scheduled["jobs"]:
        problems.append(f"schedule {SCHEDULE} never fired")
        return None
    job_id = scheduled["jobs"][0]
    said = coord.explain(job_id)
    return {"name": SCHEDULE, "jobs": scheduled["jobs"], "status": said["status"],
            "explain": said.get("schedule")}


def report(s: dict[str, Any]) -> list[str]:
    sch = s.get("schedule")
    if not (sch and sch["explain"]):
        return []
    ex = sch["explain"]
    return [f"schedule {sch['name']} fired job {sch['jobs'][0]} ({sch['status']}); "
            f"explain says: slot {ex['slot']}, window ends {ex['window_ends_at']}, "
            f"last outcome {ex['last']['outcome']}, next fire "
            f"{ex['next_fire_at'] or 'none (paused)'}"]
