"""Everything SQLite-specific in the store: renderings, pragmas, begin statements, catalog reads.

(The schema layer keeps its own SQLite specifics: canonical DDL, ``sqlite_master`` fingerprints.)
"""

from __future__ import annotations

import functools
import sqlite3
from typing import Any, Final

from sqlalchemy import Connection, String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from scheduler.schema.target import SchemaTarget, sqlite_driver_in_transaction
from scheduler.store.plumbing.constructs import glob_match, greatest, json_text_field
from scheduler.store.plumbing.fastpath import FastPath

NAME: Final = "sqlite"


# ----------------------------------------------------------------- renderings


def _literal(compiler: SQLCompiler, value: str) -> str:
    return compiler.render_literal_value(value, String())


@compiles(json_text_field, "sqlite")
def _json_text_field(element: json_text_field, compiler: SQLCompiler, **kw: Any) -> str:
    """``json_extract(column, '$.key')`` (SQLite's JSON1)."""
    path = _literal(compiler, "$." + element.member)
    return f"json_extract({compiler.process(element.column, **kw)}, {path})"


@compiles(glob_match, "sqlite")
def _glob_match(element: glob_match, compiler: SQLCompiler, **kw: Any) -> str:
    return f"{compiler.process(element.operand, **kw)} GLOB {_literal(compiler, element.pattern)}"


@compiles(greatest, "sqlite")
def _greatest(element: greatest, compiler: SQLCompiler, **kw: Any) -> str:
    """SQLite's two-argument scalar ``max()``."""
    return f"max({compiler.process(element.clauses, **kw)})"


# ----------------------------------------------------------------- connection set-up


@functools.cache
def json_functions_are_innocuous() -> bool:
    """Whether this SQLite lets CHECK (json_valid(...)) run with ``trusted_schema = OFF``.

    SQLite marks the JSON functions innocuous only in newer releases; on older ones (3.40 here)
    every insert into a table with such a CHECK would fail with "unsafe use of json_valid()".
    """
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("PRAGMA trusted_schema = OFF")
        probe.execute("CREATE TABLE probe (v TEXT CHECK (json_valid(v)))")
        probe.execute("INSERT INTO probe VALUES ('{}')")
        return True
    except sqlite3.Error:
        return False
    finally:
        probe.close()


def open_pragmas() -> tuple[str, ...]:
    """Pragmas set on every connection before the schema is touched (seed: openDatabase)."""
    trusted = ("PRAGMA trusted_schema = OFF",) if json_functions_are_innocuous() else ()
    return ("PRAGMA foreign_keys = ON", *trusted)


FILE_PRAGMAS = ("PRAGMA journal_mode = WAL",)
JOURNAL_MODE = "PRAGMA journal_mode"
CHECKPOINT_ON_CLOSE = "PRAGMA wal_checkpoint(TRUNCATE)"
"""Run by ``close()`` with ``busy_timeout = 0`` (a blocked TRUNCATE degrades to PASSIVE)."""
DURABILITY_PRAGMAS = ("PRAGMA synchronous = FULL",)
BEGIN_WRITE = "BEGIN IMMEDIATE"
BEGIN_READ = "BEGIN"


# ----------------------------------------------------------------- transactions


NO_SUCH_TABLE: Final = "no such table:"
"""How SQLite reports a statement naming a table that does not exist (result code SQLITE_ERROR)."""


def missing_table(errors: list[BaseException]) -> bool:
    """Whether a statement of the cause chain named a table that does not exist."""
    return any(
        getattr(error, "sqlite_errorname", None) == "SQLITE_ERROR" and str(error).startswith(NO_SUCH_TABLE)
        for error in errors
    )


def driver_in_transaction(conn: Connection) -> bool | None:
    """Whether the driver's SQLite connection is inside a transaction (``None``: cannot tell;
    pysqlite or aiosqlite)."""
    return sqlite_driver_in_transaction(conn)


def begin_transaction(conn: Connection, begin: str = BEGIN_WRITE, fast: FastPath | None = None) -> None:
    """Start the SQLite transaction explicitly unless the engine's own "begin" hook already did.

    (SQLAlchemy's pysqlite recipe emits BEGIN from a "begin" event; a second BEGIN would fail.)
    """
    if fast is not None:
        if not fast.in_transaction():
            fast.run_driver_sql(conn, begin)
    elif driver_in_transaction(conn) is not True:
        conn.exec_driver_sql(begin)


def begin(conn: Connection, *, write: bool, fast: FastPath | None, one_statement: bool = False) -> None:
    """The start of a transaction the store owns: ``BEGIN IMMEDIATE`` (write) or ``BEGIN``
    (one read snapshot). Waiting for the lock is the connection's ``busy_timeout``.

    A read of ``one_statement`` begins nothing: the store's driver connection is in autocommit,
    so the statement reads one snapshot of its own (an engine whose "begin" hook sends a
    ``BEGIN``, ``sqlite_engine``'s, still does)."""
    if one_statement and not write:
        return
    begin_transaction(conn, BEGIN_WRITE if write else BEGIN_READ, fast)


def ensure_transaction(conn: Connection) -> None:
    """Before a SAVEPOINT in a caller's transaction: pysqlite starts its implicit transaction
    lazily, and a SAVEPOINT opened outside one would become the outermost transaction whose
    RELEASE commits the caller's work. SQLAlchemy's own begin comes first: an engine built with
    the pysqlite recipe emits BEGIN from its "begin" event, and a second BEGIN would fail."""
    if not conn.in_transaction():
        conn.begin()
    if driver_in_transaction(conn) is False:
        conn.exec_driver_sql(BEGIN_WRITE)


def server_now(conn: Connection, fast: FastPath | None = None) -> int:
    """SQLite has no server: ``clock=None`` is the local wall clock (never called)."""
    raise NotImplementedError("SQLite stores use the local wall clock")


# ----------------------------------------------------------------- catalog reads


def schema_header(conn: Connection, target: SchemaTarget) -> tuple[int, int | None]:
    """(``application_id``, ``user_version``) of the scheduler's database file; ``None`` for the
    version of a file shared with an application (its header is the application's)."""
    application_id = int(conn.exec_driver_sql(target.pragma("application_id")).scalar_one())
    if not target.exclusive:
        return application_id, None
    return application_id, int(conn.exec_driver_sql(target.pragma("user_version")).scalar_one())
