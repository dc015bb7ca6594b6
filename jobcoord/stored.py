"""The typed read boundary: values read back from the database judged against the model.

SQLite keeps whatever was written into a column (text in a time, bytes in a priority) when
a row is changed by hand or a restore goes wrong, and times can be written past the
calendar. Every read that renders or compares a row's values passes it through `row` first,
so such a row is exit 7 (HTTP 503) naming the row and the column and pointing at
`jobcoord check`, which names every one (`value_of_wrong_type`, `time_out_of_range`), never
an internal error from a comparison deep inside a command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Boolean, CheckConstraint, Float, Integer, String, Table

from .errors import DatabaseCorrupt

#: The calendar's range, in microseconds since the epoch: 0001-01-01 to 9999-12-31 UTC.
#: jobcoord writes times near now (a delay is at most ten years); a time outside this range
#: was written outside jobcoord and cannot be rendered.
MIN_TIME_US = -62_135_596_800 * 1_000_000
MAX_TIME_US = 253_402_300_799_999_999

#: The Python types a column's values may have, by the model's column type (SQLite hands a
#: boolean back as 0 or 1, PostgreSQL as a bool; a float column may hold a whole number).
_ACCEPTED: tuple[tuple[type, tuple[type, ...]], ...] = (
    (Boolean, (int, bool)),
    (Integer, (int,)),  # BigInteger is an Integer
    (Float, (float, int)),
    (String, (str,)),  # Text is a String
)

_KINDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {}
_CHOICES: dict[str, dict[str, tuple[str, frozenset[str]]]] = {}
#: A CHECK constraint naming the values a column may hold: `status IN ('a','b')`.
_IN_LIST = re.compile(r"\s*(\w+) IN \(((?:'[^']*',?\s*)+)\)\s*")


def is_time(column: str) -> bool:
    """Whether a column holds a time (microseconds since the epoch): by the schema's naming,
    `*_at` and `run_after`."""
    return column.endswith("_at") or column == "run_after"


def kinds(table: Table) -> dict[str, tuple[tuple[type, ...], bool]]:
    """For each column of `table`: the accepted Python types and whether it holds a time."""
    found = _KINDS.get(table.name)
    if found is None:
        found = {}
        for col in table.columns:
            for declared, accepted in _ACCEPTED:
                if isinstance(col.type, declared):
                    found[col.name] = (accepted, is_time(col.name)
                                       and isinstance(col.type, Integer))
                    break
        _KINDS[table.name] = found
    return found


def choices(table: Table) -> dict[str, tuple[str, frozenset[str]]]:
    """For each column of `table` a CHECK constraint limits to a list of values: the
    constraint's name and the values (read from the model's constraints, the one place
    they are written)."""
    found = _CHOICES.get(table.name)
    if found is None:
        found = {}
        for ck in table.constraints:
            if isinstance(ck, CheckConstraint):
                m = _IN_LIST.fullmatch(str(ck.sqltext))
                if m:
                    found[m[1]] = (str(ck.name), frozenset(re.findall(r"'([^']*)'", m[2])))
        _CHOICES[table.name] = found
    return found


def row(table: Table, values: Mapping[str, Any] | Iterable[tuple[str, Any]], what: str
        ) -> None:
    """Raise DatabaseCorrupt when a value read from `table` is not of its column's declared
    type (`value_of_wrong_type`) or is a time past the calendar (`time_out_of_range`).
    `what` names the row for the message ("job 7", "schedule nightly")."""
    known, listed = kinds(table), choices(table)
    items = values.items() if isinstance(values, Mapping) else values
    for name, value in items:
        if value is None:
            continue
        if name in listed and value not in listed[name][1]:
            raise DatabaseCorrupt(
                "row_breaks_check", f"{what}: its stored {name} {str(value)[:40]!r} is none "
                f"of the values its CHECK constraint {listed[name][0]} allows (written "
                "outside jobcoord); `jobcoord check` names every such row",
                table=table.name, column=name)
        kind = known.get(name)
        if kind is None:
            continue
        accepted, time = kind
        if not isinstance(value, accepted):
            raise DatabaseCorrupt(
                "value_of_wrong_type", f"{what}: its stored {name} is "
                f"{type(value).__name__} {str(value)[:40]!r}, not what the column holds "
                "(written outside jobcoord); `jobcoord check` names every such column",
                table=table.name, column=name)
        if time and not MIN_TIME_US <= value <= MAX_TIME_US:
            raise out_of_range(value, f"{what}: its stored {name}", table.name, name)


def out_of_range(value: int, what: str, table: str | None = None,
                 column: str | None = None) -> DatabaseCorrupt:
    where = {} if table is None else {"table": table, "column": column}
    return DatabaseCorrupt(
        "time_out_of_range", f"{what} is {value}, past the calendar's range (written "
        "outside jobcoord); `jobcoord check` names every such column", **where)


def count_row(counted: Any) -> Any:
    """A JOB_COUNTS row (tenant, status, kind, attempts, n) judged against job_counts:
    `metrics` and the dashboard both render and sum these. Returns the row."""
    from . import schema
    from .store.report_statements import JOB_COUNT_KEY

    row(schema.job_counts, zip(JOB_COUNT_KEY, counted, strict=False), "job_counts")
    return counted


def oldest_row(kind: Any, created: Any) -> None:
    """An OLDEST_WAITING row's kind and creation time judged against jobs (`metrics` and
    the dashboard both render them)."""
    from . import schema

    row(schema.jobs, (("kind", kind), ("created_at", created)),
        f"a waiting job of kind {kind!r}")
