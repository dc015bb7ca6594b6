"""Running the API: uvicorn on 127.0.0.1 by default, TLS or an explicit --insecure-http
for any other address, no access log (a URL or header must never put a token in a log)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

from .. import faults
from ..errors import InvalidInput
from ..runtime import stop_on_hangup
from .state import DEFAULT_UPLOAD_IDLE_S


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tls_cert: str | None, tls_key: str | None,
               insecure_http: bool) -> str | None:
    """Refuse an unsafe binding (InvalidInput); return a warning to print, if any."""
    if (tls_cert is None) != (tls_key is None):
        raise InvalidInput("invalid_input", "give both --tls-cert and --tls-key, or neither")
    if tls_cert is not None and insecure_http:
        raise InvalidInput("invalid_input", "--insecure-http contradicts --tls-cert/--tls-key")
    if is_loopback(host) or tls_cert is not None:
        return None
    if not insecure_http:
        raise InvalidInput("invalid_input", f"binding {host} (not loopback) sends tokens over "
                           "the network: give --tls-cert and --tls-key, or --insecure-http "
                           "on a network you trust")
    return (f"serving plain HTTP on {host}: tokens and jobs cross the network unencrypted "
            "(--insecure-http)")


def check_tls_files(tls_cert: str, tls_key: str) -> None:
    """`--tls-cert` and `--tls-key` are PEM files (small_files.read_pem) that load together,
    checked before the server opens anything; InvalidInput naming the file otherwise. An
    encrypted key is refused, not asked a pass phrase for on the terminal."""
    import ssl

    from ..small_files import read_pem

    read_pem(tls_cert, "--tls-cert")
    read_pem(tls_key, "--tls-key", key=True)

    def no_pass_phrase() -> str:
        raise InvalidInput("invalid_input", f"--tls-key {tls_key}: encrypted; serve takes "
                           "an unencrypted key")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls_cert, tls_key,
                                                                no_pass_phrase)
    except ssl.SSLError as e:
        raise InvalidInput("invalid_input", f"--tls-cert {tls_cert} with --tls-key "
                           f"{tls_key}: they do not load as a certificate and its key "
                           f"({e.reason or e})") from None


def printer(as_json: bool) -> Callable[[dict[str, Any]], None]:
    """One line per event on stdout: JSON Lines with --json, text otherwise."""
    from ..cli.output import say

    def emit(event: dict[str, Any]) -> None:
        if as_json:
            line = json.dumps(event, ensure_ascii=False)
        else:
            rest = ", ".join(f"{k}={val}" for k, val in event.items()
                             if k not in ("event", "jobs"))
            line = f"{event['event']}: {rest}" if rest else event["event"]
        say(line)  # dropped when its reader is gone: the server goes on
    return emit


def _protocol(head_s: float = DEFAULT_UPLOAD_IDLE_S) -> type:
    """uvicorn's HTTP protocol (httptools), answering a request its parser refuses (a
    control character in a header, a request line that is no HTTP) in the JSON error shape
    every other error has, not uvicorn's plain text; and bounding what uvicorn left
    unbounded (its keep-alive timeout covers only the time between requests):

    - a request's line and headers have `head_s` (`--upload-idle`) from the connection's
      start, or from the request's first byte on a kept-alive connection, counted however
      the bytes trickle in: then a request begun is answered 408 `request_timeout` and the
      connection closed; one that sent nothing at all is closed without an answer (an
      answer there could be read by a client as the answer to a request it is just
      sending). Unfinished requests held their connections forever, and enough of them
      took every descriptor the process may open;
    - a request answered before its body ended (refused before the body was read, a route
      that reads none) has `head_s` in all for the rest of its body, then its connection is
      closed: it waited for the rest of a body nobody reads, a byte now and then enough to
      hold it.

    A JSON body that stops sending is bounded above the protocol (limits.BodyLimit), an
    upload's by its route."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from .limits import error_bytes
    from .routes_artifacts import DOWNLOAD_IDLE_FACTOR

    #: A reader that takes nothing of an answer for this long is cut, as a download's is.
    stall_s = DOWNLOAD_IDLE_FACTOR * head_s

    def raw(status: bytes, err: InvalidInput) -> bytes:
        body = error_bytes(err)
        return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close"
                b"\r\n\r\n" + body)

    answer = raw(b"400 Bad Request", InvalidInput(
        "invalid_input", "malformed HTTP request: its request line or a header could not "
        "be parsed"))
    too_slow = raw(b"408 Request Timeout", InvalidInput(
        "request_timeout", f"the request line and headers did not arrive within {head_s:g} "
        "s; nothing was done"))

    class Protocol(HttpToolsProtocol):  # type: ignore[misc]
        head_timer: asyncio.TimerHandle | None = None
        #: A byte of the request now being read has arrived (its headers have not ended).
        begun = False
        #: Closes the connection when the rest of an answered request's body is late.
        body_timer: asyncio.TimerHandle | None = None
        #: Aborts the connection when its reader takes nothing of an answer for too long.
        write_timer: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            # The answer's bytes wait in memory for a reader that takes none (the socket's
            # buffer full): one that never reads held its connection, and its answer, for
            # good (a 6 MB job, 40 readers: +330 MB); a download cut for its idle reader
            # too, as `close` waits for the buffered bytes to go.
            super().pause_writing()
            if self.write_timer is None:
                self.write_timer = self.loop.call_later(stall_s, self.reader_stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.write_timer is not None:
                self.write_timer.cancel()
                self.write_timer = None

        def reader_stalled(self) -> None:
            self.write_timer = None
            self.transport.abort()  # the bytes buffered are dropped with the connection

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.head_timer = self.loop.call_later(head_s, self.head_late)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            # A request begun is no idle connection (the keep-alive timer may have been
            # started in this same read, by the previous request's late body).
            self._unset_keepalive_if_required()
            self.begun = True
            if self.head_timer is None:  # the first request's bound runs from the connect
                self.head_timer = self.loop.call_later(head_s, self.head_late)

        def on_headers_complete(self) -> None:
            self.stop_head_timer()
            self.begun = False
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self.stop_head_timer()
            if self.write_timer is not None:
                self.write_timer.cancel()
                self.write_timer = None
            if self.body_timer is not None:
                self.body_timer.cancel()
                self.body_timer = None
            super().connection_lost(exc)

        def stop_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def head_late(self) -> None:
            self.head_timer = None
            if self.transport.is_closing():
                return
            if self.begun:
                self.transport.write(too_slow)
            self.transport.close()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if cycle is not None and cycle.more_body and not self.transport.is_closing():
                # Answered before its body ended: the rest may still be on its way (a
                # client sends its headers and body apart; closed at once, its body met a
                # reset and so did its answer), and has `head_s` in all to arrive.
                self.body_timer = self.loop.call_later(head_s, self.transport.close)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if self.body_timer is not None:
                self.body_timer.cancel()
                self.body_timer = None
                # Its late bytes stopped the keep-alive timer (any data does): start it
                # again, or the connection idled on unbounded.
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(answer)
            self.transport.close()

    return Protocol


#: How long a request waits for a locked database: each try at most REQUEST_BUSY_TRY_S (the
#: --busy-timeout, when shorter), none begun later than REQUEST_BUSY_BUDGET_S after the
#: request asked for a thread (Server._in_pool); then the answer is 503 `database_locked`
#: (`server_busy` when the whole budget went waiting for a thread). In all well below a remote
#: client's own timeout (10 s), so the client hears why (and a --burst worker exits 5, as a
#: local one) instead of timing out, and a request its client gave up on frees its thread.
REQUEST_BUSY_TRY_S = 1.5
REQUEST_BUSY_BUDGET_S = 3.0


def open_for_requests(settings: Any) -> Any:
    """The CLI settings' Coordinator, opened with the server's bounds on a locked database:
    each try's wait (the busy timeout, taken when the database opens) and the budget."""
    settings.busy_timeout = min(settings.busy_timeout, REQUEST_BUSY_TRY_S)
    coordinator = settings.coordinator()
    coordinator.db.busy_budget = REQUEST_BUSY_BUDGET_S
    return coordinator


#: uvicorn's grace for the requests in flight when the server stops (seconds).
STOP_GRACE_S = 5
#: Of which completions' artifact checks get this much: a validator stopped then has its
#: own grace (SIGTERM, then SIGKILL 2 s later) before uvicorn's runs out.
CHECKS_GRACE_S = 2.0


def run_server(coordinator: Any, *, host: str, port: int, tls_cert: str | None,
               tls_key: str | None, insecure_http: bool, reap_every: float, poll_s: float,
               threads: int, as_json: bool, max_artifact_bytes: int = 1 << 30,
               upload_idle_s: float = DEFAULT_UPLOAD_IDLE_S,
               at_stop: Callable[[], None] | None = None) -> None:
    """Serve until stopped. `at_stop` (the program's: signals from then on change nothing)
    is called once the server has stopped, in place of putting back the signal handlers
    that were there before: put back, a second SIGTERM as the process ended killed it."""
    import uvicorn

    from .app import create_app

    warning = check_bind(host, tls_cert, tls_key, insecure_http)
    if warning:
        print(f"jobcoord: warning: {warning}", file=sys.stderr, flush=True)
    emit = printer(as_json)
    from .routes_artifacts import sweep_download_copies

    swept = sweep_download_copies()  # said after `listening`, the first line scripts read
    app = create_app(coordinator, pool_size=threads, poll_s=poll_s, reap_every=reap_every,
                     emit=emit, max_artifact_bytes=max_artifact_bytes,
                     upload_idle_s=upload_idle_s)
    scheme = "https" if tls_cert else "http"

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # Long-polls and stalled uploads answer now, before uvicorn waits out its grace
            # for them (and then cancels them: a plain-text 500 and a traceback each).
            app.state.server.stop_waits()
            # Completions checking artifacts (a validator may take minutes) get part of the
            # grace, then end undecided (503, sent again): the process outlived its
            # `stopped` until every one had run, and uvicorn cancelled them with tracebacks.
            asyncio.get_running_loop().call_later(CHECKS_GRACE_S, coordinator.stop_checks)
            await super().shutdown(sockets)
            if self.force_exit:
                # A second Ctrl-C: uvicorn stops waiting for the requests in flight and skips
                # the app's end too, and the loop then cancelled it with a traceback. That
                # end only stops the app's own tasks and threads: it runs.
                await self.lifespan.shutdown()

        async def serve(self, sockets: Any = None) -> None:
            try:
                await super().serve(sockets)
            finally:
                await faults.loop_point("http.served")  # stopped, the loop not yet ended

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname()
                # An IPv6 address is written in brackets in a URL.
                shown = f"[{host}]" if ":" in host else host
                emit({"event": "listening", "url": f"{scheme}://{shown}:{bound[1]}",
                      "port": bound[1], "reap_every_s": reap_every,
                      "dialect": coordinator.db.dialect})
                if swept:
                    emit({"event": "swept_orphans", "removed": swept})

    config = uvicorn.Config(
        app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
        http=_protocol(upload_idle_s),
        log_level="warning", access_log=False, server_header=False, proxy_headers=False,
        lifespan="on", timeout_graceful_shutdown=STOP_GRACE_S, timeout_keep_alive=30)
    server = _Server(config)
    app.state.server.on_fatal = lambda: setattr(server, "should_exit", True)
    # uvicorn handles SIGINT/SIGTERM itself (a graceful stop), then raises the signal again
    # under the handler that was there before. SIGTERM (a service manager's stop) then only
    # asks the server to stop, so the stop is said (`stopped`) and the process exits 0
    # instead of dying of the signal. No handler here raises: the loop runs on a while
    # after uvicorn put them back, and one raising there (a SIGTERM repeated) raised inside
    # a loop callback, a traceback after a clean stop.
    previous = signal.signal(signal.SIGTERM,
                             lambda _signum, _frame: setattr(server, "should_exit", True))
    # SIGHUP (its terminal closed) is a stop as uvicorn's own for SIGTERM: graceful, exit 0.
    hangup = stop_on_hangup(lambda _signum, _frame: setattr(server, "should_exit", True))
    interrupted = False

    def _ctrl_c(_signum: int, _frame: Any) -> None:
        # What uvicorn hands its captured Ctrl-C back to as it ends: noted, never raised.
        # The CLI's own handler held a Ctrl-C that came after a commit (a reap pass, any
        # request's write), so the stop was exit 0; and a KeyboardInterrupt raised while the
        # loop was still ending printed a traceback.
        nonlocal interrupted
        interrupted = True
        server.should_exit = True

    ctrl_c = signal.signal(signal.SIGINT, _ctrl_c)
    try:
        server.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if at_stop is not None:
            at_stop()
        else:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGHUP, hangup)
            signal.signal(signal.SIGINT, ctrl_c)
        emit({"event": "stopped"})
    if app.state.server.fatal is not None:
        raise app.state.server.fatal
    if interrupted:
        # Ctrl-C is serve's way to stop from a terminal: `stopped` said it, exit 130, and no
        # `interrupted` error after it (the JSON Lines end with `stopped`).
        sys.exit(130)
    if not server.started:
        raise InvalidInput("bind_failed", f"could not listen on {host}:{port} (in use, or "
                           "not an address of this machine)")
