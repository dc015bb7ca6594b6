"""The CLI commands of the HTTP server, as click objects the `jobcoord` group registers:
`serve`, the `token` group (create, ls, revoke), and `--server URL --token-file F` for
`worker` (a remote worker: the same runtime with a RemoteCoordinator in place of the
database)."""

from __future__ import annotations

import os
from typing import Any

import click

from ..cli.group import FiniteFloatRange
from ..cli.output import result_out, stdout_for_the_result
from ..errors import InvalidInput

#: Largest token file read (a token is 47 characters).
MAX_TOKEN_FILE = 4096

#: How long a remote worker's claim long-polls unless told (`--wait`).
DEFAULT_CLAIM_WAIT_S = 20.0


def _emit(as_json: bool, payload: dict[str, Any], text: str | None = None) -> None:
    from ..cli import emit

    emit(as_json, payload, text)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback needs TLS or --insecure-http.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0: any free port; the `listening` line says which).")
@click.option("--tls-cert", metavar="PEM", help="PEM certificate (chain), a regular file.")
@click.option("--tls-key", metavar="PEM", help="PEM private key (unencrypted), a regular file.")
@click.option("--insecure-http", is_flag=True,
              help="Allow plain HTTP on a non-loopback address (prints a warning).")
@click.option("--reap-every", default=5.0, show_default=True, type=FiniteFloatRange(0, 3600),
              help="Reap expired leases this often (0: never).")
@click.option("--poll", default=0.5, show_default=True, type=FiniteFloatRange(0.01, 1.0),
              help="How often long-polls look for jobs committed by other processes.")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 64),
              help="Database calls run on this many threads.")
@click.option("--upload-idle", default=30.0, show_default=True,
              type=FiniteFloatRange(0.1, 3600),
              help="A request's line and headers must arrive within this many seconds "
                   "(else 408 request_timeout, closed); a JSON body that sends nothing for "
                   "this long is refused (400 body_incomplete), an artifact upload too "
                   "(upload_incomplete), nothing done or stored; a download whose reader "
                   "takes nothing for four times as long is cut.")
@click.option("--max-artifact-bytes", default=1 << 30, show_default=True,
              type=click.IntRange(0, 2**62),
              help="Largest artifact upload accepted (a kind's own limit applies too).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines, one per event.")
