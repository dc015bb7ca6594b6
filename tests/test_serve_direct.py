"""The direct way through a worker's hot routes (jobcoord/http/direct.py) answers exactly as
the framework's way does: the same statuses, the same bodies, the same changes, for requests
it answers itself and for those it hands back (a bad body, a missing token, a query)."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

with warnings.catch_warnings():  # it names a client package to prefer; this one works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from jobcoord import tokens
from jobcoord.http import routes_worker
from jobcoord.http.app import create_app
from jobcoord.http.direct import DirectLane, plan
from jobcoord.service import Coordinator

from .conftest import dump

_TIME = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+Z?")


def _timeless(value: Any) -> Any:
    """A value with its times (which differ between two runs a moment apart) blanked."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_timeless(v) for v in value)
    if isinstance(value, str):
        return _TIME.sub("<time>", value)
    if isinstance(value, float) and value > 1e9:  # seconds since 1970
        return "<time>"
    if isinstance(value, int) and not isinstance(value, bool) and value > 10**14:
        return "<time>"  # microseconds since 1970
    return value


@pytest.fixture
def twin_dbs(sqlite_template: str, tmp_path: Any
             ) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Two copies of one database: jobs waiting, a token of each kind (the same secrets in
    both)."""
    first = str(tmp_path / "one.db")
    shutil.copyfile(sqlite_template, first)
    with Coordinator.open(first) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i}, "max_attempts": 3}
                        for i in range(8)])
        secrets = {name: tokens.create(c.db, name, role, worker=worker)["token"]
                   for name, role, worker in (("w1", "worker", "w1"), ("w2", "worker", "w2"),
                                              ("sub", "submitter", None))}
    second = str(tmp_path / "two.db")
    shutil.copyfile(first, second)
    yield first, second, secrets


def _run(path: str, secrets: dict[str, str], direct: bool
         ) -> tuple[list[tuple[int, Any]], dict[str, Any]]:
    """One worker's life through every hot route, good requests and bad: each answer, then
    every row the database holds."""
    answers: list[tuple[int, Any]] = []
    with Coordinator.open(path) as c, TestClient(create_app(c, reap_every=0, direct=direct),
                                                 raise_server_exceptions=False) as client:
        def post(url: str, body: Any = None, who: str = "w1", raw: bytes | None = None,
                 headers: dict[str, str] | None = None) -> Any:
            sent = {"Authorization": f"Bearer {secrets[who]}",
                    "Content-Type": "application/json", **(headers or {})}
            content = raw if raw is not None else (b"" if body is None
                                                   else json.dumps(body).encode())
            r = client.post(url, content=content, headers=sent)
            got = r.json() if r.content else None
            answers.append((r.status_code, got))
            return got

        post("/v1/heartbeat", {"readings": {"memory_used_pct": 5.0}, "kinds": ["k"]})
        post("/v1/heartbeat", {"readings": {"memory_used_pct": 5.0}}, who="w2")
        first = post("/v1/claims", {"wait": 0})
        job, epoch = first["job"]["job_id"], first["lease"]["epoch"]
        post(f"/v1/jobs/{job}/renew", {"epoch": epoch, "lease_s": 60})
        post(f"/v1/jobs/{job}/checkpoint", {"epoch": epoch, "name": "c", "data": {"x": 1}})
        post(f"/v1/jobs/{job}/effect", {"epoch": epoch})
        post(f"/v1/jobs/{job}/renew", {"epoch": epoch}, who="w2")  # not its lease: 404
        post(f"/v1/jobs/{job}/renew", {"epoch": epoch + 7})  # an epoch it never held
        both = post(f"/v1/jobs/{job}/complete", {"epoch": epoch, "result": {"ok": True},
                                                  "claim_next": True, "lease_s": 30})
        post(f"/v1/jobs/{job}/complete", {"epoch": epoch, "result": {"ok": True},
                                          "claim_next": True})  # sent again: accepted
        post(f"/v1/jobs/{job}/complete", {"epoch": epoch, "result": {"other": 1}})
        nxt, nepoch = both["next"]["job"]["job_id"], both["next"]["lease"]["epoch"]
        post(f"/v1/jobs/{nxt}/fail", {"epoch": nepoch, "error": "flaky"})
        post(f"/v1/jobs/{nxt}/fail", {"epoch": nepoch, "error": "flaky"})  # again
        group = post("/v1/claims", {"n": 3, "lease_s": 45})
        items = [{"job_id": g["job"]["job_id"], "epoch": g["lease"]["epoch"],
                  "result": {"n": g["job"]["job_id"]}} for g in group["claimed"]]
        post("/v1/completions", {"items": [*items, {"job_id": 10**6, "epoch": 1}]})
        post("/v1/completions", {"items": items[:1]})  # sent again
        post("/v1/claims")  # no body at all: a claim with every default
        post("/v1/claims", {"kinds": ["nothing-of-this-kind"]})
        post("/v1/jobs/999999/complete", {"epoch": 1})
        # Handed to the framework's way: each is answered as it always was.
        post("/v1/claims", raw=b"{not json")
        post("/v1/claims", {"wait": "1"})
        post("/v1/claims", {"surprise": 1})
        post("/v1/claims", {"wait": 0}, who="sub")
        post("/v1/claims", {"wait": 0}, headers={"Authorization": "Basic abc"})
        post("/v1/claims?wait=1", {"wait": 0})
        post("/v1/jobs/0/renew", {"epoch": 1})
        post("/v1/jobs/1.0/renew", {"epoch": 1})
        post(f"/v1/jobs/{2**63}/renew", {"epoch": 1})
        post("/v1/jobs/%201/renew", {"epoch": 1})
        post(f"/v1/jobs/{job}/complete", raw=b'{"epoch": 1, "epoch": 2}')
        post(f"/v1/jobs/{job}/complete", raw=b'{"epoch": NaN}')
        post(f"/v1/jobs/{job}/complete", {"epoch": True})
        post(f"/v1/jobs/{job}/complete", {"epoch": 1, "lease_s": 5})
        post(f"/v1/jobs/{job}/complete", None)
        post("/v1/heartbeat", raw=b"[1]")
        twice = client.post("/v1/heartbeat", content=b"{}", headers=[
            ("Authorization", f"Bearer {secrets['w1']}"),
            ("Authorization", f"Bearer {secrets['w2']}")])
        answers.append((twice.status_code, twice.json()))
        post("/v1/completions", {"items": []})
        rows = dump(c)
    return answers, rows


def test_the_direct_way_answers_every_request_as_the_framework_does(
        twin_dbs: tuple[str, str, dict[str, str]]) -> None:
    one, two, secrets = twin_dbs
    direct, direct_rows = _run(one, secrets, direct=True)
    framework, framework_rows = _run(two, secrets, direct=False)
    assert len(direct) == len(framework) > 30
    for i, (a, b) in enumerate(zip(direct, framework, strict=True)):
        assert _timeless(a) == _timeless(b), f"request {i}"
    assert _timeless(direct_rows) == _timeless(framework_rows)
    # Not a run where nothing happened: jobs were finished and refusals said.
    statuses = {status for status, _ in direct}
    assert {200, 400, 401, 403, 404, 409} <= statuses


def test_every_worker_route_has_a_direct_answer() -> None:
    """A route that loses its direct answer (a parameter the direct way does not make) goes
    the framework's slower way unnoticed: this says so."""
    posted = [r for r in routes_worker.router.routes if "POST" in getattr(r, "methods", ())]
    assert len(posted) >= 8
    for route in posted:
        assert plan(route) is not None, route.path
    lane = DirectLane(None, routes_worker.router.routes, on_error=lambda e: None)
    assert len(lane.routes) == len(posted)
