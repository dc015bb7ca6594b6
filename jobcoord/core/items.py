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
#: The largest stored provenance of a completion.
MAX_PROVENANCE_BYTES = 64 * 1024


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
        dict(provenance) if isinstance(provenance, Mapping) else provenance, "provenance",
        max_bytes=MAX_PROVENANCE_BYTES, require_object=True)[1]
    return result_text, prov_text


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
