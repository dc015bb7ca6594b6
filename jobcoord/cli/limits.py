"""The `jobcoord limit` commands: set, ls, rm. No rules live here (core/limits.py)."""

from __future__ import annotations

from typing import Any

import click

from .group import Settings, cli
from .output import emit, json_option, safe_text


@cli.group("limit")
def limit() -> None:
    """Concurrency limits: at most N running jobs of a kind at once, across every worker."""


@limit.command("set")
@click.argument("kind")
@click.option("--concurrency", required=True, metavar="N",
              help="At most N live leases of KIND at once (1..100000).")
@click.option("--key", metavar="FIELD", default=None,
              help="Count per value of this top-level payload field instead.")
@json_option
@click.pass_obj
def set_(s: Settings, kind: str, concurrency: str, key: str | None, as_json: bool) -> None:
    """Limit KIND to N running jobs at once (replaces its limit if it had one)."""
    out = s.coordinator().set_limit(kind, concurrency, key=key)
    emit(as_json, out, lambda: f"limit {safe_text(out['kind'])}: at most "
         f"{out['concurrency']} at once" + (f" per {safe_text(out['key'])}"
                                            if out["key"] else ""))


@limit.command("ls")
@json_option
@click.pass_obj
def ls(s: Settings, as_json: bool) -> None:
    """Every limit, with the jobs holding its slots now."""
    out = s.coordinator().limits()

    def text() -> str:
        if not out["limits"]:
            return "no limits"
        return "\n".join(_line(lim) for lim in out["limits"])

    emit(as_json, out, text)


def _line(lim: dict[str, Any]) -> str:
    per = f" per {safe_text(lim['key'])}" if lim["key"] else ""
    held = ", ".join(f"job {h['job_id']} on {safe_text(h['worker_id'])}"
                     for h in lim["holders"]) or "none"
    return (f"{safe_text(lim['kind'])}: {lim['running']} running, at most "
            f"{lim['concurrency']}{per}; held by {held}")


@limit.command("rm")
@click.argument("kind")
@json_option
@click.pass_obj
def rm(s: Settings, kind: str, as_json: bool) -> None:
    """Remove KIND's limit (exit 4 if it has none)."""
    out = s.coordinator().remove_limit(kind)
    emit(as_json, out, lambda: f"limit {safe_text(out['kind'])} removed")
