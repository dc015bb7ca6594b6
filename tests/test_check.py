"""`check`: every broken application invariant is reported, and the exit code is 7."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.conftest import dump, run_cli
from tests.sample_state import populate
from tests.timeline import IDLE_ON_AC


def test_check_reports_each_broken_invariant_and_exits_7(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    populate(c)
    assert run_cli(sqlite_target, "check", "--full", "--json").code == 0
    raw = sqlite3.connect(sqlite_target.sqlite_path or "", isolation_level=None)
    raw.execute("DELETE FROM leases")  # a running job now has no lease
    raw.execute("UPDATE jobs SET result_json = NULL WHERE status = 'succeeded'")
    raw.close()
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7
    found = {v["invariant"] for v in r.json["violations"]}
    assert {"running_without_lease", "succeeded_without_result"} <= found
    c.close()


@pytest.mark.parametrize("status", ["succeeded", "dead", "cancelled"])
def test_check_reports_a_finished_job_without_its_finish_time_and_exits_7(
        target: Target, status: str) -> None:
    """A finished job whose finished_at is gone (written outside jobcoord) is never pruned
    (`prune` counts from it) and shows no end: `check` passed it as ok."""
    from sqlalchemy import text

    c = Coordinator.open(target)
    populate(c)
    c.cancel(c.enqueue("k", {})["job_id"])
    c.enqueue("k", {}, max_attempts=1, role="gpu")
    for got in iter(lambda: c.claim("w1"), None):
        if got["job"] is None:
            break
        c.fail(got["job"]["job_id"], "w1", got["lease"]["epoch"], "boom", permanent=True)
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        ids = [r[0] for r in conn.execute(text(
            "SELECT job_id FROM jobs WHERE status = :s ORDER BY job_id"), {"s": status})]
        assert ids, status
        conn.execute(text("UPDATE jobs SET finished_at = NULL WHERE job_id = :j"),
                     {"j": ids[0]})
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v["job_ids"] for v in r.json["violations"]}
    assert found == {"finished_without_finish_time": [ids[0]]}, found


def test_check_reports_a_missing_table_and_exits_7(target: Target) -> None:
    """A database at the current revision whose limits or schedules table is gone (dropped
    by hand, a partial restore) is damaged: `check` says so (exit 7) instead of `ok`."""
    from sqlalchemy import text

    c = Coordinator.open(target)
    c.set_limit("llm", 1)
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(text("DROP TABLE limits"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    missing = [v for v in r.json["violations"] if v["invariant"] == "table_missing"]
    assert missing and missing[0]["tables"] == ["limits"]


def test_check_reports_a_schedule_whose_stored_row_is_unreadable_and_exits_7(
        target: Target) -> None:
    """A schedule row damaged by hand (its payload not a JSON object, its time zone unknown)
    would copy the damage into every job it fires: `check` names it (exit 7)."""
    from sqlalchemy import text

    c = Coordinator.open(target)
    c.add_schedule("good", "k", every=60)
    c.add_schedule("badpayload", "k", every=60)
    c.add_schedule("badzone", "k", cron="0 2 * * *", tz="Europe/Berlin")
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(text("UPDATE schedules SET payload_json = 'not json' "
                          "WHERE name = 'badpayload'"))
        conn.execute(text("UPDATE schedules SET tz = 'Nowhere/Zone' WHERE name = 'badzone'"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "schedule_unreadable"]
    assert found and found[0]["schedules"] == ["badpayload", "badzone"]


DAMAGED = pytest.mark.parametrize(("column", "text", "needs"), [
    ("payload_json", "{broken", None), ("needs_json", "nope", "ram_mb=10")])


def _damaged_job(target: Target, column: str, text: str, needs: str | None
                 ) -> tuple[Coordinator, int, int]:
    """A good job and, first in claim order, one whose `column` was overwritten by hand."""
    from sqlalchemy import text as sql_text

    c = Coordinator.open(target)
    good = c.enqueue("k", {"n": 1}, priority=3)["job_id"]
    bad = c.enqueue("k", {"n": 2}, priority=0, needs=needs)["job_id"]
    c.heartbeat("w1", readings={**IDLE_ON_AC, "memory_available_mb": 1000})
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(sql_text(f"UPDATE jobs SET {column} = :t WHERE job_id = :j"),
                     {"t": text, "j": bad})
    return c, good, bad


@DAMAGED
def test_a_job_whose_stored_json_is_damaged_is_exit_7_naming_it_and_check_reports_it(
        target: Target, column: str, text: str, needs: str | None) -> None:
    """A job's JSON column written by hand: show and explain say which job and which
    column (exit 7, the database is damaged) and change nothing, and `check` lists it."""
    c, good, bad = _damaged_job(target, column, text, needs)
    before = dump(c)
    for args in (("show", str(bad)), ("explain", str(bad))):
        r = run_cli(target, *args, "--json")
        assert r.code == 7, (args, r)
        err = r.json["error"]
        assert err["code"] == "job_unreadable", (args, err)
        assert err["message"].startswith(f"job {bad}: its stored {column} is not valid JSON")
        assert err["details"] == {"job_id": bad, "column": column}
    assert dump(c) == before
    assert run_cli(target, "show", str(good), "--json").code == 0
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "job_unreadable"]
    assert found == [{"invariant": "job_unreadable", "job_ids": [bad],
                      "columns": [{"job_id": bad, "column": column}]}]
    c.close()


def _set_aside_as_dead(c: Coordinator, bad: int, column: str) -> None:
    from sqlalchemy import text as sql_text

    with c.db.engine.begin() as conn:
        status, error = conn.execute(sql_text(
            "SELECT status, last_error FROM jobs WHERE job_id = :j"), {"j": bad}).one()
        events = conn.execute(sql_text(
            "SELECT from_status, to_status, reason, detail FROM job_events "
            "WHERE job_id = :j ORDER BY event_id"), {"j": bad}).all()
    assert status == "dead"
    assert error.startswith(f"its stored {column} is not valid JSON")
    assert [tuple(e) for e in events][-1] == ("waiting", "dead", "job_unreadable",
                                               f'{{"column":"{column}"}}')
    assert [e[2] for e in events].count("claimed") == 0  # never handed to a worker


@DAMAGED
def test_a_claim_sets_a_damaged_waiting_job_aside_as_dead_and_takes_the_next(
        target: Target, column: str, text: str, needs: str | None) -> None:
    """One job written outside jobcoord must not stop every claim: the claim that meets it
    ends it dead with a `job_unreadable` event naming the column, in its own transaction,
    and takes the next job; `check` still lists the damaged row."""
    c, good, bad = _damaged_job(target, column, text, needs)
    r = run_cli(target, "claim", "w1", "--json")
    assert r.code == 0, r
    assert r.json["job"]["job_id"] == good
    _set_aside_as_dead(c, bad, column)
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    assert [v["job_ids"] for v in r.json["violations"]
            if v["invariant"] == "job_unreadable"] == [[bad]]
    c.close()


@DAMAGED
@pytest.mark.parametrize("call", ["claim_many", "complete_and_claim"])
def test_batch_and_chained_claims_set_a_damaged_job_aside_too(
        target: Target, column: str, text: str, needs: str | None, call: str) -> None:
    """claim_many and complete_and_claim meet the damaged job inside a transaction that
    rolls back whole (the completion too): the job is set aside and the call runs again,
    its completion judged afresh and accepted once."""
    c, good, bad = _damaged_job(target, column, text, needs)
    if call == "claim_many":
        got = c.claim_many("w1", 5)
        assert [j["job"]["job_id"] for j in got["claimed"]] == [good]
    else:
        first = c.enqueue("k", {"n": 0}, priority=0)["job_id"]
        with c.db.engine.begin() as conn:  # the bad job waits behind the running one
            from sqlalchemy import text as sql_text
            conn.execute(sql_text("UPDATE jobs SET priority = 1 WHERE job_id = :j"),
                         {"j": bad})
        lease = c.claim("w1")
        assert lease["job"]["job_id"] == first
        both = c.complete_and_claim(first, "w1", lease["lease"]["epoch"], {"ok": True})
        assert both["completed"]["status"] == "succeeded"
        assert both["next"]["job"]["job_id"] == good
        assert c.show(first)["job"]["result"] == {"ok": True}
        assert [e["reason"] for e in c.show(first)["events"]].count("completed") == 1
    _set_aside_as_dead(c, bad, column)
    c.close()


def test_set_aside_says_claim_again_unless_the_damaged_job_is_still_held(
        target: Target) -> None:
    """Setting aside reads the job again in its own transaction and answers whether the
    claim should run again: yes when it ended the job, when another claim already had (one
    event, not two), and when the job was repaired meanwhile (it stays waiting and is
    claimable); no for a running job (a lease a limit reads) or a wrong reference, where the
    claim reports the damage it saw."""
    from sqlalchemy import text as sql_text

    from jobcoord.core.claim import set_aside

    c, _good, bad = _damaged_job(target, "payload_json", "{broken", None)
    with c.db.engine.begin() as conn:
        conn.execute(sql_text("UPDATE jobs SET payload_json = '{}' WHERE job_id = :j"),
                     {"j": bad})
    assert set_aside(c, {"job_id": bad, "column": "payload_json"}) is True
    assert c.show(bad)["job"]["status"] == "waiting"
    assert set_aside(c, {"job_id": "x", "column": "payload_json"}) is False
    assert set_aside(c, {"job_id": bad, "column": "kind"}) is False
    with c.db.engine.begin() as conn:
        conn.execute(sql_text("UPDATE jobs SET payload_json = '{x' WHERE job_id = :j"),
                     {"j": bad})
    assert set_aside(c, {"job_id": bad, "column": "payload_json"}) is True
    assert set_aside(c, {"job_id": bad, "column": "payload_json"}) is True  # already ended
    _set_aside_as_dead(c, bad, "payload_json")
    with c.db.engine.begin() as conn:
        events = conn.execute(sql_text("SELECT COUNT(*) FROM job_events WHERE job_id = :j "
                                       "AND reason = 'job_unreadable'"), {"j": bad}).scalar()
    assert events == 1
    held = c.claim("w1")["job"]["job_id"]
    with c.db.engine.begin() as conn:
        conn.execute(sql_text("UPDATE jobs SET payload_json = '{x' WHERE job_id = :j"),
                     {"j": held})
    assert set_aside(c, {"job_id": held, "column": "payload_json"}) is False
    assert c.db.engine.connect().execute(sql_text(
        "SELECT status FROM jobs WHERE job_id = :j"), {"j": held}).scalar() == "running"
    c.close()


def test_claimers_racing_over_damaged_jobs_each_take_a_good_one(target: Target) -> None:
    """Several processes' claims meet the same damaged jobs at once: whichever sets a job
    aside, every other claim goes on to the next job instead of failing on one that is
    already ended."""
    import threading

    from sqlalchemy import text as sql_text

    n_bad, n_claimers = 12, 4
    c = Coordinator.open(target)
    good = [c.enqueue("k", {"n": i}, priority=3)["job_id"] for i in range(n_claimers * 3)]
    bad = [c.enqueue("k", {"n": -i}, priority=0)["job_id"] for i in range(n_bad)]
    with c.db.engine.begin() as conn:
        for j in bad:
            conn.execute(sql_text("UPDATE jobs SET payload_json = '{x' WHERE job_id = :j"),
                         {"j": j})
    claimers = [Coordinator.open(target) for _ in range(n_claimers)]
    for i, k in enumerate(claimers):
        k.heartbeat(f"w{i}", readings=IDLE_ON_AC)
    start = threading.Barrier(n_claimers)
    got: dict[int, list[Any]] = {i: [] for i in range(n_claimers)}

    def claim(i: int) -> None:
        start.wait()
        for _ in range(3):
            try:
                got[i].append(claimers[i].claim(f"w{i}")["job"]["job_id"])
            except Exception as e:
                got[i].append(getattr(e, "code", repr(e)))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(n_claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    taken = [j for answers in got.values() for j in answers]
    assert sorted(taken, key=str) == sorted(good, key=str), got
    for j in bad:
        _set_aside_as_dead(c, j, "payload_json")
    for k in claimers:
        k.close()
    c.close()


WORKER_DAMAGE = pytest.mark.parametrize(("column", "text"), [
    ("roles_json", "{broken"), ("kinds_json", "[1"), ("heartbeat_raw", "{x")])


@WORKER_DAMAGE
def test_a_worker_row_damaged_outside_jobcoord_is_stale_until_its_next_heartbeat(
        target: Target, column: str, text: str) -> None:
    """A worker's row whose stored JSON does not parse (edited by hand, a broken restore)
    is no internal error anywhere: that worker's claims are refused as `heartbeat_stale`
    (exit 3) naming the column, `workers` and `explain` list it as stale, `check` reports it
    (exit 7), nothing else changes, and its next heartbeat rewrites the row."""
    from sqlalchemy import text as sql_text

    c = Coordinator.open(target)
    job = c.enqueue("k", {"n": 1}, needs="ram_mb=10")["job_id"]
    c.heartbeat("w1", readings={**IDLE_ON_AC, "memory_available_mb": 1000}, kinds=["k"])
    c.heartbeat("w2", readings={**IDLE_ON_AC, "memory_available_mb": 1000}, kinds=["k"])
    with c.db.engine.begin() as conn:
        conn.execute(sql_text(f"UPDATE workers SET {column} = :t WHERE worker_id = 'w1'"),
                     {"t": text})
    r = run_cli(target, "claim", "w1", "--json")
    assert r.code == 3, r
    assert r.json["reason"] == "heartbeat_stale"
    assert f"stored {column} is not valid JSON" in r.json["detail"]
    assert c.claimable("w1") is False
    before = dump(c)
    r = run_cli(target, "workers", "--json")
    assert r.code == 0, r
    w1 = {w["worker_id"]: w for w in r.json["workers"]}["w1"]
    assert w1["gates"]["refusal"]["reason"] == "heartbeat_stale", w1["gates"]
    assert w1["gates"]["can_claim"] is False and w1["roles"] == []
    r = run_cli(target, "explain", str(job), "--json")
    assert r.code == 0, r
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "worker_unreadable"]
    assert found == [{"invariant": "worker_unreadable", "job_ids": [],
                      "workers": [{"worker_id": "w1", "column": column}]}], found
    assert dump(c) == before
    c.heartbeat("w1", readings={**IDLE_ON_AC, "memory_available_mb": 1000}, kinds=["k"])
    assert c.claim("w1")["job"]["job_id"] == job
    assert run_cli(target, "check", "--json").code == 0
    c.close()


def _job_with_history(target: Target) -> tuple[Coordinator, int, int]:
    """A job that failed once after saving a checkpoint (so its next claim hands the
    checkpoint over), and a good job behind it."""
    c = Coordinator.open(target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    first = c.enqueue("k", {"n": 1}, priority=0)["job_id"]
    got = c.claim("w1")
    c.checkpoint(first, "w1", got["lease"]["epoch"], "remote_submitted", {"remote_id": "R-1"})
    c.fail(first, "w1", got["lease"]["epoch"], "boom")
    good = c.enqueue("k", {"n": 2}, priority=3)["job_id"]
    from sqlalchemy import text as sql_text

    with c.db.engine.begin() as conn:  # due again at once
        conn.execute(sql_text("UPDATE jobs SET run_after = 0 WHERE job_id = :j"), {"j": first})
    return c, first, good


def test_a_damaged_checkpoint_sets_its_job_aside_instead_of_handing_it_out_without_it(
        target: Target) -> None:
    """A checkpoint records what an earlier attempt did (a paid external call): its data
    damaged outside jobcoord, the job is never handed out without it. The claim sets the
    job aside as dead naming the checkpoint column and takes the next one; `show` exits 7
    naming it; `check` lists it."""
    from sqlalchemy import text as sql_text

    c, first, good = _job_with_history(target)
    with c.db.engine.begin() as conn:
        conn.execute(sql_text("UPDATE checkpoints SET data_json = '{x' WHERE job_id = :j"),
                     {"j": first})
    r = run_cli(target, "show", str(first), "--json")
    assert r.code == 7, r
    assert r.json["error"]["details"] == {"job_id": first, "column": "checkpoints.data_json"}
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    assert [v["columns"] for v in r.json["violations"] if v["invariant"] == "job_unreadable"
            ] == [[{"job_id": first, "column": "checkpoints.data_json"}]]
    assert c.claim("w1")["job"]["job_id"] == good
    with c.db.engine.begin() as conn:
        status, error = conn.execute(sql_text(
            "SELECT status, last_error FROM jobs WHERE job_id = :j"), {"j": first}).one()
    assert status == "dead"
    assert error.startswith("its stored checkpoints.data_json is not valid JSON")
    c.close()


def test_a_damaged_event_detail_is_exit_7_on_show_and_listed_by_check(target: Target) -> None:
    """An event's detail damaged outside jobcoord: `show` of its job exits 7 naming the job
    and the column, `check` lists it, and claims, resubmissions and the job's other reads
    go on (events are history, never read to decide)."""
    from sqlalchemy import text as sql_text

    c = Coordinator.open(target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    job = c.enqueue("k", {"n": 1}, key="doc-1", max_attempts=4)["job_id"]
    with c.db.engine.begin() as conn:
        conn.execute(sql_text("UPDATE job_events SET detail = '{x' WHERE job_id = :j"),
                     {"j": job})
    r = run_cli(target, "show", str(job), "--json")
    assert r.code == 7, r
    assert r.json["error"]["code"] == "job_unreadable"
    assert r.json["error"]["details"] == {"job_id": job, "column": "job_events.detail"}
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    assert [v["columns"] for v in r.json["violations"] if v["invariant"] == "job_unreadable"
            ] == [[{"job_id": job, "column": "job_events.detail"}]]
    again = c.enqueue("k", {"n": 1}, key="doc-1", max_attempts=4)
    assert again["job_id"] == job
    assert c.claim("w1")["job"]["job_id"] == job
    c.close()


# --- a lease row left on a waiting job ------------------------------------------------------
#
# The job's status is what counts: a lease row on a job that is waiting (left by a crash of an
# older version, or written by hand) is nobody's lease. `check` reports it
# (`lease_on_job_not_running`); the claim that takes the job replaces it in its own
# transaction, at an epoch above both the job's and the stray row's, so a process holding
# either is fenced out. Before, its insert of the new lease hit the one-lease-per-job key and
# every claim failed (exit 1): one row stopped the whole queue.

STRAY_CALLS = ["claim", "claim_many", "complete_and_claim", "enqueue_and_claim",
               "claim_limited", "claim_many_limited"]


def _stray_lease(c: Coordinator, job: int, epoch: Any) -> None:
    import time

    from sqlalchemy import text as sql_text

    now = int(time.time() * 1_000_000)
    with c.db.engine.begin() as conn:  # live-looking: it expires in an hour
        conn.execute(sql_text(
            "INSERT INTO leases (job_id, worker_id, epoch, granted_at, expires_at) "
            "VALUES (:j, 'ghost', :e, :now, :later)"),
            {"j": job, "e": epoch, "now": now, "later": now + 3600 * 1_000_000})


@pytest.mark.parametrize("stray_epoch", [0, 7, 2**31 - 1], ids=["below", "above", "max"])
@pytest.mark.parametrize("call", STRAY_CALLS)
def test_a_stray_lease_on_a_waiting_job_is_replaced_by_the_claim_that_takes_the_job(
        target: Target, call: str, stray_epoch: int) -> None:
    from jobcoord.core.handover import Claimant, enqueue_and_claim
    from jobcoord.errors import Refused
    from jobcoord.maintenance import check

    c = Coordinator.open(target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    if call.endswith("_limited"):
        c.set_limit("k", 5)  # the claim checks each candidate against the limit
    stray = c.enqueue("k", {"i": "stray"}, priority=1)["job_id"]
    after = c.enqueue("k", {"i": "after"}, priority=2)["job_id"]
    # The job has a history: claimed once at epoch 1, released, waiting again.
    assert c.claim("w1")["job"]["job_id"] == stray
    c.fail(stray, "w1", 1, "shutting down", reason="worker_shutdown")
    running = None
    if call == "complete_and_claim":
        running = c.enqueue("k", {"i": "first"}, priority=0)["job_id"]
        assert c.claim("w1")["job"]["job_id"] == running
    _stray_lease(c, stray, stray_epoch)
    found = {v["invariant"]: v["job_ids"] for v in check(c.db)["violations"]}
    assert found.get("lease_on_job_not_running") == [stray], found

    if call in ("claim", "claim_limited"):
        got = [c.claim("w1")]
    elif call in ("claim_many", "claim_many_limited"):
        got = c.claim_many("w1", 5)["claimed"]
        assert [g["job"]["job_id"] for g in got] == [stray, after], got
    elif call == "complete_and_claim":
        assert running is not None
        both = c.complete_and_claim(running, "w1", 1, {"ok": True})
        assert both["completed"]["status"] == "succeeded"
        got = [both["next"]]
    else:
        handed = enqueue_and_claim(c, "k", {"i": "new"}, priority=3,
                                   claimant=Claimant("w1"))
        got = [handed["claimed"]]
    assert got[0] is not None and got[0]["job"]["job_id"] == stray, got
    epoch = got[0]["lease"]["epoch"]
    # Above the job's epoch (1) and above the stray row's, unless that one is an epoch no
    # claim can give (the schema's largest): then above the job's.
    assert epoch == (max(1, stray_epoch) if stray_epoch < 2**31 - 1 else 1) + 1, got

    shown = c.show(stray)
    assert shown["job"]["status"] == "running" and shown["job"]["epoch"] == epoch
    assert (shown["lease"]["worker_id"], shown["lease"]["epoch"]) == ("w1", epoch)
    assert check(c.db)["ok"], check(c.db)
    # Whoever held the stray row, or the job's earlier epoch, is fenced out.
    for who, their_epoch in (("ghost", stray_epoch), ("w1", 1), ("ghost", epoch)):
        with pytest.raises(Refused):
            c.complete(stray, who, their_epoch, {"late": True})
    done = c.complete(stray, "w1", epoch, {"ok": True})
    assert done["status"] == "succeeded"
    claimed = [e for e in c.show(stray)["events"] if e["reason"] == "claimed"]
    assert [e["epoch"] for e in claimed] == [1, epoch]
    c.close()


@pytest.mark.parametrize("end", ["cancel", "deadline"])
def test_a_waiting_job_that_ends_takes_its_stray_lease_with_it(target: Target, clock: Any,
                                                               end: str) -> None:
    """A waiting job ended by a cancel or by its deadline leaves no lease behind: a final
    job is never claimed again, so no later claim would replace the row, and `status` and
    `check` would report a lease on it for good."""
    from jobcoord.maintenance import check

    c = Coordinator.open(target)
    job = c.enqueue("k", {}, deadline_s=60 if end == "deadline" else None)["job_id"]
    _stray_lease(c, job, 7)
    if end == "cancel":
        assert c.cancel(job)["status"] == "cancelled"
    else:
        clock.tick(120)
        assert c.reap()["deadline_dead"] == 1
    shown = c.show(job)
    assert shown["job"]["status"] in ("cancelled", "dead") and shown["lease"] is None
    assert c.status()["active_leases"] == 0, c.status()
    assert check(c.db)["ok"], check(c.db)
    c.close()


def test_a_stray_lease_never_stops_the_claim_command(target: Target) -> None:
    c = Coordinator.open(target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    jobs = [c.enqueue("k", {"i": i})["job_id"] for i in range(2)]
    _stray_lease(c, jobs[0], 3)
    assert run_cli(target, "check", "--json").code == 7
    for job in jobs:
        r = run_cli(target, "claim", "w1", "--json")
        assert r.code == 0 and r.json["job"]["job_id"] == job, r
    assert r.json["lease"]["epoch"] == 1
    assert c.show(jobs[0])["job"]["epoch"] == 4
    assert run_cli(target, "check", "--json").code == 0
    c.close()


@pytest.mark.parametrize("stored", ["'x'", "2.5", "-3"], ids=["text", "real", "negative"])
def test_a_stray_lease_whose_epoch_is_not_a_whole_epoch_never_makes_one(
        sqlite_target: Target, stored: str) -> None:
    """SQLite keeps any value in the stray row's epoch: the claim's epoch stays a whole
    number above the job's (and above the row's whole part)."""
    from sqlalchemy import text as sql_text

    c = Coordinator.open(sqlite_target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    job = c.enqueue("k", {})["job_id"]
    _stray_lease(c, job, 0)
    with c.db.engine.begin() as conn:
        conn.execute(sql_text(f"UPDATE leases SET epoch = {stored}"))
    got = c.claim("w1")
    assert got["job"]["job_id"] == job
    assert got["lease"]["epoch"] == (3 if stored == "2.5" else 1), got
    assert type(c.show(job)["job"]["epoch"]) is int
    c.close()


@pytest.mark.parametrize("drop", ["index", "trigger", "unique", "foreign_key", "cascade"])
def test_check_reports_an_index_or_trigger_dropped_by_hand_and_exits_7(
        target: Target, drop: str) -> None:
    """An index, a counting trigger or a uniqueness dropped by hand left `check` saying ok:
    claims slowed to a scan, `job_counts` drifted from the jobs with every change, two jobs
    could share an idempotency key. `check` names what is missing (exit 7)."""
    from sqlalchemy import text

    c = Coordinator.open(target, migrate=True)
    c.enqueue("k", {})
    assert run_cli(target, "check", "--json").code == 0
    sqlite = target.sqlite_path is not None
    # SQLite cannot drop a UNIQUE constraint, only make the table again without its keys
    # (which it names not: `check` finds them by their columns).
    rebuilt = ("CREATE TABLE t2 AS SELECT * FROM tokens; DROP TABLE tokens; "
               "ALTER TABLE t2 RENAME TO tokens")
    statement, name = {
        "index": ("DROP INDEX ix_jobs_claim_roleless", "ix_jobs_claim_roleless"),
        "trigger": ("DROP TRIGGER jobs_counted_update" + ("" if sqlite else " ON jobs"),
                    "jobs_counted_update"),
        "unique": (rebuilt if sqlite else "ALTER TABLE tokens DROP CONSTRAINT uq_tokens_name",
                   "uq_tokens_name"),
        "foreign_key": ("; ".join(_without_foreign_key(c, "job_events")) if sqlite else
                        "ALTER TABLE job_events DROP CONSTRAINT fk_job_events_job_id_jobs",
                        "fk_job_events_job_id_jobs"),
        # Made again under its name without ON DELETE CASCADE: `prune` failed, exit 1.
        "cascade": ("; ".join(_without_foreign_key(c, "job_events", cascade_only=True))
                    if sqlite else
                    "ALTER TABLE job_events DROP CONSTRAINT fk_job_events_job_id_jobs; "
                    "ALTER TABLE job_events ADD CONSTRAINT fk_job_events_job_id_jobs "
                    "FOREIGN KEY (job_id) REFERENCES jobs (job_id)",
                    "fk_job_events_job_id_jobs"),
    }[drop]
    with c.db.engine.begin() as conn:
        for one in statement.split("; "):
            conn.execute(text(one))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = [v for v in r.json["violations"] if v["invariant"] == "schema_object_missing"]
    names = [o["name"] for o in found[0]["objects"]] if found else []
    if drop == "unique" and sqlite:  # the rebuilt table lost its primary key too
        assert sorted(names) == ["pk_tokens", "uq_tokens_name", "uq_tokens_token_hash"], found
    else:
        assert names == [name], found


@pytest.mark.parametrize("index,command", [
    ("my_u ON job_events (job_id)", ["claim", "w1", "--json"]),
    ("my_k ON jobs (kind)", ["enqueue", "k", "--json"]),
])
def test_a_unique_index_added_by_hand_is_found_by_check_and_commands_it_refuses_exit_7(
        target: Target, index: str, command: list[str]) -> None:
    """A UNIQUE index jobcoord never makes, added by hand, refuses jobcoord's own writes
    (a job's second event, a second job of a kind): `check` and `backup` said ok and the
    command failed as an internal error, exit 1. `check` names it (`index_unexpected`),
    the command is exit 7 `schema_damaged` naming it, nothing changed. An index of one's
    own that is not unique refuses nothing: not a finding."""
    from sqlalchemy import text

    c = Coordinator.open(target, migrate=True)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    c.enqueue("k", {})
    name = index.split()[0]
    with c.db.engine.begin() as conn:
        conn.execute(text("CREATE INDEX mine ON jobs (kind, priority)"))
        # Over the primary key's column and more: it refuses nothing either.
        conn.execute(text("CREATE UNIQUE INDEX mine_too ON jobs (job_id, kind)"))
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        conn.execute(text(f"CREATE UNIQUE INDEX {index}"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "index_unexpected"]
    assert [i["name"] for i in found["indexes"]] == [name], found
    with Coordinator.open(target) as c:
        before = dump(c)
    r = run_cli(target, *command)
    assert r.code == 7, r
    assert r.json["error"]["code"] == "schema_damaged" and name in r.json["error"]["message"]
    with Coordinator.open(target) as c:
        assert dump(c) == before


def test_a_counting_trigger_made_again_under_its_name_doing_more_is_found_by_check(
        sqlite_target: Target, tmp_path: Any) -> None:
    """jobs_counted_insert dropped and made again by hand under its own name, counting as
    before and rewriting every new job's payload: `check`, `backup` and `restore` said ok
    (only the name was looked at), and every job submitted after the restore was
    rewritten. Its definition is compared with the one its revision made (SQLite keeps a
    trigger's text): `trigger_changed`, exit 7, and `backup` refuses to copy it."""
    c = Coordinator.open(sqlite_target)
    c.enqueue("k", {"a": 1})
    c.close()
    assert run_cli(sqlite_target, "check", "--json").code == 0
    with sqlite3.connect(sqlite_target.sqlite_path or "") as conn:
        conn.executescript(
            "DROP TRIGGER jobs_counted_insert; CREATE TRIGGER jobs_counted_insert AFTER "
            "INSERT ON jobs BEGIN INSERT INTO job_counts (shard, tenant, status, kind, "
            "attempts, n) VALUES (0, NEW.tenant, NEW.status, NEW.kind, NEW.attempts, 1) "
            "ON CONFLICT (shard, tenant, status, kind, attempts) DO UPDATE SET n = n + 1; "
            "UPDATE jobs SET payload_json = '{\"hijacked\": 1}' WHERE job_id = "
            "NEW.job_id; END;")
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "trigger_changed"]
    assert [t["name"] for t in found["triggers"]] == ["jobs_counted_insert"], found
    r = run_cli(sqlite_target, "backup", str(tmp_path / "b.db"), "--json")
    assert r.code == 7 and not (tmp_path / "b.db").exists(), r


def test_a_counting_trigger_function_replaced_on_postgresql_is_found_by_check(
        target: Target) -> None:
    """On PostgreSQL a counting trigger's work is its function's: one replaced by hand
    (CREATE OR REPLACE, counting as before and rewriting every moved job's payload)
    passed `check`. Each trigger's function and its body are compared with the
    revision's statements: `trigger_changed`, exit 7."""
    from sqlalchemy import text

    if target.sqlite_path is not None:
        pytest.skip("PostgreSQL: SQLite's triggers hold their own text (the test above)")
    c = Coordinator.open(target, migrate=True)
    c.enqueue("k", {"a": 1})
    assert run_cli(target, "check", "--json").code == 0
    with c.db.engine.begin() as conn:
        body = conn.execute(text("SELECT prosrc FROM pg_proc WHERE proname = "
                                 "'jobcoord_job_moved'")).scalar_one()
        evil = body.replace("RETURN NULL;", "UPDATE jobs SET payload_json = '{}' "
                            "WHERE job_id = NEW.job_id; RETURN NULL;")
        assert evil != body
        conn.execute(text("CREATE OR REPLACE FUNCTION jobcoord_job_moved() RETURNS trigger "
                          "LANGUAGE plpgsql AS $$" + evil + "$$"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "trigger_changed"]
    assert [t["name"] for t in found["triggers"]] == ["jobs_counted_update"], found


def test_a_unique_made_with_a_table_made_again_is_found_and_commands_it_refuses_exit_7(
        sqlite_target: Target) -> None:
    """`tokens` made again by hand with a UNIQUE(role) of its own: SQLite names that index
    sqlite_autoindex_*, no statement of anyone's, and `check` said ok while a second
    worker token was refused as exit 1. Judged by its columns, as a key is: found."""
    c = Coordinator.open(sqlite_target)
    c.close()
    assert run_cli(sqlite_target, "token", "create", "a", "--role", "worker", "--worker",
                   "w1", "--json").code == 0
    with sqlite3.connect(sqlite_target.sqlite_path or "") as conn:
        made = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'tokens'").fetchone()[0]
        conn.executescript(
            "PRAGMA foreign_keys = OFF; ALTER TABLE tokens RENAME TO old_tokens; "
            + made.rstrip().rstrip(")") + ", UNIQUE (role)); "
            "INSERT INTO tokens SELECT * FROM old_tokens; DROP TABLE old_tokens;")
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "index_unexpected"]
    assert [i["name"] for i in found["indexes"]] == ["sqlite_autoindex_tokens_3"], found
    r = run_cli(sqlite_target, "token", "create", "b", "--role", "worker", "--worker", "w9",
                "--json")
    assert r.code == 7 and r.json["error"]["code"] == "schema_damaged", r


def test_a_check_constraint_changed_dropped_or_added_by_hand_is_found_by_check(
        target: Target) -> None:
    """`limits` made again by hand with its concurrency CHECK narrowed (SQLite), or that
    CHECK dropped and another added (PostgreSQL): `check` said ok, and `limit set k
    --concurrency 3` was refused exit 7 `row_breaks_check`, "check names every such row",
    which named none. `check` names each (`check_changed`)."""
    from sqlalchemy import text

    c = Coordinator.open(target, migrate=True)
    c.set_limit("k", 1)
    assert run_cli(target, "check", "--json").code == 0
    if target.sqlite_path is not None:
        c.close()
        with sqlite3.connect(target.sqlite_path) as conn:
            made = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'limits'"
                                ).fetchone()[0]
            narrowed = made.replace("CHECK (concurrency >= 1)",
                                    "CHECK (concurrency >= 1 AND concurrency < 2)")
            assert narrowed != made, made
            conn.executescript(
                "PRAGMA foreign_keys = OFF; ALTER TABLE limits RENAME TO old_limits; "
                f"{narrowed}; INSERT INTO limits SELECT * FROM old_limits; "
                "DROP TABLE old_limits;")
        expected = [("ck_limits_concurrency", "changed")]
    else:
        with c.db.engine.begin() as conn:
            conn.execute(text("ALTER TABLE limits DROP CONSTRAINT ck_limits_concurrency"))
            conn.execute(text("ALTER TABLE limits ADD CONSTRAINT mine CHECK "
                              "(concurrency < 2)"))
        c.close()
        expected = [("ck_limits_concurrency", "missing"), ("mine", "unexpected")]
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "check_changed"]
    assert [(k["name"], k["change"]) for k in found["checks"]] == expected, found


