"""Workers: heartbeats and their readings, the workers' rows, and what their gates allow."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import MICROS, now_us
from ..errors import InvalidInput
from ..policy import GateDecision, Readings, evaluate
from ..store import statements as sql
from .common import Context, as_bool
from .items import NO_KINDS, readings_value


def heartbeat(ctx: Context, worker_id: str, *, roles: Sequence[str] | None = None,
              readings: Mapping[str, Any] | str | None = None,
              kinds: Sequence[str] | None = None) -> dict[str, Any]:
    """Record a worker's readings, exactly as received, with the time received."""
    worker_id = v.name(worker_id, "worker", max_len=v.MAX_WORKER_ID)
    role_list = [] if roles is None else v.names(roles, "role")
    kind_list = None if kinds is None else v.names(kinds, "kind", empty=NO_KINDS)
    raw_text, parsed = parse_readings(readings)
    params = {
        "worker": worker_id, "roles": v.dumps(role_list),
        "kinds": None if kind_list is None else v.dumps(kind_list), "raw": raw_text,
        "mem": parsed.memory_used_pct, "temp": parsed.temperature_c,
        "battery": parsed.on_battery, "idle": parsed.user_idle_s,
    }

    def _do(conn: Connection) -> int:
        now = now_us()  # the time received: read under the write lock
        ctx.db.run(conn, sql.UPSERT_WORKER, {**params, "now": now})
        return now

    now = ctx.db.write(_do, "heartbeat")
    gates = evaluate(ctx.policy, parsed)
    return {"worker_id": worker_id, "roles": role_list, "kinds": kind_list,
            "received_at": now, "readings": parsed, "gates": gates}


#: A worker's stored JSON columns, each rewritten whole by its every heartbeat.
WORKER_JSON_COLUMNS = ("roles_json", "kinds_json", "heartbeat_raw")


def stored_shape_ok(column: str, value: Any) -> bool:
    """Whether a worker column's parsed JSON has the shape a heartbeat writes: roles and
    kinds a list of names, the readings an object whose GPUs and named capacity (what a
    claim's fit reads from it) pass the heartbeat's own check."""
    if column == "heartbeat_raw":
        if not isinstance(value, dict):
            return False
        if "gpus" not in value and "capacity" not in value:
            return True  # the other readings are kept in columns of their own
        try:
            # A heartbeat jobcoord stored before capacity names matched against another
            # reading were refused is not damage (the fit ignores those names).
            parse_readings(value, received=False)
        except InvalidInput:
            return False
        return True
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def parse_worker_json(texts: Sequence[str | None]) -> tuple[str | None, list[Any]]:
    """A worker's stored JSON columns (`WORKER_JSON_COLUMNS`, in that order; None kept),
    parsed once: the first column whose text does not parse, or parses to something no
    heartbeat writes (`null`, a number), written outside jobcoord (by hand, a broken
    restore), or None; and the values parsed."""
    values: list[Any] = [None] * len(texts)  # as many as given, whatever is damaged
    for i, (column, text) in enumerate(zip(WORKER_JSON_COLUMNS, texts, strict=False)):
        if text is None:
            continue
        try:
            value = v.loads(text)
        except ValueError:
            return column, values
        if not stored_shape_ok(column, value):
            return column, values
        values[i] = value
    return None, values


def unreadable_column(texts: Sequence[str | None]) -> str | None:
    """The first of a worker's stored JSON columns that is damaged (see
    `parse_worker_json`), or None."""
    return parse_worker_json(texts)[0]


#: A worker's stored time and readings, in the order `sql.WORKER` and `sql.ALL_WORKERS` read
#: them after its JSON columns.
WORKER_TYPED_COLUMNS = ("heartbeat_at", "memory_used_pct", "temperature_c", "on_battery",
                        "user_idle_s")


def mistyped_column(values: Sequence[Any]) -> str | None:
    """The first of a worker's time and readings (`WORKER_TYPED_COLUMNS`, in that order) of
    another type than a heartbeat stores (text written by hand on SQLite, which keeps it):
    the gates cannot compare it, so the worker is treated like one whose row is damaged."""
    for column, value in zip(WORKER_TYPED_COLUMNS, values, strict=True):
        if value is None:
            continue
        if column == "heartbeat_at":
            if type(value) is not int:
                return column
        elif type(value) not in (int, float, bool):
            return column
    return None


def unreadable_detail(worker_id: str, column: str) -> str:
    """Why a worker whose row is damaged claims nothing: as if it had no heartbeat, until
    its next one rewrites the row (a worker process heals itself on its timer)."""
    what = "not of its type" if column in WORKER_TYPED_COLUMNS else "not valid JSON"
    return (f"worker {worker_id}: its stored {column} is {what} (written outside "
            "jobcoord); its next heartbeat rewrites it")


def worker_raw(ctx: Context, conn: Connection, worker_id: str) -> str | None:
    """The worker's last readings as received (its capacity), or None."""
    from ..store import limit_statements as ls

    row = ctx.db.run(conn, ls.WORKER_RAW, {"worker": worker_id}).fetchone()
    return None if row is None else row[0]


def claiming_row(ctx: Context, conn: Connection, worker_id: str, row: Sequence[Any],
                 kinds_named: bool) -> tuple[str | None, list[Any]]:
    """A claim's read of the worker's row (`sql.WORKER`): the first damaged column it uses
    (its roles; its kinds unless the call names them; its capacity when a waiting job
    declares needs; its time and readings), or None; and the JSON columns parsed once."""
    # The capacity is read only when a waiting job declares needs (as the take does).
    raw = worker_raw(ctx, conn, worker_id) if row[8] else None
    damaged, values = parse_worker_json((row[0], None if kinds_named else row[1], raw))
    return damaged or mistyped_column(row[2:7]), values


