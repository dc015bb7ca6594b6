"""Prometheus metrics: derived from the database, the same from every process and after a
restart (docs/metrics.md)."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobcoord.clock import MICROS, iso, now_us
from jobcoord.db import Target
from jobcoord.metrics import exposition, registry_for
from jobcoord.service import Coordinator

from .serve_procs import db_args, jobcoord_argv, served, token

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def workload(c: Coordinator) -> dict[str, Any]:
    """A scripted mix: completions with provenance (known latencies), a failure retried, a
    permanent failure, an expired lease, an expired lease after an effect (unknown), a
    cancellation, and jobs left waiting of two kinds."""
    c.heartbeat("w1", roles=[], readings=None)
    c.heartbeat("w2", roles=[], readings={"on_battery": True, "user_idle_s": 0})
    for i in range(4):
        c.enqueue("summarize", {"i": i})
    c.enqueue("embed", {"i": 9})
    latencies = []
    for _ in range(2):  # two completions whose handler ended 0.2 s before the call
        got = c.claim("w1", lease_s=60)
        job = got["job"]
        end = now_us() - MICROS // 5
        prov = {"started_at": iso(end - 3 * MICROS), "duration_s": 3.0}
        c.complete(job["job_id"], "w1", got["lease"]["epoch"], {"ok": 1}, provenance=prov)
        latencies.append(job["job_id"])
    got = c.claim("w1", lease_s=60)  # fails permanently: dead
    c.fail(got["job"]["job_id"], "w1", got["lease"]["epoch"], "boom", permanent=True)
    got = c.claim("w1", lease_s=1)  # its lease expires: back to waiting
    expired_waiting = got["job"]["job_id"]
    got = c.claim("w1", lease_s=1)  # an effect started, then the lease expires: unknown
    c.mark_effect(got["job"]["job_id"], "w1", got["lease"]["epoch"])
    c.heartbeat("w3", roles=[], readings={"memory_used_pct": 99.0})
    assert c.claim("w3")["job"] is None  # refused by the memory gate, kept on its row
    cancelled = c.enqueue("summarize", {"i": 99})["job_id"]
    c.cancel(cancelled)
    deadline = time.monotonic() + 20  # both 1-second leases expire; the reaper sees them
    while c.status()["jobs"]["unknown"] < 1 or \
            c.show(expired_waiting)["job"]["status"] != "waiting":
        assert time.monotonic() < deadline, "the leases were not reaped"
        c.reap()
        time.sleep(0.1)
    return {"completed": latencies}


def database_truth(c: Coordinator) -> dict[str, Any]:
    """The same figures, read straight from the tables by different queries."""
    def _do(conn: Any) -> dict[str, Any]:
        rows = conn.exec_driver_sql("SELECT status, kind FROM jobs").all()
        events = conn.exec_driver_sql("SELECT reason, to_status FROM job_events").all()
        moves = conn.exec_driver_sql("SELECT from_status, to_status FROM job_events").all()
        finished = conn.exec_driver_sql(
            "SELECT attempts FROM jobs WHERE status IN ('succeeded','dead','cancelled')").all()
        return {"jobs": rows, "events": events, "moves": moves,
                "finished": [r[0] for r in finished]}
    return c.db.read(_do)


def check_against_database(samples: Samples, c: Coordinator) -> None:
    truth = database_truth(c)
    by: dict[tuple[str, str], int] = {}
    for status, kind in truth["jobs"]:
        by[(status, kind)] = by.get((status, kind), 0) + 1
    for (status, kind), n in by.items():
        assert value(samples, "jobcoord_jobs", status=status, kind=kind) == n
    scraped = {k: v for k, v in samples.items() if k[0] == "jobcoord_jobs"}
    assert sum(scraped.values()) == len(truth["jobs"])
    assert value(samples, "jobcoord_dead_jobs") == sum(1 for s, _ in truth["jobs"]
                                                       if s == "dead")
    assert value(samples, "jobcoord_unknown_jobs") == sum(1 for s, _ in truth["jobs"]
                                                          if s == "unknown")
    expired = [to for reason, to in truth["events"] if reason == "lease_expired"]
    assert sum(v for k, v in samples.items() if k[0] == "jobcoord_lease_expiries_total"
               ) == len(expired)
    for to in ("waiting", "unknown"):
        assert value(samples, "jobcoord_lease_expiries_total", to_status=to) == \
            expired.count(to)
    assert value(samples, "jobcoord_job_attempts_count") == len(truth["finished"])
    assert value(samples, "jobcoord_job_attempts_sum") == sum(truth["finished"])
    assert value(samples, "jobcoord_job_attempts_bucket", le="1.0") == \
        sum(1 for a in truth["finished"] if a <= 1)
    for status in ("dead", "unknown"):
        into = sum(1 for a, b in truth["moves"] if b == status and a not in (None, status))
        assert value(samples, "jobcoord_jobs_entered_total", status=status) == into > 0
    completed = sum(1 for reason, _ in truth["events"] if reason == "completed")
    assert value(samples, "jobcoord_result_commit_latency_seconds_count") == completed


def test_metrics_match_the_database_after_a_scripted_workload(coord: Coordinator) -> None:
    workload(coord)
    samples = parse(exposition(registry_for(coord)).decode())
    check_against_database(samples, coord)
    # The two completions were committed ~0.2 s after their handlers ended.
    assert value(samples, "jobcoord_result_commit_latency_seconds_bucket", le="0.1") == 0
    assert value(samples, "jobcoord_result_commit_latency_seconds_bucket", le="1.0") == 2
    assert 0.4 <= value(samples, "jobcoord_result_commit_latency_seconds_sum") < 2.0
    assert value(samples, "jobcoord_unknown_jobs") == 1
    assert value(samples, "jobcoord_dead_jobs") == 1
    assert value(samples, "jobcoord_lease_expiries_total", to_status="unknown") == 1
    age = value(samples, "jobcoord_oldest_waiting_age_seconds", kind="summarize")
    assert 0 < age < 120
    assert value(samples, "jobcoord_worker_heartbeat_age_seconds", worker="w1") < 120
    assert value(samples, "jobcoord_workers_refusing", reason="memory_gate") == 1
    assert value(samples, "jobcoord_workers") == 3
    # A second process (a fresh collector) computes the same figures from scratch.
    again = parse(exposition(registry_for(coord)).decode())
    for key, got in samples.items():
        if "age_seconds" not in key[0]:
            assert again[key] == got, key


def _fold(c: Coordinator) -> Any:
    return c.db.read(lambda conn: conn.exec_driver_sql(
        "SELECT last_event_id, state_json FROM metric_folds").all())


def test_latency_counts_stay_counted_after_prune_and_a_fresh_process_agrees(
        coord: Coordinator) -> None:
    """The latency histogram is a durable fold of the completed events: once folded, a
    completion stays counted when prune deletes its job (a counter never goes down), in the
    long-running collector and in a fresh process alike."""
    workload(coord)
    coord.db.events_settle_s = 0.0  # as once the settle time has passed
    registry = registry_for(coord)
    before = parse(exposition(registry).decode())
    assert value(before, "jobcoord_result_commit_latency_seconds_count") == 2
    assert len(_fold(coord)) == 1
    coord.prune(0, statuses=["succeeded"])
    after = parse(exposition(registry).decode())
    fresh = parse(exposition(registry_for(coord)).decode())
    for samples in (after, fresh):
        for key in [k for k in before if k[0].startswith("jobcoord_result_commit_latency")]:
            assert samples[key] == before[key], key


def _stored_fold_reads_as(coord: Coordinator, state: str, good: Samples) -> None:
    """The latency fold's row set to `state`: the next scrape shows the histogram `good`."""
    coord.db.write(lambda conn: conn.exec_driver_sql(
        "UPDATE metric_folds SET state_json = ?" if coord.db.is_sqlite
        else "UPDATE metric_folds SET state_json = %s", (state,)), "test")
    again = parse(exposition(registry_for(coord)).decode())
    for key in [k for k in good if k[0].startswith("jobcoord_result_commit_latency")]:
        assert again[key] == good[key], key


