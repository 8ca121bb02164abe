"""The SQLite-specific pieces of the store, kept in one place for a later PostgreSQL backend."""

from __future__ import annotations

import functools
import sqlite3
from typing import Any

from sqlalchemy import func
from sqlalchemy.sql.elements import ColumnElement


def json_text_field(column: Any, key: str) -> ColumnElement[Any]:
    """``json_extract(column, '$.key')`` (SQLite's JSON1)."""
    return func.json_extract(column, f"$.{key}")


def glob_match(expression: Any, pattern: str) -> ColumnElement[bool]:
    """``expression GLOB pattern`` (SQLite's case-sensitive wildcard match)."""
    return expression.op("GLOB", is_comparison=True)(pattern)  # type: ignore[no-any-return]


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


def greatest(left: Any, right: Any) -> ColumnElement[Any]:
    """The larger of two values: SQLite's two-argument scalar ``max()`` (``GREATEST`` elsewhere)."""
    return func.max(left, right)


def insert_ignoring_conflict(table: Any, *index_elements: str) -> Any:
    """``INSERT … ON CONFLICT(index_elements) DO NOTHING`` for ``table``."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=list(index_elements))
