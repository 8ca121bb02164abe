"""Writes a transaction keeps for later, sent together as one statement where the backend can.

A one-row write whose effect no statement of the call reads before the next write need not be
a round trip of its own: ``Tx.write_later`` keeps it, and the kept writes are sent before the
next statement that could observe them, with the call's event rows, or when the call ends. On a
backend with data-modifying ``WITH`` (``Backend.combines_writes``: PostgreSQL) everything
sent at once is one statement::

    WITH w0 AS (UPDATE occurrences … RETURNING 1),
         w1 AS (UPDATE occurrences … RETURNING 1),
         ev AS (INSERT INTO events … VALUES (…), (…) RETURNING 1)
    SELECT (SELECT count(*) FROM w0) AS w0, (SELECT count(*) FROM w1) AS w1, (SELECT count(*) FROM ev) AS ev

Each part is the same module-level Core statement SQLite runs on its own, its bind names
prefixed per part; the counts stand in for each part's rowcount in the compare-and-set checks.
PostgreSQL runs every part exactly once, to completion, on the snapshot the statement starts
with: the parts must not depend on each other's effects and must not change the same row twice
(``Tx.write_later`` sends what it keeps first when a second write names the same row). The
foreign-key checks of the event rows run at the end of the statement, after the updates. Event
ids are assigned in ``VALUES`` order, as the separate ``INSERT`` assigns them.

On SQLite (no data-modifying ``WITH``) nothing is kept: every write runs when it is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import BigInteger, Integer, and_, bindparam, case, cast, func, literal_column, select
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.visitors import replacement_traverse

from scheduler.schema import tables as t
from scheduler.store.plumbing.row_inserts import rows_insert, rows_parameters
from scheduler.store.plumbing.statement_plans import STATEMENTS_LOCK, Prepared

KEPT_WRITES_CHANGED: Final = "scheduler:kept-writes-changed"
"""The text a checked combined write casts to an integer when a write's count is not the one
expected (``combined(..., checked=True)``): the error aborts the transaction before a ``COMMIT``
sent with it (the backend recognizes it: ``Backend.counts_differed``)."""

EVENT_COLUMNS: Final = (
    "job_id",
    "occurrence_id",
    "event_type",
    "occurred_at",
    "owner_id",
    "fence",
    "data_json",
)
MULTI_ROW_EVENTS: Final = 4
"""Up to this many events are written with one multi-row ``INSERT … VALUES``; more with ``executemany``."""


def event_rows_insert(count: int) -> Prepared:
    """``INSERT INTO events … VALUES (…), (…)`` of ``count`` rows, parameters ``<column>_<row>``
    (:func:`event_rows_parameters`; event ids are assigned in row order, as ``executemany`` assigns
    them)."""
    return rows_insert(t.events, EVENT_COLUMNS, count)


def event_rows_parameters(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of :func:`event_rows_insert` for ``rows``."""
    return rows_parameters(EVENT_COLUMNS, rows)


def _with_prefixed_binds(statement: Any, prefix: str) -> Any:
    """A copy of ``statement`` whose named binds are called ``prefix + name`` (anonymous binds,
    such as those of literal values, already have names of their own in a compiled statement)."""

    def rename(element: Any) -> Any:
        if isinstance(element, BindParameter) and not element.key.startswith("%("):
            return bindparam(
                prefix + element.key,
                element.value,
                type_=element.type,
                required=element.required,
                literal_execute=element.literal_execute,
                expanding=element.expanding,
            )
        return None

    copied: Any = replacement_traverse(statement, {}, rename)  # type: ignore[call-overload]
    return copied


def part_name(index: int) -> str:
    return f"w{index}"


def combined_parameters(
    parts: Sequence[tuple[Prepared, dict[str, Any]]], expected: Sequence[int] = ()
) -> dict[str, Any]:
    """The parameters of :func:`combined` for the parts' own parameter dicts (and, for a checked
    statement, the counts expected of its first parts)."""
    values: dict[str, Any] = {}
    for index, (_statement, parameters) in enumerate(parts):
        prefix = part_name(index) + "_"
        for name, value in parameters.items():
            values[prefix + name] = value
    for index, count in enumerate(expected):
        values[f"expected_{part_name(index)}"] = count
    return values


def combined(statements: tuple[Prepared, ...], *, checked: int = 0) -> Prepared:
    """One statement running each of ``statements`` (single-row ``UPDATE``/``INSERT`` statements
    with explicit values) as a data-modifying ``WITH`` part; its one row holds each part's count
    of rows written, in order (columns ``w0``, ``w1``, …). Built once per combination.

    ``checked``: the statement fails (SQLSTATE 22P02 naming :data:`KEPT_WRITES_CHANGED`) unless
    each of its first ``checked`` parts wrote the count bound as ``expected_w<n>``
    (:func:`combined_parameters`), so a ``COMMIT`` sent after it in the same query never follows
    a compare-and-set that missed."""
    with STATEMENTS_LOCK:  # module-level statements are shared by every thread
        return _combined(statements, checked)


@functools.cache
def _combined(statements: tuple[Prepared, ...], checked: int) -> Prepared:
    counts = part_counts(statements)
    columns = [count.label(part_name(index)) for index, count in enumerate(counts)]
    if checked:
        columns.append(count_check(counts[:checked]))
    return Prepared(select(*columns), locks=True)


def part_counts(statements: Sequence[Prepared]) -> list[Any]:
    """Each of ``statements`` as the data-modifying ``WITH`` part ``w<n>`` (its binds prefixed
    ``w<n>_``), as the scalar subquery counting the rows it wrote."""
    counts = []
    for index, prepared in enumerate(statements):
        name = part_name(index)
        part = _with_prefixed_binds(prepared.statement, name + "_").returning(literal_column("1")).cte(name)
        counts.append(select(func.count()).select_from(part).scalar_subquery())
    return counts


def count_check(counts: Sequence[Any], *also: Any) -> Any:
    """``CAST(CASE WHEN <each count as expected> [AND <also>] THEN '1' ELSE '<marker>' END AS
    INTEGER)``, labelled ``checked``: the cast of the marker raises, at run time only (the
    condition reads the parts' counts). ``counts`` are :func:`part_counts`' first ones."""
    agreed = and_(
        *(
            count == bindparam(f"expected_{part_name(index)}", type_=BigInteger())
            for index, count in enumerate(counts)
        ),
        *also,
    )
    verdict = case((agreed, literal_column("'1'")), else_=literal_column(f"'{KEPT_WRITES_CHANGED}'"))
    return cast(verdict, Integer()).label("checked")
