"""Catalog verification (seed: verifySchema and helpers) on SQLite, and the dispatch to PostgreSQL.

``verify_schema``, ``verify_catalog`` and ``schema_fingerprint`` take ``schema=``/``exclusive=``
(see ``target.py``) and dispatch on the connection's dialect; PostgreSQL is ``pg_catalog.py``.

SQLite layouts:

* exclusive (default; ``main`` or an attached database that is the scheduler's own file): the
  seed's checks unchanged: the whole ``sqlite_master`` catalog hashes to
  ``SCHEMA_VN_FINGERPRINT``, ``application_id``/``user_version`` are the scheduler's.
* shared (``exclusive=False``, API §8): the scheduler's objects are every ``sqlite_master`` row
  whose ``tbl_name`` is one of its tables; they must hash to ``SCHEMA_VN_FINGERPRINT`` under the
  same algorithm (an application index or trigger on a scheduler table is drift). Other objects
  are the application's and allowed, unless a name collides with one of the scheduler's
  (``SCHEDULER_SCHEMA_CORRUPT``). The version is the ``migrations`` history; integrity and
  foreign keys are checked per scheduler table; ``application_id``/``user_version`` are the
  application's and never read or written.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from scheduler.schema import ddl, pg_catalog, versions
from scheduler.schema.sqlite_file import refuse_stray_file
from scheduler.schema.target import (
    SCHEMA_CORRUPT,
    SCHEMA_UNKNOWN,
    SchemaTarget,
    resolve,
    schema_error,
)
from scheduler.schema.versions import (
    SCHEDULER_TABLE_NAMES,
    ColumnShape,
    check_version,
    expected_columns,
    expected_indexes,
    expected_tables,
    require_history,
    require_tables,
    scheduler_object_names,
    version_of_history,
)

__all__ = [
    "SCHEMA_CORRUPT",
    "SCHEMA_UNKNOWN",
    "ColumnShape",
    "assert_database_integrity",
    "expected_columns",
    "expected_indexes",
    "expected_tables",
    "list_user_tables",
    "read_pragma_int",
    "schema_error",
    "schema_fingerprint",
    "verify_catalog",
    "verify_schema",
]

Target = str | SchemaTarget | None

_USER_TABLES_SQL: Final = (
    "SELECT name FROM {master} WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)
_CATALOG_SQL: Final = (
    "SELECT type, name, tbl_name, sql FROM {master} WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
)
_INDEXES_SQL: Final = (
    "SELECT name FROM {master} WHERE type = 'index' AND name LIKE 'scheduler_%' ORDER BY name"
)
# JavaScript's ``\s`` / ``String#trim`` set (Python's ``\s`` also matches U+001C..U+001F, U+0085
# and misses U+FEFF): the fingerprint must fold exactly what the original folds.
_JS_SPACE: Final = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_WHITESPACE_RUN: Final = re.compile(f"[{_JS_SPACE}]+")
_JS_TRIM: Final = re.compile(f"^[{_JS_SPACE}]+|[{_JS_SPACE}]+$")


CatalogRow = tuple[Any, ...]
"""One ``sqlite_master`` row: (type, name, tbl_name, sql)."""


def _master(target: SchemaTarget) -> str:
    return target.qualify("sqlite_master")


# ----------------------------------------------------------------- primitive reads


def _catalog_rows(connection: Connection, target: SchemaTarget) -> list[CatalogRow]:
    return [tuple(row) for row in connection.exec_driver_sql(_CATALOG_SQL.format(master=_master(target)))]


def shared_objects(connection: Connection, target: SchemaTarget) -> list[CatalogRow]:
    """The scheduler's catalog rows in a shared file: those on one of its tables (by ``tbl_name``)."""
    return [row for row in _catalog_rows(connection, target) if row[2] in SCHEDULER_TABLE_NAMES]