def _without_foreign_key(c: Coordinator, table: str, *, cascade_only: bool = False
                         ) -> list[str]:
    """SQLite cannot drop a foreign key: the statements that make `table` again as it was
    (same columns, keys and indexes, its rows) but for its foreign keys (`cascade_only`:
    but for their ON DELETE CASCADE)."""
    import re

    from sqlalchemy import text

    with c.db.engine.connect() as conn:
        made = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :t"),
                            {"t": table}).scalar_one()
        indexes = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'index' "
                                    "AND tbl_name = :t AND sql IS NOT NULL"),
                               {"t": table}).scalars().all()
    if cascade_only:
        bare = made.replace(" ON DELETE CASCADE", "")
        assert bare != made and "REFERENCES" in bare, bare
    else:
        bare = re.sub(r",\s*CONSTRAINT \w+ FOREIGN KEY[^\n]*", "", made)
        assert bare != made and "REFERENCES" not in bare, bare
    return [f"ALTER TABLE {table} RENAME TO old_{table}", bare,
            f"INSERT INTO {table} SELECT * FROM old_{table}", f"DROP TABLE old_{table}",
            *indexes]


def test_check_reports_rows_whose_job_is_gone_and_exits_7(target: Target) -> None:
    """A job deleted by hand under its events: by SQLite's shell (foreign keys not
    enforced) or on PostgreSQL with triggers off (session_replication_role = replica, as
    a replication tool or a restore with --disable-triggers runs). SQLite's check listed
    them; PostgreSQL's said ok, and a transfer back failed half way."""
    from sqlalchemy import text

    c = Coordinator.open(target, migrate=True)
    gone = c.enqueue("k", {})["job_id"]
    c.enqueue("k", {})
    assert run_cli(target, "check", "--json").code == 0
    if target.sqlite_path is None:
        with c.db.engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text("DELETE FROM jobs WHERE job_id = :j"), {"j": gone})
    else:
        with sqlite3.connect(target.sqlite_path) as plain:
            # Tables of one's own with an orphan of their own: the owner's, not judged (it
            # made `check` exit 7 and `backup` refuse the database).
            plain.executescript(
                "CREATE TABLE my_parent (id INTEGER PRIMARY KEY); CREATE TABLE my_child "
                "(id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES my_parent (id)); "
                "INSERT INTO my_parent VALUES (1); INSERT INTO my_child VALUES (1, 1); "
                "DELETE FROM my_parent; "
                # A key SQLite cannot check at all (no such parent column): the whole
                # file's check raised `foreign key mismatch`: check exit 1, internal_error.
                "CREATE TABLE my_odd (id INTEGER PRIMARY KEY, "
                "parent_id INTEGER REFERENCES my_parent (nope)); "
                "INSERT INTO my_odd VALUES (1, 1);")
        assert run_cli(target, "check", "--json").code == 0
        with sqlite3.connect(target.sqlite_path) as plain:
            plain.execute("DELETE FROM jobs WHERE job_id = ?", (gone,))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    assert {row[0] for row in r.json["foreign_key_violations"]} == {"job_events"}, r.json


