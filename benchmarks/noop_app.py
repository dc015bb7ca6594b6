"""Handlers for the worker-runtime benchmarks: `--app benchmarks.noop_app:app`."""

from __future__ import annotations

import time
from typing import Any

from jobcoord.app import App, Context

app = App()


@app.handler("noop")
def noop(payload: Any, ctx: Context) -> dict[str, Any]:
    """Does nothing: what is measured is the runtime around it."""
    return {}


@app.handler("stamp")
def stamp(payload: Any, ctx: Context) -> dict[str, Any]:
    """The wall-clock time the handler started (for the pickup latency)."""
    return {"started": time.time()}
