"""One exception hierarchy. Each class maps to one exit code (one operator action); each
instance carries a snake_case reason code that scripts can branch on."""

from __future__ import annotations

from typing import Any


class JobcoordError(Exception):
    """Unexpected internal error."""

    exit_code = 1
    default_code = "internal_error"

    def __init__(self, code: str | None = None, message: str | None = None, **details: Any):
        self.code = code or self.default_code
        self.message = message or (self.__doc__ or self.code).strip()
        self.details = details
        super().__init__(self.message)

    def __str__(self) -> str:
        # The message may be rewritten after construction (the busy retry says how many
        # attempts were made): str() always shows the current one.
        return self.message

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidInput(JobcoordError):
    """Invalid input; nothing was changed."""

    exit_code = 2
    default_code = "invalid_input"


class Refused(JobcoordError):
    """Refused by a coordinator rule."""

    # Codes: lease_expired, not_owner, stale_epoch, job_finished, job_cancelled, job_not_found,
    # idempotency_conflict, illegal_transition.
    exit_code = 4
    default_code = "refused"


class DatabaseBusy(JobcoordError):
    """The database is still locked after the bounded retries; try again."""

    exit_code = 5
    default_code = "database_locked"


class StorageUnavailable(JobcoordError):
    """The database cannot be opened or written."""

    # Codes: database_unavailable, database_readonly, database_full, database_io_error.
    exit_code = 6
    default_code = "database_unavailable"


class DatabaseCorrupt(JobcoordError):
    """The database is corrupt or an integrity check failed."""

    exit_code = 7
    default_code = "database_corrupt"


class SchemaMismatch(JobcoordError):
    """The database schema does not match this version of jobcoord."""

    # Codes: not_migrated, schema_outdated, schema_newer, migration_failed.
    exit_code = 8
    default_code = "not_migrated"


#: Exit code table, the contract scripts rely on; README.md "Exit codes" repeats it and
#: tests/test_docs.py compares them.
EXIT_CODES: dict[int, str] = {
    0: "done",
    1: "unexpected internal error (traceback only with --debug)",
    2: "bad usage or invalid input (nothing was changed)",
    3: "claim found no eligible job (the JSON says why)",
    4: "refused by a coordinator rule",
    5: "database busy: still locked after the bounded retries",
    6: "storage unavailable: cannot open, read-only, disk full, I/O error",
    7: "corrupt: not a database, malformed, integrity or invariant check failed",
    8: "schema mismatch: not migrated, older or newer than the code",
    130: "interrupted (Ctrl-C); nothing half-done was committed",
}
