"""One item of a batch, checked and answered without the database: the core's own checks,
which the remote client also runs on a group before it sends it in parts (a group the
server refuses as too large). Light on purpose: no database imports."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .. import validate as v
from ..errors import InvalidInput, Refused

T = TypeVar("T")

#: The most jobs one claim_many (or complete_many, fail_many) call handles: one write
#: transaction must stay short, whatever a caller asks for.
MAX_BATCH = 1000
#: The refusal of an empty list of kinds (a worker that takes no kind would take nothing).
NO_KINDS = "give at least one kind, or leave it out to take any kind"
#: The tenant of a job submitted without one.
DEFAULT_TENANT = "default"
#: The largest stored provenance of a completion.
MAX_PROVENANCE_BYTES = 64 * 1024


#: The fields of one item, required first.
COMPLETE_FIELDS = ("job_id", "worker_id", "epoch", "result", "provenance", "tenant")
FAIL_FIELDS = ("job_id", "worker_id", "epoch", "error", "permanent", "reason", "tenant",
               "effect_not_applied")
REQUIRED = ("job_id", "worker_id", "epoch")

def batch_items(items: Any, fields: tuple[str, ...], required: tuple[str, ...]
           ) -> list[Mapping[str, Any]]:
    """The batch argument: a non-empty list (or other iterable) of mappings with known
    fields, at most MAX_BATCH of them (the Coordinator's check, and the remote client's
    before it sends anything)."""
    optional = ", ".join(f for f in fields if f not in required)
    usage = (f"items: give a list of 1..{MAX_BATCH} mappings with {', '.join(required)} "
             f"(and optionally {optional})")
    if isinstance(items, str | bytes | bytearray | Mapping) or items is None:
        raise InvalidInput("invalid_input", usage, field="items")
    try:
        out = list(items)
    except TypeError:
        raise InvalidInput("invalid_input", usage, field="items") from None
    if not 1 <= len(out) <= MAX_BATCH:
        raise InvalidInput("invalid_input", f"{usage}; got {len(out)}", field="items")
    for i, item in enumerate(out):
        if not isinstance(item, Mapping):
            raise InvalidInput("invalid_input", f"items[{i}] is not a mapping; {usage}",
                               field="items")
        unknown = sorted(str(k) for k in item if k not in fields)
        missing = [f for f in required if f not in item]
        if unknown or missing:
            raise InvalidInput("invalid_input", f"items[{i}]: "
                               + (f"unknown {', '.join(unknown)}; " if unknown else "")
                               + (f"missing {', '.join(missing)}; " if missing else "")
                               + usage, field="items")
    return out


def job_and_epoch(job_id: Any, epoch: Any) -> tuple[int, int]:
    """The job id and epoch every fenced call takes, checked."""
    return v.whole(job_id, "job_id", 1, 2**62), v.whole(epoch, "epoch", 0, 2**31 - 1)


def completion_texts(result: Any, provenance: Any, max_result_bytes: int
                     ) -> tuple[str, str | None]:
    """A completion's result and provenance, checked, as the text stored."""
    _, result_text = v.json_value({} if result is None else result, "result",
                                  str_is_text=False, max_bytes=max_result_bytes,
                                  require_object=False, too_large_code="result_too_large")
    # json_value refuses a non-object; dict() of one would raise TypeError first.
    prov_text = None if provenance is None else v.json_value(
        v.mapping_copy(provenance, "provenance") if isinstance(provenance, Mapping)
        else provenance, "provenance",
        max_bytes=MAX_PROVENANCE_BYTES, require_object=True)[1]
    return result_text, prov_text


def checkpoint_text(name: Any, data: Any, max_bytes: int) -> tuple[str, str]:
    """A checkpoint's name and data, checked, the data as the text stored."""
    name = v.name(name, "name")
    _, data_text = v.json_value({} if data is None else data, "data", str_is_text=False,
                                max_bytes=max_bytes, require_object=False,
                                too_large_code="checkpoint_too_large")
    return name, data_text


def payload_text(payload: Any, max_bytes: int) -> str:
    """A job's payload, checked, as the text stored."""
    return v.json_value({} if payload is None else payload, "payload", max_bytes=max_bytes,
                        require_object=True)[1]


#: The largest heartbeat readings.
MAX_READINGS_BYTES = 16 * 1024


def readings_value(readings: Any) -> tuple[dict[str, Any], str]:
    """A heartbeat's readings (a JSON object as text, or a mapping), parsed, and their text
    exactly as received (a mapping serialised once). What each reading may be is the
    workers' rule (core.workers.parse_readings)."""
    if isinstance(readings, str):
        return v.json_value(readings, "readings", max_bytes=MAX_READINGS_BYTES,
                            require_object=True)[0], readings
    if not isinstance(readings, Mapping):
        raise InvalidInput("invalid_input", "readings must be a JSON object (as text) or a "
                           "mapping", field="readings")
    return v.json_value(v.mapping_copy(readings, "readings"), "readings",
                        max_bytes=MAX_READINGS_BYTES,
                        require_object=True)


#: The event reasons jobcoord records for its own transitions and refusals. A failure report
#: naming one would write that history for an attempt that failed: a `completed` event that
#: `completed_by` and the remote worker's lost-answer check take as an accepted result, a
#: second `claimed` event at one epoch, a `lease_expired` that /metrics counts as an expiry,
#: an `enqueued` event whose detail an idempotent submission compares with. A failure's own
#: reasons (`failed`, `timeout`, `invalid_result`, `result_too_large`, `worker_shutdown`,
#: `artifact_invalid`) and any other name stay the caller's to choose.
RESERVED_REASONS = frozenset({
    "enqueued", "claimed", "completed", "lease_expired", "deadline_passed", "window_missed",
    "cancelled", "cancel_requested", "operator_retry", "reconciled", "effect_started",
    "job_unreadable", "artifact_staged", "artifact_verified", "artifact_accepted",
    "artifact_rejected",
})


def failure_texts(error: Any, reason: Any) -> tuple[str, str]:
    """A failure report's error and reason, checked."""
    text = v.utf8_text(error, "error", max_len=v.MAX_TEXT)
    why = v.name(reason, "reason", max_len=40)
    # `complete_refused`, `fail_refused`, `artifact_refused`: the records of refusals.
    # In any case: a reader matching reasons regardless of case takes `Completed` for it.
    folded = why.casefold()
    if folded in RESERVED_REASONS or folded.endswith("_refused"):
        raise InvalidInput("invalid_input", f"reason: {why!r} is what jobcoord records for "
                           "its own transitions, not a failure's: use 'failed', 'timeout' or "
                           "a name of your own", field="reason")
    return text, why


def checked_item(i: int, build: Callable[[], T]) -> T:
    """Validate one item as the single call would, saying which item was refused."""
    try:
        return build()
    except InvalidInput as e:
        raise InvalidInput(e.code, f"items[{i}]: {e.message}", item=i, **e.details) from None


#: What an accepted report of each kind did to its job, for the refusal of a second report
#: of the same job later in the batch.
DONE = {"complete": "completed", "fail": "failed"}


def earlier_in_batch(job_id: int, op: str, is_now: str, /, *, code: str = "job_finished",
                     **details: Any) -> Refused:
    """The refusal of a second report of a job this batch already reported on."""
    details.pop("earlier_in_batch", None)
    details.pop("same_as_accepted", None)  # that was the earlier item; this one is not it
    return Refused(code, f"job {job_id} was already {DONE[op]} earlier in this batch (it "
                   f"is now {is_now}); only the first report of an attempt counts",
                   **details, earlier_in_batch=True)
