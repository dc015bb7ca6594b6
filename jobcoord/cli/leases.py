"""Worker and lease commands: heartbeat, claim, renew, complete, fail, effect, checkpoint, and
the workers' view."""

from __future__ import annotations

from typing import Any

import click

from ..errors import InvalidInput
from .group import (
    EXIT_NOTHING_TO_CLAIM,
    Settings,
    cli,
    fenced,
    json_text,
    read_json_source,
    tenant_option,
)
from .output import dump, emit, json_option, safe_text


@cli.command()
@click.argument("worker_id")
@click.option("--role", "roles", multiple=True, help="A role this worker serves (repeatable).")
@click.option("--kind", "kinds", multiple=True,
              help="Only claim these kinds (repeatable; default: any kind).")
@click.option("--readings", help='JSON, e.g. {"memory_used_pct": 40, "on_battery": false}.')
@click.option("--capacity", "capacity", multiple=True, metavar="NAME=INT[,NAME=INT]",
              help="Named resources this worker has free (repeatable), matched by name "
                   "against jobs' --needs (not ram_mb or gpu_mem_mb: those come from the "
                   "readings' memory_available_mb and gpus).")
@json_option
@click.pass_obj
def heartbeat(s: Settings, worker_id: str, roles: tuple[str, ...], kinds: tuple[str, ...],
              readings: str | None, capacity: tuple[str, ...], as_json: bool) -> None:
    """Record a worker's roles and resource readings."""
    if capacity:
        readings = with_capacity(readings, capacity)
    emit(as_json, s.coordinator().heartbeat(worker_id, roles=roles, readings=readings,
                                            kinds=kinds or None))


def with_capacity(readings: str | None, capacity: tuple[str, ...]) -> str:
    """--readings with `capacity` set from the --capacity options (both checked)."""
    from .. import validate as v

    named = v.capacity(",".join(capacity), "--capacity")
    value: Any = {}
    if readings is not None:
        value, _ = v.json_value(readings, "readings", max_bytes=16 * 1024,
                                require_object=True)
    if "capacity" in value:
        raise InvalidInput("invalid_input", "give capacity either in --readings or with "
                           "--capacity, not both", field="capacity")
    return v.dumps({**value, "capacity": named})


@cli.command()
@click.argument("worker_id")
@click.option("--lease", metavar="SECONDS", help="Lease length (default 45).")
@click.option("--kind", "kinds", multiple=True, help="Only these kinds (repeatable).")
@tenant_option
@json_option
@click.pass_obj
def claim(s: Settings, worker_id: str, lease: str | None, kinds: tuple[str, ...],
          tenant: str | None, as_json: bool) -> None:
    """Claim the first eligible job (of --tenant only, when given: as a worker token bound to
    that tenant claims); exit 3 with the reason when there is none."""
    result = s.coordinator().claim(worker_id, lease_s=lease, kinds=kinds or None,
                                   tenant=tenant)
    if result["job"] is None:
        emit(as_json, result, f"nothing to claim: {result['reason']}: "
             f"{safe_text(result['detail'])}",
             code=EXIT_NOTHING_TO_CLAIM)
        return
    job, lease_info = result["job"], result["lease"]
    emit(as_json, result, lambda: f"claimed job {job['job_id']} ({safe_text(job['kind'])}, "
         f"P{job['priority']}) epoch {lease_info['epoch']} until {lease_info['expires_at']}\n"
         f"payload: {safe_text(dump(job['payload']))}")


@cli.command()
@click.argument("job_id")
@fenced
@click.option("--lease", metavar="SECONDS", help="New lease length from now (default 45).")
@tenant_option
@json_option
@click.pass_obj
def renew(s: Settings, job_id: str, worker: str, epoch: str, lease: str | None,
          tenant: str | None, as_json: bool) -> None:
    """Extend a live lease (only its owner, at the current epoch)."""
    emit(as_json, s.coordinator().renew(job_id, worker, epoch, lease_s=lease, tenant=tenant))


@cli.command()
@click.argument("job_id")
@fenced
@click.option("--result", help="The result as JSON.")
@click.option("--result-file", metavar="PATH|-", help="Read the result from a file or stdin.")
@tenant_option
@json_option
@click.pass_obj
def complete(s: Settings, job_id: str, worker: str, epoch: str, result: str | None,
             result_file: str | None, tenant: str | None, as_json: bool) -> None:
    """Deliver the result: only the owner, at the current epoch, before expiry."""
    c = s.coordinator()
    raw = read_json_source(result, result_file, "result", c.policy.max_result_bytes,
                            "result_too_large")
    emit(as_json, c.complete(job_id, worker, epoch, b"{}" if raw is None else json_text(raw),
                             tenant=tenant))


@cli.command()
@click.argument("job_id")
@fenced
@click.option("--error", required=True, help="What went wrong (kept for every attempt).")
@click.option("--permanent", is_flag=True, help="Do not retry: the job goes to dead.")
@click.option("--effect-not-applied", is_flag=True,
              help="The external effect this attempt marked certainly did not happen: retry "
              "normally instead of leaving the job unknown for reconcile.")
@tenant_option
@json_option
@click.pass_obj
def fail(s: Settings, job_id: str, worker: str, epoch: str, error: str, permanent: bool,
         effect_not_applied: bool, tenant: str | None, as_json: bool) -> None:
    """Report a failed attempt (retried with backoff unless permanent or out of attempts;
    after a marked effect the job becomes unknown unless --effect-not-applied)."""
    emit(as_json, s.coordinator().fail(job_id, worker, epoch, error, permanent=permanent,
                                       tenant=tenant, effect_not_applied=effect_not_applied))


@cli.command()
@click.argument("job_id")
@fenced
@tenant_option
@json_option
@click.pass_obj
def effect(s: Settings, job_id: str, worker: str, epoch: str, tenant: str | None,
           as_json: bool) -> None:
    """Mark that this attempt started an external effect it cannot undo."""
    emit(as_json, s.coordinator().mark_effect(job_id, worker, epoch, tenant=tenant))


@cli.command()
@click.argument("job_id")
@fenced
@click.option("--name", required=True, help="Checkpoint name, e.g. remote_submitted.")
@click.option("--data", help="JSON data, e.g. {\"remote_id\": \"R-17\"}.")
@tenant_option
@json_option
@click.pass_obj
def checkpoint(s: Settings, job_id: str, worker: str, epoch: str, name: str,
               data: str | None, tenant: str | None, as_json: bool) -> None:
    """Save step progress under the current epoch (the next attempt sees it)."""
    emit(as_json, s.coordinator().checkpoint(job_id, worker, epoch, name,
                                             json_text("{}" if data is None else data),
                                             tenant=tenant))



@cli.command()
@json_option
@click.pass_obj
def workers(s: Settings, as_json: bool) -> None:
    """Workers, their readings, and whether the gates let them claim now."""
    emit(as_json, s.coordinator().workers())
