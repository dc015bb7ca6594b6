"""Retention: `prune` deletes finished jobs past an age with everything that belongs to them,
in short batches, and never a job that is waiting, running or unknown, nor the newest job
(whose id SQLite would otherwise hand out again)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from jobcoord.errors import InvalidInput
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.sql import sql
from tests.timeline import T0

IDLE_ON_AC = {"memory_used_pct": 40, "on_battery": False, "user_idle_s": 900}


def run_one(coord: Coordinator, worker: str = "w1") -> tuple[int, int]:
    """Claim the next job as `worker`; returns (job id, epoch)."""
    coord.heartbeat(worker, readings=IDLE_ON_AC)
    got = coord.claim(worker, lease_s=30)
    assert got["job"] is not None, got
    return got["job"]["job_id"], got["lease"]["epoch"]


def finished(coord: Coordinator, count: int) -> None:
    """`count` succeeded jobs, and one newer job left waiting."""
    coord.enqueue_many([{"kind": "embed", "payload": {"n": i}} for i in range(count + 1)])
    for _ in range(count):
        job, epoch = run_one(coord)
        coord.complete(job, "w1", epoch, {})


def every_status(coord: Coordinator, clock: Any) -> dict[str, int]:
    """One job in each status, all created and finished at T0, plus a newer waiting job."""
    ids: dict[str, int] = {}
    for name in ("succeeded", "dead", "running", "unknown"):
        coord.enqueue("embed", {"for": name})
    ids["cancelled"] = coord.enqueue("embed", {"for": "cancelled"})["job_id"]
    coord.cancel(ids["cancelled"])
    ids["waiting"] = coord.enqueue("embed", {"for": "waiting"}, key="k-waiting")["job_id"]
    job, epoch = run_one(coord)
    coord.checkpoint(job, "w1", epoch, "step", {"done": 1})
    coord.complete(job, "w1", epoch, {"ok": True})
    ids["succeeded"] = job
    job, epoch = run_one(coord)
    coord.fail(job, "w1", epoch, "bad input", permanent=True)
    ids["dead"] = job
    ids["running"] = run_one(coord)[0]
    job, epoch = run_one(coord)
    coord.mark_effect(job, "w1", epoch)
    ids["unknown"] = job
    clock.tick(timedelta(seconds=31))
    coord.reap()
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert coord.show(ids["unknown"])["job"]["status"] == "unknown"
    assert coord.show(ids["running"])["job"]["status"] == "waiting"  # its lease was reaped
    ids["running"] = run_one(coord)[0]
    return ids


def status_of(coord: Coordinator, job_id: int) -> str | None:
    return next((j["status"] for j in coord.jobs(limit=10_000)["jobs"]
                 if j["job_id"] == job_id), None)


def test_prune_deletes_only_finished_jobs_past_the_age_with_their_history(
        coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        ids = every_status(coord, clock)
        clock.tick(timedelta(days=2))
        fresh = coord.enqueue("embed", {"for": "fresh"})["job_id"]
        job, epoch = run_one(coord, "w2")
        assert job == ids["waiting"]
        coord.complete(job, "w2", epoch, {"ok": True})  # finished now: too young to go
        out = coord.prune("1d")
    assert out["jobs"] == 3 and out["batches"] == 1
    assert out["statuses"] == ["cancelled", "dead", "succeeded"]
    gone = {ids["succeeded"], ids["dead"], ids["cancelled"]}
    for job_id in gone:
        assert status_of(coord, job_id) is None
    for name in ("running", "unknown", "waiting"):
        assert status_of(coord, ids[name]) is not None, name
    assert status_of(coord, fresh) == "waiting"

    def leftovers(conn: Any) -> tuple[int, int]:
        marks = ", ".join(str(j) for j in gone)
        events = sql(conn, f"SELECT COUNT(*) FROM job_events WHERE job_id IN"
                                   f" ({marks})").scalar()
        points = sql(conn, f"SELECT COUNT(*) FROM checkpoints WHERE job_id IN"
                                   f" ({marks})").scalar()
        return events, points

    assert coord.db.read(leftovers) == (0, 0)
    assert out["checkpoints"] == 1 and out["events"] > 3
    assert check(coord.db)["ok"]


def test_prune_never_touches_waiting_running_or_unknown_jobs_however_old(
        coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        ids = every_status(coord, clock)
        coord.enqueue("embed", {"for": "newest"})
        clock.tick(timedelta(days=400))
        coord.prune(0)
    remaining = {j["status"] for j in coord.jobs()["jobs"]}
    assert remaining == {"waiting", "running", "unknown"}
    for name in ("running", "unknown", "waiting"):
        assert status_of(coord, ids[name]) == name


@pytest.mark.parametrize("status", ["unknown", "running", "waiting", "finished"])
def test_only_finished_statuses_can_be_named(coord: Coordinator, status: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        coord.prune("1d", statuses=[status])
    expected = "settle them with `jobcoord reconcile`" if status == "unknown" else "only finished"
    assert expected in caught.value.message


def test_the_newest_job_is_kept_so_no_id_is_handed_out_twice(coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        coord.enqueue("embed", {"n": 1})
        first, epoch = run_one(coord)
        coord.complete(first, "w1", epoch, {})
        coord.enqueue("embed", {"n": 2})
        newest, epoch = run_one(coord)
        coord.complete(newest, "w1", epoch, {})
        clock.tick(timedelta(days=30))
        out = coord.prune("7d")
        assert out["jobs"] == 1
        assert status_of(coord, first) is None
        assert status_of(coord, newest) == "succeeded"
        again = coord.enqueue("embed", {"n": 3})["job_id"]
    assert again > newest


def test_a_pruned_jobs_idempotency_key_makes_a_new_job(coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        old = coord.enqueue("embed", {"n": 1}, key="report-2026-03")["job_id"]
        job, epoch = run_one(coord)
        coord.complete(job, "w1", epoch, {})
        coord.enqueue("embed", {"n": 2})
        clock.tick(timedelta(days=8))
        assert coord.enqueue("embed", {"n": 1}, key="report-2026-03") == {
            "job_id": old, "created": False}
        out = coord.prune("7d")
        assert out["keys_released"] == 1
        new = coord.enqueue("embed", {"n": 1}, key="report-2026-03")
    assert new["created"] is True and new["job_id"] > old


def test_prune_works_in_batches_of_the_given_size(coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        finished(coord, 5)
        clock.tick(timedelta(hours=2))
        out = coord.prune("1h", batch=2)
    assert (out["jobs"], out["batches"]) == (5, 3)
    assert [j["status"] for j in coord.jobs()["jobs"]] == ["waiting"]


def test_prune_rests_between_batches_so_waiting_workers_get_the_lock(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Back to back, batches would take SQLite's write lock again before a waiting worker's
    busy handler woke (benchmarks/prune.py: a 1.3 s claim). The rest is as long as the batch
    held the lock, or `pause_s`."""
    import jobcoord.core.admin as service

    rests: list[float] = []
    monkeypatch.setattr(service.time, "sleep", rests.append)
    with freeze_time(T0) as clock:
        finished(coord, 7)
        clock.tick(timedelta(hours=2))
        coord.prune("1h", batch=3)
        assert len(rests) == 2 and all(r >= 0 for r in rests)  # after each full batch
        rests.clear()
        job, epoch = run_one(coord)
        coord.complete(job, "w1", epoch, {})
        coord.enqueue("embed", {"n": "newest"})
        clock.tick(timedelta(hours=2))
        coord.prune("1h", batch=1, pause_s=0.25)
    assert rests == [0.25]


