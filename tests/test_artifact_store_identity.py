"""What names a database to its artifact store: the same from every process and every
spelling of its URL, and never a name made up from a passing failure."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from jobcoord.artifacts.settings import database_identity
from jobcoord.db import Target, resolve_target
from jobcoord.errors import StorageUnavailable
from jobcoord.service import Coordinator


class Forwarder:
    """A TCP relay on 127.0.0.1 to the database server that can be cut and set up again on
    the same port: the server unreachable for a while, as across a network blip."""

    def __init__(self, host: str, port: int) -> None:
        self.to = (host, port)
        self.port = 0
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Stop listening and cut every connection relayed so far."""
        assert self.listener is not None
        with contextlib.suppress(OSError):  # wakes the accept blocked on it (Linux)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.listener = None
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._socks.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.to)
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def relayed(target: Target) -> Iterator[tuple[Forwarder, Target]]:
    if target.sqlite_path:
        pytest.skip("a PostgreSQL server's name for the database")
    url = make_url(target.url)
    relay = Forwarder(url.host or "127.0.0.1", url.port or 5432)
    try:
        yield relay, resolve_target(url=url.set(host="127.0.0.1", port=relay.port)
                                    .render_as_string(hide_password=False))
    finally:
        if relay.listener is not None:
            relay.down()


def test_a_postgresql_database_is_named_by_its_server_however_its_url_spells_it(
        target: Target, relayed: tuple[Forwarder, Target]) -> None:
    _relay, through = relayed
    with Coordinator.open(target) as direct, Coordinator.open(through) as relayed_coord:
        name = database_identity(direct.db)
        assert name.startswith("postgresql:") and not name.startswith("postgresql://")
        assert database_identity(relayed_coord.db) == name


def test_a_server_unreachable_when_the_database_is_first_named_is_unavailable_not_a_new_name(
        target: Target, relayed: tuple[Forwarder, Target]) -> None:
    """The first look at the server's name for the database failing for a passing reason
    (the server unreachable, busy) was taken for a role that may not read it: the URL's
    host, port and name stood in, kept for the process's life. A long-running server then
    recorded itself in its store under a second name, and gc there was refused as shared
    until it restarted. A passing failure is the database unavailable (exit 6), and the
    next look, once the server is back, names it as every other process does."""
    relay, through = relayed
    with Coordinator.open(target) as direct:
        name = database_identity(direct.db)
    with Coordinator.open(through) as c:
        c.status()  # connected through the relay
        relay.down()
        with pytest.raises(StorageUnavailable):
            database_identity(c.db)
        relay.up()
        assert database_identity(c.db) == name


def test_a_role_the_server_does_not_let_read_its_identifier_is_named_by_its_url(
        target: Target) -> None:
    """A server that keeps `pg_control_system()` from the role (permission denied, SQLSTATE
    42501): the database is named by its URL's host, port and name, every time, rather than
    every artifact command failing."""
    if target.sqlite_path:
        pytest.skip("a PostgreSQL server's name for the database")
    from jobcoord.store import Database
    from tests.conftest import _pg_admin

    url = make_url(target.url)
    role = f"jc_noctl_{url.database}"[:63]
    with _pg_admin() as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        import psycopg

        # Function rights are the database's own: revoked in this test's database only.
        with psycopg.connect(url.set(drivername="postgresql").render_as_string(
                hide_password=False), autocommit=True) as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
        limited = resolve_target(url=url.set(username=role, password=None)
                                 .render_as_string(hide_password=False))
        db = Database.open(limited)
        try:
            expected = f"postgresql://{url.host}:{url.port or 5432}/{url.database}"
            assert database_identity(db) == expected
            del db._artifact_store_identity  # type: ignore[attr-defined]
            assert database_identity(db) == expected
        finally:
            db.close()
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')
