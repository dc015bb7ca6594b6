"""Group commit on SQLite: the writes that threads of one process queue at the same moment
run in one BEGIN IMMEDIATE transaction, each in its own savepoint, with one COMMIT; every
caller is answered only after that commit. A refused or failing call changes nothing and
the others commit; a process killed in the middle of a group loses all of the group and has
answered none of it, and leaves a database that checks clean."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from jobcoord.db import Database, Target
from jobcoord.errors import JobcoordError
from jobcoord.service import Coordinator
from jobcoord.store.sqlite import SqliteDatabase
from tests.invariants import assert_invariants

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent


def _trace(db: Database) -> list[str]:
    statements: list[str] = []

    @event.listens_for(db.engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _rec: Any) -> None:
        dbapi_conn.set_trace_callback(statements.append)

    db.engine.dispose()  # new connections get the trace callback
    return statements


class Held:
    """A write that holds the write transaction (as the leader of its group) until
    released, so that the writes started meanwhile queue behind it."""

    def __init__(self, c: Coordinator) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=lambda: c.db.write(self._hold, "held"))
        self.thread.start()
        assert self.inside.wait(10)

    def _hold(self, conn: Any) -> None:
        self.inside.set()
        assert self.release.wait(30)

    def done(self) -> None:
        self.release.set()
        self.thread.join(10)


def _group(c: Coordinator) -> Any:
    db = c.db
    assert isinstance(db, SqliteDatabase)
    return db._group


def _queue_in_order(c: Coordinator, bodies: list[Any]) -> tuple[list[threading.Thread],
                                                                 dict[int, Any]]:
    """Start one thread per body, each after the previous one has queued its write."""
    group = _group(c)
    answers: dict[int, Any] = {}

    def run(i: int, body: Any) -> None:
        try:
            answers[i] = body()
        except JobcoordError as e:
            answers[i] = e

    threads = []
    for i, body in enumerate(bodies):
        before = group.queued
        t = threading.Thread(target=run, args=(i, body))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while group.queued == before:
            assert time.monotonic() < deadline, "the write never queued"
            time.sleep(0.001)
    return threads, answers


def _payloads(path: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    try:
        return [json.loads(r[0]) for r in conn.execute(
            "SELECT payload_json FROM jobs ORDER BY job_id")]
    finally:
        conn.close()


def test_writes_queued_at_once_commit_in_one_transaction_and_one_commit(
        sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    statements = _trace(c.db)
    held = Held(c)
    threads, answers = _queue_in_order(
        c, [lambda i=i: c.enqueue("k", {"i": i}) for i in range(6)])
    held.done()
    for t in threads:
        t.join(10)
    assert sorted(a["job_id"] for a in answers.values()) == [1, 2, 3, 4, 5, 6]
    # The held write alone, then the six queued behind it together: two transactions.
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE", "COMMIT", "BEGIN IMMEDIATE", "COMMIT"]
    assert statements.count("SAVEPOINT jobcoord_call") == 6
    assert _group(c).largest == 6
    assert [p["i"] for p in _payloads(sqlite_target.sqlite_path or "")] == list(range(6))
    c.close()


def test_a_group_takes_at_most_its_limit_and_the_rest_follow_in_order(
        sqlite_target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Coordinator.open(sqlite_target)
    monkeypatch.setattr(_group(c), "limit", 4)
    statements = _trace(c.db)
    held = Held(c)
    threads, _answers = _queue_in_order(
        c, [lambda i=i: c.enqueue("k", {"i": i}) for i in range(10)])
    held.done()
    for t in threads:
        t.join(10)
    assert statements.count("COMMIT") == 1 + 3  # 4 + 4 + 2
    assert _group(c).largest == 4
    assert [p["i"] for p in _payloads(sqlite_target.sqlite_path or "")] == list(range(10))
    c.close()


@pytest.mark.parametrize("kind", ["refusal", "bug"])
def test_a_refused_call_in_the_middle_of_a_group_changes_nothing_and_the_others_commit(
        sqlite_target: Target, kind: str) -> None:
    c = Coordinator.open(sqlite_target)
    path = sqlite_target.sqlite_path or ""

    def refused(conn: Any) -> None:
        # It writes first (a nested write joins the group's transaction), then is refused.
        c.enqueue("k", {"who": "refused"})
        if kind == "refusal":
            raise JobcoordError("refused_here", "refused after writing")
        raise RuntimeError("a bug after writing")

    def call_refused() -> Any:
        try:
            return c.db.write(refused, "refused")
        except RuntimeError as e:
            return e

    held = Held(c)
    threads, answers = _queue_in_order(c, [
        lambda: c.enqueue("k", {"who": "before"}),
        call_refused,
        lambda: c.enqueue("k", {"who": "after"})])
    held.done()
    for t in threads:
        t.join(10)
    assert _group(c).largest == 3
    assert answers[0]["created"] and answers[2]["created"]
    if kind == "refusal":
        assert isinstance(answers[1], JobcoordError) and answers[1].code == "refused_here"
    else:
        assert isinstance(answers[1], RuntimeError)
    assert [p["who"] for p in _payloads(path)] == ["before", "after"]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM job_events").fetchone()[0] == 2
    conn.close()
    assert_invariants(path)
    c.close()


def test_a_driver_error_in_one_call_fails_only_it_and_the_others_run_again(
        sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    path = sqlite_target.sqlite_path or ""

    def broken(conn: Any) -> None:
        c.enqueue("k", {"who": "broken"})
        conn.exec_driver_sql("INSERT INTO no_such_table VALUES (1)")

    held = Held(c)
    threads, answers = _queue_in_order(c, [
        lambda: c.enqueue("k", {"who": "before"}),
        lambda: c.db.write(broken, "broken"),
        lambda: c.enqueue("k", {"who": "after"})])
    held.done()
    for t in threads:
        t.join(10)
    assert answers[0]["created"] and answers[2]["created"]
    assert isinstance(answers[1], JobcoordError) and answers[1].code == "internal_error"
    assert sorted(p["who"] for p in _payloads(path)) == ["after", "before"]
    assert_invariants(path)
    c.close()


def test_callers_are_answered_only_after_their_groups_commit(sqlite_target: Target) -> None:
    """The first calls of a group have run, yet their callers wait until the last call of
    the group has run and the group has committed."""
    c = Coordinator.open(sqlite_target)
    path = sqlite_target.sqlite_path or ""
    last_inside, last_release = threading.Event(), threading.Event()

    def last(conn: Any) -> str:
        last_inside.set()
        assert last_release.wait(30)
        return "last"

    held = Held(c)
    threads, answers = _queue_in_order(c, [
        lambda: c.enqueue("k", {"i": 0}), lambda: c.enqueue("k", {"i": 1}),
        lambda: c.db.write(last, "last")])
    held.done()
    assert last_inside.wait(10)
    time.sleep(0.3)  # every chance for an early answer to arrive
    assert answers == {}
    assert all(t.is_alive() for t in threads)
    # Not committed yet: another connection sees no job.
    assert _payloads(path) == []
    last_release.set()
    for t in threads:
        t.join(10)
    assert answers[2] == "last" and {answers[0]["job_id"], answers[1]["job_id"]} == {1, 2}
    c.close()


def test_a_write_alone_runs_at_once_without_savepoints(sqlite_target: Target) -> None:
    c = Coordinator.open(sqlite_target)
    statements = _trace(c.db)
    started = time.monotonic()
    c.enqueue("k", {})
    assert time.monotonic() - started < 1.0
    assert "SAVEPOINT jobcoord_call" not in statements
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE", "COMMIT"]
    c.close()


# --- a process killed in the middle of a group ------------------------------------------------

# Thread "held" leads a group of its own and holds it; five threads queue an enqueue each, and
# a sixth queues a write that SIGKILLs the process: the group of six has run its first five
# calls (each in its savepoint) and dies before its COMMIT. Every answer is printed.
KILLED_MID_GROUP = r"""
import os, signal, sys, threading, time
from jobcoord.service import Coordinator
c = Coordinator.open(sys.argv[1])
group = c.db._group
inside, release = threading.Event(), threading.Event()
def hold(conn):
    c.enqueue("k", {"who": "held"})
    inside.set()
    release.wait(30)
