"""Fencing: the owned-lease check and every end of a held lease -- complete (and claim the
next), fail with backoff, renew, mark an external effect, checkpoint, release."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import MICROS, iso, now_us, seconds_to_us
from ..errors import DatabaseCorrupt, InvalidInput, JobcoordError, Refused
from ..states import FINAL_STATUSES
from ..store import query_statements as qs
from ..store import statements as sql
from .claim import answer, claim_in, past_damaged
from .common import Context, as_bool, ends_by, fenced_args, lease_us, record_event
from .items import NO_KINDS, checkpoint_text, completion_texts, failure_texts


def check_owner(ctx: Context, conn: Connection, job_id: int, worker_id: str, epoch: int,
                tenant: str | None, op: str) -> tuple[tuple[Any, ...] | JobcoordError, int]:
    """Check that `worker_id` holds the live lease of `job_id` at `epoch`. Returns the job
    row or the refusal (a requested cancellation is carried out here), and the time the
    decision was made at: read once the job row is locked, so a call that waited for the
    lock (a busy SQLite file, a PostgreSQL row lock) is judged when it writes, not when it
    started (rule 3), and its event is never older than the one it waited for."""
    owned, now, _row = fence(ctx, conn, job_id, worker_id, epoch, tenant, op)
    return owned, now


def fence(ctx: Context, conn: Connection, job_id: int, worker_id: str, epoch: int,
          tenant: str | None, op: str
          ) -> tuple[tuple[Any, ...] | JobcoordError, int, Any]:
    """`check_owner` with the fence row it read (None: no such job), for a caller that
    looks further into a refusal (`sent_again`)."""
    # The store holds the job row until commit (PostgreSQL: FOR UPDATE OF j; SQLite's
    # BEGIN IMMEDIATE already excludes every writer), so a concurrent reaper, completer or
    # operator is waited for and the row read is the version it committed.
    row = ctx.db.read_owned(conn, job_id)
    now = now_us()
    return judge(ctx, conn, row, job_id, worker_id, epoch, tenant, op, now), now, row


def judge(ctx: Context, conn: Connection, row: Any, job_id: int, worker_id: str, epoch: int,
          tenant: str | None, op: str, now: int) -> tuple[Any, ...] | JobcoordError:
    if row is None or (tenant is not None and row[2] != tenant):
        return Refused("job_not_found", f"job {job_id} not found", job_id=job_id)
    status, job_epoch = row[0], row[1]
    if status == "cancelled":
        return Refused("job_cancelled", f"job {job_id} was cancelled; stop working on it",
                       job_id=job_id)
    if status in FINAL_STATUSES:
        return Refused("job_finished", f"job {job_id} is already {status}; the first "
                       "outcome stands", job_id=job_id, status=status,
                       accepted_epoch=job_epoch)
    if epoch != job_epoch:
        # (Ahead of the job's: never handed out yet. An epoch damaged by hand to another
        # type compares with nothing: stale, as before.)
        ahead = isinstance(job_epoch, int) and epoch > job_epoch
        said = ("is stale" if not ahead else
                f"was never given: no claim of job {job_id} has reached it;")
        return Refused("stale_epoch", f"epoch {epoch} {said} job {job_id} is at epoch "
                       f"{job_epoch}", job_id=job_id, current_epoch=job_epoch)
    if status != "running" or row[9] is None:
        # Ended by a failure, a release or the reaper: the row cannot tell which, so the
        # message names none (this worker's own failure is not "expired and reaped").
        return Refused("lease_expired", f"the attempt at epoch {epoch} of job {job_id} has "
                       f"ended and its lease is gone; the job is {status}", job_id=job_id,
                       status=status)
    if row[9] != worker_id:
        return Refused("not_owner", f"job {job_id} is leased to another worker",
                       job_id=job_id)
    if type(row[11]) is not int:
        # SQLite keeps whatever was written: text in the lease's time, by hand.
        raise DatabaseCorrupt("value_of_wrong_type", f"job {job_id}: its lease's stored "
                              f"expires_at is {type(row[11]).__name__} {str(row[11])[:40]!r}, "
                              "not a time (written outside jobcoord); `jobcoord check` names "
                              "every such column", job_id=job_id, table="leases",
                              column="expires_at")
    if now >= row[11]:
        return Refused("lease_expired", f"the lease on job {job_id} expired at "
                       f"{iso(row[11])}", job_id=job_id, expired_at=iso(row[11]))
    if as_bool(row[3]):
        end_running(ctx, conn, job_id, epoch, now, "cancelled", "cancelled", worker_id,
                    detail={"during": op})
        return Refused("job_cancelled", f"job {job_id} was cancelled; stop working on it",
                       job_id=job_id)
    return tuple(row)


def end_running(ctx: Context, conn: Connection, job_id: int, epoch: int, now: int,
                to_status: str, reason: str, worker: str | None, *, result: str | None = None,
                provenance: str | None = None, error: str | None = None,
                run_after: int | None = None, detail: Mapping[str, Any] | None = None) -> None:
    """Move a running job out of `running`: drop its lease, record the event."""
    final = to_status in FINAL_STATUSES
    params = {
        "job_id": job_id, "epoch": epoch, "to_status": to_status, "result": result,
        "provenance": provenance, "error": error, "finished": now if final else None,
        "run_after": now if run_after is None else run_after, "now": now,
    }
    updated = ctx.db.end_running(conn, params, reason=reason, worker=worker,
                                 detail=v.dumps(detail) if detail else None)
    if updated != 1:  # only reachable if a caller skipped check_owner: fail loudly
        raise JobcoordError("internal_error", f"job {job_id} changed under its write lock")
    if to_status == "waiting":
        ctx.db.announce_jobs(conn)



def reject_event(ctx: Context, conn: Connection, refusal: JobcoordError, job_id: int,
                 worker: str, epoch: int, now: int, op: str) -> None:
    """A late or stale result is evidence worth keeping: record it without a transition."""
    if refusal.code in ("job_not_found", "job_cancelled"):
        return
    status = ctx.db.run(conn, sql.JOB_STATUS, {"job_id": job_id}).scalar()
    record_event(ctx, conn, job_id, now, status, status, f"{op}_refused", worker, epoch,
                 {"refusal": refusal.code})


class Completion(NamedTuple):
    """A completion checked before any transaction: its fenced arguments, its result and
    provenance as stored text, and the artifacts it links (None: none)."""

    job_id: int
    worker_id: str
    epoch: int
    tenant: str | None
    result: str
    provenance: str | None
    plan: Any


def completion_parts(ctx: Context, job_id: Any, worker_id: str, epoch: Any, result: Any,
                     provenance: Mapping[str, Any] | None, tenant: str | None,
                     *, planned: bool = True) -> Completion:
    """Validate a completion before any transaction (shared by complete, complete_and_claim
    and complete_many). `planned`: also verify the artifacts the attempt staged (`plan`);
    complete_many does that for each item once every item is valid (`with_plan`)."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch,
                                                   tenant)
    result_text, prov_text = completion_texts(result, provenance, ctx.policy.max_result_bytes)
    if isinstance(provenance, Mapping) and provenance.get("worker", worker_id) != worker_id:
        # `show` names the provenance's worker as the result's: through the server any
        # worker token could have named another worker there.
        raise InvalidInput("invalid_input", "provenance: its \"worker\" names another worker "
                           f"than the one completing ({worker_id}); leave it out or give "
                           "this one", field="provenance")
    c = Completion(job_id, worker_id, epoch, tenant, result_text, prov_text, None)
    return with_plan(ctx, c) if planned else c


