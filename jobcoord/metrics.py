"""Prometheus metrics derived from the database at scrape time.

Every figure is computed from what the database holds (jobs, job_events, workers, leases,
artifacts), never from one process's memory: a scrape of any `jobcoord serve`, or
`jobcoord metrics` run anywhere against the same database, gives the same numbers, and a
restarted server gives the numbers it gave before. The metric catalogue is docs/metrics.md.

One scrape is one read transaction (one snapshot), with parameterized SQL only.

The result commit latency needs one reading per completed job (the completed event's time
against the handler's end, which the worker records in the provenance). Parsing every
provenance at every scrape would grow with the database, so a collector keeps a cursor
(the last completed event it has folded in) and folds in only newer ones; the sums it keeps
are a cache of a pure function of the events, checked at every scrape against the count of
completed events up to the cursor, and rebuilt from scratch when they differ (`prune`
deleted some). A fresh process computes the same figures from scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from .clock import MICROS, now_us
from .states import FINAL_STATUSES, STATUSES
from .store import report_statements as rs

#: Buckets of the attempts-per-finished-job histogram (attempts are small whole numbers).
ATTEMPT_BUCKETS: tuple[float, ...] = (1, 2, 3, 5, 10)
#: Buckets of the result commit latency histogram, seconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5, 1.0, 2.5, 5.0, 10.0)
#: Provenance rows folded into the latency histogram per read (bounded memory per batch).
LATENCY_BATCH = 5000


@dataclass
class _Latency:
    """The folded-in part of the latency histogram: a cache of a function of the events."""

    cursor: int = 0          # last completed event_id folded in
    seen: int = 0            # completed events with event_id <= cursor
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0
    without: int = 0         # completed jobs with no usable provenance (hand-driven)


def _parse_iso_us(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(dt.timestamp()) * MICROS + dt.microsecond


def commit_latency_s(event_at_us: int, provenance_json: str | None) -> float | None:
    """Seconds from the handler's end (its start plus its duration, as the worker recorded
    them) to the completed event (taken under the write lock of the transaction that
    committed the result). None without a worker's provenance. Clamped at 0: a worker's
    clock a little ahead of the coordinator's must not give a negative observation."""
    if not provenance_json:
        return None
    try:
        prov = json.loads(provenance_json)
    except ValueError:
        return None
    if not isinstance(prov, dict):
        return None
    started = _parse_iso_us(prov.get("started_at"))
    duration = prov.get("duration_s")
    if started is None or not isinstance(duration, int | float) or isinstance(duration, bool):
        return None
    end_us = started + round(duration * MICROS)
    return max(0.0, (event_at_us - end_us) / MICROS)