@click.pass_obj
def serve(s: Any, host: str, port: int, tls_cert: str | None, tls_key: str | None,
          insecure_http: bool, reap_every: float, poll: float, threads: int,
          upload_idle: float, max_artifact_bytes: int, as_json: bool) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) over this database, and reap expired
    leases on a timer. Ctrl-C stops it (exit 130)."""
    from .server import check_bind, check_tls_files, open_for_requests, run_server

    check_bind(host, tls_cert, tls_key, insecure_http)  # before opening anything
    if tls_cert is not None and tls_key is not None:
        tls_cert, tls_key = os.path.expanduser(tls_cert), os.path.expanduser(tls_key)
        check_tls_files(tls_cert, tls_key)
    run_server(open_for_requests(s), host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
               insecure_http=insecure_http, reap_every=reap_every, poll_s=poll,
               threads=threads, as_json=as_json, max_artifact_bytes=max_artifact_bytes,
               upload_idle_s=upload_idle, at_stop=result_out)


@click.group()
def token() -> None:
    """API tokens for `serve`: create (the secret is shown once), ls, revoke."""


@token.command("create")
@click.argument("name")
@click.option("--role", required=True,
              type=click.Choice(["submitter", "worker", "viewer", "operator"]))
@click.option("--tenant", help="Bind the token to this tenant (operators: optional).")
@click.option("--worker", "worker_id", help="The worker id a worker token acts as.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.pass_obj
def token_create(s: Any, name: str, role: str, tenant: str | None, worker_id: str | None,
                 as_json: bool) -> None:
    """Create a token. Its secret (JSON key `token`) is printed this once; only a hash is
    stored."""
    from .. import tokens

    got = tokens.create(s.coordinator().db, name, role, tenant=tenant, worker=worker_id)
    _emit(as_json, got, got["token"])
    if not as_json:
        # On stderr: stdout redirected to a file must make a token file of that one line.
        click.echo(f"(token {name!r}, role {role}: shown only once; store it in a file "
                   "readable only by you)", err=True)


@token.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.pass_obj
def token_ls(s: Any, as_json: bool) -> None:
    """List tokens (never their secrets)."""
    from .. import tokens

    _emit(as_json, tokens.list_tokens(s.coordinator().db))


@token.command("revoke")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.pass_obj
def token_revoke(s: Any, name: str, as_json: bool) -> None:
    """Revoke a token: its next request is refused."""
    from .. import tokens

    _emit(as_json, tokens.revoke(s.coordinator().db, name))


def read_token_file(path: str) -> str:
    from ..small_files import read_small

    try:
        data, _ = read_small(os.path.expanduser(path), MAX_TOKEN_FILE)
    except OSError as e:
        raise InvalidInput("invalid_input", f"cannot read the token file {path}: "
                           f"{e.strerror}") from None
    if len(data) > MAX_TOKEN_FILE:
        raise InvalidInput("invalid_input", f"the token file {path} is too large to hold a "
                           "token")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise InvalidInput("invalid_input", f"the token file {path} does not hold a token"
                           ) from None
    if not text or any(c.isspace() for c in text):
        raise InvalidInput("invalid_input", f"the token file {path} does not hold a token")
    return text


def remote_coordinator(server: str, token_file: str, *,
                       claim_wait: float = DEFAULT_CLAIM_WAIT_S,
                       ca_file: str | None = None) -> Any:
    """`--server URL --token-file F` -> the object the worker runtime calls instead of a
    Coordinator."""
    from .client import RemoteCoordinator, server_base

    server_base(server)  # before the token file: a wrong address is said first
    secret = read_token_file(token_file)
    return RemoteCoordinator(server, secret, claim_wait=claim_wait,
                             verify=trusting(ca_file) if ca_file else True)


def trusting(ca_file: str) -> Any:
    """An SSL context trusting the CA certificates of `--ca-file`, from the bytes checked
    (small_files.read_pem): the file is read once, here."""
    import ssl

    from ..small_files import read_pem

    data = read_pem(os.path.expanduser(ca_file), "--ca-file")
    try:
        return ssl.create_default_context(cadata=data.decode("latin-1"))
    except (ssl.SSLError, ValueError) as e:
        raise InvalidInput("invalid_input", f"--ca-file {ca_file}: not a CA certificate "
                           f"that loads: {getattr(e, 'reason', None) or e}") from None


def remote_worker_command(local: click.Command) -> click.Command:
    """`worker` with --server/--token-file added: without --server it is the local command,
    unchanged; with it, the same runtime runs against the server."""
    extra = [
        click.Option(["--server"], metavar="URL",
                     help="Run against a `jobcoord serve` at URL instead of a database."),
        click.Option(["--token-file"], metavar="FILE",
                     help="File holding this worker's token (with --server)."),
        click.Option(["--wait"], default=None, type=FiniteFloatRange(0, 30),
                     help="With --server: long-poll a claim this long (default 20 s; 0 with "
                          "--burst, which leaves once a claim gets nothing)."),
        click.Option(["--ca-file"], metavar="PEM",
                     help="With --server: trust this CA (a self-signed server certificate)."),
    ]

    def callback(**kw: Any) -> Any:
        server, token_file = kw.pop("server"), kw.pop("token_file")
        wait, ca_file = kw.pop("wait"), kw.pop("ca_file")
        if wait is None:
            # A burst worker leaves on an empty claim: a long-poll would only delay that.
            wait = 0.0 if kw.get("burst") else DEFAULT_CLAIM_WAIT_S
        if server is None:
            if token_file is not None:
                raise InvalidInput("invalid_input", "--token-file needs --server")
            assert local.callback is not None
            return local.callback(**kw)
        if token_file is None:
            raise InvalidInput("invalid_input", "--server needs --token-file")
        return _run_remote(click.get_current_context(), server, token_file, wait, ca_file, kw)

    return click.Command(local.name, params=[*local.params, *extra], callback=callback,
                         help=local.help, short_help=local.short_help)


def _server_env(server: str, token_file: str, ca_file: str | None) -> dict[str, str]:
    """What the remote worker's commands get to call back (files by absolute path: a
    command may run elsewhere than the worker's directory)."""
    env = {"JOBCOORD_SERVER": server,
           "JOBCOORD_TOKEN_FILE": os.path.abspath(os.path.expanduser(token_file))}
    if ca_file:
        env["JOBCOORD_CA_FILE"] = os.path.abspath(os.path.expanduser(ca_file))
    return env