def _collisions(connection: Connection, target: SchemaTarget) -> list[str]:
    """Application objects (not on a scheduler table) named like an object of the scheduler's."""
    names = scheduler_object_names()
    rows = _catalog_rows(connection, target)
    return sorted(str(row[1]) for row in rows if row[2] not in SCHEDULER_TABLE_NAMES and row[1] in names)


def list_user_tables(connection: Connection, schema: Target = None, exclusive: bool = True) -> list[str]:
    """Tables of the schema (SQLite's own ``sqlite_%`` excluded), sorted; shared: the scheduler's only.

    On PostgreSQL: the tables (ordinary, partitioned, foreign) of the scheduler schema.
    """
    target = resolve(connection, schema, exclusive)
    if target.own_schema:
        return pg_catalog.list_tables(connection, target)
    names = [
        str(row[0]) for row in connection.exec_driver_sql(_USER_TABLES_SQL.format(master=_master(target)))
    ]
    return names if target.exclusive else [name for name in names if name in SCHEDULER_TABLE_NAMES]


def read_pragma_int(connection: Connection, name: str, schema: Target = None) -> int:
    """The integer value of ``PRAGMA [schema.]name`` (``user_version``, ``application_id``; SQLite)."""
    target = resolve(connection, schema)
    return int(connection.exec_driver_sql(target.pragma(name)).scalar_one())


def _quick_check(connection: Connection, target: SchemaTarget) -> list[Any]:
    if target.exclusive:
        return [row[0] for row in connection.exec_driver_sql(target.pragma("quick_check(1)"))]
    results: list[Any] = []
    for table in list_user_tables(connection, target):
        rows = [
            row[0] for row in connection.exec_driver_sql(target.pragma(f"quick_check({json.dumps(table)})"))
        ]
        results.extend(value for value in rows if value != "ok")
    return results or ["ok"]


def assert_database_integrity(connection: Connection, schema: Target = None, exclusive: bool = True) -> None:
    """``PRAGMA quick_check`` must report exactly ``ok``, else ``SCHEDULER_SCHEMA_CORRUPT``.

    Exclusive SQLite: ``quick_check(1)`` of the database; shared: ``quick_check(table)`` of each
    scheduler table. PostgreSQL has no equivalent (the server keeps its pages): nothing to do.
    """
    target = resolve(connection, schema, exclusive)
    if not target.flavour.checks_pages:
        return
    try:
        rows = _quick_check(connection, target)
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


