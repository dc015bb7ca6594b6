"""The coordinator's one clock.

Every time jobcoord stores or compares is an integer count of microseconds since the Unix
epoch, UTC, taken here and bound into SQL as a parameter (never SQL's own `now()`), so a lease
is judged by exactly one clock and freezegun controls it in tests.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

MICROS = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def now_us() -> int:
    """Current UTC time in integer microseconds."""
    # datetime.now (not time.time) so that freezegun's frozen clock reaches every caller.
    return us_of(datetime.now(UTC))


def us_of(dt: datetime) -> int:
    """`dt` (naive: UTC) in integer microseconds since the epoch. Integer arithmetic: a
    float of seconds has too few digits late in the calendar, where .999999 rounds up to
    the next second."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // _ONE_US


def seconds_to_us(seconds: float) -> int:
    return round(seconds * MICROS)


def iso(us: int | None) -> str | None:
    """Render a stored time as ISO 8601 UTC for humans and JSON output."""
    if us is None:
        return None
    if isinstance(us, str | bytes):
        # Only a row written outside jobcoord holds anything else (SQLite keeps text in an
        # integer column): the database is damaged (exit 7), not the code.
        from .errors import DatabaseCorrupt

        raise DatabaseCorrupt(
            "value_of_wrong_type", f"a stored time is {type(us).__name__} {str(us)[:40]!r}, "
            "not a count of microseconds (written outside jobcoord); `jobcoord check` names "
            "the table and the column")
    seconds, micro = divmod(us, MICROS)
    try:
        second = _second_text(seconds)
    except (OverflowError, OSError, ValueError):
        # Past the calendar (year 10000 on): written outside jobcoord, as above.
        from .stored import out_of_range

        raise out_of_range(us, "a stored time") from None
    # As datetime.isoformat writes it: the microseconds only when there are any.
    return f"{second}.{micro:06d}Z" if micro else second + "Z"


@functools.lru_cache(maxsize=4096)
def _second_text(seconds: int) -> str:
    """One second's ISO 8601 text without a zone. Kept: the times of one answer, and of the
    answers around it, mostly fall in a few seconds, and building a datetime to write each
    one was a twentieth of the server's time per worker request."""
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None).isoformat()
