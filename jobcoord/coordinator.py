"""The public facade: open and close a coordinator, one method per operation, no SQL.

Each operation is a rule family's function in `jobcoord.core` (submit, claim, fencing,
recovery, admin, queries), running against the store behind `jobcoord.store`; reads are given
their JSON shapes by `jobcoord.present`. Every answer is a plain dict ready for JSON.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from . import present
from . import validate as v
from .clock import iso, now_us
from .core import admin, batch, fencing, queries, recovery, submit
from .core import claim as claim_rules
from .core import limits as limit_rules
from .core import schedules as schedule_rules
from .core import workers as worker_rules
from .core.common import DEFAULT_TENANT
from .core.submit import JobSpec
from .errors import InvalidInput, JobcoordError, SchemaMismatch
from .policy import Policy
from .store.base import Database, Target, resolve_target

#: How long a feature found missing is taken as missing before the schema is read again: a
#: server answering each request for a missing feature would otherwise read it each time.
FEATURE_LOOK_S = 2.0


class Coordinator:
    """The public Python API: one method per operation, each one short transaction (prune:
    one per batch). Open one per process (it holds a connection pool)."""

    #: The artifact store's directory; None: $JOBCOORD_ARTIFACTS, else `<db>.artifacts/`.
    artifacts_dir: str | None = None

    def __init__(self, db: Database, policy: Policy | None = None, *, verify: bool = True):
        if not isinstance(db, Database):
            raise InvalidInput("invalid_input", "Coordinator(db) takes an open Database; "
                               "open a path, URL or Target with Coordinator.open(...)")
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidInput("invalid_input", "policy: give a Policy (Policy.from_toml(path) "
                               "reads a policy file)")
        verify = v.flag(verify, "verify")
        self.db = db
        self.policy = policy or Policy()
        self.features: set[str] = set()
        self._missing_seen: dict[str, float] = {}  # feature -> when last found missing
        #: Set by `stop_checks`: completions checking artifacts through this coordinator end
        #: undecided (a worker or server stopping must not wait out a validator's minutes).
        self.checks_stopped = threading.Event()
        if verify:
            from .migrate import verify_schema

            self.features = verify_schema(db)
            db.schema_watch = self._schema_look

    @classmethod
    def open(
        cls,
        target: str | os.PathLike[str] | Target | None = None,
        *,
        url: str | None = None,
        policy: Policy | None = None,
        synchronous: str = "full",
        busy_timeout: float = 5.0,
        verify: bool = True,
        migrate: bool = False,
    ) -> Coordinator:
        """Open a coordinator on a SQLite path, a URL (positionally too: any string with
        "://", e.g. "postgresql+psycopg://...", "postgres://...", "sqlite:///path"), or a
        resolved Target. With migrate=True the database (a SQLite file, if missing) is created
        or upgraded to this version's schema first, as `jobcoord migrate` would."""
        verify = v.flag(verify, "verify")
        migrate = v.flag(migrate, "migrate")
        if isinstance(target, os.PathLike):
            target = os.fspath(target)
        if isinstance(target, bytes):
            raise InvalidInput("invalid_input", "target: give the SQLite path as text (a str "
                               "or a pathlib.Path), not bytes")
        if isinstance(target, str) and "://" in target:
            if url is not None:
                raise InvalidInput("invalid_input", "give the URL once: positionally or as "
                                   "url=, not both")
            target, url = None, target
        if isinstance(url, str) and url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://"):]  # the short scheme libpq accepts
        if target is not None and not isinstance(target, str | Target):
            raise InvalidInput("invalid_input", "target: give a SQLite path or a database URL")
        if not isinstance(target, Target):
            target = resolve_target(db=target, url=url)
        if migrate:
            from .migrate import migrate as _migrate

            fresh = Database.open(target, create=True, synchronous=synchronous,
                                  busy_timeout=busy_timeout)
            try:
                _migrate(fresh)
            finally:
                fresh.close()
        db = Database.open(target, synchronous=synchronous, busy_timeout=busy_timeout)
        try:
            return cls(db, policy, verify=verify)
        except BaseException:
            db.close()
            raise

    def has_feature(self, name: str) -> bool:
        """Is the optional schema feature `name` installed? The features are read when the
        Coordinator opens; one missing then is looked for again (one read), so a
        `migrate --with` run beside a long-lived process (a server, a worker) takes effect
        without a restart: within FEATURE_LOOK_S of the last look that missed it."""
        if not isinstance(name, str):
            raise InvalidInput("invalid_input", f"a feature's name is text, not "
                               f"{type(name).__name__}")
        if name in self.features:
            return True
        seen = self._missing_seen.get(name)
        if seen is not None and time.monotonic() - seen < FEATURE_LOOK_S:
            return False
        from .migrate import verify_schema

        # In place: the core reads the same set.
        self.features |= verify_schema(self.db)
        if name in self.features:
            return True
        self._missing_seen[name] = time.monotonic()
        return False

    def _schema_look(self, where: str) -> JobcoordError | None:
        """Read the schema again after a statement failed unexplained: `schema_changed` when
        its features changed (a `migrate --with/--without` ran beside this process), taken
        now; `table_missing` or `column_missing` when a table or column of its
        revisions is gone (dropped by hand, a partial restore), `schema_damaged` when a
        key is, as `check` reports them; else None."""
        from .maintenance import schema_damage
        from .migrate import verify_schema

        now = verify_schema(self.db)
        if now != self.features:
            # In place, as has_feature: the core reads the same set.
            self.features.intersection_update(now)
            self.features |= now
            self._missing_seen.clear()
            return SchemaMismatch(
                "schema_changed", f"the database's schema changed under this process "
                f"({where}): `jobcoord migrate --with/--without` ran beside it; nothing was "
                "changed, try again (the change is taken now)")
        # Keys too: a table made again by hand without them fails every upsert.
        return schema_damage(self.db, where, keys=True)

    def stop_checks(self) -> None:
        """End the artifact checks of completions in progress through this coordinator, and
        refuse new ones: each completion is refused StorageUnavailable `server_stopping`,
        nothing decided, its validator stopped (called by a stopping worker or server)."""
        self.checks_stopped.set()

    def resume_checks(self) -> None:
        """Check completions' artifacts again after `stop_checks` (a worker run inside a
        program has stopped; the program goes on with this coordinator)."""
        self.checks_stopped.clear()

    def close(self) -> None:
        """Close the connections for good: a later call is InvalidInput `coordinator_closed`
        (it quietly opened new connections, which nothing would close)."""
        self.db.closed = True
        self.db.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- operations ---------------------------------------------------------------------

    def enqueue(self, kind: str, payload: Any = None, *, priority: int | str | None = None,
                role: str | None = None, tenant: str = DEFAULT_TENANT, key: str | None = None,
                max_attempts: int | None = None, deadline_s: float | None = None,
                delay_s: float = 0.0, needs: Mapping[str, int] | str | None = None
                ) -> dict[str, Any]:
        """Accept a job (the rules: `core.submit.enqueue`). `needs` declares the resources
        it takes, e.g. {"gpu_mem_mb": 12000, "ram_mb": 8000}."""
        return submit.enqueue(self, kind, payload, priority=priority, role=role, tenant=tenant,
                              key=key, max_attempts=max_attempts, deadline_s=deadline_s,
                              delay_s=delay_s, needs=needs)

    def enqueue_many(self, specs: Iterable[JobSpec | Mapping[str, Any]]
                     ) -> list[dict[str, Any]]:
        """Accept many jobs in one transaction: all of them or none (the rules:
        `core.submit.enqueue_many`)."""
        return submit.enqueue_many(self, specs)

    def heartbeat(self, worker_id: str, *, roles: Sequence[str] | None = None,
                  readings: Mapping[str, Any] | str | None = None,
                  kinds: Sequence[str] | None = None) -> dict[str, Any]:
        """Record a worker's readings, exactly as received, with the time received (the rules:
        `core.workers.heartbeat`)."""
        return present.heartbeat_json(worker_rules.heartbeat(self, worker_id, roles=roles,
                                                             readings=readings, kinds=kinds))

    def claim(self, worker_id: str, *, lease_s: float | None = None,
              kinds: Sequence[str] | None = None, tenant: str | None = None,
              worker_view: bool = False) -> dict[str, Any]:
        """Give this worker the first eligible waiting job (of `tenant` only, when given),
        under a new lease and epoch (the rules: `core.claim.claim`; `worker_view`: a
        refusal names no other worker's lease)."""
        return present.claimed_json(claim_rules.claim(self, worker_id, lease_s=lease_s,
                                                      kinds=kinds, tenant=tenant,
                                                      worker_view=worker_view))

    def claimable(self, worker_id: str, *, kinds: Sequence[str] | None = None,
                  tenant: str | None = None) -> bool:
        """Whether this worker's claim (bound to `tenant`, when given) could take a job now;
        a read that records nothing (the rules: `core.claim.claimable`)."""
        return claim_rules.claimable(self, worker_id, kinds, tenant=tenant)

    def claim_many(self, worker_id: str, n: int, *, lease_s: float | None = None,
                   kinds: Sequence[str] | None = None, tenant: str | None = None,
                   worker_view: bool = False) -> dict[str, Any]:
        """Give this worker up to `n` (1..1000) eligible jobs (of `tenant` only, when given)
        in one write transaction, in claim order, each under its own lease, epoch and event
        (the rules: `core.claim.claim_many`)."""
        return present.claimed_many_json(
            claim_rules.claim_many(self, worker_id, n, lease_s=lease_s, kinds=kinds,
                                   tenant=tenant, worker_view=worker_view))

    def complete_many(self, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Many completions (each: job_id, worker_id, epoch, result; optionally provenance,
        tenant) in one write transaction, each fenced on its own with its own answer (the
        rules: `core.batch.complete_many`)."""
        return present.batch_json(batch.complete_many(self, items), present.completed_json)

    def fail_many(self, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Many failure reports (each: job_id, worker_id, epoch, error; optionally
        permanent, reason, tenant, effect_not_applied) in one write transaction, each judged
        on its own (the rules: `core.batch.fail_many`)."""
        return present.batch_json(batch.fail_many(self, items), present.failed_json)

    def complete(self, job_id: int, worker_id: str, epoch: int, result: Any = None, *,
                 provenance: Mapping[str, Any] | None = None, tenant: str | None = None
                 ) -> dict[str, Any]:
        """Accept the result of the lease owner at the current epoch, before expiry (the rules:
        `core.fencing.complete`)."""
        return present.completed_json(fencing.complete(
            self, job_id, worker_id, epoch, result, provenance=provenance, tenant=tenant))

    def complete_and_claim(self, job_id: int, worker_id: str, epoch: int, result: Any = None,
                           *, provenance: Mapping[str, Any] | None = None,
                           tenant: str | None = None, lease_s: float | None = None,
                           kinds: Sequence[str] | None = None, worker_view: bool = False
                           ) -> dict[str, Any]:
        """Complete this worker's job and claim its next one in the same write transaction
        (the rules: `core.fencing.complete_and_claim`)."""
        return present.completed_and_claimed_json(fencing.complete_and_claim(
            self, job_id, worker_id, epoch, result, provenance=provenance, tenant=tenant,
            lease_s=lease_s, kinds=kinds, worker_view=worker_view))

    def fail(self, job_id: int, worker_id: str, epoch: int, error: str, *,
             permanent: bool = False, reason: str = "failed", tenant: str | None = None,
             effect_not_applied: bool = False) -> dict[str, Any]:
        """Report a failed attempt (the rules: `core.fencing.fail`)."""
        return present.failed_json(fencing.fail(
            self, job_id, worker_id, epoch, error, permanent=permanent, reason=reason,
            tenant=tenant, effect_not_applied=effect_not_applied))

    def renew(self, job_id: int, worker_id: str, epoch: int, *, lease_s: float | None = None,
              tenant: str | None = None) -> dict[str, Any]:
        """Extend a live lease of this owner and epoch to now + lease_s, never to earlier than it
        already runs (after the clock jumped back, now + lease_s can be before it) (the
        rules: `core.fencing.renew`)."""
        return present.renewed_json(fencing.renew(self, job_id, worker_id, epoch,
                                                  lease_s=lease_s, tenant=tenant))

    def mark_effect(self, job_id: int, worker_id: str, epoch: int, *,
                    tenant: str | None = None) -> dict[str, Any]:
        """Record that this attempt started an external effect it cannot undo (the rules:
        `core.fencing.mark_effect`)."""
        return fencing.mark_effect(self, job_id, worker_id, epoch, tenant=tenant)

    def checkpoint(self, job_id: int, worker_id: str, epoch: int, name: str,
                   data: Any = None, *, tenant: str | None = None) -> dict[str, Any]:
        """Commit step progress under the current epoch; the next attempt's claim returns it
        (the rules: `core.fencing.checkpoint`)."""
        return present.checkpointed_json(fencing.checkpoint(self, job_id, worker_id, epoch, name,
                                                            data, tenant=tenant))

    # --- artifacts (the rules: `artifacts.rules`) ------------------------------------------

    def put_artifact(self, job_id: int, worker: str, epoch: int, name: str, source: Any,
                     media_type: str | None = None, **kw: Any) -> dict[str, Any]:
        """Stage a file, bytes or a binary stream as an artifact of this live attempt: stored
        (content-addressed, hashed) first, then recorded under the lease; linked to the
        result only by this attempt's accepted completion."""
        from .artifacts import rules as artifact_rules

        return artifact_rules.put_artifact(self, job_id, worker, epoch, name, source,
                                           media_type, **kw)

    def get_artifact(self, job_id: int, name: str, dest: Any, *, force: bool = False
                     ) -> dict[str, Any]:
        """Copy an accepted artifact to `dest`, verifying its digest (exit 7 on a mismatch or a
        missing object; nothing is written then). An existing file is replaced only with
        `force`; the database's own files, directories, devices and pipes never."""
        from .artifacts import rules as artifact_rules

        return artifact_rules.get_artifact(self, job_id, name, dest, force=force)

    def artifacts(self, job_id: int | None = None, **kw: Any) -> dict[str, Any]:
        """The artifact rows of a job (or of every job), with their states."""
        from .artifacts import rules as artifact_rules

        return artifact_rules.artifacts(self, job_id, **kw)

    def verify_artifacts(self, job_id: int | None = None) -> dict[str, Any]:
        """Re-hash the stored objects of one job's artifacts, or of all of them."""
        from .artifacts import rules as artifact_rules

        return artifact_rules.verify_artifacts(self, job_id)

    def gc_artifacts(self, **kw: Any) -> dict[str, Any]:
        """Delete objects no row references and older than the grace (`dry_run` counts)."""
        from .artifacts import rules as artifact_rules

        return artifact_rules.gc_artifacts(self, **kw)

    def reap(self, *, limit: int = 1000) -> dict[str, Any]:
        """Turn expired leases into `waiting` (or `dead` when attempts or the deadline are used
        up, `unknown` when an external effect had started, `cancelled` when asked), and
        waiting jobs past their deadline into `dead` (the rules: `core.recovery.reap`)."""
        return present.reaped_json(recovery.reap(self, limit=limit))

    def cancel(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """waiting -> cancelled at once; running -> the owner's next renew, complete, fail or
        checkpoint is told `job_cancelled` and the job ends `cancelled` (or the reaper ends it
        when the lease runs out) (the rules: `core.admin.cancel`)."""
        return admin.cancel(self, job_id, tenant=tenant)

    def retry(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """Operator: dead or unknown -> waiting, with at least one attempt left (the rules:
        `core.admin.retry`)."""
        return admin.retry(self, job_id, tenant=tenant)

    def reconcile(self, job_id: int, as_status: str, reason: str, *, result: Any = None,
                  tenant: str | None = None) -> dict[str, Any]:
        """Operator: settle an `unknown` job as succeeded (with its result), waiting or dead
        (the rules: `core.admin.reconcile`)."""
        return admin.reconcile(self, job_id, as_status, reason, result=result, tenant=tenant)

    def prune(self, older_than: Any, *, statuses: Sequence[str] | None = None,
              tenant: str | None = None, batch: Any = 500, dry_run: bool = False,
              pause_s: Any = None) -> dict[str, Any]:
        """Delete finished jobs (succeeded, dead, cancelled; `statuses` narrows it) that finished
        more than `older_than` ago (seconds, or "7d", "12h", ...), with their events,
        checkpoints and artifact rows, in write transactions of at most `batch` jobs each,
        resting `pause_s` between them (by default as long as the batch held the write lock),
        so claims never wait long behind a large prune (the rules: `core.admin.prune`)."""
        return present.pruned_json(admin.prune(self, older_than, statuses=statuses,
                                               tenant=tenant, batch=batch, dry_run=dry_run,
                                               pause_s=pause_s))


    # --- schedules (the rules: `core.schedules`) -----------------------------------------

    def add_schedule(self, name: str, kind: str, *, cron: str | None = None,
                     tz: str | None = None, every: str | float | None = None,
                     payload: Any = None, priority: int | str | None = None,
                     role: str | None = None, tenant: str = DEFAULT_TENANT,
                     max_attempts: int | None = None, window: str | float | None = None,
                     catchup: str | None = None, overlap: str | None = None
                     ) -> dict[str, Any]:
        """A durable schedule that enqueues `kind` once per slot: `cron` (five fields) in
        the IANA zone `tz` (default UTC), or `every` (seconds or 30s, 15m, 1h, 1d). The
        fired job's deadline is slot + `window`; `catchup` skip | latest | all:N handles
        slots missed while nothing ticked; `overlap` allow | skip | queue_one handles a
        previous fire's job that is still waiting or running."""
        return present.schedule_changed_json(schedule_rules.add(
            self, name, kind, cron=cron, tz=tz, every=every, payload=payload,
            priority=priority, role=role, tenant=tenant, max_attempts=max_attempts,
            window=window, catchup=catchup, overlap=overlap))

    def schedules(self) -> dict[str, Any]:
        """Every schedule with its next fire time and last outcome."""
        return {"schedules": [present.schedule_json(s, last)
                              for s, last in schedule_rules.listing(self)]}

    def pause_schedule(self, name: str) -> dict[str, Any]:
        """Stop firing a schedule until it is resumed (nothing is recorded meanwhile)."""
        return present.schedule_changed_json(schedule_rules.set_paused(self, name, True))

    def resume_schedule(self, name: str) -> dict[str, Any]:
        """Fire again from the first slot after now."""
        return present.schedule_changed_json(schedule_rules.set_paused(self, name, False))

    def remove_schedule(self, name: str) -> dict[str, Any]:
        """Delete a schedule (the jobs it fired stay)."""
        return schedule_rules.remove(self, name)

    def tick_schedules(self, *, limit: int = 100) -> dict[str, Any]:
        """Fire what is due, at most one job per (schedule, slot) whoever else ticks."""
        return present.ticked_json(schedule_rules.tick(self, limit=limit))

    # --- reading ------------------------------------------------------------------------

    def jobs(self, *, status: str | None = None, kind: str | None = None,
             tenant: str | None = None, limit: int = 100) -> dict[str, Any]:
        """List jobs, newest first."""
        rows = queries.jobs(self, status=status, kind=kind, tenant=tenant, limit=limit)
        return {"jobs": [present.job_summary_json(r) for r in rows]}

    def show(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """A job with its lease, full event history, checkpoints and provenance."""
        # Its artifacts too, once `migrate --with artifacts` ran beside a long-lived process:
        # looked for again (at most every FEATURE_LOOK_S) while missing.
        if "artifacts" not in self.features:
            self.has_feature("artifacts")
        return present.show_json(queries.show(self, job_id, tenant=tenant))

    def claimed_by(self, job_id: int, worker_id: str, epoch: int, *,
                   tenant: str | None = None) -> bool:
        """Whether this worker claimed the job at `epoch` (a job of `tenant` only, when
        given): one indexed read, not the job's history."""
        return queries.event_by(self, job_id, worker_id, epoch, "claimed", tenant=tenant)

    def completed_by(self, job_id: int, worker_id: str, epoch: int, *,
                     tenant: str | None = None) -> bool:
        """Whether the accepted completion of the job at `epoch` was this worker's (a job of
        `tenant` only, when given): one indexed read, not the job's history."""
        return queries.event_by(self, job_id, worker_id, epoch, "completed", tenant=tenant)

    def claimed_next(self, job_id: int, worker_id: str, epoch: int, *,
                     tenant: str | None = None) -> dict[str, Any] | None:
        """The job this worker's chained completion of the job at `epoch` claimed, as that
        claim answered it, while nothing has touched it since (a job of `tenant` only, when
        given); else None (the rules: `core.fencing.claimed_next`)."""
        got = fencing.claimed_next(self, job_id, worker_id, epoch, tenant=tenant)
        return None if got is None else present.claimed_json(got)

    def failed_by(self, job_id: int, worker_id: str, epoch: int, *, reason: str, error: str,
                  permanent: bool = False, tenant: str | None = None
                  ) -> dict[str, Any] | None:
        """The failure this worker reported for the job at `epoch` (with `reason`, `error`
        and `permanent`), when it was the one recorded (a job of `tenant` only, when given):
        {"status" it took the job to, "attempt"}, else None (the rules:
        `core.queries.failure_by`)."""
        return queries.failure_by(self, job_id, worker_id, epoch, reason, error,
                                  permanent=permanent, tenant=tenant)

    def workers(self, *, tenant: str | None = None) -> dict[str, Any]:
        """Every worker, its roles, heartbeat age and readings, and whether the gates would
        let it claim now. Seen by a view bound to `tenant`: each last refusal without its
        detail, which may name another tenant's kinds, jobs and the workers holding them."""
        tenant = v.optional_name(tenant, "tenant")
        return {"workers": [present.worker_json(w, gate, age, detail=tenant is None)
                            for w, gate, age in queries.workers(self)]}

    def set_limit(self, kind: str, concurrency: int, *, key: str | None = None
                  ) -> dict[str, Any]:
        """At most `concurrency` running jobs of `kind` at once, across every worker (per
        value of payload field `key` when given); the rules: `core.limits`."""
        return limit_rules.set_limit(self, kind, concurrency, key)

    def limits(self) -> dict[str, Any]:
        """Every limit with the live leases holding its slots."""
        return limit_rules.list_limits(self)

    def remove_limit(self, kind: str) -> dict[str, Any]:
        """Remove a kind's limit (refused with limit_not_found when it has none)."""
        return limit_rules.remove_limit(self, kind)

    def explain(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """Why this job is (or is not) being picked up right now."""
        job, ahead, lease, rows, now = queries.explain(self, job_id, tenant=tenant)
        diag = job.pop("constraints", None)
        return present.explain_job(
            self.policy, job, ahead, lease, rows, now,
            lambda w, at: worker_rules.worker_gate(self, w, at),
            None if diag is None else (
                lambda ready: limit_rules.explain_reasons(job, diag, ready)),
            schedule=schedule_rules.of_job(self, job["job_id"]), viewer=tenant)

    def status(self, *, tenant: str | None = None) -> dict[str, Any]:
        """Counts by status, workers, active leases, schema and storage facts. With a tenant,
        the job and lease counts are that tenant's only."""
        out = queries.status(self, tenant=tenant)
        out["time"] = iso(now_us())
        return out

    # --- inner steps the locking and query-plan checks drive directly --------------------

    def _candidate_sql(self, roles: Sequence[str], kinds: Sequence[str] | None, *,
                       due_only: bool, locked: bool = True, tenant: str | None = None
                       ) -> tuple[str, dict[str, Any]]:
        """The store's claim candidate select (`:name` parameters) and its role, kind and
        tenant parameters."""
        stmt, params = self.db.candidate_sql(roles, kinds, due_only=due_only, locked=locked,
                                             tenant=tenant)
        return stmt.named(self.db.dialect), params

    def _claim_folded_sql(self, roles: Sequence[str], kinds: Sequence[str] | None,
                          tenant: str | None = None) -> tuple[str, dict[str, Any]]:
        """PostgreSQL's one-statement claim and its role, kind and tenant parameters."""
        from .store.postgresql import claim_sql

        return claim_sql(roles, kinds, tenant)

    def _claim(self, conn: Connection, worker_id: str, lease_us: int,
               kinds: Sequence[str] | None, now: int, tenant: str | None = None
               ) -> dict[str, Any]:
        """The claim inside a write transaction the caller holds open."""
        return present.claimed_json(claim_rules.claim_in(self, conn, worker_id, lease_us, kinds,
                                                         now, tenant))
