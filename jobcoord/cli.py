"""The `jobcoord` command: parse, call the coordinator, print. No rules live here.

Every command takes `--json` and then prints exactly one JSON object on stdout; errors become
`{"error": {"code", "message"}}` and the exit code of their class (errors.py; the table in
README.md "Exit codes"). Long-running commands print JSON Lines instead, one object per pass.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from . import __version__
from .errors import EXIT_CODES, InvalidInput, JobcoordError

EXIT_NOTHING_TO_CLAIM = 3


@dataclass
class Settings:
    db: str | None
    url: str | None
    policy_path: str | None
    synchronous: str
    busy_timeout: float
    debug: bool
    _coordinator: Any = None

    def target(self) -> Any:
        from .db import resolve_target

        return resolve_target(db=self.db, url=self.url)

    def policy(self) -> Any:
        from .policy import Policy

        return Policy.from_toml(self.policy_path) if self.policy_path else Policy()

    def coordinator(self) -> Any:
        if self._coordinator is None:
            from .service import Coordinator

            self._coordinator = Coordinator.open(
                self.target(), policy=self.policy(), synchronous=self.synchronous,
                busy_timeout=self.busy_timeout)
        return self._coordinator

    def close(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()


def _dump(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, sort_keys=False)


#: Characters that data must not bring to a terminal: C0 controls (line breaks, escape
#: sequences), DEL, C1 controls (U+0085 is a line break, U+009B a CSI), the Unicode line and
#: paragraph separators, and the bidi marks, embeddings, overrides and isolates that reorder
#: what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    ch = found.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) <= 0xFF else f"\\u{ord(ch):04x}"


def safe_text(value: Any) -> str:
    """`value` as text that cannot start a line, move the cursor or reorder the display:
    every unsafe character is written as a visible escape (\\n, \\x1b, \\u2028). Applied to
    every piece of data in text output; JSON output carries the data unchanged."""
    return _UNSAFE.sub(_escape, str(value))


def emit(as_json: bool, payload: dict[str, Any], text: str | Callable[[], str] | None = None,
         code: int = 0) -> None:
    """Print the result (one JSON object, or text for people) and exit with `code`."""
    if as_json:
        click.echo(_dump(payload))
    else:
        click.echo(text() if callable(text) else text if text is not None else _human(payload))
    if code:
        raise click.exceptions.Exit(code)


def _human(payload: Any, indent: str = "") -> str:
    lines = []
    if isinstance(payload, dict):
        for k, val in payload.items():
            if isinstance(val, dict | list) and val:
                lines.append(f"{indent}{safe_text(k)}:")
                lines.append(_human(val, indent + "  "))
            else:
                lines.append(f"{indent}{safe_text(k)}: {_scalar(val)}")
    elif isinstance(payload, list):
        for item in payload:
            if isinstance(item, dict):
                lines.append(f"{indent}- " + ", ".join(f"{safe_text(k)}={_scalar(x)}"
                                                     for k, x in item.items()))
            else:
                lines.append(f"{indent}- {_scalar(item)}")
    else:
        lines.append(f"{indent}{_scalar(payload)}")
    return "\n".join(lines)


def _scalar(val: Any) -> str:
    if isinstance(val, dict | list):
        return safe_text(_dump(val))
    return "-" if val is None else safe_text(val)


#: What click parsed for the running command, read by `main` when an error escapes it.
#: --json is decided by the parser, never by looking for the text in argv: in
#: `enqueue k --key --json` it is the idempotency key, not a switch.
_PARSED: dict[str, bool] = {}


def _note(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    _PARSED[param.name or ""] = bool(value)
    return value


json_option = click.option("--json", "as_json", is_flag=True, callback=_note,
                           help="Print exactly one JSON object on stdout.")
tenant_option = click.option("--tenant", default=None,
                             help="Act only within this tenant (others' jobs are invisible).")
fence_options = [
    click.option("--worker", "worker", required=True, help="The worker holding the lease."),
    click.option("--epoch", required=True, help="The lease epoch returned by claim."),
]


def fenced(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(fence_options):
        fn = opt(fn)
    return fn


def _read_json_source(inline: str | None, path: str | None, field: str, limit: int,
                      too_large_code: str) -> str | bytes | None:
    """--x JSON or --x-file PATH|- (stdin), read with a size bound: never more than
    limit + 1 bytes, and a source with more is refused here, with its size when a regular
    file says it (a pipe does not)."""
    from .validate import too_large

    if inline is not None and path is not None:
        raise InvalidInput("invalid_input", f"give --{field} or --{field}-file, not both")
    if path is None:
        return inline
    try:
        size: int | None = None
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
                if len(data) > limit and os.path.isfile(path):
                    size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise InvalidInput("invalid_input", f"cannot read {path}: {e.strerror}") from None
    if len(data) > limit:
        raise too_large(field, size, limit, too_large_code)
    return data


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db", metavar="PATH", help="SQLite database file (default ./jobcoord.db).")
@click.option("--url", "url", metavar="URL",
              help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db (env JOBCOORD_URL).")
@click.option("--policy", "policy_path", envvar="JOBCOORD_POLICY", metavar="TOML",
              help="Gate policy and limits (env JOBCOORD_POLICY).")
@click.option("--synchronous", type=click.Choice(["full", "normal"]), default="full",
              envvar="JOBCOORD_SYNCHRONOUS", show_default=True,
              help="SQLite durability: full survives a power cut; normal is faster and may "
                   "lose the last commits on power loss (never corrupts).")
@click.option("--busy-timeout", type=click.FloatRange(0.0, 600.0), default=5.0,
              envvar="JOBCOORD_BUSY_TIMEOUT", show_default=True,
              help="Seconds to wait for a lock before each bounded retry.")
@click.option("--debug", is_flag=True, callback=_note,
              help="Show tracebacks for internal errors.")
@click.version_option(__version__, prog_name="jobcoord")
@click.pass_context
def cli(ctx: click.Context, db: str | None, url: str | None, policy_path: str | None,
        synchronous: str, busy_timeout: float, debug: bool) -> None:
    """jobcoord: a durable job coordinator. Leases, fencing epochs and resource gates on
    one SQLite file, or PostgreSQL."""
    settings = Settings(db, url, policy_path, synchronous, busy_timeout, debug)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


# --- schema and storage ------------------------------------------------------------------


@cli.command()
@click.option("--with", "add", multiple=True, metavar="FEATURE",
              help="Also install an optional feature: artifacts.")
@click.option("--without", "remove", multiple=True, metavar="FEATURE",
              help="Remove an optional feature (its tables are dropped).")
@json_option
@click.pass_obj
def migrate(s: Settings, add: tuple[str, ...], remove: tuple[str, ...], as_json: bool) -> None:
    """Create the database or bring its schema to this version, then quick_check it."""
    from .db import Database
    from .migrate import migrate as run_migrate

    target = s.target()
    # Migrations wait longer for the lock: a concurrent migrate finishes first.
    db = Database.open(target, create=True, synchronous=s.synchronous,
                       busy_timeout=max(s.busy_timeout, 60.0))
    # A failed migration is rolled back whole. A new file it created stays behind, empty and
    # unmigrated (any command says "run jobcoord migrate"): deleting it could pull the file
    # from under a concurrent migrate that opened it meanwhile and is about to commit.
    try:
        result = run_migrate(db, add=set(add), remove=set(remove))
    finally:
        db.close()
    result["database"] = target.display()
    emit(as_json, result)


@cli.command()
@tenant_option
@json_option
@click.pass_obj
def status(s: Settings, tenant: str | None, as_json: bool) -> None:
    """Counts by status, workers, active leases, schema revision and storage facts."""
    emit(as_json, s.coordinator().status(tenant=tenant))


@cli.command()
@click.option("--full", is_flag=True, help="integrity_check instead of quick_check.")
@json_option
@click.pass_obj
def check(s: Settings, full: bool, as_json: bool) -> None:
    """Check storage and the application invariants; exit 7 if anything is wrong."""
    from .maintenance import check as run_check

    result = run_check(s.coordinator().db, full=full)
    emit(as_json, result, code=0 if result["ok"] else 7)


@cli.command()
@click.argument("dest")
@click.option("--force", is_flag=True, help="Replace DEST if it exists.")
@json_option
@click.pass_obj
def backup(s: Settings, dest: str, force: bool, as_json: bool) -> None:
    """Copy the live database to DEST (online backup API), then check the copy."""
    from .maintenance import backup as run_backup

    emit(as_json, run_backup(s.coordinator().db, dest, force=force))


@cli.command()
@click.argument("backup_file", metavar="BACKUP")
@json_option
@click.pass_obj
def restore(s: Settings, backup_file: str, as_json: bool) -> None:
    """Make the database named by --db, which must not exist yet, from BACKUP.

    BACKUP must be one file written by `backup`; it is checked whole (integrity_check and the
    invariants) before anything is written, and the new database is checked again after."""
    from .maintenance import restore as run_restore

    emit(as_json, run_restore(backup_file, s.target()))


# --- submission ----------------------------------------------------------------------------


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
@json_option
@click.pass_obj
def enqueue(s: Settings, kind: str, payload: str | None, payload_file: str | None,
            priority: str | None, role: str | None, tenant: str | None, key: str | None,
            max_attempts: str | None, deadline: str | None, delay: str, as_json: bool) -> None:
    """Accept a job; print its id only after it is committed."""
    c = s.coordinator()
    raw = _read_json_source(payload, payload_file, "payload", c.policy.max_payload_bytes,
                            "payload_too_large")
    result = c.enqueue(kind, "{}" if raw is None else raw, priority=priority, role=role,
                       tenant="default" if tenant is None else tenant, key=key,
                       max_attempts=max_attempts, deadline_s=deadline, delay_s=delay)
    emit(as_json, result, lambda: f"job {result['job_id']} "
         + ("enqueued" if result["created"] else "already existed (same idempotency key)"))


# --- workers --------------------------------------------------------------------------------


@cli.command()
@click.argument("worker_id")
@click.option("--role", "roles", multiple=True, help="A role this worker serves (repeatable).")
@click.option("--kind", "kinds", multiple=True,
              help="Only claim these kinds (repeatable; default: any kind).")
@click.option("--readings", help='JSON, e.g. {"memory_used_pct": 40, "on_battery": false}.')
@json_option
@click.pass_obj
def heartbeat(s: Settings, worker_id: str, roles: tuple[str, ...], kinds: tuple[str, ...],
              readings: str | None, as_json: bool) -> None:
    """Record a worker's roles and resource readings."""
    emit(as_json, s.coordinator().heartbeat(worker_id, roles=roles, readings=readings,
                                            kinds=kinds or None))


