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


#: Bytes SQLite adds to a database's name for the files beside it (`-journal`).
SQLITE_ROOM = len("-journal")
#: Bytes jobcoord may add to the name of a file it writes (a backup's staged copy
#: `DEST.<token>.tmp.tmp-<pid>-journal`, its objects set aside `DEST.artifacts.<token>.old`).
WRITE_ROOM = 40


def utf8_path(path: str, what: str) -> None:
    """InvalidInput (exit 2) for a database's path that is not UTF-8 (a byte of another
    encoding, which Python carries as a lone surrogate): the path goes into a database URL
    and into every answer, and it was an internal error (exit 1) there."""
    from ..errors import InvalidInput

    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("invalid_input", f"{what}: the path is not valid UTF-8 (a byte of "
                           "another encoding); rename the file or the directory") from None


def name_has_room(path: str, room: int, what: str) -> None:
    """InvalidInput (exit 2), before anything is written, when the names of the files put
    beside `path` would not fit the directory's limit (255 bytes on most filesystems): they
    failed halfway, an internal error or an empty database left behind."""
    from ..errors import InvalidInput

    try:
        limit = os.pathconf(os.path.dirname(path) or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    size = len(os.fsencode(os.path.basename(path)))
    if size + room > limit:
        raise InvalidInput("invalid_input", f"{what}: the file name is {size} bytes; at most "
                           f"{limit - room} here (the files put beside it are named after it)",
                           path=path)


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
        utf8_path(path, "--db")
        path = os.path.abspath(path)
        name_has_room(path, SQLITE_ROOM, "--db")
        # Quoted by URL.create: a raw "sqlite:///" + path would read "?" as the start of the
        # query and "#" as a fragment, and name another file.
        return Target(url=URL.create("sqlite", database=path).render_as_string(),
                      sqlite_path=path)
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018  (read: a port that is no number fails here, not later)
    except (ArgumentError, ValueError) as e:
        # ValueError: a port that is no number, a bracketed host never closed.
        raise InvalidInput("invalid_input", f"not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
    if backend == "postgres":  # Heroku-style URLs name the scheme without "ql"
        parsed = parsed.set(drivername="postgresql+psycopg")
        backend = "postgresql"
    if parsed.drivername.partition("+")[2] not in ("", "pysqlite", "psycopg"):
        # Another driver (psycopg2, asyncpg, pg8000, ...): jobcoord runs on psycopg 3 and the
        # standard library's sqlite3 only; its module missing was an internal error.
        raise InvalidInput("invalid_input", f"unsupported database driver "
                           f"{parsed.drivername!r}: use sqlite:///PATH or "
                           "postgresql+psycopg://USER@HOST/DB")
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise InvalidInput("invalid_input", "a SQLite URL must name a file")
        if parsed.query or "?" in url:
            # Cut off, `?mode=ro` would open a writable database without a word, and a `?`
            # in a file's name would name another file.
            raise InvalidInput("invalid_input", f"a SQLite URL takes no query ({url!r}): "
                               "jobcoord opens the file with its own settings; write a `?` "
                               "in the file's name as %3F")
        path = os.path.abspath(parsed.database)
        name_has_room(path, SQLITE_ROOM, "the SQLite URL")
        return Target(url=url, sqlite_path=path)
    if backend == "postgresql":
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        _check_connection_options(parsed, url)
        return Target(url=parsed.render_as_string(hide_password=False))
    raise InvalidInput(
        "invalid_input",
        f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///PATH or "
        "postgresql+psycopg://USER@HOST/DB",
    )


def _check_connection_options(parsed: URL, url: str) -> None:
    """What the driver would refuse only as it connects, refused before anything opens: a
    port that is no number or out of range (`?port=abc` ended as an internal error, `:99999`
    as a database out of reach), an option libpq does not know (`?foo=1`) or a connect
    timeout that is no number (both a database error, exit 1). Values only the server or
    libpq's connection can judge (an sslmode, a host) are left to the connection."""
    from ..errors import InvalidInput

    def bad(why: str) -> InvalidInput:
        return InvalidInput("invalid_input", f"not a usable database URL ({why}): {url!r}")

    if parsed.port is not None and not 0 < parsed.port < 65536:  # 0 was the default port
        raise bad(f"port {parsed.port} is not a number from 1 to 65535")
    for key, value in parsed.query.items():
        # Only a host list repeats (host=a&host=b, with their ports); another option given
        # twice reached the driver as the text of a tuple.
        if isinstance(value, tuple) and key not in ("host", "port"):
            raise bad(f"option {key!r} given {len(value)} times")
    try:
        _, params = parsed.get_dialect()().create_connect_args(parsed)
    except ArgumentError as e:
        raise bad(str(e)) from None
    for port in str(params.get("port", "")).split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise bad(f"port {port!r} is not a number from 1 to 65535")
    if "connect_timeout" in params:  # read by psycopg itself, with int()
        try:
            int(str(params["connect_timeout"]))
        except ValueError:
            raise bad(f"connect_timeout {params['connect_timeout']!r} is no number") from None
    try:
        from psycopg import ProgrammingError, conninfo
    except ImportError:
        return  # the connection says the driver is missing (driver_missing, exit 6)
    try:
        conninfo.make_conninfo("", **{k: str(v) for k, v in params.items()})  # libpq's parser
    except ProgrammingError as e:
        raise bad(str(e).strip()) from None