def test_the_latency_sum_never_goes_down_as_events_settle_into_the_fold(
        coord: Coordinator) -> None:
    """The `_sum` was the stored fold's float plus the unsettled events' float: once they
    settled into the fold, the same seconds added in another order gave a smaller float
    (22.1659, then 22.165899999999997), a counter going down, which Prometheus reads as a
    reset. Latencies of 0.3, 0.2 and 0.1 s: one settled and two not, then all three."""
    from freezegun import freeze_time

    start = 1_900_000_000 * MICROS
    coord.heartbeat("w", roles=[], readings=None)
    for i, (at_s, latency_us) in enumerate([(0, 300_000), (100, 200_000), (100, 100_000)]):
        with freeze_time(iso(start + at_s * MICROS + i)):
            coord.heartbeat("w", roles=[], readings=None)
            coord.enqueue("k", {"i": i})
            got = coord.claim("w", lease_s=60)
            end = now_us() - latency_us
            coord.complete(got["job"]["job_id"], "w", got["lease"]["epoch"], {},
                           provenance={"started_at": iso(end), "duration_s": 0})
    name = "jobcoord_result_commit_latency_seconds_sum"
    registry = registry_for(coord)
    with freeze_time(iso(start + 100 * MICROS + 10)):
        coord.db.events_settle_s = 50.0  # the first settled, the other two not
        first = value(parse(exposition(registry).decode()), name)
        assert len(_fold(coord)) == 1
        coord.db.events_settle_s = 0.0  # all three settled into the fold
        then = value(parse(exposition(registry).decode()), name)
        fresh = value(parse(exposition(registry_for(coord)).decode()), name)
    assert first <= then and then == fresh, (first, then, fresh)
    assert then == 0.6, then


