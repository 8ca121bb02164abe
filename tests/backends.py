"""The databases tests run against: SQLite files and the PostgreSQL server of the test run.

PostgreSQL is the server named by ``SCHEDULER_TEST_POSTGRES_URL`` (``bash .ci/run`` starts one
and creates a database of its own for the run). Each test gets a fresh schema (cheap) or, where
it needs one, a fresh database (``PostgresServer.create_database``). No server is mocked:

* variable unset: the PostgreSQL tests skip, with one line saying how to enable them;
* variable set but the server unreachable: they fail (a CI that meant to test PostgreSQL must
  not go green without it).

``Backend`` is the parametrization point for running a test on both backends (see
``conftest.backend``): the name, an engine whose ``begin()`` is a real write transaction, and
the schema the scheduler's tables live in.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from scheduler import open_store
from scheduler.schema import tables
from scheduler.testing import T0

ENV_URL: Final = "SCHEDULER_TEST_POSTGRES_URL"
HOW_TO_ENABLE: Final = (
    f"PostgreSQL tests skipped: set {ENV_URL}=postgresql+psycopg://USER@HOST:PORT/DATABASE "
    "to run them (bash .ci/run starts a local server and sets it)"
)
SQLITE: Final = "sqlite"
POSTGRESQL: Final = "postgresql"
BACKENDS: Final = (SQLITE, POSTGRESQL)

_names = itertools.count(1)


def unique_name(prefix: str) -> str:
    """A name no other test, process or parallel test run uses at the same time."""
    return f"{prefix}_{os.getpid()}_{next(_names)}"


def configured_url() -> URL | None:
    """The test server's URL (``postgresql://`` taken as psycopg), or ``None`` when unset."""
    value = os.environ.get(ENV_URL, "").strip()
    if not value:
        return None
    url = make_url(value)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def sqlite_engine(path: Path | str) -> Engine:
    """A SQLite engine with real transactions: autocommit driver, ``BEGIN IMMEDIATE`` on begin."""
    engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@contextmanager
def sqlite_transaction(path: Path | str) -> Iterator[Connection]:
    """A connection to the SQLite file inside one write transaction (committed on success)."""
    engine = sqlite_engine(path)
    try:
        with engine.connect() as connection, connection.begin():
            yield connection
    finally:
        engine.dispose()


class PostgresServer:
    """The test run's PostgreSQL database, and fresh schemas or databases made on it."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self.engine = create_engine(url, poolclass=NullPool)
        self._pooled: set[str] = set()

    def check_reachable(self) -> None:
        """Connect once; raises ``OperationalError`` when the server does not answer."""
        with self.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")

    def quote(self, name: str) -> str:
        return self.engine.dialect.identifier_preparer.quote_identifier(name)

    def drop_schema(self, name: str) -> None:
        with self.engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {self.quote(name)} CASCADE")

    def empty_scheduler_tables(self, schema: str) -> None:
        """Delete every row of a scheduler schema but its ``migrations`` history, restarting the
        ``events`` id sequence: the state of a freshly created v6 schema. (``DELETE`` in foreign-key
        order: on a test's few rows it costs a small fraction of a ``TRUNCATE``.)"""
        quoted = self.quote(schema)
        with self.engine.begin() as connection:
            for table in reversed(tables.metadata.sorted_tables):
                if table.name != "migrations":
                    connection.exec_driver_sql(f"DELETE FROM {quoted}.{self.quote(table.name)}")
            connection.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence(%s, 'event_id'), 1, false)", (f"{quoted}.events",)
            )

    def empty_schema(self, name: str, *, now: int = T0) -> str:
        """``name`` as a freshly created v6 scheduler schema: created (``open_store`` at ``now``,
        ms) the first time this session asks for it, emptied on every later call; dropped by
        ``dispose``. Returns ``name``."""
        if name in self._pooled:
            self.empty_scheduler_tables(name)
        else:
            self.drop_schema(name)
            open_store(self.engine, schema=name, clock=lambda: now).close()
            self._pooled.add(name)
        return name

    def create_database(self) -> URL:
        """A new, empty database on the same server (``template0``); drop it with ``drop_database``."""
        name = unique_name("t_db")
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {self.quote(name)} TEMPLATE template0")
        return self.url.set(database=name)

    def drop_database(self, url: URL) -> None:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql(
                f"DROP DATABASE IF EXISTS {self.quote(str(url.database))} WITH (FORCE)"
            )

    def dispose(self) -> None:
        for name in sorted(self._pooled):
            self.drop_schema(name)
        self.engine.dispose()


def describe_url(url: URL) -> str:
    """The URL without its password, for report headers and messages."""
    return url.render_as_string(hide_password=True)


def unreachable_message(url: URL, error: OperationalError) -> str:
    return (
        f"{ENV_URL} is set ({describe_url(url)}) but the server cannot be reached: {error.orig}. "
        "Start it (bash .ci/run does) or unset the variable to skip the PostgreSQL tests."
    )


@dataclass(frozen=True)
class Backend:
    """One database a backend-parametrized test runs on.

    ``engine.begin()`` opens a real write transaction on both backends (``BEGIN IMMEDIATE`` on
    SQLite); ``schema`` is where the scheduler's tables live (``"main"`` on SQLite, a fresh
    schema that does not exist yet on PostgreSQL, dropped after the test).
    """

    name: str
    engine: Engine
    schema: str

    @property
    def is_postgresql(self) -> bool:
        return self.name == POSTGRESQL
