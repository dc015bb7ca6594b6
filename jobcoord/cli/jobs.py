"""Job commands: enqueue, jobs, show, explain, and the operator's cancel, retry, reconcile,
prune and reap."""

from __future__ import annotations

from typing import Any

import click

from .group import Settings, cli, json_text, read_json_source, tenant_option
from .output import emit, json_option, result_out, safe_text


@cli.command()
@click.argument("kind")
@click.option("--payload", help="A JSON object.")
@click.option("--payload-file", metavar="PATH|-", help="Read the payload from a file or stdin.")
@click.option("--priority", help="0..3 or P0..P3 (0 highest; P2, P3 are background).")
@click.option("--role", help="Only workers with this role may run it.")
@tenant_option
@click.option("--key", help="Idempotency key: the same key returns the same job.")
@click.option("--max-attempts", help="Attempts before the job is dead (default 3).")
@click.option("--deadline", metavar="SECONDS", help="No attempt starts after now + SECONDS.")
@click.option("--delay", metavar="SECONDS", default="0", help="Do not run before now + SECONDS.")
@click.option("--needs", multiple=True, metavar="NAME=INT[,NAME=INT]",
              help="Resources it takes, e.g. gpu_mem_mb=12000,ram_mb=8000 (repeatable): only "
                   "a worker with that much free claims it.")
@json_option
@click.pass_obj
def enqueue(s: Settings, kind: str, payload: str | None, payload_file: str | None,
            priority: str | None, role: str | None, tenant: str | None, key: str | None,
            max_attempts: str | None, deadline: str | None, delay: str,
            needs: tuple[str, ...], as_json: bool) -> None:
    """Accept a job; print its id only after it is committed."""
    c = s.coordinator()
    raw = read_json_source(payload, payload_file, "payload", c.policy.max_payload_bytes,
                            "payload_too_large")
    result = c.enqueue(kind, "{}" if raw is None else raw, priority=priority, role=role,
                       tenant="default" if tenant is None else tenant, key=key,
                       max_attempts=max_attempts, deadline_s=deadline, delay_s=delay,
                       # Repeated, they add up (as --capacity): only the last was kept, and a
                       # job needing a GPU was claimed by a worker without one.
                       needs=",".join(needs) if needs else None)
    emit(as_json, result, lambda: f"job {result['job_id']} "
         + ("enqueued" if result["created"] else "already existed (same idempotency key)"))


@cli.command()
@click.argument("job_id")
@tenant_option
@json_option
@click.pass_obj
def cancel(s: Settings, job_id: str, tenant: str | None, as_json: bool) -> None:
    """Cancel a waiting job, or ask a running job's worker to stop."""
    emit(as_json, s.coordinator().cancel(job_id, tenant=tenant))


@cli.command()
@click.argument("job_id")
@tenant_option
@json_option
@click.pass_obj
def retry(s: Settings, job_id: str, tenant: str | None, as_json: bool) -> None:
    """Send a dead or unknown job back to waiting."""
    emit(as_json, s.coordinator().retry(job_id, tenant=tenant))


@cli.command()
@click.argument("job_id")
@click.option("--as", "as_status", required=True,
              type=click.Choice(["succeeded", "waiting", "dead"]))
@click.option("--result", help="The result as JSON (needed for --as succeeded).")
@click.option("--reason", required=True, help="Why: what you checked.")
@tenant_option
@json_option
@click.pass_obj
def reconcile(s: Settings, job_id: str, as_status: str, result: str | None, reason: str,
              tenant: str | None, as_json: bool) -> None:
    """Settle an unknown job after checking what its external effect did."""
    emit(as_json, s.coordinator().reconcile(job_id, as_status, reason,
                                            result=None if result is None else json_text(result),
                                            tenant=tenant))


@cli.command()
@click.option("--older-than", required=True, metavar="AGE",
              help="Only jobs that finished longer ago than this: seconds, or 90s, 15m, 12h, "
                   "7d, 2w.")
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help="succeeded, dead or cancelled (repeatable or comma-separated; default all "
                   "three).")
@tenant_option
@click.option("--batch", default="500", show_default=True,
              help="Jobs deleted per write transaction.")