def test_a_latency_fold_stored_in_seconds_by_an_earlier_version_is_read_on(
        coord: Coordinator) -> None:
    """Folds stored before the sum became whole microseconds hold `total` in seconds: read
    as such (the histogram is not counted again), and stored again in microseconds."""
    from jobcoord.metrics import LATENCY_BUCKETS, Latency

    workload(coord)
    coord.db.events_settle_s = 0.0
    good = parse(exposition(registry_for(coord)).decode())
    (_, state), = _fold(coord)
    fold = Latency.from_json(state)
    old = (f'{{"buckets": {fold.buckets}, "count": {fold.count}, "total": {fold.total!r}, '
           f'"without": {fold.without}}}')
    assert len(fold.buckets) == len(LATENCY_BUCKETS) + 1
    _stored_fold_reads_as(coord, old, good)


def test_latency_fold_stores_only_settled_events(coord: Coordinator) -> None:
    """Events newer than the settle time (a smaller id may still commit after them on a
    server with concurrent writers) are counted by the scrape but not stored in the fold."""
    workload(coord)
    coord.db.events_settle_s = 30.0
    samples = parse(exposition(registry_for(coord)).decode())
    assert value(samples, "jobcoord_result_commit_latency_seconds_count") == 2
    assert _fold(coord) == []  # every completion is seconds old: nothing stored yet
    coord.db.events_settle_s = 0.0
    again = parse(exposition(registry_for(coord)).decode())
    assert value(again, "jobcoord_result_commit_latency_seconds_count") == 2
    (last, _state), = _fold(coord)
    completed = coord.db.read(lambda conn: conn.exec_driver_sql(
        "SELECT MAX(event_id) FROM job_events WHERE reason = 'completed'").scalar_one())
    assert last == completed


def test_claim_refusals_are_a_counter_shared_by_every_process_and_kept_across_restarts(
        target: Target) -> None:
    """Each refused claim adds one under its reason, in its own transaction: refusals by
    another process (the CLI) count, and a new process reads the same totals."""
    with Coordinator.open(target) as c:
        c.heartbeat("hot", roles=[], readings={"memory_used_pct": 99.0})
        c.heartbeat("idle", roles=[], readings=None)
        for _ in range(3):
            assert c.claim("hot")["reason"] == "memory_gate"
        assert c.claim("idle")["reason"] == "no_waiting_jobs"
        assert c.claim("nobody")["reason"] == "heartbeat_missing"  # unknown: not counted
    for _ in range(2):
        r = subprocess.run([*jobcoord_argv(), *db_args(target), "claim", "hot", "--json"],
                           capture_output=True, text=True, timeout=60)
        assert '"memory_gate"' in r.stdout, (r.stdout, r.stderr)
    with Coordinator.open(target) as c:
        c.heartbeat("hot", roles=[], readings=None)  # the gate opens: the counter stays
        c.claim("hot")
        samples = parse(exposition(registry_for(c)).decode())
    assert value(samples, "jobcoord_claim_refusals_total", reason="memory_gate") == 5
    assert value(samples, "jobcoord_claim_refusals_total", reason="no_waiting_jobs") == 2
    assert ("jobcoord_claim_refusals_total", (("reason", "heartbeat_missing"),)) \
        not in samples
    assert "jobcoord_workers_refusing" in {k[0] for k in samples}


