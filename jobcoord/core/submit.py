"""Submission: job specs, their validation, enqueue and enqueue_many, idempotency keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import iso, now_us, seconds_to_us
from ..errors import InvalidInput, JobcoordError, Refused
from ..store import statements as sql
from .common import DEFAULT_TENANT, Context, later, loads, record_event
from .items import payload_text as payload_text_of

#: The most attempts a job may be given (a schedule's too: it is copied into each job).
MAX_ATTEMPTS = 100


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue (the batch API takes many)."""

    kind: str
    payload: Any = None
    priority: int | str | None = None
    role: str | None = None
    tenant: str = DEFAULT_TENANT
    key: str | None = None
    max_attempts: int | None = None
    deadline_s: float | None = None
    delay_s: float = 0.0
    #: Declared resource needs, e.g. {"gpu_mem_mb": 12000} or "gpu_mem_mb=12000,ram_mb=8000".
    needs: Mapping[str, int] | str | None = None


class CheckedSpec(NamedTuple):
    """A validated JobSpec, ready to insert (a tuple: a batch builds one per job, and a
    frozen dataclass costs several times as much to construct)."""

    kind: str
    payload_text: str
    priority: int
    role: str | None
    tenant: str
    key: str | None
    max_attempts: int
    #: Relative to the submission time, which is read inside the write transaction.
    deadline_in_us: int | None
    delay_us: int
    #: {"NAME": INT} as stored, or None for a job that declares no needs.
    needs_text: str | None = None


def _spec_list(specs: Any) -> list[Any]:
    """enqueue_many's argument: a list (or other iterable) of JobSpecs or mappings."""
    if isinstance(specs, str | bytes | bytearray | Mapping | JobSpec) or specs is None:
        raise InvalidInput("invalid_input", "specs: give a list of jobs (JobSpec or mapping)",
                           field="specs")
    try:
        return list(specs)
    except TypeError:
        raise InvalidInput("invalid_input", "specs: give a list of jobs (JobSpec or mapping)",
                           field="specs") from None


def _spec(item: Any) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if not isinstance(item, Mapping):
        raise InvalidInput("invalid_input", "specs: each job is a JobSpec or a mapping of its "
                           "fields", field="specs")
    item = v.mapping_copy(item, "specs")
    unknown = sorted(str(k) for k in item if k not in JobSpec.__dataclass_fields__)
    if unknown or "kind" not in item:
        raise InvalidInput("invalid_input", "specs: each job needs a kind, and only "
                           f"{', '.join(JobSpec.__dataclass_fields__)}"
                           + (f" (unknown: {', '.join(unknown)})" if unknown else ""),
                           field="specs")
    return JobSpec(**item)


def check_spec(ctx: Context, spec: JobSpec,
               names: dict[Any, Any] | None = None) -> CheckedSpec:
    """Validate one job. `names` remembers, for a batch, the settings already checked (a
    batch repeats a few combinations of kind, role, tenant, priority, attempts, delay and
    deadline; checking each job's again cost as much as storing it)."""
    p = ctx.policy
    payload_text = payload_text_of(spec.payload, p.max_payload_bytes)
    settings = _settings(ctx, spec, names)
    return CheckedSpec(
        kind=settings[0], payload_text=payload_text, priority=settings[1], role=settings[2],
        tenant=settings[3],
        key=None if spec.key is None else v.utf8_text(spec.key, "key", max_len=v.MAX_KEY),
        max_attempts=settings[4], deadline_in_us=settings[5], delay_us=settings[6],
        needs_text=None if spec.needs is None else v.dumps(v.resources(spec.needs, "needs")),
    )


def _settings(ctx: Context, spec: JobSpec, memo: dict[Any, Any] | None) -> tuple[Any, ...]:
    """A spec's checked kind, priority, role, tenant, max attempts, deadline and delay,
    remembered in `memo` by the values and their types (1, 1.0 and True are equal keys but
    not equal input). Only checks that passed are remembered."""
    if memo is None:
        return _check_settings(ctx, spec)
    given = (spec.kind, spec.priority, spec.role, spec.tenant, spec.max_attempts,
             spec.deadline_s, spec.delay_s)
    key = (given, type(spec.kind), type(spec.priority), type(spec.role), type(spec.tenant),
           type(spec.max_attempts), type(spec.deadline_s), type(spec.delay_s))
    try:
        found = memo.get(key)
    except TypeError:  # an unhashable value (a list where a name belongs): check it
        return _check_settings(ctx, spec)
    if found is None:
        found = memo[key] = _check_settings(ctx, spec)
    return found  # type: ignore[no-any-return]


