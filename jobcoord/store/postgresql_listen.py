"""How an idle worker on PostgreSQL waits for a hint that jobs became claimable: LISTEN on a
connection of its own, falling back to the poll."""

from __future__ import annotations

import contextlib
import select as io_select
import threading
import time
from typing import Any

from .postgresql_statements import JOBS_CHANNEL
from .sources import ChangeWaiter

#: Longest an idle worker's LISTEN wait goes without looking at its interrupt.
LISTEN_SLICE_S = 0.1
#: After the listening connection failed, poll this long before trying LISTEN again.
LISTEN_RETRY_S = 30.0


class ListenWaiter(ChangeWaiter):
    """Wakes on NOTIFY jobcoord_jobs, sent by every transaction that makes a job
    claimable, on a connection of its own. Where LISTEN is unavailable (a pooler in
    transaction mode, a dropped connection) it falls back to the poll and tries again later."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Any = None
        self._retry_at = 0.0
        self.mode = "poll"
        self._connect()

    def _connect(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        self._retry_at = time.monotonic() + LISTEN_RETRY_S
        conninfo = make_url(self._url).set(drivername="postgresql").render_as_string(
            hide_password=False)
        try:
            conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5,
                                   application_name="jobcoord-listen")
            conn.execute(f"LISTEN {JOBS_CHANNEL}")
        except psycopg.Error:
            return
        self._conn, self.mode = conn, "listen"

    def wait(self, timeout: float, interrupt: threading.Event) -> bool:
        import psycopg

        if self._conn is None and time.monotonic() >= self._retry_at:
            self._connect()
        if self._conn is None:
            return interrupt.wait(timeout)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                # Blocks in select() on the connection's socket (no CPU while idle); the
                # driver reads the notification only once something arrived.
                ready, _, _ = io_select.select([self._conn.fileno()], [], [],
                                            min(LISTEN_SLICE_S, left))
                if ready:
                    for _ in self._conn.notifies(timeout=0.05, stop_after=1):
                        return True
            except (psycopg.Error, OSError, ValueError):
                self.close()
                return interrupt.wait(max(0.0, end - time.monotonic()))
            if interrupt.is_set():
                return True

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn, self.mode = None, "poll"
