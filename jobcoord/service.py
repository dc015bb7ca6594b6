"""The names scripts have always imported from here: the coordinator is in coordinator.py,
its rules in core/, its stores in store/."""

from .coordinator import Coordinator
from .core.common import DEFAULT_TENANT
from .core.submit import JobSpec
from .core.workers import READING_RANGES, default_worker_id, parse_readings
from .present import explain_job

__all__ = ["DEFAULT_TENANT", "READING_RANGES", "Coordinator", "JobSpec", "default_worker_id",
           "explain_job", "parse_readings"]