def with_plan(ctx: Context, c: Completion) -> Completion:
    """The completion with its plan: the artifacts the attempt staged, re-hashed and
    validated before the transaction (file I/O never runs inside one), to be linked inside
    it. Refused `artifact_invalid` (the attempt failed) when one fails its validation."""
    if "artifacts" not in ctx.features:
        return c
    from ..artifacts import rules as artifact_rules

    plan = artifact_rules.prepare_completion(ctx, c.job_id, c.worker_id, c.epoch, c.tenant)
    return c._replace(plan=plan)


def completion_end(c: Completion, now: int) -> dict[str, Any]:
    """An accepted completion's end: the parameters of `end_running` (with its reason,
    worker and detail), and its answer."""
    return {"job_id": c.job_id, "epoch": c.epoch, "to_status": "succeeded",
            "result": c.result, "provenance": c.provenance, "error": None,
            "finished": now, "run_after": now, "now": now, "reason": "completed",
            "worker": c.worker_id, "detail": None}


def completion(ctx: Context, job_id: Any, worker_id: str, epoch: Any, result: Any,
               provenance: Mapping[str, Any] | None, tenant: str | None
               ) -> tuple[Callable[[Connection], tuple[dict[str, Any] | JobcoordError, int]],
                          str]:
    """Validate a completion before any transaction; return the fenced step that accepts
    it inside one (shared by complete and complete_and_claim) and the worker id."""
    return completion_step(ctx, completion_parts(ctx, job_id, worker_id, epoch, result,
                                                 provenance, tenant)), worker_id


