"""Presentation: the JSON shapes of jobs, leases, events, workers, gates and diagnoses, with
times as ISO 8601 text; the core hands over plain rows and numbers, the facade (and the HTTP
server next) answers with these."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import validate as v
from .clock import MICROS, iso
from .policy import GateDecision, Policy, Readings
from .validate import CHECKPOINT_DATA, EVENT_DETAIL, stored_json


def loads(text: str | None) -> Any:
    """Stored JSON text as a value (None kept)."""
    return None if text is None else v.loads(text)


def readings_json(r: Readings) -> dict[str, Any]:
    return {"memory_used_pct": r.memory_used_pct, "temperature_c": r.temperature_c,
            "on_battery": r.on_battery, "user_idle_s": r.user_idle_s}


def gates_json(g: GateDecision) -> dict[str, Any]:
    return {"can_claim": not g.blocks_all, "max_priority": g.max_priority,
            "background_allowed": g.max_priority >= 3,
            "refusal": None if g.refusal is None else {"reason": g.refusal[0],
                                                       "detail": g.refusal[1]}}


# --- the write operations' answers: the core's times (microseconds) as ISO text, in place --

#: The times each write operation's answer holds, by answer; each is said as ISO text.
ANSWER_TIMES: dict[str, tuple[str, ...]] = {
    "heartbeat": ("received_at",),
    "completed": ("finished_at",),
    "renewed": ("expires_at",),
    "checkpointed": ("saved_at",),
    "reaped": ("at",),
    "pruned": ("cutoff",),
    # add_schedule, pause_schedule, resume_schedule; and each schedule a tick moved on.
    "schedule_changed": ("next_fire_at",),
    "ticked": ("at",),
}


def times_as_iso(answer: dict[str, Any], name: str) -> dict[str, Any]:
    """The answer `name` (a key of ANSWER_TIMES) with its times as ISO text."""
    for field in ANSWER_TIMES[name]:
        answer[field] = iso(answer[field])
    return answer


def _shaper(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def shape(answer: dict[str, Any]) -> dict[str, Any]:
        return times_as_iso(answer, name)
    shape.__name__ = shape.__qualname__ = f"{name}_json"
    return shape


completed_json = _shaper("completed")
renewed_json = _shaper("renewed")
checkpointed_json = _shaper("checkpointed")
reaped_json = _shaper("reaped")
pruned_json = _shaper("pruned")
schedule_changed_json = _shaper("schedule_changed")


def heartbeat_json(answer: dict[str, Any]) -> dict[str, Any]:
    answer.update(readings=readings_json(answer["readings"]), gates=gates_json(answer["gates"]))
    return times_as_iso(answer, "heartbeat")


def claimed_json(answer: dict[str, Any]) -> dict[str, Any]:
    """A claim's answer (the lease's expiry and each checkpoint's time); a refusal as is."""
    if answer["job"] is not None:
        for point in answer["job"]["checkpoints"]:
            point["updated_at"] = iso(point["updated_at"])
        answer["lease"]["expires_at"] = iso(answer["lease"]["expires_at"])
    return answer


def completed_and_claimed_json(answer: dict[str, Any]) -> dict[str, Any]:
    completed_json(answer["completed"])
    claimed_json(answer["next"])
    return answer


def failed_json(answer: dict[str, Any]) -> dict[str, Any]:
    """A failure's answer: `run_after` only when the job will be retried."""
    if "run_after" in answer:
        answer["run_after"] = iso(answer["run_after"])
    return answer


def claimed_many_json(answer: dict[str, Any]) -> dict[str, Any]:
    """claim_many's answer: each claim's answer shaped like claim's."""
    for one in answer["claimed"]:
        claimed_json(one)
    return answer


def batch_json(answer: dict[str, Any], each: Callable[[dict[str, Any]], Any]
               ) -> dict[str, Any]:
    """complete_many's or fail_many's answer: each accepted item shaped by `each`
    (completed_json, failed_json); a refused one is already its error's JSON."""
    for result in answer["results"]:
        if "error" not in result:
            each(result)
    return answer


