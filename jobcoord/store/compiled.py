"""How a statement becomes the text its driver runs: `SQL`, compiled by SQLAlchemy once per
dialect into the driver's own parameter style, with the few spellings the stores' compilers
change, and `const` for the constants written into a statement's text."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, literal_column
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

_SET_ITEM = re.compile(r"(^|, )(\w+)=")
_LINE_BREAK = re.compile(r" *\n *")


class _Spelling:
    """What the stores' compilers write differently from SQLAlchemy's defaults."""

    def visit_update(self, update_stmt: Any, **kw: Any) -> str:
        # SQLAlchemy writes `SET a=:a, b=:b`; the statements have always read
        # `SET a = :a, b = :b`, as listeners and plans in the docs quote them.
        text = str(super().visit_update(update_stmt, **kw))  # type: ignore[misc]
        head, sep, rest = text.partition(" SET ")
        end = min((i for i in (rest.find(" WHERE "), rest.find(" RETURNING ")) if i >= 0),
                  default=len(rest))
        return head + sep + _SET_ITEM.sub(r"\1\2 = ", rest[:end]) + rest[end:]


def _dialect(name: str, named: bool = False) -> Dialect:
    """The dialect whose compiler gives the driver's own parameter style (SQLite: `:name`,
    psycopg: `%(name)s`), or with `named` the `:name` style whatever the driver (for reading
    a statement); imported on first use, so a SQLite process never loads psycopg's."""
    dialect = _DIALECTS.get((name, named))
    if dialect is None:
        if name == "sqlite":
            from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
            from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

            class Compiler(_Spelling, SQLiteCompiler):
                def get_from_hint_text(self, table: Any, text: str) -> str:
                    # `with_hint(table, "INDEXED BY ix", "sqlite")`, written after the table.
                    return text

                def limit_clause(self, select: Any, **kw: Any) -> str:
                    # SQLAlchemy adds "OFFSET ?" bound to 0 to every LIMIT: a parameter the
                    # cached statement would have to carry, for nothing.
                    if select._offset_clause is None and select._limit_clause is not None:
                        return "\n LIMIT " + self.process(select._limit_clause, **kw)
                    return str(super().limit_clause(select, **kw))

            class Pysqlite(SQLiteDialect_pysqlite):
                statement_compiler = Compiler

            dialect = Pysqlite(paramstyle="named")
        else:
            from sqlalchemy.dialects.postgresql.psycopg import (
                PGCompiler_psycopg,
                PGDialect_psycopg,
            )
            from sqlalchemy.engine.interfaces import BindTyping

            class PGCompiler(_Spelling, PGCompiler_psycopg):
                pass

            class Psycopg(PGDialect_psycopg):
                statement_compiler = PGCompiler

            dialect = Psycopg(paramstyle="named") if named else Psycopg()
            # No "::TYPE" casts on the parameters: the driver binds typed values itself, and
            # the statements keep the plans measured without them.
            dialect.bind_typing = BindTyping.NONE
        _DIALECTS[name, named] = dialect
    return dialect


_DIALECTS: dict[tuple[str, bool], Dialect] = {}


def _dialect_insert(name: str) -> Callable[..., Any]:
    """The dialect's own `insert`, the one with on_conflict_do_nothing / _do_update."""
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert


#: What a statement is made from: SQL text with `:name` parameters, a Core statement, or a
#: function of the dialect's own `insert` giving one (for ON CONFLICT, which each dialect
#: spells with its own construct).
Source = str | ClauseElement | Callable[[Callable[..., Any]], ClauseElement]


class SQL:
    """One statement, compiled by SQLAlchemy once per dialect into the driver's own named
    parameter style (SQLite `:name`, psycopg `%(name)s`: both take a mapping, so no
    parameter order is kept), so the hot path can hand the cached string straight to the
    DB-API cursor."""

    __slots__ = ("_source", "_texts")

    def __init__(self, source: Source) -> None:
        self._source = source
        self._texts: dict[str, str] = {}

    @property
    def source(self) -> str:
        """The statement as text with `:name` parameters (SQLite's compilation of a built
        one): for reading, and for the tests that prepare every statement."""
        return self._source if isinstance(self._source, str) else self.text("sqlite")

    def text(self, dialect: str) -> str:
        """The statement for the named dialect's driver (compiled on first use)."""
        compiled = self._texts.get(dialect)
        if compiled is None:
            compiled = self._texts[dialect] = self._compile(dialect)
        return compiled

    def element(self, dialect: str) -> ClauseElement:
        """The statement as SQLAlchemy builds it for this dialect."""
        source = self._source
        if isinstance(source, str):
            return sql_text(source)
        if isinstance(source, ClauseElement):
            return source
        return source(_dialect_insert(dialect))

    def named(self, dialect: str) -> str:
        """The statement as the dialect spells it, with `:name` parameters (for reading it,
        or a plan)."""
        if isinstance(self._source, str):
            return self._source
        return self._compile(dialect, named=True)

    def _compile(self, dialect: str, named: bool = False) -> str:
        compiled = self.element(dialect).compile(dialect=_dialect(dialect, named))
        # Every value comes from the caller's parameters: a value SQLAlchemy bound itself
        # (a Python constant in the statement) would be missing when the cached text runs.
        bound = [name for name, bind in compiled.binds.items() if bind.value is not None]
        if bound:
            raise ValueError(f"statement binds constants {bound}: write them with "
                             "literal_column so the cached text carries them")
        if isinstance(self._source, str):
            return str(compiled)
        # One line, as logs, listeners and plans quote it: SQLAlchemy breaks lines before
        # FROM, WHERE, LIMIT and each CTE's body; no constant here holds a line break.
        return _LINE_BREAK.sub(" ", str(compiled))

    @property
    def sqlite(self) -> str:
        return self.text("sqlite")

    @property
    def postgresql(self) -> str:
        return self.text("postgresql")


def const(value: str | int) -> ColumnElement[Any]:
    """A constant written into the statement's text, not bound: the partial claim and
    deadline indexes match only a literal `status = 'waiting'`."""
    return literal_column(f"'{value}'" if isinstance(value, str) else str(int(value)))