@cli.command()
@click.argument("worker_id")
@click.option("--lease", metavar="SECONDS", help="Lease length (default 45).")
@click.option("--kind", "kinds", multiple=True, help="Only these kinds (repeatable).")
@json_option
@click.pass_obj
def claim(s: Settings, worker_id: str, lease: str | None, kinds: tuple[str, ...],
          as_json: bool) -> None:
    """Claim the first eligible job; exit 3 with the reason when there is none."""
    result = s.coordinator().claim(worker_id, lease_s=lease, kinds=kinds or None)
    if result["job"] is None:
        emit(as_json, result, f"nothing to claim: {result['reason']}: "
             f"{safe_text(result['detail'])}",
             code=EXIT_NOTHING_TO_CLAIM)
        return
    job, lease_info = result["job"], result["lease"]
    emit(as_json, result, lambda: f"claimed job {job['job_id']} ({safe_text(job['kind'])}, "
         f"P{job['priority']}) epoch {lease_info['epoch']} until {lease_info['expires_at']}\n"
         f"payload: {safe_text(_dump(job['payload']))}")


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
    raw = _read_json_source(result, result_file, "result", c.policy.max_result_bytes,
                            "result_too_large")
    emit(as_json, c.complete(job_id, worker, epoch, "{}" if raw is None else raw,
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
                                             "{}" if data is None else data, tenant=tenant))


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
    from . import validate as v
    from .runtime import run_reaper

    interval = v.seconds(every, "every", 0.05, 3600.0)
    code = run_reaper(c, interval, limit=int(v.integer(limit, "limit", 1, 100_000)),
                      as_json=as_json)
    if code:
        raise click.exceptions.Exit(code)


