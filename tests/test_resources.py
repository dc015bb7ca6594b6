"""Resource fit: a claim takes only a job whose declared needs fit what the worker reported
free minus what its running jobs declared; gpu_mem_mb fits on one GPU; `explain` names the
short resource and the worker; GPU temperature joins the thermal gate; bad needs and readings
are refused with nothing changed. SQLite and PostgreSQL, frozen clock. The NVML reading code
runs for real: without the library, and with it but without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from jobcoord.errors import InvalidInput, Refused
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.timeline import IDLE_ON_AC


def gpu(free: int, total: int = 24000, temp: float | None = 50) -> dict[str, Any]:
    return {"memory_free_mb": free, "memory_total_mb": total, "utilization_pct": 10,
            "temperature_c": temp}


def beat(coord: Coordinator, worker: str, **readings: Any) -> dict[str, Any]:
    return coord.heartbeat(worker, readings={**IDLE_ON_AC, **readings})


def test_a_job_goes_only_to_a_worker_whose_free_gpu_memory_fits_it(coord, clock):
    beat(coord, "small", gpus=[gpu(8000)])
    beat(coord, "big", gpus=[gpu(16000)])
    job = coord.enqueue("render", {}, needs="gpu_mem_mb=12000")["job_id"]
    refused = coord.claim("small")
    assert refused["job"] is None and refused["reason"] == "resource_short"
    assert "gpu_mem_mb: needs 12000" in refused["detail"]
    assert coord.claim("big")["job"]["job_id"] == job
    assert coord.show(job)["job"]["needs"] == {"gpu_mem_mb": 12000}


def test_gpu_memory_does_not_span_gpus(coord, clock):
    beat(coord, "w1", gpus=[gpu(8000), gpu(8000)])
    coord.enqueue("render", {}, needs={"gpu_mem_mb": 12000})
    assert coord.claim("w1")["reason"] == "resource_short"
    fits = coord.enqueue("render", {}, needs={"gpu_mem_mb": 8000})["job_id"]
    assert coord.claim("w1")["job"]["job_id"] == fits  # the next eligible job, not a failure


def test_running_jobs_declared_needs_are_subtracted_per_gpu(coord, clock):
    beat(coord, "w1", gpus=[gpu(10000), gpu(6000)])
    ids = [coord.enqueue("r", {}, needs={"gpu_mem_mb": n})["job_id"]
           for n in (6000, 6000, 4000, 1)]
    taken = [coord.claim("w1")["job"] for _ in range(3)]
    assert [j["job_id"] for j in taken] == ids[:3]  # 6000 on each GPU, then 4000 on the first
    last = coord.claim("w1")
    assert last["reason"] == "resource_short" and "most any GPU has free is 0" in last["detail"]
    coord.complete(ids[0], "w1", 1, {})
    assert coord.claim("w1")["job"]["job_id"] == ids[3]


def test_a_running_job_that_no_longer_fits_still_counts_against_the_gpu(coord, clock):
    """Less free memory reported never admits more work: a running job whose declared
    gpu_mem_mb no longer fits what its GPU reports is still subtracted (going below zero),
    in the claim and in explain alike."""
    beat(coord, "w1", gpus=[gpu(10000)])
    coord.enqueue("train", {}, needs={"gpu_mem_mb": 8000})
    assert coord.claim("w1")["job"] is not None
    b = coord.enqueue("train", {}, needs={"gpu_mem_mb": 2000})["job_id"]
    for free in (9000, 7000, 0):
        beat(coord, "w1", gpus=[gpu(free)])
        refused = coord.claim("w1")
        assert refused["reason"] == "resource_short", (free, refused)
        assert f"the most any GPU has free is {free - 8000} " in refused["detail"]
        told = coord.explain(b)
        assert told["claimable_now"] is False and told["reasons"][0]["code"] == "resource_short"


def test_a_running_job_that_fits_no_gpu_is_counted_on_the_one_with_the_most_left(coord, clock):
    """With several GPUs, a running job that fits none of them is placed on the GPU with the
    most memory left, whose free memory goes below zero; the other GPUs keep theirs."""
    beat(coord, "w1", gpus=[gpu(10000), gpu(3000)])
    coord.enqueue("train", {}, needs={"gpu_mem_mb": 8000})
    assert coord.claim("w1")["job"] is not None
    beat(coord, "w1", gpus=[gpu(3000), gpu(5000)])
    too_big = coord.enqueue("train", {}, needs={"gpu_mem_mb": 3001})["job_id"]
    refused = coord.claim("w1")
    assert refused["reason"] == "resource_short"
    assert "the most any GPU has free is 3000 " in refused["detail"]  # GPU 1: 5000 - 8000
    fits = coord.enqueue("train", {}, needs={"gpu_mem_mb": 3000})["job_id"]
    assert coord.claim("w1")["job"]["job_id"] == fits
    assert coord.explain(too_big)["claimable_now"] is False


def test_ram_and_named_capacity_fit_after_running_jobs(coord, clock):
    beat(coord, "w1", memory_available_mb=10000, capacity={"slots": 2})
    a = coord.enqueue("k", {}, needs="ram_mb=6000,slots=1")["job_id"]
    b = coord.enqueue("k", {}, needs="ram_mb=6000")["job_id"]
    c = coord.enqueue("k", {}, needs="slots=1")["job_id"]
    d = coord.enqueue("k", {}, needs="slots=1")["job_id"]
    assert coord.claim("w1")["job"]["job_id"] == a
    assert coord.claim("w1")["job"]["job_id"] == c  # b: 4000 MB left of 10000
    held = coord.claim("w1")
    assert held["reason"] == "resource_short"
    assert "ram_mb: needs 6000; 4000 left of 10000" in held["detail"]
    coord.complete(a, "w1", 1, {})
    assert coord.claim("w1")["job"]["job_id"] == b
    assert coord.claim("w1")["job"]["job_id"] == d
    assert coord.explain(b)["status"] == "running"


def test_a_worker_that_reports_no_such_resource_gets_no_job_that_needs_it(coord, clock):
    beat(coord, "w1")
    coord.enqueue("k", {}, needs="ram_mb=1")
    coord.enqueue("k", {}, needs="tpu=1")
    out = coord.claim("w1")
    assert out["reason"] == "resource_short"
    assert out["detail"] == "ram_mb: needs 1; the worker reports no memory_available_mb"


def test_explain_says_which_resource_is_short_on_which_worker(coord, clock):
    beat(coord, "laptop", gpus=[gpu(4000)], memory_available_mb=64000)
    beat(coord, "desktop", gpus=[gpu(20000)], memory_available_mb=2000)
    beat(coord, "server", gpus=[gpu(20000)], memory_available_mb=64000)
    job = coord.enqueue("k", {}, needs="gpu_mem_mb=12000,ram_mb=8000")["job_id"]
    out = coord.explain(job)
    details = {r["code"]: [] for r in out["reasons"]}
    for r in out["reasons"]:
        details[r["code"]].append(r["detail"])
    assert [d.split(":")[0] for d in details["resource_short"]] == [
        "worker desktop", "worker laptop"]
    assert "ram_mb: needs 8000; 2000 left" in details["resource_short"][0]
    assert "gpu_mem_mb: needs 12000 on one GPU" in details["resource_short"][1]
    assert out["ready_workers"] == ["server"] and out["claimable_now"] is True


def test_gpu_temperature_joins_the_thermal_gate(coord, clock):
    out = beat(coord, "w1", temperature_c=50, gpus=[gpu(20000, temp=95)])
    assert out["readings"]["temperature_c"] == 95.0
    coord.enqueue("k", {})
    assert coord.claim("w1")["reason"] == "thermal_gate"
    beat(coord, "w1", temperature_c=50, gpus=[gpu(20000, temp=None)])
    assert coord.claim("w1")["job"] is not None


@pytest.mark.parametrize("needs", [
    "gpu_mem_mb", "gpu_mem_mb=", "=5", "gpu_mem_mb=abc", "gpu_mem_mb=0", "gpu_mem_mb=-1",
    "gpu_mem_mb=1.5", "gpu_mem_mb=" + "9" * 30, "gpu mem=1", "a=1,a=2", "", " ",
    {"gpu_mem_mb": "12"}, {"gpu_mem_mb": 2**80}, {"gpu_mem_mb": True}, {"": 1}, {},
    [("gpu_mem_mb", 1)], 12000, {f"r{i}": 1 for i in range(17)}])
def test_needs_that_are_not_name_equals_int_are_refused_and_change_nothing(coord, needs):
    before = dump(coord)
    with pytest.raises(InvalidInput) as e:
        coord.enqueue("k", {}, needs=needs)
    assert e.value.code == "invalid_input" and "needs" in e.value.message
    assert dump(coord) == before


@pytest.mark.parametrize("readings", [
    {"gpus": {"memory_free_mb": 1}}, {"gpus": [{"memory_free_mb": -1}]},
    {"gpus": [{"memory_free_mb": 1, "fan": 3}]}, {"gpus": [5]},
    {"gpus": [{"temperature_c": 500}]}, {"gpus": [{"utilization_pct": "high"}]},
    {"gpus": [gpu(1)] * 65}, {"memory_available_mb": -5}, {"memory_available_mb": 1.5},
    {"memory_available_mb": 2**60}, {"capacity": {"slots": -1}}, {"capacity": [1]},
    {"capacity": {"bad name": 1}}, {"capacity": {}},
    # Digits as text: a heartbeat took "50" (and stored it over the last good reading),
    # then every claim needing ram_mb said the worker reports no memory_available_mb.
    {"memory_available_mb": "50"}, {"capacity": {"slots": "4"}},
    {"gpus": [{"memory_free_mb": "100"}]},
    {"gpus": [{"memory_free_mb": 1, "temperature_c": "40"}]}])
def test_bad_resource_readings_are_refused_and_change_nothing(coord, readings):
    beat(coord, "w1")
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.heartbeat("w1", readings=readings)
    assert dump(coord) == before


#: The resources a claim matches against readings of their own, and the reading each
#: refusal must name.
MATCHED_ELSEWHERE = [("ram_mb", "memory_available_mb"), ("gpu_mem_mb", "memory_free_mb")]


@pytest.mark.parametrize("name, source", MATCHED_ELSEWHERE)
def test_a_capacity_named_like_a_resource_matched_elsewhere_is_refused(coord, clock, name,
                                                                       source):
    """`ram_mb` comes from memory_available_mb and `gpu_mem_mb` from the GPUs' free memory:
    a named capacity of either name would override (or be ignored beside) that reading."""
    beat(coord, "w1", memory_available_mb=1000, gpus=[gpu(1000)])
    job = coord.enqueue("big", {}, needs={name: 64000})["job_id"]
    before = dump(coord)
    for capacity in ({name: 999999}, {"slots": 2, name: 999999}):
        with pytest.raises(InvalidInput) as e:
            beat(coord, "w1", memory_available_mb=1000, gpus=[gpu(1000)], capacity=capacity)
        assert e.value.code == "invalid_input"
        assert name in e.value.message and source in e.value.message, e.value.message
        assert dump(coord) == before
    refused = coord.claim("w1")
    assert refused["job"] is None and refused["reason"] == "resource_short"
    assert coord.show(job)["job"]["status"] == "waiting"


@pytest.mark.parametrize("name, source", MATCHED_ELSEWHERE)
def test_the_cli_refuses_a_capacity_named_like_a_resource_matched_elsewhere(cli, name, source):
    for args in (["--capacity", f"{name}=8000"], ["--capacity", f"slots=1,{name}=8000"],
                 ["--readings", json.dumps({"capacity": {name: 8000}})]):
        r = cli("heartbeat", "w1", *args, "--json")
        assert r.code == 2 and r.json["error"]["code"] == "invalid_input", (args, r.out)
        assert source in r.json["error"]["message"], r.json
    assert cli("workers", "--json").json["workers"] == []


def test_a_heartbeat_stored_with_such_a_capacity_before_the_rule_claims_without_it(coord,
                                                                                 clock):
    """A heartbeat an earlier version stored with capacity ram_mb is no damage (the worker
    still claims, `check` is content), but its ram_mb counts for nothing: the amount comes
    from memory_available_mb alone."""
    from tests.sql import sql

    beat(coord, "w1", memory_available_mb=1000)
    big = coord.enqueue("big", {}, needs={"ram_mb": 64000})["job_id"]
    small = coord.enqueue("small", {}, needs={"slots": 1})["job_id"]
    raw = json.dumps({**IDLE_ON_AC, "memory_available_mb": 1000,
                      "capacity": {"ram_mb": 999999, "slots": 1}})
    coord.db.write(lambda conn: sql(conn, "UPDATE workers SET heartbeat_raw = :r", {"r": raw}))
    assert coord.claim("w1")["job"]["job_id"] == small
    refused = coord.claim("w1")
    assert refused["reason"] == "resource_short"
    assert "ram_mb: needs 64000; 1000 left of 1000" in refused["detail"]
    assert coord.explain(big)["claimable_now"] is False
    from jobcoord.maintenance import check

    assert check(coord.db)["ok"] is True


def test_a_gpu_reading_with_more_memory_free_than_in_total_is_refused(coord):
    beat(coord, "w1", gpus=[gpu(24000)])  # all of it free: fine
    before = dump(coord)
    with pytest.raises(InvalidInput) as e:
        beat(coord, "w1", gpus=[gpu(8000), gpu(24001)])
    assert e.value.code == "invalid_input"
    assert "GPU 1: memory_free_mb (24001) is more than memory_total_mb (24000)" \
        in e.value.message
    assert dump(coord) == before
    # An unknown total (or free) leaves nothing to compare.
    beat(coord, "w1", gpus=[{**gpu(30000), "memory_total_mb": None}])


def test_a_repeated_key_with_other_needs_is_an_idempotency_conflict(coord):
    coord.enqueue("k", {}, key="x", needs="ram_mb=100")
    assert coord.enqueue("k", {}, key="x", needs={"ram_mb": 100})["created"] is False
    with pytest.raises(Refused) as e:
        coord.enqueue("k", {}, key="x", needs="ram_mb=200")
    assert e.value.code == "idempotency_conflict" and "needs" in e.value.message


def test_the_cli_takes_needs_and_capacity(cli):
    job = cli("enqueue", "k", "--needs", "ram_mb=8000,slots=1", "--json")
    assert job.code == 0
    bad = cli("enqueue", "k", "--needs", "ram_mb:8000", "--json")
    assert bad.code == 2 and bad.json["error"]["code"] == "invalid_input"
    hb = cli("heartbeat", "w1", "--capacity", "slots=2", "--capacity", "tpu=1",
             "--readings", '{"memory_available_mb": 9000}', "--json")
    assert hb.code == 0, hb.err
    for args in (["--capacity", "slots"], ["--capacity", "slots=2", "--readings",
                                           '{"capacity": {"slots": 1}}']):
        r = cli("heartbeat", "w2", *args, "--json")
        assert r.code == 2 and r.json["error"]["code"] == "invalid_input", args
    got = cli("claim", "w1", "--json")
    assert got.code == 0 and got.json["job"]["job_id"] == job.json["job_id"]
    assert cli("claim", "w1", "--json").code == 3
    assert [w["worker_id"] for w in cli("workers", "--json").json["workers"]] == ["w1"]


def test_needs_given_twice_on_the_cli_add_up_and_a_name_twice_is_refused(cli):
    """`--needs gpu_mem_mb=12000 --needs slots=1` kept only the last (click's way with an
    option given twice): the job was claimed by a worker with no GPU. They add up, as
    `--capacity` does; a name in both is refused, nothing enqueued."""
    job = cli("enqueue", "k", "--needs", "gpu_mem_mb=12000", "--needs", "slots=1", "--json")
    assert job.code == 0, job.err
    shown = cli("show", str(job.json["job_id"]), "--json")
    assert shown.json["job"]["needs"] == {"gpu_mem_mb": 12000, "slots": 1}
    assert cli("heartbeat", "nogpu", "--capacity", "slots=1", "--json").code == 0
    assert cli("claim", "nogpu", "--json").code == 3
    twice = cli("enqueue", "k", "--needs", "slots=1", "--needs", "slots=2", "--json")
    assert twice.code == 2 and "given twice" in twice.json["error"]["message"], twice.out
    assert cli("jobs", "--json").json["jobs"][-1]["job_id"] == job.json["job_id"]


# --- the worker's own readings ----------------------------------------------------------------

_READ = ("import json, sys\n"
         "{block}\n"
         "from jobcoord.readings import read_machine\n"
         "r = read_machine()\n"
         "print(json.dumps({{'beat': r.as_heartbeat(), 'why': r.sources['gpus']}}))\n")


def _read_in_child(block: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _READ.format(block=block)],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_without_nvml_a_worker_reports_no_gpus_and_no_error() -> None:
    # The library made unimportable, as on a machine without the [gpu] extra.
    got = _read_in_child("sys.modules['pynvml'] = None")
    assert "gpus" not in got["beat"]
    assert "nvidia-ml-py is not installed" in got["why"]
    assert isinstance(got["beat"]["memory_available_mb"], int)


def test_with_nvml_but_no_gpu_a_worker_reports_no_gpus_and_no_error() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed here")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass  # the case this test is for: the library present, no driver or GPU
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: the no-GPU case cannot happen")
    got = _read_in_child("")
    assert "gpus" not in got["beat"] and got["why"].startswith("unavailable: NVML")


def test_a_machine_with_a_gpu_reports_it_through_nvml() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed here")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pytest.skip("no NVIDIA driver or GPU on this machine")
    pynvml.nvmlShutdown()
    got = _read_in_child("")
    assert got["beat"]["gpus"] and set(got["beat"]["gpus"][0]) == {
        "memory_free_mb", "memory_total_mb", "utilization_pct", "temperature_c"}


def test_needs_and_gpu_readings_go_through_the_server(target) -> None:
    from tests.serve_procs import served, token

    sub = token(target, "ci", "submitter")
    work = token(target, "gpu-box", "worker", worker="gpu-box")
    with served(target, "--reap-every", "0") as s, s.client(sub) as http:
        made = http.post("/v1/jobs", json={"kind": "render", "needs": {"gpu_mem_mb": 12000}})
        assert made.status_code == 201
        for bad in ({"gpu_mem_mb": "12000"}, {"gpu mem": 1}, {"gpu_mem_mb": 0}, [1]):
            r = http.post("/v1/jobs", json={"kind": "render", "needs": bad})
            assert r.status_code in (400, 422) and "error" in r.json(), bad
        with s.client(work) as w:
            beat = w.post("/v1/heartbeat", json={"readings": {"gpus": [gpu(8000)]}})
            assert beat.status_code == 200, beat.text
            short = w.post("/v1/claims", json={"wait": 0})
            assert short.status_code == 200 and short.json()["reason"] == "resource_short"
            # A long-poll waits through it: the worker cannot act on a busy GPU.
            assert w.post("/v1/claims", json={"wait": 0.3}).status_code == 204
            w.post("/v1/heartbeat", json={"readings": {"gpus": [gpu(16000)]}})
            got = w.post("/v1/claims", json={"wait": 0})
            assert got.status_code == 200 and got.json()["job"]["job_id"] == made.json()["job_id"]
    with Coordinator.open(target) as c:
        assert c.status()["jobs"]["waiting"] == 0  # the bad submissions changed nothing


def test_the_server_refuses_a_capacity_named_like_a_resource_matched_elsewhere(target) -> None:
    from tests.serve_procs import served, token

    work = token(target, "w1", "worker", worker="w1")
    with Coordinator.open(target) as c:
        job = c.enqueue("big", {}, needs={"ram_mb": 64000})["job_id"]
    good = {"memory_available_mb": 1000, "gpus": [gpu(1000)]}
    with served(target, "--reap-every", "0") as s, s.client(work) as w:
        assert w.post("/v1/heartbeat", json={"readings": good}).status_code == 200
        with Coordinator.open(target) as c:
            before = dump(c)
        for name, source in MATCHED_ELSEWHERE:
            r = w.post("/v1/heartbeat", json={"readings": {**good, "capacity": {name: 999999}}})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "invalid_input"
            assert source in r.json()["error"]["message"]
        with Coordinator.open(target) as c:
            assert dump(c) == before
        refused = w.post("/v1/claims", json={"wait": 0})
        assert refused.status_code == 200 and refused.json()["reason"] == "resource_short"
    with Coordinator.open(target) as c:
        assert c.show(job)["job"]["status"] == "waiting"