def completion_step(ctx: Context, c: Completion
                    ) -> Callable[[Connection], tuple[dict[str, Any] | JobcoordError, int]]:
    """The fenced step that accepts a checked completion inside a write transaction."""
    job_id, worker_id, epoch = c.job_id, c.worker_id, c.epoch

    def finish(conn: Connection) -> tuple[dict[str, Any] | JobcoordError, int]:
        owned, now, row = fence(ctx, conn, job_id, worker_id, epoch, c.tenant, "complete")
        if isinstance(owned, JobcoordError):
            if sent_again(ctx, conn, owned, c, None if row is None else row[8]):
                return said_sent_again(owned), now
            reject_event(ctx, conn, owned, job_id, worker_id, epoch, now, "complete")
            return owned, now
        if c.plan:
            from ..artifacts import rules as artifact_rules

            changed = artifact_rules.link_accepted(ctx, conn, c.plan, job_id, worker_id,
                                                   epoch, now)
            if changed is not None:
                reject_event(ctx, conn, changed, job_id, worker_id, epoch, now, "complete")
                return changed, now
        end_running(ctx, conn, job_id, epoch, now, "succeeded", "completed", worker_id,
                    result=c.result, provenance=c.provenance)
        return {"job_id": job_id, "status": "succeeded", "epoch": epoch,
                "finished_at": now}, now

    return finish


def sent_again(ctx: Context, conn: Connection, refusal: JobcoordError, c: Completion,
               stored_result: Any) -> bool:
    """Is this refused completion the accepted one sent again (its answer lost): the job
    succeeded at its epoch, by this worker's `completed` event, with this very result? No new
    evidence then: no `complete_refused` is recorded (as for a failure report sent again).
    `stored_result`: the job's result column, from its fence row."""
    details = refusal.details
    if (refusal.code != "job_finished" or details.get("status") != "succeeded"
            or details.get("accepted_epoch") != c.epoch):
        return False
    return stored_result == c.result and ctx.db.run(conn, qs.event_by(False), {
        "job_id": c.job_id, "worker": c.worker_id, "epoch": c.epoch, "reason": "completed",
        "tenant": None}).first() is not None


def said_sent_again(refusal: JobcoordError) -> Refused:
    """The refusal of the accepted completion sent again, saying so (`same_as_accepted`):
    a client whose answer was lost learns that this very result stands (the server answers
    it `already_accepted`); another result of that epoch is refused without it."""
    return Refused(refusal.code, refusal.message, **refusal.details, same_as_accepted=True)


def complete(ctx: Context, job_id: int, worker_id: str, epoch: int, result: Any = None, *,
             provenance: Mapping[str, Any] | None = None, tenant: str | None = None
             ) -> dict[str, Any]:
    """Accept the result of the lease owner at the current epoch, before expiry."""
    finish, _ = completion(ctx, job_id, worker_id, epoch, result, provenance, tenant)
    return ctx.db.write(lambda conn: finish(conn)[0], "complete")