@click.option("--pause", metavar="SECONDS",
              help="Rest between batches (default: as long as the last batch took).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@json_option
@click.pass_obj
def prune(s: Settings, older_than: str, statuses: tuple[str, ...], tenant: str | None,
          batch: str, pause: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete finished jobs older than AGE, with their events, checkpoints and artifact rows.

    Waiting, running and unknown jobs are never deleted. A pruned job's idempotency key is
    forgotten, and files named by its artifact rows are left in place."""
    chosen = [x.strip() for item in statuses for x in item.split(",")] or None
    result = s.coordinator().prune(older_than, statuses=chosen, tenant=tenant, batch=batch,
                                   dry_run=dry_run, pause_s=pause)
    verb = "would delete" if dry_run else "deleted"
    emit(as_json, result, lambda: (
        f"{verb} {result['jobs']} jobs ({', '.join(result['statuses'])}) that finished before "
        f"{result['cutoff']}, with {result['events']} events, {result['checkpoints']} "
        f"checkpoints and {result['artifacts']} artifact rows; {result['keys_released']} "
        "idempotency keys released"))


@cli.command()
@click.option("--status", "status_", help="Only jobs in this status.")
@click.option("--kind", help="Only jobs of this kind.")
@tenant_option
@click.option("--limit", default="100", help="At most this many (newest first).")
@json_option
@click.pass_obj
def jobs(s: Settings, status_: str | None, kind: str | None, tenant: str | None, limit: str,
         as_json: bool) -> None:
    """List jobs, newest first."""
    result = s.coordinator().jobs(status=status_, kind=kind, tenant=tenant, limit=limit)

    def table() -> str:
        rows = [f"{'id':>8} {'status':<10} {'P':<2} {'kind':<20} {'tenant':<12} attempts"]
        rows += [f"{j['job_id']:>8} {j['status']:<10} P{j['priority']} "
                 f"{safe_text(j['kind']):<20} {safe_text(j['tenant']):<12} "
                 f"{j['attempts']}/{j['max_attempts']}"
                 for j in result["jobs"]]
        return "\n".join(rows)

    emit(as_json, result, table)


@cli.command()
@click.argument("job_id")
@tenant_option
@json_option
@click.pass_obj
def show(s: Settings, job_id: str, tenant: str | None, as_json: bool) -> None:
    """A job with its lease, event history, checkpoints and provenance."""
    emit(as_json, s.coordinator().show(job_id, tenant=tenant))


@cli.command()
@click.argument("job_id")
@tenant_option
@json_option
@click.pass_obj
def explain(s: Settings, job_id: str, tenant: str | None, as_json: bool) -> None:
    """Why a job is or is not being picked up right now."""
    result = s.coordinator().explain(job_id, tenant=tenant)
    emit(as_json, result, lambda: f"job {result['job_id']} is {result['status']}\n" + "\n".join(
        f"- {r['code']}: {safe_text(r['detail'])}" for r in result["reasons"])
        + _schedule_line(result.get("schedule")))


def _schedule_line(sch: dict[str, Any] | None) -> str:
    """explain's line about the schedule that fired the job, if one did."""
    if sch is None:
        return ""
    last = sch["last"]
    said = "none" if last is None else f"{last['outcome']} (slot {last['slot']})"
    return (f"\n- fired by schedule {safe_text(sch['name'])} for slot {sch['slot']}"
            + (f", window ends {sch['window_ends_at']}" if sch["window_ends_at"] else "")
            + f"; next fire {sch['next_fire_at'] or 'none (paused)'}; last outcome {said}")


@cli.command()
@click.option("--every", metavar="SECONDS", help="Keep reaping at this interval until stopped.")
@click.option("--limit", default="1000", help="Leases handled per pass.")
@json_option
@click.pass_obj
def reap(s: Settings, every: str | None, limit: str, as_json: bool) -> None:
    """Recover jobs whose lease expired (to waiting, dead or unknown)."""
    c = s.coordinator()
    if every is None:
        emit(as_json, c.reap(limit=limit))
        return
    from .. import validate as v
    from ..runtime import run_reaper

    interval = v.seconds(every, "every", 0.05, 3600.0)
    code = run_reaper(c, interval, limit=int(v.integer(limit, "limit", 1, 100_000)),
                      as_json=as_json)
    result_out()  # stopped: a signal from here on changes nothing
    if code:
        raise click.exceptions.Exit(code)
