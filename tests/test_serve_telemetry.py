"""`jobcoord serve` reports through its own /metrics and event lines: the framework's
OpenTelemetry hooks stay off even where a program has set up a tracer, meter or logger
provider (they looked those providers up on every request)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from jobcoord.db import Target
from tests.serve_procs import token

SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    from opentelemetry import _logs, metrics, trace

    asked = []

    # Providers of a program's own (what an SDK or a vendor installs), each recording
    # that it was asked for the instrument it hands out (the API's no-op one).
    class Tracers(trace.TracerProvider):
        def get_tracer(self, *a, **kw):
            asked.append("tracer")
            return trace.NoOpTracer()

    class Meters(metrics.MeterProvider):
        def get_meter(self, *a, **kw):
            asked.append("meter")
            return metrics.NoOpMeter("x")

    class Loggers(_logs.LoggerProvider):
        def get_logger(self, *a, **kw):
            asked.append("logger")
            return _logs.NoOpLogger("x")

    trace.set_tracer_provider(Tracers())
    metrics.set_meter_provider(Meters())
    _logs.set_logger_provider(Loggers())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from starlette.testclient import TestClient
    from jobcoord.http.app import create_app
    from jobcoord.service import Coordinator

    path, secret = sys.argv[1], sys.argv[2]
    with Coordinator.open(path) as coord, TestClient(create_app(coord, reap_every=0)) as http:
        head = {"Authorization": "Bearer " + secret}
        answers = [http.post("/v1/heartbeat", json={"readings": {}}, headers=head).status_code,
                   http.post("/v1/claims", json={"wait": 0}, headers=head).status_code,
                   http.post("/v1/claims", json={"wait": "x"}, headers=head).status_code,
                   http.get("/healthz").status_code]
    print(json.dumps({"answers": answers, "asked": asked}))
""")


def test_serve_never_asks_for_an_opentelemetry_provider_even_when_one_is_set(
        sqlite_target: Target) -> None:
    import json

    secret = token(sqlite_target, "w1", "worker", worker="w1")
    got = subprocess.run([sys.executable, "-c", SCRIPT, sqlite_target.sqlite_path, secret],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["answers"] == [200, 200, 400, 200], out
    assert out["asked"] == [], out
