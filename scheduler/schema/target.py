"""Where the scheduler's tables live: the backend, the schema and (SQLite) whether the file is ours.

Every function of the schema layer takes ``schema=`` and ``exclusive=`` and resolves them here,
once per call, into a :class:`SchemaTarget`:

* SQLite: ``schema`` is ``"main"`` (default) or the name of an attached database. ``exclusive``
  (default ``True``) means the database file holds the scheduler's catalog and nothing else and
  its ``application_id``/``user_version`` are the scheduler's (the original's rule); ``False``
  means the file is shared with an application (API §8).
* PostgreSQL: ``schema`` is a schema name (default ``"scheduler"``; any name, quoted as needed);
  the schema holds the scheduler's objects and nothing else. ``exclusive`` must stay ``True``.

Core statements over ``scheduler.schema.tables`` reach the right place through
``SchemaTarget.bind(connection)`` (``schema_translate_map={None: schema}``); raw catalog SQL
uses ``SchemaTarget.qualify`` / ``SchemaTarget.pragma``. For SQLite ``main`` nothing is
qualified, so the statements of the default layout are exactly those of the original.

The schema layer sits below the backends (:mod:`scheduler.backends` builds on it), so it cannot
ask them. What differs between the two databases for it is one :class:`Flavour` of facts, chosen
once per target from the dialect's name in :data:`FLAVOURS`: the only place of the schema layer
that maps a database's name to what it does. Every other module asks the target
(``target.own_schema``, ``target.owns_file_header`` …), never the name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection

from scheduler.contract.errors import SchedulerKernelError, invalid_argument

SQLITE: Final = "sqlite"
POSTGRESQL: Final = "postgresql"
POSTGRESQL_MAX_IDENTIFIER_BYTES: Final = 63
SQLITE_PREAMBLE: Final = ".bail on"
"""The first line of an offline script for ``sqlite3``: stop at the first error."""
PSQL_PREAMBLE: Final = "\\set ON_ERROR_STOP on"
"""The first line of an offline script for ``psql``: stop at the first error."""


@dataclass(frozen=True)
class Flavour:
    """What the schema layer does differently on one database (see the module)."""

    default_schema: str
    """Where the tables live when no ``schema=`` is given."""
    own_schema: bool
    """The tables live in a schema of their own, which step 1 creates and holds nothing else: the
    DDL is rendered from the Core tables (``pg_ddl``), the catalog read from the server's
    (``pg_catalog``), the version is the ``migrations`` history, DDL takes the schema's advisory
    lock first and must run in a driver transaction (not autocommit). Else (SQLite) the tables
    live in a database file, ``main`` or attached, maybe shared: the canonical DDL text, the file's
    own catalog, its header and pragmas."""
    file_header: bool
    """The database file has a header (``application_id``, ``user_version``) that an exclusive
    store owns."""
    latest_per_statement: bool
    """Each statement of a transaction reads the latest commit (READ COMMITTED), so a check made
    of several statements may see another process's upgrade half done."""
    aborts_on_failure: bool
    """A failed statement aborts the whole transaction: a read that may fail runs in a SAVEPOINT
    so the caller's transaction stays usable."""
    checks_pages: bool
    """The database file's pages can be checked (``PRAGMA quick_check``); a server keeps its own."""
    script_preamble: str
    """The first line of an offline script, for the database's command-line client."""
    script_begin: str
    """How an offline script begins its one transaction."""
    script_blocks: bool
    """A script can run an anonymous block that raises (``DO``): an offline script's guard is one;
    else it is a TEMP trigger on a TEMP table, dropped at the end."""
    max_identifier_bytes: int | None
    """The longest schema name, in UTF-8 bytes (``None``: no limit of the schema layer's)."""
    reserved_prefix: str | None
    """Schema names the database keeps for itself start with it."""