@pytest.mark.parametrize("call", ["claim", "claim_many"])
def test_a_worker_whose_last_claim_succeeded_is_not_counted_as_refusing(
        target: Target, call: str) -> None:
    """`jobcoord_workers_refusing` is the workers whose last claim was refused: a refusal
    stayed on the worker row (and in `workers`) after the next claim took a job."""
    with Coordinator.open(target) as c:
        c.heartbeat("w1", readings=None)
        assert c.claim("w1")["reason"] == "no_waiting_jobs"
        samples = parse(exposition(registry_for(c)).decode())
        assert value(samples, "jobcoord_workers_refusing", reason="no_waiting_jobs") == 1
        c.enqueue("k", {})
        got = c.claim("w1") if call == "claim" else c.claim_many("w1", 4)
        assert got.get("job") or got.get("claimed")
        samples = parse(exposition(registry_for(c)).decode())
        assert not [k for k in samples if k[0] == "jobcoord_workers_refusing"]
        assert c.workers()["workers"][0]["last_refusal"] is None
        assert c.claim("w1")["reason"] == "no_waiting_jobs"  # refused again: counted again
        samples = parse(exposition(registry_for(c)).decode())
        assert value(samples, "jobcoord_workers_refusing", reason="no_waiting_jobs") == 1


def _scrape(url: str, secret: str | None = None) -> tuple[int, str]:
    import httpx

    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    r = httpx.get(url + "/metrics", headers=headers, timeout=30)
    return r.status_code, r.text


def test_metrics_endpoint_identical_after_a_server_restart(target: Target) -> None:
    with Coordinator.open(target) as c:
        workload(c)
    viewer = token(target, "prom", "viewer")
    with served(target, "--reap-every", "0") as s:
        status, text = _scrape(s.url, viewer)
        assert status == 200, text
        first = parse(text)
    with Coordinator.open(target) as c:
        check_against_database(first, c)
    with served(target, "--reap-every", "0") as s:
        second = parse(_scrape(s.url, viewer)[1])
    counters = {k: v for k, v in first.items() if "age_seconds" not in k[0]}
    assert counters == {k: v for k, v in second.items() if "age_seconds" not in k[0]}
    assert value(first, "jobcoord_lease_expiries_total", to_status="unknown") == 1


def test_metrics_endpoint_needs_an_unbound_viewer_or_the_metrics_token(
        sqlite_target: Target) -> None:
    viewer = token(sqlite_target, "v", "viewer")
    operator = token(sqlite_target, "o", "operator")
    bound = token(sqlite_target, "vb", "viewer", tenant="alice")
    worker = token(sqlite_target, "w", "worker", worker="w1")
    secret = "m" * 40
    with served(sqlite_target, "--reap-every", "0",
                env={"JOBCOORD_METRICS_TOKEN": secret}) as s:
        assert _scrape(s.url)[0] == 401
        assert _scrape(s.url, "jct_nope")[0] == 401
        assert _scrape(s.url, worker)[0] == 403
        assert _scrape(s.url, bound)[0] == 403
        assert _scrape(s.url, viewer)[0] == 200
        assert _scrape(s.url, operator)[0] == 200
        status, text = _scrape(s.url, secret)
        assert status == 200 and "jobcoord_jobs_by_status" in text
        # The metrics token opens /metrics only, not the API.
        import httpx

        assert httpx.get(s.url + "/v1/jobs", headers={"Authorization": f"Bearer {secret}"}
                         ).status_code == 401
        # Two tokens (the first was judged: a bound one first 403, after it 200) and a query
        # parameter /metrics does not take are 400, as on every /v1 route.
        for headers, query in (([("Authorization", f"Bearer {viewer}"),
                                 ("Authorization", f"Bearer {bound}")], ""),
                               ([("Authorization", f"Bearer {bound}"),
                                 ("Authorization", f"Bearer {viewer}")], ""),
                               ([("Authorization", f"Bearer {viewer}")], "?x=1")):
            got = httpx.get(s.url + "/metrics" + query, headers=headers)
            assert got.status_code == 400, (headers, query, got.status_code)
            assert got.json()["error"]["code"] == "invalid_input"
    with served(sqlite_target, "--reap-every", "0", "--metrics-public") as s:
        assert _scrape(s.url)[0] == 200


