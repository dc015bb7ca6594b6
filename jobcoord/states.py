"""Job statuses, in a module of their own so the everyday CLI path (service) can use them
without importing the ORM models and with them most of SQLAlchemy."""

from __future__ import annotations

#: Every job status (README.md "Job states").
STATUSES = ("waiting", "running", "succeeded", "dead", "cancelled", "unknown")
#: Final for workers: no claim, no completion, no renewal.
FINAL_STATUSES = ("succeeded", "dead", "cancelled")
