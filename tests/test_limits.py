"""Concurrency limits: counted from live leases inside the claim, a limited job skipped (never
failed), an expired lease freeing its slot at once, per-key limits, `explain`'s words, and bad
input refused with nothing changed. SQLite and PostgreSQL, frozen clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from jobcoord.errors import InvalidInput, Refused
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC, at


def _workers(coord: Coordinator, *names: str) -> None:
    for w in names:
        coord.heartbeat(w, readings=IDLE_ON_AC)


def test_a_limited_job_is_skipped_and_the_next_eligible_job_is_claimed(coord, clock):
    coord.set_limit("llm", 1)
    _workers(coord, "w1", "w2")
    first = coord.enqueue("llm", {"n": 1}, priority=0)["job_id"]
    second = coord.enqueue("llm", {"n": 2}, priority=0)["job_id"]
    other = coord.enqueue("embed", {}, priority=3)["job_id"]
    assert coord.claim("w1")["job"]["job_id"] == first
    got = coord.claim("w2")
    assert got["job"]["job_id"] == other  # P3 behind the held P0: skipped past, not failed
    held = coord.show(second)
    assert held["job"]["status"] == "waiting" and held["job"]["attempts"] == 0
    nothing = coord.claim("w2")
    assert nothing["job"] is None and nothing["reason"] == "concurrency_limit"
    assert f"held by job {first} on w1" in nothing["detail"]


def test_a_limit_counts_live_leases_and_an_expired_lease_frees_its_slot_at_once(coord, clock):
    coord.set_limit("llm", 1)
    _workers(coord, "w1", "w2")
    a = coord.enqueue("llm", {})["job_id"]
    b = coord.enqueue("llm", {})["job_id"]
    assert coord.claim("w1", lease_s=10)["job"]["job_id"] == a
    clock.move_to(at(10) - timedelta(microseconds=1))  # live until t=10, as fencing says
    _workers(coord, "w2")
    assert coord.claim("w2")["reason"] == "concurrency_limit"
    clock.move_to(at(10))
    # Not reaped yet: the expired lease no longer holds the slot.
    assert coord.show(a)["job"]["status"] == "running"
    assert coord.claim("w2")["job"]["job_id"] == b


def test_a_slot_freed_by_an_expired_lease_is_never_given_back_when_the_clock_steps_back(
        coord, clock):
    """The claim that counted an expired lease's slot as free left the lease as it was: the
    clock stepped back, its worker renewed and completed it beside the new holder (limit 1,
    two running). The claim ends the expired lease it frees the slot of (as the reaper
    would), so the old epoch is refused whatever the clock does next."""
    coord.set_limit("llm", 1)
    _workers(coord, "w1", "w2")
    a = coord.enqueue("llm", {})["job_id"]
    b = coord.enqueue("llm", {})["job_id"]
    epoch = coord.claim("w1", lease_s=10)["lease"]["epoch"]
    clock.move_to(at(11))
    _workers(coord, "w2")
    assert coord.claim("w2", lease_s=30)["job"]["job_id"] == b
    shown = coord.show(a)
    assert shown["job"]["status"] == "waiting", shown["job"]
    assert shown["events"][-1]["reason"] == "lease_expired", shown["events"][-1]
    clock.move_to(at(5))  # the clock steps back: the old lease would look live again
    with pytest.raises(Refused):
        coord.renew(a, "w1", epoch, lease_s=30)
    with pytest.raises(Refused):
        coord.complete(a, "w1", epoch, {"ok": 1})
    (llm,) = coord.limits()["limits"]
    assert [h["job_id"] for h in llm["holders"]] == [b], llm


def test_a_finished_job_frees_its_slot(coord, clock):
    coord.set_limit("llm", 2)
    _workers(coord, "w1")
    ids = [coord.enqueue("llm", {})["job_id"] for _ in range(3)]
    leases = [coord.claim("w1") for _ in range(2)]
    assert coord.claim("w1")["reason"] == "concurrency_limit"
    coord.complete(ids[0], "w1", leases[0]["lease"]["epoch"], {})
    assert coord.claim("w1")["job"]["job_id"] == ids[2]


def test_a_keyed_limit_counts_per_value_of_the_payload_field(coord, clock):
    coord.set_limit("embed", 1, key="model")
    _workers(coord, "w1")
    small = [coord.enqueue("embed", {"model": "small", "i": i})["job_id"] for i in range(2)]
    large = coord.enqueue("embed", {"model": "large"})["job_id"]
    bare = coord.enqueue("embed", {"i": 9})["job_id"]
    taken = [coord.claim("w1")["job"] for _ in range(3)]
    assert [j["job_id"] for j in taken] == [small[0], large, bare]
    refused = coord.claim("w1")
    assert refused["reason"] == "concurrency_limit"
    assert 'model="small"' in refused["detail"]


def test_limit_set_replaces_ls_shows_holders_and_rm_lifts_it(coord, clock):
    assert coord.set_limit("llm", 1)["concurrency"] == 1
    replaced = coord.set_limit("llm", 3, key="model")
    assert (replaced["concurrency"], replaced["key"]) == (3, "model")
    assert [(x["kind"], x["concurrency"]) for x in coord.limits()["limits"]] == [("llm", 3)]
    _workers(coord, "w1")
    job = coord.enqueue("llm", {"model": "m"})["job_id"]
    coord.claim("w1")
    (shown,) = coord.limits()["limits"]
    assert shown["running"] == 1 and shown["holders"][0]["job_id"] == job
    assert shown["holders"][0]["key"] == '"m"'
    assert coord.remove_limit("llm") == {"kind": "llm", "removed": True}
    assert coord.limits() == {"limits": []}
    with pytest.raises(Refused) as e:
        coord.remove_limit("llm")
    assert e.value.code == "limit_not_found"


def test_explain_says_concurrency_limit_with_the_holders(coord, clock):
    coord.set_limit("llm", 1)
    _workers(coord, "w1", "w2")
    a = coord.enqueue("llm", {})["job_id"]
    b = coord.enqueue("llm", {})["job_id"]
    coord.claim("w1")
    out = coord.explain(b)
    assert out["claimable_now"] is False and out["ready_workers"] == []
    codes = [r["code"] for r in out["reasons"]]
    assert codes == ["concurrency_limit"]
    assert f"held by job {a} on w1" in out["reasons"][0]["detail"]
    assert out["limit"]["holders"][0]["job_id"] == a
    for w in ("w1", "w2"):
        coord.heartbeat(w, readings={**IDLE_ON_AC, "memory_used_pct": 99})
    gated = coord.explain(b)  # no worker may claim: the gates are said, the limit shown
    assert {r["code"] for r in gated["reasons"]} == {"memory_gate"}
    assert gated["limit"]["holders"][0]["job_id"] == a
    coord.remove_limit("llm")
    assert "limit" not in coord.explain(b)
    _workers(coord, "w1", "w2")
    assert coord.explain(b)["claimable_now"] is True


@pytest.mark.parametrize("args", [
    ("llm", 0), ("llm", -1), ("llm", "abc"), ("llm", 1.5), ("llm", True), ("llm", None),
    ("llm", 10**5000), ("llm", "9" * 5000), ("bad kind", 1), ("", 1), (5, 1)])
def test_a_bad_limit_is_refused_and_changes_nothing(coord, args: tuple[Any, Any]):
    coord.set_limit("keep", 2)
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.set_limit(*args)
    assert dump(coord) == before


@pytest.mark.parametrize("key", ["a.b", "", "x y", "1st", 5, ["model"], "m" * 200])
def test_a_limit_key_that_is_not_a_payload_field_name_is_refused(coord, key: Any):
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.set_limit("llm", 1, key=key)
    assert dump(coord) == before


def test_the_limit_commands_print_json_and_exit_with_their_codes(cli):
    ok = cli("limit", "set", "embed", "--concurrency", "4", "--key", "model", "--json")
    assert ok.code == 0 and ok.json["concurrency"] == 4 and ok.json["key"] == "model"
    ls = cli("limit", "ls", "--json")
    assert ls.code == 0 and ls.json["limits"][0]["kind"] == "embed"
    for bad in (["--concurrency", "0"], ["--concurrency", "-3"], ["--concurrency", "x"],
                ["--concurrency", "4", "--key", "a.b"], ["--concurrency", "1" * 40]):
        r = cli("limit", "set", "embed", *bad, "--json")
        assert r.code == 2 and r.json["error"]["code"] == "invalid_input", bad
    assert cli("limit", "ls", "--json").json == ls.json  # nothing changed
    missing = cli("limit", "rm", "nope", "--json")
    assert missing.code == 4 and missing.json["error"]["code"] == "limit_not_found"
    assert cli("limit", "rm", "embed").code == 0
    assert cli("limit", "ls").out.strip() == "no limits"


def test_a_claim_without_limits_or_needs_takes_the_one_step_path(coord, clock):
    """With no limit and no job declaring needs, the claim never reads the limits or the
    worker's capacity: the store's own take (one statement on PostgreSQL)."""
    _workers(coord, "w1")
    coord.enqueue("k", {})
    seen: list[str] = []
    from sqlalchemy import event

    def _watch(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(coord.db.write_engine, "before_cursor_execute", _watch)
    try:
        assert coord.claim("w1")["job"] is not None
    finally:
        event.remove(coord.db.write_engine, "before_cursor_execute", _watch)
    # Only the claim's first read names the new column (in its EXISTS probe); the checked
    # path would read every candidate's needs. PostgreSQL's one-statement take also names
    # it, only to leave alone a job with needs committed after that read (`IS NULL`).
    reads = [s for s in seen if "needs_json" in s and "needs_json IS NULL" not in s]
    assert len(reads) == 1, reads
    assert not [s for s in seen if "heartbeat_raw" in s]


def test_a_tenant_bound_claim_and_explain_name_no_other_tenants_holders(coord, clock):
    """Limits count every tenant's jobs, but a tenant-bound caller is told about its own
    tenant only: another tenant's job id and worker are not named in a refused claim's
    detail or in explain's holders, only counted."""
    coord.set_limit("llm", 2, key="model")
    _workers(coord, "bob-box", "alice-box")
    mine = coord.enqueue("llm", {"model": "m"}, tenant="alice")["job_id"]
    theirs = coord.enqueue("llm", {"model": "m"}, tenant="bob")["job_id"]
    assert coord.claim("alice-box", tenant="alice")["job"]["job_id"] == mine
    assert coord.claim("bob-box", tenant="bob")["job"]["job_id"] == theirs
    waiting = coord.enqueue("llm", {"model": "m"}, tenant="alice")["job_id"]
    refused = coord.claim("alice-box", tenant="alice")
    assert refused["reason"] == "concurrency_limit"
    assert f"job {mine} on alice-box" in refused["detail"]
    assert f"job {theirs}" not in refused["detail"] and "bob-box" not in refused["detail"]
    assert "1 job of another tenant" in refused["detail"]
    told = coord.explain(waiting, tenant="alice")
    assert [h["job_id"] for h in told["limit"]["holders"]] == [mine]
    assert told["limit"]["other_tenants_holding"] == 1
    assert "bob-box" not in str(told) and f"job {theirs}" not in str(told)
    # Unbound (the operator's view, every tenant's): every holder is named.
    everyone = coord.explain(waiting)
    assert [h["job_id"] for h in everyone["limit"]["holders"]] == [mine, theirs]
    assert f"job {theirs} on bob-box" in str(everyone)