def _run_remote(ctx: click.Context, server: str, token_file: str, wait: float,
                ca_file: str | None, kw: dict[str, Any]) -> None:
    from ..worker import Worker, make_config

    remote = remote_coordinator(server, token_file, claim_wait=wait, ca_file=ca_file)
    try:
        who = remote.whoami()
        if who["role"] != "worker":
            raise InvalidInput("invalid_input", f"the token is a {who['role']} token; a worker "
                               "needs a worker token")
        if kw["worker_id"] is not None and kw["worker_id"] != who["worker_id"]:
            raise InvalidInput("invalid_input", f"--worker-id {kw['worker_id']!r} differs "
                               f"from the token's worker {who['worker_id']!r}")
        # The claim's tenant is the token's (the server never takes it from a request): a
        # --tenant the token does not keep is refused, not dropped (which ran every tenant's
        # jobs under an unbound token).
        if kw["tenant"] is not None and kw["tenant"] != who["tenant"]:
            raise InvalidInput("invalid_input", (
                f"--tenant {kw['tenant']!r}: the token's claims are "
                + ("every tenant's; create the worker token with --tenant "
                   f"{kw['tenant']!r} to claim only that tenant's jobs"
                   if who["tenant"] is None else f"tenant {who['tenant']!r}'s")))
        # The long-poll does the waiting: after an empty one, ask again almost at once.
        poll = kw["poll"]
        if ctx.get_parameter_source("poll") is click.core.ParameterSource.DEFAULT:
            poll = "0.05"
        config = make_config(
            app_spec=kw["app_spec"], execs=kw["execs"], roles=kw["roles"],
            worker_id=who["worker_id"], lease=kw["lease"], concurrency=kw["concurrency"],
            grace=kw["grace"], kill_grace=kw["kill_grace"],
            heartbeat_every=kw["heartbeat_every"],
            reap_every="0",  # the server reaps
            poll=poll, timeouts=kw["timeouts"], max_results=kw["max_results"],
            readings_override=kw["readings_override"], log_format=kw["log_format"],
            max_jobs=kw["max_jobs"], burst=kw["burst"], database_url=None,
            policy=remote.policy, flush_delay=kw["flush_delay"], batch=kw["batch"],
            tenant=who["tenant"], server_env=_server_env(server, token_file, ca_file),
            # A --burst worker whose server is gone gives up after the client's own
            # retry budget, as its first call (whoami, above) did.
            give_up_s=remote.retry_s)
        with stdout_for_the_result(kw["as_json"]) as result_fd:
            summary = Worker(remote, config, as_json=kw["as_json"], result_fd=result_fd).run()
    finally:
        remote.close()
    _emit(kw["as_json"], summary)


#: What a command under a remote worker calls back with (docs/worker.md): the fenced calls
#: it may make itself, each as the Coordinator method of the same name takes them.
REMOTE_CALLS: dict[str, Any] = {
    "checkpoint": lambda r, job, worker, epoch, kw: r.checkpoint(
        job, worker, epoch, kw["name"], _json_data(kw["data"], r.policy.max_payload_bytes)),
    "effect": lambda r, job, worker, epoch, kw: r.mark_effect(job, worker, epoch),
}


def _json_data(raw: str | None, max_bytes: int) -> Any:
    """--data checked here exactly as the core checks a local checkpoint's (NaN, numbers
    out of range, duplicate keys, depth, size): the JSON sent could not say what is wrong."""
    from .. import validate as v

    if raw is None:
        return {}
    return v.json_value(raw.encode("utf-8", "surrogateescape"), "data", max_bytes=max_bytes,
                        require_object=False, too_large_code="checkpoint_too_large")[0]


