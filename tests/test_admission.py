"""Admission: idempotent submission, payload rules and limits, all-or-nothing batches, and
tenant isolation, through the Python API and the CLI, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.errors import InvalidInput, Refused
from jobcoord.service import Coordinator, JobSpec
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC


def payload_of_size(n: int) -> str:
    """A JSON object whose canonical (stored) text is exactly n bytes."""
    text = '{"a":""}'
    body = "x" * (n - len(text))
    out = '{"a":"' + body + '"}'
    assert len(out.encode()) == n
    return out


# --- idempotency ------------------------------------------------------------------------------


def test_same_tenant_key_and_payload_returns_the_same_job(coord, cli):
    r1 = cli("enqueue", "summarize", "--payload", '{"doc": 1, "lang": "en"}', "--key", "k1",
             "--json")
    assert r1.code == 0, r1.err
    assert r1.json["created"] is True
    # Key order and spacing do not make a payload different.
    r2 = cli("enqueue", "summarize", "--payload", '{"lang":"en","doc":1}', "--key", "k1",
             "--json")
    assert r2.code == 0, r2.err
    assert r2.json == {"job_id": r1.json["job_id"], "created": False}
    assert len(coord.jobs()["jobs"]) == 1
    events = coord.show(r1.json["job_id"])["events"]
    assert [e["reason"] for e in events] == ["enqueued"]


def test_same_key_with_a_different_payload_is_an_idempotency_conflict(coord, cli):
    first = coord.enqueue("summarize", {"doc": 1}, key="k1")
    before = dump(coord)
    r = cli("enqueue", "summarize", "--payload", '{"doc": 2}', "--key", "k1", "--json")
    assert r.code == 4
    assert r.json["error"]["code"] == "idempotency_conflict"
    assert "k1" in r.json["error"]["message"]
    assert dump(coord) == before
    # A different kind under the same key is the same conflict.
    with pytest.raises(Refused) as caught:
        coord.enqueue("translate", {"doc": 1}, key="k1")
    assert caught.value.code == "idempotency_conflict"
    assert caught.value.details["job_id"] == first["job_id"]
    assert dump(coord) == before


def test_same_key_in_another_tenant_is_a_new_job(coord, cli):
    a = cli("enqueue", "summarize", "--payload", '{"doc": 1}', "--key", "k1", "--tenant", "A",
            "--json").json
    b = cli("enqueue", "summarize", "--payload", '{"doc": 2}', "--key", "k1", "--tenant", "B",
            "--json").json
    assert a["created"] and b["created"] and a["job_id"] != b["job_id"]
    assert coord.show(b["job_id"])["job"]["tenant"] == "B"
    assert coord.show(b["job_id"])["job"]["payload"] == {"doc": 2}


def test_jobs_without_a_key_are_never_merged(coord):
    ids = {coord.enqueue("summarize", {"doc": 1})["job_id"] for _ in range(3)}
    assert len(ids) == 3


# --- payloads -----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", ["[1, 2]", '"text"', "3", "null", "true"])
def test_payload_must_be_a_json_object(coord, cli, payload):
    before = dump(coord)
    r = cli("enqueue", "summarize", "--payload", payload, "--json")
    assert r.code == 2
    assert r.json["error"]["code"] == "invalid_input"
    assert "payload" in r.json["error"]["message"] and "object" in r.json["error"]["message"]
    assert dump(coord) == before


def test_payload_is_stored_and_returned_as_parsed_json(coord, cli):
    payload = {"text": "naïve café ✓", "nested": {"list": [1, 2.5, None, True]}}
    job_id = cli("enqueue", "summarize", "--payload", json.dumps(payload), "--json"
                 ).json["job_id"]
    assert coord.show(job_id)["job"]["payload"] == payload
    shown = cli("show", str(job_id), "--json").json
    assert shown["job"]["payload"] == payload


@pytest.mark.parametrize("delta,ok", [(-1, True), (0, True), (1, False)])
def test_default_payload_limit_is_256_kib(coord, cli, delta, ok):
    limit = 256 * 1024
    assert coord.policy.max_payload_bytes == limit
    before = dump(coord)
    r = cli("enqueue", "embed", "--payload", payload_of_size(limit + delta), "--json")
    if ok:
        assert r.code == 0, r.out
        assert len(coord.show(r.json["job_id"])["job"]["payload"]["a"]) == limit + delta - 8
    else:
        assert r.code == 2
        err = r.json["error"]
        assert err["code"] == "payload_too_large"
        assert "artifact" in err["message"] and str(limit) in err["message"]
        assert dump(coord) == before


@pytest.mark.parametrize("delta,ok", [(-1, True), (0, True), (1, False)])
def test_payload_limit_is_configurable_by_a_policy_file(coord, cli, tmp_path, delta, ok):
    policy = tmp_path / "policy.toml"
    policy.write_text("max_payload_bytes = 100\n")
    before = dump(coord)
    r = cli("--policy", str(policy), "enqueue", "embed", "--payload",
            payload_of_size(100 + delta), "--json")
    if ok:
        assert r.code == 0, r.out
    else:
        assert r.code == 2
        assert r.json["error"]["code"] == "payload_too_large"
        assert "artifact" in r.json["error"]["message"]
        assert dump(coord) == before


def test_payload_limit_applies_to_payload_files_and_stdin(coord, cli, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[policy]\nmax_payload_bytes = 100\n")
    big = tmp_path / "big.json"
    big.write_text(payload_of_size(5000))
    before = dump(coord)
    r = cli("--policy", str(policy), "enqueue", "embed", "--payload-file", str(big), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "payload_too_large"
    r = cli("--policy", str(policy), "enqueue", "embed", "--payload-file", "-", "--json",
            stdin=payload_of_size(101).encode())
    assert r.code == 2 and r.json["error"]["code"] == "payload_too_large"
    assert dump(coord) == before
    r = cli("--policy", str(policy), "enqueue", "embed", "--payload-file", "-", "--json",
            stdin=payload_of_size(100).encode())
    assert r.code == 0, r.out


def test_python_api_applies_the_same_payload_limit(coord):
    with pytest.raises(InvalidInput) as caught:
        coord.enqueue("embed", {"a": "x" * (256 * 1024)})
    assert caught.value.code == "payload_too_large"
    assert coord.jobs()["jobs"] == []


def test_a_payload_far_past_the_limit_is_payload_too_large_as_one_just_past_it(coord, cli,
                                                                              tmp_path):
    """A payload text more characters long than the limit has bytes (one byte past was
    payload_too_large) was refused as `invalid_input` "is 1000000 characters long; the limit
    is 262145": another code for the same fault, and a limit one more than the policy's."""
    limit = 256 * 1024
    before = dump(coord)
    with pytest.raises(InvalidInput) as caught:
        coord.enqueue("embed", '"' + "x" * (4 * limit) + '"')
    assert caught.value.code == "payload_too_large", caught.value
    assert caught.value.details["limit"] == limit
    assert caught.value.details["size"] == 4 * limit + 2
    policy = tmp_path / "policy.toml"
    policy.write_text("max_payload_bytes = 100\n")
    r = cli("--policy", str(policy), "enqueue", "embed", "--payload", payload_of_size(5000),
            "--json")
    assert r.code == 2 and r.json["error"]["code"] == "payload_too_large", r.json
    assert r.json["error"]["details"] == {"field": "payload", "limit": 100, "size": 5000}
    assert dump(coord) == before