def test_a_dry_run_counts_what_prune_would_delete_and_changes_nothing(coord: Coordinator
                                                                      ) -> None:
    with freeze_time(T0) as clock:
        every_status(coord, clock)
        coord.enqueue("embed", {"for": "newest"})
        clock.tick(timedelta(days=3))
        before = dump(coord)
        dry = coord.prune("2d", dry_run=True)
        assert dump(coord) == before
        real = coord.prune("2d")
    counted = ("jobs", "events", "checkpoints", "artifacts", "keys_released")
    assert {k: dry[k] for k in counted} == {k: real[k] for k in counted}
    assert dry["dry_run"] is True and real["jobs"] == 3


def test_statuses_and_tenant_narrow_what_is_pruned(coord: Coordinator) -> None:
    with freeze_time(T0) as clock:
        for tenant in ("acme", "globex"):
            coord.enqueue("embed", {"t": tenant}, tenant=tenant)
            job, epoch = run_one(coord)
            coord.fail(job, "w1", epoch, "no", permanent=True)
            coord.enqueue("embed", {"t": tenant, "n": 2}, tenant=tenant)
            job, epoch = run_one(coord)
            coord.complete(job, "w1", epoch, {})
        coord.enqueue("embed", {"for": "newest"})
        clock.tick(timedelta(days=2))
        out = coord.prune("1d", statuses=["dead"], tenant="acme")
    assert out["jobs"] == 1
    left = sorted((j["tenant"], j["status"]) for j in coord.jobs()["jobs"])
    assert left == [("acme", "succeeded"), ("default", "waiting"), ("globex", "dead"),
                    ("globex", "succeeded")]