def _raw_get(port: int, path: str, headers: list[str]) -> bytes:
    """A GET as sent byte for byte (no client library lets a request name two Hosts)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\n{''.join(h + chr(13) + chr(10) for h in headers)}"
                     "Connection: close\r\n\r\n".encode())
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def test_metrics_public_answers_only_a_request_naming_a_loopback_host(
        sqlite_target: Target) -> None:
    """`--metrics-public` served any loopback client, whatever site its Host named: a page
    of another site the operator's browser opened, its name rebound to 127.0.0.1, read
    every tenant's kinds and workers. Without a token, the Host must name loopback too
    (401 otherwise, as a missing token); a token still opens it under any Host."""
    import httpx

    with Coordinator.open(sqlite_target) as c:
        c.enqueue("secret_kind", {})
    viewer = token(sqlite_target, "v", "viewer")
    with served(sqlite_target, "--reap-every", "0", "--metrics-public") as s:
        port = s.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1", "localhost",
                     f"LOCALHOST:{port}", f"[::1]:{port}"):
            got = httpx.get(s.url + "/metrics", headers={"Host": host})
            assert got.status_code == 200 and "secret_kind" in got.text, (host, got)
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}",
                     f"localhost.attacker.example:{port}", f"evil@127.0.0.1:{port}",
                     f"127.0.0.1/x:{port}", "", f"[::1:{port}"):
            got = httpx.get(s.url + "/metrics", headers={"Host": host})
            assert got.status_code == 401, (host, got.status_code)
            assert "secret_kind" not in got.text
        # Two Host headers: which one a proxy in front judged is anyone's guess (the
        # first was taken, a loopback one beside the site's passed). Neither is.
        for hosts in (("localhost", "attacker.example"), ("attacker.example", "localhost"),
                      ("localhost", "localhost")):
            raw = _raw_get(int(port), "/metrics", [f"Host: {h}" for h in hosts])
            assert raw.startswith(b"HTTP/1.1 401 "), (hosts, raw[:200])
            assert b"secret_kind" not in raw
        got = httpx.get(s.url + "/metrics", headers={"Host": f"attacker.example:{port}",
                                                     "Authorization": f"Bearer {viewer}"})
        assert got.status_code == 200


def test_metrics_public_is_refused_off_loopback(sqlite_target: Target) -> None:
    argv = [*jobcoord_argv(), *db_args(sqlite_target), "serve", "--host", "0.0.0.0",
            "--insecure-http", "--metrics-public", "--port", "0"]
    got = subprocess.run(argv, capture_output=True, timeout=60)
    assert got.returncode == 2
    assert b"--metrics-public" in got.stderr and b"Traceback" not in got.stderr


def test_metrics_command_writes_a_textfile_atomically(sqlite_target: Target,
                                                      tmp_path: Any) -> None:
    with Coordinator.open(sqlite_target) as c:
        c.enqueue("summarize", {})
    path = tmp_path / "jobcoord.prom"
    base = [*jobcoord_argv(), *db_args(sqlite_target), "metrics"]
    got = subprocess.run([*base, "--textfile", str(path)], capture_output=True, timeout=60)
    assert got.returncode == 0, got.stderr
    samples = parse(path.read_text())
    assert value(samples, "jobcoord_jobs", status="waiting", kind="summarize") == 1
    assert [p for p in os.listdir(tmp_path) if p.startswith(".jobcoord-metrics-")] == []
    out = subprocess.run(base, capture_output=True, timeout=60)
    assert out.returncode == 0
    assert value(parse(out.stdout.decode()), "jobcoord_jobs_by_status", status="waiting") == 1
    # A directory that is not there is the destination unavailable, as for `backup` and
    # `artifact get -o` (exit 6), not a bad argument: nothing written.
    bad = subprocess.run([*base, "--textfile", str(tmp_path / "no" / "x.prom")],
                         capture_output=True, timeout=60)
    assert bad.returncode == 6 and b"cannot write" in bad.stderr, bad
    assert not (tmp_path / "no").exists()


def test_a_metrics_textfile_on_a_full_disk_is_exit_6_and_keeps_the_old_one(
        sqlite_target: Target) -> None:
    """A full disk while the exposition is written said exit 2 (bad input) where the exit
    codes say 6 (disk full): the earlier textfile left as it was and no
    temporary file left beside it."""
    from tests.test_storage_faults import fill_with_ballast, small_tmpfs

    with Coordinator.open(sqlite_target) as c:
        for i in range(50):
            c.enqueue(f"kind_{i}", {})
    base = [*jobcoord_argv(), *db_args(sqlite_target), "metrics"]
    with small_tmpfs("1m") as mount:
        path = os.path.join(mount, "jobcoord # ?%.prom")
        with open(path, "w") as f:
            f.write("# the earlier one\n")
        fill_with_ballast(mount)
        got = subprocess.run([*base, "--textfile", path], capture_output=True,
                             timeout=60)
        assert got.returncode == 6 and b"No space left" in got.stderr, got
        with open(path) as f:
            assert f.read() == "# the earlier one\n"
        assert sorted(os.listdir(mount)) == ["ballast", "jobcoord # ?%.prom"]


@pytest.mark.parametrize("prov, expected", [
    (None, None),
    ('{"started_at": "2026-01-01T00:00:00Z", "duration_s": 1.5}', 0.5),
    ('{"started_at": "2026-01-01T00:00:03Z", "duration_s": 0}', 0.0),  # worker clock ahead
    ('{"duration_s": 1}', None),
    ("[1]", None),
])
def test_commit_latency_is_event_time_minus_handler_end(prov: str | None,
                                                        expected: float | None) -> None:
    from jobcoord.metrics import _parse_iso_us, commit_latency_s

    at = _parse_iso_us("2026-01-01T00:00:02Z")
    assert at is not None
    assert commit_latency_s(at, prov) == expected


def test_artifact_metrics_count_rows_and_bytes_by_state(tmp_path: Any) -> None:
    from jobcoord.db import Database, resolve_target
    from jobcoord.migrate import migrate

    path = str(tmp_path / "a.db")
    db = Database.open(resolve_target(db=path), create=True)
    migrate(db, add={"artifacts"})
    db.close()
    with Coordinator.open(path) as c:
        c.heartbeat("w")
        c.enqueue("k", {})
        got = c.claim("w")
        job_id, epoch = got["job"]["job_id"], got["lease"]["epoch"]
        c.put_artifact(job_id, "w", epoch, "a.txt", b"hello")
        c.put_artifact(job_id, "w", epoch, "b.txt", b"world!")
        c.complete(job_id, "w", epoch, {})
        samples = parse(exposition(registry_for(c)).decode())
    assert value(samples, "jobcoord_artifacts", state="accepted") == 2
    assert value(samples, "jobcoord_artifact_bytes", state="accepted") == 11


def test_every_metric_is_documented_with_its_type_and_labels(sqlite_target: Target) -> None:
    """docs/metrics.md's table and the exposition agree: every family exposed is listed
    with its type and labels, and every listed family is exposed (the artifact ones when
    the artifacts tables exist)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text()
    listed: dict[str, tuple[str, set[str]]] = {}
    for names, kind, labels in re.findall(
            r"^\| (`jobcoord_[^|]+) \| (gauge|counter|histogram) \|([^|]*)\|", doc, re.M):
        for name in re.findall(r"`(jobcoord_\w+)`", names):
            base = name.removesuffix("_total")
            listed[base] = (kind, set(re.findall(r"`(\w+)`", labels)) - {"le"})
    with Coordinator.open(sqlite_target) as c:
        workload(c)
        exposed: dict[str, tuple[str, set[str]]] = {}
        for family in text_string_to_metric_families(exposition(registry_for(c)).decode()):
            labels = {k for s in family.samples for k in s.labels} - {"le"}
            exposed[family.name] = (family.type, labels)
    artifact_only = {"jobcoord_artifact_bytes", "jobcoord_artifacts"}
    assert set(listed) - artifact_only == set(exposed)
    for name, got in exposed.items():
        assert listed[name] == got, name