def nested(depth: int) -> dict[str, Any]:
    """A payload whose outermost object is level 1 and whose innermost is level `depth`."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth,ok", [(64, True), (65, False), (5000, False)])
def test_payloads_nested_deeper_than_64_levels_are_refused(coord, cli, depth, ok):
    before = dump(coord)
    if ok:
        job = coord.enqueue("embed", nested(depth))
        assert coord.show(job["job_id"])["job"]["payload"] == nested(depth)
    else:
        with pytest.raises(InvalidInput) as caught:
            coord.enqueue("embed", nested(depth))
        assert "nested deeper than 64" in caught.value.message
        assert dump(coord) == before
    r = cli("enqueue", "embed", "--payload", json.dumps(nested(min(depth, 900))), "--json")
    assert (r.code == 0) == ok, r.out
    if not ok:
        assert "nested deeper than 64" in r.json["error"]["message"]


def beside(depth: int, leaf: Any) -> dict[str, Any]:
    """A payload whose objects nest `depth` levels, `leaf` in the innermost, with an empty
    list beside them: more brackets than levels."""
    value: Any = leaf
    for _ in range(depth - 1):
        value = {"a": value}
    return {"pad": [], "a": value}


@pytest.mark.parametrize("leaf", [1, "text", None, True])
@pytest.mark.parametrize("depth,ok", [(64, True), (65, False)])
def test_a_value_is_as_deep_as_its_brackets_nest_whatever_else_it_holds(coord, depth, ok,
                                                                        leaf):
    """A number, string or null in the innermost object is no level of its own, whether or
    not the value holds more brackets than levels: the same depth, the same verdict."""
    coord.heartbeat("w1")
    job = coord.enqueue("embed", {})["job_id"]
    epoch = coord.claim("w1")["lease"]["epoch"]
    value = beside(depth, leaf)
    if ok:
        coord.checkpoint(job, "w1", epoch, "step", value)
        coord.complete(job, "w1", epoch, value)
        assert coord.show(job)["job"]["result"] == value
        assert coord.show(coord.enqueue("embed", value)["job_id"])["job"]["payload"] == value
        return
    before = dump(coord)
    for call in (lambda: coord.enqueue("embed", value),
                 lambda: coord.checkpoint(job, "w1", epoch, "step", value),
                 lambda: coord.complete(job, "w1", epoch, value)):
        with pytest.raises(InvalidInput) as caught:
            call()
        assert "nested deeper than 64 levels" in caught.value.message
    assert dump(coord) == before


def test_brackets_inside_strings_do_not_count_as_nesting(coord):
    payload = {"text": "{[" * 200, "list": [[1], {"b": "]}" * 100}]}
    job = coord.enqueue("embed", payload)
    assert coord.show(job["job_id"])["job"]["payload"] == payload


def test_a_lone_surrogate_in_a_payload_is_refused_by_name(coord):
    before = dump(coord)
    with pytest.raises(InvalidInput) as caught:
        coord.enqueue("embed", {"text": "half a pair: \ud800"})
    assert "lone surrogate" in caught.value.message
    assert dump(coord) == before


# --- batches ----------------------------------------------------------------------------------


def test_batch_enqueue_accepts_every_job_in_one_transaction(coord):
    out = coord.enqueue_many([
        JobSpec("summarize", {"doc": 1}, priority=0),
        {"kind": "embed", "payload": {"doc": 2}, "priority": "P3", "key": "e2"},
        JobSpec("summarize", {"doc": 3}, tenant="B"),
    ])
    assert [o["created"] for o in out] == [True, True, True]
    assert len({o["job_id"] for o in out}) == 3
    assert {j["job_id"] for j in coord.jobs()["jobs"]} == {o["job_id"] for o in out}
    # Resubmitting a keyed job in a batch returns it again.
    again = coord.enqueue_many([{"kind": "embed", "payload": {"doc": 2}, "key": "e2",
                                 "priority": "P3"}])
    assert again == [{"job_id": out[1]["job_id"], "created": False}]


def test_batch_with_a_conflicting_job_creates_nothing(coord):
    coord.enqueue("summarize", {"doc": 1}, key="taken")
    before = dump(coord)
    with pytest.raises(Refused) as caught:
        coord.enqueue_many([
            JobSpec("summarize", {"doc": 10}),
            JobSpec("summarize", {"doc": 11}),
            JobSpec("summarize", {"doc": 99}, key="taken"),
        ])
    assert caught.value.code == "idempotency_conflict"
    assert dump(coord) == before


def test_batch_conflicting_with_itself_creates_nothing_and_names_its_items_not_a_job(coord):
    """Two jobs of one batch with one key and different payloads: the refusal named "job 1",
    a job rolled back with the batch (the next enqueue took its id)."""
    before = dump(coord)
    with pytest.raises(Refused) as caught:
        coord.enqueue_many([JobSpec("x", {}), JobSpec("a", {"v": 1}, key="k"),
                            JobSpec("a", {"v": 2}, key="k")])
    assert caught.value.code == "idempotency_conflict"
    assert "job_id" not in caught.value.details, caught.value.details
    assert caught.value.details["items"] == [1, 2], caught.value.details
    assert "items 1 and 2 of this batch" in caught.value.message, caught.value.message
    assert dump(coord) == before


def test_batch_with_an_invalid_job_creates_nothing(coord):
    before = dump(coord)
    with pytest.raises(InvalidInput) as caught:
        coord.enqueue_many([JobSpec("ok", {}), JobSpec("ok", {}, priority=7)])
    assert "priority" in caught.value.message
    with pytest.raises(InvalidInput):
        coord.enqueue_many([JobSpec("ok", {}), JobSpec("ok", [1, 2])])
    assert dump(coord) == before


# --- tenants ------------------------------------------------------------------------------------


def _not_found_message(r: Any, job_id: int) -> str:
    assert r.code == 4, (r.out, r.err)
    assert r.json["error"]["code"] == "job_not_found"
    return r.json["error"]["message"].replace(str(job_id), "<id>")


def test_another_tenants_job_is_indistinguishable_from_a_missing_one(coord, cli):
    with freeze_time("2026-03-01 09:00:00"):
        job_id = coord.enqueue("summarize", {"doc": 1}, tenant="A", priority=0)["job_id"]
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        epoch = str(coord.claim("w1")["lease"]["epoch"])
        before = dump(coord)
        missing = 10**6
        commands = [
            ("show", "{id}"),
            ("explain", "{id}"),
            ("complete", "{id}", "--worker", "w1", "--epoch", epoch, "--result", "{}"),
            ("renew", "{id}", "--worker", "w1", "--epoch", epoch),
            ("fail", "{id}", "--worker", "w1", "--epoch", epoch, "--error", "x"),
            ("effect", "{id}", "--worker", "w1", "--epoch", epoch),
            ("checkpoint", "{id}", "--worker", "w1", "--epoch", epoch, "--name", "n"),
            ("cancel", "{id}"),
            ("retry", "{id}"),
            ("reconcile", "{id}", "--as", "dead", "--reason", "r"),
        ]
        for cmd in commands:
            as_b = cli(*[a.replace("{id}", str(job_id)) for a in cmd], "--tenant", "B", "--json")
            absent = cli(*[a.replace("{id}", str(missing)) for a in cmd], "--tenant", "B", "--json")
            assert _not_found_message(as_b, job_id) == _not_found_message(absent, missing), cmd
            assert as_b.err.replace(str(job_id), "<id>") == absent.err.replace(
                str(missing), "<id>")
        assert dump(coord) == before
        # Its own tenant (and the operator without --tenant) still sees and completes it.
        assert cli("show", str(job_id), "--tenant", "A", "--json").json["job"]["tenant"] == "A"
        r = cli("complete", str(job_id), "--worker", "w1", "--epoch", epoch, "--tenant", "A",
                "--result", '{"ok": true}', "--json")
        assert r.code == 0, r.out


def test_jobs_with_a_tenant_lists_only_that_tenant(coord, cli):
    a = {coord.enqueue("k", {"n": n}, tenant="A")["job_id"] for n in range(3)}
    b = {coord.enqueue("k", {"n": n}, tenant="B")["job_id"] for n in range(2)}
    coord.enqueue("k", {}, tenant="AB")
    listed_a = cli("jobs", "--tenant", "A", "--json").json["jobs"]
    assert {j["job_id"] for j in listed_a} == a
    assert {j["tenant"] for j in listed_a} == {"A"}
    listed_b = cli("jobs", "--tenant", "B", "--json").json["jobs"]
    assert {j["job_id"] for j in listed_b} == b
    assert cli("jobs", "--tenant", "nobody", "--json").json == {"jobs": []}
    # "_" is a LIKE wildcard: the filter must be an exact match, not a pattern.
    assert cli("jobs", "--tenant", "A_", "--json").json == {"jobs": []}
    assert len(cli("jobs", "--json").json["jobs"]) == 6


def test_status_with_a_tenant_counts_only_that_tenants_jobs_and_leases(coord, cli):
    for n in range(3):
        coord.enqueue("k", {"n": n}, tenant="A")
    coord.enqueue("k", {}, tenant="B", priority=0)
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert coord.claim("w1")["job"]["tenant"] == "B"
    a = cli("status", "--tenant", "A", "--json").json
    assert a["tenant"] == "A" and a["active_leases"] == 0
    assert a["jobs"]["waiting"] == 3 and a["jobs"]["running"] == 0
    b = cli("status", "--tenant", "B", "--json").json
    assert b["active_leases"] == 1 and b["jobs"]["running"] == 1 and b["jobs"]["waiting"] == 0
    everyone = cli("status", "--json").json
    assert everyone["tenant"] is None and everyone["active_leases"] == 1
    assert everyone["jobs"]["waiting"] == 3 and everyone["jobs"]["running"] == 1


def test_enqueue_without_a_tenant_uses_the_default_tenant(coord, cli):
    job_id = cli("enqueue", "k", "--json").json["job_id"]
    assert coord.show(job_id)["job"]["tenant"] == "default"
    assert [j["job_id"] for j in coord.jobs(tenant="default")["jobs"]] == [job_id]
    assert coord.show(job_id)["job"]["payload"] == {}


def test_concurrent_submissions_with_one_key_create_one_job(coord, target):
    """Six submitters at once per key, half with the winner's payload or not: one job, the
    same id for every same-payload caller, a conflict for every other one, nothing else."""
    for round_ in range(5):
        key = f"burst-{round_}"
        answers: list[tuple[int, Any]] = []
        start = threading.Barrier(6)

        def submit(i: int, key: str = key, answers: list[Any] = answers,
                   start: threading.Barrier = start) -> None:
            c = Coordinator.open(target)
            try:
                start.wait()
                answers.append((i, c.enqueue("summarize", {"v": i % 2}, key=key)))
            except Refused as e:
                answers.append((i, e.code))
            except Exception as e:  # anything else is the finding
                answers.append((i, f"{type(e).__name__}: {e}"))
            finally:
                c.close()

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        jobs = coord.jobs(limit=1000)["jobs"]
        (job,) = [j for j in jobs if coord.show(j["job_id"])["job"]["idempotency_key"] == key]
        winner = coord.show(job["job_id"])["job"]["payload"]["v"]
        assert len(answers) == 6
        for i, answer in answers:
            if i % 2 == winner:
                assert isinstance(answer, dict) and answer["job_id"] == job["job_id"], answer
            else:
                assert answer == "idempotency_conflict", answer
        assert sum(1 for _, a in answers if isinstance(a, dict) and a["created"]) == 1


def test_status_counts_the_leases_that_expired_and_wait_for_the_reaper(coord, cli):
    """A lease past its end is still held (until the reaper ends it) and counted as such,
    and said apart: `expired_leases`, of the tenant when asked."""
    import time

    coord.enqueue("k", {}, tenant="A")
    coord.enqueue("k", {}, tenant="B")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert coord.claim("w1", lease_s=0.3, tenant="A")["job"]["tenant"] == "A"
    assert coord.claim("w1", lease_s=300, tenant="B")["job"]["tenant"] == "B"
    fresh = cli("status", "--json").json
    assert (fresh["active_leases"], fresh["expired_leases"]) == (2, 0)
    time.sleep(0.4)
    late = cli("status", "--json").json
    assert (late["active_leases"], late["expired_leases"]) == (2, 1)
    assert cli("status", "--tenant", "B", "--json").json["expired_leases"] == 0
    coord.reap()
    assert cli("status", "--json").json["expired_leases"] == 0