class JobcoordCollector(Collector):
    """A prometheus_client collector over one jobcoord Database."""

    def __init__(self, db: Any, *, features: Sequence[str] = (),
                 heartbeat_max_age_s: float | None = None):
        self.db = db
        self.features = set(features)
        self.heartbeat_max_age_s = heartbeat_max_age_s
        self._latency = _Latency()
        self._lock = threading.Lock()

    # -- reading --

    def _fold_latency(self, conn: Any, state: _Latency, completed_total: int) -> _Latency:
        """Fold completed events newer than the cursor into `state` (a copy when rebuilt)."""
        db = self.db
        # Completed events up to the cursor = all of them minus those after it (a range of
        # the primary key): if that is not what the cache has seen, prune deleted some.
        newer = db.run(conn, rs.COMPLETED_AFTER, {"cursor": state.cursor}).scalar_one()
        seen = completed_total - newer
        if seen != state.seen:
            state = _Latency()  # events were pruned: rebuild from the events that remain
        while True:
            rows = db.run(conn, rs.COMPLETED_PAGE,
                          {"cursor": state.cursor, "n": LATENCY_BATCH}).all()
            for event_id, at, prov in rows:
                state.cursor = event_id
                state.seen += 1
                latency = commit_latency_s(at, prov)
                if latency is None:
                    state.without += 1
                    continue
                state.count += 1
                state.total += latency
                for i, bound in enumerate(LATENCY_BUCKETS):
                    if latency <= bound:
                        state.buckets[i] += 1
                        break
                else:
                    state.buckets[-1] += 1
            if len(rows) < LATENCY_BATCH:
                return state

    def snapshot(self) -> dict[str, Any]:
        """Every figure, from one read transaction."""
        db = self.db
        now = now_us()
        final = FINAL_STATUSES

        def _do(conn: Any) -> dict[str, Any]:
            out: dict[str, Any] = {"now_us": now}
            # One scan of jobs and one of job_events serve every figure from each table.
            rows = db.run(conn, rs.JOBS_BY_STATUS_KIND_ATTEMPTS).all()
            jobs: dict[tuple[str, str], int] = {}
            attempts: dict[int, int] = {}
            for status, kind, tries, n in rows:
                jobs[(status, kind)] = jobs.get((status, kind), 0) + n
                if status in final:
                    attempts[tries] = attempts.get(tries, 0) + n
            out["jobs"] = [(st, kind, n) for (st, kind), n in jobs.items()]
            out["attempts"] = sorted(attempts.items())
            out["oldest_waiting"] = [tuple(r) for r in db.run(
                conn, rs.OLDEST_WAITING_BY_KIND).all()]
            events = db.run(conn, rs.EXPIRED_AND_COMPLETED).all()
            out["expired_to"] = {to: n for reason, to, n in events
                                 if reason == "lease_expired"}
            out["completed_total"] = sum(n for reason, _to, n in events
                                         if reason == "completed")
            out["workers"] = [tuple(r) for r in db.run(conn, rs.WORKER_STATES).all()]
            out["leases"] = dict(db.run(conn, rs.LEASES_BY_WORKER).all())
            if "artifacts" in self.features:
                out["artifacts"] = [tuple(r) for r in db.run(
                    conn, rs.ARTIFACTS_BY_STATE).all()]
            with self._lock:
                base = _Latency(self._latency.cursor, self._latency.seen,
                                list(self._latency.buckets), self._latency.total,
                                self._latency.count, self._latency.without)
            out["latency"] = self._fold_latency(conn, base, out["completed_total"])
            return out

        got = db.read(_do, "metrics")
        with self._lock:
            if got["latency"].cursor >= self._latency.cursor or got["latency"].seen == 0:
                self._latency = got["latency"]
        return got

    # -- exposition --

    def describe(self) -> Iterator[Any]:
        # Registering must not read the database (prometheus_client calls describe() or,
        # without it, collect() at registration).
        return iter(())

    def collect(self) -> Iterator[Any]:
        s = self.snapshot()
        now = s["now_us"]

        jobs = GaugeMetricFamily("jobcoord_jobs", "Jobs in the database by status and kind.",
                                 labels=["status", "kind"])
        totals = dict.fromkeys(STATUSES, 0)
        for status, kind, n in sorted(s["jobs"]):
            jobs.add_metric([status, kind], n)
            totals[status] += n
        yield jobs

        by_status = GaugeMetricFamily("jobcoord_jobs_by_status",
                                      "Jobs in the database by status (all kinds).",
                                      labels=["status"])
        for status in STATUSES:
            by_status.add_metric([status], totals[status])
        yield by_status

        yield GaugeMetricFamily("jobcoord_dead_jobs", "Jobs that are dead (attempts used, "
                                "deadline passed, or failed permanently).",
                                value=totals["dead"])
        yield GaugeMetricFamily("jobcoord_unknown_jobs", "Jobs in `unknown`: an external "
                                "effect had started when the lease was lost; a human must "
                                "reconcile them.", value=totals["unknown"])

        age = GaugeMetricFamily("jobcoord_oldest_waiting_age_seconds",
                                "Age of the oldest waiting job per kind (queue age), seconds "
                                "since it was submitted.", labels=["kind"])
        for kind, created in sorted(s["oldest_waiting"]):
            age.add_metric([kind], max(0.0, (now - created) / MICROS))
        yield age

        expiries = CounterMetricFamily("jobcoord_lease_expiries",
                                       "Leases that expired and were reaped (job_events with "
                                       "reason lease_expired), by the status the job went to.",
                                       labels=["to_status"])
        for to_status in ("waiting", "dead", "unknown", "cancelled"):
            expiries.add_metric([to_status], s["expired_to"].get(to_status, 0))
        yield expiries

        yield _histogram("jobcoord_job_attempts",
                         "Attempts used by each finished job (succeeded, dead, cancelled).",
                         ATTEMPT_BUCKETS, s["attempts"])

        lat: _Latency = s["latency"]
        cumulative, acc = [], 0
        for i, bound in enumerate(LATENCY_BUCKETS):
            acc += lat.buckets[i]
            cumulative.append((_le(bound), acc))
        cumulative.append(("+Inf", lat.count))
        hist = HistogramMetricFamily(
            "jobcoord_result_commit_latency_seconds",
            "From a handler's end (worker provenance: started_at + duration_s) to the "
            "completed event of the transaction that committed its result.",
            buckets=cumulative, sum_value=lat.total)
        yield hist
        yield CounterMetricFamily("jobcoord_completions_without_provenance",
                                  "Completed jobs with no worker provenance to time (driven "
                                  "by hand or through the API directly).", value=lat.without)

        refusing = GaugeMetricFamily("jobcoord_workers_refusing",
                                     "Workers whose last claim was refused, by the reason "
                                     "(gate or heartbeat) stored on the worker row.",
                                     labels=["reason"])
        reasons: dict[str, int] = {}
        for _w, _hb, refusal in s["workers"]:
            if refusal is not None:
                reasons[refusal] = reasons.get(refusal, 0) + 1
        for reason, n in sorted(reasons.items()):
            refusing.add_metric([reason], n)
        yield refusing

        hb = GaugeMetricFamily("jobcoord_worker_heartbeat_age_seconds",
                               "Seconds since each worker's last heartbeat.",
                               labels=["worker"])
        leases = GaugeMetricFamily("jobcoord_worker_leases", "Leases each worker holds.",
                                   labels=["worker"])
        for worker, beat, _refusal in s["workers"]:
            if beat is not None:
                hb.add_metric([worker], max(0.0, (now - beat) / MICROS))
            leases.add_metric([worker], s["leases"].get(worker, 0))
        yield hb
        yield leases
        yield GaugeMetricFamily("jobcoord_workers", "Worker rows known to the coordinator.",
                                value=len(s["workers"]))

        if "artifacts" in s:
            size = GaugeMetricFamily("jobcoord_artifact_bytes",
                                     "Bytes of artifact rows, by state (staged, verified, "
                                     "accepted, rejected; identical content is stored once).",
                                     labels=["state"])
            count = GaugeMetricFamily("jobcoord_artifacts", "Artifact rows, by state.",
                                      labels=["state"])
            for state, n, total in sorted(s["artifacts"]):
                size.add_metric([state], int(total))
                count.add_metric([state], n)
            yield size
            yield count


def _le(bound: float) -> str:
    return repr(float(bound))


def _histogram(name: str, doc: str, bounds: Sequence[float],
               rows: Sequence[tuple[int, int]]) -> HistogramMetricFamily:
    """A histogram from (value, count) rows."""
    cumulative = []
    total = sum(n for _v, n in rows)
    for bound in bounds:
        cumulative.append((_le(bound), sum(n for value, n in rows if value <= bound)))
    cumulative.append(("+Inf", total))
    return HistogramMetricFamily(name, doc, buckets=cumulative,
                                 sum_value=float(sum(value * n for value, n in rows)))


def registry_for(coordinator: Any) -> CollectorRegistry:
    """A registry holding only jobcoord's collector (no process metrics: they would describe
    one process, and the figures here describe the database)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobcoordCollector(
        coordinator.db, features=sorted(getattr(coordinator, "features", ()))))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(registry)


def write_textfile(registry: CollectorRegistry, path: str) -> int:
    """Write the exposition for node_exporter's textfile collector atomically: a temporary
    file in the same directory, then a rename, so the collector never reads half a file.
    Returns the bytes written."""
    data = exposition(registry)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".jobcoord-metrics-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(data)
