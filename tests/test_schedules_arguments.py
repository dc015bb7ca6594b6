"""Every argument of the schedule methods either works or is refused as InvalidInput (or a
rule's refusal), and a refusal changes nothing; bad cron, unknown zones, zero or negative
intervals, bad windows, unknown and duplicate names say so clearly."""

from __future__ import annotations

from typing import Any

import pytest

from jobcoord.errors import InvalidInput, Refused
from jobcoord.maintenance import check
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.test_api_arguments import SCHEDULE_METHODS, check_calls


def test_schedule_methods_either_work_or_refuse_and_change_nothing(coord: Coordinator
                                                                   ) -> None:
    check_calls(coord, coord, SCHEDULE_METHODS, 200, refusals=(InvalidInput, Refused),
                unchanged_on=(InvalidInput, Refused))


BAD_ADDS = [
    ({"cron": "0 2 * *"}, "cron", "fields"),
    ({"cron": "61 2 * * *"}, "cron", "not a valid cron"),
    ({"cron": "0 0 30 2 *"}, "cron", "not a valid cron"),
    ({"cron": "0 2 * * *", "tz": "Mars/Olympus"}, "tz", "not a known IANA time zone"),
    ({"cron": "0 2 * * *", "tz": "America"}, "tz", "not a known IANA time zone"),
    ({"cron": "0 2 * * *", "tz": "../../etc/passwd"}, "tz", "not a known IANA time zone"),
    ({"cron": "0 2 * * *", "tz": ""}, "tz", "IANA"),
    # Names the zone reader opens that are no zone a schedule can mean: the host's own
    # setting (slots would depend on which machine ticks), tzdata's placeholder and its
    # alternative trees.
    ({"cron": "0 2 * * *", "tz": "localtime"}, "tz", "not an IANA time zone"),
    ({"cron": "0 2 * * *", "tz": "Factory"}, "tz", "not an IANA time zone"),
    ({"cron": "0 2 * * *", "tz": "posixrules"}, "tz", "not an IANA time zone"),
    ({"cron": "0 2 * * *", "tz": "right/UTC"}, "tz", "not an IANA time zone"),
    ({"cron": "0 2 * * *", "tz": "posix/Europe/Berlin"}, "tz", "not an IANA time zone"),
    # Read as 5 minutes, a schedule meant monthly fired 8,928 times a month.
    ({"every": "5M"}, "every", "months or minutes"),
    ({"cron": "0 2 * * *", "window": "1M"}, "window", "months or minutes"),
    # The range named is the one checked: the shortest interval is one second.
    ({"every": "0"}, "every", "outside [1, "),
    ({"every": 0}, "every", "outside [1, "),
    ({"every": "0.5s"}, "every", "outside [1, "),
    ({"every": "0.9999999s"}, "every", "0.9999999 is outside [1, "),  # not shown as 1
    ({"every": "99999999999w"}, "every", "outside [1, "),
    ({"every": -60}, "every", "outside"),
    ({"every": "-5m"}, "every", "not a duration"),
    ({"every": "15x"}, "every", "not a duration"),
    ({"every": "15m", "window": "0"}, "window", "longer than zero"),
    ({"every": "15m", "window": "-1h"}, "window", "not a duration"),
    ({"every": "15m", "window": "soon"}, "window", "not a duration"),
    ({"every": "15m", "catchup": "all"}, "catchup", "all:N"),
    ({"every": "15m", "catchup": "all:0"}, "catchup N", "outside"),
    ({"every": "15m", "overlap": "never"}, "overlap", "allow, skip, queue_one"),
    ({"every": "15m", "tz": "UTC"}, "tz", "takes no time zone"),
    ({}, "cron", "exactly one"),
    ({"every": "15m", "cron": "* * * * *"}, "cron", "exactly one"),
]


@pytest.mark.parametrize(("kwargs", "field", "words"), BAD_ADDS,
                         ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_ADDS)])
def test_a_bad_schedule_is_refused_clearly_and_changes_nothing(
        coord: Coordinator, kwargs: dict[str, Any], field: str, words: str) -> None:
    before = dump(coord)
    with pytest.raises(InvalidInput) as e:
        coord.add_schedule("nightly", "k", **kwargs)
    assert e.value.details.get("field") == field and words in e.value.message
    assert dump(coord) == before


def test_an_unknown_or_duplicate_name_is_refused_and_changes_nothing(coord: Coordinator
                                                                     ) -> None:
    coord.add_schedule("nightly", "k", cron="0 2 * * *")
    before = dump(coord)
    with pytest.raises(Refused) as e:
        coord.add_schedule("nightly", "j", every="1h")
    assert e.value.code == "schedule_exists"
    for call in (coord.pause_schedule, coord.resume_schedule, coord.remove_schedule):
        with pytest.raises(Refused) as e:
            call("nope")
        assert e.value.code == "schedule_not_found"
    assert dump(coord) == before


@pytest.mark.parametrize("kwargs", [{"every": "1w"}, {"cron": "0 0 1 1 *"},
                                    {"every": "1m", "window": "3650d"}],
                         ids=["every", "cron", "window"])
