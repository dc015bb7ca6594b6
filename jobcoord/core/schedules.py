"""Schedules: durable rules that enqueue a job per slot (a cron time or an interval), and the
tick that fires what is due.

Firing is idempotent across processes: the slot's row in `schedule_fires` (unique per
schedule and slot) is inserted in the transaction that inserts its job, so any number of
tickers may run at once and each slot makes at most one job. A ticker also holds the
schedule's row while it decides (PostgreSQL: others skip it; SQLite: the write lock).

A slot is on time while the tick finds it less than `ON_TIME_S` old; older slots (the
machine slept or nothing ticked) are handled by the catch-up policy. A fired job's deadline
is slot + window, so it ends `dead` with reason `window_missed` if it never ran in time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from .. import faults
from .. import validate as v
from ..clock import MICROS, iso, now_us, seconds_to_us
from ..errors import InvalidInput, JobcoordError, Refused
from ..store import schedule_statements as sql
from .common import DEFAULT_TENANT, Context
from .slots import Due, Timing, cron_timing
from .submit import MAX_ATTEMPTS, CheckedSpec, JobSpec, check_spec, insert

#: How old a slot may be when a tick finds it and still count as on time (not missed).
ON_TIME_S = 300
CATCHUP = ("skip", "latest", "all:N")
OVERLAP = ("allow", "skip", "queue_one")
MAX_CATCHUP = 1000
#: Missed slots recorded one row each per tick; older ones are counted in the last row.
MAX_MISSED_ROWS = 100
#: A job still counts as the previous fire's until it is final (`unknown` waits for an
#: operator, and may yet turn out to have run).
LIVE = ("waiting", "running", "unknown")
MAX_EVERY_S = 366 * 86400
#: The most slots one write transaction of a tick handles, each a `schedule_fires` row and
#: at most one job: a tick with more (a long gap, many schedules, `all:N`) writes them in
#: further transactions, so SQLite's write lock is never held for more than this many.
MAX_TICK_SLOTS = 1000


def _catchup(value: object) -> tuple[str, int]:
    if value is None:
        return "skip", 1
    value = v.exact_text(value)
    if isinstance(value, str):
        if value in ("skip", "latest"):
            return value, 1
        head, sep, n = value.partition(":")
        if head == "all" and sep:
            return "all", v.whole(n, "catchup N", 1, MAX_CATCHUP)
    raise InvalidInput("invalid_input", f"catchup: {v.shown(value)} is not one of skip, latest, "
                       f"all:N (N from 1 to {MAX_CATCHUP})", field="catchup")


def _choice(value: object, field: str, allowed: tuple[str, ...], default: str) -> str:
    if value is None:
        return default
    value = v.exact_text(value)
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput("invalid_input", f"{field}: {v.shown(value)} is not one of "
                           f"{', '.join(allowed)}", field=field)
    return value


def _timing(cron: object, tz: object, every: object) -> Timing:
    if (cron is None) == (every is None):
        raise InvalidInput("invalid_input", "give either a cron expression (--cron, with an "
                           "optional --tz) or an interval (--every), exactly one",
                           field="cron")
    if every is not None:
        if tz is not None:
            raise InvalidInput("invalid_input", "tz: an interval (--every) is absolute time "
                               "and takes no time zone; --tz goes with --cron", field="tz")
        # The shortest interval is one second: the range a refusal names is the one checked.
        return Timing(every_us=seconds_to_us(v.safe_duration(every, "every", 1, MAX_EVERY_S)))
    return cron_timing(cron, tz)


def add(ctx: Context, name: str, kind: str, *, cron: str | None = None, tz: str | None = None,
        every: str | float | None = None, payload: Any = None,
        priority: int | str | None = None, role: str | None = None,
        tenant: str = DEFAULT_TENANT, max_attempts: int | None = None,
        window: str | float | None = None, catchup: str | None = None,
        overlap: str | None = None) -> dict[str, Any]:
    """Create a schedule; its first slot is the first one after now (none fires for the
    past). Refused (schedule_exists) when the name is taken."""
    name = v.name(name, "name")
    timing = _timing(cron, tz, every)
    spec = check_spec(ctx, JobSpec(kind, payload, priority, role, tenant, None, max_attempts))
    window_us = None
    if window is not None:
        window_us = seconds_to_us(v.safe_duration(window, "window", 0, v.TEN_YEARS_S))
        if window_us <= 0:
            raise InvalidInput("invalid_input", "window: must be longer than zero (the job "
                               "may start from its slot until slot + window)", field="window")
    catch, catch_max = _catchup(catchup)
    over = _choice(overlap, "overlap", OVERLAP, "allow")

    def _do(conn: Connection) -> dict[str, Any] | Refused:
        now = now_us()
        first = _first_slot(timing, now, window_us)
        got = ctx.db.run(conn, sql.INSERT_SCHEDULE, {
            "name": name, "tenant": spec.tenant, "kind": spec.kind, "role": spec.role,
            "priority": spec.priority, "payload": spec.payload_text,
            "max_attempts": spec.max_attempts, "cron": timing.cron, "tz": timing.tz,
            "every_us": timing.every_us, "window_us": window_us, "catchup": catch,
            "catchup_max": catch_max, "overlap": over, "paused": False,
            "next_slot_at": first, "due_at": first, "now": now}).first()
        if got is None:
            return Refused("schedule_exists", f"a schedule named {name!r} already exists "
                           "(`jobcoord schedule rm` it first to replace it)", name=name)
        return {"schedule": name, "created": True, "next_fire_at": first}

    return ctx.db.write(_do, "schedule add")


def _first_slot(timing: Timing, now: int, window_us: int | None) -> int:
    """A new schedule's first slot, refused when it (or its window's end) falls past the
    calendar's last day: stored, it would be a time no reader can render."""
    from ..stored import MAX_TIME_US

    try:
        first = timing.next_after(now)
    except (OverflowError, StopIteration, ValueError):  # no date after it to walk to
        first = None
    if first is None or first + (window_us or 0) > MAX_TIME_US:
        raise InvalidInput("invalid_input", "the schedule's first slot (and its window) "
                           "would fall past the year 9999", field="cron" if timing.cron
                           else "every")
    return first


