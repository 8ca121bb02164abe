"""Dialect-neutral Core constructs for what SQLite and PostgreSQL spell differently.

The capability modules build every statement once, at import time, from these constructs; each
renders per dialect when SQLAlchemy compiles the statement for a connection. The renderings live
in one module per dialect (``scheduler.backends.sqlite.backend`` and ``…postgresql``), which also
hold each backend's runtime pieces (begin statements, failure classification, clock, pragmas):

* :class:`json_text_field` — a JSON object member as text (``json_extract`` / ``->>``);
* :class:`correlated_exists` — an ``EXISTS`` kept row by row (PostgreSQL: ``OFFSET 0`` inside);
* :class:`greatest` — the larger of two values (SQLite's scalar ``max`` / ``GREATEST``);
* :class:`glob_match` — SQLite's ``GLOB`` with a constant pattern (a regular expression on
  PostgreSQL, translated by ``scheduler.schema.glob_to_regex``);
* :func:`insert_ignoring_conflict` — ``INSERT … ON CONFLICT (cols) DO NOTHING`` (the same text on
  both backends);
* :class:`server_clock_ms` — the server's clock in epoch ms, :class:`server_instant` — the
  server's clock as a timestamp, and :class:`micros_since`, the µs since such an instant
  (PostgreSQL only: SQLite's store samples its clock in Python);
* :class:`row_version` — the version of a row the statement read (PostgreSQL only);
* :class:`expiry_order` — the order an expired-lease probe reads its rows in (PostgreSQL: lease
  expiry, from ``scheduler_pg_occurrences_expired``; SQLite: the claim index's own order);
* :class:`row_check` — a condition checked on a row found by its primary key, never an index
  condition (PostgreSQL: ``(…) IS TRUE``).

Row locks need no construct: ``Select.with_for_update(skip_locked=…)`` renders ``FOR UPDATE …``
on PostgreSQL and nothing on SQLite, whose ``BEGIN IMMEDIATE`` already serializes writers.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import BigInteger, Boolean, String, Table
from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ClauseElement, ColumnElement, operators
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.expression import Exists
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.visitors import InternalTraversal

_TraverseInternalsType = list[tuple[str, InternalTraversal]]
"""What SQLAlchemy reads of a construct's ``_traverse_internals`` (its cache key): (attribute, kind)."""


class json_text_field(ColumnElement[str]):
    """The text of member ``member`` of the JSON object stored in ``column`` (``NULL`` if absent).

    The stored documents are canonical JSON text; the members read this way are strings.
    """

    __visit_name__ = "scheduler_json_text_field"
    inherit_cache = True
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 - SQLAlchemy's declaration
        ("column", InternalTraversal.dp_clauseelement),
        ("member", InternalTraversal.dp_string),
    ]
    type = String()

    def __init__(self, column: ColumnElement[Any], member: str) -> None:
        if not member.isidentifier():
            raise ValueError(f"JSON member names are identifiers here, not {member!r}")
        self.column = column
        self.member = member


class glob_match(ColumnElement[bool]):
    """``operand GLOB pattern`` with SQLite's semantics, for a constant ``pattern``."""

    __visit_name__ = "scheduler_glob_match"
    inherit_cache = True
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 - SQLAlchemy's declaration
        ("operand", InternalTraversal.dp_clauseelement),
        ("pattern", InternalTraversal.dp_string),
    ]
    type = Boolean()

    def __init__(self, operand: ColumnElement[Any], pattern: str) -> None:
        self.operand = operand
        self.pattern = pattern


class correlated_exists(Exists):
    """An ``EXISTS`` tested row by row on the rows an ordered index walk yields, as SQLite runs it.

    Built like ``exists()`` (``correlated_exists().where(…)``). SQLite renders it as a plain
    ``EXISTS``. PostgreSQL would pull it up into a semi-join and, for a selective filter
    (``job_kind``), read and sort every due row instead of walking the claim index; ``OFFSET 0``
    in the subquery keeps it a per-row subplan there.
    """

    __visit_name__ = "scheduler_correlated_exists"
    inherit_cache = True