def ticked_json(answer: dict[str, Any]) -> dict[str, Any]:
    for s in answer["schedules"]:
        schedule_changed_json(s)
    return times_as_iso(answer, "ticked")


# --- the read operations' answers ------------------------------------------------------------


def job_json(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": job["job_id"], "tenant": job["tenant"], "kind": job["kind"],
        "role": job["required_role"], "priority": job["priority"], "status": job["status"],
        "payload": stored_json(job["payload_json"], job["job_id"], "payload_json"),
        "result": stored_json(job["result_json"], job["job_id"], "result_json"),
        "provenance": stored_json(job["provenance_json"], job["job_id"], "provenance_json"),
        "attempts": job["attempts"],
        "max_attempts": job["max_attempts"], "epoch": job["epoch"],
        "idempotency_key": job["idempotency_key"], "last_error": job["last_error"],
        "effect_started": bool(job["effect_started"]),
        "cancel_requested": bool(job["cancel_requested"]),
        "created_at": iso(job["created_at"]), "updated_at": iso(job["updated_at"]),
        "run_after": iso(job["run_after"]), "deadline_at": iso(job["deadline_at"]),
        "finished_at": iso(job["finished_at"]),
        # Declared resource needs ({"NAME": INT}), or None.
        "needs": stored_json(job.get("needs_json"), job["job_id"], "needs_json"),
    }


def explain_job(policy: Policy, job: dict[str, Any], ahead: int | None, lease: Any,
                workers: list[dict[str, Any]], now: int,
                gate_of: Callable[[dict[str, Any], int], tuple[GateDecision, float | None]],
                fit_of: Callable[[list[dict[str, Any]]], tuple[list[str], list[tuple[str, str]],
                                                                  Any]] | None = None,
                schedule: Mapping[str, Any] | None = None, viewer: str | None = None
                ) -> dict[str, Any]:
    """The diagnosis an operator would do by hand, in the seed's order: status, schedule,
    deadline, then the workers that could take it (role, kind, heartbeat, gates).

    A view bound to a tenant (`viewer`) names no worker from the workers table: a worker row
    carries no tenant, so any of them may be another tenant's. Ready workers are counted
    (`ready_count`, `ready_workers` empty) and a gated one is "a worker that could run it";
    a worker is named only through the tenant's own job (its lease, its limit holders)."""
    status = job["status"]
    reasons: list[dict[str, str]] = []

    def say(code: str, detail: str) -> None:
        reasons.append({"code": code, "detail": detail})

    out: dict[str, Any] = {"job_id": job["job_id"], "status": status,
                           "priority": job["priority"], "role": job["required_role"],
                           "kind": job["kind"]}
    if status == "running" and lease is None:
        # Never in one snapshot of a consistent database; said plainly rather than asserted.
        say("running", "running, but no lease was found for it (it is ending right now, or "
            "the database needs `jobcoord check`)")
    elif status == "running":
        left = (lease[2] - now) / MICROS
        say("running", f"leased to {lease[0]} at epoch {lease[1]}; the lease "
            + (f"expires in {left:.0f}s" if left > 0 else
               f"expired {-left:.0f}s ago and waits for the reaper"))
    elif status == "unknown":
        say("unknown", "its lease expired after an external effect had started; an operator "
            "must `jobcoord reconcile` it")
    elif status != "waiting":
        say(status, f"the job is {status}: final, nobody will pick it up")
    else:
        if job["run_after"] > now:
            say("scheduled", f"not due until {iso(job['run_after'])} (backoff or delay)")
        if job["deadline_at"] is not None and job["deadline_at"] <= now and schedule:
            say("window_missed", f"the window of its slot closed at {iso(job['deadline_at'])};"
                " the reaper will mark it dead (window_missed)")
        elif job["deadline_at"] is not None and job["deadline_at"] <= now:
            say("deadline_passed", "its deadline has passed; the reaper will mark it dead")
        # Only the schedule and the deadline stop every worker; a gated worker does not stop
        # another one that is ready.
        blocked = bool(reasons)
        role, kind, bg = job["required_role"], job["kind"], job["priority"]
        able = [w for w in workers if role is None or role in w["roles"]]
        if not able:
            say("no_matching_role", f"no worker has role {role!r}" if role is not None
                else "no worker has sent a heartbeat yet")
        handlers = [w for w in able if w["kinds"] is None or kind in w["kinds"]]
        if able and not handlers:
            say("no_handler", f"no worker{'' if role is None else f' with role {role!r}'} "
                f"has a handler for kind {kind!r}")
        ready = []
        for w in handlers:
            gate, _age = gate_of(w, now)
            if gate.max_priority >= bg:
                ready.append(w["worker_id"])
            elif gate.refusal is not None:
                who = (f"worker {w['worker_id']}" if viewer is None
                       else "a worker that could run it")
                say(gate.refusal[0], f"{who}: {gate.refusal[1]}")
        if handlers and not ready and not reasons:
            say("gated", "every worker that could run it is gated")
        if fit_of is not None:
            # A full limit holds it back on every worker; a resource on some. Said only
            # of workers the gates let claim it, the limit shown (with its holders) always.
            was_ready = bool(ready)
            ready, held_back, limit = fit_of([w for w in handlers if w["worker_id"] in ready])
            if limit is not None:
                out["limit"] = limit
            blocked = blocked or not ready
            for code, detail in held_back if was_ready else ():
                say(code, detail)
        out["ready_workers"] = ready if viewer is None else []
        out["ready_count"] = len(ready)
        out["jobs_ahead"] = ahead
        if ready and not blocked:
            say("eligible", f"{len(ready)} worker(s) can claim it now; {ahead} job(s) are "
                "ahead of it in the claim order")
    if schedule:
        out["schedule"] = job_schedule_json(schedule)
    out["claimable_now"] = any(r["code"] == "eligible" for r in reasons)
    out["reasons"] = reasons
    return out


