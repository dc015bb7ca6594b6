"""Where a coordinator's state lives: `Target` and its resolution from `--db`, `--url` or
`JOBCOORD_URL`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError


@dataclass(frozen=True)
class Target:
    """Where the coordinator's state lives."""

    url: str
    sqlite_path: str | None = None  # absolute path for SQLite files

    @property
    def dialect(self) -> str:
        return "sqlite" if self.sqlite_path is not None else "postgresql"

    def display(self) -> str:
        if self.sqlite_path is not None:
            return self.sqlite_path
        return make_url(self.url).render_as_string(hide_password=True)


def resolve_target(db: str | None = None, url: str | None = None) -> Target:
    """Turn `--db PATH` / `--url URL` / `JOBCOORD_URL` into a Target (default ./jobcoord.db)."""
    from ..errors import InvalidInput

    if db is not None and url is not None:
        raise InvalidInput("invalid_input", "give either --db or --url, not both")
    if url is None and db is None:
        url = os.environ.get("JOBCOORD_URL") or None
    if url is None:
        path = db if db is not None else "jobcoord.db"
        if not path or "\x00" in path:
            raise InvalidInput("invalid_input", "--db must be a file path")
        path = os.path.abspath(path)
        # Quoted by URL.create: a raw "sqlite:///" + path would read "?" as the start of the
        # query and "#" as a fragment, and name another file.
        return Target(url=URL.create("sqlite", database=path).render_as_string(),
                      sqlite_path=path)
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise InvalidInput("invalid_input", f"not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
    if backend == "postgres":  # Heroku-style URLs name the scheme without "ql"
        parsed = parsed.set(drivername="postgresql+psycopg")
        backend = "postgresql"
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise InvalidInput("invalid_input", "a SQLite URL must name a file")
        if parsed.query or "?" in url:
            # Cut off, `?mode=ro` would open a writable database without a word, and a `?`
            # in a file's name would name another file.
            raise InvalidInput("invalid_input", f"a SQLite URL takes no query ({url!r}): "
                               "jobcoord opens the file with its own settings; write a `?` "
                               "in the file's name as %3F")
        return Target(url=url, sqlite_path=os.path.abspath(parsed.database))
    if backend == "postgresql":
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        return Target(url=parsed.render_as_string(hide_password=False))
    raise InvalidInput(
        "invalid_input",
        f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///PATH or "
        "postgresql+psycopg://USER@HOST/DB",
    )
