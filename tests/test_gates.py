"""Resource gates and claim refusals: each gate refuses with its own code, heartbeats are
stored exactly as received, bad readings change nothing, and `workers` and `explain` show
the gate decisions an operator needs. SQLite and PostgreSQL, frozen clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from jobcoord.policy import Policy
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.sql import sql
from tests.timeline import IDLE_ON_AC, at, iso_at


def worker_row(coord: Coordinator, worker: str) -> tuple[Any, ...] | None:
    row = coord.db.read(lambda conn: sql(
        conn, "SELECT heartbeat_raw, heartbeat_at FROM workers WHERE worker_id = :w",
        {"w": worker}).first())
    return None if row is None else tuple(row)


def readings(**overrides: Any) -> dict[str, Any]:
    return {**IDLE_ON_AC, **overrides}


def refusal(coord: Coordinator, worker: str = "w1") -> tuple[str, str]:
    got = coord.claim(worker)
    assert got["job"] is None, got
    return got["reason"], got["detail"]


# --- claim refusals, one code each -----------------------------------------------------------


def test_worker_without_a_heartbeat_is_refused_heartbeat_missing(coord, clock):
    coord.enqueue("work", {}, priority=0)
    assert refusal(coord, "ghost")[0] == "heartbeat_missing"


def test_heartbeat_older_than_the_freshness_limit_is_refused_heartbeat_stale(coord, clock):
    job_id = coord.enqueue("work", {}, priority=0)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    clock.move_to(at(60) + timedelta(microseconds=1))
    code, detail = refusal(coord)
    assert code == "heartbeat_stale" and "60" in detail
    clock.move_to(at(60))  # exactly at the limit is still fresh
    assert coord.claim("w1")["job"]["job_id"] == job_id


@pytest.mark.parametrize("memory,allowed", [(90, False), (85.01, False), (85, True), (0, True)])
def test_memory_gate_refuses_above_85_percent(coord, clock, memory, allowed):
    coord.enqueue("work", {}, priority=0)
    coord.heartbeat("w1", readings=readings(memory_used_pct=memory))
    got = coord.claim("w1")
    if allowed:
        assert got["job"] is not None
    else:
        assert got["job"] is None and got["reason"] == "memory_gate"


@pytest.mark.parametrize("temp,allowed", [(91, False), (90, True)])
def test_thermal_gate_refuses_above_the_temperature_limit(coord, clock, temp, allowed):
    coord.enqueue("work", {}, priority=0)
    coord.heartbeat("w1", readings=readings(temperature_c=temp))
    got = coord.claim("w1")
    assert (got["job"] is not None) == allowed
    if not allowed:
        assert got["reason"] == "thermal_gate" and "91" in got["detail"]


@pytest.mark.parametrize("gate,bad", [
    ("power_gate", {"on_battery": True}),
    ("user_active", {"user_idle_s": 10}),
])
def test_background_gates_hold_back_only_p2_and_p3(coord, clock, gate, bad):
    background = [coord.enqueue("learn", {}, priority=p)["job_id"] for p in (3, 2)]
    coord.heartbeat("w1", readings=readings(**bad))
    assert refusal(coord) == refusal(coord)  # stable, and nothing was taken
    assert refusal(coord)[0] == gate
    foreground = [coord.enqueue("ask", {}, priority=p)["job_id"] for p in (1, 0)]
    assert coord.claim("w1")["job"]["job_id"] == foreground[1]
    assert coord.claim("w1")["job"]["job_id"] == foreground[0]
    assert refusal(coord)[0] == gate
    # Once the machine is back on AC with an idle user, background work flows.
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert coord.claim("w1")["job"]["job_id"] == background[1]  # P2 before P3
    assert coord.claim("w1")["job"]["job_id"] == background[0]


def test_user_idle_exactly_at_the_threshold_allows_background_work(coord, clock):
    coord.enqueue("learn", {}, priority=3)
    coord.heartbeat("w1", readings=readings(user_idle_s=299.9))
    assert refusal(coord)[0] == "user_active"
    coord.heartbeat("w1", readings=readings(user_idle_s=300))
    assert coord.claim("w1")["job"] is not None


def test_memory_gate_is_checked_before_the_thermal_gate(coord, clock):
    coord.enqueue("work", {}, priority=0)
    coord.heartbeat("w1", readings=readings(memory_used_pct=95, temperature_c=99))
    assert refusal(coord)[0] == "memory_gate"


def test_worker_without_the_jobs_role_is_refused_no_matching_role(coord, clock):
    coord.enqueue("render", {}, role="gpu", priority=0)
    coord.heartbeat("w1", roles=["cpu"], readings=IDLE_ON_AC)
    code, detail = refusal(coord)
    assert code == "no_matching_role" and "cpu" in detail
    coord.heartbeat("w2", roles=["cpu", "gpu"], readings=IDLE_ON_AC)
    assert coord.claim("w2")["job"] is not None


def test_jobs_without_a_role_are_open_to_every_worker(coord, clock):
    job_id = coord.enqueue("anything", {}, priority=0)["job_id"]
    coord.heartbeat("w1", roles=["cpu"], readings=IDLE_ON_AC)
    assert coord.claim("w1")["job"]["job_id"] == job_id


def test_empty_queue_is_refused_no_waiting_jobs(coord, clock):
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert refusal(coord)[0] == "no_waiting_jobs"


def test_cli_claim_refusal_exits_3_with_the_reason(coord, cli, clock):
    coord.enqueue("work", {}, priority=0)
    coord.heartbeat("w1", readings=readings(memory_used_pct=90))
    r = cli("claim", "w1", "--json")
    assert r.code == 3
    assert r.json["job"] is None and r.json["reason"] == "memory_gate"
    assert "90" in r.json["detail"]


# --- unknown readings --------------------------------------------------------------------------


@pytest.mark.parametrize("given", [
    None,
    {},
    {"memory_used_pct": None, "temperature_c": None, "on_battery": None, "user_idle_s": None},
    {"memory_used_pct": "unknown", "temperature_c": "unknown", "on_battery": "unknown",
     "user_idle_s": "unknown"},
])
def test_unknown_readings_do_not_block_any_priority_by_default(coord, clock, given):
    job_id = coord.enqueue("learn", {}, priority=3)["job_id"]
    coord.heartbeat("w1", readings=given)
    assert coord.claim("w1")["job"]["job_id"] == job_id


def test_unknown_power_or_idle_can_be_made_to_block_background_work(coord, clock):
    strict = Coordinator(coord.db, Policy(unknown_blocks_background=True), verify=False)
    coord.enqueue("learn", {}, priority=3)
    strict.heartbeat("w1", readings={"memory_used_pct": 40})
    code, detail = refusal(strict)
    assert code == "power_gate" and "unknown" in detail
    strict.heartbeat("w1", readings={"on_battery": False})
    code, detail = refusal(strict)
    assert code == "user_active" and "unknown" in detail
    foreground = strict.enqueue("ask", {}, priority=0)["job_id"]
    assert strict.claim("w1")["job"]["job_id"] == foreground


# --- heartbeats ------------------------------------------------------------------------------


def test_heartbeat_stores_the_raw_readings_exactly_as_received_with_the_time(coord, cli, clock):
    raw = '{ "user_idle_s":  12 , "memory_used_pct": 40.50, "on_battery" : false }'
    clock.move_to(at(7.25))
    r = cli("heartbeat", "w1", "--role", "gpu", "--readings", raw, "--json")
    assert r.code == 0, r.out
    assert r.json["received_at"] == iso_at(7.25)
    assert r.json["readings"] == {"memory_used_pct": 40.5, "temperature_c": None,
                                  "on_battery": False, "user_idle_s": 12.0}
    stored_raw, stored_at = worker_row(coord, "w1")
    assert stored_raw == raw
    assert stored_at == int(at(7.25).timestamp() * 1_000_000)
    listed = coord.workers()["workers"][0]
    assert listed["heartbeat_raw"] == raw and listed["heartbeat_at"] == iso_at(7.25)
    assert listed["roles"] == ["gpu"]


def test_a_new_heartbeat_replaces_the_readings_and_roles(coord, clock):
    coord.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 95})
    clock.tick(5)
    coord.heartbeat("w1", roles=["cpu"], readings={"memory_used_pct": 10})
    (w,) = coord.workers()["workers"]
    assert w["roles"] == ["cpu"] and w["readings"]["memory_used_pct"] == 10
    assert w["heartbeat_age_s"] == 0 and w["gates"]["can_claim"] is True


@pytest.mark.parametrize("bad", [
    "{not json",
    '{"memory_used_pct": NaN}',
    '{"temperature_c": Infinity}',
    '{"memory_used_pct": 1e999}',
    '{"memory_used_pct": 101}',
    '{"memory_used_pct": -1}',
    '{"temperature_c": 500}',
    '{"user_idle_s": -5}',
    '{"gpu_load": 3}',
    '{"memory_used_pct": "high"}',
    '{"memory_used_pct": true}',
    '{"on_battery": "yes"}',
    '{"on_battery": 1}',
    '{"memory_used_pct": 40, "memory_used_pct": 50}',
    "[40]",
    '"memory"',
    "",
])
def test_invalid_readings_exit_2_and_store_nothing(coord, cli, clock, bad):
    coord.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 20})
    before = dump(coord)
    clock.tick(1)
    for worker in ("w1", "w-new"):
        r = cli("heartbeat", worker, "--role", "cpu", "--readings", bad, "--json")
        assert r.code == 2, (bad, r.out)
        assert r.json["error"]["code"] == "invalid_input"
        assert "readings" in r.json["error"]["message"]
        assert "Traceback" not in r.err
    assert dump(coord) == before


# --- workers: gate decisions and the last refusal ------------------------------------------------


GATED = {
    "hot": ({"temperature_c": 95}, "thermal_gate", False),
    "battery": ({"on_battery": True}, "power_gate", True),
    "busy_user": ({"user_idle_s": 1}, "user_active", True),
    "full": ({"memory_used_pct": 99}, "memory_gate", False),
}


def test_workers_shows_each_gate_decision_and_the_last_refusal(coord, cli, clock):
    coord.enqueue("learn", {}, priority=3)
    coord.heartbeat("old", readings=IDLE_ON_AC)
    clock.move_to(at(30))
    coord.heartbeat("fine", readings=IDLE_ON_AC)
    for name, (bad, _, _) in GATED.items():
        coord.heartbeat(name, readings=readings(**bad))
    clock.move_to(at(61))  # "old" is 61 s old, the others 31 s
    for name in (*GATED, "old"):
        assert coord.claim(name)["job"] is None

    listed = {w["worker_id"]: w for w in cli("workers", "--json").json["workers"]}
    assert set(listed) == {"old", "fine", *GATED}
    for name, (_, code, foreground_ok) in GATED.items():
        w = listed[name]
        assert w["gates"]["refusal"]["reason"] == code
        assert w["gates"]["can_claim"] is foreground_ok
        assert w["gates"]["background_allowed"] is False
        assert w["last_refusal"]["reason"] == code
        assert w["last_refusal"]["at"] == iso_at(61)
        assert w["heartbeat_age_s"] == 31
    old = listed["old"]
    assert old["gates"]["can_claim"] is False
    assert old["gates"]["refusal"]["reason"] == "heartbeat_stale"
    assert old["last_refusal"]["reason"] == "heartbeat_stale"
    assert old["heartbeat_age_s"] == 61
    fine = listed["fine"]
    assert fine["gates"] == {"can_claim": True, "max_priority": 3, "background_allowed": True,
                             "refusal": None}
    assert fine["last_refusal"] is None
    assert coord.claim("fine")["job"] is not None


# --- explain -------------------------------------------------------------------------------------


def codes(coord: Coordinator, job_id: int) -> list[str]:
    return [r["code"] for r in coord.explain(job_id)["reasons"]]


def test_explain_says_when_no_worker_has_the_role(coord, clock):
    job_id = coord.enqueue("render", {}, role="gpu", priority=0)["job_id"]
    coord.heartbeat("w1", roles=["cpu"], readings=IDLE_ON_AC)
    out = coord.explain(job_id)
    assert codes(coord, job_id) == ["no_matching_role"]
    assert out["claimable_now"] is False and out["ready_workers"] == []


def test_explain_says_when_no_worker_exists_at_all(coord, clock):
    job_id = coord.enqueue("anything", {}, priority=0)["job_id"]
    (reason,) = coord.explain(job_id)["reasons"]
    assert reason == {"code": "no_matching_role", "detail": "no worker has sent a heartbeat yet"}


def test_explain_says_when_no_worker_has_a_handler_for_the_kind(coord, clock):
    job_id = coord.enqueue("render", {}, role="gpu", priority=0)["job_id"]
    coord.heartbeat("w1", roles=["gpu"], kinds=["summarize"], readings=IDLE_ON_AC)
    assert codes(coord, job_id) == ["no_handler"]
    got = coord.claim("w1")
    assert got["job"] is None


def test_explain_of_a_job_without_a_role_never_names_a_role_none(coord, clock):
    """A job that needs no role, with no worker handling its kind, was explained as "no
    worker with role None has a handler", as if it needed a role called None."""
    job_id = coord.enqueue("render", {}, priority=0)["job_id"]
    coord.heartbeat("w1", kinds=["summarize"], readings=IDLE_ON_AC)
    (reason,) = coord.explain(job_id)["reasons"]
    assert reason == {"code": "no_handler", "detail": "no worker has a handler for kind "
                      "'render'"}, reason


