"""The server keeps a live token's identity (a token's identity never changes; it is only
revoked) and judges whether the token is still live on every call: inside each write
transaction the call begins, first thing, and with a read of its own when the call began
none. These drive `Server.as_caller` on a thread of the test, against a real database; the
same rules over real HTTP are in test_serve_access.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from jobcoord import tokens
from jobcoord.db import Target
from jobcoord.errors import InvalidInput, Unauthorized
from jobcoord.http.deps import Caller
from jobcoord.http.state import Server
from jobcoord.service import Coordinator

WORKERS = ("worker",)
READINGS = {"memory_used_pct": 10.0}


@pytest.fixture
def server(target: Target) -> Iterator[tuple[Server, Coordinator, str]]:
    c = Coordinator.open(target)
    secret = tokens.create(c.db, "w1", "worker", worker="w1")["token"]
    srv = Server(c, pool_size=2, poll_s=1.0, reap_every=0, emit=None)
    try:
        yield srv, c, secret
    finally:
        srv.pool.shutdown()
        srv.transfers.shutdown()
        c.close()


def _known(srv: Server, c: Coordinator, secret: str) -> Caller:
    """The caller, its identity kept by the server (it has called once), then revoked."""
    caller = Caller(secret, WORKERS)
    assert srv.as_caller(caller, lambda who: who.worker_id) == "w1"
    tokens.revoke(c.db, "w1")
    return caller


def test_a_revoked_kept_token_is_refused_after_a_call_that_wrote_nothing(
        server: tuple[Server, Coordinator, str]) -> None:
    srv, c, secret = server
    job = c.enqueue("k", {})["job_id"]
    caller = _known(srv, c, secret)
    with pytest.raises(Unauthorized):
        srv.as_caller(caller, lambda who: c.show(job))


def test_a_revoked_kept_token_is_refused_before_the_error_of_a_call_that_wrote_nothing(
        server: tuple[Server, Coordinator, str]) -> None:
    """401 comes before what is wrong with the call, as when the token is read first."""
    srv, c, secret = server
    caller = _known(srv, c, secret)

    def bad(who: Any) -> None:
        raise InvalidInput("invalid_input", "wrong")

    with pytest.raises(Unauthorized):
        srv.as_caller(caller, bad)


def test_a_call_that_swallows_its_refused_write_is_still_refused_and_wrote_nothing(
        server: tuple[Server, Coordinator, str]) -> None:
    """Whatever the call makes of its write's refusal, its answer is 401."""
    srv, c, secret = server
    caller = _known(srv, c, secret)

    def stubborn(who: Any) -> str:
        with contextlib.suppress(Exception):
            c.heartbeat(who.worker_id, readings=READINGS)
        return "answered"

    with pytest.raises(Unauthorized):
        srv.as_caller(caller, stubborn)
    assert c.workers()["workers"] == []


def test_a_kept_token_still_live_writes_as_its_identity(
        server: tuple[Server, Coordinator, str]) -> None:
    srv, c, secret = server
    caller = Caller(secret, WORKERS)
    for _ in range(2):  # read, then kept
        srv.as_caller(caller, lambda who: c.heartbeat(who.worker_id, readings=READINGS))
    assert [w["worker_id"] for w in c.workers()["workers"]] == ["w1"]
