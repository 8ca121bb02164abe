"""Batches of rows written as a few multi-row ``INSERT … VALUES (…), (…)`` statements.

A batch is cut into chunks whose row counts come from :data:`LADDER`, so whatever its length
a batch uses at most four statement shapes, each compiled once and (on PostgreSQL) named once:
100 rows go as 64 + 16 + 16 + 4. One multi-row statement is one executor run on the server and
one bind in the client, where ``executemany`` is one per row. Rows keep their order: the
database assigns an ``INTEGER PRIMARY KEY`` or a sequence in ``VALUES`` order, as ``executemany``
does.

The largest chunk binds 64 × the table's columns parameters (1,280 for ``occurrences``), far
below PostgreSQL's 65,535 and SQLite's 32,766.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final, TypeVar

from sqlalchemy import Table, bindparam, insert

from scheduler.store.plumbing.constructs import insert_ignoring_conflict
from scheduler.store.plumbing.statement_plans import Prepared

LADDER: Final = (64, 16, 4, 1)
"""The row counts a chunk may have, largest first."""
COPY_AT_LEAST: Final = 8
"""New occurrences of one ``enqueue_many`` from which they go as one ``COPY`` (where the backend
has one), after a read of their identities: measured faster from 6 rows than multi-row inserts
(at 63 rows, 7.9k against 5.3k rows/s), slower at 4."""

T = TypeVar("T")


def chunked(rows: Sequence[T], sizes: Sequence[int] = LADDER) -> tuple[list[Sequence[T]], Sequence[T]]:
    """``rows`` as consecutive chunks of ``sizes`` (largest first) and the rows left over (fewer
    than the smallest size; none with :data:`LADDER`)."""
    chunks: list[Sequence[T]] = []
    start = 0
    for size in sizes:
        while len(rows) - start >= size:
            chunks.append(rows[start : start + size])
            start += size
    return chunks, rows[start:]


@functools.cache
def rows_insert(
    table: Table, columns: tuple[str, ...], count: int, *, skip_conflicts_on: str | None = None
) -> Prepared:
    """``INSERT INTO table (columns) VALUES …`` of ``count`` rows, parameters ``<column>_<row>``
    (:func:`rows_parameters`). With ``skip_conflicts_on`` (a unique column), a row whose value
    of it is taken is skipped (``ON CONFLICT (…) DO NOTHING``) and the statement returns that
    column of each row it inserted."""
    values: list[dict[str, Any]] = [
        {name: bindparam(f"{name}_{row}") for name in columns} for row in range(count)
    ]
    if skip_conflicts_on is None:
        return Prepared(insert(table).values(values))
    statement = insert_ignoring_conflict(table, skip_conflicts_on).values(values)
    return Prepared(statement.returning(table.c[skip_conflicts_on]))


def rows_parameters(columns: tuple[str, ...], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of :func:`rows_insert` for ``rows``."""
    return {f"{name}_{index}": row[name] for index, row in enumerate(rows) for name in columns}
