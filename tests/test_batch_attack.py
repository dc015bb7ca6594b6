"""Batches under attack: claim_many's set path against limits, needs, roles, kinds, tenants
and schedules; complete_many / fail_many groups carrying reaped, re-claimed, cancelled,
foreign and malformed items; threads of one Coordinator mixing every call. On both
databases; the state is checked with `check` and the events afterwards."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from jobcoord.errors import InvalidInput, JobcoordError
from jobcoord.maintenance import check
from jobcoord.service import Coordinator, JobSpec
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC

pytestmark = pytest.mark.timeout(600)


def _item(got: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"job_id": got["job"]["job_id"], "worker_id": got["lease"]["worker_id"],
            "epoch": got["lease"]["epoch"], "result": {"ok": got["job"]["job_id"]}} | over


def _codes(done: dict[str, Any]) -> list[str]:
    return [r.get("status") or r["error"]["code"] for r in done["results"]]


def _events(coord: Coordinator, job_id: int) -> list[tuple[Any, ...]]:
    return [(e["reason"], e["epoch"]) for e in coord.show(job_id)["events"]]


def _running_kinds(coord: Coordinator) -> Counter[str]:
    return Counter(j["kind"] for j in coord.jobs(status="running", limit=1000)["jobs"])


# --- claim_many's choice of jobs --------------------------------------------------------------


def test_a_limit_created_between_two_batch_claims_bounds_the_second(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(20)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    first = coord.claim_many("w1", 3, lease_s=30)["claimed"]
    assert len(first) == 3  # no limit yet: the set path
    coord.set_limit("k", 4)
    second = coord.claim_many("w1", 10, lease_s=30)["claimed"]
    assert len(second) == 1, "the limit of 4 counts the 3 already running"
    assert coord.claim_many("w1", 10)["claimed"] == []
    assert _running_kinds(coord)["k"] == 4
    coord.remove_limit("k")
    assert len(coord.claim_many("w1", 10, lease_s=30)["claimed"]) == 10


def test_one_waiting_job_with_needs_among_many_is_judged_by_the_worker_resources(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k", {"i": i}) for i in range(6)])
    needy = coord.enqueue("k", priority=0, needs={"gpu_mem_mb": 8000})["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)  # declares no GPU memory
    got = coord.claim_many("w1", 10, lease_s=30)["claimed"]
    ids = [g["job"]["job_id"] for g in got]
    assert needy not in ids and len(ids) == 6
    assert coord.show(needy)["job"]["status"] == "waiting"


def test_a_role_less_and_role_bound_mix_gives_each_worker_only_its_jobs(
        coord: Coordinator) -> None:
    plain = {j["job_id"] for j in coord.enqueue_many([JobSpec("k") for _ in range(5)])}
    gpu = {j["job_id"] for j in coord.enqueue_many(
        [JobSpec("k", role="gpu") for _ in range(5)])}
    coord.heartbeat("cpu", readings=IDLE_ON_AC)
    coord.heartbeat("g", roles=["gpu"], readings=IDLE_ON_AC)
    cpu_got = {g["job"]["job_id"] for g in coord.claim_many("cpu", 10)["claimed"]}
    assert cpu_got == plain
    g_got = {g["job"]["job_id"] for g in coord.claim_many("g", 10)["claimed"]}
    assert g_got == gpu


def test_a_batch_claim_skips_jobs_scheduled_for_later_and_follows_the_kinds_filter(
        coord: Coordinator) -> None:
    later = {j["job_id"] for j in coord.enqueue_many(
        [JobSpec("a", delay_s=3600) for _ in range(3)])}
    a_now = {j["job_id"] for j in coord.enqueue_many([JobSpec("a") for _ in range(2)])}
    b_now = {j["job_id"] for j in coord.enqueue_many([JobSpec("b") for _ in range(3)])}
    coord.enqueue_many([JobSpec("c") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 100, kinds=["a", "b"], lease_s=30)
    assert {g["job"]["job_id"] for g in got["claimed"]} == a_now | b_now
    again = coord.claim_many("w1", 100, kinds=["a"])
    assert again["claimed"] == [] and "later" in again["detail"]
    assert all(coord.show(j)["job"]["status"] == "waiting" for j in later)


def test_a_tenant_bound_batch_claim_takes_only_its_tenant(coord: Coordinator) -> None:
    mine = {j["job_id"] for j in coord.enqueue_many(
        [JobSpec("k", tenant="t1") for _ in range(3)])}
    coord.enqueue_many([JobSpec("k", tenant="t2") for _ in range(3)] + [JobSpec("k")])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 100, tenant="t1", lease_s=30)["claimed"]
    assert {g["job"]["job_id"] for g in got} == mine
    assert coord.claim_many("w1", 100, tenant="t1")["reason"] == "no_waiting_jobs"


@pytest.mark.parametrize("n", [1000, 1001, 10**6])
def test_huge_batches_take_at_most_the_largest_batch(coord: Coordinator, n: int) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(1000)])
    coord.enqueue_many([JobSpec("k") for _ in range(5)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    if n > 1000:
        before = dump(coord)
        with pytest.raises(InvalidInput):
            coord.claim_many("w1", n)
        assert dump(coord) == before
        return
    got = coord.claim_many("w1", n, lease_s=60)["claimed"]
    assert len(got) == 1000 and len({g["job"]["job_id"] for g in got}) == 1000
    done = coord.complete_many([_item(g) for g in got])
    assert done["accepted"] == 1000
    assert check(coord.db)["ok"]


# --- groups of reports ------------------------------------------------------------------------


def test_a_group_carrying_epoch_1_of_a_job_reaped_and_reclaimed_by_another_worker(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(3)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.heartbeat("w2", readings=IDLE_ON_AC)
    short = coord.claim("w1", lease_s=0.2)
    rest = coord.claim_many("w1", 2, lease_s=30)["claimed"]
    time.sleep(0.3)
    assert coord.reap()["expired"] == 1
    again = coord.claim("w2", lease_s=30)
    assert again["job"]["job_id"] == short["job"]["job_id"] and again["lease"]["epoch"] == 2
    job = short["job"]["job_id"]
    for report in (coord.complete_many, coord.fail_many):
        items = [_item(g) for g in (short, *rest)]
        if report == coord.fail_many:
            items = [{k: v for k, v in i.items() if k != "result"} | {"error": "x"}
                     for i in items]
        done = report(items)
        assert done["results"][0]["error"]["code"] in ("stale_epoch", "not_owner")
    # The rest were accepted by the first group, refused as finished by the second.
    assert coord.show(job)["job"]["status"] == "running"
    assert coord.show(job)["job"]["epoch"] == 2
    assert coord.complete(job, "w2", 2, {"by": "w2"})["status"] == "succeeded"
    assert coord.show(job)["job"]["result"] == {"by": "w2"}
    assert check(coord.db)["ok"]


def test_a_tenant_bound_item_of_another_tenants_job_is_refused_as_absent(
        coord: Coordinator) -> None:
    coord.enqueue("k", tenant="t1")
    coord.enqueue("k", tenant="t2")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2, lease_s=30)["claimed"]
    ta, tb = a["job"]["tenant"], b["job"]["tenant"]
    done = coord.complete_many([_item(a, tenant=ta), _item(b, tenant=ta)])
    assert _codes(done) == ["succeeded", "job_not_found"]
    assert coord.show(b["job"]["job_id"])["job"]["status"] == "running"
    done = coord.complete_many([_item(b, tenant=tb)])
    assert _codes(done) == ["succeeded"]


@pytest.mark.parametrize("bad", [
    {"result": object()}, {"result": {"x": float("inf")}}, {"result": b"bytes"},
    {"epoch": "x"}, {"epoch": True}, {"epoch": 1.5}, {"job_id": [1]}, {"job_id": None},
    {"worker_id": 7}, {"tenant": 5}, {"provenance": "x"},
], ids=lambda v: repr(v)[:30])
def test_a_malformed_item_refuses_the_whole_group_and_changes_nothing(
        coord: Coordinator, bad: dict[str, Any]) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(2)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2, lease_s=30)["claimed"]
    before = dump(coord)
    with pytest.raises(InvalidInput) as caught:
        coord.complete_many([_item(a), _item(b) | bad])
    assert "items[1]" in caught.value.message
    assert dump(coord) == before


def test_a_result_over_the_size_budget_refuses_its_item_only_at_validation(
        coord: Coordinator) -> None:
    coord.enqueue_many([JobSpec("k") for _ in range(2)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    a, b = coord.claim_many("w1", 2, lease_s=30)["claimed"]
    huge = {"x": "y" * (int(coord.policy.max_result_bytes) + 10)}
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.complete_many([_item(a), _item(b, result=huge)])
    assert dump(coord) == before


# --- threads sharing one Coordinator -----------------------------------------------------------


def test_threads_sharing_one_coordinator_mixing_every_call_keep_the_books(
        coord: Coordinator) -> None:
    n_jobs = 300
    coord.enqueue_many([JobSpec("k", {"i": i}, max_attempts=50) for i in range(n_jobs)])
    for w in ("w0", "w1", "w2", "w3"):
        coord.heartbeat(w, readings=IDLE_ON_AC)
    accepted: list[tuple[int, int]] = []
    claimed: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(w: str, seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                if rnd.random() < 0.3:
                    got = coord.claim(w, lease_s=rnd.choice([0.05, 30]))
                    batch = [got] if got["job"] else []
                else:
                    batch = coord.claim_many(w, rnd.randint(1, 8),
                                             lease_s=rnd.choice([0.05, 30]))["claimed"]
                if not batch:
                    if not coord.jobs(status="waiting", limit=1)["jobs"] and not coord.jobs(
                            status="running", limit=1)["jobs"]:
                        return
                    coord.reap()
                    # Failed jobs wait out their backoff: stay fresh meanwhile (a stale
                    # worker is refused and the loop would only end at the deadline).
                    coord.heartbeat(w, readings=IDLE_ON_AC)
                    continue
                with lock:
                    claimed.extend((g["job"]["job_id"], g["lease"]["epoch"]) for g in batch)
                items = [_item(g) for g in batch]
                if rnd.random() < 0.3:
                    items.append(dict(items[0]))  # the same job twice
                if rnd.random() < 0.2:
                    items.append(_item(batch[0], epoch=batch[0]["lease"]["epoch"] + 1))
                choice = rnd.random()
                if choice < 0.15:
                    for it in items:
                        try:
                            coord.complete(it["job_id"], w, it["epoch"], it["result"])
                            with lock:
                                accepted.append((it["job_id"], it["epoch"]))
                        except JobcoordError:
                            pass
                    continue
                if choice < 0.3:
                    done = coord.fail_many([
                        {k: v for k, v in it.items() if k != "result"} | {"error": "x"}
                        for it in items])
                    continue
                if choice < 0.35:
                    with contextlib.suppress(JobcoordError):
                        coord.cancel(items[0]["job_id"])
                done = coord.complete_many(items)
                with lock:
                    accepted.extend((it["job_id"], it["epoch"]) for it, r in
                                    zip(items, done["results"], strict=True)
                                    if "error" not in r)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(f"w{i}", i)) for i in range(4)]
    for t in threads:
        t.start()
    # The rules are checked whatever is left running or waiting at the end: a job failed
    # many times waits minutes of backoff, not worth waiting for.
    deadline = time.monotonic() + 90
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(claimed) == len(set(claimed)), "a (job, epoch) was claimed twice"
    assert len({j for j, _ in accepted}) == len(accepted), "a job accepted twice"
    found = check(coord.db)
    assert found["ok"], found
    succeeded = {j["job_id"]: j for j in coord.jobs(status="succeeded", limit=1000)["jobs"]}
    assert set(succeeded) == {j for j, _ in accepted}
    for job_id, epoch in accepted[:: max(1, len(accepted) // 40)]:
        events = _events(coord, job_id)
        assert events.count(("completed", epoch)) == 1
        assert [e for e in events if e[0] == "claimed"] == [
            ("claimed", e) for e in range(1, epoch + 1)]
    counts = coord.status()["jobs"]
    assert sum(counts.values()) == n_jobs
    assert counts["running"] == len(coord.jobs(status="running", limit=1000)["jobs"])


def test_a_job_with_needs_enqueued_while_a_claim_runs_is_never_taken_unchecked(
        coord: Coordinator) -> None:
    # A claim reads "no waiting job declares needs" first and takes after: a job declaring
    # needs that commits in between (PostgreSQL runs them side by side) must not be taken by
    # a worker that has not been checked against them; it waits for the next claim.
    coord.heartbeat("w1", readings=IDLE_ON_AC)  # declares no GPU memory
    needy: set[int] = set()
    taken: set[int] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def enqueue_needy() -> None:
        try:
            while not stop.is_set():
                job = coord.enqueue("k", priority=0, needs={"gpu_mem_mb": 10**6})["job_id"]
                needy.add(job)
                with contextlib.suppress(JobcoordError):
                    coord.cancel(job)
        except BaseException as e:  # reported by the test
            errors.append(e)

    def claim() -> None:
        try:
            rounds = 0
            while not stop.is_set() and rounds < 1500:
                rounds += 1
                if rounds % 20 == 1:
                    coord.enqueue_many([JobSpec("k", priority=1) for _ in range(40)])
                got = coord.claim_many("w1", 4, lease_s=30)["claimed"]
                one = coord.claim("w1", lease_s=30)
                got += [one] if one["job"] else []
                taken.update(g["job"]["job_id"] for g in got)
                if got:
                    coord.complete_many([_item(g) for g in got])
        except BaseException as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=enqueue_needy), threading.Thread(target=claim)]
    for t in threads:
        t.start()
    threads[1].join(240)
    stop.set()
    threads[0].join(30)
    assert not errors, errors
    assert needy and taken
    assert not taken & needy, f"jobs declaring needs taken unchecked: {sorted(taken & needy)}"


def test_groups_racing_over_the_same_jobs_in_any_order_accept_each_once(
        coord: Coordinator) -> None:
    # Four threads report the same 60 jobs in shuffled groups (with duplicates), beside a
    # canceller and a reaper: no deadlock, no error, one accepted report per job.
    coord.enqueue_many([JobSpec("k") for _ in range(60)])
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim_many("w1", 60, lease_s=30)["claimed"]
    items = [_item(g) for g in got]
    accepted: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def report(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(6):
                group = rnd.sample(items, 20) + rnd.sample(items, 3)
                if seed % 2:
                    done = coord.fail_many([
                        {k: v for k, v in i.items() if k != "result"} | {"error": "x"}
                        for i in group])
                else:
                    done = coord.complete_many(group)
                with lock:
                    accepted.extend(i["job_id"] for i, r in zip(group, done["results"],
                                                                 strict=True)
                                    if "error" not in r)
        except BaseException as e:  # reported by the test
            errors.append(e)

    def meddle() -> None:
        try:
            for g in got[::7]:
                with contextlib.suppress(JobcoordError):
                    coord.cancel(g["job"]["job_id"])
                coord.reap()
        except BaseException as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=report, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=meddle))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(accepted) == len(set(accepted)), Counter(accepted).most_common(3)
    for g in got:
        events = [e["reason"] for e in coord.show(g["job"]["job_id"])["events"]]
        ends = [e for e in events if e in ("completed", "failed")]
        assert len(ends) <= 1, events
    found = check(coord.db)
    assert found["ok"], found
