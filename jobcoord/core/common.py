"""What every rule family shares: the context it runs in, the event every transition
records, and the checks of a lease length and of a fenced call's arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import seconds_to_us
from ..errors import InvalidInput
from ..policy import Policy
from ..store import statements as sql
from ..store.base import Database
from ..stored import MAX_TIME_US
from .items import DEFAULT_TENANT as DEFAULT_TENANT  # (its home: items, for the client)
from .items import job_and_epoch


class Context(Protocol):
    """What a rule needs from the open coordinator: its store, its policy and the optional
    schema features present."""

    db: Database
    policy: Policy
    features: set[str]


def record_event(ctx: Context, conn: Connection, job_id: int, now: int,
                 from_status: str | None, to_status: str, reason: str,
                 worker: str | None = None, epoch: int | None = None,
                 detail: Mapping[str, Any] | None = None) -> None:
    """Write the job_events row of a transition (or of a refusal worth keeping)."""
    ctx.db.run(conn, sql.INSERT_EVENT, {
        "job_id": job_id, "now": now, "from_status": from_status, "to_status": to_status,
        "reason": reason, "worker": worker, "epoch": epoch,
        "detail": v.dumps(detail) if detail else None,
    })


def end_waiting(ctx: Context, conn: Connection, job_id: int, epoch: int, now: int,
                to_status: str, reason: str, *, error: str | None = None,
                detail: Mapping[str, Any] | None = None) -> bool:
    """Move a waiting job to a final status (cancelled, or dead by its deadline) and record
    the event; False, with nothing changed, when it is no longer waiting at `epoch` (claimed
    meanwhile). A final job is never claimed again, so any lease row it still has (one
    written outside jobcoord) goes with it: left, `status` would count it active and `check`
    would fail for good."""
    ended = ctx.db.run(conn, sql.SET_STATUS, {
        "job_id": job_id, "epoch": epoch, "from_status": "waiting", "to_status": to_status,
        "now": now, "finished": now, "error": error}).rowcount
    if ended != 1:
        return False
    ctx.db.run(conn, sql.DROP_ANY_LEASE, {"job_id": job_id})
    record_event(ctx, conn, job_id, now, "waiting", to_status, reason, detail=detail)
    return True


def ends_by(now: int, us: int) -> int:
    """`now` + `us`, stopped at the calendar's last microsecond: a lease or a backoff the
    coordinator times near the end of the year 9999 ends with it (stored past it, no
    reader could render the row: every command then called it damaged)."""
    return min(now + us, MAX_TIME_US)


def lease_end(now: int, us: int) -> int:
    """When a lease granted at `now` ends (`ends_by`); refused at the calendar's last
    microsecond, where no lease can start: one ending as it starts breaks the leases
    table's check, which turned the claim into a damaged database (SQLite) or an internal
    error (PostgreSQL)."""
    if now >= MAX_TIME_US:
        raise InvalidInput("invalid_input", "lease: the clock stands at the last microsecond "
                           "of the year 9999, the calendar's end; no lease can start",
                           field="lease")
    return ends_by(now, us)


def later(now: int, us: int, field: str) -> int:
    """`now` + `us` for a time the caller asked for (a delay, a deadline): refused when it
    falls past the calendar's end, since it could never be kept."""
    if now + us > MAX_TIME_US:
        raise InvalidInput("invalid_input", f"{field}: it would fall past the year 9999, "
                           "the calendar's end", field=field)
    return now + us


def lease_us(ctx: Context, lease_s: float | None) -> int:
    """A lease length in microseconds: the policy's default, or `lease_s` within its bound."""
    value = ctx.policy.default_lease_s if lease_s is None else lease_s
    us = seconds_to_us(v.finite_seconds(value, "lease", 0, ctx.policy.max_lease_s,
                                        lo_inclusive=False))
    if us < 1:
        # Above 0 but under half a microsecond: a lease that ends as it starts, which the
        # leases table's check refuses (an internal error, after the write had begun).
        raise InvalidInput("invalid_input", f"lease: {v.shown(value)} seconds is shorter than a "
                           "microsecond", field="lease")
    return us


def fenced_args(job_id: Any, worker_id: str, epoch: Any, tenant: str | None
                ) -> tuple[int, str, int, str | None]:
    """The checked arguments every fenced call takes."""
    job_id, epoch = job_and_epoch(job_id, epoch)
    return (job_id, v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID), epoch,
            v.optional_name(tenant, "tenant"))


def as_bool(value: Any) -> bool | None:
    """A stored boolean (SQLite gives 0/1), None kept."""
    return None if value is None else bool(value)


def loads(text: str | None) -> Any:
    return None if text is None else v.loads(text)
