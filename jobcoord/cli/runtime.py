"""Long-running commands that run code: the worker and the demo."""

from __future__ import annotations

import click

from .group import Settings, cli
from .output import emit, json_option, say, stdout_for_the_result


@cli.command()
@click.option("--app", "app_spec", metavar="MODULE:APP",
              help="Python handlers: an App object (jobcoord.app), e.g. mymodule:app.")
@click.option("--exec", "execs", multiple=True, metavar="KIND=COMMAND",
              help="Command handler, e.g. summarize='python summarize.py' (repeatable): "
                   "payload JSON on stdin, result JSON on stdout, exit 65 = permanent failure.")
@click.option("--role", "roles", multiple=True, metavar="ROLE",
              help="A role this worker serves (repeatable; Python handlers add their own).")
@click.option("--worker-id", metavar="ID", help="Default: HOST:PID.")
@click.option("--lease", default="30", show_default=True, metavar="SECONDS",
              help="Lease length; renewed every lease/3.")
@click.option("--concurrency", default="1", show_default=True, metavar="N",
              help="Jobs run at once.")
@click.option("--grace", default="10", show_default=True, metavar="SECONDS",
              help="On SIGTERM/SIGINT, running jobs get this long before they are released.")
@click.option("--kill-grace", default="5", show_default=True, metavar="SECONDS",
              help="A stopped command gets this long between SIGTERM and SIGKILL.")
@click.option("--heartbeat-every", default="10", show_default=True, metavar="SECONDS",
              help="Send the machine's readings this often, on a timer of its own.")
@click.option("--reap-every", default="5", show_default=True, metavar="SECONDS",
              help="Reap expired leases this often (0: never).")
@click.option("--poll", default="1", show_default=True, metavar="SECONDS",
              help="Wait this long after a claim finds nothing.")
@click.option("--timeout", "timeouts", multiple=True, metavar="KIND=SECONDS",
              help="Wall-clock budget per attempt (default 600, or the handler's).")
@click.option("--max-result-bytes", "max_results", multiple=True, metavar="KIND=BYTES",
              help="Largest result accepted for KIND (default: the policy's limit).")
@click.option("--readings-override", metavar="JSON",
              help="For tests and demos: replace real readings, e.g. "
                   '{"memory_used_pct": 92}.')
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Decision log on stderr.")
@click.option("--max-jobs", metavar="N", help="Exit after claiming this many jobs.")
@click.option("--burst", is_flag=True,
              help="Exit once nothing is running and a claim gets nothing (no job, or gated; "
                   "expired leases are reaped once first, and their jobs claimed); exit with "
                   "the error after claims failed for 10 s (server or database out of "
                   "reach: 6).")
@click.option("--flush-delay", default="0.005", show_default=True, metavar="SECONDS",
              help="Longest a finished job's result waits to be accepted with others in one "
                   "transaction (0..1; a lease near its end is flushed at once).")
@click.option("--batch/--no-batch", default=True, show_default=True,
              help="Claim up to the free slots per call and accept results in groups; "
                   "--no-batch: one job per claim and per completion.")
@click.option("--tenant", default=None, metavar="TENANT",
              help="Claim only this tenant's jobs (as a worker token bound to it does).")
@json_option
@click.pass_obj
def worker(s: Settings, app_spec: str | None, execs: tuple[str, ...], roles: tuple[str, ...],
           worker_id: str | None, lease: str, concurrency: str, grace: str, kill_grace: str,
           heartbeat_every: str, reap_every: str, poll: str, timeouts: tuple[str, ...],
           max_results: tuple[str, ...], readings_override: str | None, log_format: str,
           max_jobs: str | None, burst: bool, flush_delay: str, batch: bool,
           tenant: str | None, as_json: bool) -> None:
    """Run handlers under leases until SIGTERM/SIGINT (a second signal exits at once)."""
    from ..worker import Worker, make_config

    target = s.target()
    url = target.url  # quoted: a path with "?", "#" or "%" stays that path
    policy = s.policy()
    config = make_config(
        app_spec=app_spec, execs=execs, roles=roles, worker_id=worker_id, lease=lease,
        concurrency=concurrency, grace=grace, kill_grace=kill_grace,
        heartbeat_every=heartbeat_every, reap_every=reap_every, poll=poll, timeouts=timeouts,
        max_results=max_results, readings_override=readings_override, log_format=log_format,
        max_jobs=max_jobs, burst=burst, database_url=url, policy=policy,
        flush_delay=flush_delay, batch=batch, tenant=tenant)
    with stdout_for_the_result(as_json) as result_fd:
        summary = Worker(s.coordinator(), config, as_json=as_json, result_fd=result_fd).run()
    emit(as_json, summary)


@cli.command()
@click.option("--dir", "directory", metavar="DIR",
              help="Where to create the demo database (default: a new directory here).")
@json_option
@click.pass_obj
def demo(s: Settings, directory: str | None, as_json: bool) -> None:
    """Run a small real workload: workers with different roles and readings, a worker killed
    mid-job and recovered, then a summary. Leaves the database to explore."""
    from ..demo import report, run_demo

    summary = run_demo(directory, echo=None if as_json else say)
    emit(as_json, summary, lambda: "\n".join(report(summary)), code=0 if summary["ok"] else 1)