@compiles(correlated_exists)
def _render_correlated_exists(element: correlated_exists, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.visit_unary(element, **kw))  # type: ignore[no-untyped-call]


class greatest(FunctionElement[Any]):
    """The larger of two non-null values."""

    name = "greatest"
    inherit_cache = True


class row_version(ColumnElement[str]):
    """The version of the row of ``table`` (a table or an alias in the statement's FROM) that the
    statement read (PostgreSQL: its ``xmin``: a row lock keeps it, an update makes a new one). A
    row locked after another transaction updated it comes back as that newer version, while a
    second reference to the table still reads the version of the statement's snapshot."""

    __visit_name__ = "scheduler_row_version"
    inherit_cache = True
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 - SQLAlchemy's declaration
        ("table", InternalTraversal.dp_clauseelement),
    ]
    type = String()

    def __init__(self, table: Any) -> None:
        self.table = table


class expiry_order(ColumnElement[Any]):
    """The ``ORDER BY`` of a probe of running rows whose lease expired (``status = 'running' AND
    lease_expires_at <= now … LIMIT n``) over ``table`` (``occurrences`` or an alias of it).

    SQLite renders the order its ``scheduler_occurrences_claim`` walk yields anyway (available_at,
    lease_expires_at, scheduled_for, occurrence_id: no sort, the probe still stops at its limit).
    PostgreSQL renders ``lease_expires_at, occurrence_id``, the order of the PostgreSQL-only
    ``scheduler_pg_occurrences_expired``, so that (with sorts disabled on the store's connection,
    ``opening_postgresql.PLANNER_SQL``) the planner reads that index whatever the statistics say.
    """

    __visit_name__ = "scheduler_expiry_order"
    inherit_cache = True
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 - SQLAlchemy's declaration
        ("table", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, table: Any) -> None:
        self.table = table


def render_order(compiler: SQLCompiler, table: Any, names: tuple[str, ...], **kw: Any) -> str:
    """``table.a, table.b, …`` as ``compiler`` renders those columns."""
    return ", ".join(compiler.process(table.c[name], **kw) for name in names)


CLAIM_INDEX_ORDER: Final = ("available_at", "lease_expires_at", "scheduled_for", "occurrence_id")


@compiles(expiry_order)
def _expiry_in_claim_index_order(element: expiry_order, compiler: SQLCompiler, **kw: Any) -> str:
    return render_order(compiler, element.table, CLAIM_INDEX_ORDER, **kw)


class row_check(ColumnElement[bool]):
    """``condition``, checked on each row the statement's other conditions find (by primary key)
    and never used to choose an index.

    The by-key writes of a held lease (settle, renew, park) also require ``status = 'running'``.
    With statistics taken while no row ran, PostgreSQL estimated one running row and looked the
    row up through ``scheduler_occurrences_claim`` (``status`` leads it) instead of the primary
    key: a walk over every running entry, the dead ones each settle leaves behind included (the
    lease checked in the index lies ahead, so no scan marks them dead), growing with the settles
    of the last lease. PostgreSQL renders ``(condition) IS TRUE``, the same filter, which no
    index matches; SQLite, which looks a key up by its primary key anyway, the condition itself.
    The other by-key writes that name a status (requeue, reopen, resume) and the sweep's lock
    (``claim_locks.LOCK_EXPIRED``) use it too.

    Only as a term of a ``WHERE``: negated, ``NOT (condition) IS TRUE`` keeps NULL rows that
    ``NOT condition`` drops.
    """

    __visit_name__ = "scheduler_row_check"
    inherit_cache = True
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 - SQLAlchemy's declaration
        ("condition", InternalTraversal.dp_clauseelement),
    ]
    type = Boolean()

    def __init__(self, condition: ColumnElement[bool]) -> None:
        self.condition = condition

    def self_group(self, against: Any = None) -> ColumnElement[Any]:
        return self  # a condition already, not a boolean value to compare with 1 on SQLite