def held():
    c.db.write(hold, "held")
    print("answered held", flush=True)
def enqueue(i):
    got = c.enqueue("k", {"who": i})
    print(f"answered {i} {got['job_id']}", flush=True)
def kill(conn):
    time.sleep(0.5)  # every chance for an early answer to be printed
    os.kill(os.getpid(), signal.SIGKILL)
threading.Thread(target=held).start()
inside.wait(10)
for target, args in [(enqueue, (i,)) for i in range(5)] + [(c.db.write, (kill, "kill"))]:
    queued = group.queued
    threading.Thread(target=target, args=args).start()
    while group.queued == queued:
        time.sleep(0.001)
release.set()
time.sleep(30)
"""


def _check(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobcoord", "--db", path, "check", "--full",
                           "--json"], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_a_process_killed_before_its_groups_commit_loses_the_group_and_answered_none(
        sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path or ""
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_GROUP, path], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["answered held"], proc.stdout
    assert [p["who"] for p in _payloads(path)] == ["held"]
    check = _check(path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert_invariants(path)


# Eight threads share one Coordinator: each submits, claims and completes in a loop and prints
# each job it was told is completed.
BUSY_THREADS = r"""
import sys, threading
from jobcoord.service import Coordinator
c = Coordinator.open(sys.argv[1])
say = threading.Lock()
def body(n):
    w = f"w{n}"
    c.heartbeat(w, readings={"memory_used_pct": 10})
    while True:
        c.enqueue("k", {"n": n})
        got = c.claim(w)
        if got["job"] is not None:
            job = got["job"]["job_id"]
            c.complete(job, w, got["lease"]["epoch"], {"by": w})
            with say:
                print(job, flush=True)
