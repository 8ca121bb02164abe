"""An application's SQLite engine for the outbox: deferred readers, ``BEGIN IMMEDIATE`` writers.

pysqlite's default transaction handling begins a *deferred* transaction at the first write, or
none at all before DDL. A request that reads, then enqueues, must upgrade its read lock to a
write lock; in WAL mode SQLite refuses that at once (``SQLITE_BUSY``, no ``busy_timeout`` wait)
whenever another connection committed in between. Under load most such requests fail.

:func:`sqlite_engine` gives an Engine whose transactions begin lazily, just before their first
statement: ``BEGIN IMMEDIATE`` (the write lock, waiting up to ``busy_timeout_ms``) for a
transaction marked as a writer, a plain deferred ``BEGIN`` otherwise (readers never serialize).
Mark a writer with :func:`mark_writer` (a ``Connection`` or an ORM ``Session``, before its first
statement), or use an engine whose every transaction writes:
``engine.execution_options(scheduler_writer=True)``. The store's own calls through
``SchedulerStore.on_connection`` on such a connection begin ``IMMEDIATE`` themselves when they are
the transaction's first statement.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session

from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS, MAX_BUSY_TIMEOUT_MS
from scheduler.contract.errors import invalid_argument
from scheduler.schema.target import quote_identifier

WRITER_OPTION: Final = "scheduler_writer"
"""Execution option (engine, connection or ORM ``bind``): every transaction begins IMMEDIATE."""
_PENDING: Final = "scheduler.begin_pending"
_WRITER: Final = "scheduler.writer"
_BEGUN: Final = "scheduler.begun"
_JOURNAL_MODES: Final = frozenset({"wal", "delete", "truncate", "persist", "memory", "off"})


def _driver(connection: Connection) -> Any:
    return connection.connection.dbapi_connection


def _emit_begin(connection: Connection) -> None:
    """BEGIN (IMMEDIATE for a writer) if the connection's transaction has none open in the driver.

    The flag stays set for the whole SQLAlchemy transaction: if a driver transaction ends
    inside it (a store read's own snapshot), the next statement begins a new one.
    """
    info = connection.info
    driver = _driver(connection)
    if not info.get(_PENDING) or driver is None or driver.in_transaction:
        return
    if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return
    writer = bool(info.get(_WRITER)) or bool(connection.get_execution_options().get(WRITER_OPTION))
    driver.execute("BEGIN IMMEDIATE" if writer else "BEGIN").close()
    info[_BEGUN] = "immediate" if writer else "deferred"


def _on_begin(connection: Connection) -> None:
    connection.info[_PENDING] = True
    connection.info.pop(_BEGUN, None)


def _before_execute(
    connection: Connection, _cursor: Any, statement: str, _parameters: Any, _context: Any, _many: bool
) -> None:
    if not connection.info.get(_PENDING):
        return
    if statement.lstrip()[:5].upper() == "BEGIN":
        connection.info[_BEGUN] = "explicit"  # the caller (e.g. the store) begins itself
        return
    _emit_begin(connection)


def _on_end(connection: Connection) -> None:
    for key in (_PENDING, _WRITER, _BEGUN):
        connection.info.pop(key, None)


def _validate(path: Any, busy_timeout_ms: Any, journal_mode: Any, attach: Any) -> dict[str, str]:
    if not isinstance(path, (str, os.PathLike)) or not str(path) or str(path) == ":memory:":
        raise invalid_argument("path must be an SQLite database file path")
    if (
        isinstance(busy_timeout_ms, bool)
        or not isinstance(busy_timeout_ms, int)
        or not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS
    ):
        raise invalid_argument(f"busy_timeout_ms must be an integer between 0 and {MAX_BUSY_TIMEOUT_MS}")
    if journal_mode is not None and str(journal_mode).lower() not in _JOURNAL_MODES:
        raise invalid_argument(f"journal_mode must be one of {sorted(_JOURNAL_MODES)} or None")
    if attach is not None and not isinstance(attach, Mapping):
        raise invalid_argument("attach must be a mapping of schema name to database path")
    attached = {str(name): os.fspath(target) for name, target in (attach or {}).items()}
    for name in attached:
        if not name or name.lower() in ("main", "temp"):
            raise invalid_argument(f"cannot attach a database as {name!r}")
    return attached


def sqlite_engine(
    path: str | os.PathLike[str],
    *,
    attach: Mapping[str, str | os.PathLike[str]] | None = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    journal_mode: str | None = "wal",
    **engine_options: Any,
) -> Engine:
    """An SQLite Engine for an application that enqueues inside its own transactions.

    ``path``: the application's database file. ``attach``: ``{schema name: file}`` attached on
    every connection (the attached-database layout: pass the name to ``open_store``/
    ``on_connection`` as ``schema=``). ``busy_timeout_ms`` (0..60000): how long a writer waits for
    the write lock. ``journal_mode``: set on each database of the connection by name (``"wal"``
    default; ``None`` leaves the files as they are; ``"delete"`` makes a commit spanning an
    attached file atomic, see docs/embedding.md). ``foreign_keys`` is on. Other keyword arguments
    go to ``create_engine``. Transactions begin deferred; :func:`mark_writer` (or the execution
    option ``scheduler_writer=True``) makes them begin ``IMMEDIATE``.
    Raises ``SCHEDULER_INVALID_ARGUMENT`` for bad arguments.
    """
    attached = _validate(path, busy_timeout_ms, journal_mode, attach)
    connect_args = {"timeout": busy_timeout_ms / 1000, "check_same_thread": False}
    connect_args.update(engine_options.pop("connect_args", {}))
    engine = create_engine(f"sqlite+pysqlite:///{Path(path)}", connect_args=connect_args, **engine_options)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # transactions are begun by _emit_begin
        for name, target in attached.items():
            dbapi_connection.execute(f"ATTACH DATABASE ? AS {quote_identifier(name)}", (target,)).close()
        dbapi_connection.execute("PRAGMA foreign_keys = ON").close()
        dbapi_connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}").close()
        if journal_mode is not None:
            for name in ("main", *attached):
                dbapi_connection.execute(
                    f"PRAGMA {quote_identifier(name)}.journal_mode = {journal_mode.lower()}"
                ).close()

    event.listen(engine, "begin", _on_begin)
    event.listen(engine, "before_cursor_execute", _before_execute)
    event.listen(engine, "commit", _on_end)
    event.listen(engine, "rollback", _on_end)
    return engine


def mark_writer(target: Connection | Session) -> Connection:
    """Make the current transaction of ``target`` begin ``BEGIN IMMEDIATE``; return its Connection.

    Call it before the transaction's first statement (``with engine.begin() as conn:
    mark_writer(conn)``; ``with Session(engine) as session, session.begin():
    mark_writer(session)``). ``SCHEDULER_INVALID_ARGUMENT`` if the transaction already began
    deferred (it cannot take the write lock up front any more). A no-op on a transaction already
    begun ``IMMEDIATE`` and on other dialects (PostgreSQL locks rows, not the database).
    """
    if isinstance(target, Session):
        connection = target.connection()
    elif isinstance(target, Connection):
        connection = target
    else:
        raise invalid_argument("mark_writer takes a sqlalchemy Connection or ORM Session")
    if connection.dialect.name != "sqlite":
        return connection
    if not connection.in_transaction():
        connection.begin()
    begun = connection.info.get(_BEGUN)
    if begun == "deferred" and _driver(connection).in_transaction:
        raise invalid_argument(
            "mark_writer must be called before the transaction's first statement (it already began deferred)"
        )
    connection.info[_WRITER] = True
    if not connection.info.get(_PENDING):
        driver = _driver(connection)
        if driver is not None and not driver.in_transaction:
            driver.execute("BEGIN IMMEDIATE").close()  # an engine not built by sqlite_engine
    return connection


__all__ = ["WRITER_OPTION", "mark_writer", "sqlite_engine"]