def test_a_schedule_whose_first_slot_falls_past_the_calendar_is_refused_and_changes_nothing(
        coord: Coordinator, kwargs: dict[str, Any]) -> None:
    """At the calendar's end (a clock set to 9999-12-31), a first slot past it was stored
    anyway, then called corrupt by every read ("written outside jobcoord", exit 7), or the
    add failed with an internal error (exit 1). Refused, exit 2, nothing stored."""
    from freezegun import freeze_time

    before = dump(coord)
    with freeze_time("9999-12-31T23:59:00"), pytest.raises(InvalidInput) as e:
        coord.add_schedule("far", "k", **kwargs)
    assert "9999" in e.value.message or "10000" in e.value.message, e.value.message
    assert dump(coord) == before


@pytest.mark.parametrize("kwargs", [{"every": "30m"}, {"cron": "30 23 31 12 *"},
                                    {"every": "10m", "window": "20m"}],
                         ids=["every", "cron", "window"])
def test_a_schedule_at_the_calendars_end_fires_what_is_due_then_pauses(
        coord: Coordinator, kwargs: dict[str, Any]) -> None:
    """A tick whose schedule's next slot (or its window) would fall past the year 9999
    called the row corrupt ("written outside jobcoord", `schedule tick` exit 7) and fired
    nothing, not even the slot due; a resume then failed with an internal error (exit 1).
    Now the due slot fires and the schedule pauses, saying its calendar ended; a resume is
    refused as an add past the calendar is, and changes nothing."""
    from freezegun import freeze_time

    with freeze_time("9999-12-31T23:05:00"):
        coord.add_schedule("end", "k", **kwargs)
    with freeze_time("9999-12-31T23:31:00"):
        got = coord.tick_schedules()
        assert got["unreadable"] == [], got
        (s,) = got["schedules"]
        assert s["fired"] >= 1 and len(s["jobs"]) == s["fired"], got
        assert s["next_fire_at"] is None and s["calendar_ended"] is True, s
        (row,) = coord.schedules()["schedules"]
        assert row["paused"] is True and row["next_fire_at"] is None, row
        # Nothing more is due: the next tick handles nothing.
        again = coord.tick_schedules()
        assert (again["schedules"], again["unreadable"]) == ([], []), again
        before = dump(coord)
        with pytest.raises(InvalidInput) as e:
            coord.resume_schedule("end")
        assert "9999" in e.value.message, e.value.message
        assert dump(coord) == before


def test_schedule_tick_says_a_schedule_paused_at_the_calendars_end_exit_0(
        target: Any) -> None:
    from freezegun import freeze_time

    from tests.conftest import run_cli

    with freeze_time("9999-12-31T23:05:00"):
        assert run_cli(target, "schedule", "add", "end", "--every", "30m", "k").code == 0
    with freeze_time("9999-12-31T23:31:00"):
        got = run_cli(target, "schedule", "tick")
    assert got.code == 0, got
    assert "fired 1" in got.out and "schedule end: paused" in got.out, got


@pytest.mark.parametrize(("added", "ticked", "kwargs"), [
    # A late tick whose latest slot's window leaves the calendar (18:00 + 6 h).
    ("9999-12-31T12:30:00", "9999-12-31T18:00:30", {"every": "1h", "window": "6h"}),
    # A zone ahead of UTC, whose own calendar ends at 10:00 UTC: ticked after that.
    ("9999-12-31T07:30:00", "9999-12-31T12:00:30",
     {"cron": "0 * * * *", "tz": "Pacific/Kiritimati"}),
    ("9999-12-31T07:30:00", "9999-12-31T12:00:30", {"cron": "0 * * * *", "tz": "Etc/GMT-14"}),
], ids=["late-window", "kiritimati", "gmt-14"])
def test_a_late_tick_at_the_calendars_end_fires_what_fits_then_pauses(
        coord: Coordinator, added: str, ticked: str, kwargs: dict[str, Any]) -> None:
    """Ticked late at the calendar's end, a slot whose window leaves it, or a zone whose
    own calendar has ended (local time in the year 10000), made the tick call the row
    jobcoord wrote itself damaged ("written outside jobcoord", exit 7) on every tick for
    good: nothing fired, nothing paused. The slots that fit are handled as catch-up says,
    and the schedule pauses, its calendar ended."""
    from freezegun import freeze_time

    with freeze_time(added):
        coord.add_schedule("end", "k", **kwargs)
    with freeze_time(ticked):
        got = coord.tick_schedules()
        assert got["unreadable"] == [], got
        (s,) = got["schedules"]
        assert s["next_fire_at"] is None and s["calendar_ended"] is True, s
        (row,) = coord.schedules()["schedules"]
        assert row["paused"] is True, row
        again = coord.tick_schedules()
        assert (again["schedules"], again["unreadable"]) == ([], []), again
        assert check(coord.db)["ok"], check(coord.db)


@pytest.mark.parametrize("kwargs", [{"cron": "0 * * * *"},
                                    {"cron": "0 * * * *", "tz": "Pacific/Kiritimati"}])
def test_check_finds_nothing_in_a_schedule_whose_calendar_ended(
        coord: Coordinator, kwargs: dict[str, Any]) -> None:
    """A cron with no slot left before the year 10000 was `schedule_unreadable` to check
    (exit 7), the state the tick is documented to leave; its verdict hung on the clock."""
    from freezegun import freeze_time

    with freeze_time("9999-12-31T07:30:00"):
        coord.add_schedule("end", "k", **kwargs)
    with freeze_time("9999-12-31T09:00:30"):
        coord.tick_schedules()
    with freeze_time("9999-12-31T23:00:30"):
        coord.tick_schedules()
        (row,) = coord.schedules()["schedules"]
        assert row["paused"] is True, row
        got = check(coord.db)
        assert got["ok"], got
