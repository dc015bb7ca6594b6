"""When a schedule's slots are: a cron expression in an IANA time zone (through cronsim), or
a fixed interval. Pure arithmetic on integer microseconds since the epoch, UTC; no database.

Cron follows Debian cron's rules for daylight saving time (cronsim's): a slot whose local
time does not exist on the spring-forward night fires once, at the first minute after the
gap (02:30 in Europe/Berlin fires at 03:00 CEST); a slot whose local time happens twice on
the fall-back night fires once, at its first occurrence. Expressions whose minute or hour
field is a wildcard (`*/15 * * * *`) keep their real-time spacing through the change.
Intervals are absolute time: `every 15m` fires at every multiple of 15 minutes since the
Unix epoch, whatever the zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..errors import InvalidInput

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def zone(name: object) -> ZoneInfo:
    """An IANA time zone by name (e.g. Europe/Berlin), or a clear refusal."""
    if not isinstance(name, str) or not name or len(name) > 64 or "\x00" in name:
        raise InvalidInput("invalid_input", "tz: give an IANA time zone name such as "
                           "Europe/Berlin or UTC", field="tz")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput("invalid_input", f"tz: {name!r} is not a known IANA time zone "
                           "(e.g. Europe/Berlin, America/New_York, UTC)", field="tz") from None


#: Names the zone reader opens that are no zone a schedule can mean: the host's own setting
#: (slots would depend on which machine ticks), tzdata's placeholder, and its alternative
#: trees (leap-second and POSIX-rule copies of the real zones).
_NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})
_NOT_ZONE_TREES = ("posix/", "right/")


def input_zone(name: object) -> ZoneInfo:
    """`zone` for a name given now (a schedule being added): also refuses the names the
    reader opens that are no IANA zone. (Stored names are read with `zone` alone.)"""
    tz = zone(name)
    if name in _NOT_ZONES or str(name).startswith(_NOT_ZONE_TREES):
        raise InvalidInput("invalid_input", f"tz: {name!r} is not an IANA time zone a "
                           "schedule can use (e.g. Europe/Berlin, America/New_York, UTC)",
                           field="tz")
    return tz


def to_us(dt: datetime) -> int:
    return (dt - _EPOCH) // _ONE_US


def from_us(us: int, tz: ZoneInfo) -> datetime:
    return (_EPOCH + timedelta(microseconds=us)).astimezone(tz)


@dataclass(frozen=True)
class Timing:
    """A schedule's slots: `cron` in `tz`, or every `every_us` microseconds."""

    cron: str | None = None
    tz: str | None = None
    every_us: int | None = None

    def next_after(self, t_us: int) -> int:
        """The first slot strictly after t_us."""
        if self.every_us is not None:
            return (t_us // self.every_us + 1) * self.every_us
        assert self.cron is not None
        tz = zone(self.tz or "UTC")
        it = CronSim(self.cron, from_us(t_us, tz))
        nxt = to_us(next(it))
        # cronsim walks local wall-clock time: from inside the hour that repeats on the
        # fall-back night, its next match can be the first pass's, already behind t.
        while nxt <= t_us:
            nxt = to_us(next(it))
        return nxt

    def due(self, first: int, now: int, *, since: int, older: int) -> Due:
        """The slots from `first` (itself a slot) up to `now` that a tick handles: every one
        after `since`, and the latest `older` ones at or before it. The cost is those slots,
        never the length of the gap: a cron is walked back from `now` (months asleep are
        not walked through), an interval is arithmetic."""
        if first > now:
            return Due((), 0, first)
        if self.every_us is not None:
            every = self.every_us
            count = (now - first) // every + 1  # first, first + every, ... up to now
            recent = max(0, min(count, count - (since - first) // every - 1))
            keep = min(count, recent + older)
            start = first + (count - keep) * every
            return Due(tuple(range(start, first + count * every, every)), count - keep,
                       first + count * every)
        extra = 0
        while True:
            start = self._start_of_latest(first, now, since, older + extra)
            slots, after = self._walk(first, start, now)
            recent = sum(1 for x in slots if x > since)
            if start is None or len(slots) - recent >= older:
                break
            # The walk back found a slot the walk forward does not (a daylight saving
            # night in a zone that shifts by half an hour): start further back.
            extra = 2 * extra + 1
        keep = min(len(slots), recent + older)
        passed = None if start is not None else len(slots) - keep
        return Due(tuple(slots[len(slots) - keep:]), passed, after)

    def _walk(self, first: int, start: int | None, now: int
              ) -> tuple[list[int], int | None]:
        """A cron's slots up to `now` from `first` (start None) or after `start`, and the
        first slot after `now` (None: the calendar ends first)."""
        assert self.cron is not None
        slots = [first] if start is None else []
        last = first if start is None else start
        it = CronSim(self.cron, from_us(last, zone(self.tz or "UTC")))
        while True:
            try:
                nxt = to_us(next(it))
            except OverflowError:  # the calendar ends (the year 9999) before a next slot
                return slots, None
            if nxt <= last:  # never a slot twice, never backwards (see next_after)
                continue
            if nxt > now:
                return slots, nxt
            slots.append(nxt)
            last = nxt

    def _start_of_latest(self, first: int, now: int, since: int, older: int) -> int | None:
        """Where a forward walk finds the latest slots: None when they reach back to
        `first` (walk from it, every slot counted), else a slot older than every one
        kept, after which the walk starts (the ones before it are not counted).

        Found by cronsim's walk backwards from `now`; the forward walk stays the one
        definition of the slots (the two can differ by a slot on a daylight saving night in
        a zone that shifts by half an hour), this only says where it starts."""
        tz = zone(self.tz or "UTC")
        try:
            walk_from = from_us(now + 1, tz)
        except OverflowError:
            # The zone's own calendar has ended (ahead of UTC, local time is in the year
            # 10000 already): its latest slots are before its last local instant.
            walk_from = datetime.max.replace(tzinfo=tz)
        back = CronSim(self.cron or "", walk_from, reverse=True)
        seen_older = 0
        while True:
            try:
                slot = to_us(next(back))
            except StopIteration:  # no slot for decades back
                return None
            if slot > now:  # never, said rather than assumed (DST fix-ups step forward)
                continue
            if slot <= first:
                return None
            if slot <= since:
                seen_older += 1
                if seen_older > older:
                    return slot


@dataclass(frozen=True)
class Due:
    """What a tick handles of a schedule: `slots`, ascending, the latest up to now; how
    many slots before them were passed over, or None when they were not counted (a cron
    after more slots than the tick handles); the first slot after now, or None when the
    calendar ends before it (or before its window does)."""

    slots: tuple[int, ...]
    passed: int | None
    after: int | None


def cron_timing(expr: object, tz: object, *, after_us: int | None = None) -> Timing:
    """A checked cron timing: five fields (minute hour day-of-month month day-of-week), and
    a zone (UTC when none is given), with a slot after `after_us` (default: now)."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > 200:
        raise InvalidInput("invalid_input", "cron: give a cron expression of five fields, "
                           "e.g. '0 2 * * *'", field="cron")
    expr = " ".join(expr.split())
    if len(expr.split(" ")) != 5:
        raise InvalidInput("invalid_input", f"cron: {expr!r} has {len(expr.split(' '))} "
                           "fields; give five: minute hour day-of-month month day-of-week",
                           field="cron")
    tz_name = "UTC" if tz is None else tz
    input_zone(tz_name)
    timing = Timing(cron=expr, tz=tz_name)
    try:
        timing.next_after(to_us(datetime.now(UTC)) if after_us is None else after_us)
    except OverflowError:
        raise InvalidInput("invalid_input", f"cron: {expr!r} has no slot before the year "
                           "10000", field="cron") from None
    except (CronSimError, StopIteration, ValueError, IndexError, KeyError) as e:
        reason = str(e) or "it never matches a date"
        raise InvalidInput("invalid_input", f"cron: {expr!r} is not a valid cron expression "
                           f"({reason})", field="cron") from None
    return timing