def complete_and_claim(ctx: Context, job_id: int, worker_id: str, epoch: int,
                       result: Any = None,
                       *, provenance: Mapping[str, Any] | None = None,
                       tenant: str | None = None, lease_s: float | None = None,
                       kinds: Sequence[str] | None = None, worker_view: bool = False
                       ) -> dict[str, Any]:
    """Complete this worker's job and claim its next one in the same write transaction:
    one commit per job in steady state instead of two.

    The completion is judged exactly like `complete` (same refusals, same events); a
    refused completion raises its refusal and claims nothing. After an accepted
    completion the claim follows every rule of `claim` (heartbeat, gates, order;
    `worker_view` as there).
    Returns {"completed": <complete's answer>, "next": <claim's answer>}."""
    finish, worker_id = completion(ctx, job_id, worker_id, epoch, result, provenance,
                                   tenant)
    lease = lease_us(ctx, lease_s)
    kind_filter = None if kinds is None else v.names(kinds, "kind", empty=NO_KINDS)
    worker_view = v.flag(worker_view, "worker_view")

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        done, now = finish(conn)
        if isinstance(done, JobcoordError):
            return done
        # The next claim is bound to the same tenant the completion was fenced by.
        nxt = claim_in(ctx, conn, worker_id, lease, kind_filter, now, tenant, worker_view)
        if nxt["job"] is not None:
            note_next(ctx, conn, done["job_id"], done["epoch"], worker_id, nxt)
        return {"completed": done, "next": nxt}

    # A damaged next job rolls the whole transaction back, completion included: the retry
    # after setting it aside judges the completion again from scratch.
    return past_damaged(ctx, lambda: ctx.db.write(_do, "complete_and_claim"))


def note_next(ctx: Context, conn: Connection, job_id: int, epoch: int, worker_id: str,
              nxt: Mapping[str, Any]) -> None:
    """Name, in the detail of the accepted completion's event, the `claimed` event of the
    job its transaction claimed next ({"next_claim": <event id>}): how the completion sent
    again after its answer was lost finds that job (`claimed_next`). The event's id, not the
    job's: the completed job's readers may be of another tenant than the next job."""
    ctx.db.run(conn, sql.NOTE_COMPLETED, {
        "job_id": job_id, "epoch": epoch, "worker": worker_id,
        "next_job": nxt["job"]["job_id"], "next_epoch": nxt["lease"]["epoch"]})


