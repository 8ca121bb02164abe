"""Everything PostgreSQL-specific in the store (psycopg 3; asyncpg under ``scheduler.aio``).

(The schema layer keeps its own PostgreSQL specifics: ``pg_ddl``, ``pg_catalog``.)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Final

from sqlalchemy import BigInteger, Connection, String, column, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from scheduler.backends.postgresql.server_statements import STATEMENT_GONE
from scheduler.schema.checks import glob_to_regex
from scheduler.schema.ddl import SCHEDULER_APPLICATION_ID
from scheduler.schema.target import SchemaTarget
from scheduler.store.plumbing import library_internals
from scheduler.store.plumbing.constructs import (
    correlated_exists,
    expiry_order,
    glob_match,
    greatest,
    json_text_field,
    micros_since,
    render_order,
    row_check,
    row_version,
    server_clock_ms,
    server_instant,
)
from scheduler.store.plumbing.failures import CONNECTION_LOST, IN_FAILED_TRANSACTION, lost_connection
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.library_internals import InternalsUnavailable
from scheduler.store.plumbing.statement_plans import Prepared

NAME: Final = "postgresql"


CACHED_STATEMENT_LENGTH: Final = 32_768
"""Longest statement text (characters) psycopg keeps its parsed form of (its default is 4,096).

