"""Artifact rows: staging under a live lease, verification and fenced linking at completion,
and reading (the per-kind settings are in settings.py, gc in retention.py).

The object store (objects.py) holds the bytes; this module holds the rules that tie them to
jobs. Order of writes, everywhere: the object is stored and fsynced first, outside any
transaction; the row naming it is committed after, in a short transaction. A crash between
the two leaves an object no row references (removed by `gc` after the grace), never a row
that references a missing object.

States of a row (one row per job, attempt epoch and name):

    staged   -- put by the lease owner at its current epoch, before the lease expired
    verified -- re-hashed from the stored bytes when its attempt completes
    accepted -- linked in the transaction that accepted that attempt's completion
    rejected -- failed validation (reason code), or its attempt ended without completing

Every stage is a `job_events` row (reasons artifact_staged, artifact_verified,
artifact_accepted, artifact_rejected).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobcoord import faults, interrupts
from jobcoord.artifacts.objects import ObjectStore, Source, parse_digest, validate_name
from jobcoord.artifacts.retention import (  # noqa: F401 -- the artifacts API, as before
    DEFAULT_GRACE_S,
    TEMP_MIN_AGE_S,
    gc_artifacts,
    referenced_digests,
    refuse_missing_store,
    removal_check,
    some_referenced,
)
from jobcoord.artifacts.settings import (  # noqa: F401 -- the artifacts API, as before
    DEFAULT_MEDIA_TYPE,
    ENV_STORE,
    GC_LOCK_WAIT_S,
    ArtifactSettings,
    KindRule,
    another_databases,
    database_identity,
    declare_kind,
    gc_lock,
    is_user,
    kind_rule,
    location_of,
    media_type_of,
    need_feature,
    not_its_store,
    record_user,
    refuse_a_backups_directory,
    refuse_broken_lock,
    refuse_if_not_its_store,
    settings_from_mapping,
    settings_of,
    store_of,
    store_root,
    store_users,
)
from jobcoord.clock import iso, now_us
from jobcoord.core.common import fenced_args, record_event
from jobcoord.core.fencing import check_owner, reject_event
from jobcoord.errors import (
    DatabaseBusy,
    DatabaseCorrupt,
    InvalidInput,
    JobcoordError,
    Refused,
    StorageUnavailable,
)
from jobcoord.leftovers import is_real_directory
from jobcoord.store import feature_statements as fs
from jobcoord.validate import whole

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from jobcoord.coordinator import Coordinator

VALIDATOR_TIMEOUT_S = 300.0


def _row(r: Any) -> dict[str, Any]:
    return {"artifact_id": r[0], "job_id": r[1], "epoch": r[2], "name": r[3], "digest": r[4],
            "size": r[5], "media_type": r[6], "state": r[7], "reason": r[8],
            "location": r[9], "created_at": iso(r[10]),
            "verified_at": None if r[11] is None else iso(r[11])}


# --- staging --------------------------------------------------------------------------------


def put_artifact(coord: Coordinator, job_id: Any, worker: str, epoch: Any, name: Any,
                 source: Source, media_type: str | None = None, *,
                 tenant: str | None = None, expected_digest: str | None = None,
                 max_bytes: int | None = None) -> dict[str, Any]:
    """Stage an artifact for the attempt (job, epoch) held by `worker`: store the bytes, then
    record the row under the live lease, as `checkpoint` writes (rule: owner, current epoch,
    lease not expired). The lease is checked before the bytes are read too, so a caller
    without it stores nothing; a stage refused at its commit leaves at most an unreferenced
    object for gc. `expected_digest`: bytes hashing to anything else are refused
    (`artifact_invalid`), nothing stored. `max_bytes`: a limit of the caller's (an upload's),
    on top of the kind's."""
    if max_bytes is not None:
        max_bytes = whole(max_bytes, "max_bytes", 0, 2**62)
    # A test makes a staging slow here (a large file, a slow disk or network).
    faults.point("artifacts.put")
    need_feature(coord)
    job_id, worker, epoch, tenant = fenced_args(job_id, worker, epoch, tenant)
    name = validate_name(name)
    media_type = media_type_of(media_type, name)
    if expected_digest is not None:
        parse_digest(expected_digest)
    store = store_of(coord)

    def _owned_kind(conn: Connection) -> str | JobcoordError:
        owned, now = check_owner(coord, conn, job_id, worker, epoch, tenant, "artifact")
        if isinstance(owned, JobcoordError):
            reject_event(coord, conn, owned, job_id, worker, epoch, now, "artifact")
            return owned
        return str(coord.db.run(conn, fs.JOB_KIND, {"j": job_id}).scalar())

    kind = coord.db.write(_owned_kind, "artifact")
    # That write changed nothing (the lease held): a Ctrl-C from here stops the put while it
    # reads, not once the whole source is stored (held since that commit, it waited for
    # the stage's write: a source without an end never got there).
    interrupts.accounted()
    rule = settings_of(coord).for_kind(kind)
    limits = [m for m in (rule.max_bytes, max_bytes) if m is not None]
    # A store is made by the first stage of a database naming no object. Where its rows
    # name some, a store not there moved away (or --artifacts is mistyped): made again
    # here, empty, the worker went on staging into it and the earlier objects were missing.
    first = not store.present()
    if not is_user(store, database_identity(coord.db)):
        # Until a stage records this database: into a backup's directory, it made it a live
        # store, and the backup no longer restored (its directory no longer a backup's).
        refuse_a_backups_directory(store.root, "staged into")
    if first:
        try:
            refuse_missing_store(coord, store, "artifact put")
        except InvalidInput:
            if not store.present():
                raise
            first = False  # made meanwhile (by a stage beside this one, or a restore)
    if not first:
        # Into another database's store while this database's rows name objects: staged
        # there, it recorded this database, and the earlier artifacts read as missing
        # through it. Once a stage records it, one `stat` a stage.
        wrong = another_databases(coord.db, store,
                                  lambda: some_referenced(coord.db, "artifact put"))
        if wrong is not None:
            raise wrong
        refuse_broken_lock(store)
    obj = store.put(source, max_bytes=min(limits) if limits else None,
                    expected_digest=expected_digest, create=first)

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        owned, now = check_owner(coord, conn, job_id, worker, epoch, tenant, "artifact")
        if isinstance(owned, JobcoordError):
            reject_event(coord, conn, owned, job_id, worker, epoch, now, "artifact")
            return owned
        params = {"j": job_id, "e": epoch, "n": name, "d": obj.digest, "s": obj.size,
                  "m": media_type, "l": location_of(obj.digest), "now": now}
        replaced = coord.db.run(conn, fs.RESTAGE, params).rowcount
        if not replaced:
            coord.db.run(conn, fs.STAGE, params)
        record_event(coord, conn, job_id, now, "running", "running", "artifact_staged", worker,
                     epoch, {"name": name, "digest": obj.digest, "size": obj.size,
                      "media_type": media_type, **({"replaced": True} if replaced else {})})
        return {"job_id": job_id, "epoch": epoch, "name": name, "digest": obj.digest,
                "size": obj.size, "media_type": media_type, "state": "staged",
                "stored": obj.created}

    # The shared gc lock from "the object is there" to the row's commit: gc cannot delete
    # an old object this upload found already stored (dedup) before the row names it.
    with gc_lock(store, exclusive=False, create=False):  # made by the put above, if new
        # This database uses the store from its first row on: recorded first, so a gc from
        # another database sharing the store is refused rather than delete its objects.
        record_user(store, database_identity(coord.db))
        if not store.exists(obj.digest):
            raise DatabaseBusy("artifact_store_busy", "a concurrent gc removed the object "
                               "while it was stored; put it again", digest=obj.digest)
        with contextlib.suppress(OSError):
            os.utime(obj.path)  # young again: gc's grace counts from the latest upload
        return coord.db.write(_do, "artifact put")


