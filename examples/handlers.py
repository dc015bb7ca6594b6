"""Example Python handlers: `jobcoord worker --app examples.handlers:app` (run from the
repository root). The tests use them; each shows one part of the handler API."""

from __future__ import annotations

import json
import os
import time

from examples import remote_service
from jobcoord.app import App, Cancelled, Context, PermanentError, Result

app = App()


@app.handler("summarize", timeout=60)
def summarize(payload: dict, ctx: Context) -> Result:
    """A result with the model and settings that produced it."""
    words = str(payload.get("text", "")).split()
    size = int(payload.get("pad", 0))
    return Result({"summary": " ".join(words[:5]), "words": len(words), "pad": "x" * size},
                  provenance={"model": "tiny-summarizer", "model_version": "0.1",
                              "settings": {"max_words": 5}})


@app.handler("sleepy", timeout=600)
def sleepy(payload: dict, ctx: Context) -> dict:
    """Works for `seconds`, stopping within 50 ms once told to; leaves a marker file saying why
    it stopped, so a test can see the handler itself was stopped."""
    marker = payload.get("marker")
    if marker:
        with open(marker + ".started", "w") as f:
            f.write(str(ctx.epoch))
    end = time.monotonic() + float(payload.get("seconds", 1))
    try:
        while time.monotonic() < end:
            ctx.sleep(0.05)
    except Cancelled as e:
        if marker:
            with open(marker, "w") as f:
                f.write(e.reason)
        raise
    return {"slept": payload.get("seconds", 1), "epoch": ctx.epoch}


@app.handler("stubborn", timeout=600)
def stubborn(payload: dict, ctx: Context) -> dict:
    """Ignores cancellation: its result, however late, must never be accepted."""
    time.sleep(float(payload.get("seconds", 1)))
    if payload.get("marker"):
        with open(payload["marker"], "w") as f:
            f.write(repr(time.time()))  # when it really returned
    return {"by": "stubborn", "epoch": ctx.epoch}


@app.handler("flaky", timeout=60)
def flaky(payload: dict, ctx: Context) -> dict:
    raise ValueError(f"model server refused the request (attempt {ctx.attempt})")


@app.handler("strict", timeout=60)
def strict(payload: dict, ctx: Context) -> dict:
    if "doc" not in payload:
        raise PermanentError("payload has no 'doc': retrying cannot help")
    return {"ok": True}


@app.handler("deadline_render", timeout=0.5, retry_on_timeout=False)
def deadline_render(payload: dict, ctx: Context) -> dict:
    """A budget that must not be retried: a timeout sends the job to dead."""
    while True:
        ctx.sleep(0.05)


@app.handler("render", timeout=120)
def render(payload: dict, ctx: Context) -> Result:
    """Seed 002: submit to a remote service once, record the remote id as a checkpoint, and on
    a later attempt resume watching that id instead of submitting again.

    The window between `submit` returning and the checkpoint committing is the one place a
    crash can lose the id; the remote call has no idempotency key, so that case needs an
    operator, not a blind resubmission."""
    remote = payload["remote_dir"]
    saved = ctx.checkpoints.get("remote_submitted")
    if saved is None:
        remote_id = remote_service.submit(remote, {"prompt": payload.get("prompt"),
                                                   "job_id": ctx.job_id})
        ctx.checkpoint("remote_submitted", {"remote_id": remote_id})
        resumed = False
    else:
        remote_id, resumed = saved["remote_id"], True
    with open(os.path.join(remote, f"watcher-{ctx.epoch}.pid"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        state = remote_service.status(remote, remote_id)
        if state["state"] == "done":
            return Result({"remote_id": remote_id, "output": state["output"],
                           "resumed": resumed},
                          provenance={"remote_service": "example", "remote_id": remote_id})
        ctx.sleep(0.05)


@app.handler("bad_result", timeout=60)
def bad_result(payload: dict, ctx: Context) -> object:
    """A handler bug: a result JSON cannot express."""
    return {"tags": {"a", "b"}}


@app.handler("noisy", timeout=60)
def noisy(payload: dict, ctx: Context) -> dict:
    """An error message no coordinator field would take as is."""
    raise RuntimeError("start\x00" + "x" * 100_000 + " the real cause is at the end")



@app.handler("overlap", timeout=60)
def overlap(payload: dict, ctx: Context) -> dict:
    """Ignores its stop and records when it really ran (one file per attempt, with its start
    and end), so a test can count how many handlers were alive at once."""
    path = os.path.join(payload["dir"], f"{ctx.job_id}-{ctx.epoch}.json")
    record = {"job_id": ctx.job_id, "epoch": ctx.epoch, "pid": os.getpid(),
              "start": time.time(), "end": None}
    with open(path, "w") as f:
        f.write(json.dumps(record))
    time.sleep(float(payload.get("seconds", 1)))
    record["end"] = time.time()
    with open(path, "w") as f:
        f.write(json.dumps(record))
    return {"epoch": ctx.epoch}