# --- operators ------------------------------------------------------------------------------


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
    emit(as_json, s.coordinator().reconcile(job_id, as_status, reason, result=result,
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
        f"- {r['code']}: {safe_text(r['detail'])}" for r in result["reasons"]))


@cli.command()
@json_option
@click.pass_obj
def workers(s: Settings, as_json: bool) -> None:
    """Workers, their readings, and whether the gates let them claim now."""
    emit(as_json, s.coordinator().workers())


@cli.command()
@click.option("--to", "to_url", required=True, metavar="URL",
              help="An empty, migrated PostgreSQL database, e.g. "
                   "postgresql+psycopg://user@host/db.")
@click.option("--allow-active-leases", is_flag=True,
              help="Copy even while workers hold live leases (their results would still go "
                   "to the old database).")
@json_option
@click.pass_obj
def transfer(s: Settings, to_url: str, allow_active_leases: bool, as_json: bool) -> None:
    """Copy this SQLite coordinator's whole state into PostgreSQL and verify every table."""
    from .db import resolve_target
    from .transfer import transfer as run_transfer

    dest = resolve_target(url=to_url)
    c = s.coordinator()
    result = run_transfer(c.db, c.features, dest, allow_active_leases=allow_active_leases)
    emit(as_json, result, lambda: "\n".join(
        [f"copied {safe_text(result['source'])} to {safe_text(result['target'])}, verified:"]
        + [f"  {name}: {t['rows']} rows, sha256 {t['sha256'][:16]}..."
           for name, t in result["tables"].items()]))


# --- worker runtime and demo ------------------------------------------------------------------


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
              help="Exit once nothing is running and a claim gets nothing (no job, or gated).")
