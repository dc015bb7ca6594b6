"""Helpers for the `jobcoord serve` tests: a real server process on 127.0.0.1, real HTTP.

`Served` starts `jobcoord serve --port 0 --json`, reads its `listening` line for the URL, and
stops it (SIGTERM, then SIGKILL) when the block ends. Tokens are created through the same
function `jobcoord token create` calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from jobcoord.db import Target


def jobcoord_argv() -> list[str]:
    """The `jobcoord` command with `serve`, `token` and the remote `worker` in it."""
    from jobcoord.cli import cli

    if "serve" in cli.commands:
        return [sys.executable, "-m", "jobcoord"]
    return [sys.executable, "-m", "jobcoord.http"]


def db_args(target: Target) -> list[str]:
    return ["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url]


def token(target: Target, name: str, role: str, tenant: str | None = None,
          worker: str | None = None) -> str:
    from jobcoord import tokens
    from jobcoord.service import Coordinator

    with Coordinator.open(target) as c:
        return str(tokens.create(c.db, name, role, tenant=tenant, worker=worker)["token"])


def token_file(directory: str | os.PathLike[str], name: str, secret: str) -> str:
    """A token's secret written to `directory`/`name`, readable by its owner only, as a
    worker's `--token-file` reads it: the file's path."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)
    return path


def tokens_for(target: Target, specs: list[tuple[str, str, str | None, str | None]]
               ) -> list[str]:
    """Many tokens through one connection: (name, role, tenant, worker) each."""
    from jobcoord import tokens
    from jobcoord.service import Coordinator

    with Coordinator.open(target) as c:
        return [str(tokens.create(c.db, name, role, tenant=tenant, worker=worker)["token"])
                for name, role, tenant, worker in specs]


class Served:
    def __init__(self, target: Target, *extra: str, env: dict[str, str] | None = None,
                 port: int = 0):
        self.target = target
        self.extra = list(extra)
        self.env = env
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.events: list[dict[str, Any]] = []

    def start(self, timeout: float = 30.0) -> Served:
        argv = [*jobcoord_argv(), *db_args(self.target), "serve", "--port", str(self.port),
                "--json", *self.extra]
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env)
        line = self._line(timeout)
        event = json.loads(line)
        assert event["event"] == "listening", event
        self.url = event["url"]
        self.port = event["port"]
        return self

    def _line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        buf = b""
        while b"\n" not in buf:
            left = end - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and not sel.select(0)):
                err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                raise AssertionError(f"serve did not start: {buf!r} {err}")
            if sel.select(min(left, 0.5)):
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    continue
                buf += chunk
        return buf.decode()

    def client(self, secret: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, **kw)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return int(self.proc.returncode)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@contextlib.contextmanager
def served(target: Target, *extra: str, env: dict[str, str] | None = None
           ) -> Iterator[Served]:
    s = Served(target, *extra, env=env)
    try:
        yield s.start()
    finally:
        s.stop()


def wait_for(predicate: Any, timeout: float = 20.0, every: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(every)


def terminated(proc: subprocess.Popen[bytes], timeout: float = 60
               ) -> tuple[bytes, bytes, float]:
    """Send `proc` SIGTERM and wait for it to exit: its output, and how long it took (killed
    if it outlives `timeout`, or if waiting for it fails)."""
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=timeout)
        return out, err, time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()


def as_connection_opens(conns: Any, action: Any) -> None:
    """Make `action` run whenever a connection of this client's cuttable pool (the remote
    client's `_poll_conns`, `_checked_conns`) starts opening: after its call looked at
    whether it was stopped, before its socket is known."""
    traced = conns.trace

    def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.started":
            action()
        traced(event, info)

    conns.trace = trace


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of the server that forwards every request and, for
    `drops` of the requests whose line names `needle` (every `every`th one), reads the
    server's answer and closes the client's connection instead of passing it on: the answer
    is lost after the server has committed, as on a network cut."""

    def __init__(self, upstream_port: int, needle: bytes, drops: int = 1, every: int = 1):
        import socket

        self.upstream_port = upstream_port
        self.needle = needle
        self.drops = drops
        self.every = every
        self.seen = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            state = {"drop": False}
            threading.Thread(target=self._up, args=(client, upstream, state),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, state),
                             daemon=True).start()

    def _up(self, client: Any, upstream: Any, state: dict[str, bool]) -> None:
        try:
            while chunk := client.recv(65536):
                if chunk.startswith((b"POST ", b"GET ", b"PUT ")):
                    line = chunk.split(b"\r\n", 1)[0]
                    with self.lock:
                        hit = self.needle in line
                        self.seen += hit
                        state["drop"] = (hit and self.seen % self.every == 0
                                         and self.dropped < self.drops)
                        self.dropped += state["drop"]
                upstream.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                upstream.shutdown(2)

    def _down(self, upstream: Any, client: Any, state: dict[str, bool]) -> None:
        try:
            while chunk := upstream.recv(65536):
                if state["drop"]:
                    break  # the answer came: lose it
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(2)
                sock.close()

    def close(self) -> None:
        self.listener.close()