def claimed_next(ctx: Context, job_id: Any, worker_id: Any, epoch: Any, *,
                 tenant: Any = None) -> dict[str, Any] | None:
    """The job this worker's chained completion of `job_id` at `epoch` claimed (in its
    transaction: `complete_and_claim`), as that claim answered it ({"job", "lease"}), while
    it is exactly as the claim left it: running at that epoch under this worker's lease, the
    lease unexpired and never renewed, no event, checkpoint or artifact of the attempt since
    (no call of the worker touched it: the answer naming it was never heard). Else None.
    What a chained completion sent again after its answer was lost is handed back: the same
    job, epoch and lease, instead of a job leased to nobody until the reaper ends it (an
    attempt used without a run). A read: nothing is written."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch, tenant)

    def _do(conn: Connection) -> dict[str, Any] | None:
        now = now_us()
        ends = ctx.db.run(conn, qs.ends_by(tenant is not None), {
            "job_id": job_id, "worker": worker_id, "epoch": epoch, "reason": "completed",
            "tenant": tenant}).all()
        claimed = _json_object(ends[0][1]).get("next_claim") if ends else None
        if type(claimed) is not int:
            return None
        event = ctx.db.run(conn, qs.EVENT_ROW, {"event_id": claimed}).first()
        if event is None or event[2] != "claimed" or event[3] != worker_id:
            return None
        nxt, at, nxt_epoch = event[0], event[1], event[4]
        job = ctx.db.run(conn, qs.CLAIM_ANSWER_ROW, {"job_id": nxt}).first()
        lease = ctx.db.run(conn, qs.LEASE_OF, {"job_id": nxt}).first()
        if (job is None or job[8] != "running" or job[6] != nxt_epoch
                or (tenant is not None and job[7] != tenant) or lease is None
                or tuple(lease[:3]) != (worker_id, nxt_epoch, at)
                or type(lease[3]) is not int or lease[3] <= now
                or iso(lease[3]) != _json_object(event[5]).get("expires_at")):
            return None  # ended, reaped, claimed again, renewed, or past its lease
        if ctx.db.run(conn, qs.EVENT_AFTER, {"job_id": nxt, "event_id": claimed}).first():
            return None  # an effect, or any other event of the attempt since
        if any(r[2] == nxt_epoch for r in ctx.db.run(conn, sql.CHECKPOINTS, {"job_id": nxt})):
            return None
        if "artifacts" in ctx.features and any(
                r[6] == nxt_epoch for r in ctx.db.run(conn, qs.ARTIFACTS_OF, {"job_id": nxt})):
            return None
        return answer(ctx, conn, worker_id, tuple(job[:8]), lease[3])

    return ctx.db.read(_do, "claimed_next")


def _json_object(text: Any) -> dict[str, Any]:
    """An event's detail as stored, when it is a JSON object; else {} (written outside
    jobcoord, or none)."""
    if not isinstance(text, str):
        return {}
    try:
        got = json.loads(text)
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def fail(ctx: Context, job_id: int, worker_id: str, epoch: int, error: str, *,
         permanent: bool = False, reason: str = "failed", tenant: str | None = None,
         effect_not_applied: bool = False) -> dict[str, Any]:
    """Report a failed attempt. Retryable failures go back to `waiting` after the
    policy's backoff, until max attempts or the deadline; then (or if permanent) `dead`.

    reason="worker_shutdown" is a release, not a failure of the job: a worker stopping
    gives the job back at once, without backoff, and gives the attempt back (max_attempts
    grows by one: a deploy or a closed laptop lid must not use up retries). The attempt
    still counts in `attempts` and the event history. Only the policy's `max_releases`
    releases are free; each one past them counts as a normal attempt.

    After the attempt marked an external effect (mark_effect), any end that is not
    permanent (a retryable failure, reason "timeout", a release) makes the job `unknown`
    for `reconcile` (rule 6): the effect is never silently run again. Pass
    effect_not_applied=True only when the worker knows the effect did not happen; the
    normal path is then taken and the event records it."""
    step = failure(ctx, job_id, worker_id, epoch, error, permanent=permanent, reason=reason,
                   tenant=tenant, effect_not_applied=effect_not_applied)
    return ctx.db.write(step, "fail")


#: Why a permanent failure's job is dead (its event's `dead_because`).
PERMANENT = "permanent failure"


class Failure(NamedTuple):
    """A failure report checked before any transaction."""

    job_id: int
    worker_id: str
    epoch: int
    tenant: str | None
    error: str
    reason: str
    permanent: bool
    effect_not_applied: bool


def failure_parts(job_id: Any, worker_id: Any, epoch: Any, error: Any, *,
                  permanent: Any = False, reason: Any = "failed", tenant: Any = None,
                  effect_not_applied: Any = False) -> Failure:
    """Validate a failure report before any transaction (shared by fail and fail_many)."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch, tenant)
    error, reason = failure_texts(error, reason)
    return Failure(job_id, worker_id, epoch, tenant, error, reason,
                   v.flag(permanent, "permanent"),
                   v.flag(effect_not_applied, "effect_not_applied"))