def test_explain_names_every_gated_worker_and_its_gate(coord, clock):
    job_id = coord.enqueue("learn", {}, priority=3)["job_id"]
    for name, (bad, _, _) in GATED.items():
        coord.heartbeat(name, readings=readings(**bad))
    out = coord.explain(job_id)
    found = {(r["code"], r["detail"].split(":")[0]) for r in out["reasons"]}
    assert found == {(code, f"worker {name}") for name, (_, code, _) in GATED.items()}
    assert out["claimable_now"] is False
    # A P0 job is held back only by the gates that stop all claims.
    p0 = coord.enqueue("ask", {}, priority=0)["job_id"]
    out = coord.explain(p0)
    assert sorted(out["ready_workers"]) == ["battery", "busy_user"]
    assert out["claimable_now"] is True


def test_explain_says_when_the_workers_heartbeat_is_stale(coord, clock):
    job_id = coord.enqueue("work", {}, priority=0)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    clock.move_to(at(120))
    out = coord.explain(job_id)
    assert codes(coord, job_id) == ["heartbeat_stale"]
    assert "w1" in out["reasons"][0]["detail"] and "120" in out["reasons"][0]["detail"]


def test_explain_says_when_run_after_is_in_the_future(coord, clock):
    job_id = coord.enqueue("work", {}, priority=0, delay_s=90)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    out = coord.explain(job_id)
    assert codes(coord, job_id) == ["scheduled"]
    assert iso_at(90) in out["reasons"][0]["detail"]
    assert out["claimable_now"] is False
    assert coord.claim("w1")["job"] is None


