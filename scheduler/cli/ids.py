"""Ids on the command line: unique prefixes in, short ids out (as git abbreviates commit hashes).

In: every command that takes an occurrence, job or domain-migration id (an argument or a filter
such as ``--job``) accepts the whole id or a unique prefix of at least :data:`MIN_PREFIX`
characters. A whole id always wins (a job named ``report`` beside ``report-daily``); a prefix that
several ids start with is a usage error (exit 2, ``CLI_AMBIGUOUS_ID``) listing them; a prefix no
id starts with is passed on unchanged, so each command reports an unknown id as it always has.

Out: tables show the generated ids (``occ_…`` occurrences, ``scheduler-domain-migration-…``
migrations) shortened to the shortest prefix that no other id of the table starts with, and at
least :data:`SHORT_DIGITS` characters past the id's fixed namespace (``occ_1a2b3c4d``). As with
git, a prefix unique today may stop being unique when more ids arrive: the commands then say so
and list the candidates. ``--json`` always prints whole ids. Job ids are names the application
chose and are shown whole.

Both directions are index range scans of the table's primary key
(``id >= prefix AND id < successor(prefix)``, and the nearest ids below and above), never a
``LIKE`` scan: text order is code-point order on both backends (SQLite ``BINARY``, PostgreSQL
``COLLATE "C"``), so the ids starting with a prefix are exactly that range.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Column, Connection, Select, select

from scheduler.backends import backend_for, backend_named
from scheduler.cli import pg_target
from scheduler.cli.common import (
    EXIT_USAGE,
    CliFailure,
    readonly_connection,
    refuse_stray_file,
    resolve_schema,
    resolve_target,
    sqlite_schema,
)
from scheduler.schema import tables as t
from scheduler.schema.catalog import list_user_tables

MIN_PREFIX: Final = 4
"""A shorter value is only ever taken as a whole id."""
SHORT_DIGITS: Final = 8
"""Characters past the namespace a short id shows at least (``occ_`` + 8 = 12 characters)."""
CANDIDATES_SHOWN: Final = 10

Short = Callable[[str | None], str]
"""Maps an id to what a table shows for it (``-`` for ``None``)."""


@dataclass(frozen=True)
class IdSpace:
    """One kind of id: the primary-key column it lives in, how output names it, and its namespace."""

    noun: str
    column: Column[str]
    namespace: str = ""
    shorten: bool = True


OCCURRENCE: Final = IdSpace("occurrence", t.occurrences.c.occurrence_id, "occ_")
JOB: Final = IdSpace("job", t.jobs.c.job_id, shorten=False)
MIGRATION: Final = IdSpace(
    "domain migration", t.domain_migrations.c.migration_id, "scheduler-domain-migration-"
)


def successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with ``prefix`` (``None``: none is,
    for a prefix of U+10FFFF only). Surrogates are skipped: they never occur in stored text."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= 0x10FFFF:
            return "".join(chars) + chr(code)
    return None


def prefix_query(space: IdSpace, prefix: str, limit: int) -> Select[Any]:
    """The ids starting with ``prefix``, in order, at most ``limit``: a primary-key range scan."""
    column = space.column
    query = select(column).where(column >= prefix).order_by(column).limit(limit)
    upper = successor(prefix)
    return query if upper is None else query.where(column < upper)


def candidates(connection: Connection, space: IdSpace, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` ids starting with ``prefix``, in order (:func:`prefix_query`)."""
    return [str(value) for value in connection.execute(prefix_query(space, prefix, limit)).scalars()]


def resolve(connection: Connection, space: IdSpace, value: str) -> str:
    """The id ``value`` names: itself when it is a whole id, else the one id it is a prefix of
    (``CLI_AMBIGUOUS_ID``, exit 2, when several are), else ``value`` unchanged (unknown)."""
    if len(value) < MIN_PREFIX:
        return value
    found = candidates(connection, space, value, CANDIDATES_SHOWN + 1)
    if not found or found[0] == value:  # unknown, or a whole id (it sorts first in its range)
        return value
    if len(found) == 1:
        return found[0]
    shown = found[:CANDIDATES_SHOWN]
    more = " and more" if len(found) > CANDIDATES_SHOWN else ""
    raise CliFailure(
        f"{space.noun} id prefix {value!r} is ambiguous: {', '.join(shown)}{more} start with it; "
        "give more characters",
        exit_code=EXIT_USAGE,
        code="CLI_AMBIGUOUS_ID",
        details={"prefix": value, "candidates": shown, "more": bool(more)},
    )