def job_summary_json(r: Mapping[str, Any]) -> dict[str, Any]:
    """One line of `jobs`."""
    return {"job_id": r["job_id"], "tenant": r["tenant"], "kind": r["kind"],
            "role": r["required_role"], "priority": r["priority"], "status": r["status"],
            "attempts": r["attempts"], "max_attempts": r["max_attempts"], "epoch": r["epoch"],
            "created_at": iso(r["created_at"]), "updated_at": iso(r["updated_at"]),
            "run_after": iso(r["run_after"])}


def checkpoint_json(c: Sequence[Any], job_id: int) -> dict[str, Any]:
    """A checkpoint row (name, data_json, epoch, worker_id, updated_at)."""
    return {"name": c[0], "data": stored_json(c[1], job_id, CHECKPOINT_DATA), "epoch": c[2],
            "worker_id": c[3], "updated_at": iso(c[4])}


def show_json(got: Mapping[str, Any]) -> dict[str, Any]:
    """`show`: the job, its lease, every event, its checkpoints and artifacts."""
    lease = got["lease"]
    job_id = got["job"]["job_id"]
    return {
        "job": job_json(got["job"]),
        "lease": None if lease is None else {
            "worker_id": lease[0], "epoch": lease[1], "granted_at": iso(lease[2]),
            "expires_at": iso(lease[3])},
        "events": [
            {"event_id": e[0], "at": iso(e[1]), "from": e[2], "to": e[3],
             "reason": e[4], "worker_id": e[5], "epoch": e[6],
             "detail": stored_json(e[7], job_id, EVENT_DETAIL)}
            for e in got["events"]],
        "checkpoints": [checkpoint_json(c, job_id) for c in got["checkpoints"]],
        "artifacts": [
            {"name": a[0], "location": a[1], "digest": a[2], "size": a[3],
             "media_type": a[4], "state": a[5], "epoch": a[6]} for a in got["artifacts"]],
    }


