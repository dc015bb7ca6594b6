"""Handlers the remote-worker tests run (`--app tests.serve_app:app`)."""

from __future__ import annotations

from typing import Any

from jobcoord.app import App, Context

app = App()


@app.handler("work")
def work(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"i": payload.get("i"), "epoch": ctx.epoch, "worker": ctx.worker_id}


@app.handler("slow")
def slow(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    # Checkpoints and effects go through the remote coordinator too.
    ctx.checkpoint("started", {"i": payload.get("i")})
    ctx.sleep(float(payload.get("sleep", 1.0)))
    return {"i": payload.get("i"), "epoch": ctx.epoch}


@app.handler("boom")
def boom(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    raise RuntimeError(f"boom {payload.get('i')}")
