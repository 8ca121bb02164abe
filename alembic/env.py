"""The repository's Alembic environment: a DBA's way to create or upgrade a scheduler database.

The revisions themselves ship in the package (``scheduler/revisions/versions``, found through
``version_locations = scheduler:revisions/versions`` in alembic.ini); an application mounts the
same revisions in its own environment instead (docs/embedding.md).

* Database: ``-x url=...`` > ``$SCHEDULER_DATABASE_URL`` > ``sqlalchemy.url`` in alembic.ini (a
  value without ``://`` is a file path): an SQLite file or a PostgreSQL database.
  ``-x scheduler_schema=NAME`` (PostgreSQL schema, default ``scheduler``) and
  ``-x scheduler_exclusive=false`` (an SQLite file shared with an application) as for
  ``open_store``. ``-x now=<epoch ms>`` pins the clock of ``migrations.applied_at`` and the v2
  backfill (default: the wall clock).
* The whole run is ONE transaction (SQLite: ``BEGIN IMMEDIATE`` on a driver connection in
  autocommit mode; PostgreSQL: READ COMMITTED): the database is first checked like
  ``open_store`` checks it, then upgraded, then verified again. Any failure rolls everything back.
* The revision of a database IS its ``migrations`` history (on an exclusive SQLite file also its
  ``PRAGMA user_version``). Alembic's bookkeeping table is a TEMP table named ``alembic_version``,
  filled from that version before Alembic looks at it; the unqualified name resolves to the temp
  schema first, so nothing is ever created in the database: the persistent catalog stays
  canonical. ``alembic stamp`` is refused (it could change only that temp table).
* Offline (``--sql``): the guarded script of ``scheduler.schema.offline`` for ``sqlite3``/``psql``
  (starting from an empty database, or from ``vN`` with ``upgrade vN:head --sql``).
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from pathlib import Path
from typing import Any

from alembic import context
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from scheduler.contract.errors import SchedulerKernelError
from scheduler.revisions import EXCLUSIVE_ATTRIBUTE, SCHEMA_ATTRIBUTE, refuse_stamp, settings_from
from scheduler.schema import metadata
from scheduler.schema.catalog import verify_schema
from scheduler.schema.sqlite_file import foreign_file_error
from scheduler.schema.target import FLAVOURS, SchemaTarget, schema_target
from scheduler.schema.upgrade import LATEST_VERSION, inspect_database, validate_now, wall_clock_ms
from scheduler.schema.versions import exists_on

URL_ENVIRONMENT_VARIABLE = "SCHEDULER_DATABASE_URL"
BUSY_TIMEOUT_MS = 5_000
VERSION_TABLE = "alembic_version"
TEMP_SCHEMA = {"sqlite": "temp", "postgresql": "pg_temp"}

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def x_argument(name: str) -> str | None:
    return context.get_x_argument(as_dictionary=True).get(name)


def database_url() -> str:
    """The target database: ``-x url`` > environment > alembic.ini; a bare path becomes a URL."""
    value = (
        x_argument("url")
        or os.environ.get(URL_ENVIRONMENT_VARIABLE)
        or config.get_main_option("sqlalchemy.url")
    )
    if not value:
        raise CommandError(f"No database: pass -x url=..., set {URL_ENVIRONMENT_VARIABLE} or sqlalchemy.url")
    if "://" not in value:
        return f"sqlite:///{Path(value).expanduser().resolve()}"
    if value.startswith("postgresql://"):
        return "postgresql+psycopg://" + value.removeprefix("postgresql://")
    return value


def pinned_now() -> int:
    """``-x now=<epoch ms>`` validated like the store validates its clock, else the wall clock."""
    value = x_argument("now")
    if value is None:
        return wall_clock_ms()
    try:
        if not (value.isascii() and value.isdigit()):
            raise ValueError(value)
        return validate_now(int(value))
    except (ValueError, SchedulerKernelError) as cause:
        raise CommandError(
            f"-x now must be a non-negative integer epoch in milliseconds: {value!r}"
        ) from cause


def configure_layout() -> None:
    """The DBA environment manages a dedicated file unless told otherwise (``-x scheduler_*``)."""
    config.attributes.setdefault(SCHEMA_ATTRIBUTE, x_argument("scheduler_schema"))
    config.attributes.setdefault(EXCLUSIVE_ATTRIBUTE, x_argument("scheduler_exclusive") or "true")


def database_engine(url: str) -> Engine:
    """SQLite: autocommit driver + ``BEGIN IMMEDIATE`` (real transactions); PostgreSQL as is."""
    backend = make_url(url).get_backend_name()
    if backend not in TEMP_SCHEMA:
        raise CommandError(f"The scheduler schema migrations support SQLite and PostgreSQL, not {backend}")
    engine = create_engine(url, poolclass=NullPool)
    if FLAVOURS[backend].own_schema:
        return engine

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # Not trusted_schema = OFF: SQLite 3.40 then refuses the schema's json_valid() CHECKs.
        for pragma in ("foreign_keys = ON", f"busy_timeout = {BUSY_TIMEOUT_MS}"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def layout(connection: Connection) -> SchemaTarget:
    """Where the scheduler's tables are, resolved exactly as the revisions resolve it."""
    settings = settings_from(config.attributes, context.get_x_argument(as_dictionary=True), {})
    return schema_target(connection, settings.schema, settings.resolve_exclusive(connection.dialect.name))