# --- completion: verify and validate before, link inside ------------------------------------


@dataclass(frozen=True)
class Plan:
    """The attempt's stages as checked before the completion's transaction."""

    rows: tuple[tuple[int, str, str, int], ...]  # (artifact_id, name, digest, size)
    verified_at: int


def _stages(coord: Coordinator, job_id: int, worker: str, epoch: int, tenant: str | None
            ) -> tuple[str | None, list[Any], float] | None:
    """The job's kind, the rows the attempt staged and the seconds left of its lease, or
    None when `worker` does not hold the job's lease at `epoch` (of `tenant`, when given):
    such a completion is refused by the fence in its own transaction, and the owner's
    stages are none of its business."""
    def _read(conn: Connection) -> tuple[str | None, list[Any], float] | None:
        holder = coord.db.run(conn, fs.LEASE_HOLDER, {"j": job_id}).first()
        if (holder is None or holder[0] != worker or holder[1] != epoch
                or (tenant is not None and holder[2] != tenant)):
            return None
        kind = coord.db.run(conn, fs.JOB_KIND, {"j": job_id}).scalar()
        rows = coord.db.run(conn, fs.ATTEMPT_STAGES, {"j": job_id, "e": epoch}).all()
        return kind, list(rows), (holder[3] - now_us()) / 1e6
    return coord.db.read(_read, "reading staged artifacts")


