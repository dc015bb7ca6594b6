"""Prometheus metrics derived from the database at scrape time.

Every figure is computed from what the database holds, never from one process's memory: a
scrape of any `jobcoord serve`, or `jobcoord metrics` run anywhere against the same
database, gives the same numbers, and a restarted server gives the numbers it gave before.
The metric catalogue is docs/metrics.md.

One scrape is one read transaction (one snapshot) of statements that stay cheap at any size
(jobcoord/store/report_statements.py): jobs by status, kind and attempts from `job_counts`, which
triggers keep in the transaction of every change to `jobs`; claim refusals from
`claim_refusals`, written by each refused claim; the queue age from one index seek per
(tenant, kind).

The result commit latency needs one reading per completed job (the completed event's time
against the handler's end, which the worker records in the provenance). Its histogram is a
durable fold of the completed events (`metric_folds`): the buckets up to an event id, kept
in the database. A scrape reads the fold, folds in the completed events after it, and
stores the advanced fold (compare-and-set: two scrapers never both advance it); only events
old enough that no smaller id can still commit (`Database.events_settle_s`) are stored, the
newer ones are added for this scrape only. So no scrape, first or not, re-reads every
completed job, and a completion counted once stays counted when `prune` deletes its job.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from . import stored
from . import validate as v
from .clock import MICROS, now_us, us_of
from .states import FINAL_STATUSES, STATUSES
from .store import report_statements as rs

#: Buckets of the attempts-per-finished-job histogram (attempts are small whole numbers).
ATTEMPT_BUCKETS: tuple[float, ...] = (1, 2, 3, 5, 10)
#: Buckets of the result commit latency histogram, seconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5, 1.0, 2.5, 5.0, 10.0)
#: The name of the latency histogram's row in metric_folds.
LATENCY_FOLD = "result_commit_latency"


@dataclass
class Latency:
    """Latency histogram counts (per bucket, not cumulative), their sum in whole
    microseconds, and the completed jobs with no usable provenance. The sum is an integer:
    a sum of floats depends on the order it is added in, and the stored fold plus the
    unsettled events (a scrape) gave another float than the same events all folded (the
    next scrape), a few units in the last place less: a counter going down."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total_us: int = 0
    count: int = 0
    without: int = 0

    @property
    def total(self) -> float:
        """The sum in seconds, as exposed."""
        return self.total_us / MICROS

    def add(self, event_at_us: int, provenance_json: str | None) -> None:
        latency_us = commit_latency_us(event_at_us, provenance_json)
        if latency_us is None:
            self.without += 1
            return
        self.count += 1
        self.total_us += latency_us
        latency = latency_us / MICROS
        for i, bound in enumerate(LATENCY_BUCKETS):
            if latency <= bound:
                self.buckets[i] += 1
                return
        self.buckets[-1] += 1

    def plus(self, other: Latency) -> Latency:
        return Latency([a + b for a, b in zip(self.buckets, other.buckets, strict=True)],
                       self.total_us + other.total_us, self.count + other.count,
                       self.without + other.without)

    def to_json(self) -> str:
        return json.dumps({"buckets": self.buckets, "total_us": self.total_us,
                           "count": self.count, "without": self.without}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Latency:
        d = v.loads(text)
        if len(d["buckets"]) != len(LATENCY_BUCKETS) + 1:
            raise ValueError("the stored latency fold has other buckets")
        counts = [*d["buckets"], d["count"], d["without"]]
        if "total_us" in d:
            total_us = d["total_us"]
        else:  # a fold stored before the sum was whole microseconds: its seconds
            total = d["total"]
            if type(total) not in (int, float) or not 0 <= total < math.inf:
                raise ValueError("the stored latency fold holds a value no fold can")
            total_us = round(total * MICROS)
        # Counts and the sum are whole and never negative: a fold edited by hand (-1, NaN)
        # was printed as it stood, a counter gone down, and stored again. Unreadable, it is
        # folded again from the first event.
        if not all(type(n) is int and n >= 0 for n in [*counts, total_us]):
            raise ValueError("the stored latency fold holds a value no fold can")
        return cls(list(d["buckets"]), total_us, int(d["count"]), int(d["without"]))


def settled_horizon_us(settle_s: float, now: int | None = None) -> int | None:
    """Events at or before this time are settled (None: every committed event is)."""
    if settle_s <= 0:
        return None
    return (now_us() if now is None else now) - round(settle_s * MICROS)


def fold_rows(state: Latency | None, cursor: int, rows: Sequence[Any],
              horizon: int | None) -> tuple[Latency | None, int, bool]:
    """Fold (event_id, at, provenance) rows, in id order, into `state` while they are
    settled. Returns the state (made when rows were folded into None), the last id folded,
    and whether an unsettled event stopped the fold."""
    for event_id, at, prov in rows:
        if horizon is not None and at > horizon:
            return state, cursor, True
        if state is None:
            state = Latency()
        state.add(at, prov)
        cursor = event_id
    return state, cursor, False


def _parse_iso_us(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return us_of(dt)


def commit_latency_s(event_at_us: int, provenance_json: str | None) -> float | None:
    """`commit_latency_us` in seconds."""
    us = commit_latency_us(event_at_us, provenance_json)
    return None if us is None else us / MICROS


def commit_latency_us(event_at_us: int, provenance_json: str | None) -> int | None:
    """Microseconds from the handler's end (its start plus its duration, as the worker recorded
    them) to the completed event (taken under the write lock of the transaction that
    committed the result). None without a worker's provenance. Clamped at 0: a worker's
    clock a little ahead of the coordinator's must not give a negative observation."""
    if not provenance_json:
        return None
    try:
        prov = v.loads(provenance_json)
    except ValueError:
        return None
    if not isinstance(prov, dict):
        return None
    started = _parse_iso_us(prov.get("started_at"))
    duration = prov.get("duration_s")
    if started is None or not isinstance(duration, int | float) or isinstance(duration, bool):
        return None
    end_us = started + round(duration * MICROS)
    return max(0, event_at_us - end_us)


class JobcoordCollector(Collector):
    """A prometheus_client collector over one jobcoord Database."""

    def __init__(self, db: Any, *, features: Sequence[str] = (),
                 heartbeat_max_age_s: float | None = None,
                 has_feature: Callable[[str], bool] | None = None):
        self.db = db
        self.features = set(features)
        self.heartbeat_max_age_s = heartbeat_max_age_s
        #: The coordinator's: the features as they are now, not as they were when a
        #: long-lived server started (one added beside it never showed; one removed made
        #: every scrape fail).
        self.has_feature = has_feature or (lambda name: name in self.features)

    # -- reading --

    def _latency(self, conn: Any, now: int) -> tuple[Latency, tuple[Any, ...] | None]:
        """The latency histogram: the durable fold plus every completed event after it, and
        the fold to store when settled events advanced it ((old id or None, new id, state))."""
        db = self.db
        row = db.run(conn, rs.FOLD, {"name": LATENCY_FOLD}).first()
        stored = None if row is None else row[0]
        start = stored or 0
        try:
            durable = Latency() if row is None else Latency.from_json(row[1])
        except (ValueError, KeyError, TypeError):
            durable, start = Latency(), 0  # unreadable: fold again from the first event
        horizon = settled_horizon_us(db.events_settle_s, now)
        state, tail = durable, Latency()
        seen = cursor = start  # the last event read; the last one folded durably
        stopped = False
        while True:
            rows = db.run(conn, rs.COMPLETED_ROWS, {"cursor": seen}).all()
            for event_id, at, prov in rows:
                if not stopped and (horizon is None or at <= horizon):
                    state.add(at, prov)
                    cursor = event_id
                else:  # from the first unsettled event on, for this scrape only
                    stopped = True
                    tail.add(at, prov)
            if rows:
                seen = rows[-1][0]
            if len(rows) < 5000:
                break
        advance = (stored, cursor, state) if cursor != start else None
        return state.plus(tail), advance

    def snapshot(self) -> dict[str, Any]:
        """Every figure, from one read transaction (and, when the latency fold advanced, a
        short write that stores it)."""
        db = self.db
        artifacts = self.has_feature("artifacts")  # (a read of its own when looked for)
        now = now_us()
        final = FINAL_STATUSES

        def _do(conn: Any) -> dict[str, Any]:
            out: dict[str, Any] = {"now_us": now}
            jobs: dict[tuple[str, str], int] = {}
            attempts: dict[int, int] = {}
            for row in db.run(conn, rs.JOB_COUNTS).all():
                # Rendered as labels and summed: a value of the wrong type is exit 7 (503)
                # naming it, as every read of a damaged row (jobcoord/stored.py).
                _tenant, status, kind, tries, n = stored.count_row(row)
                if n:
                    jobs[(status, kind)] = jobs.get((status, kind), 0) + int(n)
                    if status in final:
                        attempts[tries] = attempts.get(tries, 0) + int(n)
            out["jobs"] = [(st, kind, n) for (st, kind), n in jobs.items() if n]
            out["attempts"] = sorted((a, n) for a, n in attempts.items() if n)
            oldest: dict[str, int] = {}
            for _tenant, kind, created, _n in db.run(conn, rs.OLDEST_WAITING).all():
                stored.oldest_row(kind, created)
                if created is not None:
                    oldest[kind] = min(created, oldest.get(kind, created))
            out["oldest_waiting"] = sorted(oldest.items())
            out["expired_to"] = dict(db.run(conn, rs.LEASE_EXPIRIES).all())
            out["entered"] = dict(db.run(conn, rs.ENTERED).all())
            out["refusals"] = {reason: int(n) for reason, n in
                               db.run(conn, rs.CLAIM_REFUSALS).all()}
            # A worker whose stored heartbeat time is not a number (written outside
            # jobcoord) is shown as one without a heartbeat: as `workers` and claims do.
            out["workers"] = [(w, beat if type(beat) is int else None, refusal)
                              for w, beat, refusal in db.run(conn, rs.WORKER_STATES).all()]
            from .schema import workers

            for w, _beat, _refusal in out["workers"]:
                # A label of the wrong type (bytes written by hand): exit 7 naming it, as a
                # job's kind is, never the exporter's TypeError.
                stored.row(workers, {"worker_id": w}, "a worker")
            out["leases"] = dict(db.run(conn, rs.LEASES_BY_WORKER).all())
            if artifacts:
                out["artifacts"] = [tuple(r) for r in
                                    db.run(conn, rs.ARTIFACTS_BY_STATE).all()]
            out["latency"], out["advance"] = self._latency(conn, now)
            return out

        got = db.read(_do, "metrics")
        if got["advance"] is not None:
            self._store_fold(*got["advance"])
        return got

    def _store_fold(self, old: int | None, cursor: int, state: Latency) -> None:
        """Store the advanced fold if no one advanced it since we read it. A failure (a
        read-only database, a busy one) loses nothing: the next scrape folds again."""
        from .errors import JobcoordError
        params = {"name": LATENCY_FOLD, "old": old, "cursor": cursor,
                  "state": state.to_json(), "now": now_us()}
        stmt = rs.START_FOLD if old is None else rs.ADVANCE_FOLD
        with contextlib.suppress(JobcoordError):
            self.db.write(lambda conn: self.db.run(conn, stmt, params), "metrics fold")

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
            # A status jobcoord never writes (a row changed by hand; `check` names it) is
            # shown under its own label above, in no total.
            if status in totals:
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

        entered = CounterMetricFamily(
            "jobcoord_jobs_entered", "Transitions of jobs into dead or unknown (job_events), "
            "including jobs retried or reconciled since.", labels=["status"])
        for status in ("dead", "unknown"):
            entered.add_metric([status], s["entered"].get(status, 0))
        yield entered

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

        lat: Latency = s["latency"]
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

        refusals = CounterMetricFamily(
            "jobcoord_claim_refusals", "Claims refused, by reason (a gate: memory_gate, "
            "thermal_gate, power_gate, user_active; or heartbeat_stale, no_waiting_jobs, "
            "no_matching_role, ...), counted by each refused claim's own transaction.",
            labels=["reason"])
        for reason, n in sorted(s["refusals"].items()):
            refusals.add_metric([reason], n)
        yield refusals

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
    registry.register(JobcoordCollector(coordinator.db,
                                        has_feature=getattr(coordinator, "has_feature", None)))
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