@compiles(row_check)
def _row_check_as_condition(element: row_check, compiler: SQLCompiler, **kw: Any) -> str:
    # grouped as an AND operand, so an OR inside it stays one condition beside the others
    return str(compiler.process(element.condition.self_group(against=operators.and_), **kw))


class server_clock_ms(FunctionElement[int]):
    """The server's clock in epoch milliseconds, read when the statement computes the value
    (PostgreSQL ``clock_timestamp()``; a statement that needs it after a row lock reads it in
    the outer query over a ``MATERIALIZED`` locking CTE)."""

    name = "server_clock_ms"
    inherit_cache = True
    type = BigInteger()


class server_instant(FunctionElement[Any]):
    """The server's clock as a timestamp, read when the statement computes it (PostgreSQL
    ``clock_timestamp()``)."""

    name = "server_instant"
    inherit_cache = True


class micros_since(FunctionElement[int]):
    """Microseconds from ``instant`` (a :class:`server_instant` the statement read earlier) to when
    this value is computed: how long the statement waited for the locks it took in between."""

    name = "micros_since"
    inherit_cache = True
    type = BigInteger()


@compiles(row_version)
def _row_version_as_named(element: row_version, compiler: SQLCompiler, **_kw: Any) -> str:
    return f"row_version({element.table.name})"  # str(statement); each backend renders its own


@compiles(row_version, "sqlite")
def _no_row_version(element: row_version, compiler: SQLCompiler, **_kw: Any) -> str:
    raise CompileError("the SQLite store reads no row versions (one writer at a time)")


@compiles(server_instant)
@compiles(micros_since)
def _clock_as_named(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> str:
    return f"{element.name}({compiler.process(element.clauses, **kw)})"  # str(statement)


@compiles(server_instant, "sqlite")
@compiles(micros_since, "sqlite")
def _no_clock(element: FunctionElement[Any], compiler: SQLCompiler, **_kw: Any) -> str:
    raise CompileError("the SQLite store has no server clock")


@compiles(server_clock_ms)
def _server_clock_as_named(element: server_clock_ms, compiler: SQLCompiler, **_kw: Any) -> str:
    return "server_clock_ms()"  # str(statement); each backend renders its own (or refuses)


@compiles(server_clock_ms, "sqlite")
def _no_server_clock(element: server_clock_ms, compiler: SQLCompiler, **_kw: Any) -> str:
    raise CompileError("the SQLite store has no server clock; it samples its clock in Python")


class _IgnoreConflict(ClauseElement):
    """The ``ON CONFLICT (…) DO NOTHING`` clause of :func:`insert_ignoring_conflict`."""

    __visit_name__ = "scheduler_ignore_conflict"
    inherit_cache = True
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 - SQLAlchemy's declaration
        ("columns", InternalTraversal.dp_string_list)
    ]

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns


@compiles(_IgnoreConflict)
def _render_ignore_conflict(element: _IgnoreConflict, compiler: SQLCompiler, **_kw: Any) -> str:
    columns = ", ".join(compiler.preparer.quote(name) for name in element.columns)
    return f"ON CONFLICT ({columns}) DO NOTHING"


class InsertIgnoringConflict(Insert):
    """An ``INSERT`` that skips a row conflicting on the given unique columns (SQLite and
    PostgreSQL both spell it ``ON CONFLICT (cols) DO NOTHING``)."""

    inherit_cache = True

    def __init__(self, table: Table, columns: tuple[str, ...]) -> None:
        super().__init__(table)
        self._post_values_clause = _IgnoreConflict(columns)


def insert_ignoring_conflict(table: Table, *index_elements: str) -> InsertIgnoringConflict:
    """``INSERT … ON CONFLICT(index_elements) DO NOTHING`` for ``table``."""
    return InsertIgnoringConflict(table, index_elements)


__all__ = [
    "InsertIgnoringConflict",
    "correlated_exists",
    "glob_match",
    "greatest",
    "insert_ignoring_conflict",
    "json_text_field",
    "micros_since",
    "row_version",
    "server_clock_ms",
    "server_instant",
]
