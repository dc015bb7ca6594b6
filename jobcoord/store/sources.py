"""The small pieces a Database is assembled from: a statement's `Result`, where its
connections come from (`ConnectionSource`), and how an idle worker waits (`ChangeWaiter`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import Connection

from ..errors import JobcoordError


class Result:
    """What `run` returns, whichever way the statement ran: the DB-API cursor's answers
    (fetchone, fetchall, rowcount, iteration) and the few of SQLAlchemy's the callers read
    (all, first, one, scalar, scalar_one). Rows are sequences: tuples, or SQLAlchemy's rows
    when the statement went its way."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    def all(self) -> list[Any]:
        return self._cursor.fetchall()  # type: ignore[no-any-return]

    def first(self) -> Any:
        return self._cursor.fetchone()

    def scalar(self) -> Any:
        row = self._cursor.fetchone()
        return None if row is None else row[0]

    def one(self) -> Any:
        rows = self._cursor.fetchall()
        if len(rows) != 1:
            raise JobcoordError("internal_error", f"expected one row, got {len(rows)}")
        return rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]


class ChangeWaiter:
    """Waits for a hint that the jobs may have changed. This base one has no hint: it
    sleeps the whole timeout (the poll)."""

    #: "poll", or how the hint arrives ("data_version", "listen").
    mode = "poll"

    def wait(self, timeout: float, interrupt: threading.Event) -> bool:
        """Wait up to `timeout` seconds; True when woken early (a hint, or `interrupt`
        set), False when the timeout passed."""
        return interrupt.wait(timeout)

    def close(self) -> None:
        pass


class ConnectionSource:
    """Where a transaction takes its connection from and gives it back to."""

    def take(self) -> Connection:
        raise NotImplementedError

    def give(self, conn: Connection, healthy: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
