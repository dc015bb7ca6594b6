"""Shared fixtures: one suite, two databases.

`coord` (and `target`) are parametrized over SQLite and PostgreSQL. Each test gets a fresh
database copied from a template migrated once per session: a file copy for SQLite,
`CREATE DATABASE ... TEMPLATE` for PostgreSQL. The PostgreSQL cases read
JOBCOORD_TEST_PG_URL (a URL of an existing database on the server, used only to create and
drop test databases) and skip, with the reason shown, when it is unset.
"""

from __future__ import annotations

import os
import sys

# Tests must not pick up a developer's database or policy, nor a fault switch: every
# JOBCOORD_* variable is removed before anything imports jobcoord (a module reading one at
# import would otherwise see it). The switches of the test run itself are read first and
# kept: clearing them would make the PostgreSQL and slow tests impossible to run.
assert "jobcoord" not in sys.modules, "tests/conftest.py must run before jobcoord is imported"
PG_URL = os.environ.get("JOBCOORD_TEST_PG_URL")
SLOW_TESTS = bool(os.environ.get("JOBCOORD_SLOW_TESTS"))
_KEEP = {"JOBCOORD_TEST_PG_URL", "JOBCOORD_SLOW_TESTS"}
for _var in [k for k in os.environ if k.startswith("JOBCOORD_") and k not in _KEEP]:
    del os.environ[_var]

# Every process the tests start imports tests/fault_site/sitecustomize.py, which arms the
# fault points named by JOBCOORD_FAULT / JOBCOORD_TEST_DEFERRED_WRITES (see jobcoord/faults.py:
# jobcoord itself reads neither). A test that sets them uses `environment(...)` below.
FAULT_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_site")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [FAULT_SITE, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from freezegun import freeze_time  # noqa: E402

from jobcoord.db import Database, Target, resolve_target  # noqa: E402
from jobcoord.migrate import migrate  # noqa: E402
from jobcoord.service import Coordinator  # noqa: E402
from tests.sql import sql  # noqa: E402
from tests.timeline import at  # noqa: E402

PG_SKIP = "JOBCOORD_TEST_PG_URL is not set: PostgreSQL cases skipped"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SLOW_TESTS:
        return
    skip = pytest.mark.skip(reason="slow scale-up: set JOBCOORD_SLOW_TESTS=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# --- where the suite's time goes ------------------------------------------------------------

# The clock is kept in a list: freezegun replaces every module attribute holding the real
# clock functions while a test freezes time, which made `--durations` report setups of
# billions of seconds. A list's item is not a module attribute, so this one stays real.
_REAL_CLOCK = [time.perf_counter]
_WALL: dict[str, float] = {}
SLOWEST_SHOWN = 25


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Iterator[None]:
    started = _REAL_CLOCK[0]()
    yield
    _WALL[item.nodeid] = _REAL_CLOCK[0]() - started


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The slowest files and tests by wall clock (setup, call and teardown), for keeping
    the suite short: each file's total, then the single tests."""
    if len(_WALL) < 2:
        return
    files: dict[str, float] = {}
    for nodeid, seconds in _WALL.items():
        files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0.0) + seconds
    write = terminalreporter.write_line
    terminalreporter.section(f"wall clock: {sum(_WALL.values()):.0f} s in all")
    for path, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]:
        write(f"{seconds:9.1f} s  {path}")
    write("")
    for nodeid, seconds in sorted(_WALL.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]:
        write(f"{seconds:9.1f} s  {nodeid}")


# --- SQLite ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("template") / "template.db")
    db = Database.open(resolve_target(db=path), create=True)
    migrate(db)
    db.close()
    return path


def fresh_sqlite(template: str, directory: str, name: str = "jobcoord.db") -> Target:
    path = os.path.join(directory, name)
    shutil.copy(template, path)
    os.chmod(path, 0o600)
    return resolve_target(db=path)


# --- PostgreSQL -----------------------------------------------------------------------------


def _pg_admin() -> Any:
    import psycopg

    from jobcoord.db import resolve_target as _rt

    url = _rt(url=PG_URL).url.replace("postgresql+psycopg://", "postgresql://")
    return psycopg.connect(url, autocommit=True)


def _pg_url_for(dbname: str) -> str:
    from sqlalchemy.engine import make_url

    assert PG_URL is not None
    return make_url(PG_URL).set(drivername="postgresql+psycopg", database=dbname
                                ).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    if not PG_URL:
        pytest.skip(PG_SKIP)
    name = f"jobcoord_tpl_{os.getpid()}"
    with _pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    db = Database.open(resolve_target(url=_pg_url_for(name)))
    migrate(db)
    db.close()
    yield name
    with _pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_pg(template: str | None) -> Iterator[Target]:
    """A new PostgreSQL database copied from `template`, or with no schema at all."""
    name = f"jobcoord_t_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield resolve_target(url=_pg_url_for(name))
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set variables for the processes started inside the block (spawn copies os.environ)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the parametrized fixtures ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql" and not PG_URL:
        pytest.skip(PG_SKIP)
    return str(request.param)


@pytest.fixture
def target(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Target]:
    """A fresh, migrated database on the parametrized backend."""
    if backend == "sqlite":
        yield fresh_sqlite(request.getfixturevalue("sqlite_template"), str(tmp_path))
    else:
        with fresh_pg(request.getfixturevalue("pg_template")) as t:
            yield t


@pytest.fixture
def coord(target: Target) -> Iterator[Coordinator]:
    c = Coordinator.open(target)
    yield c
    c.close()


@pytest.fixture
def sqlite_target(sqlite_template: str, tmp_path: Any) -> Target:
    """A fresh migrated SQLite database, for SQLite-only facts."""
    return fresh_sqlite(sqlite_template, str(tmp_path))


# --- running the CLI in-process -------------------------------------------------------------


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(target: Target | None, *args: str, stdin: bytes = b"") -> CliResult:
    """Run `jobcoord [--db|--url] ARGS` in this process (so freezegun applies) and capture
    stdout, stderr and the exit code."""
    from jobcoord.cli import main

    argv: list[str] = []
    if target is not None:
        argv = (["--db", target.sqlite_path] if target.sqlite_path
                else ["--url", target.url])
    argv += list(args)
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(target: Target) -> Any:
    """`cli("claim", "w1", "--json")` against the parametrized database."""
    return lambda *args, stdin=b"": run_cli(target, *args, stdin=stdin)


@pytest.fixture
def clock() -> Iterator[Any]:
    """Time frozen at tests.timeline.T0; tick it to move on."""
    with freeze_time(at(0)) as frozen:
        yield frozen


def dump(coord: Coordinator) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every core table, to prove that a refused command changed nothing."""
    from jobcoord.models import CORE_TABLES

    def _read(conn: Any) -> dict[str, list[tuple[Any, ...]]]:
        return {t: [tuple(r) for r in sql(conn, f"SELECT * FROM {t} ORDER BY 1"
                                                         ).all()] for t in CORE_TABLES}
    return coord.db.read(_read)


def flip_root_page_byte(path: Any, table: str, offset: int) -> None:
    """One byte of `table`'s root page changed, as a bad disk sector does: at `offset` 4 the
    page header's cell content start, at 8 a leaf's first cell pointer. quick_check finds it;
    the rows read past it come back as NULLs."""
    import sqlite3

    conn = sqlite3.connect(str(path))
    root, page = (conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                               (table,)).fetchone()[0],
                  conn.execute("PRAGMA page_size").fetchone()[0])
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page + offset)
        b = f.read(1)
        f.seek((root - 1) * page + offset)
        f.write(bytes([b[0] ^ 0x5A]))