def worker_rows(ctx: Context, conn: Connection) -> list[dict[str, Any]]:
    """Every worker's row, its readings parsed for the gates. A row whose stored JSON does
    not parse is listed with no roles and no kinds and `unreadable` naming the column (its
    gate says stale): one damaged row must not hide every other worker."""
    out = []
    from .. import schema, stored

    for r in ctx.db.run(conn, sql.ALL_WORKERS).all():
        # An id of the wrong type (bytes written by hand) names nobody: exit 7 naming it.
        stored.row(schema.workers, {"worker_id": r[0]}, "a worker")
        damaged, values = parse_worker_json((r[1], r[2], r[11]))
        damaged = damaged or mistyped_column(r[3:8])
        out.append({
            "worker_id": r[0], "roles": [] if damaged else values[0],
            # kinds_json NULL: every kind (a heartbeat that named none).
            "kinds": [] if damaged else values[1],
            "heartbeat_at": None if damaged else r[3],
            "readings": Readings(None, None, None, None) if damaged else
            Readings(r[4], r[5], as_bool(r[6]), r[7]),
            "last_refusal": r[8], "last_refusal_detail": r[9], "last_refusal_at": r[10],
            "heartbeat_raw": r[11], "unreadable": damaged})
    return out


def worker_gate(ctx: Context, w: dict[str, Any], now: int
                ) -> tuple[GateDecision, float | None]:
    """What the gates let this worker claim now, and its heartbeat's age in seconds."""
    age = None if w["heartbeat_at"] is None else (now - w["heartbeat_at"]) / MICROS
    if w.get("unreadable"):
        return GateDecision(-1, ("heartbeat_stale",
                                 unreadable_detail(w["worker_id"], w["unreadable"]))), age
    if age is None or age > ctx.policy.heartbeat_max_age_s:
        detail = f"last heartbeat {age:.0f}s ago" if age is not None else "no heartbeat"
        return GateDecision(-1, ("heartbeat_stale", detail)), age
    return evaluate(ctx.policy, w["readings"]), age


READING_RANGES: dict[str, tuple[float, float]] = {
    "memory_used_pct": (0.0, 100.0),
    "temperature_c": (-50.0, 150.0),
    "user_idle_s": (0.0, float(v.TEN_YEARS_S)),
}


def parse_readings(readings: Mapping[str, Any] | str | None, *, received: bool = True
                   ) -> tuple[str | None, Readings]:
    """Validate heartbeat readings. Returns the raw text exactly as received (a mapping is
    serialised once) and the parsed values the gates use. Each reading may be absent, null or
    "unknown". `received=False`: readings as stored, which may predate a rule on receipt."""
    if readings is None:
        return None, Readings()
    value, raw = readings_value(readings)
    parsed: dict[str, Any] = {}
    gpu_temps: list[float] = []
    for key, val in value.items():
        if key not in KNOWN_READINGS:
            raise InvalidInput("invalid_input", f"readings: unknown reading {key!r}; known: "
                               f"{', '.join(KNOWN_READINGS)}", field="readings")
        if val is None or val == "unknown":
            continue
        if key in RESOURCE_READINGS:
            # Read again from the raw heartbeat by the claims that need them (core.limits).
            gpu_temps.extend(capacity_reading(key, val, received))
            continue
        if key == "on_battery":
            if not isinstance(val, bool):
                raise InvalidInput("invalid_input", "readings: on_battery must be true, false, "
                                   "null or \"unknown\"", field="readings")
            parsed[key] = val
            continue
        lo, hi = READING_RANGES[key]
        if isinstance(val, bool) or not isinstance(val, int | float) or not lo <= val <= hi:
            raise InvalidInput("invalid_input", f"readings: {key} must be a number in "
                               f"{lo:g}..{hi:g}, null or \"unknown\"", field="readings")
        parsed[key] = float(val)
    if gpu_temps:
        # GPU temperature joins the thermal gate: the hottest part of the machine counts.
        parsed["temperature_c"] = max([*gpu_temps, parsed.get("temperature_c", -math.inf)])
    return raw, Readings(**parsed)


#: Readings a claim matches declared needs against (core.limits), not used by the gates.
RESOURCE_READINGS = ("memory_available_mb", "gpus", "capacity")
KNOWN_READINGS = ("memory_used_pct", "temperature_c", "on_battery", "user_idle_s",
                  *RESOURCE_READINGS)


def capacity_reading(key: str, val: Any, received: bool = True) -> list[float]:
    """Check one resource reading; returns the GPU temperatures it carries."""
    if key == "gpus":
        return [g["temperature_c"] for g in v.gpu_readings(val)
                if g["temperature_c"] is not None]
    if key == "capacity":
        if not isinstance(val, dict) or not val:
            raise InvalidInput("invalid_input", "readings: capacity must be an object of "
                               "NAME: INT (e.g. {\"slots\": 4})", field="readings")
        if received:
            v.capacity(val, "readings: capacity")
        else:
            v.resources(val, "readings: capacity", lo=0)
        return []
    if received and (isinstance(val, bool) or not isinstance(val, int)):
        # Digits as text would be stored as sent, and core.limits matches only a number:
        # the claims needing it would find no reading at all.
        raise InvalidInput("invalid_input", f"readings: {key} must be a whole number (a JSON "
                           f"integer, not {type(val).__name__}), null or \"unknown\"",
                           field="readings")
    v.whole(val, f"readings: {key}", 0, v.MAX_RESOURCE)
    return []


def default_worker_id() -> str:
    """host:pid, unique per process incarnation on one host."""
    return f"{socket.gethostname()}:{os.getpid()}"
