"""JSON nesting over HTTP against a real `jobcoord serve`, on SQLite and PostgreSQL: every
endpoint that carries a JSON value (a payload, a result, a provenance, checkpoint data)
accepts exactly the values the Python API accepts, nested up to 64 levels, and refuses one
level more as the API does (400 `invalid_input`, nothing changed). The request body wraps
the value in levels of its own, which never count against the value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from jobcoord.db import Target
from jobcoord.errors import InvalidInput
from jobcoord.service import Coordinator
from tests.serve_procs import db_args, jobcoord_argv, served, token, token_file

LIMIT = 64


def chain(levels: int) -> dict[str, Any]:
    """Objects nested `levels` deep, the innermost holding a number."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def padded(levels: int) -> dict[str, Any]:
    """The same depth with more brackets than levels beside it (an empty list)."""
    return {"pad": [], "a": chain(levels - 1)}


SHAPES = {"chain": chain, "padded": padded}


class Case:
    """One endpoint's JSON value: POSTed over HTTP by `who` to `path` ({job} filled in) in
    the body `body(job, epoch, value)`, and given to the Python API by `api`."""

    def __init__(self, name: str, needs: str, who: str, path: str,
                 body: Callable[[int, int, Any], dict[str, Any]],
                 api: Callable[[Coordinator, int, int, Any], Any]):
        self.name, self.needs, self.api, self.body = name, needs, api, body
        self.who, self.path = who, path

    def http(self, h: dict[str, httpx.Client], job: int, epoch: int, value: Any
             ) -> httpx.Response:
        return h[self.who].post(self.path.format(job=job), json=self.body(job, epoch, value))


CASES = [
    Case("submit payload", "nothing", "sub", "/v1/jobs",
         lambda job, epoch, value: {"kind": "deep", "payload": value},
         lambda c, job, epoch, value: c.enqueue("deep", value)),
    Case("complete result", "lease", "worker", "/v1/jobs/{job}/complete",
         lambda job, epoch, value: {"epoch": epoch, "result": value},
         lambda c, job, epoch, value: c.complete(job, "wa", epoch, value)),
    Case("complete provenance", "lease", "worker", "/v1/jobs/{job}/complete",
         lambda job, epoch, value: {"epoch": epoch, "provenance": value},
         lambda c, job, epoch, value: c.complete(job, "wa", epoch, provenance=value)),
    Case("complete with claim_next", "lease", "worker", "/v1/jobs/{job}/complete",
         lambda job, epoch, value: {"epoch": epoch, "result": value, "claim_next": True},
         lambda c, job, epoch, value: c.complete_and_claim(job, "wa", epoch, value)),
    Case("checkpoint data", "lease", "worker", "/v1/jobs/{job}/checkpoint",
         lambda job, epoch, value: {"epoch": epoch, "name": "n", "data": value},
         lambda c, job, epoch, value: c.checkpoint(job, "wa", epoch, "n", value)),
    Case("reconcile result", "unknown", "op", "/v1/jobs/{job}/reconcile",
         lambda job, epoch, value: {"as": "succeeded", "reason": "checked", "result": value},
         lambda c, job, epoch, value: c.reconcile(job, "succeeded", "checked", result=value)),
]
# A batch of completions carries its values one level down, in an item.
CASES += [
    Case(f"completions {field}", "lease", "worker", "/v1/completions",
         lambda job, epoch, value, field=field: {"items": [{"job_id": job, "epoch": epoch,
                                                       field: value}]},
         lambda c, job, epoch, value, field=field: c.complete_many(
             [{"job_id": job, "worker_id": "wa", "epoch": epoch, field: value}]))
    for field in ("result", "provenance")
]


def prepare(c: Coordinator, needs: str) -> tuple[int, int]:
    """A job in the state the case needs: (job id, epoch)."""
    if needs == "nothing":
        return 0, 0
    job = c.enqueue("held", {})["job_id"]
    if needs == "lease":
        got = c.claim("wa", lease_s=300, kinds=["held"])
        assert got["job"]["job_id"] == job
        return job, got["lease"]["epoch"]
    got = c.claim("wa", lease_s=0.5, kinds=["held"])
    c.mark_effect(job, "wa", got["lease"]["epoch"])
    time.sleep(0.6)
    c.reap()
    assert c.show(job)["job"]["status"] == "unknown"
    return job, got["lease"]["epoch"]


def api_outcome(c: Coordinator, case: Case, value: Any) -> tuple[str, str]:
    job, epoch = prepare(c, case.needs)
    try:
        case.api(c, job, epoch, value)
    except InvalidInput as e:
        return e.code, e.message
    return "accepted", ""