def test_check_in_a_fresh_process_reports_every_partial_index_dropped_by_hand(
        target: Target) -> None:
    """The partial indexes (claim order per role, per tenant, finished jobs, expired leases:
    those with a WHERE) are attached to the models only on demand; a `check` process that
    had not attached them looked for none, said ok with all of them dropped, and `backup`
    copied the database as good. Run as its own process, as an operator runs it."""
    import json
    import subprocess

    from sqlalchemy import text

    from jobcoord.schema import add_partial_indexes, metadata
    from tests.serve_procs import db_args, jobcoord_argv

    add_partial_indexes()
    partial = sorted(str(i.name) for t in metadata.sorted_tables for i in t.indexes
                     if i.dialect_options["sqlite"]["where"] is not None)
    assert {"ix_jobs_claim_role", "ix_jobs_finished_at", "ix_job_events_lease_expired"
            } <= set(partial), partial
    c = Coordinator.open(target, migrate=True)
    c.enqueue("k", {})
    with c.db.engine.begin() as conn:
        partial = sorted(set(partial) & c.db.schema_object_names(conn))  # (features: not all)
        for name in partial:
            conn.execute(text(f"DROP INDEX {name}"))
    c.close()
    done = subprocess.run([*jobcoord_argv(), *db_args(target), "check", "--json"],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 7, (done.stdout, done.stderr)
    found = [v for v in json.loads(done.stdout)["violations"]
             if v["invariant"] == "schema_object_missing"]
    assert found and sorted(o["name"] for o in found[0]["objects"]) == partial, found


@pytest.mark.parametrize("damage", ["leases.epoch", "workers.roles_json", "schedules.tz",
                                    "table job_counts"])
def test_check_reports_a_column_or_derived_table_dropped_by_hand_and_exits_7(
        target: Target, damage: str) -> None:
    """A column dropped by hand made `check` exit 1 (its own statements read the column:
    "no such column"); the tables jobcoord keeps beside the core ones (job_counts,
    claim_refusals, metric_folds) were not looked for at all, and check said ok."""
    from sqlalchemy import text

    c = Coordinator.open(target, migrate=True)
    c.enqueue("k", {})
    assert run_cli(target, "check", "--json").code == 0
    if damage.startswith("table "):
        statement = f"DROP TABLE {damage.split()[1]}"
    else:
        table, column = damage.split(".")
        statement = f"ALTER TABLE {table} DROP COLUMN {column}"
    with c.db.engine.begin() as conn:
        conn.execute(text(statement))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    if damage.startswith("table "):
        assert found["table_missing"]["tables"] == [damage.split()[1]]
    else:
        assert found["column_missing"]["columns"] == [damage]


@pytest.mark.parametrize("damage,command,code", [
    ("ALTER TABLE leases DROP CONSTRAINT pk_leases", ["claim", "w1", "--json"],
     "schema_damaged"),
    ("ALTER TABLE jobs DROP COLUMN run_after", ["enqueue", "k", "--json"], "column_missing"),
])
def test_a_command_on_a_schema_damaged_by_hand_is_corrupt_exit_7_never_internal(
        target: Target, damage: str, command: list[str], code: str) -> None:
    """A key or a column dropped by hand made `claim` or `enqueue` exit 1 as an internal
    error ("no unique or exclusion constraint matching the ON CONFLICT", "column does not
    exist"). jobcoord's statements are fixed: only a schema changed outside it makes them
    fail so, which is damage, exit 7; a missing column is named (`column_missing`, as
    `check` names it), on SQLite too, whose one generic error code the schema look
    explains. SQLite cannot drop a primary key: that case is PostgreSQL's."""
    from sqlalchemy import text

    if target.sqlite_path and "CONSTRAINT" in damage:
        pytest.skip("SQLite cannot drop a constraint")
    c = Coordinator.open(target, migrate=True)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    c.enqueue("k", {})
    with c.db.engine.begin() as conn:
        conn.execute(text(damage))
    c.close()
    r = run_cli(target, *command)
    assert r.code == 7, r
    assert r.json["error"]["code"] == code
    if code == "column_missing":
        assert r.json["error"]["details"]["columns"] == ["jobs.run_after"]


@pytest.mark.parametrize("on", ["jobs", '"JOBS"', "alembic_version"])
def test_check_reports_a_trigger_on_jobcoords_tables_it_never_makes_and_exits_7(
        target: Target, on: str) -> None:
    """A trigger of someone's on `jobs` changes its rows behind the coordinator's rules;
    `check` said ok. It names it (`trigger_unexpected`, exit 7), on both databases. On
    alembic_version too: one there ran at the next `migrate` (deleting every job passed
    check, backup and restore)."""
    from sqlalchemy import text

    if on != "jobs" and not target.sqlite_path:
        pytest.skip("PostgreSQL: a quoted \"JOBS\" is another table, not jobs")
    c = Coordinator.open(target, migrate=True)
    c.enqueue("k", {})
    with c.db.engine.begin() as conn:
        if target.sqlite_path:  # SQLite's names know no case: "JOBS" is jobs
            conn.execute(text(f"CREATE TRIGGER evil AFTER INSERT ON {on} BEGIN "
                              "DELETE FROM job_events; DELETE FROM jobs; END"))
        else:
            conn.execute(text("CREATE FUNCTION evil_fn() RETURNS trigger LANGUAGE plpgsql AS "
                              "$$ BEGIN RETURN NEW; END $$"))
            conn.execute(text(f"CREATE TRIGGER evil BEFORE INSERT ON {on} FOR EACH ROW "
                              "EXECUTE FUNCTION evil_fn()"))
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v for v in r.json["violations"]}
    table = "alembic_version" if on == "alembic_version" else "jobs"
    assert found["trigger_unexpected"]["triggers"] == [{"table": table, "name": "evil"}]


