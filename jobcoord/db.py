"""The names other modules and scripts have always imported from here; the stores live in
`jobcoord.store` (the seam in `store.base`, one module per database)."""

from .store.base import (
    CORE_REVISIONS,
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_RETRIES,
    OPTIONAL_REVISIONS,
    SYNCHRONOUS_LEVELS,
    Database,
    Stats,
    Target,
    classify,
    resolve_target,
)
from .store.postgresql import MAX_CLOCK_SKEW_S, clock_skew_refusal
from .store.sqlite import create_private_file, precheck_sqlite_path, sqlite_pragma
from .store.statements import SQL

__all__ = [
    "CORE_REVISIONS", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_RETRIES", "MAX_CLOCK_SKEW_S",
    "OPTIONAL_REVISIONS", "SQL", "SYNCHRONOUS_LEVELS", "Database", "Stats", "Target",
    "classify", "clock_skew_refusal", "create_private_file", "precheck_sqlite_path",
    "resolve_target", "sqlite_pragma",
]
