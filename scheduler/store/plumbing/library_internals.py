"""The one place the store reads SQLAlchemy's and psycopg's private attributes (their internals).

The compile-once fast path (:mod:`~scheduler.store.plumbing.statement_plans`,
:mod:`~scheduler.store.plumbing.fastpath`) reproduces SQLAlchemy's execution of the hot
statements, and on PostgreSQL names them on the server instead of psycopg
(:mod:`scheduler.backends.postgresql.server_statements`); both need facts no public API gives:
what a compiled statement's binds and result columns convert, whether anything observes a
connection, SQLAlchemy's wrapping of a driver error, psycopg's prepared-statement cache. Each fact
is one function here, whose docstring says what it reads and why.

It fails closed. Every function raises :class:`InternalsUnavailable` when

* the installed library's minor version is not one of :data:`TESTED_ON` (the versions CI runs
  ``tests/test_library_internals.py`` on: each internal is there checked to mean what the store
  assumes),
* the public path is forced (:data:`PUBLIC_PATH_ENV` set to ``1``, or :func:`force_public_path`),
* SQLAlchemy's compiler internals do not pass a self-check made once per process on a small
  statement of its own (:func:`sqlalchemy_available`), or
* an attribute is missing or not of the shape assumed.

The callers then take the public path: SQLAlchemy executes the statement itself (no fast path,
or no plan for that statement), psycopg keeps its own statement cache (no named statements), and
a statement whose row locks cannot be read counts as one that locks rows. Results are identical
either way; only the per-statement cost differs. asyncpg and aiosqlite are only driven through
SQLAlchemy's public API.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

import sqlalchemy
from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

TESTED_ON: Final[Mapping[str, tuple[str, ...]]] = {
    # pyproject.toml: SQLAlchemy>=2.0.0,<2.2 (>=2.0.28 with the ``postgres`` extra); CI runs
    # 2.0.0 (SQLite), 2.0.28 (PostgreSQL) and the newest 2.1.x.
    "sqlalchemy": ("2.0", "2.1"),
    # pyproject.toml: psycopg[binary]>=3.2.1; CI runs 3.2.1 and the newest 3.3.x.
    "psycopg": ("3.2", "3.3"),
}
"""The minor versions whose internals were checked (``tests/test_library_internals.py``)."""

PUBLIC_PATH_ENV: Final = "SCHEDULER_PUBLIC_PATH"
"""Set to ``1``: never read an internal (every store takes SQLAlchemy's and psycopg's public path)."""

CONNECTION_INTERNALS: Final = ("_has_events", "_echo", "_handle_dbapi_exception")
"""What :func:`connection_supported` requires of a SQLAlchemy ``Connection``."""
PREPARED_CACHE_PARTS: Final = ("_names", "_counts", "_to_flush")
"""What :func:`psycopg_prepared_count` requires of psycopg's ``PrepareManager``."""


class InternalsUnavailable(Exception):
    """The internal cannot be relied on here: take the public path."""


_forced = os.environ.get(PUBLIC_PATH_ENV, "") == "1"
_self_check: bool | None = None
_self_check_lock = threading.Lock()


def force_public_path(forced: bool = True) -> None:
    """Take (``True``) or stop taking the public path, whatever the environment says."""
    global _forced
    _forced = forced


def public_path_forced() -> bool:
    """Whether the public path is forced (:data:`PUBLIC_PATH_ENV` or :func:`force_public_path`)."""
    return _forced


def minor_version(version: str) -> str:
    """``"2.0"`` of ``"2.0.28"`` (or of ``"2.0.0b4"``)."""
    return ".".join(version.split(".")[:2])


def tested(library: str, version: str) -> bool:
    """Whether ``version`` of ``library`` is of a minor version listed in :data:`TESTED_ON`."""
    return minor_version(version) in TESTED_ON.get(library, ())


def sqlalchemy_available() -> bool:
    """Whether SQLAlchemy's internals may be read: a tested minor version, not forced off, and
    the once-per-process self-check passed."""
    if _forced or not tested("sqlalchemy", sqlalchemy.__version__):
        return False
    global _self_check
    if _self_check is None:
        with _self_check_lock:
            if _self_check is None:
                _self_check = _compiler_means_what_is_assumed()
    return _self_check


def psycopg_available() -> bool:
    """Whether psycopg's internals may be read: it is imported, of a tested minor version, and the
    public path is not forced."""
    psycopg = sys.modules.get("psycopg")
    version = getattr(psycopg, "__version__", None)
    return not _forced and isinstance(version, str) and tested("psycopg", version)


def _require_sqlalchemy() -> None:
    if not sqlalchemy_available():
        raise InternalsUnavailable("SQLAlchemy internals")


# -- SQLAlchemy: connections ---------------------------------------------------------------------