def worker_json(w: Mapping[str, Any], gate: GateDecision, age: float | None, *,
                detail: bool = True) -> dict[str, Any]:
    """One worker of `workers`, with what its gates allow now; without `detail`, its last
    refusal's reason and time only (the detail may name any tenant's jobs)."""
    return {
        "worker_id": w["worker_id"], "roles": w["roles"], "kinds": w["kinds"],
        "heartbeat_age_s": None if age is None else round(age, 3),
        "heartbeat_at": iso(w["heartbeat_at"]), "heartbeat_raw": w["heartbeat_raw"],
        "readings": readings_json(w["readings"]), "gates": gates_json(gate),
        "last_refusal": None if w["last_refusal"] is None else {
            "reason": w["last_refusal"],
            "detail": w["last_refusal_detail"] if detail else None,
            "at": iso(w["last_refusal_at"])},
    }


# --- schedules ------------------------------------------------------------------------------


def _seconds(us: int | None) -> float | None:
    return None if us is None else us / MICROS


def fire_json(last: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A handled slot: when, what became of it, and its job's status now."""
    if last is None:
        return None
    return {"slot": iso(last["slot_at"]), "outcome": last["outcome"], "job_id": last["job_id"],
            "job_status": last["status"], "at": iso(last["at"]), "detail": loads(last["detail"])}


def _schedule_payload(s: Mapping[str, Any]) -> Any:
    """A schedule's stored payload; not an object (written outside jobcoord): exit 7 naming
    the schedule, as `check` does, never an internal error."""
    try:
        payload = v.loads(s["payload_json"])
    except ValueError:
        payload = None
    if type(payload) is not dict:
        from .errors import DatabaseCorrupt

        raise DatabaseCorrupt(
            "schedule_unreadable", f"schedule {s['name']}: its stored payload_json is not a "
            "JSON object (written outside jobcoord); `jobcoord check` lists every such "
            "schedule; remove it (`schedule rm`) and add it again", schedule=s["name"],
            column="payload_json")
    return payload


def schedule_json(s: Mapping[str, Any], last: Mapping[str, Any] | None) -> dict[str, Any]:
    """A schedule as `schedule ls` shows it: its timing and job, the next fire time (None
    while paused) and the last outcome."""
    from . import schema, stored

    stored.row(schema.schedules, s, f"schedule {s['name']}")
    if s["cron"] is None and s["every_us"] is None:
        from .errors import DatabaseCorrupt

        raise DatabaseCorrupt(
            "schedule_unreadable", f"schedule {s['name']}: it has neither a cron nor an "
            "interval (written outside jobcoord); remove it (`schedule rm`) and add it again",
            schedule=s["name"], column="cron")
    catchup = s["catchup"] if s["catchup"] != "all" else f"all:{s['catchup_max']}"
    return {
        "name": s["name"], "kind": s["kind"], "tenant": s["tenant"], "role": s["required_role"],
        "priority": s["priority"], "payload": _schedule_payload(s),
        "max_attempts": s["max_attempts"], "cron": s["cron"], "tz": s["tz"],
        "every_s": _seconds(s["every_us"]), "window_s": _seconds(s["window_us"]),
        "catchup": catchup, "overlap": s["overlap"], "paused": bool(s["paused"]),
        "next_fire_at": None if s["paused"] else iso(s["next_slot_at"]),
        "queued_slot": iso(s["queued_slot_at"]), "last": fire_json(last),
        "created_at": iso(s["created_at"]),
    }


def job_schedule_json(got: Mapping[str, Any]) -> dict[str, Any]:
    """For `explain` of a fired job: its schedule and slot, the window's end, the schedule's
    next fire time and last outcome."""
    s = got["schedule"]
    window = s["window_us"]
    return {"name": s["name"], "slot": iso(got["slot_at"]),
            "window_ends_at": None if window is None else iso(got["slot_at"] + window),
            "next_fire_at": None if s["paused"] else iso(s["next_slot_at"]),
            "paused": bool(s["paused"]), "last": fire_json(got["last"])}
