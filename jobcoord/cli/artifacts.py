"""The `jobcoord artifact` commands: put, get, ls, verify, gc. No rules live here (rules.py)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import InvalidInput
from .group import cli
from .output import emit, json_option, safe_text


def _coord(s: Any) -> Any:
    return s.coordinator()


@cli.group("artifact")
def artifact() -> None:
    """Large results in the content-addressed artifact store (`migrate --with artifacts`)."""


@artifact.command("put")
@click.argument("job_id", metavar="JOB")
@click.argument("source", metavar="FILE|-")
@click.option("--worker", required=True, help="The worker holding the lease.")
@click.option("--epoch", required=True, help="The lease epoch returned by claim.")
@click.option("--name", required=True, help="The artifact's name (one path component).")
@click.option("--media-type", default=None, help="e.g. application/pdf (default: guessed "
              "from the name, else application/octet-stream).")
@click.option("--tenant", default=None, help="Act only within this tenant.")
@json_option
@click.pass_obj
def put(s: Any, job_id: str, source: str, worker: str, epoch: str, name: str,
        media_type: str | None, tenant: str | None, as_json: bool) -> None:
    """Stage FILE (or stdin) as artifact NAME of the attempt (JOB, EPOCH) held by WORKER.

    The bytes are stored first; the row is written only under the live lease. The artifact
    becomes part of the result when that attempt's completion is accepted."""
    src: Any = sys.stdin.buffer if source == "-" else source
    result = _coord(s).put_artifact(job_id, worker, epoch, name, src, media_type,
                                    tenant=tenant)
    emit(as_json, result, lambda: f"staged {safe_text(result['name'])} "
                f"{result['digest']} ({result['size']} bytes) for job {result['job_id']} "
                f"epoch {result['epoch']}")


@artifact.command("get")
@click.argument("job_id", metavar="JOB")
@click.argument("name")
@click.option("-o", "--output", "output", default=None, metavar="FILE",
              help="Write here (verified before it gets its name). Default, or -: stdout.")
@click.option("--force", is_flag=True,
              help="Replace FILE if it exists (never the database's own files).")
@json_option
@click.pass_obj
def get(s: Any, job_id: str, name: str, output: str | None, force: bool,
        as_json: bool) -> None:
    """Copy an accepted artifact out, verifying its size and digest.

    With -o, FILE appears only once the bytes matched (exit 7 and nothing written on a
    missing or corrupt object). To stdout the bytes flow as they are read and a mismatch is
    reported at the end (exit 7): use -o when the bytes must not be acted on unverified.
    An existing FILE is replaced only with --force; the database's own files, directories,
    devices and pipes never (exit 2)."""
    c = _coord(s)
    if output == "-":  # stdout, as `put`'s `-` is stdin (a file named so: `-o ./-`)
        output = None
    if output is not None:
        result = c.get_artifact(job_id, name, output, force=force)
        emit(as_json, result, lambda: f"wrote {safe_text(output)} "
                    f"({result['size']} bytes, {result['digest']})")
        return
    if as_json:
        raise InvalidInput("invalid_input", "--json needs -o FILE (stdout carries the bytes)")
    out = sys.stdout.buffer
    from ..artifacts import rules  # here: the other commands never load the artifact rules

    with rules.open_artifact(c, job_id, name) as reader:
        for chunk in reader:
            out.write(chunk)
    out.flush()


@artifact.command("ls")
@click.argument("job_id", metavar="[JOB]", required=False)
@click.option("--all", "all_states", is_flag=True,
              help="Every stage (staged, verified, rejected too), not only accepted ones.")
@click.option("--tenant", default=None, help="Act only within this tenant.")
@json_option
@click.pass_obj
def ls(s: Any, job_id: str | None, all_states: bool, tenant: str | None, as_json: bool) -> None:
    """List a job's accepted artifacts (or every job's)."""
    result = _coord(s).artifacts(job_id, all_states=all_states, tenant=tenant)

    def table() -> str:
        rows = [f"{'job':>8} {'epoch':>5} {'state':<9} {'size':>12}  digest  name"]
        for a in result["artifacts"]:
            rows.append(f"{a['job_id']:>8} {a['epoch']:>5} {a['state']:<9} {a['size']:>12}  "
                        f"{a['digest'][:19]}...  {safe_text(a['name'])}")
        return "\n".join(rows)
    emit(as_json, result, table)


@artifact.command("verify")
@click.argument("job_id", metavar="[JOB]", required=False)
@click.option("--all", "all_jobs", is_flag=True, help="Every job's artifacts.")
@json_option
@click.pass_obj
def verify(s: Any, job_id: str | None, all_jobs: bool, as_json: bool) -> None:
    """Re-hash the stored objects of JOB's artifacts (or --all); exit 7 on a problem."""
    if (job_id is None) == (not all_jobs):
        raise InvalidInput("invalid_input", "give JOB or --all (one of them)")
    result = _coord(s).verify_artifacts(job_id)
    emit(as_json, result, code=0 if result["ok"] else 7)


@artifact.command("gc")
@click.option("--grace", default="1h", show_default=True, metavar="AGE",
              help="Keep unreferenced objects younger than this (uploads in flight).")
@click.option("--dry-run", is_flag=True, help="Say what would go; delete nothing.")
@json_option
@click.pass_obj
def gc(s: Any, grace: str, dry_run: bool, as_json: bool) -> None:
    """Delete objects no artifact row references, older than the grace, and dead uploads'
    temporary files. Never a referenced object, never a young one."""
    from jobcoord import validate as v

    grace_s = v.safe_duration(grace, "grace", 0, 10 * 365 * 86400)
    result = _coord(s).gc_artifacts(grace_s=grace_s, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    emit(as_json, result, lambda: (
        f"{verb} {result['objects_removed']} objects ({result['bytes_removed']} bytes), "
        f"{result['temp_files_removed']} temporary files; kept {result['referenced']} "
        f"referenced and {result['kept_young']} younger than the grace"))
