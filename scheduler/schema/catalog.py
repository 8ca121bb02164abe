"""Catalog verification of a scheduler SQLite database (seed: verifySchema and helpers).

What each schema version must contain (tables, their ``table_info`` shape, index names) is
derived from ``tables.metadata`` and the ``"since"`` version recorded on each table and column;
the catalog text itself is pinned by ``SCHEMA_VN_FINGERPRINT``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import ddl
from scheduler.schema.tables import SINCE, metadata

SCHEMA_CORRUPT: Final = "SCHEDULER_SCHEMA_CORRUPT"
SCHEMA_UNKNOWN: Final = "SCHEDULER_SCHEMA_UNKNOWN"

ColumnShape = tuple[str, str, int, int]
"""One ``PRAGMA table_info`` row as the seed compares it: (name, TYPE, notnull, pk)."""

_USER_TABLES_SQL: Final = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)
_CATALOG_SQL: Final = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
)
_INDEXES_SQL: Final = (
    "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'scheduler_%' ORDER BY name"
)
_MIGRATIONS_SQL: Final = "SELECT version, name, checksum FROM migrations ORDER BY version"
# JavaScript's ``\s`` / ``String#trim`` set (Python's ``\s`` also matches U+001C..U+001F, U+0085
# and misses U+FEFF): the fingerprint must fold exactly what the original folds.
_JS_SPACE: Final = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_WHITESPACE_RUN: Final = re.compile(f"[{_JS_SPACE}]+")
_JS_TRIM: Final = re.compile(f"^[{_JS_SPACE}]+|[{_JS_SPACE}]+$")


def schema_error(
    code: str, message: str, details: Any = None, cause: BaseException | None = None
) -> SchedulerKernelError:
    """A ``SCHEDULER_SCHEMA_*`` error, chaining ``cause`` like the seed's ``schemaError``."""
    error = SchedulerKernelError(code, message, details)
    error.__cause__ = cause
    return error


def _check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= 6:
        raise SchedulerKernelError(
            "SCHEDULER_INVALID_ARGUMENT", "schema version must be an integer between 1 and 6"
        )
    return version


# ----------------------------------------------------------------- expectations per version


def _since(item: Any) -> int:
    return int(item.info.get(SINCE, 1))


def _tables(version: int) -> list[Table]:
    return [table for table in metadata.tables.values() if _since(table) <= version]


def expected_tables(version: int) -> list[str]:
    """The user tables of schema ``version``, sorted like ``ORDER BY name``."""
    return sorted(table.name for table in _tables(_check_version(version)))


def expected_columns(table_name: str, version: int) -> list[ColumnShape]:
    """The ``table_info`` shape of ``table_name`` at schema ``version``."""
    table = metadata.tables[table_name]
    pk_order = [column.name for column in table.primary_key.columns]
    return [
        (
            column.name,
            str(column.type.compile()).upper(),
            0 if column.nullable else 1,
            pk_order.index(column.name) + 1 if column.name in pk_order else 0,
        )
        for column in table.columns
        if _since(column) <= version
    ]


def expected_indexes(version: int) -> list[str]:
    """The names of the ``scheduler_%`` indexes of schema ``version``, sorted."""
    names = [str(index.name) for table in _tables(_check_version(version)) for index in table.indexes]
    return sorted(names)


# ----------------------------------------------------------------- primitive reads


def list_user_tables(connection: Connection) -> list[str]:
    """Names of the tables in ``sqlite_master`` (SQLite's own ``sqlite_%`` excluded), sorted."""
    return [str(row[0]) for row in connection.exec_driver_sql(_USER_TABLES_SQL)]


def read_pragma_int(connection: Connection, name: str) -> int:
    """The integer value of ``PRAGMA name`` (``user_version``, ``application_id``)."""
    return int(connection.exec_driver_sql(f"PRAGMA {name}").scalar_one())


def assert_database_integrity(connection: Connection) -> None:
    """``PRAGMA quick_check(1)`` must report exactly ``ok``, else ``SCHEDULER_SCHEMA_CORRUPT``."""
    try:
        rows = [row[0] for row in connection.exec_driver_sql("PRAGMA quick_check(1)")]
    except DBAPIError as cause:
        raise schema_error(
            SCHEMA_CORRUPT, "Scheduler database integrity check could not run", cause=cause
        ) from cause
    if rows != ["ok"]:
        raise schema_error(
            SCHEMA_CORRUPT,
            "Scheduler database failed SQLite quick_check",
            {"result": [{"quick_check": value} for value in rows]},
        )


def _fold_js_whitespace(sql: str) -> str:
    """``sql.replace(/\\s+/g, " ").trim()`` with JavaScript's whitespace set."""
    return _JS_TRIM.sub("", _JS_WHITESPACE_RUN.sub(" ", sql))