def failure_end(ctx: Context, conn: Connection, f: Failure, owned: Sequence[Any], now: int
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Where an accepted failure takes its job (judged on `owned`, the fence row): the
    parameters of `end_running` (with its reason, worker and detail), and the answer."""
    job_id = f.job_id
    attempts, max_attempts, deadline = owned[5], owned[6], owned[7]
    detail: dict[str, Any] = {"error": f.error, "attempt": attempts}
    if f.effect_not_applied:
        detail["effect_not_applied"] = True
    effect = as_bool(owned[4]) and not f.effect_not_applied
    backoff_us = seconds_to_us(ctx.policy.backoff_s(attempts))
    release = f.reason == "worker_shutdown" and not f.permanent and not effect
    if release and ctx.db.run(conn, sql.RELEASES, {"job_id": job_id}
                              ).fetchone()[0] >= ctx.policy.max_releases:
        release = False  # past the bound: this release counts as an attempt
        detail["releases_exhausted"] = ctx.policy.max_releases
    if release:
        backoff_us = 0
    if f.permanent:
        to_status, why = "dead", PERMANENT
    elif effect:
        to_status, why = "unknown", "an external effect had started"
    elif release and (deadline is None or now < deadline):
        # A free release gives its attempt back (the attempt still counts in `attempts`):
        # the job keeps every real attempt it had. Granting only on the last attempt left a
        # job of three attempts released twice with one.
        to_status, why = "waiting", None
        granted = max(max_attempts, attempts) + 1
        ctx.db.run(conn, sql.GRANT_ATTEMPT, {"job_id": job_id, "max_attempts": granted})
        detail["max_attempts"] = max_attempts = granted
    elif attempts >= max_attempts:
        to_status, why = "dead", f"all {max_attempts} attempts used"
    elif deadline is not None and now + backoff_us >= deadline:
        to_status, why = "dead", "the next attempt would start past the deadline"
    else:
        to_status, why = "waiting", None
        detail["backoff_s"] = backoff_us / MICROS
        detail["run_after"] = iso(ends_by(now, backoff_us))
    if why and to_status == "unknown":
        detail["because"] = why
    elif why:
        detail["dead_because"] = why
    end = {"job_id": job_id, "epoch": f.epoch, "to_status": to_status, "result": None,
           "provenance": None, "error": f.error,
           "finished": now if to_status in FINAL_STATUSES else None,
           "run_after": ends_by(now, backoff_us) if to_status == "waiting" else now,
           "now": now,
           "reason": f.reason, "worker": f.worker_id, "detail": v.dumps(detail)}
    out = {"job_id": job_id, "status": to_status, "attempt": attempts,
           "max_attempts": max_attempts}
    if to_status == "waiting":
        out["run_after"] = ends_by(now, backoff_us)
    elif to_status == "unknown":
        out["because"] = why
    else:
        out["dead_because"] = why
    return end, out


#: Where an accepted failure report takes its job (`failure_end`).
FAILURE_ENDS = ("waiting", "dead", "unknown")


def recorded_failure(ctx: Context, conn: Connection, f: Failure) -> dict[str, Any] | None:
    """Was this very report (worker, epoch, reason, error, permanent) the failure recorded
    for its job? {"status": where it took the job, "attempt"}, else None. What a report sent
    again after its answer was lost is told (`already_accepted`), and why its refusal is not
    recorded again as new evidence. Read through the job's events at that epoch; a detail
    that does not parse is not this report."""
    stmt = qs.ends_by(f.tenant is not None)
    params = {"job_id": f.job_id, "worker": f.worker_id, "epoch": f.epoch,
              "reason": f.reason, "tenant": f.tenant}
    for to_status, detail in ctx.db.run(conn, stmt, params).all():
        recorded = _json_object(detail)
        if (to_status in FAILURE_ENDS and "error" in recorded
                and recorded["error"] == f.error
                and (recorded.get("dead_because") == PERMANENT) == f.permanent):
            return {"status": to_status, "attempt": recorded.get("attempt")}
    return None


def failure(ctx: Context, job_id: Any, worker_id: Any, epoch: Any, error: Any, *,
            permanent: Any = False, reason: Any = "failed", tenant: Any = None,
            effect_not_applied: Any = False
            ) -> Callable[[Connection], dict[str, Any] | JobcoordError]:
    """Validate a failure report before any transaction; return the fenced step that
    judges it inside one (shared by fail and fail_many)."""
    return failure_step(ctx, failure_parts(job_id, worker_id, epoch, error,
                                           permanent=permanent, reason=reason, tenant=tenant,
                                           effect_not_applied=effect_not_applied))


def failure_step(ctx: Context, f: Failure
                 ) -> Callable[[Connection], dict[str, Any] | JobcoordError]:
    """The fenced step that judges a checked failure report inside a write transaction."""

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        owned, now = check_owner(ctx, conn, f.job_id, f.worker_id, f.epoch, f.tenant, "fail")
        if isinstance(owned, JobcoordError):
            if not repeated(ctx, conn, owned, f):
                reject_event(ctx, conn, owned, f.job_id, f.worker_id, f.epoch, now, "fail")
            return owned
        end, out = failure_end(ctx, conn, f, owned, now)
        end_running(ctx, conn, f.job_id, f.epoch, now, end["to_status"], f.reason,
                    f.worker_id, error=f.error, run_after=end["run_after"],
                    detail=json.loads(end["detail"]))
        return out

    return _do


def repeated(ctx: Context, conn: Connection, refusal: JobcoordError, f: Failure) -> bool:
    """Is this refused report the recorded failure sent again (its answer lost)? It is no
    new evidence: no `fail_refused` event is recorded for it."""
    return (refusal.code not in ("job_not_found", "job_cancelled")
            and recorded_failure(ctx, conn, f) is not None)


def renew(ctx: Context, job_id: int, worker_id: str, epoch: int, *, lease_s: float | None = None,
          tenant: str | None = None) -> dict[str, Any]:
    """Extend a live lease of this owner and epoch to now + lease_s, never to earlier than
    it already runs (after the clock jumped back, now + lease_s can be before it)."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch,
                                                   tenant)
    lease = lease_us(ctx, lease_s)

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        owned, now = check_owner(ctx, conn, job_id, worker_id, epoch, tenant, "renew")
        if isinstance(owned, JobcoordError):
            return owned
        # Never shorten: a lease moved before its grant time would break the schema's
        # expiry check and turn a clock step into an internal error.
        expires = max(ends_by(now, lease), owned[11])
        ctx.db.run(conn, sql.RENEW, {"job_id": job_id, "epoch": epoch, "worker": worker_id,
                                     "now": now, "expires": expires})
        return {"job_id": job_id, "epoch": epoch, "expires_at": expires,
                "expires_at_us": expires}

    return ctx.db.write(_do, "renew")


