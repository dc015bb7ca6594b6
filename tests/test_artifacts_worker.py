"""The worker runtime returns artifacts: a Python handler through `ctx.artifact`, a command
handler through files in $JOBCOORD_ARTIFACTS_OUT. Real worker processes, SQLite."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests import test_worker as tw
from tests.test_artifacts_rules import install
from tests.test_worker import PY

db = tw.db
start = tw.start

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("handler", ["python", "command"])
def test_a_handler_returns_an_artifact_linked_to_its_result(db: Any, start: Any,
                                                            sqlite_target: Any,
                                                            tmp_path: Path,
                                                            handler: str) -> None:
    _, c = db
    install(sqlite_target)
    c.features.add("artifacts")  # this coordinator opened before the feature was added
    job = c.enqueue("report", {"title": "Quarterly"})["job_id"]
    pattern = os.path.join(tempfile.gettempdir(), f"jobcoord-{job}-artifacts-*")
    before = set(glob.glob(pattern))  # other tests' killed workers may have left some
    args = (("--app", "examples.report_app:app") if handler == "python"
            else ("--exec", f"report={PY} examples/report_cmd.py"))
    code, summary = start(*args, "--burst").finish()
    assert code == 0 and summary["completed"] == 1, summary
    [a] = c.artifacts(job)["artifacts"]
    assert a["name"] == "report.md" and a["state"] == "accepted"
    assert a["digest"].startswith("sha256:") and a["size"] > 10
    out = tmp_path / "out.md"
    c.get_artifact(job, "report.md", out)
    assert out.read_text().startswith("# Quarterly")
    reasons = [e["reason"] for e in c.show(job)["events"]]
    assert reasons.index("artifact_staged") < reasons.index("artifact_accepted") \
        < reasons.index("completed")
    # The command's artifacts directory is gone with the attempt (directories other tests'
    # workers left or remove meanwhile are not this attempt's).
    assert set(glob.glob(pattern)) - before == set()