for n in range(8):
    threading.Thread(target=body, args=(n,), daemon=True).start()
threading.Event().wait()
"""


def test_a_process_killed_at_random_moments_of_grouped_writes_leaves_a_sound_database(
        sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path or ""
    told: set[int] = set()
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", BUSY_THREADS, path], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        # Let it get going (some completions answered), then kill it at a random moment.
        for _ in range(20):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            told.add(int(line))
        time.sleep(random.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        out, _err = proc.communicate(timeout=30)
        # Whole lines only: the kill can land inside a print (a number without its newline,
        # or the newline written apart from its number, seen once as a blank line).
        told.update(int(x) for x in out.splitlines(keepends=True)
                    if x.endswith("\n") and x.strip().isdigit())
        assert proc.returncode == -signal.SIGKILL, round_
        check = _check(path)
        assert check.returncode == 0, check.stdout + check.stderr
        assert_invariants(path)
    # Every completion a caller was told of is in the database.
    conn = sqlite3.connect(path)
    succeeded = {r[0] for r in conn.execute("SELECT job_id FROM jobs WHERE status = "
                                            "'succeeded'")}
    conn.close()
    assert told and told <= succeeded


# The main thread's write waits behind a held group when Ctrl-C (a real SIGINT) arrives: its
# call leaves the queue unrun, and the writes after it are not left waiting for it to lead.
INTERRUPTED_IN_THE_QUEUE = r"""
import json, os, signal, sys, threading, time
from jobcoord.service import Coordinator
c = Coordinator.open(sys.argv[1])
inside, release = threading.Event(), threading.Event()
def hold(conn):
    inside.set()
    release.wait(30)
holder = threading.Thread(target=lambda: c.db.write(hold, "held"))
holder.start()
inside.wait(10)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    c.enqueue("k", {"who": "interrupted"})
    print(json.dumps({"interrupted": False}))
except KeyboardInterrupt:
    pass