def connection_supported(conn: Connection) -> None:
    """Raise unless ``conn`` has the internals :func:`observed` and :func:`raise_dbapi_error` read
    (``Connection._has_events``, ``_echo``, ``_handle_dbapi_exception``; ``Engine._has_events``;
    ``Dialect._has_events``): the fast path is made for a connection only then."""
    _require_sqlalchemy()
    if not all(hasattr(conn, name) for name in CONNECTION_INTERNALS) or not (
        hasattr(conn.engine, "_has_events") and hasattr(conn.dialect, "_has_events")
    ):
        raise InternalsUnavailable("SQLAlchemy connection internals")


def observed(conn: Connection, dialect: Dialect) -> bool:
    """Whether anything observes statements on ``conn``: an event listener on the connection, its
    engine or ``dialect`` (``_has_events``, which SQLAlchemy checks before dispatching each event),
    or echo (``Connection._echo``, set from the engine's logger when the connection was made).

    The fast path runs statements on the driver's cursor, where no event is dispatched and nothing
    is logged: it steps aside for every such connection (no public API says whether any listener
    is registered without naming each event).
    """
    _require_sqlalchemy()
    try:
        return bool(conn._has_events or conn.engine._has_events or dialect._has_events or conn._echo)
    except AttributeError as error:
        raise InternalsUnavailable(str(error)) from error


def raise_dbapi_error(conn: Connection, error: BaseException, sql: str | None, arguments: Any) -> NoReturn:
    """SQLAlchemy's own handling of a driver error (``Connection._handle_dbapi_exception``: the
    ``handle_error`` event, wrapping as ``DBAPIError``, invalidation of a lost connection); raises.

    A statement the fast path sent fails as if ``Connection.execute`` had sent it. Not gated: it
    runs only for a statement the fast path sent, which :func:`connection_supported` allowed on
    this connection; were the method gone, the driver's own error is raised as it is.
    """
    handle = getattr(conn, "_handle_dbapi_exception", None)
    if handle is None:
        raise error
    handle(error, sql, arguments, None, None)
    raise error  # the handler always raises; this keeps the NoReturn contract if it did not


# -- SQLAlchemy: compiled statements -------------------------------------------------------------


def bind_processors(compiled: SQLCompiler) -> Mapping[str, Any]:
    """``SQLCompiler._bind_processors``: per bind name, the function (or, for a tuple bind, the
    functions per element) SQLAlchemy applies to a value before the driver gets it; binds with no
    conversion are absent or ``None``.

    A plan hands values to the driver as given, so a statement with any processing bind is left to
    SQLAlchemy (``statement_plans._unsupported``).
    """
    _require_sqlalchemy()
    try:
        processors = compiled._bind_processors
    except AttributeError as error:
        raise InternalsUnavailable(str(error)) from error
    if not isinstance(processors, Mapping):
        raise InternalsUnavailable("SQLCompiler._bind_processors is not a mapping")
    return processors


def result_columns(compiled: SQLCompiler) -> list[tuple[str, TypeEngine[Any]]]:
    """``SQLCompiler._result_columns``: the key and type of each column of the statement's rows,
    in the order the driver returns them (what ``Result.keys()`` gives).

    A plan builds its row class from these keys, and leaves to SQLAlchemy a statement with a type
    that converts result values (:func:`result_processor`).
    """
    _require_sqlalchemy()
    try:
        entries = compiled._result_columns
    except AttributeError as error:
        raise InternalsUnavailable(str(error)) from error
    columns: list[tuple[str, TypeEngine[Any]]] = []
    for entry in entries or ():
        if not (
            isinstance(entry, Sequence)
            and len(entry) >= 2
            and isinstance(entry[0], str)
            and isinstance(entry[-1], TypeEngine)
        ):
            raise InternalsUnavailable("SQLCompiler._result_columns entries are not (key, …, type)")
        columns.append((entry[0], entry[-1]))
    return columns


def result_processor(column_type: TypeEngine[Any], dialect: Dialect) -> Any:
    """``TypeEngine._cached_result_processor(dialect, None)``: the function SQLAlchemy applies to
    a column's values as the driver returns them on ``dialect`` (``None``: none), memoized as
    SQLAlchemy's own result set-up memoizes it."""
    _require_sqlalchemy()
    try:
        return column_type._cached_result_processor(dialect, None)
    except AttributeError as error:
        raise InternalsUnavailable(str(error)) from error


def inserts_many_values(compiled: SQLCompiler) -> bool:
    """``SQLCompiler._insertmanyvalues`` is set: SQLAlchemy would batch an ``executemany`` of this
    INSERT into multi-row ``VALUES`` statements of its own, which a plan does not reproduce."""
    _require_sqlalchemy()
    try:
        return bool(compiled._insertmanyvalues)
    except AttributeError as error:
        raise InternalsUnavailable(str(error)) from error