def _check_settings(ctx: Context, spec: JobSpec) -> tuple[Any, ...]:
    p = ctx.policy
    deadline_us = None
    delay_us = seconds_to_us(v.finite_seconds(spec.delay_s, "delay", 0, v.TEN_YEARS_S))
    if spec.deadline_s is not None:
        deadline_us = seconds_to_us(
            v.finite_seconds(spec.deadline_s, "deadline", 0, v.TEN_YEARS_S, lo_inclusive=False))
        if deadline_us <= delay_us:
            # A job that may not start before its deadline could only ever die.
            raise InvalidInput("invalid_input", "deadline: must be later than the delay "
                               "(no attempt may start at or after the deadline)",
                               field="deadline")
    return (
        v.name(spec.kind, "kind"),
        v.priority(p.default_priority if spec.priority is None else spec.priority),
        None if spec.role is None else v.name(spec.role, "role"),
        v.name(spec.tenant, "tenant"),
        v.whole(p.default_max_attempts if spec.max_attempts is None else spec.max_attempts,
                "max_attempts", 1, MAX_ATTEMPTS),
        deadline_us,
        delay_us,
    )


def key_differences(ctx: Context, conn: Connection, existing: Any, c: CheckedSpec) -> list[str]:
    """The submitted fields in which a resubmission with the same key differs from the job
    the key made. Deadline and delay are relative to each submission's own time, so they
    are not compared."""
    differ = [name for name, old, new in (
        ("kind", existing[1], c.kind), ("payload", existing[2], c.payload_text),
        ("priority", existing[3], c.priority), ("role", existing[4], c.role),
        ("needs", existing[6], c.needs_text))
        if old != new]
    submitted = existing[5]
    if submitted != c.max_attempts:
        # Raised since by a release or an operator retry? Compare what was submitted.
        recorded = ctx.db.run(conn, sql.SUBMITTED_DETAIL, {"job_id": existing[0]}
                                  ).fetchone()
        try:
            shown = loads(recorded[0]) if recorded is not None else None
        except ValueError:  # damaged outside jobcoord: compare with the current count
            shown = None
        if isinstance(shown, dict) and isinstance(shown.get("max_attempts"), int):
            submitted = shown["max_attempts"]
    if submitted != c.max_attempts:
        differ.append("max_attempts")
    return differ


def insert(ctx: Context, conn: Connection, c: CheckedSpec, now: int, *,
           after_conflict: bool = False) -> dict[str, Any] | JobcoordError:
    """Insert one checked job (or answer with the job its idempotency key made)."""
    if c.key is not None:
        existing = ctx.db.run(conn, sql.JOB_BY_KEY, {"tenant": c.tenant, "key": c.key}
                                  ).fetchone()
        if existing is not None:
            differ = key_differences(ctx, conn, existing, c)
            if differ:
                return Refused(
                    "idempotency_conflict",
                    f"idempotency key {c.key!r} was already used in tenant {c.tenant!r} "
                    f"for job {existing[0]} with a different {', '.join(differ)}",
                    job_id=existing[0], fields=differ,
                )
            return {"job_id": existing[0], "created": False}
    inserted = ctx.db.run(conn, sql.INSERT_JOB, {
        "tenant": c.tenant, "kind": c.kind, "role": c.role, "priority": c.priority,
        "payload": c.payload_text, "now": now, "run_after": later(now, c.delay_us, "delay"),
        "deadline": (None if c.deadline_in_us is None
                     else later(now, c.deadline_in_us, "deadline")),
        "max_attempts": c.max_attempts, "key": c.key, "f": False, "needs": c.needs_text,
    }).fetchone()
    if inserted is None and not after_conflict:
        # The same key was committed meanwhile: answer as if it had arrived first.
        return insert(ctx, conn, c, now, after_conflict=True)
    if inserted is None:
        raise JobcoordError("internal_error", f"idempotency key {c.key!r} conflicts with "
                            "a job that cannot be read")
    job_id = inserted[0]
    detail: dict[str, Any] = {"priority": c.priority, "max_attempts": c.max_attempts}
    if c.delay_us:
        detail["run_after"] = iso(later(now, c.delay_us, "delay"))
    record_event(ctx, conn, job_id, now, None, "waiting", "enqueued", detail=detail)
    ctx.db.announce_jobs(conn)
    return {"job_id": job_id, "created": True}


