"""Handlers for the worker attack tests: `--app tests.attack_app:app`."""

from __future__ import annotations

import os
import time
from typing import Any

from jobcoord.app import App, Context

app = App()


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@app.handler("note", timeout=60)
def note(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Sleep `s` seconds, then append "job epoch" to the `ledger` file."""
    time.sleep(float(payload.get("s", 0)))
    _append(payload["ledger"], f"{ctx.job_id} {ctx.epoch}")
    return {"job": ctx.job_id, "epoch": ctx.epoch}


@app.handler("ignore", timeout=60)
def ignore(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Ignores its stop: sleeps `s` seconds whatever happens, then appends to `ledger`."""
    time.sleep(float(payload.get("s", 1)))
    _append(payload["ledger"], f"{ctx.job_id} {ctx.epoch}")
    return {"job": ctx.job_id, "epoch": ctx.epoch}


@app.handler("boom", timeout=60)
def boom(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    raise RuntimeError(f"boom at attempt {ctx.attempt}")


@app.handler("big", timeout=60)
def big(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"x": "y" * int(payload.get("n", 1000))}


@app.handler("deep", timeout=60)
def deep(payload: dict[str, Any], ctx: Context) -> Any:
    """A result nested `depth` lists deep."""
    out: Any = []
    for _ in range(int(payload["depth"])):
        out = [out]
    return out


class _Unreadable:
    def __repr__(self) -> str:
        raise RuntimeError("no words for it")

    __str__ = __repr__


@app.handler("odd_provenance", timeout=60)
def odd_provenance(payload: dict[str, Any], ctx: Context) -> Any:
    """A result with a provenance that is no JSON: `how` says which way."""
    from jobcoord.app import Result

    how = payload["how"]
    if how == "tuple_key":
        reported: Any = {"k": {(1, 2): 1}}
    elif how == "big_int":
        reported = {"n": 10**5000}
    elif how == "deep":
        reported = {}
        for _ in range(3000):
            reported = {"x": reported}
    elif how == "list":
        reported = ["model", "v2"]
    elif how == "text":
        reported = "model v2"
    elif how == "pairs":  # what dict() takes: a provenance, as it always was
        return Result({"a": 1}, provenance=[("model", "v2")])
    else:
        reported = {"o": _Unreadable()}
    return Result({"a": 1}, provenance=reported)


@app.handler("chatty", timeout=60)
def chatty(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Prints to its standard output, as a library it calls may."""
    import subprocess
    import sys

    print("I am not JSON", flush=True)
    sys.stdout.write("nor this\n")
    sys.stdout.flush()
    subprocess.run([sys.executable, "-c", "print('a child says so too')"], check=True)
    return {"ok": True}