def _row(r: Any, names: tuple[str, ...] = sql.SCHEDULE_NAMES) -> dict[str, Any]:
    """A row (a tuple) as a mapping of its column names."""
    return dict(zip(names, r, strict=True))


def _timing_of(s: Mapping[str, Any]) -> Timing:
    return Timing(cron=s["cron"], tz=s["tz"], every_us=s["every_us"])


def _find(ctx: Context, conn: Connection, name: str, *, lock: bool) -> dict[str, Any] | Refused:
    stmt = sql.SCHEDULE_BY_NAME_LOCKED if lock else sql.SCHEDULE_BY_NAME
    row = ctx.db.run(conn, stmt, {"name": name}).first()
    if row is None:
        return Refused("schedule_not_found", f"no schedule named {name!r}", name=name)
    return _row(row)


def _last(ctx: Context, conn: Connection, schedule_id: int) -> dict[str, Any] | None:
    row = ctx.db.run(conn, sql.LAST_FIRE, {"schedule_id": schedule_id}).first()
    return None if row is None else _row(row, sql.FIRE_NAMES)


def listing(ctx: Context) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Every schedule with its last handled slot (and that job's status now)."""
    def _do(conn: Connection) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        rows = [_row(r) for r in ctx.db.run(conn, sql.ALL_SCHEDULES).all()]
        return [(s, _last(ctx, conn, s["schedule_id"])) for s in rows]

    return ctx.db.read(_do, "schedule ls")


def set_paused(ctx: Context, name: str, paused: bool) -> dict[str, Any]:
    """Pause (no slot is handled, none recorded) or resume (from the first slot after now:
    slots passed while paused are not caught up, the pause was asked for)."""
    name = v.name(name, "name")

    def _do(conn: Connection) -> dict[str, Any] | Refused:
        s = _find(ctx, conn, name, lock=True)
        if isinstance(s, Refused):
            return s
        now = now_us()
        changed = bool(s["paused"]) != paused
        next_slot = s["next_slot_at"]
        if changed and not paused:
            next_slot = _first_slot(_timing_of(s), now, s["window_us"])
        due = None if paused else (now if s["queued_slot_at"] is not None else next_slot)
        if changed:
            ctx.db.run(conn, sql.SET_PAUSED, {
                "schedule_id": s["schedule_id"], "paused": paused, "next_slot_at": next_slot,
                "due_at": due, "queued_slot_at": s["queued_slot_at"], "now": now})
        return {"schedule": name, "paused": paused, "changed": changed,
                "next_fire_at": None if paused else next_slot}

    return ctx.db.write(_do, "schedule pause" if paused else "schedule resume")


def remove(ctx: Context, name: str) -> dict[str, Any]:
    """Delete a schedule and its record of handled slots; jobs it fired stay as they are."""
    name = v.name(name, "name")

    def _do(conn: Connection) -> dict[str, Any] | Refused:
        s = _find(ctx, conn, name, lock=True)
        if isinstance(s, Refused):
            return s
        ctx.db.run(conn, sql.DELETE_SCHEDULE, {"schedule_id": s["schedule_id"]})
        return {"schedule": name, "removed": True}

    return ctx.db.write(_do, "schedule rm")


def of_job(ctx: Context, job_id: int) -> dict[str, Any] | None:
    """The schedule and slot that made a job, the schedule's next fire and last outcome."""
    def _do(conn: Connection) -> dict[str, Any] | None:
        fire = ctx.db.run(conn, sql.FIRE_OF_JOB, {"job_id": job_id}).first()
        if fire is None:
            return None
        s = _find(ctx, conn, fire[0], lock=False)
        if isinstance(s, Refused):
            return None
        return {"schedule": s, "slot_at": fire[1], "last": _last(ctx, conn, s["schedule_id"])}

    return ctx.db.read(_do, "explain")


# --- the tick ---------------------------------------------------------------------------------


class _Tick:
    """One schedule's handling inside the tick's write transaction."""

    def __init__(self, ctx: Context, conn: Connection, s: dict[str, Any], now: int):
        self.ctx, self.conn, self.s, self.now = ctx, conn, s, now
        self.counts = {"fired": 0, "missed": 0, "skipped": 0, "queued": 0}
        self.jobs: list[int] = []
        self.queued = s["queued_slot_at"]
        self.handled = 0  # slots handled: a row each (a released held slot: its job)

    def record(self, slot: int, outcome: str, detail: Mapping[str, Any] | None = None
               ) -> int | None:
        """The slot's row; None when another ticker handled this slot already."""
        got = self.ctx.db.run(self.conn, sql.INSERT_FIRE, {
            "schedule_id": self.s["schedule_id"], "slot_at": slot, "outcome": outcome,
            "job_id": None, "now": self.now,
            "detail": v.dumps(detail) if detail else None}).first()
        if got is None:
            return None
        self.counts[outcome] += 1
        return int(got[0])

    def live_previous(self) -> dict[str, Any] | None:
        row = self.ctx.db.run(self.conn, sql.LAST_JOB_FIRE,
                              {"schedule_id": self.s["schedule_id"]}).first()
        if row is None or row[5] not in LIVE:
            return None
        return {"job_id": row[2], "status": row[5], "slot": iso(row[0])}

    def make_job(self, fire_id: int, slot: int) -> None:
        s, window = self.s, self.s["window_us"]
        spec = CheckedSpec(kind=s["kind"], payload_text=s["payload_json"],
                           priority=s["priority"], role=s["required_role"],
                           tenant=s["tenant"], key=None, max_attempts=s["max_attempts"],
                           deadline_in_us=None if window is None else slot + window - self.now,
                           delay_us=0)
        made = insert(self.ctx, self.conn, spec, self.now)
        if isinstance(made, JobcoordError):  # no key, so never; said rather than assumed
            raise made
        faults.point("schedule.after_job")  # a kill here must leave neither job nor slot
        self.ctx.db.run(self.conn, sql.SET_FIRE_JOB, {
            "fire_id": fire_id, "job_id": made["job_id"], "outcome": "fired", "now": self.now})
        self.jobs.append(made["job_id"])

    def fire(self, slot: int) -> None:
        """Fire one slot, as the overlap policy allows."""
        window = self.s["window_us"]
        if window is not None and slot + window <= self.now:
            self.record(slot, "missed", {"because": "window_closed"})
            return
        previous = self.live_previous() if self.s["overlap"] != "allow" else None
        if previous is not None and self.s["overlap"] == "skip":
            self.record(slot, "skipped", {"because": "overlap", "previous": previous})
            return
        if previous is not None:  # queue_one: hold one slot until the previous job ends
            if self.queued is not None:
                self.record(slot, "skipped", {"because": "overlap_queue_full",
                                              "previous": previous})
            elif self.record(slot, "queued", {"previous": previous}) is not None:
                self.queued = slot
            return
        fire_id = self.record(slot, "fired")
        if fire_id is not None:
            self.make_job(fire_id, slot)

    def release_queued(self) -> None:
        """queue_one: fire the held slot once the previous job has finished."""
        if self.queued is None or self.live_previous() is not None:
            return
        slot, self.queued = self.queued, None
        window = self.s["window_us"]
        fire_id = self.ctx.db.run(self.conn, sql.FIRE_ID, {
            "schedule_id": self.s["schedule_id"], "slot_at": slot}).scalar()
        if fire_id is None:
            return
        if window is not None and slot + window <= self.now:
            self.ctx.db.run(self.conn, sql.SET_FIRE_OUTCOME, {
                "fire_id": fire_id, "outcome": "missed", "now": self.now,
                "detail": v.dumps({"because": "window_closed"})})
            self.counts["missed"] += 1
            return
        self.make_job(fire_id, slot)
        self.counts["fired"] += 1

    def run(self, due: Due, room: int) -> tuple[dict[str, Any], Due | None]:
        """Handle the slots `_plan` found due (the latest ones up to `now`), at most `room`
        of them (a held slot this releases counts as one). Returns what was done and, when
        slots are left over, the rest as a Due of their own: the row's next slot is then the
        first of them and it stays due, so whoever ticks next handles exactly those."""
        s, now = self.s, self.now
        self.release_queued()
        room -= len(self.jobs)
        on_time = [x for x in due.slots if now - x < ON_TIME_S * MICROS]
        late = [x for x in due.slots if now - x >= ON_TIME_S * MICROS]
        catch_up: list[int] = []
        if s["catchup"] == "latest" and late and not on_time:
            catch_up = late[-1:]
        elif s["catchup"] == "all":
            catch_up = late[-_catchup_max(s):]
        chosen = set(catch_up)
        missed = [x for x in late if x not in chosen]
        rows = missed[-MAX_MISSED_ROWS:]
        # In slot order: the missed rows, then catch-up, then on time. Catch-up takes the
        # latest late slots, so the policy applied again to what is left of this list
        # (after a crash, by any ticker) chooses the same slots.
        todo = (*rows, *catch_up, *on_time)
        now_todo, rest = todo[:max(room, 0)], todo[max(room, 0):]
        self.handled = len(self.jobs) + len(now_todo)
        if rows and now_todo:
            self.record_missed(rows[:len(now_todo)], len(missed) - len(rows), due.passed)
        for slot in now_todo[len(rows):]:
            self.fire(slot)
        after = rest[0] if rest else due.after
        ended = after is None
        if ended:
            # No slot is left on the calendar: paused, as `pause` leaves a schedule (a
            # resume is refused while no slot is left, as an add is).
            self.ctx.db.run(self.conn, sql.SET_PAUSED, {
                "schedule_id": s["schedule_id"], "paused": True,
                "next_slot_at": max(due.slots, default=s["next_slot_at"]), "due_at": None,
                "queued_slot_at": self.queued, "now": now})
        else:
            due_at = now if self.queued is not None or rest else after
            self.ctx.db.run(self.conn, sql.ADVANCE_SCHEDULE, {
                "schedule_id": s["schedule_id"], "next_slot_at": after, "due_at": due_at,
                "queued_slot_at": self.queued, "now": now})
        return ({"schedule": s["name"], **self.counts, "missed_exact": due.passed is not None,
                 "jobs": self.jobs, "next_fire_at": due.after,
                 "calendar_ended": ended},
                Due(rest, 0, due.after) if rest else None)

    def record_missed(self, rows: list[int] | tuple[int, ...], uncounted: int,
                      passed: int | None) -> None:
        """Each missed slot gets its row (the latest MAX_MISSED_ROWS of them); the earliest
        row counts the older ones it stands for (`uncounted` of them plus the `passed`
        over), or says "many" when they were not counted (a cron after more slots than a
        tick handles)."""
        older = uncounted + (passed or 0)
        for i, slot in enumerate(rows):
            detail: dict[str, Any] = {"because": "late", "catchup": self.s["catchup"]}
            if i == 0 and (older or passed is None):
                detail["older_missed"] = older if passed is not None else "many"
            self.record(slot, "missed", detail)
        self.counts["missed"] += older


def _catchup_max(s: Mapping[str, Any]) -> int:
    """all:N's N; a row written outside jobcoord with more still fires at most
    MAX_CATCHUP, so the slots a tick computes stay bounded."""
    return min(int(s["catchup_max"]), MAX_CATCHUP)


def unreadable(row: Any, now: int) -> str | None:
    """Why a tick at `now` would pass schedule `row` (a SCHEDULE_COLUMNS tuple) over as
    written outside jobcoord, or None: `check` judges by the tick's own rule, and by its
    cron and zone even before a slot is due (a tick parses them only then)."""
    s = _row(row)
    if s["cron"] is not None:
        # With a slot at all: one whose slots the calendar has run out of is what the
        # tick leaves, paused, not damage.
        try:
            cron_timing(s["cron"], s["tz"], after_us=0)
        except (InvalidInput, ValueError, TypeError) as e:
            return f"{type(e).__name__}: {str(e)[:200]} (written outside jobcoord)"
    got = _plan(s, now)
    return got if isinstance(got, str) else None


def _plan(s: Mapping[str, Any], now: int, first: int | None = None) -> Due | str:
    """The slots a tick at `now` handles of due schedule `s` (from `first`, else its next
    slot): the on-time ones, and the latest late ones that catch-up may fire or that get a
    row each as missed. Or why its stored row cannot be ticked: a value of the wrong type
    or past the calendar, neither a cron nor an interval (or an interval under a second), a
    cron that does not parse, slots or windows that leave the calendar. Computed before
    anything is written, from what a tick computes: a damaged row once stopped every
    schedule (the tick's one transaction failed on it, exit 1, in every ticker)."""
    from .. import stored
    from ..schema import schedules

    try:
        stored.row(schedules, s, f"schedule {str(s['name'])[:60]!r}")
        # What every fire copies into a job: damaged, each job it made was damaged (a
        # payload no reader parses), or the insert broke the jobs table's check and the
        # tick's one transaction with it.
        if not isinstance(v.loads(s["payload_json"]), dict):
            raise ValueError("its payload is not a JSON object")
        if not 1 <= s["max_attempts"] <= MAX_ATTEMPTS:  # what an add takes
            raise ValueError(f"its max_attempts {s['max_attempts']} is not 1..{MAX_ATTEMPTS}")
        if not 0 <= s["priority"] <= 3:  # the jobs table's check, as the schedules' own
            raise ValueError(f"its priority {s['priority']} is not 0..3")
        timing = _timing_of(s)
        if timing.every_us is None and timing.cron is None:
            raise ValueError("it has neither a cron nor an interval")
        if timing.every_us is not None and timing.every_us < MICROS:
            raise ValueError(f"its interval {timing.every_us} us is under a second")
        due = timing.due(s["next_slot_at"] if first is None else first, now,
                         since=now - ON_TIME_S * MICROS,
                         older=_catchup_max(s) + MAX_MISSED_ROWS)
        window = s["window_us"]
        if window is not None and not 0 < window <= seconds_to_us(v.TEN_YEARS_S):
            raise ValueError(f"its window {window} us is none an add accepts")
        if window is not None and due.slots and due.slots[-1] + window > stored.MAX_TIME_US:
            # A late tick: the latest slots' windows leave the calendar, as the next slot's
            # would on time. The ones that fit are handled; the calendar has ended.
            due = Due(tuple(x for x in due.slots if x + window <= stored.MAX_TIME_US),
                      due.passed, None)
        for slot in due.slots:
            iso(slot)
            if window is not None:
                iso(slot + window)
    except Exception as e:  # whatever the row makes the slot arithmetic raise
        return f"{type(e).__name__}: {str(e)[:200]} (written outside jobcoord)"
    if due.after is not None and due.after + (s["window_us"] or 0) > stored.MAX_TIME_US:
        # The calendar ends before the next slot (or its window): the tick fires what is
        # due and pauses the schedule (an add is refused as much, see _first_slot).
        return Due(due.slots, due.passed, None)
    return due


def _replan(planned: tuple[dict[str, Any], int, Due | str] | None, s: dict[str, Any],
            now: int) -> Due | str:
    """The slots due at `now` (read under the write lock) of schedule row `s`, from those
    planned before the lock: only the slots that came due since are computed here (none
    or one, normally). A row that changed meanwhile, or was not planned, is planned
    afresh."""
    if planned is None or planned[0] != s or now < planned[1]:  # (or the clock stepped back)
        return _plan(s, now)
    due = planned[2]
    if isinstance(due, str) or due.after is None or due.after > now:
        return due
    more = _plan(s, now, due.after)
    if isinstance(more, str):
        return more
    if more.passed == 0:
        return Due(due.slots + more.slots, due.passed, more.after)
    passed = None if due.passed is None or more.passed is None else (
        due.passed + len(due.slots) + more.passed)
    return Due(more.slots, passed, more.after)


def tick(ctx: Context, *, limit: int = 100) -> dict[str, Any]:
    """Fire what is due, in write transactions of at most MAX_TICK_SLOTS slots each, every
    one leaving the schedules' rows consistent with what it committed. At most `limit`
    schedules are handled, each counted once: one a write left half done is gone on with
    first in the next write, before the tick begins any other. Cheap when nothing is due:
    one read of the due index, no write lock.
    `missed` counts the missed slots exactly unless `missed_exact` is false: a cron after
    more slots than a tick handles, whose older slots are not walked through to count them.
    Times in the answer are microseconds (present.ticked_json makes them ISO text)."""
    limit = v.whole(limit, "limit", 1, 10_000)

    def _empty() -> dict[str, Any]:
        return {"fired": 0, "missed": 0, "skipped": 0, "queued": 0, "missed_exact": True,
                "schedules": [], "unreadable": []}

    then = now_us()
    rows = ctx.db.read(lambda conn: [_row(r) for r in ctx.db.run(
        conn, sql.DUE_TO_PLAN, {"now": then, "limit": limit}).all()], "schedule tick")
    if not rows:
        return {**_empty(), "at": then}
    # The slots are computed here, outside any transaction: it is arithmetic on the rows,
    # and the write lock (SQLite's, held by one writer at a time) is taken only for the
    # inserts. The write re-reads each row and uses this plan while the row is unchanged.
    plans: dict[int, tuple[dict[str, Any], int, Due | str]] = {
        s["schedule_id"]: (s, then, _plan(s, then)) for s in rows}
    done: set[int] = set()  # handled in full by an earlier write of this tick (or unreadable)
    # The schedules this tick has begun, each counted once against `limit` however many
    # writes it takes; the one an earlier write left half done (`split`, at most one: a
    # write ends where it splits a schedule) is gone on with first in the next write.
    begun: set[int] = set()
    split: int | None = None

    def _do(conn: Connection
            ) -> tuple[int, list[Any], dict[int, Any], set[int], set[int], int | None, bool]:
        # Only local state here: a busy retry runs this afresh, and the tick's own state
        # changes once the write has committed.
        now, room, more = now_us(), MAX_TICK_SLOTS, False
        results: list[Any] = []
        rest_plans: dict[int, Any] = {}
        finished: set[int] = set()
        started: set[int] = set()
        left_split: int | None = None
        first = [] if split is None else ctx.db.run(
            conn, sql.DUE_SCHEDULE_BY_ID, {"schedule_id": split, "now": now}).all()
        due_rows = ctx.db.run(conn, sql.DUE_SCHEDULES,
                              {"now": now, "limit": limit + len(begun)}).all()
        for row in (*first, *due_rows):
            s = _row(row)
            sid = s["schedule_id"]
            if sid in done or sid in finished:  # still due: a held queue_one slot, or a slot
                continue                        # due since
            if sid not in begun and sid not in started and len(begun | started) >= limit:
                break
            if room < 2:  # a held slot it releases and one slot, at least
                more = True
                break
            started.add(sid)
            due = _replan(plans.get(sid), s, now)
            if isinstance(due, str):
                # Written outside jobcoord: left as it is, said in every tick's answer, and
                # never in the way of the schedules after it.
                results.append({"name": str(s["name"])[:200], "detail": due})
                finished.add(sid)
                continue
            t = _Tick(ctx, conn, s, now)
            got, rest = t.run(due, room)
            room -= t.handled
            results.append(got)
            if rest is None:
                finished.add(sid)
                continue
            # The row as this write leaves it, so the next write uses the rest of the plan
            # (no slot computed under the lock) unless someone changed the row meanwhile.
            left = {**s, "next_slot_at": rest.slots[0], "due_at": now,
                    "queued_slot_at": t.queued, "updated_at": now}
            rest_plans[sid] = (left, now, rest)
            left_split = sid
            more = True
            break
        return now, results, rest_plans, finished, started, left_split, more

    out = _empty()
    out["at"] = None
    by_name: dict[str, dict[str, Any]] = {}
    while True:
        now, results, rest_plans, finished, started, split, more = ctx.db.write(
            _do, "schedule tick")
        plans.update(rest_plans)
        done.update(finished)
        begun.update(started)
        out["at"] = now if out["at"] is None else out["at"]
        for got in results:
            if "detail" in got:
                out["unreadable"].append(got)
                continue
            for k in ("fired", "missed", "skipped", "queued"):
                out[k] += got[k]
            out["missed_exact"] = out["missed_exact"] and got["missed_exact"]
            seen = by_name.get(got["schedule"])
            if seen is None:
                by_name[got["schedule"]] = got
                out["schedules"].append(got)
                continue
            for k in ("fired", "missed", "skipped", "queued"):
                seen[k] += got[k]
            seen["missed_exact"] = seen["missed_exact"] and got["missed_exact"]
            seen["jobs"] = seen["jobs"] + got["jobs"]
            seen["next_fire_at"] = got["next_fire_at"]
            seen["calendar_ended"] = got["calendar_ended"]
        if not more:
            return out
        # Each write committed its slots with the rows advanced: a crash here neither loses
        # nor repeats a slot, the next tick handles the rest.
        faults.point("schedule.tick.between_writes")
        ctx.db.let_writers_in()