#: The parameters of a batch's job rows and event rows, in the order each row tuple gives
#: them (the driver binds by position: no mapping is built per row).
_JOB_COLUMNS = ("job_id", "payload", "needs", "tenant", "kind", "role", "priority", "now",
                "run_after", "deadline", "max_attempts")
_EVENT_COLUMNS = ("job_id", "now", "detail")


#: A batch job as checked: its settings (shared by every job with the same ones, see
#: `_settings`), its payload's stored text and its needs' (or None).
_Batched = tuple[tuple[Any, ...], str, "str | None"]


def insert_bulk(ctx: Context, conn: Connection, checked: Sequence[_Batched], now: int
                ) -> list[dict[str, Any]]:
    """Insert keyless jobs with one executemany and their `enqueued` events (one statement
    when every job has the same detail, as most batches do). The values every job with the
    same settings shares are put together once per settings, so each row is its id, payload
    and needs followed by them."""
    n = len(checked)
    ids = ctx.db.allocate_job_ids(conn, n)
    shared: dict[int, tuple[tuple[Any, ...], str]] = {}
    details: dict[tuple[int, int, int], str] = {}  # the same detail `insert` records
    jobs = []
    # Where each run of jobs with the same settings starts, and its events' detail.
    runs: list[tuple[int, str]] = []
    last: tuple[Any, ...] | None = None
    job_tail: tuple[Any, ...] = ()
    for job_id, (settings, payload_text, needs_text) in zip(ids, checked, strict=True):
        if settings is not last:
            last = settings
            found = shared.get(id(settings))
            if found is None:
                kind, priority, role, tenant, max_attempts, deadline_in_us, delay_us = settings
                detail = details.get((priority, delay_us, max_attempts))
                if detail is None:
                    shown: dict[str, Any] = {"priority": priority, "max_attempts": max_attempts}
                    if delay_us:
                        shown["run_after"] = iso(later(now, delay_us, "delay"))
                    detail = details[(priority, delay_us, max_attempts)] = v.dumps(shown)
                found = shared[id(settings)] = (
                    (tenant, kind, role, priority, now, later(now, delay_us, "delay"),
                     None if deadline_in_us is None
                     else later(now, deadline_in_us, "deadline"), max_attempts),
                    detail)
            job_tail, detail = found
            runs.append((len(jobs), detail))
        # Concatenated, not unpacked: `(a, *t)` builds a list first and costs more per row.
        jobs.append((job_id, payload_text, needs_text) + job_tail)  # noqa: RUF005
    ctx.db.run_many(conn, sql.INSERT_JOB_AT, jobs, columns=_JOB_COLUMNS)
    if len({detail for _, detail in runs}) == 1:  # the common batch: one statement
        ctx.db.insert_enqueued(conn, ids, now, runs[0][1])
    else:
        ends = [start for start, _ in runs[1:]] + [n]
        events = [(job_id, now, detail) for (start, detail), end in zip(runs, ends, strict=True)
                  for job_id in ids[start:end]]
        ctx.db.run_many(conn, sql.INSERT_ENQUEUED, events, columns=_EVENT_COLUMNS)
    ctx.db.announce_jobs(conn)
    return [{"job_id": job_id, "created": True} for job_id in ids]


def enqueue(ctx: Context, kind: str, payload: Any = None, *, priority: int | str | None = None,
            role: str | None = None, tenant: str = DEFAULT_TENANT, key: str | None = None,
            max_attempts: int | None = None, deadline_s: float | None = None,
            delay_s: float = 0.0, needs: Mapping[str, int] | str | None = None
            ) -> dict[str, Any]:
    """Accept a job. Returns {"job_id", "created"} only after the row is committed.
    The same tenant and idempotency key returns the same job (created False); the same
    key with another kind or payload is refused (idempotency_conflict)."""
    spec = JobSpec(kind, payload, priority, role, tenant, key, max_attempts, deadline_s,
                   delay_s, needs)
    checked = check_spec(ctx, spec)
    # The clock is read inside the transaction (a busy retry reads it again), so creation
    # times follow commit order.
    return ctx.db.write(lambda conn: insert(ctx, conn, checked, now_us()), "enqueue")


