"""The `jobcoord` command group: its global options, the `Settings` they make (which open the
Coordinator lazily), and the options and input readers that commands share."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from .. import __version__
from ..errors import InvalidInput
from .output import note_flag

#: `claim` found nothing to claim (the reason is printed).
EXIT_NOTHING_TO_CLAIM = 3


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing NaN: NaN compares false with every bound, so it passed
    the range check (`serve --upload-idle nan` answered nothing, `--reap-every nan` never
    reaped). Infinity is outside every finite range already."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number != number:  # NaN, the one float unequal to itself
            self.fail(f"{value!r} is not a number in the range {self._describe_range()}.",
                      param, ctx)
        return number


@dataclass
class Settings:
    """The global options of one invocation; the Coordinator is opened on first use, so a
    command that needs no database (or fails its input checks) never opens one."""

    db: str | None
    url: str | None
    policy_path: str | None
    synchronous: str
    busy_timeout: float
    debug: bool
    _coordinator: Any = None
    artifacts: str | None = None  # --artifacts DIR / JOBCOORD_ARTIFACTS

    def busy_timeout_given(self) -> bool:
        """Whether --busy-timeout (or JOBCOORD_BUSY_TIMEOUT) was given, not defaulted."""
        ctx = click.get_current_context().find_root()
        source = ctx.get_parameter_source("busy_timeout")
        return source not in (None, click.core.ParameterSource.DEFAULT)

    def target(self) -> Any:
        from ..store import resolve_target

        return resolve_target(db=self.db, url=self.url)

    def policy(self) -> Any:
        from ..policy import Policy

        if self.policy_path == "":
            # An empty JOBCOORD_POLICY means no policy; an empty --policy is a mistyped
            # command (a variable that was not set), not a request for the defaults.
            ctx = click.get_current_context().find_root()
            if ctx.get_parameter_source("policy_path") is click.core.ParameterSource.COMMANDLINE:
                from ..errors import InvalidInput

                raise InvalidInput("invalid_input", "--policy must name a TOML file, not an "
                                   "empty path (leave it out for the default policy)")
        return Policy.from_toml(self.policy_path) if self.policy_path else Policy()

    def coordinator(self) -> Any:
        if self._coordinator is None:
            from ..coordinator import Coordinator

            self._coordinator = Coordinator.open(
                self.target(), policy=self.policy(), synchronous=self.synchronous,
                busy_timeout=self.busy_timeout)
            self._coordinator.artifacts_dir = self.artifacts
        return self._coordinator

    def close(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()


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


def json_text(raw: str | bytes) -> bytes:
    """JSON text from the command line as bytes: the Python API reads a `str` result or
    checkpoint as a string value, bytes as JSON text. Undecodable arguments keep their bytes
    (surrogateescape), so the check names them as invalid UTF-8."""
    return raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")


def read_json_source(inline: str | None, path: str | None, field: str, limit: int,
                      too_large_code: str) -> str | bytes | None:
    """--x JSON or --x-file PATH|- (stdin), read with a size bound: never more than
    limit + 1 bytes, and a source with more is refused here, with its size when a regular
    file says it (a pipe does not)."""
    from ..validate import too_large

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
@click.option("--busy-timeout", type=FiniteFloatRange(0.0, 600.0), default=5.0,
              envvar="JOBCOORD_BUSY_TIMEOUT", show_default=True,
              help="Seconds each try of a transaction waits for a locked database; a busy "
                   "one is tried up to 4 times (about 4x this in all) before exit 5.")
@click.option("--debug", is_flag=True, callback=note_flag,
              help="Show tracebacks for internal errors.")
@click.option("--artifacts", "artifacts", envvar="JOBCOORD_ARTIFACTS", metavar="DIR",
              help="Artifact store directory (env JOBCOORD_ARTIFACTS; SQLite default: "
                   "<db>.artifacts; PostgreSQL: required).")
@click.version_option(__version__, prog_name="jobcoord")
@click.pass_context
def cli(ctx: click.Context, db: str | None, url: str | None, policy_path: str | None,
        synchronous: str, busy_timeout: float, debug: bool, artifacts: str | None) -> None:
    """jobcoord: a durable job coordinator. Leases, fencing epochs and resource gates on
    one SQLite file, or PostgreSQL."""
    settings = Settings(db, url, policy_path, synchronous, busy_timeout, debug,
                        artifacts=artifacts)
    ctx.obj = settings
    ctx.call_on_close(settings.close)
