"""The answers of batches that a client builds as well as the core (the remote client
splits a group the server refuses as too large): light on purpose, no database imports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import InvalidInput, Refused

T = TypeVar("T")


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
    return Refused(code, f"job {job_id} was already {DONE[op]} earlier in this batch (it "
                   f"is now {is_now}); only the first report of an attempt counts",
                   **details, earlier_in_batch=True)