def test_prune_from_the_cli(coord: Coordinator, cli: Any) -> None:
    with freeze_time(T0) as clock:
        finished(coord, 1)
        clock.tick(timedelta(days=10))
        dry = cli("prune", "--older-than", "1w", "--dry-run", "--json")
        assert dry.code == 0 and dry.json["jobs"] == 1 and dry.json["dry_run"] is True
        done = cli("prune", "--older-than", "1w", "--status", "succeeded,dead", "--json")
        assert done.code == 0, done.out
        assert done.json["jobs"] == 1 and done.json["statuses"] == ["dead", "succeeded"]
        text = cli("prune", "--older-than", "7d")
    assert text.code == 0 and text.out.startswith("deleted 0 jobs")


@pytest.mark.parametrize("age,seconds", [("90", 90), ("90s", 90), ("15m", 900),
                                         ("1.5h", 5400), ("7D", 604800), ("2w", 1209600)])
def test_ages_are_seconds_or_a_number_with_a_unit(age: str, seconds: float) -> None:
    from jobcoord import validate as v

    assert v.duration(age, "older_than", 0, 10**9) == seconds


@pytest.mark.parametrize("args", [
    ["--older-than", "soon"],
    ["--older-than", "-1"],
    ["--older-than", "7y"],
    # 6M read as six minutes pruned nearly every finished job of someone who meant months.
    ["--older-than", "6M"],
    ["--older-than", "nan"],
    ["--older-than", "1d", "--status", "running"],
    ["--older-than", "1d", "--status", "unknown"],
    ["--older-than", "1d", "--status", ","],
    ["--older-than", "1d", "--batch", "0"],
    ["--older-than", "1d", "--tenant", ""],
    [],
])
def test_bad_prune_input_exits_2_and_deletes_nothing(coord: Coordinator, cli: Any,
                                                     args: list[str]) -> None:
    with freeze_time(T0) as clock:
        finished(coord, 1)
        clock.tick(timedelta(days=30))
        before = dump(coord)
        r = cli("prune", *args, "--json")
    assert r.code == 2, r.out
    assert "Traceback" not in r.out + r.err
    assert dump(coord) == before


def test_an_interrupted_prune_says_in_json_what_its_committed_batches_deleted(
        tmp_path: Path) -> None:
    """`prune --json` stopped by Ctrl-C between batches printed nothing on stdout (the
    contract: one JSON object, an error too) and nothing said that some batches had
    already deleted jobs. Now: exit 130 and one JSON error, `interrupted`, whose details
    count what the committed batches deleted (each batch whole)."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from jobcoord.service import Coordinator

    db = str(tmp_path / "q #1.db")
    with Coordinator.open(db, migrate=True) as c:
        ids = [c.enqueue("k", {})["job_id"] for _ in range(4)]
        for job in ids[:3]:
            c.cancel(job)
    time.sleep(0.01)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", db, "prune", "--older-than", "0s",
         "--batch", "1", "--pause", "30", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    with Coordinator.open(db) as c:
        while len(c.jobs()["jobs"]) == 4:  # the first batch has not committed yet
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    [line] = out.splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "interrupted", error
    assert error["details"]["pruned"]["jobs"] == 1 and error["details"]["pruned"]["batches"] == 1
    with Coordinator.open(db) as c:
        assert len(c.jobs()["jobs"]) == 3


def test_any_command_interrupted_with_json_prints_one_json_error(tmp_path: Path) -> None:
    """Ctrl-C of a `--json` command printed only `jobcoord: interrupted` on stderr."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from jobcoord.service import Coordinator

    db = str(tmp_path / "q.db")
    Coordinator.open(db, migrate=True).close()
    proc = subprocess.Popen(  # waits for its payload on stdin, which never comes
        [sys.executable, "-m", "jobcoord", "--db", db, "enqueue", "k", "--payload-file", "-",
         "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    [line] = out.splitlines()
    assert json.loads(line)["error"]["code"] == "interrupted"
    assert "Traceback" not in err
    with Coordinator.open(db) as c:
        assert c.jobs()["jobs"] == []