@json_option
@click.pass_obj
def worker(s: Settings, app_spec: str | None, execs: tuple[str, ...], roles: tuple[str, ...],
           worker_id: str | None, lease: str, concurrency: str, grace: str, kill_grace: str,
           heartbeat_every: str, reap_every: str, poll: str, timeouts: tuple[str, ...],
           max_results: tuple[str, ...], readings_override: str | None, log_format: str,
           max_jobs: str | None, burst: bool, as_json: bool) -> None:
    """Run handlers under leases until SIGTERM/SIGINT (a second signal exits at once)."""
    from .worker import Worker, make_config

    target = s.target()
    url = target.url  # quoted: a path with "?", "#" or "%" stays that path
    policy = s.policy()
    config = make_config(
        app_spec=app_spec, execs=execs, roles=roles, worker_id=worker_id, lease=lease,
        concurrency=concurrency, grace=grace, kill_grace=kill_grace,
        heartbeat_every=heartbeat_every, reap_every=reap_every, poll=poll, timeouts=timeouts,
        max_results=max_results, readings_override=readings_override, log_format=log_format,
        max_jobs=max_jobs, burst=burst, database_url=url, policy=policy)
    summary = Worker(s.coordinator(), config, as_json=as_json).run()
    emit(as_json, summary)


@cli.command()
@click.option("--dir", "directory", metavar="DIR",
              help="Where to create the demo database (default: a new directory here).")
@json_option
@click.pass_obj
def demo(s: Settings, directory: str | None, as_json: bool) -> None:
    """Run a small real workload: workers with different roles and readings, a worker killed
    mid-job and recovered, then a summary. Leaves the database to explore."""
    from .demo import report, run_demo

    summary = run_demo(directory, echo=None if as_json else click.echo)
    emit(as_json, summary, lambda: "\n".join(report(summary)), code=0 if summary["ok"] else 1)


# --- entry point ----------------------------------------------------------------------------


def _value_options(command: click.Command) -> set[str]:
    """The option names of `command` that take a value (the next token is that value)."""
    names: set[str] = set()
    for param in command.params:
        if isinstance(param, click.Option) and not param.is_flag and not param.count:
            names.update(param.opts)
    return names


def _flag_in_argv(argv: list[str]) -> tuple[bool, bool]:
    """(--json, --debug) for a command line click could not parse: a token counts only where
    click would read it as that flag, not as the value of an option before it, and not after
    `--`. --debug belongs before the command name, --json after it."""
    group_values = _value_options(cli)
    i, debug = 0, False
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        if argv[i] == "--debug":
            debug = True
        i += 2 if argv[i] in group_values else 1
    if i >= len(argv) or argv[i] == "--":
        return False, debug
    command = cli.commands.get(argv[i])
    rest = argv[i + 1:]
    if command is None:  # an unknown command: its options are unknown too
        return "--json" in rest[:rest.index("--")] if "--" in rest else "--json" in rest, debug
    values = _value_options(command)
    j = 0
    while j < len(rest) and rest[j] != "--":
        if rest[j] == "--json":
            return True, debug
        j += 2 if rest[j] in values else 1
    return False, debug


def _print_error(err: JobcoordError, as_json: bool) -> None:
    if as_json:
        click.echo(_dump(err.to_json()))
    # One line on stderr whatever the message echoes (a path, a value): data cannot add one.
    click.echo(f"jobcoord: error: {safe_text(err.message)}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; map every failure to its documented exit code, never a traceback (unless
    --debug for internal errors)."""
    args = list(sys.argv[1:] if argv is None else argv)
    _PARSED.clear()

    def modes() -> tuple[bool, bool]:
        # What click parsed, when it got that far; the argv scan only for what it did not.
        scanned = _flag_in_argv(args)
        return (_PARSED.get("as_json", scanned[0]), _PARSED.get("debug", scanned[1]))

    try:
        code = cli.main(args=args, prog_name="jobcoord", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        # Ctrl-C at a prompt or during a read: nothing half-done was committed.
        click.echo("jobcoord: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        err = InvalidInput("usage_error", e.format_message())
        _print_error(err, modes()[0])
        sys.exit(2)
    except JobcoordError as e:
        as_json, debug = modes()
        if debug and type(e) is JobcoordError:
            traceback.print_exc()
        _print_error(e, as_json)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        # The reader went away (e.g. `jobcoord jobs | head -1`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
    except KeyboardInterrupt:
        # Ctrl-C: every write is one transaction, so an interrupted one was rolled back.
        click.echo("jobcoord: interrupted", err=True)
        sys.exit(130)
    except Exception as e:
        as_json, debug = modes()
        if debug:
            traceback.print_exc()
        err = JobcoordError("internal_error", f"unexpected error: {type(e).__name__}: {e}"
                            + ("" if debug else " (rerun with --debug for the traceback)"))
        _print_error(err, as_json)
        sys.exit(1)
    # Without standalone mode click returns a command's exit code instead of exiting.
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["EXIT_CODES", "cli", "main"]