@pytest.mark.parametrize("where", ["the database", "its -wal", "a link to the database",
                                   "an artifact object", "a directory", "a fifo", "-",
                                   "a trailing slash"])
def test_metrics_textfile_never_replaces_the_database_or_an_artifact(
        tmp_path: Any, where: str) -> None:
    """`metrics --textfile q.db` (a typo) replaced the database with the exposition, exit
    0: every job gone. The same over its -wal (a running server's) or an artifact object.
    Refused now as `artifact get -o` refuses those paths: exit 2, nothing written."""
    from tests.conftest import run_cli

    db = tmp_path / "q #1.db"
    assert run_cli(None, "--db", str(db), "migrate").code == 0
    with Coordinator.open(str(db)) as c:
        c.enqueue("summarize", {})
    obj = tmp_path / "q #1.db.artifacts" / "objects" / "sha256" / "ab" / "cd" / ("abcd" * 16)
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"accepted bytes")
    wal = tmp_path / "q #1.db-wal"  # refused by its name: SQLite's own, whether there or not
    link = tmp_path / "link.db"
    link.symlink_to(db)
    (tmp_path / "d.prom").mkdir()
    os.mkfifo(tmp_path / "f.prom")
    path = {"the database": db, "its -wal": wal, "a link to the database": link,
            "an artifact object": obj, "a directory": tmp_path / "d.prom",
            "a fifo": tmp_path / "f.prom", "-": "-",
            "a trailing slash": str(tmp_path / "new.prom") + "/"}[where]
    before = {p: p.read_bytes() for p in (db, obj)}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        got = run_cli(None, "--db", str(db), "metrics", "--textfile", str(path))
        assert not os.path.exists(tmp_path / "-")
        assert not os.path.exists(tmp_path / "new.prom")
    finally:
        os.chdir(cwd)
    assert got.code == 2, got
    assert {p: p.read_bytes() for p in (db, obj)} == before
    assert [p for p in os.listdir(tmp_path) if p.startswith(".jobcoord-metrics-")] == []


