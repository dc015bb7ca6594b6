"""Artifact rows: staging under a live lease, verification, fenced linking, reading, gc.

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
import fcntl
import mimetypes
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobcoord.artifacts.objects import ObjectStore, Source, parse_digest, validate_name
from jobcoord.clock import iso, now_us
from jobcoord.core.common import fenced_args, record_event
from jobcoord.core.fencing import check_owner, reject_event
from jobcoord.errors import (
    DatabaseBusy,
    InvalidInput,
    JobcoordError,
    Refused,
    SchemaMismatch,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from jobcoord.coordinator import Coordinator
    from jobcoord.store import Database

ENV_STORE = "JOBCOORD_ARTIFACTS"
DEFAULT_GRACE_S = 3600.0
DEFAULT_MEDIA_TYPE = "application/octet-stream"
#: How long gc waits for uploads that are committing their rows (seconds).
GC_LOCK_WAIT_S = 60.0
VALIDATOR_TIMEOUT_S = 300.0
#: gc never removes a temporary file younger than this, whatever its grace: an upload creates
#: its file an instant before it locks it (objects.py, clean_temp).
TEMP_MIN_AGE_S = 60.0
_MEDIA = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,99}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,99}")
_COLUMNS = ("artifact_id, job_id, epoch, name, digest, size, media_type, state, reason,"
            " location, created_at, verified_at")


# --- validation rules per kind --------------------------------------------------------------


@dataclass(frozen=True)
class KindRule:
    """What the artifacts of one kind must satisfy to be accepted."""

    max_bytes: int | None = None
    media_types: tuple[str, ...] | None = None  # None: any
    validator: tuple[str, ...] | None = None  # argv; the stored file's path is appended

    def check_static(self, size: int, media_type: str) -> str | None:
        if self.max_bytes is not None and size > self.max_bytes:
            return "artifact_too_large"
        if self.media_types is not None and media_type not in self.media_types:
            return "media_type_not_allowed"
        return None


@dataclass
class ArtifactSettings:
    """Per-kind rules (`rules[kind]`; `default` for kinds without their own)."""

    default: KindRule = field(default_factory=KindRule)
    rules: dict[str, KindRule] = field(default_factory=dict)

    def for_kind(self, kind: str) -> KindRule:
        return self.rules.get(kind, self.default)


def kind_rule(max_bytes: Any = None, media_types: Any = None, validator: Any = None,
              where: str = "artifacts") -> KindRule:
    """A validated KindRule (InvalidInput `invalid_policy` naming `where` otherwise)."""
    def bad(why: str) -> InvalidInput:
        return InvalidInput("invalid_policy", f"{where}: {why}")

    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or not 0 <= max_bytes <= 2**62):
        raise bad("max_bytes must be a whole number of bytes, 0..2**62")
    if media_types is not None:
        if isinstance(media_types, str) or not all(isinstance(m, str) and _MEDIA.fullmatch(m)
                                                   for m in media_types):
            raise bad("media_types must be a list of media types like 'application/pdf'")
        media_types = tuple(media_types)
    if validator is not None:
        if isinstance(validator, str):
            validator = shlex.split(validator)
        if not validator or not all(isinstance(a, str) and "\0" not in a for a in validator):
            raise bad("validator must be a command (a string or a list of arguments)")
        validator = tuple(validator)
    return KindRule(max_bytes, media_types, validator)


def settings_from_mapping(data: Mapping[str, Any] | None, source: str = "policy"
                          ) -> ArtifactSettings:
    """The `[artifacts]` table of a policy file: defaults, and `[artifacts.kinds.<kind>]`."""
    out = ArtifactSettings()
    if not data:
        return out
    if not isinstance(data, Mapping):
        raise InvalidInput("invalid_policy", f"{source}: [artifacts] must be a table")
    keys = {"max_bytes", "media_types", "validator"}
    for key in data:
        if key not in keys | {"kinds"}:
            raise InvalidInput("invalid_policy", f"{source}: unknown setting artifacts.{key}")
    out.default = kind_rule(data.get("max_bytes"), data.get("media_types"),
                            data.get("validator"), f"{source}: artifacts")
    for kind, rule in dict(data.get("kinds") or {}).items():
        if not isinstance(rule, Mapping) or set(rule) - keys:
            raise InvalidInput("invalid_policy", f"{source}: artifacts.kinds.{kind} takes "
                               f"{', '.join(sorted(keys))}")
        merged = {"max_bytes": out.default.max_bytes, "media_types": out.default.media_types,
                  "validator": out.default.validator, **rule}
        out.rules[str(kind)] = kind_rule(merged["max_bytes"], merged["media_types"],
                                         merged["validator"], f"{source}: artifacts.kinds.{kind}")
    return out


def settings_of(coord: Coordinator) -> ArtifactSettings:
    found = getattr(coord, "artifact_settings", None)
    if found is None:
        found = getattr(coord.policy, "artifacts", None) or ArtifactSettings()
    return found


def declare_kind(coord: Coordinator, kind: str, *, max_bytes: int | None = None,
                 media_types: Sequence[str] | None = None,
                 validator: str | Sequence[str] | None = None) -> None:
    """Declare a kind's artifact rules from Python (a handler's application does this)."""
    settings = getattr(coord, "artifact_settings", None)
    if settings is None:
        base = settings_of(coord)
        settings = ArtifactSettings(base.default, dict(base.rules))
        coord.artifact_settings = settings  # type: ignore[attr-defined]
    settings.rules[kind] = kind_rule(max_bytes, media_types, validator, f"kind {kind!r}")


# --- where the store is ---------------------------------------------------------------------


def store_root(db: Database, explicit: str | os.PathLike[str] | None = None) -> str:
    """The store directory: the explicit one (--artifacts), else $JOBCOORD_ARTIFACTS, else for
    SQLite `<database>.artifacts`; PostgreSQL has no default."""
    root = explicit or os.environ.get(ENV_STORE)
    if root:
        return os.path.abspath(os.fspath(root))
    if db.target.sqlite_path:
        return db.target.sqlite_path + ".artifacts"
    raise InvalidInput("artifact_store_required",
                       "artifacts on PostgreSQL need a store directory: pass --artifacts DIR "
                       f"(or set {ENV_STORE}); every coordinator and worker must name the same "
                       "one")


def store_of(coord: Coordinator) -> ObjectStore:
    return ObjectStore(store_root(coord.db, getattr(coord, "artifacts_dir", None)))


def _need(coord: Coordinator) -> None:
    if "artifacts" not in coord.features:
        raise SchemaMismatch("feature_missing", "artifact storage is not installed in this "
                             "database: run `jobcoord migrate --with artifacts`")


def _location(digest: str) -> str:
    h = parse_digest(digest)
    return f"objects/sha256/{h[:2]}/{h[2:4]}/{h}"


def _media_type(media_type: Any, name: str) -> str:
    if media_type is None:
        return mimetypes.guess_type(name, strict=False)[0] or DEFAULT_MEDIA_TYPE
    if not isinstance(media_type, str) or not _MEDIA.fullmatch(media_type):
        raise InvalidInput("invalid_media_type", f"not a media type: {ascii(media_type)[:80]} "
                           "(expected type/subtype, e.g. application/pdf)")
    return media_type


@contextlib.contextmanager
def _gc_lock(store: ObjectStore, exclusive: bool, wait_s: float = GC_LOCK_WAIT_S
             ) -> Iterator[None]:
    """Uploads committing their row hold this shared; gc holds it exclusive while it decides
    and deletes, so an object is never deleted between an upload's `put` and its row."""
    store._ensure_layout()
    fd = os.open(os.path.join(store.root, "gc.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DatabaseBusy("artifact_store_busy", "the artifact store's gc lock "
                                       f"was held for {wait_s:.0f} s; try again") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)


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
    _need(coord)
    job_id, worker, epoch, tenant = fenced_args(job_id, worker, epoch, tenant)
    name = validate_name(name)
    media_type = _media_type(media_type, name)
    if expected_digest is not None:
        parse_digest(expected_digest)
    store = store_of(coord)

    def _owned_kind(conn: Connection) -> str | JobcoordError:
        owned, now = check_owner(coord, conn, job_id, worker, epoch, tenant, "artifact")
        if isinstance(owned, JobcoordError):
            reject_event(coord, conn, owned, job_id, worker, epoch, now, "artifact")
            return owned
        return str(coord.db.run_text(conn, "SELECT kind FROM jobs WHERE job_id = :j",
                                     {"j": job_id}).scalar())

    kind = coord.db.write(_owned_kind, "artifact")
    rule = settings_of(coord).for_kind(kind)
    limits = [m for m in (rule.max_bytes, max_bytes) if m is not None]
    obj = store.put(source, max_bytes=min(limits) if limits else None,
                    expected_digest=expected_digest)

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        owned, now = check_owner(coord, conn, job_id, worker, epoch, tenant, "artifact")
        if isinstance(owned, JobcoordError):
            reject_event(coord, conn, owned, job_id, worker, epoch, now, "artifact")
            return owned
        params = {"j": job_id, "e": epoch, "n": name, "d": obj.digest, "s": obj.size,
                  "m": media_type, "l": _location(obj.digest), "now": now}
        replaced = coord.db.run_text(
            conn, "UPDATE artifacts SET digest = :d, size = :s, media_type = :m, location = :l,"
            " state = 'staged', reason = NULL, created_at = :now, verified_at = NULL"
            " WHERE job_id = :j AND epoch = :e AND name = :n", params).rowcount
        if not replaced:
            coord.db.run_text(
                conn, "INSERT INTO artifacts (job_id, epoch, name, digest, size, media_type,"
                " state, location, created_at) VALUES (:j, :e, :n, :d, :s, :m, 'staged', :l,"
                " :now)", params)
        record_event(coord, conn, job_id, now, "running", "running", "artifact_staged", worker,
                     epoch, {"name": name, "digest": obj.digest, "size": obj.size,
                      "media_type": media_type, **({"replaced": True} if replaced else {})})
        return {"job_id": job_id, "epoch": epoch, "name": name, "digest": obj.digest,
                "size": obj.size, "media_type": media_type, "state": "staged",
                "stored": obj.created}

    # The shared gc lock from "the object is there" to the row's commit: gc cannot delete
    # an old object this upload found already stored (dedup) before the row names it.
    with _gc_lock(store, exclusive=False):
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


