"""Driver errors mapped to jobcoord's error hierarchy (by SQLite error name or SQLSTATE)."""

from __future__ import annotations

from sqlalchemy.exc import TimeoutError as PoolTimeout

from ..errors import DatabaseBusy, JobcoordError, StorageUnavailable


def classify(exc: BaseException, where: str = "") -> JobcoordError:
    """Map a driver error to jobcoord's hierarchy by SQLite's error name or PostgreSQL's
    SQLSTATE, never by message text."""
    orig = getattr(exc, "orig", exc)
    suffix = f" ({where})" if where else ""
    if isinstance(orig, PoolTimeout):
        return DatabaseBusy(
            "connections_exhausted",
            f"every connection to the database is in use{suffix}; nothing was changed, try "
            "again",
        )
    from .postgresql import PG_STATES
    from .sqlite import SQLITE_CODES

    name = getattr(orig, "sqlite_errorname", None)
    if name:
        for prefix, cls, code, text in SQLITE_CODES:
            if name.startswith(prefix):
                return cls(code, f"{text}{suffix} [{name}]", sqlite_error=name)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate and sqlstate in PG_STATES:
        cls, code, text = PG_STATES[sqlstate]
        return cls(code, f"{text}{suffix} [SQLSTATE {sqlstate}]", sqlstate=sqlstate)
    if sqlstate and (sqlstate[:2] == "08" or sqlstate in ("57P01", "57P02", "57P03")):
        # Connection lost, or the server shutting down or starting (a restart): transient.
        return StorageUnavailable(
            "database_unavailable", f"lost the database connection{suffix}: "
            f"{str(orig).strip()} [SQLSTATE {sqlstate}]", sqlstate=sqlstate)
    if any(c.__module__.startswith("psycopg") and c.__name__ == "OperationalError"
           for c in type(orig).__mro__):
        return StorageUnavailable(
            "database_unavailable", f"cannot reach the database{suffix}: {str(orig).strip()}"
        )
    return JobcoordError("internal_error", f"database error{suffix}: {orig}")