def mark_effect(ctx: Context, job_id: int, worker_id: str, epoch: int, *,
                tenant: str | None = None) -> dict[str, Any]:
    """Record that this attempt started an external effect it cannot undo. If its lease
    then expires, the job becomes `unknown` instead of running the effect again."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch,
                                                   tenant)

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        owned, now = check_owner(ctx, conn, job_id, worker_id, epoch, tenant, "effect")
        if isinstance(owned, JobcoordError):
            return owned
        if not as_bool(owned[4]):
            ctx.db.run(conn, sql.MARK_EFFECT, {"job_id": job_id, "epoch": epoch, "now": now,
                                               "t": True})
            record_event(ctx, conn, job_id, now, "running", "running", "effect_started",
                         worker_id, epoch)
        return {"job_id": job_id, "epoch": epoch, "effect_started": True}

    return ctx.db.write(_do, "effect")


def checkpoint(ctx: Context, job_id: int, worker_id: str, epoch: int, name: str,
               data: Any = None, *, tenant: str | None = None) -> dict[str, Any]:
    """Commit step progress under the current epoch; the next attempt's claim returns it."""
    job_id, worker_id, epoch, tenant = fenced_args(job_id, worker_id, epoch,
                                                   tenant)
    name, data_text = checkpoint_text(name, data, ctx.policy.max_payload_bytes)

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        owned, now = check_owner(ctx, conn, job_id, worker_id, epoch, tenant, "checkpoint")
        if isinstance(owned, JobcoordError):
            return owned
        ctx.db.run(conn, sql.UPSERT_CHECKPOINT, {"job_id": job_id, "name": name,
                                                 "data": data_text, "epoch": epoch,
                                                 "worker": worker_id, "now": now})
        return {"job_id": job_id, "name": name, "epoch": epoch, "saved_at": now}

    return ctx.db.write(_do, "checkpoint")