def _stages(coord: Coordinator, job_id: int, epoch: int) -> tuple[str | None, list[Any]]:
    def _read(conn: Connection) -> tuple[str | None, list[Any]]:
        kind = coord.db.run_text(conn, "SELECT kind FROM jobs WHERE job_id = :j",
                                 {"j": job_id}).scalar()
        rows = coord.db.run_text(
            conn, "SELECT artifact_id, name, digest, size, media_type FROM artifacts"
            " WHERE job_id = :j AND epoch = :e AND state IN ('staged', 'verified')"
            " ORDER BY name", {"j": job_id, "e": epoch}).all()
        return kind, list(rows)
    return coord.db.read(_read, "reading staged artifacts")


def _validate(store: ObjectStore, rule: KindRule, row: Any) -> tuple[str | None, str]:
    """(reason code or None, evidence) for one staged row, from its stored bytes."""
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
        try:
            done = subprocess.run([*rule.validator, store.path_of(digest)], capture_output=True,
                                  timeout=VALIDATOR_TIMEOUT_S, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "JOBCOORD_ARTIFACT_NAME": name,
                                       "JOBCOORD_ARTIFACT_MEDIA_TYPE": media_type})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return "validator_failed", f"the validator could not run: {exc}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-500:]
            return "validator_refused", f"the validator exited {done.returncode}: {said}"
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
    kind, rows = _stages(coord, job_id, epoch)
    if not rows:
        return Plan((), now_us())
    store = store_of(coord)
    rule = settings_of(coord).for_kind(kind or "")
    verdicts = [(row, *_validate(store, rule, row)) for row in rows]
    bad = [(row, reason, why) for row, reason, why in verdicts if reason]
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
            coord.db.run_text(conn, "UPDATE artifacts SET state = 'rejected', reason = :r"
                              " WHERE artifact_id = :a", {"r": reason, "a": row[0]})
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
                  worker: str, epoch: int, now: int) -> None:
    """Inside the completion's transaction, after its fencing check passed: the verified
    stages become `accepted`. A stage replaced or added after the plan was made is not
    linked (it stays staged and gc rejects it once the attempt is over)."""
    if not plan:
        return
    for artifact_id, name, digest, _size in plan.rows:
        linked = coord.db.run_text(
            conn, "UPDATE artifacts SET state = 'accepted', verified_at = :v WHERE"
            " artifact_id = :a AND job_id = :j AND epoch = :e AND digest = :d AND state IN"
            " ('staged', 'verified')", {"v": plan.verified_at, "a": artifact_id, "j": job_id,
                                         "e": epoch, "d": digest}).rowcount
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
    _need(coord)
    where, params = [], {}
    if job_id is not None:
        from jobcoord import validate as v

        params["j"] = v.whole(job_id, "job_id", 1, 2**62)
        where.append("a.job_id = :j")
    if tenant is not None:
        params["t"] = tenant
        where.append("j.tenant = :t")
    if not all_states:
        where.append("a.state = 'accepted'")
    sql = (f"SELECT {', '.join('a.' + c.strip() for c in _COLUMNS.split(','))} FROM artifacts a"
           " JOIN jobs j ON j.job_id = a.job_id"
           + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY a.job_id, a.name, a.epoch")
    rows = coord.db.read(lambda conn: coord.db.run_text(conn, sql, params).all(), "artifacts")
    if job_id is not None and not rows:
        exists = coord.db.read(lambda conn: coord.db.run_text(
            conn, "SELECT 1 FROM jobs WHERE job_id = :j" + (" AND tenant = :t" if tenant
                                                           else ""), params).first())
        if exists is None:
            raise Refused("job_not_found", f"job {job_id} not found", job_id=job_id)
    return {"artifacts": [_row(r) for r in rows]}


def _accepted(coord: Coordinator, job_id: Any, name: Any) -> Any:
    from jobcoord import validate as v

    job_id = v.whole(job_id, "job_id", 1, 2**62)
    name = validate_name(name)
    row = coord.db.read(lambda conn: coord.db.run_text(
        conn, f"SELECT {_COLUMNS} FROM artifacts WHERE job_id = :j AND name = :n AND"
        " state = 'accepted'", {"j": job_id, "n": name}).first(), "artifact get")
    if row is None:
        raise Refused("artifact_not_found", f"job {job_id} has no accepted artifact "
                      f"{name!r}", job_id=job_id, name=name)
    return row


def get_artifact(coord: Coordinator, job_id: Any, name: Any,
                 dest: str | os.PathLike[str]) -> dict[str, Any]:
    """Copy an accepted artifact to `dest`, verified: written beside it and renamed only after
    size and digest matched. Missing or corrupt object: DatabaseCorrupt (exit 7), nothing
    at dest."""
    _need(coord)
    row = _accepted(coord, job_id, name)
    store = store_of(coord)
    store.copy_to(row[4], dest, expected_size=row[5])
    return {**_row(row), "written": os.fspath(dest)}


def open_artifact(coord: Coordinator, job_id: Any, name: Any) -> Any:
    """A verified stream (ObjectReader) of an accepted artifact: the caller must treat the
    bytes as unverified until the iteration ended without an error."""
    _need(coord)
    row = _accepted(coord, job_id, name)
    return store_of(coord).read(row[4], expected_size=row[5])


def verify_artifacts(coord: Coordinator, job_id: Any = None) -> dict[str, Any]:
    """Re-hash the object of every row that is not rejected (of one job, or all)."""
    _need(coord)
    listed = artifacts(coord, job_id, all_states=True)["artifacts"]
    store = store_of(coord)
    seen: dict[str, str] = {}
    bad = []
    for a in listed:
        if a["state"] == "rejected":
            continue
        state = seen.get(a["digest"])
        if state is None:
            state = seen[a["digest"]] = store.verify(a["digest"])
            if state == "ok" and store.size(a["digest"]) != a["size"]:
                state = seen[a["digest"]] = "corrupt"
        if state != "ok":
            bad.append({"job_id": a["job_id"], "name": a["name"], "epoch": a["epoch"],
                        "digest": a["digest"], "state": a["state"], "problem": state})
    return {"ok": not bad, "checked_rows": sum(a["state"] != "rejected" for a in listed),
            "checked_objects": len(seen), "problems": bad}


# --- retention ------------------------------------------------------------------------------


_END_STALE = (
    "UPDATE artifacts SET state = 'rejected', reason = 'attempt_ended'"
    " WHERE state IN ('staged', 'verified') AND NOT EXISTS (SELECT 1 FROM leases l"
    " WHERE l.job_id = artifacts.job_id AND l.epoch = artifacts.epoch)")


def referenced_digests(db: Database, conn: Connection) -> set[str]:
    rows = db.run_text(conn, "SELECT DISTINCT digest FROM artifacts WHERE state <> 'rejected'"
                       ).all()
    return {r[0] for r in rows}


def gc_artifacts(coord: Coordinator, *, grace_s: float = DEFAULT_GRACE_S,
                 dry_run: bool = False) -> dict[str, Any]:
    """Reject the stages of attempts that are over (their lease is gone), then delete every
    object no live row references that is older than the grace, and the temporary files of
    uploads that died. Never a referenced object; never a young one (an upload in flight)."""
    _need(coord)
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or not (
            0 <= grace_s <= 10 * 365 * 86400):
        raise InvalidInput("invalid_input", "grace must be 0 s .. 10 years")
    store = store_of(coord)
    ended = 0
    if not dry_run:
        def _end(conn: Connection) -> int:
            rows = coord.db.run_text(
                conn, "SELECT a.artifact_id, a.job_id, a.epoch, a.name, a.digest, j.status"
                " FROM artifacts a JOIN jobs j ON j.job_id = a.job_id WHERE a.state IN"
                " ('staged', 'verified') AND NOT EXISTS (SELECT 1 FROM leases l"
                " WHERE l.job_id = a.job_id AND l.epoch = a.epoch)").all()
            if rows:
                now = now_us()
                coord.db.run_text(conn, _END_STALE)
                for r in rows:
                    record_event(coord, conn, r[1], now, r[5], r[5], "artifact_rejected", None,
                                 r[2], {"name": r[3], "digest": r[4], "reason": "attempt_ended"})
            return len(rows)
        ended = coord.db.write(_end, "artifact gc")
    removed, kept_young, freed = [], 0, 0
    with _gc_lock(store, exclusive=True):
        candidates = [(d, size) for d, size, _mtime in store.iter_objects()]
        live = coord.db.read(lambda conn: referenced_digests(coord.db, conn), "artifact gc")
        cutoff = time.time() - grace_s
        for digest, size in candidates:
            if digest in live:
                continue
            try:
                mtime = os.stat(store.path_of(digest)).st_mtime
            except FileNotFoundError:
                continue
            if mtime > cutoff:
                kept_young += 1
                continue
            if not dry_run:
                store.remove(digest)
            removed.append(digest)
            freed += size
    temp = ({"removed": 0, "bytes_removed": 0} if dry_run
            else store.clean_temp(max(grace_s, TEMP_MIN_AGE_S)))
    return {"dry_run": dry_run, "stages_ended": ended, "objects_removed": len(removed),
            "bytes_removed": freed, "kept_young": kept_young, "referenced": len(live),
            "removed": removed, "temp_files_removed": temp["removed"],
            "temp_bytes_removed": temp["bytes_removed"], "store": store.root}


# --- removing the feature -------------------------------------------------------------------


def removal_check(db: Database, conn: Connection, force: bool,
                  store: str | None = None) -> dict[str, int]:
    """Before `migrate --without artifacts`: how many rows, and objects in the store, would be
    left without the feature. Refused (exit 4) when there are any, unless forced. Objects are
    never deleted here (gc owns them; without the feature, remove the directory by hand)."""
    rows, size = db.run_text(conn, "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM artifacts"
                             ).one() if _has_new_columns(db, conn) else db.run_text(
        conn, "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM artifacts").one()
    objects = object_bytes = 0
    with contextlib.suppress(InvalidInput):  # PostgreSQL without a named store: rows only
        for _digest, n, _mtime in ObjectStore(store_root(db, store)).iter_objects():
            objects += 1
            object_bytes += n
    if (rows or objects) and not force:
        raise Refused("artifacts_present",
                      f"removing the artifacts feature would drop {rows} artifact rows naming "
                      f"{int(size)} bytes, and leave {objects} objects ({object_bytes} bytes) in "
                      "the store unmanaged; pass --force to go ahead (objects are never deleted "
                      "by a migration)", rows=int(rows), bytes=int(size), objects=objects,
                      object_bytes=object_bytes)
    return {"artifact_rows_dropped": int(rows), "artifact_bytes_unreferenced": int(size),
            "objects_left": objects, "object_bytes_left": object_bytes}


def _has_new_columns(db: Database, conn: Connection) -> bool:
    from sqlalchemy import inspect

    return "digest" in {c["name"] for c in inspect(conn).get_columns("artifacts")}


# --- handlers -------------------------------------------------------------------------------


def make_outdir(job_id: int) -> str:
    """The directory a command handler writes its artifacts into ($JOBCOORD_ARTIFACTS_OUT)."""
    import tempfile

    return tempfile.mkdtemp(prefix=f"jobcoord-{job_id}-artifacts-")


def stage_outdir(coord: Any, directory: str | None, job_id: int, worker: str, epoch: int,
                 tenant: str | None) -> list[dict[str, Any]]:
    """Stage every regular file a command left in its artifacts directory (name = file name;
    sub-directories and links are not followed), before the worker reports the completion."""
    if not directory or not os.path.isdir(directory):
        return []
    staged = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            staged.append(coord.put_artifact(job_id, worker, epoch, entry.name, entry.path,
                                             None, tenant=tenant))
    return staged


def first_accepted(coord: Any, job_ids: Sequence[int]) -> dict[str, Any] | None:
    """The first accepted artifact among these jobs (the demo shows one), or None."""
    for job_id in job_ids:
        found = artifacts(coord, job_id)["artifacts"]
        if found:
            return found[0]
    return None