def install_version_table(connection: Connection, version: int) -> None:
    """A TEMP ``alembic_version`` holding the revision that matches the recorded version."""
    connection.exec_driver_sql(
        f"CREATE TEMP TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"
    )
    if version > 0:
        connection.exec_driver_sql(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('v{version}')")


def checked_version(connection: Connection, target: SchemaTarget) -> int:
    """The database's schema version after the checks ``open_store`` makes (0 = empty)."""
    version = inspect_database(connection, schema=target.schema, exclusive=target.exclusive)
    if version == LATEST_VERSION:
        verify_schema(connection, version, schema=target.schema, exclusive=target.exclusive)
    return version


def include_object(object_: Any, _name: str | None, type_: str, reflected: bool, _compare_to: Any) -> bool:
    """Autogenerate/``alembic check`` filter: skip foreign keys and other dialects' indexes.

    SQLAlchemy's SQLite reflection drops the inline ``ON DELETE RESTRICT`` of the canonical
    DDL, so every foreign key would look changed; tests/test_schema_metadata.py compares them
    through ``PRAGMA foreign_key_list`` instead. The claim path's PostgreSQL-only indexes
    (``Index.info["dialect"]``) do not exist on SQLite.
    """
    if type_ == "index" and not reflected:
        return bool(exists_on(object_, context.get_context().dialect.name))
    return type_ != "foreign_key_constraint"


def run_in_transaction(connection: Connection, now: int) -> None:
    """Check, let Alembic run the selected revisions, verify the result; one transaction."""
    configure_layout()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_object=include_object,
        include_schemas=False,
        transaction_per_migration=False,
        transactional_ddl=True,  # true here: the driver is in autocommit mode and we BEGIN ourselves
        on_version_apply=[refuse_stamp],
    )
    target = layout(connection)
    install_version_table(connection, checked_version(connection, target))
    with context.begin_transaction():
        context.run_migrations(now=now)
    final_version = inspect_database(connection, schema=target.schema, exclusive=target.exclusive)
    if final_version > 0:
        verify_schema(connection, final_version, schema=target.schema, exclusive=target.exclusive)
    connection.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")


def run_migrations_online() -> None:
    """Run the command against the database, refusing anything ``open_store`` would refuse."""
    now = pinned_now()
    url = database_url()
    engine = database_engine(url)
    try:
        with engine.connect() as connection, connection.begin():
            run_in_transaction(connection, now)
    except SchedulerKernelError as error:
        raise CommandError(f"{error.code}: {error.message}") from error
    except DBAPIError as error:  # SQLite refuses a foreign file at BEGIN, before any check runs
        refusal = foreign_file_error(error, str(make_url(url).database))
        if refusal is None:
            raise
        raise CommandError(f"{refusal.code}: {refusal.message}") from error
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    """Print the guarded script (no database is read); Alembic's table stays a TEMP one."""
    now = pinned_now()
    url = database_url()
    backend = make_url(url).get_backend_name()
    if backend not in TEMP_SCHEMA:
        raise CommandError(f"The scheduler schema migrations support SQLite and PostgreSQL, not {backend}")
    configure_layout()
    context.configure(
        url=url,
        literal_binds=True,
        transactional_ddl=True,
        version_table_schema=TEMP_SCHEMA[backend],
        on_version_apply=[refuse_stamp],
    )
    impl = context.get_context().impl
    impl.static_output(FLAVOURS[backend].script_preamble)
    start = context.get_starting_revision_argument()
    with context.begin_transaction():
        if isinstance(start, str) and start != "base":
            start = context.script.get_revision(start).revision
            # Alembic assumes its table exists when the script starts from a revision.
            impl.static_output(
                f"CREATE TEMP TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL PRIMARY KEY);"
            )
            impl.static_output(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('{start}');")
        context.run_migrations(now=now)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
