"""The `jobcoord schedule` commands: add, ls, pause, resume, rm, tick. No rules live here
(core/schedules.py)."""

from __future__ import annotations

from typing import Any

import click

from .group import Settings, cli, read_json_source, tenant_option
from .output import emit, json_option, safe_text


@cli.group("schedule")
def schedule() -> None:
    """Durable schedules: enqueue a job per cron slot or interval (workers, `reap --every`
    and `serve` tick them; so does `schedule tick`)."""


@schedule.command("add")
@click.argument("name")
@click.argument("kind")
@click.option("--cron", metavar="EXPR", help="Five fields: minute hour day month weekday, "
              "e.g. '0 2 * * *'.")
@click.option("--tz", metavar="ZONE", help="IANA time zone of --cron (default UTC), e.g. "
              "Europe/Berlin.")
@click.option("--every", metavar="DUR", help="An interval instead of --cron: 30s, 15m, 1h, 1d "
              "(slots at multiples of it since the Unix epoch).")
@click.option("--payload", help="The jobs' payload, a JSON object.")
@click.option("--payload-file", metavar="PATH|-", help="Read the payload from a file or stdin.")
@click.option("--priority", help="0..3 or P0..P3 (0 highest).")
@click.option("--role", help="Only workers with this role may run the jobs.")
@tenant_option
@click.option("--max-attempts", help="Attempts per fired job (default 3).")
@click.option("--window", metavar="DUR", help="A fired job's deadline is its slot + DUR; "
              "one that never ran by then ends dead (window_missed).")
@click.option("--catchup", metavar="skip|latest|all:N", help="Slots missed while nothing "
              "ticked: record them (skip, the default), fire the latest, or fire up to N.")
@click.option("--overlap", type=click.Choice(["allow", "skip", "queue_one"]),
              help="When the previous fire's job is still waiting or running: fire anyway "
              "(allow, the default), skip the slot, or hold one slot until it ends.")
@json_option
@click.pass_obj
def add(s: Settings, name: str, kind: str, cron: str | None, tz: str | None,
        every: str | None, payload: str | None, payload_file: str | None,
        priority: str | None, role: str | None, tenant: str | None,
        max_attempts: str | None, window: str | None, catchup: str | None,
        overlap: str | None, as_json: bool) -> None:
    """Create schedule NAME, enqueuing KIND at every slot from the next one on."""
    c = s.coordinator()
    raw = read_json_source(payload, payload_file, "payload", c.policy.max_payload_bytes,
                           "payload_too_large")
    got = c.add_schedule(name, kind, cron=cron, tz=tz, every=every,
                         payload="{}" if raw is None else raw, priority=priority, role=role,
                         tenant="default" if tenant is None else tenant,
                         max_attempts=max_attempts, window=window, catchup=catchup,
                         overlap=overlap)
    emit(as_json, got, lambda: f"schedule {safe_text(name)} added; next fire at "
         f"{got['next_fire_at']}")


def _when(x: dict[str, Any]) -> str:
    if x["cron"] is not None:
        return f"cron '{x['cron']}' {x['tz']}"
    return f"every {x['every_s']:g}s"


@schedule.command("ls")
@json_option
@click.pass_obj
def ls(s: Settings, as_json: bool) -> None:
    """Every schedule: when it fires next and what its last slot came to."""
    got = s.coordinator().schedules()

    def table() -> str:
        if not got["schedules"]:
            return "no schedules"
        rows = []
        for x in got["schedules"]:
            last = x["last"]
            said = "never fired" if last is None else (
                f"last {last['slot']} {last['outcome']}"
                + (f" (job {last['job_id']} {last['job_status']})" if last["job_id"] else ""))
            nxt = "paused" if x["paused"] else f"next {x['next_fire_at']}"
            rows.append(f"{safe_text(x['name'])}: {safe_text(x['kind'])}, "
                        f"{safe_text(_when(x))}; {nxt}; {said}")
        return "\n".join(rows)

    emit(as_json, got, table)


def _simple(verb: str, help_text: str) -> None:
    @schedule.command(verb, help=help_text)
    @click.argument("name")
    @json_option
    @click.pass_obj
    def command(s: Settings, name: str, as_json: bool) -> None:
        c = s.coordinator()
        act = {"pause": c.pause_schedule, "resume": c.resume_schedule,
               "rm": c.remove_schedule}[verb]
        got = act(name)
        emit(as_json, got, lambda: f"schedule {safe_text(name)}: " + (
            "removed" if verb == "rm" else "paused" if got["paused"]
            else f"resumed, next fire at {got['next_fire_at']}"))


_simple("pause", "Stop firing schedule NAME until it is resumed.")
_simple("resume", "Fire schedule NAME again, from the first slot after now.")
_simple("rm", "Delete schedule NAME (the jobs it fired stay).")


@schedule.command("tick")
@click.option("--limit", default="100",
              help="Schedules handled at most in this tick (each counted once, however many "
                   "write transactions its slots take; the rest wait for the next tick).")
@json_option
@click.pass_obj
def tick(s: Settings, limit: str, as_json: bool) -> None:
    """Fire what is due now (one job per schedule and slot, whoever else ticks). A due
    schedule whose stored row is damaged is passed over and named (`unreadable`): exit 7
    once the others were ticked."""
    got = s.coordinator().tick_schedules(limit=limit)
    bad = got.get("unreadable") or []
    emit(as_json, got, lambda: f"fired {got['fired']}, missed {got['missed']}"
         f"{'' if got['missed_exact'] else ' or more (older slots not counted)'}, skipped "
         f"{got['skipped']}, queued {got['queued']}" + "".join(
             f"\nunreadable schedule {safe_text(u['name'])}: {safe_text(u['detail'])}"
             for u in bad) + "".join(
             f"\nschedule {safe_text(x['schedule'])}: paused, no slot is left before the "
             "calendar's end (the year 9999)" for x in got["schedules"]
             if x.get("calendar_ended")), code=7 if bad else 0)