psycopg turns each query's ``%(name)s`` placeholders into ``$n`` on every execution and caches
the result (an LRU of 128 queries) only for texts up to its ``MAX_CACHED_STATEMENT_LENGTH``. The
claim statement is ~10 KB (more with a long schema name), so without a larger limit it is
parsed again on every claim: ~100–200 µs of client CPU per claim on the development machine,
against ~6 µs from the cache. The largest scheduler statement stays well under this limit."""


def cache_long_statements() -> None:
    """Raise psycopg's parsed-query cache limit to :data:`CACHED_STATEMENT_LENGTH` (idempotent).

    The limit is a module global of psycopg (process-wide, never lowered here); the cache stays
    bounded by its 128 entries. A psycopg release without that global, or of a version not tested
    (:mod:`~scheduler.store.plumbing.library_internals`), is left as it is (the statements then run
    as before, only parsed on each execution).
    """
    with suppress(InternalsUnavailable):
        library_internals.raise_psycopg_parse_cache_limit(CACHED_STATEMENT_LENGTH)


def _literal(compiler: SQLCompiler, value: str) -> str:
    return compiler.render_literal_value(value, String())


@compiles(json_text_field, "postgresql")
def _json_text_field(element: json_text_field, compiler: SQLCompiler, **kw: Any) -> str:
    """``(column::json ->> 'key') COLLATE "C"``: the member as text, ordered by code point like
    every scheduler text column (``json``, not ``jsonb``, reads the stored text as SQLite does)."""
    column = compiler.process(element.column, **kw)
    return f'(CAST({column} AS JSON) ->> {_literal(compiler, element.member)}) COLLATE "C"'


@compiles(glob_match, "postgresql")
def _glob_match(element: glob_match, compiler: SQLCompiler, **kw: Any) -> str:
    """The anchored regular expression equivalent to the GLOB pattern."""
    expression = compiler.process(element.operand, **kw)
    return f"({expression}) ~ {_literal(compiler, glob_to_regex(element.pattern))}"


@compiles(correlated_exists, "postgresql")
def _correlated_exists(element: correlated_exists, compiler: SQLCompiler, **kw: Any) -> str:
    """``EXISTS (… OFFSET 0)``: a subquery with an OFFSET is never pulled up into a semi-join, so
    the planner keeps walking the claim index in order and tests each row (cost independent of
    the queue's depth), instead of reading and sorting every due row of a selective filter."""
    rendered = str(compiler.visit_unary(element, **kw))  # type: ignore[no-untyped-call]
    if not rendered.endswith(")"):
        raise ValueError(f"unexpected EXISTS rendering: {rendered!r}")
    return rendered[:-1] + " OFFSET 0)"


@compiles(greatest, "postgresql")
def _greatest(element: greatest, compiler: SQLCompiler, **kw: Any) -> str:
    return f"GREATEST({compiler.process(element.clauses, **kw)})"


# The server's clock in epoch milliseconds: clock_timestamp() is the real time of the call (now()
# would be the transaction's start, possibly before a lock wait).
_SERVER_CLOCK_MS: Final = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


@compiles(server_clock_ms, "postgresql")
def _server_clock_ms(element: server_clock_ms, compiler: SQLCompiler, **_kw: Any) -> str:
    return _SERVER_CLOCK_MS


@compiles(expiry_order, "postgresql")
def _expiry_order(element: expiry_order, compiler: SQLCompiler, **kw: Any) -> str:
    """Lease expiry first: ``scheduler_pg_occurrences_expired``'s order, which only that index
    yields without a sort. The seed orders running rows by ``lease_expires_at, scheduled_for,
    occurrence_id``; the probe's rows are merged in that order (``claim_plan.sort_key``), so only
    which rows a probe of more than its limit reads differs, among leases of one millisecond."""
    return render_order(compiler, element.table, ("lease_expires_at", "occurrence_id"), **kw)


@compiles(row_check, "postgresql")
def _row_check(element: row_check, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({compiler.process(element.condition, **kw)}) IS TRUE"


@compiles(row_version, "postgresql")
def _row_version(element: row_version, compiler: SQLCompiler, **_kw: Any) -> str:
    return f"{compiler.preparer.quote(element.table.name)}.xmin::text"


@compiles(server_instant, "postgresql")
def _server_instant(element: server_instant, compiler: SQLCompiler, **_kw: Any) -> str:
    return "clock_timestamp()"


@compiles(micros_since, "postgresql")
def _micros_since(element: micros_since, compiler: SQLCompiler, **kw: Any) -> str:
    since = compiler.process(element.clauses, **kw)
    return f"floor(extract(epoch FROM clock_timestamp() - {since}) * 1000000)::bigint"


# ----------------------------------------------------------------- transactions

SERVER_NOW_SQL: Final = f"SELECT {_SERVER_CLOCK_MS}"
READ_SNAPSHOT_SQL: Final = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
BEGIN_READ_SQL: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
BEGIN_WRITE_SQL: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""The ``BEGIN`` sent with a store-owned transaction's first statement (``FastPath.defer_begin``)."""
ISOLATION_LEVEL: Final = "READ COMMITTED"
"""Every write transaction runs READ COMMITTED and locks the rows that decide its result."""


# libpq's PQtransactionStatus values (psycopg.pq.TransactionStatus; psycopg is an optional extra,
# so this module does not import it).
_IDLE: Final = 0
_UNKNOWN: Final = 4


_IN_TRANSACTION: Final = 2


def _transaction_status(conn: Connection) -> int | None:
    """libpq's transaction status of the driver connection (psycopg, sync or async); asyncpg's
    connection (under SQLAlchemy's adapter) tells only idle, in a transaction, or closed."""
    dbapi: Any = conn.connection.dbapi_connection
    try:
        return int(dbapi.info.transaction_status)
    except Exception:
        pass
    try:
        driver: Any = dbapi.driver_connection
        if driver.is_closed():
            return _UNKNOWN
        return _IN_TRANSACTION if driver.is_in_transaction() else _IDLE
    except Exception:
        return None


def driver_in_transaction(conn: Connection) -> bool | None:
    """Whether psycopg's connection is inside a transaction block. A closed or broken
    connection is not: the server rolls back whatever it had not committed."""
    status = _transaction_status(conn)
    if status is None:
        return None
    if getattr(conn.connection.dbapi_connection, "closed", False) or status == _UNKNOWN:
        return False
    return status != _IDLE


def begin(conn: Connection, *, write: bool, fast: FastPath | None, one_statement: bool = False) -> None:
    """The start of a transaction the store owns (psycopg sends ``BEGIN`` with the first statement).

    Writes run READ COMMITTED (the connection's level) with row locks; a read is one
    ``REPEATABLE READ, READ ONLY`` snapshot, like SQLite's deferred ``BEGIN``. The lock timeout is
    a setting of the store's own connection (:func:`lock_timeout_sql`).

    A read of ``one_statement`` needs no transaction (one statement reads one snapshot): with
    named statements it runs alone in autocommit, no ``BEGIN`` or ``COMMIT`` round trip; else
    without the ``SET TRANSACTION`` statement.
    """
    begin = None if one_statement and not write else BEGIN_WRITE_SQL if write else BEGIN_READ_SQL
    if fast is not None and fast.defer_begin(conn, begin):
        return
    if not write and not one_statement:
        conn.exec_driver_sql(READ_SNAPSHOT_SQL)


def ensure_transaction(conn: Connection) -> None:
    """psycopg (not in autocommit) opens a transaction block before a SAVEPOINT by itself."""


SERVER_NOW: Final = Prepared(text(SERVER_NOW_SQL).columns(column("now", BigInteger)))


def server_now(conn: Connection, fast: FastPath | None = None) -> int:
    """``clock_timestamp()`` in epoch milliseconds (through the fast path when it is usable)."""
    done = None if fast is None else fast.run(conn, SERVER_NOW, None)
    if done is not None:
        return int(done[0][0][0])
    return int(conn.exec_driver_sql(SERVER_NOW_SQL).scalar_one())


_KEY_LOCKS_SQL: Final = text(
    "SELECT pg_advisory_xact_lock(:space, hashtext(k)) "
    "FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS keys(k, n) ORDER BY n"
)
"""(Core ``text``: each driver gets its own parameter style, psycopg's ``%(name)s`` or asyncpg's
``$n``.)"""


def key_space(schema: str, scope: str) -> int:
    """The int4 first half of an advisory lock key: one space per schema and scope."""
    return zlib.crc32(f"{schema}\x00{scope}".encode()) - 2**31


def key_locks(target: SchemaTarget) -> Callable[[Connection, str, list[str]], None]:
    """``pg_advisory_xact_lock(space, hashtext(key))`` for each key, in the given (sorted) order,
    so two transactions locking overlapping keys cannot deadlock on them. A hash collision only
    makes unrelated keys wait for each other."""
    schema = target.schema

    def lock(conn: Connection, scope: str, keys: list[str]) -> None:
        if keys:
            conn.execute(_KEY_LOCKS_SQL, {"space": key_space(schema, scope), "keys": keys}).all()

    return lock


def lock_timeout_sql(timeout_ms: int) -> str:
    """``SET lock_timeout`` for ``busy_timeout_ms`` (0 means "do not wait": 1 ms, since
    PostgreSQL's 0 would mean "wait forever")."""
    return f"SET lock_timeout = '{max(1, int(timeout_ms))}ms'"


RESET_LOCK_TIMEOUT_SQL: Final = "RESET lock_timeout"


def schema_header(conn: Connection, target: SchemaTarget) -> tuple[int, int | None]:
    """A PostgreSQL schema has no header: the application id is the scheduler's own (the schema
    holds nothing else) and the version is the ``migrations`` history."""
    return SCHEDULER_APPLICATION_ID, None


# ----------------------------------------------------------------- failure classification

CONTENTION_SQLSTATES: Final = frozenset({"40001", "40P01", "55P03", "57014", "57P01"})
"""Serialization failure, deadlock, lock timeout, statement timeout / cancel, terminated backend:
nothing of the transaction survives them, so the store's own call may be retried."""
LOST_CONNECTION_CLASS: Final = "08"
"""Connection exceptions (SQLSTATE class 08): retryable like a connection lost without one."""
FAILURE_SQLSTATES: Final = frozenset(
    {"25006", "53100", "53200", "53300", "57P02", "57P03", "58000", "58030", "XX000", "XX001", "XX002"}
)
"""The server cannot store (read-only, disk full, out of memory or connections, shutting down,
I/O error, corruption): reported as storage unavailable, not retryable."""


CONNECT_SQLSTATE_CLASSES: Final = ("28", "3D")
"""Refused at connect (asyncpg reports the server's SQLSTATE, psycopg none): invalid
authorization, a database that does not exist. Not retryable."""
UNDEFINED_TABLE: Final = "42P01"
"""A statement named a table that does not exist (``undefined_table``)."""

_DRIVER_MODULES: Final = frozenset({"psycopg", "asyncpg"})


def _is_driver_error(error: BaseException) -> bool:
    """An error of psycopg (sync or async) or asyncpg; SQLAlchemy's asyncpg adapter raises its own
    classes chained to asyncpg's, which carry the SQLSTATE."""
    return type(error).__module__.split(".")[0] in _DRIVER_MODULES


def storage_condition(errors: list[BaseException]) -> tuple[str, bool] | None:
    """(``storageCode``, whether the cause is contention or a lost connection) for the first
    PostgreSQL failure in a cause chain, or ``None``.

    psycopg and asyncpg errors carry the server's SQLSTATE; an ``OperationalError`` (or a closed-connection
    ``InterfaceError``) without one is a lost connection, as is an error SQLAlchemy reports as
    having invalidated the connection, or a network ``OSError`` (asyncpg's connect raises them bare).
    Not retryable: the failure SQLSTATEs, 25P02 (the caller's aborted transaction), 26000 (a
    prepared statement the session no longer has, on any connection and driver: e.g. one the
    store named on its own connection that someone deallocated, met inside a ``transaction()``
    block; a store-owned call runs again instead, and the store names its statements anew) and
    the refusals at connect (classes 28 and 3D).
    """
    for error in errors:
        if getattr(error, "connection_invalidated", False) is True:
            return _lost(errors)
        if not _is_driver_error(error):
            continue
        sqlstate = getattr(error, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate:
            if sqlstate in CONTENTION_SQLSTATES or sqlstate.startswith(LOST_CONNECTION_CLASS):
                return sqlstate, True
            if (
                sqlstate in FAILURE_SQLSTATES
                or sqlstate in (IN_FAILED_TRANSACTION, STATEMENT_GONE)
                or sqlstate.startswith(CONNECT_SQLSTATE_CLASSES)
            ):
                return sqlstate, False
            continue
        if type(error).__name__ in ("OperationalError", "InterfaceError"):
            return CONNECTION_LOST, True
    return lost_connection(errors)  # no server code: a network error, as on any backend


ROLLED_BACK_SQLSTATES: Final = frozenset({"40001", "40P01", "55P03", "57014"})
"""Errors the server answers a statement or a ``COMMIT`` with, aborting the transaction: a
``COMMIT`` that fails with one (a lock timeout taking the notification queue's lock, a deferred
trigger's error, a serialization failure) committed nothing. Not the terminations (57P01 …, class
08): they end the session, and a commit they interrupt may have been written."""


def rolled_back(errors: list[BaseException]) -> bool:
    """Whether a driver error of the cause chain is one of :data:`ROLLED_BACK_SQLSTATES` or an
    integrity violation (class 23, a deferred constraint's at ``COMMIT``)."""
    for error in errors:
        if getattr(error, "connection_invalidated", False) is True:
            return False
        sqlstate = getattr(error, "sqlstate", None) if _is_driver_error(error) else None
        if isinstance(sqlstate, str) and sqlstate:
            return sqlstate in ROLLED_BACK_SQLSTATES or sqlstate.startswith("23")
    return False


def missing_table(errors: list[BaseException]) -> bool:
    """Whether a statement of the cause chain named a table that does not exist (42P01)."""
    return has_sqlstate(errors, UNDEFINED_TABLE)


def has_sqlstate(errors: list[BaseException], sqlstate: str) -> bool:
    """Whether a psycopg or asyncpg error of the cause chain carries ``sqlstate``."""
    return any(_is_driver_error(error) and getattr(error, "sqlstate", None) == sqlstate for error in errors)


def _lost(errors: list[BaseException]) -> tuple[str, bool]:
    """A connection SQLAlchemy invalidated: the server's SQLSTATE if it sent one (57P01 …)."""
    for error in errors:
        sqlstate = getattr(error, "sqlstate", None) if _is_driver_error(error) else None
        if isinstance(sqlstate, str) and sqlstate:
            return sqlstate, True
    return CONNECTION_LOST, True