release.set()
holder.join(10)
started = time.monotonic()
got = c.enqueue("k", {"who": "next"})
print(json.dumps({"interrupted": True, "next_s": time.monotonic() - started}), flush=True)
"""


def test_a_write_interrupted_in_the_queue_leaves_it_and_the_next_write_goes_on(
        sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path or ""
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IN_THE_QUEUE, path], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = json.loads(proc.stdout)
    assert said["interrupted"] and said["next_s"] < 2.0, said
    assert [p["who"] for p in _payloads(path)] == ["next"]


# The main thread leads a group (its write, three enqueues of other threads, then a slow
# write) when Ctrl-C (a real SIGINT) arrives inside the slow one: the group is rolled back,
# the main thread gets KeyboardInterrupt, and the other threads' writes run again in the next
# group, each saved once.
INTERRUPTED_LEADER = r"""
import json, os, signal, sys, threading, time
from jobcoord.service import Coordinator
c = Coordinator.open(sys.argv[1])
group = c.db._group
inside, release = threading.Event(), threading.Event()
answers = {}
def hold(conn):
    inside.set()
    release.wait(30)
holder = threading.Thread(target=lambda: c.db.write(hold, "held"))
holder.start()
inside.wait(10)
def slow(conn):
    c.enqueue("k", {"who": "slow"})
    time.sleep(1.0)
    return "slow"
def enqueue(i):
    answers[i] = c.enqueue("k", {"who": i})["job_id"]
def others():
    while group.queued < 1:
        time.sleep(0.001)
    threads = []
    for target, args in [(enqueue, (i,)) for i in range(3)] + [(c.db.write, (slow, "slow"))]:
        queued = group.queued
        t = threading.Thread(target=target, args=args)
        t.start()
        threads.append(t)
        while group.queued == queued:
            time.sleep(0.001)
    threading.Timer(0.4, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    release.set()
    for t in threads:
        t.join(30)
others_thread = threading.Thread(target=others)
others_thread.start()
try:
    c.enqueue("k", {"who": "main"})
    main = "answered"
except KeyboardInterrupt:
    main = "interrupted"
others_thread.join(30)
print(json.dumps({"main": main, "answers": len(answers)}), flush=True)
"""


def test_a_leader_interrupted_inside_its_group_rolls_it_back_and_the_others_run_again(
        sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path or ""
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_LEADER, path], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"main": "interrupted", "answers": 3}
    assert sorted(str(p["who"]) for p in _payloads(path)) == ["0", "1", "2", "slow"]
    assert_invariants(path)


class _Refuse(Exception):
    pass


def test_a_guarded_write_in_a_group_is_checked_in_its_own_turn_and_refused_alone(
        sqlite_target: Target) -> None:
    """`Database.guarded`: the check runs first in the write's own turn of the group (on the
    thread leading it, in the group's transaction) and once per write, not again for a
    write nested in it; a check that raises rolls back that write alone, before it changed
    anything, and the others of the group commit."""
    c = Coordinator.open(sqlite_target)
    path = sqlite_target.sqlite_path or ""
    checked: list[tuple[str, int]] = []

    def check(who: str, passes: bool) -> Any:
        def run(conn: Any) -> None:
            jobs = conn.exec_driver_sql("SELECT COUNT(*) FROM jobs").scalar()
            checked.append((who, jobs))
            if not passes:
                raise _Refuse(who)
        return run

    def guarded(who: str, passes: bool) -> Any:
        def body() -> Any:
            with c.db.guarded(check(who, passes)):
                try:
                    # A write with one nested in it: one check.
                    return c.db.write(lambda conn: c.enqueue("k", {"who": who}), who)
                except _Refuse as e:
                    return e
        return body

    held = Held(c)
    threads, answers = _queue_in_order(c, [
        lambda: c.enqueue("k", {"who": "before"}),
        guarded("refused", False),
        guarded("live", True)])
    held.done()
    for t in threads:
        t.join(10)
    assert _group(c).largest == 3
    assert isinstance(answers[1], _Refuse)
    assert answers[2]["created"]
    # Each checked once, in its turn: after "before" was written, in the same transaction.
    assert checked == [("refused", 1), ("live", 1)]
    assert [p["who"] for p in _payloads(path)] == ["before", "live"]
    assert_invariants(path)
    # Alone (its own thread leads), with a write nested in it: checked once.
    assert guarded("alone", True)()["created"]
    assert checked[2:] == [("alone", 2)]
    # Outside `guarded` nothing is checked.
    c.enqueue("k", {"who": "unguarded"})
    assert len(checked) == 3
    c.close()