def _set_epoch(c: Coordinator, job: int, epoch: int, *, lease_too: bool = False) -> None:
    from sqlalchemy import text as sql_text

    with c.db.engine.begin() as conn:
        conn.execute(sql_text("UPDATE jobs SET epoch = :e WHERE job_id = :j"),
                     {"e": epoch, "j": job})
        if lease_too:
            conn.execute(sql_text("UPDATE leases SET epoch = :e WHERE job_id = :j"),
                         {"e": epoch, "j": job})


@pytest.mark.parametrize("status", ["waiting", "running", "dead"])
def test_check_reports_a_job_epoch_set_back_below_one_a_claim_gave_and_exits_7(
        target: Target, status: str) -> None:
    """A job's epoch set back by hand (to 0, below the epoch its `claimed` event shows)
    passed `check` as ok; the next claim then handed out (job, epoch 1) a second time, the
    fencing every completion relies on broken. `check` names it
    (`epoch_behind_claims`). A job never claimed at epoch 0 is whole."""
    c = Coordinator.open(target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    fresh = c.enqueue("k", {})["job_id"]
    job = c.enqueue("k", {})["job_id"]
    got = c.claim("w1")
    assert got["job"]["job_id"] == fresh
    c.fail(fresh, "w1", 1, "x", permanent=True)
    got = c.claim("w1")
    assert got["job"]["job_id"] == job and got["lease"]["epoch"] == 1
    if status == "waiting":
        c.fail(job, "w1", 1, "try again")
    elif status == "dead":
        c.fail(job, "w1", 1, "x", permanent=True)
    c.enqueue("k", {})  # never claimed: epoch 0 is its own
    assert run_cli(target, "check", "--json").code == 0
    _set_epoch(c, job, 0, lease_too=status == "running")
    c.close()
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v["job_ids"] for v in r.json["violations"]}
    assert found == {"epoch_behind_claims": [job]}, found