def test_explain_says_when_the_deadline_has_passed(coord, clock):
    job_id = coord.enqueue("work", {}, priority=0, deadline_s=10)["job_id"]
    clock.move_to(at(10))
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert "deadline_passed" in codes(coord, job_id)
    assert coord.explain(job_id)["claimable_now"] is False
    assert coord.claim("w1")["job"] is None


def test_explain_of_an_eligible_job_counts_the_jobs_ahead(coord, cli, clock):
    ahead = [coord.enqueue("work", {}, priority=0)["job_id"] for _ in range(2)]
    clock.tick(1)
    job_id = coord.enqueue("work", {}, priority=1)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    out = cli("explain", str(job_id), "--json").json
    assert out["claimable_now"] is True and out["jobs_ahead"] == len(ahead)
    assert [r["code"] for r in out["reasons"]] == ["eligible"]
    assert out["ready_workers"] == ["w1"]


def test_explain_of_a_running_job_names_the_lease_holder(coord, clock):
    job_id = coord.enqueue("work", {}, priority=0)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.claim("w1", lease_s=45)
    clock.tick(50)
    (reason,) = coord.explain(job_id)["reasons"]
    assert reason["code"] == "running"
    assert "w1" in reason["detail"] and "expired" in reason["detail"]


# --- the claim order ------------------------------------------------------------------------------


def test_claim_order_is_priority_then_age_across_the_workers_roles(coord, clock):
    # Jobs for the worker's two roles and for no role compete in one order.
    p3_any = coord.enqueue("learn", {}, priority=3)["job_id"]
    clock.tick(1)
    p1_cpu = coord.enqueue("ask", {}, priority=1, role="cpu")["job_id"]
    clock.tick(1)
    p0_gpu_new = coord.enqueue("ask", {}, priority=0, role="gpu")["job_id"]
    p1_any = coord.enqueue("ask", {}, priority=1)["job_id"]
    clock.tick(1)
    p1_cpu_newer = coord.enqueue("ask", {}, priority=1, role="cpu")["job_id"]
    clock.tick(-5)  # an older P0 job enqueued "earlier": age decides within a priority
    p0_cpu_old = coord.enqueue("ask", {}, priority=0, role="cpu")["job_id"]
    clock.tick(10)
    coord.heartbeat("w1", roles=["cpu", "gpu"], readings=IDLE_ON_AC)
    order = [coord.claim("w1")["job"]["job_id"] for _ in range(6)]
    assert order == [p0_cpu_old, p0_gpu_new, p1_cpu, p1_any, p1_cpu_newer, p3_any]
