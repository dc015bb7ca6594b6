"""What the Python API answers: idempotency keys cover every submitted field, a tenant-scoped
caller only ever sees its own tenant, a read never trips on data it did not expect, and
`Coordinator.open` takes a URL and can create the schema itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobcoord.errors import InvalidInput, Refused
from jobcoord.service import Coordinator, JobSpec
from tests.conftest import dump
from tests.sql import sql
from tests.timeline import IDLE_ON_AC

REPO = Path(__file__).resolve().parent.parent


# --- idempotency keys cover the submitted fields ---------------------------------------------


@pytest.mark.parametrize(("change", "field"), [
    ({"kind": "other"}, "kind"),
    ({"payload": {"n": 2}}, "payload"),
    ({"priority": 0}, "priority"),
    ({"role": "gpu"}, "role"),
    ({"max_attempts": 7}, "max_attempts"),
])
def test_same_key_with_another_field_is_an_idempotency_conflict_naming_it(coord, change, field):
    first: dict[str, Any] = {"kind": "k", "payload": {"n": 1}, "priority": 2, "role": None,
                             "max_attempts": 3}
    job_id = coord.enqueue(**first, key="K1")["job_id"]
    before = dump(coord)
    with pytest.raises(Refused) as caught:
        coord.enqueue(**{**first, **change}, key="K1")
    assert caught.value.code == "idempotency_conflict"
    assert caught.value.exit_code == 4
    assert caught.value.details["fields"] == [field]
    assert caught.value.details["job_id"] == job_id
    assert field in caught.value.message
    assert dump(coord) == before
    with pytest.raises(Refused) as caught:
        coord.enqueue_many([JobSpec(**{**first, **change}, key="K1")])
    assert caught.value.code == "idempotency_conflict"
    assert caught.value.details["fields"] == [field]
    assert dump(coord) == before


def test_same_key_with_another_deadline_or_delay_is_the_same_job(coord):
    job_id = coord.enqueue("k", {}, key="K2", deadline_s=600)["job_id"]
    again = coord.enqueue("k", {}, key="K2", deadline_s=60, delay_s=5)
    assert again == {"job_id": job_id, "created": False}
    assert coord.enqueue_many([{"kind": "k", "key": "K2", "delay_s": 1}]) == [again]


def test_same_key_after_a_granted_attempt_is_still_the_same_job(coord):
    # A shutdown release raises the stored max_attempts: the key compares what was submitted.
    job_id = coord.enqueue("k", {}, key="K3", max_attempts=1)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    epoch = coord.claim("w1")["lease"]["epoch"]
    coord.fail(job_id, "w1", epoch, "stopping", reason="worker_shutdown")
    assert coord.show(job_id)["job"]["max_attempts"] == 2
    assert coord.enqueue("k", {}, key="K3", max_attempts=1)["created"] is False


def test_the_cli_reports_the_differing_fields(coord, cli):
    assert cli("enqueue", "k", "--key", "K4", "--priority", "P2", "--json").code == 0
    r = cli("enqueue", "k", "--key", "K4", "--priority", "P0", "--json")
    assert r.code == 4
    assert r.json["error"]["details"]["fields"] == ["priority"]


# --- a tenant-scoped caller sees its own tenant only -----------------------------------------


def test_explain_with_a_tenant_counts_only_that_tenants_jobs_ahead(coord):
    for _ in range(3):
        coord.enqueue("k", {}, tenant="B", priority=0)
    coord.enqueue("k", {}, tenant="A", priority=0)
    mine = coord.enqueue("k", {}, tenant="A", priority=1)["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    assert coord.explain(mine, tenant="A")["jobs_ahead"] == 1
    # Without a tenant the operator sees the whole queue.
    assert coord.explain(mine)["jobs_ahead"] == 4


# --- reads never assert on what the database holds --------------------------------------------


def test_explain_reports_a_running_job_without_a_lease(coord):
    job_id = coord.enqueue("k", {})["job_id"]
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.claim("w1")
    # What a read spanning two snapshots could once see: the job running, its lease gone.
    coord.db.write(lambda conn: sql(conn, "DELETE FROM leases"))
    out = coord.explain(job_id)
    assert out["status"] == "running"
    assert out["reasons"][0]["code"] == "running"
    assert "no lease" in out["reasons"][0]["detail"]


def test_no_assert_guards_data_read_from_the_database():
    source = (REPO / "jobcoord" / "service.py").read_text()
    assert not re.findall(r"^\s*assert ", source, re.MULTILINE)


# --- opening ----------------------------------------------------------------------------------


def test_open_accepts_a_url_positionally(target):
    spelled = target.url if target.sqlite_path is None else f"sqlite:///{target.sqlite_path}"
    with Coordinator.open(spelled) as c:
        assert c.enqueue("k", {})["created"] is True
        assert c.db.dialect == target.dialect
    if target.sqlite_path is None:
        plain = spelled.replace("postgresql+psycopg://", "postgres://")
        with Coordinator.open(plain) as c:
            assert c.status()["jobs"]["waiting"] == 1


@pytest.mark.parametrize("url", ["sqlite:///{d}/q.db?mode=ro", "sqlite:///{d}/q?x.db",
                                 "sqlite:///{d}/q.db?bogus=1&immutable=1"])
def test_a_sqlite_url_with_a_query_is_refused_not_cut(tmp_path, url):
    """`?mode=ro` gave a writable database without a word, and an unquoted `?` in a file's
    name named another file: a SQLite URL's query is refused (exit 2), nothing created."""
    from tests.conftest import run_cli

    url = url.format(d=tmp_path)
    with pytest.raises(InvalidInput, match="%3F"):
        Coordinator.open(url, migrate=True)
    run = run_cli(None, "--url", url, "migrate", "--json")
    assert run.code == 2, run.err
    assert os.listdir(tmp_path) == []
    # Quoted, the `?` is part of the file's name.
    quoted = f"sqlite:///{tmp_path}/q%3Fx.db"
    with Coordinator.open(quoted, migrate=True) as c:
        assert c.db.target.sqlite_path == f"{tmp_path}/q?x.db"
    assert "q?x.db" in os.listdir(tmp_path)


def test_open_with_migrate_creates_the_schema_in_an_empty_directory(tmp_path):
    path = str(tmp_path / "new.db")
    with Coordinator.open(path, migrate=True) as c:
        assert c.enqueue("k", {})["job_id"] == 1
    with Coordinator.open(path, migrate=True) as c:  # and again: nothing to do
        assert c.status()["jobs"]["waiting"] == 1


def test_the_readme_python_example_runs_verbatim_in_a_fresh_directory(tmp_path):
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert blocks, "README has a Python example"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCOORD_")}
    env["PYTHONPATH"] = str(REPO)
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