def _sqlite_fingerprint(rows: list[CatalogRow]) -> str:
    catalog = [
        {"type": row[0], "name": row[1], "tbl_name": row[2], "sql": _fold_js_whitespace(row[3] or "")}
        for row in rows
    ]
    encoded = json.dumps(catalog, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def schema_fingerprint(connection: Connection, schema: Target = None, exclusive: bool = True) -> str:
    """sha256 (hex) of the scheduler's catalog.

    SQLite: the seed's algorithm over the normalized ``sqlite_master`` rows (shared file: only
    the scheduler's rows). PostgreSQL: the ``pg_catalog`` description of ``pg_catalog.py``.
    """
    target = resolve(connection, schema, exclusive)
    if target.own_schema:
        return pg_catalog.fingerprint(connection, target)
    rows = _catalog_rows(connection, target) if target.exclusive else shared_objects(connection, target)
    return _sqlite_fingerprint(rows)


def _table_shape(connection: Connection, table: str, target: SchemaTarget) -> list[ColumnShape]:
    rows = connection.exec_driver_sql(target.pragma(f"table_info({json.dumps(table)})"))
    return [(str(row[1]), str(row[2] or "").upper(), int(row[3]), int(row[5])) for row in rows]


def read_history(connection: Connection, schema: Target = None) -> list[dict[str, Any]]:
    """The ``migrations`` rows ordered by version; ``SCHEDULER_SCHEMA_CORRUPT`` if unreadable."""
    return versions.read_history(connection, resolve(connection, schema))


# ----------------------------------------------------------------- verification steps (SQLite)


def _verify_tables(connection: Connection, version: int, target: Target = None) -> list[str]:
    place = resolve(connection, target)
    expected = expected_tables(version)
    actual = list_user_tables(connection, place)
    if not place.exclusive and set(actual) - set(expected):
        raise schema_error(
            SCHEMA_CORRUPT,
            "Scheduler names collide with objects of the application",
            {"collisions": sorted(set(actual) - set(expected))},
        )
    return require_tables(actual, version)


def _verify_collisions(connection: Connection, target: SchemaTarget) -> None:
    collisions = _collisions(connection, target)
    if collisions:
        raise schema_error(
            SCHEMA_CORRUPT,
            "Scheduler names collide with objects of the application",
            {"collisions": collisions},
        )


def _verify_identity(connection: Connection, version: int, target: Target = None) -> None:
    """Exclusive SQLite: ``application_id``/``user_version``; shared: the application's, skipped."""
    place = resolve(connection, target)
    if not place.exclusive:
        _verify_collisions(connection, place)
        return
    try:
        application_id = read_pragma_int(connection, "application_id", place)
        user_version = read_pragma_int(connection, "user_version", place)
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


def _verify_table_shapes(
    connection: Connection, tables: list[str], version: int, target: Target = None
) -> None:
    place = resolve(connection, target)
    for table in tables:
        expected = expected_columns(table, version)
        actual = _table_shape(connection, table, place)
        if actual != expected:
            raise schema_error(
                SCHEMA_CORRUPT,
                f"Scheduler table shape is invalid: {table}",
                {"expected": [list(c) for c in expected], "actual": [list(c) for c in actual]},
            )


def _verify_fingerprint(connection: Connection, version: int, target: Target = None) -> None:
    expected = ddl.SCHEMA_FINGERPRINTS[version]
    actual = schema_fingerprint(connection, resolve(connection, target))
    if actual != expected:
        raise schema_error(
            SCHEMA_CORRUPT,
            f"Scheduler sqlite_master catalog does not match v{version}",
            {"expected": expected, "actual": actual},
        )


def _verify_history(connection: Connection, version: int, target: Target = None) -> None:
    require_history(read_history(connection, resolve(connection, target)), version)


def _verify_indexes(connection: Connection, version: int, target: Target = None) -> None:
    place = resolve(connection, target)
    expected = expected_indexes(version)
    if place.exclusive:
        actual = [
            str(row[0]) for row in connection.exec_driver_sql(_INDEXES_SQL.format(master=_master(place)))
        ]
    else:
        actual = sorted(str(row[1]) for row in shared_objects(connection, place) if row[0] == "index")
        actual = [name for name in actual if name.startswith("scheduler_")]
    if actual != expected:
        raise schema_error(
            SCHEMA_CORRUPT,
            f"Scheduler indexes do not match v{version}",
            {"expected": expected, "actual": actual},
        )


def _foreign_key_failures(connection: Connection, target: SchemaTarget) -> list[Any]:
    if target.exclusive:
        return list(connection.exec_driver_sql(target.pragma("foreign_key_check")).fetchall())
    failures: list[Any] = []
    for table in list_user_tables(connection, target):
        failures += connection.exec_driver_sql(
            target.pragma(f"foreign_key_check({json.dumps(table)})")
        ).fetchall()
    return failures


def _verify_foreign_keys(connection: Connection, target: Target = None) -> None:
    failures = _foreign_key_failures(connection, resolve(connection, target))
    if failures:
        raise schema_error(
            SCHEMA_CORRUPT,
            "Scheduler database contains broken foreign keys",
            {"count": len(failures)},
        )


# ----------------------------------------------------------------- public verification


def verify_schema(
    connection: Connection,
    version: int = ddl.SCHEDULER_STORE_SCHEMA_VERSION,
    *,
    schema: str | None = None,
    exclusive: bool = True,
) -> None:
    """Verify the whole catalog is exactly schema ``version`` (1..6), in the seed's order.

    SQLite: quick_check → ``SCHEDULER_SCHEMA_CORRUPT``; table set → ``SCHEDULER_SCHEMA_UNKNOWN``;
    application_id / user_version (shared: name collisions, CORRUPT) → ``SCHEDULER_SCHEMA_UNKNOWN``;
    column shapes, catalog fingerprint → ``SCHEDULER_SCHEMA_CORRUPT``; migration history (rows
    and checksums) → ``SCHEDULER_SCHEMA_UNKNOWN``; index names, ``foreign_key_check`` →
    ``SCHEDULER_SCHEMA_CORRUPT``. PostgreSQL: see ``pg_catalog.verify_catalog``. ``details``
    carry the seed's keys. Read-only.
    """
    check_version(version)
    target = resolve(connection, schema, exclusive)
    assert_database_integrity(connection, target)
    verify_catalog(connection, version, schema=target.schema, exclusive=target.exclusive)


def verify_catalog(
    connection: Connection,
    version: int = ddl.SCHEDULER_STORE_SCHEMA_VERSION,
    *,
    schema: str | None = None,
    exclusive: bool = True,
) -> None:
    """Every check of :func:`verify_schema` except ``quick_check`` (for a caller that just ran it)."""
    check_version(version)
    target = resolve(connection, schema, exclusive)
    if target.own_schema:
        pg_catalog.verify_catalog(connection, version, target)
        return
    tables = _verify_tables(connection, version, target)
    _verify_identity(connection, version, target)
    _verify_table_shapes(connection, tables, version, target)
    _verify_fingerprint(connection, version, target)
    _verify_history(connection, version, target)
    _verify_indexes(connection, version, target)
    _verify_foreign_keys(connection, target)


# ----------------------------------------------------------------- inspection (SQLite)


def read_shared_version(connection: Connection, target: SchemaTarget) -> int:
    """A shared file's version: 0 without scheduler tables, else its known ``migrations`` history.

    Scheduler-named objects without a ``migrations`` table collide with the application's
    (``SCHEDULER_SCHEMA_CORRUPT``); an unknown history is ``SCHEDULER_SCHEMA_UNKNOWN``.
    """
    _verify_collisions(connection, target)
    tables = list_user_tables(connection, target)
    names = sorted({str(row[1]) for row in shared_objects(connection, target)})
    if not names:
        return 0
    if "migrations" not in tables:
        raise schema_error(
            SCHEMA_CORRUPT, "Scheduler names collide with objects of the application", {"collisions": names}
        )
    _verify_table_shapes(connection, ["migrations"], 1, target)
    return version_of_history(read_history(connection, target))


def inspect_sqlite(connection: Connection, target: SchemaTarget) -> int:
    """``inspect_database`` on SQLite (see there); a stray 1-byte file is refused first."""
    refuse_stray_file(connection, target)
    assert_database_integrity(connection, target)
    if not target.exclusive:
        version = read_shared_version(connection, target)
        if 1 <= version < ddl.SCHEDULER_STORE_SCHEMA_VERSION:
            verify_catalog(connection, version, schema=target.schema, exclusive=False)
        return version
    tables = list_user_tables(connection, target)
    if not tables:
        return 0
    if "migrations" not in tables:
        raise schema_error(
            SCHEMA_UNKNOWN,
            "Refusing a non-empty database without scheduler migration history",
            {"tables": tables},
        )
    user_version = read_pragma_int(connection, "user_version", target)
    latest = ddl.SCHEDULER_STORE_SCHEMA_VERSION
    if 1 <= user_version < latest:
        verify_schema(connection, user_version, schema=target.schema)
        return user_version
    if user_version == latest:
        return user_version
    verify_schema(connection, latest, schema=target.schema)
    raise schema_error(  # unreachable: verify_schema refuses a foreign user_version
        SCHEMA_UNKNOWN,
        "Scheduler schema version or application identity is unknown",
        {"applicationId": read_pragma_int(connection, "application_id", target), "userVersion": user_version},
    )