@pytest.mark.parametrize("status", ["waiting", "running"])
def test_check_reports_a_job_whose_epoch_cannot_grow_and_exits_7(
        target: Target, status: str) -> None:
    """A waiting job at epoch 2**31 - 1 passed `check` as ok, and the next claim set it aside
    as `dead` (`job_unreadable`, its epoch cannot grow). `check` names it
    (`epoch_out_of_range`); a running job at that epoch is whole (its claim gave it)."""
    c = Coordinator.open(target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    job = c.enqueue("k", {})["job_id"]
    if status == "running":
        c.claim("w1")
    _set_epoch(c, job, 2**31 - 1, lease_too=status == "running")
    c.close()
    r = run_cli(target, "check", "--json")
    if status == "running":
        assert r.code == 0, r
        return
    assert r.code == 7, r
    found = {v["invariant"]: v["job_ids"] for v in r.json["violations"]}
    assert found == {"epoch_out_of_range": [job]}, found


def test_check_reports_a_sqlite_epoch_past_the_largest_one_kept_and_exits_7(
        sqlite_target: Target) -> None:
    """SQLite keeps any integer: an epoch past 2**31 - 1 (PostgreSQL's column) on any job is
    one no claim gave, `transfer` to PostgreSQL refused it naming nothing."""
    c = Coordinator.open(sqlite_target)
    c.heartbeat("w1", readings=IDLE_ON_AC)
    job = c.enqueue("k", {})["job_id"]
    c.claim("w1")
    _set_epoch(c, job, 3_000_000_000, lease_too=True)
    c.close()
    r = run_cli(sqlite_target, "check", "--json")
    assert r.code == 7, r
    found = {v["invariant"]: v["job_ids"] for v in r.json["violations"]}
    assert found == {"epoch_out_of_range": [job]}, found