def enqueue_many(ctx: Context, specs: Iterable[JobSpec | Mapping[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Accept many jobs in one transaction: all of them or none."""
    items = _spec_list(specs)
    batched, keyed = _check_batch(ctx, items)
    if batched and not keyed:
        return ctx.db.write(lambda conn: insert_bulk(ctx, conn, batched, now_us()),
                            "enqueue")
    checked = [CheckedSpec(
        kind=settings[0], payload_text=payload_text, priority=settings[1], role=settings[2],
        tenant=settings[3], key=key, max_attempts=settings[4], deadline_in_us=settings[5],
        delay_us=settings[6], needs_text=needs_text)
        for (settings, payload_text, needs_text), key
        in zip(batched, keyed or [None] * len(batched), strict=True)]

    def _all(conn: Connection) -> list[dict[str, Any]] | JobcoordError:
        out = []
        now = now_us()
        made: dict[int, int] = {}  # job id -> the item of this batch that made it
        for i, c in enumerate(checked):
            res = insert(ctx, conn, c, now)
            if isinstance(res, JobcoordError):
                first = made.get(res.details.get("job_id", -1))
                if first is not None:
                    # That job goes with the rolled-back batch (its id may be the next
                    # enqueue's): name the two items instead.
                    fields = res.details.get("fields", [])
                    raise Refused("idempotency_conflict", f"items {first} and {i} of this "
                                  f"batch have idempotency key {c.key!r} in tenant "
                                  f"{c.tenant!r} with a different {', '.join(fields)}; "
                                  "nothing was enqueued", items=[first, i], fields=fields)
                raise res  # roll the whole batch back
            if res["created"]:
                made[res["job_id"]] = i
            out.append(res)
        return out

    return ctx.db.write(_all, "enqueue")


def _check_batch(ctx: Context, items: Sequence[Any]
                 ) -> tuple[list[_Batched], list[str | None] | None]:
    """Validate a batch's jobs in order, each exactly as `check_spec` does (the same checks
    in the same order, so the same first refusal), and their idempotency keys (None when no
    job has one).

    Cheaper per job than `check_spec` where that is not validation: one JSON encoder for
    the whole batch (a failing job ends the batch, see `v.encoder`), and a job whose
    settings are the very objects of the job before it takes that job's checked settings
    without building the memo's key (the same objects have the same types)."""
    p = ctx.policy
    max_bytes = p.max_payload_bytes
    encode = v.encoder()
    names: dict[Any, Any] = {}
    out: list[_Batched] = []
    keys: list[str | None] = []
    keyed = False
    prev: JobSpec | None = None
    settings: tuple[Any, ...] = ()
    for item in items:
        spec = item if type(item) is JobSpec else _spec(item)
        payload = spec.payload
        if type(payload) is dict:
            # `v.stored_text`'s checks, its common case inline (one call less per job): any
            # failure, or a text that may be too deep or too large, goes to it for the verdict.
            try:
                payload_text = encode(payload)
                size = (len(payload_text) if payload_text.isascii()
                        else len(payload_text.encode("utf-8")))
            except Exception:  # stored_text names the refusal
                size = -1
                encode = v.encoder()  # the failed one is not reused (see v.encoder)
            # Deeper than MAX_JSON_DEPTH takes more brackets than that: a shorter text is not
            # counted.
            if (size < 0 or size > max_bytes
                    or (size > v.MAX_JSON_DEPTH and payload_text.count("{")
                        + payload_text.count("[") > v.MAX_JSON_DEPTH)):
                payload_text = v.stored_text(payload, "payload", max_bytes=max_bytes)
        else:
            payload_text = payload_text_of(payload, max_bytes)
        if (prev is None or spec.kind is not prev.kind or spec.priority is not prev.priority
                or spec.role is not prev.role or spec.tenant is not prev.tenant
                or spec.max_attempts is not prev.max_attempts
                or spec.deadline_s is not prev.deadline_s or spec.delay_s is not prev.delay_s):
            settings = _settings(ctx, spec, names)
            prev = spec
        key = spec.key
        if key is not None:
            key = v.utf8_text(key, "key", max_len=v.MAX_KEY)
            keyed = True
        keys.append(key)
        needs = spec.needs
        # A plain tuple: a NamedTuple's constructor is a Python call per job.
        out.append((settings, payload_text,
                    None if needs is None else v.dumps(v.resources(needs, "needs"))))
    return out, keys if keyed else None