@pytest.mark.parametrize("state", [
    '{"buckets": [0,0,0,0,0,0,0,0,0,0,0,0,0,1e400], "count": -1, "total": "nan", '
    '"without": 0}',
    '{"buckets": [0,0,0,0,0,0,0,0,0,0,0,0,0,-5], "count": 3, "total": 1.0, "without": 0}',
    '{"buckets": [0,0,0,0,0,0,0,0,0,0,0,0,0,1.5], "count": 3, "total": 1.0, "without": 0}',
    '{"buckets": [0,0,0,0,0,0,0,0,0,0,0,0,0,0], "count": 0, "total": -1.0, "without": -2}',
], ids=["nan-and-negative-count", "negative-bucket", "fractional-bucket", "negative-total"])
def test_a_latency_fold_edited_by_hand_is_folded_again_never_printed(
        coord: Coordinator, state: str) -> None:
    """A fold with a negative count, NaN total or a bucket that is no count was printed as
    it stood (`_count -1.0`, `_sum NaN`: a counter going down, which Prometheus reads as a
    reset) and stored again on the next scrape. It is unreadable, as garbage text is: the
    histogram is folded again from the first completed event."""
    workload(coord)
    coord.db.events_settle_s = 0.0
    good = parse(exposition(registry_for(coord)).decode())
    assert len(_fold(coord)) == 1
    _stored_fold_reads_as(coord, state, good)
