"""The DDL of each schema version on PostgreSQL, derived from ``tables.metadata``.

There is no second copy of the tables: step N creates the tables introduced in version N
(``CreateTable`` with only the columns they had then) with their indexes, and adds the columns
introduced in version N to older tables (``ALTER TABLE … ADD COLUMN``, the v5 source locator).
The type variants and :class:`~scheduler.schema.checks.DialectCheck` give the PostgreSQL column
rules of API §8. Statements are executed through ``schema_translate_map``, so every name,
foreign-key target and ``BIGSERIAL`` sequence lands in the target schema.

Creating from empty runs the same steps in one transaction, so a new v6 schema and an upgraded
one have the same catalog (and constraint names) and hash to ``SCHEMA_V6_PG_FINGERPRINT``; so
does ``metadata.create_all``.

Concurrency: every schema change takes ``pg_advisory_xact_lock(SCHEDULER_APPLICATION_ID,
crc32(schema name))`` first, so two processes initializing or upgrading the same schema run one
after the other; the second re-inspects (under READ COMMITTED it sees the first one's commit)
and finds nothing left to do.
"""

from __future__ import annotations

import zlib
from typing import Any, Final

from sqlalchemy import Connection, Table, text
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable, ExecutableDDLElement

from scheduler.contract.errors import invalid_argument
from scheduler.schema import ddl
from scheduler.schema.target import POSTGRESQL, SchemaTarget, driver_sql, quote_identifier
from scheduler.schema.versions import columns_at, indexes_at, since, tables_at

_LOCK_CLASS: Final = ddl.SCHEDULER_APPLICATION_ID  # "CCSK", fits a signed int4
_ISOLATION: Final = "SELECT current_setting('transaction_isolation')"


def lock_key(schema: str) -> tuple[int, int]:
    """The two int4 keys of the schema's advisory lock: the application id and crc32(name)."""
    crc = zlib.crc32(schema.encode("utf-8"))
    return _LOCK_CLASS, crc - (1 << 32) if crc >= 1 << 31 else crc


def lock_schema(connection: Connection, target: SchemaTarget) -> None:
    """Wait for, then hold until the transaction ends, the schema's advisory lock.

    Refuses (``SCHEDULER_INVALID_ARGUMENT``) a transaction that is not READ COMMITTED: under
    REPEATABLE READ or SERIALIZABLE the snapshot predates the lock, so the work of the process
    that held it before would stay invisible.
    """
    isolation = connection.exec_driver_sql(_ISOLATION).scalar_one()
    if isolation != "read committed":
        raise invalid_argument(
            f"Scheduler schema changes need a READ COMMITTED transaction on PostgreSQL, not {isolation}"
        )
    classid, objid = lock_key(target.schema)
    connection.execute(
        text("SELECT pg_advisory_xact_lock(:classid, :objid)"), {"classid": classid, "objid": objid}
    )


def create_schema(connection: Connection, target: SchemaTarget) -> None:
    """``CREATE SCHEMA IF NOT EXISTS`` (the caller holds the advisory lock)."""
    statement = f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(target.schema)}"
    connection.exec_driver_sql(driver_sql(connection, statement))


def _create_table(table: Table, version: int) -> CreateTable:
    statement = CreateTable(table)
    statement.columns = [column for column in statement.columns if since(column.element) <= version]
    return statement


def step_statements(version: int) -> list[ExecutableDDLElement]:
    """The schema-less DDL constructs of step ``version`` (creations only)."""
    statements: list[ExecutableDDLElement] = []
    for table in tables_at(version):
        if since(table) == version:
            statements.append(_create_table(table, version))
            statements.extend(CreateIndex(index) for index in indexes_at(table, version, POSTGRESQL))
    return statements


def added_columns(version: int) -> list[tuple[Table, Any]]:
    """(table, column) pairs that step ``version`` adds to tables of earlier versions."""
    return [
        (table, column)
        for table in tables_at(version)
        if since(table) < version
        for column in columns_at(table, version)
        if since(column) == version
    ]


def run_step_ddl(connection: Connection, version: int, target: SchemaTarget) -> None:
    """Execute step ``version``'s DDL in ``target``'s schema (inside the caller's transaction)."""
    with target.bound(connection) as bound:
        for statement in step_statements(version):
            bound.execute(statement)
    for table, column in added_columns(version):
        column_sql = CreateColumn(column).compile(dialect=connection.dialect)
        alter = f"ALTER TABLE {target.qualify(table.name)} ADD COLUMN {column_sql}"
        connection.exec_driver_sql(driver_sql(connection, alter))
