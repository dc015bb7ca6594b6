"""A stand-in for a remote generation service (the pattern of seed 002), kept in a directory so
that separate worker processes see the same "remote" state.

`submit` is the non-idempotent POST: every call creates a new remote request with a new id.
`status` is the GET: a request is `done` once a file `<id>.done` exists (the test, or
`finish`, writes it), with the output the service produced.
"""

from __future__ import annotations

import json
import os


def submit(directory: str, payload: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    n = len([f for f in os.listdir(directory) if f.endswith(".request")]) + 1
    remote_id = f"R-{n}"
    with open(os.path.join(directory, f"{remote_id}.request"), "x", encoding="utf-8") as f:
        json.dump(payload, f)
    return remote_id


def submissions(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(f[: -len(".request")] for f in os.listdir(directory) if f.endswith(".request"))


def finish(directory: str, remote_id: str, output: str) -> None:
    with open(os.path.join(directory, f"{remote_id}.done"), "w", encoding="utf-8") as f:
        json.dump({"output": output}, f)


def status(directory: str, remote_id: str) -> dict:
    path = os.path.join(directory, f"{remote_id}.done")
    if not os.path.exists(path):
        return {"id": remote_id, "state": "running"}
    with open(path, encoding="utf-8") as f:
        return {"id": remote_id, "state": "done", **json.load(f)}
