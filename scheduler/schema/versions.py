"""What each schema version contains, derived from ``tables.metadata`` and the ``"since"`` tags.

One description serves both backends: the tables, their columns in order, their indexes (the
PostgreSQL-only ones are tagged ``info["dialect"]``) and the ``migrations`` history a database
at version N must hold.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Column, Connection, Index, Table
from sqlalchemy.exc import DBAPIError

from scheduler.contract.errors import invalid_argument
from scheduler.schema import ddl
from scheduler.schema.tables import ALL_TABLES, DIALECT, SINCE, metadata
from scheduler.schema.target import (
    SCHEMA_CORRUPT,
    SCHEMA_UNKNOWN,
    SchemaTarget,
    driver_autocommit,
    driver_sql,
    schema_error,
)

ColumnShape = tuple[str, str, int, int]
"""One ``PRAGMA table_info`` row as the seed compares it: (name, TYPE, notnull, pk)."""

VERSIONS: Final = tuple(sorted(ddl.MIGRATION_SQL))
_HISTORY_SQL: Final = "SELECT version, name, checksum FROM {migrations} ORDER BY version"
SCHEDULER_TABLE_NAMES: Final = frozenset(metadata.tables)


def check_version(version: object) -> int:
    """``version`` must be an integer 1..6 (``bool`` is not one), else ``SCHEDULER_INVALID_ARGUMENT``."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= VERSIONS[-1]:
        raise invalid_argument("schema version must be an integer between 1 and 6")
    return version


def since(item: Any) -> int:
    """The schema version that introduced a table, column or index (its table's, if untagged)."""
    if SINCE in item.info:
        return int(item.info[SINCE])
    table = getattr(item, "table", None)
    return since(table) if table is not None and table is not item else 1


def tables_at(version: int) -> list[Table]:
    """The tables of schema ``version``, in the canonical DDL's creation order."""
    return [table for table in ALL_TABLES if since(table) <= version]


def columns_at(table: Table, version: int) -> list[Column[Any]]:
    """The columns ``table`` has at schema ``version``, in order."""
    return [column for column in table.columns if since(column) <= version]


def exists_on(index: Index, dialect: str) -> bool:
    """Whether ``index`` is created on ``dialect`` (PostgreSQL-only indexes are tagged)."""
    return bool(index.info.get(DIALECT, dialect) == dialect)


def indexes_at(table: Table, version: int, dialect: str) -> list[Index]:
    """The named indexes of ``table`` at ``version`` on ``dialect``, sorted by name."""
    if since(table) > version:
        return []
    return sorted(
        (index for index in table.indexes if exists_on(index, dialect)), key=lambda index: str(index.name)
    )


def expected_tables(version: int) -> list[str]:
    """The user tables of schema ``version``, sorted like ``ORDER BY name``."""
    return sorted(table.name for table in tables_at(check_version(version)))


def expected_columns(table_name: str, version: int) -> list[ColumnShape]:
    """The SQLite ``table_info`` shape of ``table_name`` at schema ``version``."""
    table = metadata.tables[table_name]
    pk_order = [column.name for column in table.primary_key.columns]
    return [
        (
            column.name,
            str(column.type.compile()).upper(),
            0 if column.nullable else 1,
            pk_order.index(column.name) + 1 if column.name in pk_order else 0,
        )
        for column in columns_at(table, version)
    ]


def expected_indexes(version: int, dialect: str = "sqlite") -> list[str]:
    """The names of the indexes of schema ``version`` on ``dialect``, sorted."""
    check_version(version)
    return sorted(
        str(index.name) for table in metadata.tables.values() for index in indexes_at(table, version, dialect)
    )


def scheduler_object_names() -> frozenset[str]:
    """Every table and index name the scheduler creates at any version, on SQLite."""
    indexes = {
        str(index.name) for table in metadata.tables.values() for index in indexes_at(table, 6, "sqlite")
    }
    return SCHEDULER_TABLE_NAMES | indexes


def history_matches(rows: list[dict[str, Any]], version: int) -> bool:
    """Whether ``migrations`` rows (ordered by version) are exactly versions 1..``version``."""
    if len(rows) != version:
        return False
    return all(
        row["version"] == step
        and row["name"] == ddl.MIGRATION_NAMES[step]
        and row["checksum"] == ddl.MIGRATION_CHECKSUMS[step]
        for step, row in enumerate(rows, start=1)
    )


def version_of_history(rows: list[dict[str, Any]]) -> int:
    """The version a ``migrations`` history records (1..6); ``SCHEDULER_SCHEMA_UNKNOWN`` otherwise."""
    if 1 <= len(rows) <= VERSIONS[-1] and history_matches(rows, len(rows)):
        return len(rows)
    raise schema_error(SCHEMA_UNKNOWN, "Scheduler migration history is unknown", {"migrations": rows})


def require_history(rows: list[dict[str, Any]], version: int) -> None:
    """``migrations`` must hold exactly versions 1..``version``, else ``SCHEDULER_SCHEMA_UNKNOWN``."""
    if not history_matches(rows, version):
        raise schema_error(SCHEMA_UNKNOWN, "Scheduler migration history is unknown", {"migrations": rows})


def require_tables(actual: list[str], version: int) -> list[str]:
    """The table set must be exactly version ``version``'s, else ``SCHEDULER_SCHEMA_UNKNOWN``."""
    expected = expected_tables(version)
    if actual != expected:
        raise schema_error(
            SCHEMA_UNKNOWN,
            "Scheduler database has unknown or missing tables",
            {"expected": expected, "actual": actual},
        )
    return expected


def read_history(connection: Connection, target: SchemaTarget) -> list[dict[str, Any]]:
    """The ``migrations`` rows ordered by version; ``SCHEDULER_SCHEMA_CORRUPT`` if unreadable.

    On PostgreSQL (inside a transaction) the read runs in a SAVEPOINT, so a failed read leaves the
    caller's transaction usable (SQLite keeps its transaction after a failed statement).
    """
    sql = driver_sql(connection, _HISTORY_SQL.format(migrations=target.qualify("migrations")))
    try:
        if target.flavour.aborts_on_failure and not driver_autocommit(connection):
            with connection.begin_nested():
                rows = connection.exec_driver_sql(sql).all()
        else:
            rows = connection.exec_driver_sql(sql).all()
    except DBAPIError as cause:
        raise schema_error(
            SCHEMA_CORRUPT, "Scheduler migration history could not be read", cause=cause
        ) from cause
    return [{"version": row[0], "name": row[1], "checksum": row[2]} for row in rows]
