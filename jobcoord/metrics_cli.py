"""`jobcoord metrics [--textfile PATH]`: the same figures as `serve`'s /metrics, for a
machine without `serve` (node_exporter's textfile collector reads PATH)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click


@click.command("metrics")
@click.option("--textfile", metavar="PATH",
              help="Write the exposition to PATH atomically (for node_exporter's textfile "
                   "collector: name it *.prom) instead of stdout.")
@click.pass_obj
def metrics(s: Any, textfile: str | None) -> None:
    """Print the Prometheus metrics computed from the database (docs/metrics.md)."""
    from .artifacts.files import dest_error
    from .metrics import exposition, registry_for, write_textfile

    coordinator = s.coordinator()
    if textfile is not None:
        textfile = _textfile(coordinator, textfile)
    registry = registry_for(coordinator)
    if textfile is None:
        sys.stdout.write(exposition(registry).decode())
        sys.stdout.flush()
        return
    try:
        write_textfile(registry, textfile)
    except OSError as e:
        # Its directory not there, the disk full, no permission: the destination is
        # unavailable (exit 6, as for `backup` and `artifact get -o`), not a bad argument.
        raise dest_error(e, textfile) from None


def _textfile(coordinator: Any, textfile: str) -> str:
    """Where the textfile may go: never the database or a file SQLite keeps beside it, nor
    inside the artifact store (a typo replaced the database with the exposition, exit 0),
    nor a directory, a pipe or a device. An existing file is replaced: that is the point.
    Bad: InvalidInput (exit 2), nothing written."""
    from .artifacts.settings import store_root
    from .errors import InvalidInput
    from .maintenance import writable_destination

    if textfile.endswith(os.sep):
        raise InvalidInput("invalid_input", f"--textfile {textfile} names a directory (it "
                           "ends in /); name the file")
    if textfile == "-":
        raise InvalidInput("invalid_input", "--textfile names a file; leave it out to print "
                           "the metrics on stdout")
    try:
        store: str | None = store_root(coordinator.db, coordinator.artifacts_dir)
    except InvalidInput:
        store = None  # PostgreSQL without a store: there is none to protect
    return writable_destination(textfile, force=True,
                                database=coordinator.db.target.sqlite_path,
                                what="the metrics textfile", store=store)
