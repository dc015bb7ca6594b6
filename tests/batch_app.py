"""Handlers for the batched worker tests: `--app tests.batch_app:app`."""

from __future__ import annotations

import os
import time
from typing import Any

from jobcoord.app import App, Context

app = App()


@app.handler("note", timeout=60)
def note(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Sleep `s` seconds, then append "job epoch" to the `ledger` file (one write, O_APPEND):
    which attempts ran their handler to the end."""
    time.sleep(float(payload.get("s", 0)))
    fd = os.open(payload["ledger"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{ctx.job_id} {ctx.epoch}\n".encode())
    finally:
        os.close(fd)
    return {"job": ctx.job_id, "epoch": ctx.epoch}
