"""What the dashboard's pages read: each part one read transaction of the statements in
`jobcoord/store/report_statements.py`, cheap at any size (counts from `job_counts`, the
queue age from an index seek per (tenant, kind), the last hour from a range of finished
jobs, a jobs page by keyset with a count that stops at COUNT_CAP)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ... import stored
from ... import validate as v
from ...clock import MICROS, iso, now_us
from ...errors import InvalidInput
from ...states import STATUSES
from ...store import report_statements as rs
from .views import worker_views

#: Rows on one page of the jobs view.
PAGE = 50
#: Counts above this are shown as "10,000+": counting stops there.
COUNT_CAP = 10_000


async def overview_data(request: Request, scope: str | None) -> dict[str, Any]:
    """The overview's figures for a login's scope (None: every tenant)."""
    srv = request.app.state.server
    data = await srv.call(overview_read, srv.c.db, scope)
    got = await srv.call(srv.c.workers)
    views = worker_views(got["workers"], {}, srv.c.policy.heartbeat_max_age_s)
    data["workers_online"] = sum(1 for w in views if w["online"])
    data["workers_total"] = len(views)
    data["blocking"] = [w for w in views if w["online"] and w["gate_text"]]
    return data


def overview_read(db: Any, scope: str | None) -> dict[str, Any]:
    now = now_us()
    params = {"tenant": scope, "since": now - 3600 * MICROS}

    def _do(conn: Any) -> dict[str, Any]:
        counts = db.run(conn, rs.JOB_COUNTS).all()
        oldest = db.run(conn, rs.OLDEST_WAITING if scope is None else rs.OLDEST_WAITING_OF,
                        params).all()
        recent = db.run(conn, rs.FINISHED_SINCE if scope is None else rs.FINISHED_SINCE_OF,
                        params).all()
        return {"counts": counts, "oldest": oldest, "recent": recent}

    got = db.read(_do, "ui overview")
    by_status = dict.fromkeys(STATUSES, 0)
    kinds: dict[str, dict[str, int]] = {}
    for row in got["counts"]:
        # Rendered and summed: a value written outside jobcoord is a 503 naming it, as on
        # every read (jobcoord/stored.py); a status jobcoord never writes is in no total.
        tenant, status, kind, _attempts, n = stored.count_row(row)
        if not n or (scope is not None and tenant != scope) or status not in by_status:
            continue
        by_status[status] += int(n)
        kinds.setdefault(kind, dict.fromkeys(STATUSES, 0))[status] += int(n)
    oldest: dict[str, tuple[int, int]] = {}
    for _tenant, kind, created, n in got["oldest"]:
        stored.oldest_row(kind, created)
        if created is None:
            continue
        first, waiting = oldest.get(kind, (created, 0))
        oldest[kind] = (min(first, created), waiting + int(n))
    recent = dict(got["recent"])
    return {
        "by_status": by_status, "statuses": STATUSES,
        "kinds": sorted(kinds.items()),
        "oldest": [{"kind": k, "age_s": max(0.0, (now - c) / MICROS), "waiting": n}
                   for k, (c, n) in sorted(oldest.items(), key=lambda kv: kv[1][0])],
        "finished_hour": recent.get("succeeded", 0),
        "failed_hour": recent.get("dead", 0) + recent.get("unknown", 0),
        "cancelled_hour": recent.get("cancelled", 0), "now": iso(now)}


def filters(q: Any, scope: str | None) -> dict[str, Any]:
    """The jobs page's filters from the query string, checked; a scoped login sees its
    tenant only, whatever the URL says."""
    def text(name: str) -> str | None:
        value = (q.get(name) or "").strip()
        return value or None

    status = text("status")
    if status is not None and status not in STATUSES:
        raise InvalidInput("invalid_input", f"status must be one of {', '.join(STATUSES)}")
    priority = text("priority")
    if priority is not None:
        priority = priority.upper().removeprefix("P")
        if priority not in ("0", "1", "2", "3"):
            raise InvalidInput("invalid_input", "priority must be 0..3 (or P0..P3)")
    before = text("before")
    if before is not None and not _is_job_id(before):
        raise InvalidInput("invalid_input", "before must be a job id")
    tenant = text("tenant")
    if scope is not None:
        tenant = scope
    key = text("key")
    # Checked as the API's list and the Coordinator check them (a NUL, a name too long).
    return {"status": status, "kind": v.optional_name(text("kind"), "kind"),
            "tenant": v.optional_name(tenant, "tenant"),
            "priority": None if priority is None else int(priority),
            "key": None if key is None else v.utf8_text(key, "key", max_len=v.MAX_KEY),
            "before": None if before is None else int(before)}


def jobs_page(db: Any, f: dict[str, Any]) -> tuple[list[Any], int, int | None]:
    """One page, newest first, by keyset (job_id < before; no OFFSET), and the number of
    matches, counted no further than COUNT_CAP + 1."""
    names = tuple(name for _col, name in rs.JOB_FILTERS if f[name] is not None)
    page, count = rs.job_page(names, f["before"] is not None)
    params: dict[str, Any] = {name: f[name] for name in names}
    params.update(limit=PAGE + 1, cap=COUNT_CAP + 1)
    if f["before"] is not None:
        params["before"] = f["before"]

    def _do(conn: Any) -> tuple[list[Any], int]:
        return db.run(conn, page, params).all(), db.run(conn, count, params).scalar_one()

    rows, n = db.read(_do, "ui jobs")
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    view = [{"job_id": r[0], "tenant": r[1], "kind": r[2], "priority": r[3],
             "status": r[4], "attempts": r[5], "max_attempts": r[6],
             "created_at": iso(r[7]), "updated_at": iso(r[8])} for r in rows]
    return view, n, rows[-1][0] if more else None


def leases(db: Any, scope: str | None) -> dict[str, list[dict[str, Any]]]:
    now = now_us()
    rows = db.read(lambda conn: db.run(conn, rs.LEASE_LIST[scope is not None],
                                       {"tenant": scope}).all(), "ui leases")
    out: dict[str, list[dict[str, Any]]] = {}
    for worker, job_id, epoch, expires, kind in rows:
        out.setdefault(worker, []).append({"job_id": job_id, "epoch": epoch, "kind": kind,
                                           "expires_in_s": (expires - now) / MICROS})
    return out


def attention(db: Any, scope: str | None) -> tuple[list[Any], list[Any]]:
    """The newest unknown and dead jobs, at most `rs.ATTENTION_SHOWN` + 1 of each (a list
    that long has more than the page shows)."""
    scoped = scope is not None

    def _do(conn: Any) -> tuple[list[Any], list[Any]]:
        return (db.run(conn, rs.UNKNOWN_JOBS[scoped], {"tenant": scope}).all(),
                db.run(conn, rs.DEAD_JOBS[scoped], {"tenant": scope}).all())

    unknown, dead = db.read(_do, "ui attention")

    def view(r: Any) -> dict[str, Any]:
        return {"job_id": r[0], "tenant": r[1], "kind": r[2], "attempts": r[3],
                "last_error": (r[4] or "")[:2000], "updated_at": iso(r[5])}

    return [view(r) for r in unknown], [view(r) for r in dead]


def result_field(text: str) -> bytes | None:
    """The reconcile form's result: JSON text, or nothing. Handed over as text (bytes), so
    the Coordinator checks it as it checks the CLI's `--result` (duplicate keys, NaN,
    nesting, size), not as a value parsed here."""
    if not text.strip():
        return None
    return text.encode("utf-8", "surrogateescape")


def _is_job_id(text: str) -> bool:
    """Plain ASCII digits of a job id in range (1..2**62). The length is looked at before
    int(): `²` is a digit to str.isdigit but no number to int(), and int() refuses text of
    more than 4,300 digits."""
    return (text.isascii() and text.isdigit() and len(text) <= 19
            and 1 <= int(text) <= 2**62)


def job_id(text: str) -> int:
    if not _is_job_id(text):
        raise InvalidInput("invalid_input", f"{text[:40]!r} is not a job id")
    return int(text)
