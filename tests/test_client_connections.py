"""How the remote coordinator talks to its server: straight to the address it was given,
over its own kept-alive connections, with the token on every request."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from jobcoord.db import Target
from jobcoord.errors import InvalidInput
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.conftest import environment
from tests.serve_procs import served, token
from tests.timeline import IDLE_ON_AC


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_remote_coordinator_reaches_its_server_directly_whatever_proxy_the_environment_names(
        sqlite_target: Target) -> None:
    """A proxy named in the environment is not used: the coordinator is reached at the
    address given (a worker on a machine whose environment sends web traffic through a proxy
    still reaches the coordinator on its own network)."""
    secret = token(sqlite_target, "w1", "worker", worker="w1")
    with Coordinator.open(sqlite_target) as coord:
        job = coord.enqueue("k", {})["job_id"]
    dead = f"http://127.0.0.1:{_closed_port()}"
    proxies = {name: dead for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                       "http_proxy", "https_proxy", "all_proxy")}
    with served(sqlite_target, "--reap-every", "0") as s, environment(**proxies, NO_PROXY=""):
        # The environment as httpx would read it sends this server's traffic to the dead
        # proxy (so the test means something where it runs).
        with pytest.raises(httpx.ConnectError), httpx.Client(timeout=5) as plain:
            plain.get(f"{s.url}/healthz")
        with RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=0) as remote:
            remote.heartbeat("w1", readings=IDLE_ON_AC)
            got = remote.claim("w1")
            assert got["job"]["job_id"] == job
            done = remote.complete(job, "w1", got["lease"]["epoch"], {"ok": True})
            assert coord_status(sqlite_target, job) == "succeeded", done


def test_a_closed_remote_coordinator_refuses_every_call_and_sends_nothing(
        sqlite_target: Target) -> None:
    secret = token(sqlite_target, "w1", "worker", worker="w1")
    with Coordinator.open(sqlite_target) as coord:
        coord.enqueue("k", {})
    with served(sqlite_target, "--reap-every", "0") as s:
        remote = RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=0)
        remote.heartbeat("w1", readings=IDLE_ON_AC)
        remote.close()
        for call in (lambda: remote.heartbeat("w1", readings=IDLE_ON_AC),
                     lambda: remote.claim("w1")):
            with pytest.raises(InvalidInput) as e:
                call()
            assert e.value.code == "coordinator_closed", e.value
    with Coordinator.open(sqlite_target) as coord:
        assert coord.show(1)["job"]["status"] == "waiting"


def coord_status(target: Target, job: int) -> str:
    with Coordinator.open(target) as coord:
        return coord.show(job)["job"]["status"]


def test_close_from_another_thread_cuts_a_waiting_claim_and_it_is_handed_nothing(
        sqlite_target: Target) -> None:
    """A claim long-polling while another thread closed the client sat out its whole wait,
    still queued at the server: a job submitted after `close()` was handed to it (its attempt
    used, leased to nobody) and the caller got `coordinator_closed`. `close()` cuts the poll:
    the call ends at once, and the server, seeing its client gone, hands it nothing."""
    import threading
    import time

    secret = token(sqlite_target, "w1", "worker", worker="w1")
    with served(sqlite_target, "--reap-every", "0") as s:
        remote = RemoteCoordinator(s.url, secret, claim_wait=10, retry_s=0)
        remote.heartbeat("w1", readings=IDLE_ON_AC)
        out: list[Any] = []

        def poll() -> None:
            t0 = time.monotonic()
            try:
                out.append(remote.claim("w1", lease_s=300))
            except InvalidInput as e:
                out.append(e.code)
            out.append(time.monotonic() - t0)

        thread = threading.Thread(target=poll)
        thread.start()
        time.sleep(1.0)  # the poll is waiting at the server
        remote.close()
        thread.join(5)
        assert not thread.is_alive(), "the claim sat out its wait after close()"
        assert out[0] == "coordinator_closed", out
        assert out[1] < 4, out
        with Coordinator.open(sqlite_target) as coord:
            job = coord.enqueue("k", {}, max_attempts=1)["job_id"]
        time.sleep(1.0)
        assert coord_status(sqlite_target, job) == "waiting"


@pytest.mark.parametrize("char", ["\t", "\n", "\x00", "\x7f"], ids=["tab", "lf", "nul", "del"])
def test_a_server_url_with_a_control_character_is_invalid_input(char: str) -> None:
    """It passed the client's checks and failed on the first call as httpx's InvalidURL (the
    CLI's exit 1, internal error)."""
    with pytest.raises(InvalidInput) as e:
        RemoteCoordinator(f"http://127.0.0.1:9/{char}", "secret")
    assert e.value.code == "invalid_input", e.value
