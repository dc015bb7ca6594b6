"""The entry point: run the command group and map every failure (the exception hierarchy of
errors.py, click's usage errors, Ctrl-C, a closed pipe) to its documented exit code, in this
one place."""

from __future__ import annotations

import errno
import sys
import traceback
from typing import Any

import click

from ..errors import Interrupted, InvalidInput, JobcoordError
from ..http.commands import register as register_http

# Importing the command modules registers their commands on the group.
from . import artifacts, jobs, leases, limits, runtime, schedules, storage  # noqa: F401
from .group import cli
from .output import (
    PARSED,
    drop_output,
    dump,
    reader_gone,
    result_out,
    safe_text,
    unless_gone,
    unwritable,
)

register_http(cli)  # serve, token, and worker --server (jobcoord/http/commands.py)


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
    result_out()
    if as_json:
        with unless_gone(reporting=True):
            click.echo(dump(err.to_json()))
    # One line on stderr whatever the message echoes (a path, a value): data cannot add one.
    with unless_gone(err=True, reporting=True):
        click.echo(f"jobcoord: error: {safe_text(err.message)}", err=True)


def _interrupted(as_json: bool) -> None:
    result_out()  # the command's answer, as a refusal is: a signal from here on ends nothing
    if as_json:
        with unless_gone(reporting=True):
            click.echo(dump(Interrupted("interrupted", "interrupted (Ctrl-C); the write "
                                        "under way, if any, was rolled back").to_json()))
    with unless_gone(err=True, reporting=True):
        click.echo("jobcoord: interrupted", err=True)
    sys.exit(130)


def interrupted_before_parsing(argv: list[str]) -> None:
    """A Ctrl-C that came while the CLI's modules loaded (jobcoord/start.py)."""
    _interrupted(_flag_in_argv(argv)[0])


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; map every failure to its documented exit code, never a traceback (unless
    --debug for internal errors)."""
    args = list(sys.argv[1:] if argv is None else argv)
    PARSED.clear()

    def modes() -> tuple[bool, bool]:
        # What click parsed, when it got that far; the argv scan only for what it did not.
        scanned = _flag_in_argv(args)
        return (PARSED.get("as_json", scanned[0]), PARSED.get("debug", scanned[1]))

    try:
        code = _run(args)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt, EOFError):
        # Ctrl-C (at a prompt, during a read, anywhere): every write is one transaction, so
        # the one under way was rolled back. --json still gets its one object.
        _interrupted(modes()[0])
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
    except OSError as e:
        if reader_gone(e):
            # The reader went away while the command printed (`jobcoord metrics | head -1`,
            # `--help` into a closed terminal): not an error of ours, and nothing but
            # printing was left to do (results and refusals are printed by `emit`, which
            # drops them).
            drop_output()
            sys.exit(0)
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise _internal(e, *modes()) from None
        # A full disk, whatever was written to it (`metrics > m.prom`): storage unavailable.
        drop_output()
        err = unwritable(e, "the output")
        _print_error(err, modes()[0])
        sys.exit(err.exit_code)
    except Exception as e:
        raise _internal(e, *modes()) from None
    sys.exit(code if isinstance(code, int) else 0)


def _run(args: list[str]) -> Any:
    """click's own `main` less its handling of a closed pipe (it exits 1 there, the
    command's exit code lost): every failure is mapped in `main`."""
    with cli.make_context("jobcoord", args) as ctx:
        return cli.invoke(ctx)


def _internal(e: Exception, as_json: bool, debug: bool) -> SystemExit:
    if debug:
        traceback.print_exception(e)
    err = JobcoordError("internal_error", f"unexpected error: {type(e).__name__}: {e}"
                        + ("" if debug else " (rerun with --debug for the traceback)"))
    _print_error(err, as_json)
    return SystemExit(1)
