"""Alembic environment of the scheduler schema (SQLite only, forward-only, one transaction).

* Database: ``-x url=...`` > ``$SCHEDULER_DATABASE_URL`` > ``sqlalchemy.url`` in alembic.ini
  (a value without ``://`` is a file path). ``-x now=<epoch ms>`` pins the clock used for
  ``migrations.applied_at`` and the v2 backfill (default: the wall clock).
* The whole run is ONE ``BEGIN IMMEDIATE`` transaction on a driver connection in autocommit
  mode (pysqlite would otherwise run DDL outside any transaction): the database is first
  checked like ``open_store`` checks it (``inspect_database``: integrity, history, exact
  catalog of its version), then upgraded, then verified again as the version it ends at. Any
  failure rolls everything back and leaves the file untouched.
* The revision of a database IS its ``PRAGMA user_version``. Alembic's bookkeeping table is a
  TEMP table named ``alembic_version``, filled from ``user_version`` before Alembic looks at it;
  the unqualified name resolves to the temp schema first, so Alembic reads and writes it there
  and nothing is ever created in the main schema: the persistent catalog stays canonical.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from pathlib import Path
from typing import Any

from alembic import context
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.pool import NullPool

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import metadata
from scheduler.schema.catalog import read_pragma_int, verify_schema
from scheduler.schema.upgrade import LATEST_VERSION, inspect_database, validate_now, wall_clock_ms
from scheduler.schema.versions import exists_on

URL_ENVIRONMENT_VARIABLE = "SCHEDULER_DATABASE_URL"
BUSY_TIMEOUT_MS = 5_000
VERSION_TABLE = "alembic_version"

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    """The target database: ``-x url`` > environment > alembic.ini; a bare path becomes a URL."""
    x_arguments = context.get_x_argument(as_dictionary=True)
    value = (
        x_arguments.get("url")
        or os.environ.get(URL_ENVIRONMENT_VARIABLE)
        or config.get_main_option("sqlalchemy.url")
    )
    if not value:
        raise CommandError(f"No database: pass -x url=..., set {URL_ENVIRONMENT_VARIABLE} or sqlalchemy.url")
    if "://" not in value:
        return f"sqlite:///{Path(value).expanduser().resolve()}"
    return value


def pinned_now() -> int:
    """``-x now=<epoch ms>`` validated like the store validates its clock, else the wall clock."""
    value = context.get_x_argument(as_dictionary=True).get("now")
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


def sqlite_engine(url: str) -> Engine:
    """A SQLite engine whose transactions are real: autocommit driver + ``BEGIN IMMEDIATE``."""
    backend = make_url(url).get_backend_name()
    if backend != "sqlite":
        raise CommandError(f"The scheduler schema migrations support SQLite only, not {backend}")
    engine = create_engine(url, poolclass=NullPool)

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


def install_version_table(connection: Connection, version: int) -> None:
    """A TEMP ``alembic_version`` holding the revision that matches ``user_version``."""
    connection.exec_driver_sql(
        f"CREATE TEMP TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"
    )
    if version > 0:
        connection.exec_driver_sql(f"INSERT INTO temp.{VERSION_TABLE} (version_num) VALUES ('v{version}')")


def checked_version(connection: Connection) -> int:
    """The database's schema version after the checks ``open_store`` makes (0 = empty)."""
    version = inspect_database(connection)
    if version == LATEST_VERSION:
        verify_schema(connection, version)
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
    install_version_table(connection, checked_version(connection))
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_object=include_object,
        transaction_per_migration=False,
        transactional_ddl=True,  # true here: the driver is in autocommit mode and we BEGIN ourselves
    )
    with context.begin_transaction():
        context.run_migrations(now=now)
    final_version = read_pragma_int(connection, "user_version")
    if final_version > 0:
        verify_schema(connection, final_version)
    connection.exec_driver_sql(f"DROP TABLE temp.{VERSION_TABLE}")


def run_migrations_online() -> None:
    """Run the command against the database, refusing anything ``open_store`` would refuse."""
    now = pinned_now()
    engine = sqlite_engine(database_url())
    try:
        with engine.connect() as connection, connection.begin():
            run_in_transaction(connection, now)
    except SchedulerKernelError as error:
        raise CommandError(f"{error.code}: {error.message}") from error
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    """Refused: the v2 step reads and rewrites data, so no SQL script can stand in for it."""
    raise CommandError("Offline (--sql) mode is not supported by the scheduler schema migrations")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