#: More held jobs ahead of the eligible one than a claim reads in one statement (2,048), twice
#: over, so the claim must read on past several of its reads.
BACKLOG = 4200


@pytest.mark.parametrize("held", ["limit", "keyed_limit", "needs", "needs_all_different"])
def test_a_claim_never_answers_concurrency_limit_or_resource_short_while_an_eligible_job_exists(
        coord, clock, held: str):
    """However many held jobs come first in claim order, the claim (and a batch claim) takes
    the eligible job behind them, and says why nothing fits only once nothing does."""
    reason = "resource_short" if held.startswith("needs") else "concurrency_limit"
    coord.heartbeat("w1", readings={**IDLE_ON_AC, "memory_available_mb": 1000})
    coord.heartbeat("w2", readings={**IDLE_ON_AC, "memory_available_mb": 1000})
    if reason == "concurrency_limit":
        coord.set_limit("llm", 1, key="model" if held == "keyed_limit" else None)
        coord.enqueue("llm", {"model": "m"}, priority=0)
        assert coord.claim("w1")["job"]["kind"] == "llm"
    coord.enqueue_many([
        {"kind": "llm", "payload": {"model": "m", "i": i}, "priority": 0,
         "needs": ({"ram_mb": 64000 + (i if held == "needs_all_different" else 0)}
                   if reason == "resource_short" else None)}
        for i in range(BACKLOG)])
    behind = coord.enqueue("thumbnail", {}, priority=1)["job_id"]
    assert coord.explain(behind)["claimable_now"] is True
    got = coord.claim("w2")
    assert got["job"] is not None and got["job"]["job_id"] == behind, got
    batch = [coord.enqueue("thumbnail", {"n": n}, priority=3)["job_id"] for n in range(2)]
    many = coord.claim_many("w2", 5)
    assert [g["job"]["job_id"] for g in many["claimed"]] == batch, many["reason"]
    # A claim bound to kinds reads per kind, one bound to a tenant its tenant's: the same.
    for bound in ({"kinds": ["llm", "thumbnail"]}, {"tenant": "default"}):
        last = coord.enqueue("thumbnail", {"n": 9}, priority=3)["job_id"]
        got = coord.claim("w2", **bound)
        assert got["job"] is not None and got["job"]["job_id"] == last, (bound, got)
    # Now nothing else fits: the reason, never another job.
    refused = coord.claim("w2")
    assert refused["job"] is None and refused["reason"] == reason
    assert coord.claim_many("w2", 5)["reason"] == reason
    assert coord.status()["jobs"]["waiting"] == BACKLOG