def collects_params(compiled: SQLCompiler) -> bool:
    """``SQLCompiler._collected_params`` (SQLAlchemy 2.1; absent before) is non-empty: values the
    statement carries (``.params()``) that SQLAlchemy merges into each execution's parameters."""
    _require_sqlalchemy()
    return bool(getattr(compiled, "_collected_params", None))


def locks_rows(statement: Any) -> bool:
    """Whether ``statement`` is a ``SELECT … FOR UPDATE``/``FOR SHARE`` (``_for_update_arg``, set
    by ``with_for_update``; a statement without the attribute does not lock).

    ``Prepared.locks``: running it changes what a rollback to an earlier savepoint undoes. (The
    caller counts a statement as locking when this is unavailable: a savepoint is then taken again
    where one could have been kept.)
    """
    _require_sqlalchemy()
    return getattr(statement, "_for_update_arg", None) is not None


def _compiler_means_what_is_assumed() -> bool:
    """The compiler internals read above, on a small statement whose answers are known: a
    converting bind has a processor and a plain one none, result columns come as (key, …, type)
    in select order, ``with_for_update`` sets the lock, a SELECT does not insert many values."""
    from sqlalchemy import Integer, String, TypeDecorator, bindparam, column, select, table
    from sqlalchemy.dialects import sqlite

    class Shout(TypeDecorator[str]):
        impl = String
        cache_ok = True

        def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
            return value.upper()

    rows = table("t", column("a", Integer()), column("b", String()))
    statement = select(rows.c.b, rows.c.a).where(
        rows.c.a == bindparam("plain", type_=Integer()), rows.c.b == bindparam("shout", type_=Shout())
    )
    try:
        compiled: Any = statement.compile(dialect=sqlite.dialect())
        processors = compiled._bind_processors
        shout = processors.get("shout")
        entries = compiled._result_columns
        return bool(
            processors.get("plain") is None
            and shout is not None
            and shout("x") == "X"
            and [(entry[0], type(entry[-1])) for entry in entries] == [("b", String), ("a", Integer)]
            and getattr(statement, "_for_update_arg", False) is None
            and statement.with_for_update()._for_update_arg is not None
            and not compiled._insertmanyvalues
        )
    except Exception:  # any difference at all: the internals are not what this module reads
        return False


# -- psycopg: the prepared-statement cache -------------------------------------------------------


def _prepare_manager(driver: Any) -> Any:
    if not psycopg_available():
        raise InternalsUnavailable("psycopg internals")
    manager = getattr(driver, "_prepared", None)
    if manager is None or not all(
        callable(getattr(getattr(manager, part, None), "clear", None)) for part in PREPARED_CACHE_PARTS
    ):
        raise InternalsUnavailable("psycopg's PrepareManager")
    return manager


def psycopg_prepared_count(driver: Any) -> int:
    """How many statements psycopg prepared on ``driver`` (a psycopg ``Connection``) and would
    ``DEALLOCATE ALL`` at its next ``rollback()``: ``Connection._prepared`` (its ``PrepareManager``),
    ``_names``, which also needs ``_counts`` and ``_to_flush`` for
    :func:`forget_psycopg_prepared`.

    The store names its hot statements on the server itself (``server_statements``); it first
    empties psycopg's cache and turns it off, and deallocates what was prepared before.
    """
    return len(_prepare_manager(driver)._names)


def forget_psycopg_prepared(driver: Any) -> None:
    """Empty psycopg's prepared-statement cache on ``driver`` without telling the server: the
    prepared names (``_names``), the execution counts toward preparing (``_counts``) and the
    deallocations it still meant to send (``_to_flush``).

    With the cache empty (and ``prepare_threshold`` ``None``), no later ``rollback()`` or
    ``ROLLBACK`` makes psycopg send ``DEALLOCATE ALL``, which would drop the store's named
    statements too; the caller deallocates the forgotten statements itself.
    """
    manager = _prepare_manager(driver)
    for part in PREPARED_CACHE_PARTS:
        getattr(manager, part).clear()


def raise_psycopg_parse_cache_limit(length: int) -> None:
    """Raise ``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`` (a module global, 4,096 by default)
    to ``length`` if it is lower: the longest query text whose ``%(name)s`` -> ``$n`` conversion
    psycopg keeps in its LRU cache instead of redoing on every execution.

    The claim statement is ~10 KB (``scheduler.backends.postgresql.backend.CACHED_STATEMENT_LENGTH``).
    """
    try:
        from psycopg import _queries
    except ImportError as error:  # psycopg not installed, or a release that moved the module
        raise InternalsUnavailable(str(error)) from error
    if not psycopg_available():
        raise InternalsUnavailable("psycopg internals")
    current = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", None)
    if not isinstance(current, int):
        raise InternalsUnavailable("psycopg._queries.MAX_CACHED_STATEMENT_LENGTH")
    if current < length:
        _queries.MAX_CACHED_STATEMENT_LENGTH = length
