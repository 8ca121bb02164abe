"""The command line on PostgreSQL: which targets are PostgreSQL URLs, the schema, read-only access.

A ``--db`` (or ``$SCHEDULER_DATABASE_URL``) of the form ``postgresql://`` or
``postgresql+psycopg://`` names a PostgreSQL database; the scheduler's tables live in the schema of
the global ``--schema`` (API §8 default ``scheduler``). Read commands run in one
``READ ONLY``, ``REPEATABLE READ`` transaction (one consistent snapshot, nothing can be written)
that is rolled back at the end; they never create or upgrade a schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy import Connection, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from scheduler.backends import backend_named, is_supported
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import pg_catalog
from scheduler.schema.ddl import SCHEDULER_STORE_SCHEMA_VERSION
from scheduler.schema.target import SchemaTarget, schema_target
from scheduler.store.opening import parse_url

POSTGRESQL_DRIVERS = ("postgresql", "postgresql+psycopg")


class PgTargetError(Exception):
    """A PostgreSQL target the command line cannot use: ``usage`` (exit 2) or a refusal (exit 1)."""

    def __init__(self, message: str, *, usage: bool, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage
        self.code = code


def has_own_schema(target: str) -> bool:
    """Whether a ``--db`` value is the URL of a database whose stores live in schemas of their own
    (PostgreSQL, any driver: others are refused later)."""
    if "://" not in target:
        return False
    try:
        name = parse_url(target).get_backend_name()
        return is_supported(name) and backend_named(name).own_schema
    except SchedulerKernelError:  # malformed: resolve_target reports it as a usage error
        return False


def postgresql_url(target: str) -> URL:
    """The psycopg URL of a PostgreSQL ``--db`` (``postgresql://`` is taken as psycopg)."""
    url = make_url(target)
    if url.drivername not in POSTGRESQL_DRIVERS:
        raise PgTargetError(
            f"PostgreSQL is supported through psycopg 3 (postgresql+psycopg://), not {url.drivername}",
            usage=True,
            code="CLI_USAGE",
        )
    return url.set(drivername="postgresql+psycopg")


def label(url: URL, schema: str) -> str:
    """The database as reports name it: the URL without its password, and the schema."""
    return f"{url.render_as_string(hide_password=True)} (schema {schema})"


@contextmanager
def readonly_connection(target: str, schema: str | None) -> Iterator[tuple[str, Connection, SchemaTarget]]:
    """``(label, connection, schema target)`` inside one read-only snapshot transaction.

    The connection's Core statements are sent to the schema (``schema_translate_map``); the
    transaction is rolled back at the end.
    """
    url = postgresql_url(target)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            snapshot = connection.begin()
            connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            try:
                where = schema_target(connection, schema)
                yield label(url, where.schema), where.bind(connection), where
            finally:
                with suppress(DBAPIError):
                    snapshot.rollback()
    finally:
        engine.dispose()


def recorded_version(connection: Connection, where: SchemaTarget) -> int:
    """The schema's version (0: absent or empty); refusals as ``open_store`` refuses them."""
    return pg_catalog.recorded_version(connection, where)


def current_schema_problem(connection: Connection, where: SchemaTarget, name: str) -> PgTargetError | None:
    """Why a read command cannot read this schema (absent, empty or not v6), else ``None``."""
    version = recorded_version(connection, where)
    if version == 0:
        return PgTargetError(
            f"{name} has no scheduler tables (run `scheduler init`)",
            usage=False,
            code="SCHEDULER_SCHEMA_UNKNOWN",
        )
    if version != SCHEDULER_STORE_SCHEMA_VERSION:
        return PgTargetError(
            f"{name} is at schema v{version}, not v{SCHEDULER_STORE_SCHEMA_VERSION} "
            "(run `scheduler upgrade`)",
            usage=False,
            code="SCHEDULER_SCHEMA_UNKNOWN",
        )
    return None


def require_existing(target: str, schema: str | None) -> None:
    """A write command that never creates: the schema must hold scheduler tables (exit 1)."""
    with readonly_connection(target, schema) as (name, connection, where):
        if recorded_version(connection, where) == 0:
            raise PgTargetError(
                f"no scheduler tables in {name} (run `scheduler init`)",
                usage=False,
                code="SCHEDULER_NOT_FOUND",
            )


def server_version(connection: Connection) -> str:
    value: Any = connection.exec_driver_sql("SHOW server_version").scalar_one()
    return str(value)
