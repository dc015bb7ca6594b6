"""One exception hierarchy, with its two maps: each class to one exit code (its `exit_code`,
one operator action, described by EXIT_CODES) and to one HTTP status (HTTP_STATUS_BY_CLASS);
each instance carries a snake_case reason code that scripts can branch on."""

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

    # Codes: database_corrupt, row_breaks_check, table_missing (a table of the current
    # revision dropped beside jobcoord), and the checks' own.
    exit_code = 7
    default_code = "database_corrupt"


class SchemaMismatch(JobcoordError):
    """The database schema does not match this version of jobcoord."""

    # Codes: not_migrated, schema_outdated, schema_newer, migration_failed, schema_changed
    # (a feature added or removed beside a running process; the call can be sent again).
    exit_code = 8
    default_code = "not_migrated"


class Unauthorized(Refused):
    """No token, or an unknown or revoked one (HTTP). A refusal, so a remote worker stops
    using the lease or claim loop it was for, as for any rule's refusal; its exit code is
    bad usage's: the token given is not one the server knows."""

    exit_code = 2
    default_code = "unauthorized"


class Forbidden(Refused):
    """This token's role may not do that (HTTP)."""

    exit_code = 4
    default_code = "forbidden"


class Interrupted(JobcoordError):
    """Ctrl-C (SIGINT) stopped a command. Every write is one transaction, so the one under
    way was rolled back; details say what earlier transactions of the command committed
    (a prune's whole batches)."""

    exit_code = 130
    default_code = "interrupted"


class BodyTooLarge(InvalidInput):
    """The request body is larger than the server accepts (HTTP)."""

    default_code = "body_too_large"


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
    7: "corrupt: not a database, malformed, integrity or invariant check failed; a table "
       "of the current revision missing",
    8: "schema mismatch: not migrated, older or newer than the code",
    130: "interrupted (Ctrl-C); nothing half-done was committed (`--json`: the error "
         "`interrupted`; a prune's details count the whole batches it deleted)",
}

#: Exception class -> HTTP status; the first class in this order that matches wins.
HTTP_STATUS_BY_CLASS: tuple[tuple[type[JobcoordError], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (BodyTooLarge, 413),
    (InvalidInput, 400),
    (Refused, 409),
    (DatabaseBusy, 503),
    (StorageUnavailable, 503),
    # The server is up but cannot serve this database: not a bug of the request or the
    # server; an operator has to act (check / migrate), so nothing to retry soon.
    (DatabaseCorrupt, 503),
    (SchemaMismatch, 503),
    (JobcoordError, 500),
)
#: Refusals that mean "no such job for you": answered 404, exactly like a missing job.
HTTP_NOT_FOUND_CODES = frozenset({"job_not_found", "token_not_found", "artifact_not_found"})
#: A digest mismatch on an artifact upload (the issue's contract): 422. Only the upload's
#: (InvalidInput): a completion refused by its artifacts' checks is a rule's refusal, 409.
HTTP_UNPROCESSABLE_CODES = frozenset({"artifact_invalid"})
#: An artifact over its limit (the server's upload limit or its kind's): 413, the body was
#: too large.
HTTP_TOO_LARGE_CODES = frozenset({"artifact_too_large"})
#: Retry-After seconds of the answers that are worth retrying.
HTTP_RETRY_AFTER_S: dict[type[JobcoordError], int] = {DatabaseBusy: 1, StorageUnavailable: 5}
#: Codes a 503 answer carries that mean "busy" (retry soon) rather than "unavailable".
BUSY_CODES = frozenset({"database_locked", "connections_exhausted", "database_busy",
                        "server_busy"})