def schema_fingerprint(connection: Connection) -> str:
    """sha256 (hex) of the normalized ``sqlite_master`` catalog, as the seed computes it."""
    catalog = [
        {
            "type": row[0],
            "name": row[1],
            "tbl_name": row[2],
            "sql": _fold_js_whitespace(row[3] or ""),
        }
        for row in connection.exec_driver_sql(_CATALOG_SQL)
    ]
    encoded = json.dumps(catalog, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def _table_shape(connection: Connection, table: str) -> list[ColumnShape]:
    rows = connection.exec_driver_sql(f"PRAGMA table_info({json.dumps(table)})")
    return [(str(row[1]), str(row[2] or "").upper(), int(row[3]), int(row[5])) for row in rows]


# ----------------------------------------------------------------- verification steps


def _verify_tables(connection: Connection, version: int) -> list[str]:
    expected = expected_tables(version)
    actual = list_user_tables(connection)
    if actual != expected:
        raise schema_error(
            SCHEMA_UNKNOWN,
            "Scheduler database has unknown or missing tables",
            {"expected": expected, "actual": actual},
        )
    return expected


def _verify_identity(connection: Connection, version: int) -> None:
    try:
        application_id = read_pragma_int(connection, "application_id")
        user_version = read_pragma_int(connection, "user_version")
    except DBAPIError as cause:
        raise schema_error(
            SCHEMA_CORRUPT, "Scheduler schema metadata could not be read", cause=cause
        ) from cause
    if application_id != ddl.SCHEDULER_APPLICATION_ID or user_version != version:
        raise schema_error(
            SCHEMA_UNKNOWN,
            "Scheduler schema version or application identity is unknown",
            {"applicationId": application_id, "userVersion": user_version},
        )


def _verify_table_shapes(connection: Connection, tables: list[str], version: int) -> None:
    for table in tables:
        expected = expected_columns(table, version)
        actual = _table_shape(connection, table)
        if actual != expected:
            raise schema_error(
                SCHEMA_CORRUPT,
                f"Scheduler table shape is invalid: {table}",
                {"expected": [list(c) for c in expected], "actual": [list(c) for c in actual]},
            )


def _verify_fingerprint(connection: Connection, version: int) -> None:
    expected = ddl.SCHEMA_FINGERPRINTS[version]
    actual = schema_fingerprint(connection)
    if actual != expected:
        raise schema_error(
            SCHEMA_CORRUPT,
            f"Scheduler sqlite_master catalog does not match v{version}",
            {"expected": expected, "actual": actual},
        )


def _history_matches(rows: list[dict[str, Any]], version: int) -> bool:
    if len(rows) != version:
        return False
    return all(
        row["version"] == step
        and row["name"] == ddl.MIGRATION_NAMES[step]
        and row["checksum"] == ddl.MIGRATION_CHECKSUMS[step]
        for step, row in enumerate(rows, start=1)
    )


def _verify_history(connection: Connection, version: int) -> None:
    try:
        rows = [
            {"version": row[0], "name": row[1], "checksum": row[2]}
            for row in connection.exec_driver_sql(_MIGRATIONS_SQL)
        ]
    except DBAPIError as cause:
        raise schema_error(
            SCHEMA_CORRUPT, "Scheduler migration history could not be read", cause=cause
        ) from cause
    if not _history_matches(rows, version):
        raise schema_error(SCHEMA_UNKNOWN, "Scheduler migration history is unknown", {"migrations": rows})


def _verify_indexes(connection: Connection, version: int) -> None:
    expected = expected_indexes(version)
    actual = [str(row[0]) for row in connection.exec_driver_sql(_INDEXES_SQL)]
    if actual != expected:
        raise schema_error(
            SCHEMA_CORRUPT,
            f"Scheduler indexes do not match v{version}",
            {"expected": expected, "actual": actual},
        )


def _verify_foreign_keys(connection: Connection) -> None:
    failures = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if failures:
        raise schema_error(
            SCHEMA_CORRUPT,
            "Scheduler database contains broken foreign keys",
            {"count": len(failures)},
        )


def verify_schema(connection: Connection, version: int = ddl.SCHEDULER_STORE_SCHEMA_VERSION) -> None:
    """Verify the whole catalog is exactly schema ``version`` (1..6), in the seed's order.

    quick_check → ``SCHEDULER_SCHEMA_CORRUPT``; table set → ``SCHEDULER_SCHEMA_UNKNOWN``;
    application_id / user_version → ``SCHEDULER_SCHEMA_UNKNOWN``; column shapes,
    catalog fingerprint → ``SCHEDULER_SCHEMA_CORRUPT``; migration history (rows and
    checksums) → ``SCHEDULER_SCHEMA_UNKNOWN``; index names, ``foreign_key_check`` →
    ``SCHEDULER_SCHEMA_CORRUPT``. ``details`` carry the seed's keys. Read-only.
    """
    _check_version(version)
    assert_database_integrity(connection)
    verify_catalog(connection, version)


def verify_catalog(connection: Connection, version: int = ddl.SCHEDULER_STORE_SCHEMA_VERSION) -> None:
    """Every check of :func:`verify_schema` except ``quick_check`` (for a caller that just ran it)."""
    _check_version(version)
    tables = _verify_tables(connection, version)
    _verify_identity(connection, version)
    _verify_table_shapes(connection, tables, version)
    _verify_fingerprint(connection, version)
    _verify_history(connection, version)
    _verify_indexes(connection, version)
    _verify_foreign_keys(connection)
