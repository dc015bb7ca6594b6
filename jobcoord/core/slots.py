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
#: Enumerating more due slots than this in one tick (a minute cron after months asleep)
#: would hold the write lock for seconds: the rest are counted as missed without a row each.
MAX_SLOTS_PER_TICK = 100_000


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

    def due(self, first: int, now: int) -> tuple[list[int], int, int]:
        """The slots from `first` (itself a slot) up to `now`, ascending, at most
        `MAX_SLOTS_PER_TICK` of them; how many more were passed over (0 normally; -1: an
        unknown number, after a cron's list reached the bound); the first slot after `now`.
        An interval keeps the latest slots; a cron, walked forward, keeps the earliest."""
        if first > now:
            return [], 0, first
        if self.every_us is not None:
            last = now - now % self.every_us
            count = (last - first) // self.every_us + 1
            start = max(first, last - (MAX_SLOTS_PER_TICK - 1) * self.every_us)
            slots = list(range(start, last + 1, self.every_us))
            return slots, count - len(slots), last + self.every_us
        assert self.cron is not None
        tz = zone(self.tz or "UTC")
        slots = [first]
        it = CronSim(self.cron, from_us(first, tz))
        while True:
            nxt = to_us(next(it))
            if nxt <= slots[-1]:  # never a slot twice, never backwards (see next_after)
                continue
            if nxt > now:
                return slots, 0, nxt
            if len(slots) >= MAX_SLOTS_PER_TICK:
                # Months of a minute cron: jump to the present instead of walking it.
                return slots, -1, self.next_after(now)
            slots.append(nxt)


def cron_timing(expr: object, tz: object) -> Timing:
    """A checked cron timing: five fields (minute hour day-of-month month day-of-week), and
    a zone (UTC when none is given)."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > 200:
        raise InvalidInput("invalid_input", "cron: give a cron expression of five fields, "
                           "e.g. '0 2 * * *'", field="cron")
    expr = " ".join(expr.split())
    if len(expr.split(" ")) != 5:
        raise InvalidInput("invalid_input", f"cron: {expr!r} has {len(expr.split(' '))} "
                           "fields; give five: minute hour day-of-month month day-of-week",
                           field="cron")
    tz_name = "UTC" if tz is None else tz
    zone(tz_name)
    timing = Timing(cron=expr, tz=tz_name)
    try:
        timing.next_after(to_us(datetime.now(UTC)))
    except (CronSimError, StopIteration, ValueError, IndexError, KeyError) as e:
        reason = str(e) or "it never matches a date"
        raise InvalidInput("invalid_input", f"cron: {expr!r} is not a valid cron expression "
                           f"({reason})", field="cron") from None
    return timing