FLAVOURS: Final = {
    SQLITE: Flavour(
        default_schema="main",
        own_schema=False,
        file_header=True,
        latest_per_statement=False,
        aborts_on_failure=False,
        checks_pages=True,
        script_preamble=SQLITE_PREAMBLE,
        script_begin="BEGIN IMMEDIATE;",
        script_blocks=False,
        max_identifier_bytes=None,
        reserved_prefix=None,
    ),
    POSTGRESQL: Flavour(
        default_schema="scheduler",
        own_schema=True,
        file_header=False,
        latest_per_statement=True,
        aborts_on_failure=True,
        checks_pages=False,
        script_preamble=PSQL_PREAMBLE,
        script_begin="BEGIN;",
        script_blocks=True,
        max_identifier_bytes=POSTGRESQL_MAX_IDENTIFIER_BYTES,
        reserved_prefix="pg_",
    ),
}
"""The flavour of each dialect the schema layer supports, by SQLAlchemy dialect name."""
DEFAULT_SCHEMAS: Final = {name: flavour.default_schema for name, flavour in FLAVOURS.items()}

SCHEMA_CORRUPT: Final = "SCHEDULER_SCHEMA_CORRUPT"
SCHEMA_UNKNOWN: Final = "SCHEDULER_SCHEMA_UNKNOWN"


def schema_error(
    code: str, message: str, details: Any = None, cause: BaseException | None = None
) -> SchedulerKernelError:
    """A ``SCHEDULER_SCHEMA_*`` error, chaining ``cause`` like the seed's ``schemaError``."""
    error = SchedulerKernelError(code, message, details)
    error.__cause__ = cause
    return error


def driver_autocommit(connection: Connection) -> bool:
    """Whether the DBAPI connection is in autocommit mode (psycopg: no transaction block)."""
    return getattr(connection.connection.dbapi_connection, "autocommit", False) is True


def sqlite_driver_in_transaction(connection: Connection) -> bool | None:
    """Whether the driver's SQLite connection is inside a transaction (``None``: cannot tell).

    pysqlite answers itself; SQLAlchemy's aiosqlite adapter does not, its driver connection
    (``aiosqlite.Connection``, over the same ``sqlite3`` connection) does.
    """
    try:
        dbapi: Any = connection.connection.dbapi_connection
        if not hasattr(dbapi, "in_transaction"):
            dbapi = dbapi.driver_connection
        return bool(dbapi.in_transaction)
    except Exception:
        return None


def quote_identifier(name: str) -> str:
    """``"name"`` with embedded double quotes doubled (SQLite and PostgreSQL alike)."""
    return '"' + name.replace('"', '""') + '"'


def driver_sql(connection: Connection, sql: str) -> str:
    """``sql`` as ``exec_driver_sql`` must pass it to ``connection``'s driver, without parameters.

    psycopg (``pyformat``) reads ``%`` as a placeholder even when no parameters are given, so a
    schema named ``a%sb`` would become ``a$1b``: its percent signs are doubled. Other drivers
    (``qmark``, asyncpg's ``$n``) take the text as it is.
    """
    if connection.dialect.paramstyle in ("format", "pyformat"):
        return sql.replace("%", "%%")
    return sql


