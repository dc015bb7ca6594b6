"""Batches of fenced reports: many completions (or failures) in one write transaction, each
judged and fenced on its own -- one refused item never refuses the others, and each gets
its own answer."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import now_us
from ..errors import InvalidInput, JobcoordError, Refused
from ..store import statements as sql
from .common import Context, as_bool
from .fencing import (
    Completion,
    completion_end,
    completion_parts,
    completion_step,
    failure_end,
    failure_parts,
    failure_step,
    judge,
    repeated,
    said_sent_again,
    sent_again,
    with_plan,
)
from .items import (
    COMPLETE_FIELDS,
    FAIL_FIELDS,
    REQUIRED,
    batch_items,
    checked_item,
    earlier_in_batch,
)

Step = Callable[[Connection], Any]
#: An accepted item's end (end_running's parameters, reason, worker, detail) and answer.
Accept = Callable[[Connection, Any, Any, int], tuple[dict[str, Any], dict[str, Any]]]


def _run_all(ctx: Context, parts: Sequence[Any], op: str, where: str,
             step: Callable[[Any], Step], accept: Accept) -> dict[str, Any]:
    """Judge every item in one write transaction, in job id order (two batches touching the
    same jobs take their row locks, on PostgreSQL, in one order and never deadlock); the
    answers keep the caller's order.

    The fence rows of all items are read in one statement (and held until commit), each
    item is judged in Python by the rules of its single call (`judge`), in order, against
    its job's state after the batch's earlier items, and the accepted ones are written in
    bulk, with every event in the order the single calls would have written them. An item
    that needs a write of its own while being judged (artifacts to link, a cancellation to
    carry out) sends the whole batch through the single calls' steps instead."""
    order = sorted(range(len(parts)), key=lambda i: parts[i].job_id)

    def _do(conn: Connection) -> dict[str, Any]:
        answers: list[dict[str, Any] | None] = [None] * len(parts)
        rows: dict[int, Any] = ctx.db.read_owned_many(conn, [p.job_id for p in parts])
        now = now_us()
        done: dict[int, str] = {}  # job id -> its status after this batch's earlier report
        if any(getattr(p, "plan", None) for p in parts) or any(
                as_bool(r[3]) for r in rows.values()):
            for i in order:
                got = step(parts[i])(conn)
                got = got[0] if isinstance(got, tuple) else got
                answers[i] = _answer(parts[i], got, done, op)
            return _summary(answers)
        ends: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for i in order:
            p = parts[i]
            row = rows.get(p.job_id)
            owned = judge(ctx, conn, row, p.job_id, p.worker_id, p.epoch, p.tenant, op, now)
            if isinstance(owned, JobcoordError):
                recorded = owned.code not in ("job_not_found", "job_cancelled")
                if recorded and p.job_id not in done:
                    # One accepted before this batch and sent again (its answer lost) is
                    # no new evidence; a report this batch made earlier is recorded, as
                    # the single calls one after the other would have recorded it.
                    if op == "fail":
                        recorded = not repeated(ctx, conn, owned, p)
                    elif sent_again(ctx, conn, owned, p, row[8]):
                        owned, recorded = said_sent_again(owned), False
                if recorded:
                    events.append({
                        "job_id": p.job_id, "now": now, "from_status": row[0],
                        "to_status": row[0], "reason": f"{op}_refused",
                        "worker": p.worker_id, "epoch": p.epoch,
                        "detail": v.dumps({"refusal": owned.code})})
                answers[i] = _answer(p, owned, done, op)
                continue
            end, out = accept(conn, p, owned, now)
            ends.append(end)
            events.append({k: end[k] for k in ("job_id", "now", "to_status", "reason",
                                               "worker", "epoch", "detail")}
                          | {"from_status": "running"})
            answers[i] = _answer(p, out, done, op)
            # Later items of this job see it ended: no lease, its new status.
            rows[p.job_id] = (end["to_status"], *row[1:9], None, None, None)
        if ends:
            ctx.db.end_running_many(conn, ends, events)
            if any(e["to_status"] == "waiting" for e in ends):
                ctx.db.announce_jobs(conn)
        elif events:
            ctx.db.run_many(conn, sql.INSERT_EVENT, events)
        return _summary(answers)

    return ctx.db.write(_do, where)


