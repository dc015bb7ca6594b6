"""`jobcoord metrics [--textfile PATH]`: the same figures as `serve`'s /metrics, for a
machine without `serve` (node_exporter's textfile collector reads PATH)."""

from __future__ import annotations

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
    from .errors import InvalidInput
    from .metrics import exposition, registry_for, write_textfile

    registry = registry_for(s.coordinator())
    if textfile is None:
        sys.stdout.write(exposition(registry).decode())
        sys.stdout.flush()
        return
    try:
        write_textfile(registry, textfile)
    except OSError as e:
        raise InvalidInput("invalid_input", f"cannot write {textfile}: {e.strerror}") from None
