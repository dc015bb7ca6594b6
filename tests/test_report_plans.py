"""The dashboard's and /metrics' statements read indexes, never every job: each plan on
SQLite and PostgreSQL touches `jobs` and `job_events` only through an index search (no full
scan of the table or of an index, no sort of its rows), and the overview's figures equal a
count of the jobs table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from jobcoord.clock import MICROS, now_us
from jobcoord.http.dashboard.reads import overview_read
from jobcoord.service import Coordinator
from jobcoord.store import report_statements as R
from jobcoord.store.statements import SQL
from tests.timeline import IDLE_ON_AC


def populate(c: Coordinator) -> None:
    c.enqueue_many([{"kind": f"k{i % 4}", "tenant": "alice" if i % 3 else "default",
                     "priority": i % 4} for i in range(3000)])
    c.heartbeat("w1", readings=IDLE_ON_AC)
    for _ in range(40):
        got = c.claim("w1", lease_s=60)
        c.complete(got["job"]["job_id"], "w1", got["lease"]["epoch"], {"ok": 1})
    for _ in range(5):
        got = c.claim("w1", lease_s=60)
        c.fail(got["job"]["job_id"], "w1", got["lease"]["epoch"], "boom", permanent=True)
    c.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))


def statements() -> Iterator[tuple[str, SQL, dict[str, Any]]]:
    since = {"since": now_us() - 3600 * MICROS, "tenant": "alice"}
    yield "oldest waiting", R.OLDEST_WAITING, {}
    yield "oldest waiting of a tenant", R.OLDEST_WAITING_OF, {"tenant": "alice"}
    yield "finished since", R.FINISHED_SINCE, since
    yield "finished since, of a tenant", R.FINISHED_SINCE_OF, since
    yield "lease expiries", R.LEASE_EXPIRIES, {}
    yield "entered dead or unknown", R.ENTERED, {}
    yield "completed after", R.COMPLETED_ROWS, {"cursor": 0}
    for status in ("unknown", "dead"):
        stmts = R.UNKNOWN_JOBS if status == "unknown" else R.DEAD_JOBS
        yield f"attention {status}", stmts[True], {"tenant": "alice"}
    for name, f in (("no filter", {}), ("status", {"status": "waiting"}),
                    ("kind", {"kind": "k1"}), ("tenant", {"tenant": "alice"}),
                    ("status and kind", {"status": "waiting", "kind": "k1"}),
                    ("status, next page", {"status": "waiting", "before": 2000})):
        names = tuple(n for _col, n in R.JOB_FILTERS if n in f)
        page, count = R.job_page(names, "before" in f)
        params = {**f, "limit": 51, "cap": 10_001}
        yield f"jobs page, {name}", page, params
        yield f"jobs count, {name}", count, params


#: Indexes holding only the rows a statement wants (partial), whole scans of which are fine.
PARTIAL = ("ix_job_events_lease_expired", "ix_job_events_dead_unknown")


def bounded(name: str, line: str) -> bool:
    """A scan that stops early: the unfiltered jobs page reads the newest rows up to its
    LIMIT (and its count stops at the cap), and a partial index holds only what is wanted."""
    return "no filter" in name or any(ix in line for ix in PARTIAL)


def sqlite_plan(c: Coordinator, stmt: SQL, params: dict[str, Any]) -> list[str]:
    return [row[3] for row in c.db.read(lambda conn: conn.exec_driver_sql(
        "EXPLAIN QUERY PLAN " + stmt.sqlite, params).all())]


def pg_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from pg_nodes(child)


def pg_plan(c: Coordinator, stmt: SQL, params: dict[str, Any]) -> list[dict[str, Any]]:
    def explain(conn: Any) -> Any:
        # A small table: ask the planner what it would do with a large one.
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
        return conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + stmt.postgresql,
                                    params).scalar()

    raw = c.db.read(explain)
    return list(pg_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))


#: The index each aggregate must read (a search of all waiting or all finished jobs through
#: another index would pass the checks below and still grow with the queue).
EXPECT = {"oldest waiting": "ix_jobs_waiting_age",
          "oldest waiting of a tenant": "ix_jobs_waiting_age",
          "finished since": "ix_jobs_finished_at",
          "finished since, of a tenant": "ix_jobs_finished_at",
          "lease expiries": "ix_job_events_lease_expired",
          "entered dead or unknown": "ix_job_events_dead_unknown"}


def test_report_statements_search_indexes_instead_of_scanning_jobs(coord: Coordinator
                                                                   ) -> None:
    populate(coord)
    for name, stmt, params in statements():
        if name in EXPECT:
            plan_text = (" ".join(sqlite_plan(coord, stmt, params))
                         if coord.db.dialect == "sqlite"
                         else json.dumps(pg_plan(coord, stmt, params)))
            assert EXPECT[name] in plan_text, (name, plan_text)
        if coord.db.dialect == "sqlite":
            plan = sqlite_plan(coord, stmt, params)
            for line in plan:
                # A search of an index (or of the rowid) is bounded; "SCAN jobs" (the
                # table) or "SCAN jobs USING ... INDEX" (all of an index) is not.
                words = line.split()
                if words[0] == "SCAN" and words[1] in ("jobs", "j", "job_events", "e") \
                        and not bounded(name, line):
                    pytest.fail(f"{name}: {plan}")
            # A temporary b-tree sorts or groups rows: only the small counts table's.
            temp = [line for line in plan if "TEMP B-TREE" in line]
            assert not temp or "SCAN job_counts" in plan, (name, plan)
        else:
            nodes = pg_plan(coord, stmt, params)
            for n in nodes:
                if n.get("Relation Name") in ("jobs", "job_events"):
                    assert n["Node Type"] != "Seq Scan", (name, n)
                    # An index read with no condition reads all of it.
                    # A page may walk the primary key newest first, filtering, when its
                    # statistics say matches are dense: its LIMIT ends the walk.
                    walk = name.startswith("jobs page") and n.get("Index Name") == "pk_jobs"
                    # A capped count may read a partial index that holds exactly the
                    # waiting jobs it counts.
                    walk = walk or (name.startswith("jobs count") and "status" in name
                                    and n.get("Index Name") == "ix_jobs_waiting_age")
                    assert n.get("Index Cond") or walk or bounded(
                        name, n.get("Index Name", "")), (name, n)
            sorts = [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")]
            assert all("job_counts" in json.dumps(s) or "keys" in json.dumps(s)
                       for s in sorts), (name, sorts)


def test_overview_counts_equal_a_count_of_the_jobs_table(coord: Coordinator) -> None:
    populate(coord)
    for scope in (None, "alice"):
        got = overview_read(coord.db, scope)
        where = "" if scope is None else " WHERE tenant = 'alice'"
        rows = coord.db.read(lambda conn, where=where: conn.exec_driver_sql(
            f"SELECT status, kind, COUNT(*) FROM jobs{where} GROUP BY status, kind").all())
        want: dict[str, int] = {}
        for status, _kind, n in rows:
            want[status] = want.get(status, 0) + n
        assert {s: n for s, n in got["by_status"].items() if n} == want
        kinds = {k: {s: n for s, n in v.items() if n} for k, v in got["kinds"]}
        assert kinds == {kind: {s: n for s, k, n in rows if k == kind}
                         for _s, kind, _n in rows}
        waiting = coord.db.read(lambda conn, where=where: conn.exec_driver_sql(
            "SELECT kind, COUNT(*) FROM jobs WHERE status = 'waiting'"
            + where.replace("WHERE", "AND") + " GROUP BY kind").all())
        assert {o["kind"]: o["waiting"] for o in got["oldest"]} == dict(waiting)
        finished = sum(n for s, n in want.items() if s == "succeeded")
        assert got["finished_hour"] == finished
