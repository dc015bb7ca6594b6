"""The long-running processes tick the schedules on their reaper timers: `reap --every`
(JSON Lines carry each pass's schedule counts), a `worker`, and `serve`."""

from __future__ import annotations

from typing import Any

import pytest

from jobcoord.service import Coordinator
from tests.serve_procs import served
from tests.test_loops import Loop, _reaper, loops
from tests.test_worker import wait_for

__all__ = ["loops"]  # the fixture, imported for this module's tests
pytestmark = pytest.mark.timeout(120)


def _fired(c: Coordinator) -> list[dict[str, Any]]:
    return c.jobs(kind="digest")["jobs"]


def test_reap_every_ticks_the_schedules_each_pass(target: Any, coord: Coordinator,
                                                   loops: list[Loop], tmp_path: Any) -> None:
    # A role no process here has: the jobs only wait, and overlap skip keeps it to one.
    coord.add_schedule("digest", "digest", every="1s", role="nightly", overlap="skip")
    db_args = (["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url])
    r = _reaper(loops, db_args, tmp_path)
    wait_for(lambda: r.alive() and any(o["schedules"].get("skipped") for o in r.objects()),
             20, "a pass that fires and one that skips")
    assert r.stop() == 0
    objects = r.objects()
    assert all("schedules" in o for o in objects)
    assert sum(o["schedules"]["fired"] for o in objects) == len(_fired(coord)) == 1


def test_a_worker_ticks_the_schedules_on_its_reaper_timer(sqlite_target: Any,
                                                          loops: list[Loop],
                                                          tmp_path: Any) -> None:
    with Coordinator.open(sqlite_target) as c:
        c.add_schedule("digest", "digest", every="1s", role="nightly", overlap="skip")
        w = Loop(["--db", sqlite_target.sqlite_path],
                 ["worker", "--worker-id", "w1", "--app", "examples.handlers:app",
                  "--heartbeat-every", "0.3", "--poll", "0.05", "--reap-every", "0.2",
                  "--log-format", "json", "--json"], str(tmp_path / "worker.log"))
        loops.append(w)
        wait_for(lambda: w.alive() and _fired(c), 20, "a job fired by the worker's tick")
        assert w.stop() == 0
        assert "schedules_ticked" in w.stderr()


def test_serve_ticks_the_schedules_on_its_reaper_timer(sqlite_target: Any) -> None:
    with Coordinator.open(sqlite_target) as c:
        c.add_schedule("digest", "digest", every="1s", role="nightly", overlap="skip")
        with served(sqlite_target, "--reap-every", "0.2"):
            wait_for(lambda: _fired(c), 20, "a job fired by the server's tick")
        assert len(_fired(c)) == 1


def test_a_ticker_killed_between_the_job_and_the_slot_row_leaves_neither(
        target: Any, coord: Coordinator) -> None:
    """SIGKILL inside the tick's transaction, after the job's insert: both roll back, and the
    next tick fires the slot once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from sqlalchemy import select

    from jobcoord.schema import schedule_fires
    from tests.test_worker import REPO

    coord.add_schedule("digest", "digest", every="1s", role="nightly", overlap="skip")
    time.sleep(1.1)
    db_args = (["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url])
    env = dict(os.environ, JOBCOORD_FAULT="schedule.after_job:kill")
    killed = subprocess.run([sys.executable, "-m", "jobcoord", *db_args, "schedule", "tick"],
                            cwd=REPO, env=env, capture_output=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL

    def rows() -> list[Any]:
        return coord.db.read(lambda conn: conn.execute(
            select(schedule_fires.c.outcome, schedule_fires.c.job_id)).all())

    assert rows() == [] and _fired(coord) == []
    got = coord.tick_schedules()
    assert got["fired"] == 1
    assert [r[0] for r in rows()].count("fired") == 1 == len(_fired(coord))