def resolve_optional(connection: Connection, space: IdSpace, value: str | None) -> str | None:
    """:func:`resolve` of an optional filter value (``None`` stays ``None``)."""
    return None if value is None else resolve(connection, space, value)


def _common_length(left: str, right: str | None) -> int:
    if right is None:
        return 0
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


@functools.lru_cache(maxsize=8)
def neighbour_query(space: IdSpace, backend: str) -> Select[Any]:
    """``(id, nearest id below, nearest id above)`` for each id of the bound list ``:ids``, in ONE
    statement: a correlated index seek each way per id, over the backend's table of the bound
    values (``Backend.text_values``: ``unnest`` of a text array on PostgreSQL, ``json_each`` of a
    JSON array on SQLite). Built once per process."""
    column = space.column
    wanted = backend_named(backend).text_values("ids")
    below = select(column).where(column < wanted).order_by(column.desc()).limit(1).scalar_subquery()
    above = select(column).where(column > wanted).order_by(column).limit(1).scalar_subquery()
    return select(wanted, below, above)


def _neighbours(
    connection: Connection, space: IdSpace, ids: list[str]
) -> dict[str, tuple[str | None, str | None]]:
    """For each id, the nearest id below and above it in the table."""
    backend = backend_for(connection)
    bound = backend.text_values_parameter(ids)
    rows = connection.execute(neighbour_query(space, backend.name), {"ids": bound})
    return {str(row[0]): (row[1], row[2]) for row in rows}


def shortener(connection: Connection, space: IdSpace, ids: Iterable[str | None]) -> Short:
    """What a table shows for each of ``ids``: the shortest prefix that no other id of the table
    starts with, at least :data:`SHORT_DIGITS` past the namespace (whole ids for job ids)."""
    wanted = sorted({value for value in ids if value})
    if not space.shorten or not wanted:
        return whole
    floor = len(space.namespace) + SHORT_DIGITS
    shown: dict[str, str] = {}
    for value, (below, above) in _neighbours(connection, space, wanted).items():
        needed = max(_common_length(value, below), _common_length(value, above)) + 1
        shown[value] = value[: max(floor, needed)]

    def short(value: str | None) -> str:
        return "-" if value is None else shown.get(value, value)

    return short


def whole(value: str | None) -> str:
    """The identity :data:`Short` (``-`` for ``None``)."""
    return "-" if value is None else value


@dataclass(frozen=True)
class Resolved:
    """An id argument after :func:`resolve_before_write`: the whole id and its short form."""

    id: str
    short: str


def resolve_before_write(db: str | None, space: IdSpace, value: str) -> Resolved:
    """Resolve an id argument of a write command in a read-only snapshot of its own, before the
    command opens the store to write (the id of a row never changes, so it stays right)."""
    with _lookup_connection(db, space) as connection:
        if connection is None:  # no such table yet: nothing to resolve
            return Resolved(value, value)
        full = resolve(connection, space, value)
        return Resolved(full, shortener(connection, space, [full])(full))


@contextmanager
def _lookup_connection(db: str | None, space: IdSpace) -> Iterator[Connection | None]:
    target, schema = resolve_target(db), resolve_schema()
    table = space.column.table.name
    if pg_target.has_own_schema(target):
        with pg_target.readonly_connection(target, schema) as (_, connection, where):
            yield connection if table in list_user_tables(connection, where) else None
        return
    sqlite_schema(schema)
    with readonly_connection(target) as (path, connection):
        refuse_stray_file(path)
        yield connection if table in list_user_tables(connection) else None