#: The least a lease is renewed by while its completion's checks run: a lease nearly over
#: when they begin is not held by renewals a fraction of a second apart (a busy machine
#: delays one past its end).
KEEP_MIN_S = 5.0
#: The first renewal comes at most this long after the checks begin.
KEEP_FIRST_S = 0.25
#: The attempts (job, worker, epoch, tenant) of a group completion (complete_many) whose
#: checks are being made, one after another: while one's run, every one of them waits, so
#: every one's lease is kept (`_lease_kept`).
_GROUP: contextvars.ContextVar[tuple[tuple[int, str, int, str | None], ...]] = \
    contextvars.ContextVar("jobcoord_completion_group", default=())


class ChecksElsewhere(Exception):
    """Raised by a completion made inside `checks_elsewhere()` that has artifacts to check,
    before any check: its caller makes it again where long checks hold nothing back,
    keeping the leases of its `attempts` (job, worker, epoch, tenant) meanwhile
    (`leases_kept`, with `left_s`, what the completion's lease had left)."""

    def __init__(self, attempts: Sequence[tuple[int, str, int, str | None]], left_s: float):
        super().__init__("this completion's artifacts are checked elsewhere")
        self.attempts = tuple(attempts)
        self.left_s = left_s


_ELSEWHERE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "jobcoord_checks_elsewhere", default=False)


@contextlib.contextmanager
def checks_elsewhere() -> Iterator[None]:
    """Completions made in the block do no artifact checks: one that has some raises
    ChecksElsewhere (the server's database threads, which every other call shares)."""
    token = _ELSEWHERE.set(True)
    try:
        yield
    finally:
        _ELSEWHERE.reset(token)


@contextlib.contextmanager
def completion_group(attempts: Sequence[tuple[int, str, int, str | None]]) -> Iterator[None]:
    """The block makes the checks of these attempts' completions, which wait together."""
    token = _GROUP.set(tuple(attempts))
    try:
        yield
    finally:
        _GROUP.reset(token)


def _lease_kept(coord: Coordinator, job_id: int, worker: str, epoch: int,
                tenant: str | None, left_s: float) -> contextlib.AbstractContextManager[None]:
    """The attempt's lease (and those of its group: `completion_group`) renewed while the
    block runs (`leases_kept`)."""
    return leases_kept(coord, [(job_id, worker, epoch, tenant), *_GROUP.get()], left_s)


