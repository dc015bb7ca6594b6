"""What the CLI prints: one JSON object in JSON mode (and which mode was asked for), or text
for people with every piece of data escaped so it cannot forge a line."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import click

from ..errors import StorageUnavailable
from ..text import safe_text


def dump(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, sort_keys=False)


#: What the program (jobcoord/start.py) does as a command's result is about to be printed.
AT_RESULT: list[Callable[[], None]] = []


def emit(as_json: bool, payload: dict[str, Any], text: str | Callable[[], str] | None = None,
         code: int = 0) -> None:
    """Print the result (one JSON object, or text for people) and exit with `code`."""
    result_out()
    with unless_gone():
        if as_json:
            click.echo(dump(payload))
        else:
            click.echo(text() if callable(text) else text if text is not None
                       else _human(payload))
    if code:
        raise click.exceptions.Exit(code)


@contextlib.contextmanager
def unless_gone(err: bool = False, *, reporting: bool = False) -> Iterator[None]:
    """Print to a stream whose reader may be gone: a closed terminal (EIO: a worker whose
    terminal closed printed its summary there) or a closed pipe (EPIPE). What cannot be
    printed is dropped, and the stream pointed at /dev/null so the interpreter's own flush
    at exit cannot fail; the command's work is done and its exit code stands. It ended exit
    1 as an internal error.

    A stream that cannot be written otherwise (a full disk under `> out.json`) lost what a
    reader is waiting for: StorageUnavailable (exit 6), unless what is printed is already
    that report (`reporting`), which then is dropped."""
    stream = sys.stderr if err else sys.stdout
    try:
        yield
        stream.flush()
    except OSError as e:
        drop_output(stream)
        if reader_gone(e) or reporting:
            return
        raise unwritable(e, "stderr" if err else "stdout") from None


def unwritable(e: OSError, where: str) -> StorageUnavailable:
    return StorageUnavailable("output_unwritable", f"cannot write to {where}: "
                              f"{e.strerror or e}; what the command did is done (`show`, "
                              "`jobs` tell)")


@contextlib.contextmanager
def stdout_for_the_result(as_json: bool) -> Iterator[int]:
    """With --json, stdout is for the command's one JSON object: while the block runs (a
    worker's handlers), what is printed to it goes to stderr instead, the handlers' own
    `print` and the processes they start included (file descriptor 1 points at stderr).
    A Python handler's print came before the worker's summary, and `--json` was no JSON.
    Yields the descriptor of the real stdout, for a line the block must write there (a
    forced exit's)."""
    if not as_json:
        yield 1
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    try:
        saved = os.dup(1)  # not inherited: no child holds the real stdout open
    except OSError:
        yield 1
        return
    try:
        os.dup2(2, 1)
        yield saved
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def result_out() -> None:
    """A result or a refusal is about to be printed: what the program does from then on (a
    Ctrl-C ends nothing) holds for both, since a refusal is the command's answer too."""
    for hook in AT_RESULT:
        hook()


def say(text: str) -> None:
    """One line of progress (the demo's, serve's events) that goes on when its reader is
    gone (`demo | head -c0` stopped the demo at its first line) or its disk is full, as
    the worker's log does: progress is not the result."""
    with unless_gone(reporting=True):
        click.echo(text)


def reader_gone(e: OSError) -> bool:
    return e.errno in (errno.EIO, errno.EPIPE)


def drop_output(stream: TextIO | None = None) -> None:
    """Point `stream` (stdout by default) at /dev/null: what is still buffered, and what is
    printed from now on, goes nowhere, and the interpreter's own flush at exit cannot fail."""
    stream = stream or sys.stdout
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


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
        return safe_text(dump(val))
    return "-" if val is None else safe_text(val)


#: What click parsed for the running command, read by `main` when an error escapes it.
#: --json is decided by the parser, never by looking for the text in argv: in
#: `enqueue k --key --json` it is the idempotency key, not a switch.
PARSED: dict[str, bool] = {}


def note_flag(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    PARSED[param.name or ""] = bool(value)
    return value


json_option = click.option("--json", "as_json", is_flag=True, callback=note_flag,
                           help="Print exactly one JSON object on stdout.")