def http_outcome(c: Coordinator, h: dict[str, httpx.Client], case: Case, value: Any
                 ) -> tuple[str, str, str]:
    job, epoch = prepare(c, case.needs)
    before = c.show(job)["job"]["status"] if job else None
    jobs_before = len(c.jobs(limit=1000)["jobs"])
    resp = case.http(h, job, epoch, value)
    if resp.status_code < 300:
        return "accepted", "", str(resp.status_code)
    err = resp.json()["error"]
    # Refused: nothing changed.
    if job:
        assert c.show(job)["job"]["status"] == before, case.name
    assert len(c.jobs(limit=1000)["jobs"]) == jobs_before, case.name
    return err["code"], err["message"], str(resp.status_code)


def test_every_json_value_over_http_is_held_to_the_apis_64_levels(target: Target) -> None:
    secrets = {"sub": token(target, "sub", "submitter"),
               "worker": token(target, "wa", "worker", worker="wa"),
               "op": token(target, "op", "operator")}
    seen = []
    with Coordinator.open(target) as c, served(target, "--reap-every", "0") as srv:
        c.heartbeat("wa", readings={"memory_used_pct": 5})
        h = {who: srv.client(secret) for who, secret in secrets.items()}
        try:
            for case in CASES:
                for shape, make in SHAPES.items():
                    for levels in (LIMIT, LIMIT + 1):
                        value = make(levels)
                        api = api_outcome(c, case, value)
                        http = http_outcome(c, h, case, value)
                        seen.append((case.name, shape, levels, api, http))
        finally:
            for client in h.values():
                client.close()
    wrong = []
    for name, shape, levels, api, http in seen:
        if levels == LIMIT:
            ok = api[0] == "accepted" and http[0] == "accepted"
        else:
            ok = (api[0] == http[0] == "invalid_input" and http[2] == "400"
                  and f"nested deeper than {LIMIT} levels" in api[1]
                  and f"nested deeper than {LIMIT} levels" in http[1])
        if not ok:
            wrong.append(f"{name} ({shape}, {levels} levels): API {api}, HTTP {http}")
    assert not wrong, "\n".join(wrong)


DEEP_CMD = """
import json, sys
sys.stdin.read()
value = 1
for _ in range(64):
    value = {"a": value}
print(json.dumps(value))
"""


def test_a_result_nested_64_levels_succeeds_on_a_remote_worker_as_on_a_local_one(
        target: Target, tmp_path: Path) -> None:
    (tmp_path / "deep_cmd.py").write_text(DEEP_CMD)
    secret = token(target, "wa", "worker", worker="wa")
    path = token_file(tmp_path, "worker token", secret)
    handler = ["--exec", f"deep={sys.executable} {tmp_path / 'deep_cmd.py'}",
               "--readings-override", '{"memory_used_pct": 10}', "--burst", "--json"]
    with Coordinator.open(target) as c:
        local = c.enqueue("deep", {}, max_attempts=1)["job_id"]
        done = subprocess.run([*jobcoord_argv(), *db_args(target), "worker", "--worker-id",
                               "wl", *handler], capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        remote = c.enqueue("deep", {}, max_attempts=1)["job_id"]
        with served(target, "--reap-every", "0") as srv:
            done = subprocess.run([*jobcoord_argv(), "worker", "--server", srv.url,
                                   "--token-file", path, *handler],
                                  capture_output=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            # And a checkpoint's data through --server, as a local checkpoint takes it.
            job = c.enqueue("held", {})["job_id"]
            epoch = c.claim("wa", lease_s=300, kinds=["held"])["lease"]["epoch"]
            data = json.dumps(chain(LIMIT))
            local_cp = subprocess.run(
                [*jobcoord_argv(), *db_args(target), "checkpoint", str(job), "--worker", "wa",
                 "--epoch", str(epoch), "--name", "n", "--data", data, "--json"],
                capture_output=True, timeout=60, check=False)
            assert local_cp.returncode == 0, local_cp.stdout + local_cp.stderr
            remote_cp = subprocess.run(
                [*jobcoord_argv(), "checkpoint", str(job), "--worker", "wa", "--epoch",
                 str(epoch), "--name", "m", "--data", data, "--server", srv.url,
                 "--token-file", path, "--json"],
                capture_output=True, timeout=60, check=False,
                env={k: v for k, v in os.environ.items() if k != "JOBCOORD_DB"})
            assert remote_cp.returncode == 0, remote_cp.stdout + remote_cp.stderr
        for job in (local, remote):
            shown = c.show(job)["job"]
            assert shown["status"] == "succeeded", shown["last_error"]
            assert shown["result"] == chain(LIMIT)
