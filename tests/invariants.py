"""The invariants every fault scenario ends with, checked on a SQLite file from outside
jobcoord (plain sqlite3, so a bug in jobcoord's own reading code cannot hide a bug in its
writing code).

`violations(path)` returns a list of human-readable findings, empty when everything holds;
`assert_invariants(path)` fails the test with all of them.

Checked (numbering from the reliability notes):
  I1  at most one lease per job
  I2  a job is running exactly when it has a lease
  I3  lease epoch = job epoch = number of `claimed` events; attempts = claims as well
  I4  final jobs (succeeded, dead, cancelled) have no lease
  I5  succeeded jobs have a result
  I7  replaying each job's events in event_id order through the state machine gives the stored
      status, attempts and epoch; the first event is `enqueued`; every transition is legal;
      event epochs never decrease
  I12 an unknown job had an effect_started event in its last epoch
  I13 integrity_check ok, foreign_key_check empty, journal_mode wal
  I15 payloads and results are valid JSON
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import Any

from jobcoord.maintenance import sqlite_uri

FINAL = {"succeeded", "dead", "cancelled"}

#: Every status change the state machine allows (README.md "Job states"). Events whose
#: from-status equals their to-status record something without a transition (an external
#: effect started, a cancellation was requested, a late result was refused).
TRANSITIONS = {
    (None, "waiting"),
    ("waiting", "running"),
    ("waiting", "cancelled"),
    ("waiting", "dead"),
    ("running", "succeeded"),
    ("running", "waiting"),
    ("running", "dead"),
    ("running", "unknown"),
    ("running", "cancelled"),
    ("unknown", "waiting"),
    ("unknown", "succeeded"),
    ("unknown", "dead"),
    ("dead", "waiting"),
}


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(sqlite_uri(path, "rw"), uri=True, timeout=30)
    conn.isolation_level = None
    return conn


def storage_violations(conn: sqlite3.Connection, wal: bool = True) -> list[str]:
    out = []
    integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if integrity != ["ok"]:
        out.append(f"I13 integrity_check: {integrity[:5]}")
    fks = conn.execute("PRAGMA foreign_key_check").fetchall()
    if fks:
        out.append(f"I13 foreign_key_check: {fks[:5]}")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    if wal and mode != "wal":
        out.append(f"I13 journal_mode is {mode}")
    return out


def _query(conn: sqlite3.Connection, label: str, sql: str) -> list[str]:
    ids = [r[0] for r in conn.execute(sql).fetchall()]
    return [f"{label}: jobs {ids[:10]}"] if ids else []


def _replay(job: tuple[Any, ...], events: list[tuple[Any, ...]]) -> list[str]:
    job_id, status, attempts, epoch = job
    problems: list[str] = []
    state: str | None = None
    cur_epoch = 0
    claims = 0
    last_epoch = 0
    effect_epoch: int | None = None
    if not events or events[0][2] != "enqueued":
        problems.append(f"I7 job {job_id}: first event is not `enqueued`")
    for event_id, from_s, reason, to_s, ev_epoch in (
        (e[0], e[1], e[2], e[3], e[4]) for e in events
    ):
        where = f"I7 job {job_id} event {event_id} ({reason} {from_s}->{to_s})"
        if from_s != state:
            problems.append(f"{where}: the job was {state}")
        if reason.endswith("_refused"):
            # A refused late result is evidence, not a transition; it carries the caller's
            # (possibly stale) epoch, so it is left out of the epoch order.
            if from_s != to_s:
                problems.append(f"{where}: a refusal changed the status")
            continue
        if from_s != to_s and (from_s, to_s) not in TRANSITIONS:
            problems.append(f"{where}: illegal transition")
        if reason == "claimed":
            if to_s != "running":
                problems.append(f"{where}: a claim must lead to running")
            claims += 1
            cur_epoch += 1
            if ev_epoch != cur_epoch:
                problems.append(f"{where}: claim epoch {ev_epoch}, expected {cur_epoch}")
        elif from_s == "running" and ev_epoch is not None and ev_epoch != cur_epoch:
            problems.append(f"{where}: event epoch {ev_epoch} is not the lease epoch "
                            f"{cur_epoch}")
        if reason == "effect_started":
            effect_epoch = ev_epoch
        if ev_epoch is not None:
            if ev_epoch < last_epoch:
                problems.append(f"{where}: epoch went back from {last_epoch} to {ev_epoch}")
            last_epoch = max(last_epoch, ev_epoch)
        state = to_s
    if state != status:
        problems.append(f"I7 job {job_id}: events end in {state}, the job is {status}")
    if claims != epoch:
        problems.append(f"I3 job {job_id}: {claims} claimed events, epoch {epoch}")
    if claims != attempts:
        problems.append(f"I3 job {job_id}: {claims} claimed events, attempts {attempts}")
    if status == "unknown" and effect_epoch != epoch:
        problems.append(f"I12 job {job_id}: unknown without an effect_started event in "
                        f"epoch {epoch}")
    return problems


def application_violations(conn: sqlite3.Connection) -> list[str]:
    out: list[str] = []
    out += _query(conn, "I1 more than one lease",
                  "SELECT job_id FROM leases GROUP BY job_id HAVING COUNT(*) > 1")
    out += _query(conn, "I2 running without a lease",
                  "SELECT j.job_id FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id"
                  " WHERE j.status = 'running' AND l.job_id IS NULL")
    out += _query(conn, "I2/I4 lease on a job that is not running",
                  "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id"
                  " WHERE j.status <> 'running'")
    out += _query(conn, "I3 lease epoch differs from the job epoch",
                  "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id"
                  " WHERE l.epoch <> j.epoch")
    out += _query(conn, "I5 succeeded without a result",
                  "SELECT job_id FROM jobs WHERE status = 'succeeded' AND result_json IS NULL")
    out += _query(conn, "I15 invalid JSON",
                  "SELECT job_id FROM jobs WHERE json_valid(payload_json) = 0"
                  " OR (result_json IS NOT NULL AND json_valid(result_json) = 0)")
    events: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in conn.execute("SELECT job_id, event_id, from_status, reason, to_status, epoch"
                            " FROM job_events ORDER BY event_id"):
        events[row[0]].append(row[1:])
    jobs = conn.execute("SELECT job_id, status, attempts, epoch FROM jobs").fetchall()
    known = {j[0] for j in jobs}
    orphans = sorted(set(events) - known)
    if orphans:
        out.append(f"I7 events of jobs that do not exist: {orphans[:10]}")
    for job in jobs:
        out += _replay(job, events.get(job[0], []))
    return out


def violations(path: str, *, wal: bool = True) -> list[str]:
    """All findings on the database at `path`; `wal=False` for a backup copy, which is a
    standalone file in rollback-journal mode."""
    conn = _connect(path)
    try:
        conn.execute("BEGIN")  # one snapshot for every query
        try:
            return storage_violations(conn, wal) + application_violations(conn)
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


def assert_invariants(path: str) -> None:
    found = violations(path)
    assert not found, "invariants violated:\n" + "\n".join(found[:40])
