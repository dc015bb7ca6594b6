"""A real client: Debian's `prometheus` scrapes a running `jobcoord serve` (with the
metrics-only token), a PromQL query through its HTTP API returns the queue age the database
implies, and `promtool check rules` accepts the alert rules of docs/metrics.md."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from typing import Any

import httpx
import pytest

from jobcoord.clock import MICROS
from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.sql import sql

from .serve_procs import served

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def alert_rules() -> str:
    """The ```yaml block of docs/metrics.md that holds the rule groups."""
    with open(os.path.join(ROOT, "docs", "metrics.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "groups:" in b]
    assert len(blocks) == 1, "docs/metrics.md must hold exactly one block of alert rules"
    return blocks[0]


@pytest.mark.skipif(PROMTOOL is None, reason="needs Debian's prometheus (.ci/run installs it)")
def test_promtool_accepts_the_three_alert_rules_in_the_docs(tmp_path: Any) -> None:
    rules = alert_rules()
    assert len(re.findall(r"^\s+- alert: ", rules, re.M)) == 3
    path = tmp_path / "rules.yml"
    path.write_text(rules)
    assert PROMTOOL is not None
    got = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "3 rules found" in got.stdout
    # promtool is not a rubber stamp: a broken expression is refused.
    path.write_text(rules.replace("jobcoord_unknown_jobs > 0", "jobcoord_unknown_jobs >"))
    bad = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus (.ci/run installs it)")
def test_prometheus_scrapes_serve_and_promql_returns_the_queue_age(
        sqlite_target: Target, tmp_path: Any) -> None:
    with Coordinator.open(sqlite_target) as c:
        first = c.enqueue("summarize", {"doc": 1})["job_id"]
        c.enqueue("summarize", {"doc": 2})
        created_us = c.db.read(lambda conn: sql(
            conn, "SELECT created_at FROM jobs WHERE job_id = :id", {"id": first}
        ).scalar_one())
    secret = "prom-" + "x" * 32
    (tmp_path / "token").write_text(secret)
    (tmp_path / "rules.yml").write_text(alert_rules())
    with served(sqlite_target, "--reap-every", "0",
                env={"JOBCOORD_METRICS_TOKEN": secret}) as s:
        target = s.url.removeprefix("http://")
        (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{tmp_path / 'rules.yml'}"]
scrape_configs:
  - job_name: jobcoord
    authorization: {{type: Bearer, credentials_file: "{tmp_path / 'token'}"}}
    static_configs: [{{targets: ["{target}"]}}]
""")
        port = _free_port()
        assert PROMETHEUS is not None
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "wb"))  # noqa: SIM115
        try:
            api = f"http://127.0.0.1:{port}/api/v1"
            deadline = time.monotonic() + 60
            result: list[Any] = []
            while time.monotonic() < deadline:
                try:
                    r = httpx.get(api + "/query", params={
                        "query": 'jobcoord_oldest_waiting_age_seconds{kind="summarize"}'},
                        timeout=5)
                    result = r.json()["data"]["result"] if r.status_code == 200 else []
                except httpx.HTTPError:
                    result = []
                if result:
                    break
                assert prom.poll() is None, (tmp_path / "prom.log").read_text()
                time.sleep(0.25)
            assert result, (tmp_path / "prom.log").read_text()
            scraped_at, age = float(result[0]["value"][0]), float(result[0]["value"][1])
            # The age at the scrape is the scrape time minus the oldest job's submission
            # (Prometheus's sample time is its scrape's start: allow one scrape interval).
            expected = scraped_at - created_us / MICROS
            assert abs(age - expected) < 1.5, (age, expected)
            # The scrape itself was healthy (and authenticated with the metrics token).
            up = httpx.get(api + "/query", params={"query": 'up{job="jobcoord"}'},
                           timeout=5).json()["data"]["result"]
            assert up and up[0]["value"][1] == "1"
            # The rules were loaded by the real server too.
            groups = httpx.get(api + "/rules", timeout=5).json()["data"]["groups"]
            assert {r["name"] for g in groups for r in g["rules"]} == {
                "JobcoordQueueTooOld", "JobcoordUnknownJobsNeedAHuman", "JobcoordWorkerSilent"}
        finally:
            prom.terminate()
            try:
                prom.wait(20)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait(10)