def _database_named_over(ctx: click.Context) -> bool:
    """A server from the environment (JOBCOORD_SERVER) and a database named on the command
    line (`--db`, `--url`): the command line wins, as an option always wins over the
    environment."""
    env = click.core.ParameterSource.ENVIRONMENT
    line = click.core.ParameterSource.COMMANDLINE
    group = ctx.parent
    return (ctx.get_parameter_source("server") == env and group is not None
            and line in (group.get_parameter_source("db"), group.get_parameter_source("url")))


def remote_fenced_command(local: click.Command, call: Any) -> click.Command:
    """A fenced command (`checkpoint`, `effect`) with --server/--token-file/--ca-file added,
    read from JOBCOORD_SERVER, JOBCOORD_TOKEN_FILE and JOBCOORD_CA_FILE too: what a remote
    worker gives its commands, so they reach the coordinator as a local worker's do through
    JOBCOORD_URL. Without a server it is the local command, unchanged."""
    extra = [
        click.Option(["--server"], envvar="JOBCOORD_SERVER", metavar="URL",
                     help="Call a `jobcoord serve` at URL instead of a database "
                          "(JOBCOORD_SERVER)."),
        click.Option(["--token-file"], envvar="JOBCOORD_TOKEN_FILE", metavar="FILE",
                     help="With --server: file holding the worker's token "
                          "(JOBCOORD_TOKEN_FILE)."),
        click.Option(["--ca-file"], envvar="JOBCOORD_CA_FILE", metavar="PEM",
                     help="With --server: trust this CA (JOBCOORD_CA_FILE)."),
    ]

    def callback(**kw: Any) -> Any:
        server, token_file, ca_file = kw.pop("server"), kw.pop("token_file"), kw.pop("ca_file")
        ctx = click.get_current_context()
        if server and _database_named_over(ctx):
            server = token_file = ca_file = None
        if not server:
            # Only a --token-file given on this command line without a server is a mistake;
            # one left in the environment is not this command's.
            if token_file and ctx.get_parameter_source("token_file") != \
                    click.core.ParameterSource.ENVIRONMENT:
                raise InvalidInput("invalid_input", "--token-file needs --server")
            assert local.callback is not None
            return local.callback(**kw)
        if not token_file:
            raise InvalidInput("invalid_input", "--server needs --token-file")
        from ..core.items import job_and_epoch

        job_id, epoch = job_and_epoch(kw["job_id"], kw["epoch"])
        remote = remote_coordinator(server, token_file, ca_file=ca_file)
        try:
            who = remote.whoami()
            if who["role"] != "worker":
                raise InvalidInput("invalid_input", f"the token is a {who['role']} token; "
                                   f"{local.name} needs a worker token")
            # The server acts as the token's worker and tenant: a --worker or --tenant it
            # is not would be silently replaced.
            if kw["worker"] != who["worker_id"]:
                raise InvalidInput("invalid_input", f"--worker {kw['worker']!r} differs from "
                                   f"the token's worker {who['worker_id']!r}")
            if kw["tenant"] is not None and kw["tenant"] != who["tenant"]:
                raise InvalidInput("invalid_input", f"--tenant {kw['tenant']!r} differs from "
                                   f"the token's tenant {who['tenant']!r}")
            got = call(remote, job_id, who["worker_id"], epoch, kw)
        finally:
            remote.close()
        _emit(kw["as_json"], got)

    return click.Command(local.name, params=[*local.params, *extra], callback=callback,
                         help=local.help, short_help=local.short_help)


def register(cli: click.Group) -> None:
    """Add `serve`, `token` and the remote `worker` to the `jobcoord` group."""
    from ..metrics_cli import metrics as metrics_command
    from .metrics_route import serve_with_metrics_options

    cli.add_command(serve_with_metrics_options(serve))  # + --metrics-token/-public
    cli.add_command(metrics_command)
    cli.add_command(token)
    local = cli.commands.get("worker")
    if local is not None:
        cli.add_command(remote_worker_command(local))
    for name, call in REMOTE_CALLS.items():
        fenced = cli.commands.get(name)
        if fenced is not None:
            cli.add_command(remote_fenced_command(fenced, call))