def _answer(p: Any, got: Any, done: dict[int, str], op: str) -> dict[str, Any]:
    """An item's answer; a refusal of a job this batch already reported on says so.

    Only a report this batch accepted counts as one: an item that is a report accepted by
    an earlier request, sent again (`same_as_accepted`), leaves the job out of `done`, so a
    second such item is judged as the first was (the same result: `already_accepted` too;
    another: `job_finished`), never "completed earlier in this batch", which it was not."""
    if not isinstance(got, JobcoordError):
        done[p.job_id] = got["status"]
        return got  # type: ignore[no-any-return]
    if p.job_id in done:
        got = earlier_in_batch(p.job_id, op, done[p.job_id], code=got.code, **got.details)
    return {"job_id": p.job_id, **got.to_json()}


def _summary(answers: list[dict[str, Any] | None]) -> dict[str, Any]:
    refused = sum(1 for a in answers if a is not None and "error" in a)
    return {"results": answers, "accepted": len(answers) - refused, "refused": refused}


def _checked_together(ctx: Context, bare: list[Completion]) -> Any:
    """The items' artifact checks are made one after another, each item waiting for the
    others': while one's run, every item's lease is kept (its checks keep its own)."""
    if "artifacts" not in ctx.features or len(bare) < 2:
        return contextlib.nullcontext()
    from ..artifacts.rules import completion_group

    return completion_group([(c.job_id, c.worker_id, c.epoch, c.tenant) for c in bare])


def complete_many(ctx: Context, items: Any) -> dict[str, Any]:
    """Accept many completions in one write transaction, each fenced like `complete`.

    Returns {"results": [...], "accepted": n, "refused": m}: per item, in the order given,
    complete's answer, or {"job_id": ..., "error": {"code", "message", "details"}} for a
    refused one (recorded as its own `complete_refused` event, as `complete` records it)."""
    checked = batch_items(items, COMPLETE_FIELDS, REQUIRED)
    # Every item valid first (bad input refuses the batch and changes nothing); then each
    # item's staged artifacts are verified, and one that fails is that item's refusal only
    # (its attempt failed, as a single completion's), never the batch's.
    bare = [checked_item(i, lambda it=it: completion_parts(
        ctx, it["job_id"], it["worker_id"], it["epoch"], it.get("result"),
        it.get("provenance"), it.get("tenant"), planned=False))
        for i, it in enumerate(checked)]
    parts: dict[int, Completion] = {}
    refused: dict[int, dict[str, Any]] = {}
    with _checked_together(ctx, bare):
        for i, c in enumerate(bare):
            try:
                parts[i] = with_plan(ctx, c)
            except Refused as e:
                refused[i] = {"job_id": c.job_id, **e.to_json()}
            except InvalidInput as e:
                if e.code != "artifact_store_missing":
                    raise
                # No store where this item's objects should be: its own refusal, nothing
                # changed for it; the items without artifacts need none.
                refused[i] = {"job_id": c.job_id, **e.to_json()}

    def accept(_conn: Connection, c: Completion, _owned: Any, now: int
               ) -> tuple[dict[str, Any], dict[str, Any]]:
        return completion_end(c, now), {"job_id": c.job_id, "status": "succeeded",
                                        "epoch": c.epoch, "finished_at": now}

    ran = iter(_run_all(ctx, list(parts.values()), "complete", "complete_many",
                        lambda c: completion_step(ctx, c), accept)["results"]
               if parts else ())
    return _summary([refused[i] if i in refused else next(ran) for i in range(len(bare))])


def fail_many(ctx: Context, items: Any) -> dict[str, Any]:
    """Report many failed attempts in one write transaction, each judged like `fail`.

    Returns {"results": [...], "accepted": n, "refused": m} in the shape of complete_many,
    each accepted answer the one `fail` gives."""
    checked = batch_items(items, FAIL_FIELDS, (*REQUIRED, "error"))
    parts = [checked_item(i, lambda it=it: failure_parts(
        it["job_id"], it["worker_id"], it["epoch"], it["error"],
        permanent=it.get("permanent", False), reason=it.get("reason", "failed"),
        tenant=it.get("tenant"), effect_not_applied=it.get("effect_not_applied", False)))
        for i, it in enumerate(checked)]
    return _run_all(ctx, parts, "fail", "fail_many", lambda f: failure_step(ctx, f),
                    lambda conn, f, owned, now: failure_end(ctx, conn, f, owned, now))
