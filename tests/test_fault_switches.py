"""Fault points are switched on only by the test suite, never by the environment of a
production process: an installed jobcoord started with JOBCOORD_FAULT or
JOBCOORD_TEST_DEFERRED_WRITES in its environment ignores both. The suite arms them through
tests/fault_site/sitecustomize.py, which it puts on the path of the processes it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.conftest import FAULT_SITE
from tests.timeline import IDLE_ON_AC

REPO = Path(__file__).resolve().parent.parent


def _env(with_test_site: bool, **values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and p != FAULT_SITE]
    if with_test_site:
        paths.insert(0, FAULT_SITE)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(values)
    return env


def _claim(path: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobcoord", "--db", path, "claim", "w1",
                           "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_production_process_ignores_the_fault_variable(sqlite_target: Target) -> None:
    path = sqlite_target.sqlite_path or ""
    with Coordinator.open(sqlite_target) as c:
        c.enqueue("work", {})
        c.enqueue("work", {})
        c.heartbeat("w1", readings=IDLE_ON_AC)
    plain = _claim(path, _env(False, JOBCOORD_FAULT="claim.after_take:kill"))
    assert plain.returncode == 0, (plain.returncode, plain.stdout, plain.stderr)
    assert '"job_id"' in plain.stdout
    # The same variable with the suite's sitecustomize on the path: the point fires. This is
    # what makes the crash tests real, and proves the variable above reached the process.
    armed = _claim(path, _env(True, JOBCOORD_FAULT="claim.after_take:kill"))
    assert armed.returncode == -signal.SIGKILL, (armed.returncode, armed.stderr)


PROBE = """
import sys
from jobcoord.db import Database, resolve_target
db = Database.open(resolve_target(db=sys.argv[1]))
print(db.write_engine.get_execution_options()["jobcoord_begin"])
db.close()
"""


def test_a_production_process_ignores_the_deferred_writes_variable(sqlite_target: Target
                                                                   ) -> None:
    path = sqlite_target.sqlite_path or ""

    def begin(with_test_site: bool) -> str:
        r = subprocess.run([sys.executable, "-c", PROBE, path], cwd=REPO, capture_output=True,
                           text=True, timeout=60,
                           env=_env(with_test_site, JOBCOORD_TEST_DEFERRED_WRITES="1"))
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert begin(False) == "BEGIN IMMEDIATE"
    assert begin(True) == "BEGIN"


def test_jobcoord_reads_no_fault_switch_from_the_environment() -> None:
    """Belt and braces for the two tests above: no module of the package names a test
    switch (a new one read from the environment would slip past them)."""
    package = REPO / "jobcoord"
    for source in package.rglob("*.py"):
        text = source.read_text()
        assert "JOBCOORD_FAULT" not in text and "JOBCOORD_TEST_" not in text, source
