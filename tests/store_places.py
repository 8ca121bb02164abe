"""Where a behavioural test's store lives: a SQLite file or a fresh PostgreSQL schema.

The ``place`` fixture (``conftest.py``) runs a test body on both backends. A place opens stores
(``open_store`` with the test's clock and options) and gives the test an independent view of
the database: ``dump()`` (every scheduler table's rows in the fixtures' layout), ``sql()`` (raw
SQL on a second connection, written with SQLite's ``?`` placeholders) and ``insert()`` (a Core
insert on a second connection, for rows another module would write).
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any, Final

import pytest
from backends import POSTGRESQL, SQLITE, PostgresServer
from dump import dump
from sqlalchemy import create_engine, insert, select
from sqlalchemy.pool import NullPool

from scheduler import SchedulerStore, open_store
from scheduler.schema import tables as t
from scheduler.schema.target import quote_identifier

Dump = dict[str, Any]

sqlite_only = pytest.mark.parametrize("place", [SQLITE], indirect=True)
"""Mark a test of a ``place``-parametrized module as SQLite-only (it reads the file, its
pragmas or the SQLite driver); the module docstring says which tests and why."""

_siblings = itertools.count(1)


class SqliteFilePlace:
    """A SQLite file (``path``), read back with the standard library."""

    backend: Final = SQLITE

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self, **options: Any) -> SchedulerStore:
        return open_store(self.path, **options)

    def dump(self) -> Dump:
        return dump(self.path)

    def sibling(self, name: str) -> SqliteFilePlace:
        """Another empty place on this backend: a new file next to this one."""
        return SqliteFilePlace(self.path.with_name(f"{name}-{next(_siblings)}.sqlite"))

    def sql(self, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        connection = sqlite3.connect(self.path)
        try:
            rows = connection.execute(statement, parameters).fetchall()
            connection.commit()
            return rows
        finally:
            connection.close()

    def insert(self, table: Any, **values: Any) -> None:
        engine = create_engine(f"sqlite:///{self.path}", poolclass=NullPool)
        try:
            with engine.begin() as connection:
                connection.execute(insert(table), values)
        finally:
            engine.dispose()


class PostgresSchemaPlace:
    """A schema on the test run's PostgreSQL server (created by the first ``open``)."""

    backend: Final = POSTGRESQL

    def __init__(self, server: PostgresServer, schema: str) -> None:
        self.server = server
        self.schema = schema

    def open(self, **options: Any) -> SchedulerStore:
        return open_store(self.server.engine, schema=self.schema, **options)

    def sibling(self, name: str) -> PostgresSchemaPlace:
        """Another empty place on this backend: the session's v6 schema ``name`` (created once),
        emptied now. Two siblings of the same name are the same schema."""
        return PostgresSchemaPlace(self.server, self.server.empty_schema(f"{self.schema}_{name}"))

    def dump(self) -> Dump:
        """Every scheduler table's rows ordered by primary key (no ``sqlite_sequence``, no header)."""
        options = {"schema_translate_map": {None: self.schema}}
        with self.server.engine.connect() as connection:
            tables = {
                table.name: [
                    dict(row)
                    for row in connection.execute(
                        select(table).order_by(*table.primary_key), execution_options=options
                    ).mappings()
                ]
                for table in t.ALL_TABLES
            }
        return {"tables": dict(sorted(tables.items()))}

    def sql(self, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.server.engine.begin() as connection:
            connection.exec_driver_sql(f"SET LOCAL search_path TO {quote_identifier(self.schema)}")
            result = connection.exec_driver_sql(statement.replace("?", "%s"), parameters)
            return [tuple(row) for row in result] if result.returns_rows else []

    def insert(self, table: Any, **values: Any) -> None:
        with self.server.engine.begin() as connection:
            connection.execute(
                insert(table), values, execution_options={"schema_translate_map": {None: self.schema}}
            )


StorePlace = SqliteFilePlace | PostgresSchemaPlace


PG_EXAMPLES_DIVISOR: Final = 4
"""A randomized (hypothesis) test runs this many times fewer examples on PostgreSQL, whose
round trips cost far more than a SQLite file's: CI time, not coverage of a different kind."""


def examples(place: StorePlace, on_sqlite: int) -> int:
    """How many hypothesis examples a randomized test runs in ``place``."""
    if place.backend == SQLITE:
        return on_sqlite
    return max(1, on_sqlite // PG_EXAMPLES_DIVISOR)


def in_transaction(connection: Any) -> bool:
    """Whether a store's SQLAlchemy ``connection`` is inside a transaction right now.

    SQLite: the driver's own flag (``BEGIN IMMEDIATE`` was sent, the write lock is held).
    PostgreSQL: SQLAlchemy's transaction or the server's (psycopg sends ``BEGIN`` with the
    transaction's first statement, so the server's alone says nothing before that statement).
    """
    dbapi = connection.connection.dbapi_connection
    if isinstance(dbapi, sqlite3.Connection):
        return dbapi.in_transaction
    from psycopg.pq import TransactionStatus

    return bool(connection.in_transaction() or dbapi.info.transaction_status != TransactionStatus.IDLE)