@dataclass(frozen=True)
class SchemaTarget:
    """A resolved place for the scheduler's tables on one connection's backend."""

    dialect: str
    schema: str
    exclusive: bool = True

    @property
    def flavour(self) -> Flavour:
        """What the schema layer does differently on this target's database."""
        return FLAVOURS[self.dialect]

    @property
    def own_schema(self) -> bool:
        """:attr:`Flavour.own_schema`."""
        return self.flavour.own_schema

    @property
    def owns_file_header(self) -> bool:
        """Whether the store owns the database file's header (:attr:`Flavour.file_header`, and the
        file is the scheduler's alone: ``exclusive``)."""
        return self.flavour.file_header and self.exclusive

    @property
    def is_default_sqlite(self) -> bool:
        """SQLite ``main``: statements stay unqualified, exactly the original's."""
        return not self.own_schema and self.schema == "main"

    @property
    def prefix(self) -> str:
        """``""`` for SQLite ``main``, else the quoted schema and a dot."""
        return "" if self.is_default_sqlite else quote_identifier(self.schema) + "."

    def qualify(self, name: str) -> str:
        """A table (or ``sqlite_master``) name for raw SQL in this schema."""
        return self.prefix + name

    def pragma(self, body: str) -> str:
        """``PRAGMA body`` addressed to this schema's database (SQLite)."""
        return f"PRAGMA {self.prefix}{body}"

    @property
    def translate_map(self) -> dict[str | None, str] | None:
        return None if self.is_default_sqlite else {None: self.schema}

    def bind(self, connection: Connection) -> Connection:
        """``connection`` with Core statements over the schema-less tables sent to this schema.

        SQLAlchemy 2 applies ``Connection.execution_options`` IN PLACE: the map stays on the
        connection. Use it only on a connection the store owns; on anyone else's connection (an
        Alembic environment, ``on_connection``) use :meth:`bound`, which restores it.
        """
        mapping = self.translate_map
        return connection if mapping is None else connection.execution_options(schema_translate_map=mapping)

    @contextmanager
    def bound(self, connection: Connection) -> Iterator[Connection]:
        """:meth:`bind` for the duration of a block; the connection's previous map is restored,
        so an application's own tables of the same names are never redirected afterwards."""
        mapping = self.translate_map
        if mapping is None:
            yield connection
            return
        previous = connection.get_execution_options().get("schema_translate_map")
        connection.execution_options(schema_translate_map=mapping)
        try:
            yield connection
        finally:
            connection.execution_options(schema_translate_map=previous)


def _validate_schema(schema: object, flavour: Flavour) -> str:
    if not isinstance(schema, str) or not schema or "\x00" in schema:
        raise invalid_argument("schema must be a non-empty string")
    limit = flavour.max_identifier_bytes
    if limit is not None and len(schema.encode("utf-8")) > limit:
        raise invalid_argument(f"schema must be at most {limit} bytes on PostgreSQL")
    if flavour.reserved_prefix is not None and schema.startswith(flavour.reserved_prefix):
        raise invalid_argument(
            f"schema names starting with {flavour.reserved_prefix} are reserved by PostgreSQL"
        )
    return schema


def _attached_databases(connection: Connection) -> list[str]:
    return [str(row[1]) for row in connection.exec_driver_sql("PRAGMA database_list")]


def schema_target(connection: Connection, schema: str | None = None, exclusive: bool = True) -> SchemaTarget:
    """Resolve ``schema``/``exclusive`` for ``connection``'s backend; ``SCHEDULER_INVALID_ARGUMENT``
    for an unsupported backend, a bad name, an SQLite name that is not an attached database (or
    ``temp``), or ``exclusive=False`` on PostgreSQL."""
    dialect = connection.dialect.name
    flavour = FLAVOURS.get(dialect)
    if flavour is None:
        raise invalid_argument(f"the scheduler schema supports SQLite and PostgreSQL, not {dialect}")
    if not isinstance(exclusive, bool):
        raise invalid_argument("exclusive must be a boolean")
    name = flavour.default_schema if schema is None else _validate_schema(schema, flavour)
    if flavour.own_schema and not exclusive:
        raise invalid_argument(
            "exclusive=False applies to SQLite only: a PostgreSQL schema is the scheduler's"
        )
    if not flavour.own_schema and name != "main":
        attached = [database.lower() for database in _attached_databases(connection)]
        if name.lower() == "temp" or name.lower() not in attached:
            raise invalid_argument(f"schema {name!r} is not an attached SQLite database")
    return SchemaTarget(dialect, name, exclusive)


def resolve(
    connection: Connection, schema: str | SchemaTarget | None, exclusive: bool = True
) -> SchemaTarget:
    """A :class:`SchemaTarget` as is, else :func:`schema_target` (internal calls pass one along)."""
    if isinstance(schema, SchemaTarget):
        return schema
    return schema_target(connection, schema, exclusive)