@contextlib.contextmanager
def leases_kept(coord: Coordinator, attempts: Sequence[tuple[int, str, int, str | None]],
                left_s: float) -> Iterator[None]:
    """These attempts' leases (job, worker, epoch, tenant) renewed while the block runs.
    A completion's checks (re-hashing large files, a kind's validator: up to
    VALIDATOR_TIMEOUT_S each) run after the worker's lease loop has ended; a lease shorter
    than them ran out meanwhile, the completion was refused `lease_expired` and the job ran
    again, each attempt alike. The leases are renewed by `left_s` (what the completion's
    lease had left when the checks began), at least KEEP_MIN_S (a renewal never shortens a
    lease), a third of that apart, the first soon (KEEP_FIRST_S); if this process dies, the
    renewals stop and the leases end as any other. A refused renewal ends that lease's
    keeping: its completion's fence decides."""
    from jobcoord.core import fencing

    lease_s = max(left_s, KEEP_MIN_S)
    kept = dict.fromkeys(attempts)
    done = threading.Event()

    def keep() -> None:
        wait = min(max(0.05, left_s / 3), KEEP_FIRST_S)  # (a group's may have less left)
        while kept and not done.wait(wait):
            wait = lease_s / 3
            for attempt in list(kept):
                try:
                    fencing.renew(coord, attempt[0], attempt[1], attempt[2],
                                  lease_s=lease_s, tenant=attempt[3])
                except Refused:
                    kept.pop(attempt, None)
                except Exception:  # a busy database: the next renewal may get through
                    continue

    keeper = threading.Thread(target=keep, name=f"jobcoord-checks-{attempts[0][0]}",
                              daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()
        keeper.join()


def _stopping() -> StorageUnavailable:
    """The refusal of a completion whose checks its coordinator's stop ended
    (`Coordinator.stop_checks`): a 503 over HTTP, sent again and checked again by whoever
    takes it; a stopping worker releases the job. They held the process for minutes."""
    return StorageUnavailable("server_stopping", "the coordinator is stopping: the "
                              "completion's artifact checks ended, nothing was decided; send "
                              "the completion again")


def _validate(store: ObjectStore, rule: KindRule, row: Any, stop: threading.Event
              ) -> tuple[str | None, str]:
    """(reason code or None, evidence) for one staged row, from its stored bytes; `stop`:
    the coordinator's `checks_stopped`."""
    if stop.is_set():
        raise _stopping()
    _artifact_id, name, digest, size, media_type = row
    state = store.verify(digest)
    if state != "ok":
        return f"artifact_{state}", f"the stored object is {state}"
    actual = store.size(digest)
    if actual != size:
        return "artifact_corrupt", f"stored object is {actual} bytes, the row says {size}"
    static = rule.check_static(size, media_type)
    if static:
        return static, (f"{size} bytes, over {rule.max_bytes}" if static == "artifact_too_large"
                        else f"{media_type} is not one of {', '.join(rule.media_types or ())}")
    if rule.validator:
        # Guarded: it and what it starts die with this process (a worker or a server
        # killed during the checks left them running), and are stopped at the time limit.
        from jobcoord.worker.handlers import CANNOT_START, GuardStopped, run_guarded

        try:
            code, said_bytes = run_guarded(
                [*rule.validator, store.path_of(digest)], VALIDATOR_TIMEOUT_S,
                {**os.environ, "JOBCOORD_ARTIFACT_NAME": name,
                 "JOBCOORD_ARTIFACT_MEDIA_TYPE": media_type}, stop=stop)
        except GuardStopped:
            raise _stopping() from None
        except OSError as exc:
            return "validator_failed", f"the validator could not run: {exc}"
        said = said_bytes.decode("utf-8", "replace").strip()[-500:]
        if code is None:
            return "validator_failed", (f"the validator did not finish within "
                                        f"{VALIDATOR_TIMEOUT_S:g} s: stopped")
        if code == 127 and CANNOT_START in said_bytes:
            return "validator_failed", f"the validator could not run: {said}"
        if code != 0:
            return "validator_refused", f"the validator exited {code}: {said}"
    return None, "ok"


def prepare_completion(coord: Coordinator, job_id: int, worker: str, epoch: int,
                       tenant: str | None) -> Plan | None:
    """Before the completion's transaction: re-hash every artifact the attempt staged and run
    its kind's validation (size, media type, validator command). All good: a Plan for
    `link_accepted`. Any failure: the rows are rejected with their reason codes, the attempt
    fails (reason `artifact_invalid`, a failed attempt like any other) and the completion is
    refused with `artifact_invalid` (exit 4)."""
    if "artifacts" not in coord.features:
        return None
    staged = _stages(coord, job_id, worker, epoch, tenant)
    if staged is None:
        return None  # not this lease's: nothing is hashed or judged, the fence refuses it
    kind, rows, left_s = staged
    if not rows:
        return Plan((), now_us())
    if _ELSEWHERE.get():
        raise ChecksElsewhere([(job_id, worker, epoch, tenant), *_GROUP.get()], left_s)
    store = store_of(coord)
    # Where the attempt's objects are not in this database's store, the caller's
    # --artifacts is wrong (mistyped, another machine's or database's) or the store moved:
    # not the attempt's output (judged missing, the attempt failed and the job lost a try
    # for each typo).
    refuse_if_not_its_store(coord.db, store, missing=False, job_id=job_id)
    rule = settings_of(coord).for_kind(kind or "")
    with _lease_kept(coord, job_id, worker, epoch, tenant, left_s):
        try:
            verdicts = [(row, *_validate(store, rule, row, coord.checks_stopped))
                        for row in rows]
        except DatabaseCorrupt as e:
            # Its size asked once the file had gone: the store moved meanwhile?
            refuse_if_not_its_store(coord.db, store, found=e, job_id=job_id)
            raise
    bad = [(row, reason, why) for row, reason, why in verdicts if reason]
    if bad:
        # Judged through a store that went while they were checked (a validator finds no
        # file either), or through another database's: not the attempt's doing.
        refuse_if_not_its_store(coord.db, store, job_id=job_id, missing=any(
            reason == "artifact_missing" for _, reason, _ in bad))
    if not bad:
        return Plan(tuple((r[0], r[1], r[2], r[3]) for r in rows), now_us())
    evidence = [{"name": r[1], "digest": r[2], "reason": reason, "evidence": why}
                for r, reason, why in bad]

    def _reject(conn: Connection) -> JobcoordError | None:
        owned, now = check_owner(coord, conn, job_id, worker, epoch, tenant, "complete")
        if isinstance(owned, JobcoordError):
            reject_event(coord, conn, owned, job_id, worker, epoch, now, "complete")
            return owned
        for row, reason, why in bad:
            coord.db.run(conn, fs.REJECT, {"r": reason, "a": row[0]})
            record_event(coord, conn, job_id, now, "running", "running", "artifact_rejected",
                         worker, epoch, {"name": row[1], "digest": row[2], "reason": reason,
                                 "evidence": why})
        return None

    coord.db.write(_reject, "artifact validation")
    first = evidence[0]
    message = (f"artifact {first['name']!r} of job {job_id} failed validation "
               f"({first['reason']}: {first['evidence']})")
    failed = coord.fail(job_id, worker, epoch, message, reason="artifact_invalid")
    raise Refused("artifact_invalid", message + f"; the attempt failed (job is now "
                  f"{failed['status']})", job_id=job_id, artifacts=evidence,
                  status=failed["status"])


def link_accepted(coord: Coordinator, conn: Connection, plan: Plan | None, job_id: int,
                  worker: str, epoch: int, now: int) -> Refused | None:
    """Inside the completion's transaction, after its fencing check passed: the verified
    stages become `accepted`. If the attempt staged an artifact again, or a new one, after
    the checks began, nothing is linked and the refusal is returned (`artifact_changed`):
    accepted, the job would have succeeded without what its worker staged last."""
    if not plan:
        return None
    now_staged = {(r[0], r[2]) for r in coord.db.run(conn, fs.ATTEMPT_STAGES,
                                                       {"j": job_id, "e": epoch}).all()}
    if now_staged != {(r[0], r[2]) for r in plan.rows}:
        return Refused("artifact_changed", f"job {job_id}'s attempt {epoch} staged artifacts "
                       "while its completion checked them: nothing was accepted; send the "
                       "completion again to check what is staged now", job_id=job_id,
                       epoch=epoch)
    for artifact_id, name, digest, _size in plan.rows:
        linked = coord.db.run(conn, fs.ACCEPT, {"v": plan.verified_at, "a": artifact_id,
                                                "j": job_id, "e": epoch, "d": digest}
                              ).rowcount
        if linked:
            record_event(coord, conn, job_id, now, "running", "running", "artifact_verified",
                         worker, epoch,
                         {"name": name, "digest": digest, "at": iso(plan.verified_at)})
            record_event(coord, conn, job_id, now, "running", "running", "artifact_accepted",
                         worker, epoch, {"name": name, "digest": digest})


# --- reading --------------------------------------------------------------------------------


def artifacts(coord: Coordinator, job_id: Any = None, *, all_states: bool = False,
              tenant: str | None = None) -> dict[str, Any]:
    """A job's accepted artifacts (every stage with all_states), or every job's."""
    from jobcoord import validate as v

    tenant = v.optional_name(tenant, "tenant")
    all_states = v.flag(all_states, "all_states")
    need_feature(coord)
    params: dict[str, Any] = {}
    if job_id is not None:
        params["j"] = v.whole(job_id, "job_id", 1, 2**62)
    if tenant is not None:
        params["t"] = tenant
    stmt = fs.artifact_list(job_id is not None, tenant is not None, all_states)
    rows = coord.db.read(lambda conn: coord.db.run(conn, stmt, params).all(), "artifacts")
    if job_id is not None and not rows:
        exists = coord.db.read(lambda conn: coord.db.run(
            conn, fs.JOB_OF_TENANT_EXISTS if tenant else fs.JOB_EXISTS, params).first())
        if exists is None:
            raise Refused("job_not_found", f"job {job_id} not found", job_id=job_id)
    return {"artifacts": [_row(r) for r in rows]}


def _accepted(coord: Coordinator, job_id: Any, name: Any) -> Any:
    from jobcoord import validate as v

    job_id = v.whole(job_id, "job_id", 1, 2**62)
    name = validate_name(name)
    row = coord.db.read(lambda conn: coord.db.run(
        conn, fs.ACCEPTED_NAMED, {"j": job_id, "n": name}).first(), "artifact get")
    if row is None:
        raise Refused("artifact_not_found", f"job {job_id} has no accepted artifact "
                      f"{name!r}", job_id=job_id, name=name)
    return row


def get_artifact(coord: Coordinator, job_id: Any, name: Any,
                 dest: str | os.PathLike[str], *, force: bool = False) -> dict[str, Any]:
    """Copy an accepted artifact to `dest`, verified: written beside it and renamed only after
    size and digest matched. Missing or corrupt object: DatabaseCorrupt (exit 7), nothing
    at dest. Never over the database or its files, a directory or anything but a regular
    file; over an existing file only with `force` (InvalidInput, exit 2)."""
    from ..maintenance import writable_destination

    need_feature(coord)
    if not isinstance(force, bool):
        raise InvalidInput("invalid_input", "force must be true or false", field="force")
    row = _accepted(coord, job_id, name)
    store = store_of(coord)
    dest = writable_destination(dest, force=force, database=coord.db.target.sqlite_path,
                                what="the artifact's", store=store.root)
    try:
        store.copy_to(row[4], dest, expected_size=row[5], replace=force)
    except DatabaseCorrupt as e:
        refuse_if_not_its_store(coord.db, store, found=e)  # the path's fault, if so
        raise
    return {**_row(row), "written": os.fspath(dest)}


def open_artifact(coord: Coordinator, job_id: Any, name: Any) -> Any:
    """A verified stream (ObjectReader) of an accepted artifact: the caller must treat the
    bytes as unverified until the iteration ended without an error."""
    need_feature(coord)
    row = _accepted(coord, job_id, name)
    store = store_of(coord)
    try:
        return store.read(row[4], expected_size=row[5])
    except DatabaseCorrupt as e:
        refuse_if_not_its_store(coord.db, store, found=e)  # the path's fault, if so
        raise


def verify_artifacts(coord: Coordinator, job_id: Any = None) -> dict[str, Any]:
    """Re-hash the object of every row that is not rejected (of one job, or all)."""
    need_feature(coord)
    listed = artifacts(coord, job_id, all_states=True)["artifacts"]
    store = store_of(coord)
    seen: dict[str, str] = {}
    bad = []
    for a in listed:
        if a["state"] == "rejected":
            continue
        state = seen.get(a["digest"])
        if state is None:
            try:
                parse_digest(a["digest"])
            except InvalidInput:  # changed by hand: names no object (`check` says so too)
                state = seen[a["digest"]] = "unreadable"
            else:
                state = seen[a["digest"]] = store.verify(a["digest"])
            if state == "ok":
                try:
                    if store.size(a["digest"]) != a["size"]:
                        state = seen[a["digest"]] = "corrupt"
                except DatabaseCorrupt:  # gone since its hash was read
                    state = seen[a["digest"]] = "missing"
        if state != "ok":
            bad.append({"job_id": a["job_id"], "name": a["name"], "epoch": a["epoch"],
                        "digest": a["digest"], "state": a["state"], "problem": state})
    if any(b["problem"] == "missing" for b in bad):
        refuse_if_not_its_store(coord.db, store)
    return {"ok": not bad, "checked_rows": sum(a["state"] != "rejected" for a in listed),
            "checked_objects": len(seen), "problems": bad}


# --- handlers -------------------------------------------------------------------------------


def make_outdir(job_id: int) -> str:
    """The directory a command handler writes its artifacts into ($JOBCOORD_ARTIFACTS_OUT),
    named for the worker process that owns it (see worker.handlers.sweep_orphans)."""
    import tempfile

    return tempfile.mkdtemp(prefix=f"jobcoord-w{os.getpid()}-{job_id}-artifacts-")


#: What refuses a command's file for what it is, not for how it was sent.
REFUSED_FILES = frozenset({"invalid_artifact_name", "artifact_too_large"})


def stage_outdir(coord: Any, directory: str | None, job_id: int, worker: str, epoch: int,
                 tenant: str | None, *, done: set[str] | None = None) -> list[dict[str, Any]]:
    """Stage every regular file a command left in its artifacts directory (name = file name;
    sub-directories and links are not followed), before the worker reports the completion.
    `done`: the names already staged (skipped), to which each name staged here is added, so
    a staging that failed part way is taken up again where it stopped."""
    if not directory or not is_real_directory(directory):
        # Gone, or replaced by the command with a link (its target's files are not the
        # command's to send) or a file: nothing is staged.
        return []
    staged = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False) and (done is None or entry.name not in done):
            try:
                staged.append(coord.put_artifact(job_id, worker, epoch, entry.name,
                                                 entry.path, None, tenant=tenant))
            except InvalidInput as e:
                # Said by the file's name, not by a temporary path removed right after. A
                # file no artifact may be (its name, its size: the same command leaves it
                # again) is marked `command_file`: the worker fails the attempt for good,
                # as for output `complete` would refuse. Others (an upload cut on the way)
                # stay retryable.
                marked = ({"command_file": ascii(entry.name)} if e.code in REFUSED_FILES
                          else {})
                said = e.message.replace(entry.path, ascii(entry.name))
                if ascii(entry.name) not in said:
                    said = f"{entry.name!a}: {said}"
                raise InvalidInput(e.code, said, **{**e.details, **marked}) from None
            if done is not None:
                done.add(entry.name)
    return staged


def first_accepted(coord: Any, job_ids: Sequence[int]) -> dict[str, Any] | None:
    """The first accepted artifact among these jobs (the demo shows one), or None."""
    for job_id in job_ids:
        found = artifacts(coord, job_id)["artifacts"]
        if found:
            return found[0]
    return None
