"""The scheduler's catalog on PostgreSQL: description, fingerprint, verification (API §8).

The fingerprint is the sha256 of a canonical JSON description of the scheduler schema read from
``pg_catalog``, independent of the schema's name:

* per table (ordinary, partitioned or foreign): its kind, persistence and row-security flags;
  its columns in order as ``[name, format_type, not-null, default, collation]`` (an identity or
  generated column's "default" is that clause); its constraints of type p/u/f/c by name with
  ``pg_get_constraintdef``; its indexes by name with ``pg_get_indexdef`` minus the schema
  qualifier (and whether the index is valid); its non-internal triggers and its rules;
* every other object in the schema (sequences, views, composite types, functions, types,
  collations, operators) as ``[kind, name]``.

Object references that ``pg_catalog`` renders relative to ``search_path`` (foreign-key targets,
``nextval('…'::regclass)`` defaults) are read with ``search_path`` set to the schema alone, so they
come out unqualified; ``pg_get_indexdef``/``pg_get_triggerdef`` always qualify their table, and
exactly that ``ON <schema>.`` qualifier is removed. The schema's name never enters the text.

The version of a PostgreSQL schema is its ``migrations`` table (there is no ``user_version``):
it must hold exactly the rows 1..N of the known history, and the catalog must then hash to
``SCHEMA_VN_PG_FINGERPRINT``. The schema must hold the scheduler's objects and nothing else.
There is no ``quick_check``: page integrity is the server's job, and foreign keys are always
enforced (a constraint added ``NOT VALID`` shows in its definition).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from sqlalchemy import Connection, Integer, text

from scheduler.schema import ddl
from scheduler.schema.tables import metadata
from scheduler.schema.target import (
    SCHEMA_CORRUPT,
    SCHEMA_UNKNOWN,
    SchemaTarget,
    driver_autocommit,
    schema_error,
)
from scheduler.schema.versions import (
    check_version,
    columns_at,
    read_history,
    require_history,
    require_tables,
    version_of_history,
)

PgColumnShape = tuple[str, str, bool]
"""A column as the table-shape check compares it: (name, format_type, not-null)."""

TABLE_KINDS: Final = ("r", "p", "f")
_KIND_NAMES: Final = {"S": "sequence", "v": "view", "m": "materialized view", "c": "composite type"}

_NAMESPACE: Final = text(
    "SELECT oid, quote_ident(nspname) FROM pg_catalog.pg_namespace WHERE nspname = :schema"
)
# The one-byte "char" columns (relkind, contype, …) are read as text: asyncpg returns "char" as bytes.
_RELATIONS: Final = text(
    "SELECT c.relname, c.relkind::text, c.relpersistence::text, c.relrowsecurity, c.relforcerowsecurity "
    "FROM pg_catalog.pg_class c WHERE c.relnamespace = :ns ORDER BY c.relname"
)
_COLUMNS: Final = text(
    "SELECT r.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, "
    "pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text, co.collname "
    "FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class r ON r.oid = a.attrelid "
    "LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation "
    "WHERE r.relnamespace = :ns AND r.relkind IN ('r', 'p', 'f') AND a.attnum > 0 "
    "AND NOT a.attisdropped ORDER BY r.relname, a.attnum"
)
_CONSTRAINTS: Final = text(
    "SELECT r.relname, con.conname, con.contype::text, pg_catalog.pg_get_constraintdef(con.oid) "
    "FROM pg_catalog.pg_constraint con JOIN pg_catalog.pg_class r ON r.oid = con.conrelid "
    "WHERE r.relnamespace = :ns AND con.contype IN ('p', 'u', 'f', 'c') ORDER BY r.relname, con.conname"
)
_INDEXES: Final = text(
    "SELECT r.relname, i.relname, pg_catalog.pg_get_indexdef(x.indexrelid), x.indisvalid "
    "FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid "
    "JOIN pg_catalog.pg_class r ON r.oid = x.indrelid "
    "WHERE r.relnamespace = :ns ORDER BY r.relname, i.relname"
)
_TRIGGERS: Final = text(
    "SELECT r.relname, t.tgname, pg_catalog.pg_get_triggerdef(t.oid) "
    "FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class r ON r.oid = t.tgrelid "
    "WHERE r.relnamespace = :ns AND NOT t.tgisinternal ORDER BY r.relname, t.tgname"
)
_RULES: Final = text(
    "SELECT r.relname, w.rulename, pg_catalog.pg_get_ruledef(w.oid) "
    "FROM pg_catalog.pg_rewrite w JOIN pg_catalog.pg_class r ON r.oid = w.ev_class "
    "WHERE r.relnamespace = :ns AND w.rulename <> '_RETURN' ORDER BY r.relname, w.rulename"
)
# Objects in the schema that are not relations: functions, standalone types (a table's row type
# and array types are excluded), collations and operators.
_OTHER_OBJECTS: Final = text(
    "SELECT 'function', p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')' "
    "FROM pg_catalog.pg_proc p WHERE p.pronamespace = :ns "
    "UNION ALL SELECT 'type', t.typname FROM pg_catalog.pg_type t "
    "WHERE t.typnamespace = :ns AND t.typrelid = 0 AND t.typelem = 0 "
    "UNION ALL SELECT 'collation', c.collname FROM pg_catalog.pg_collation c WHERE c.collnamespace = :ns "
    "UNION ALL SELECT 'operator', o.oprname FROM pg_catalog.pg_operator o WHERE o.oprnamespace = :ns"
)


# ----------------------------------------------------------------- reading pg_catalog


def namespace(connection: Connection, target: SchemaTarget) -> tuple[int, str] | None:
    """(oid, ``quote_ident(name)``) of the schema, or ``None`` when it does not exist."""
    row = connection.execute(_NAMESPACE, {"schema": target.schema}).first()
    return None if row is None else (int(row[0]), str(row[1]))


def list_tables(connection: Connection, target: SchemaTarget) -> list[str]:
    """Names of the tables (ordinary, partitioned, foreign) in the schema, sorted."""
    found = namespace(connection, target)
    if found is None:
        return []
    rows = connection.execute(_RELATIONS, {"ns": found[0]})
    return sorted(str(row[0]) for row in rows if row[1] in TABLE_KINDS)


def list_objects(connection: Connection, target: SchemaTarget) -> list[list[str]]:
    """``[kind, name]`` of every object in the schema that is not a table or an index."""
    found = namespace(connection, target)
    if found is None:
        return []
    relations = [
        [_KIND_NAMES.get(str(row[1]), f"relkind {row[1]}"), str(row[0])]
        for row in connection.execute(_RELATIONS, {"ns": found[0]})
        if row[1] not in (*TABLE_KINDS, "i", "I")
    ]
    others = [[str(row[0]), str(row[1])] for row in connection.execute(_OTHER_OBJECTS, {"ns": found[0]})]
    return sorted(relations + others)


@contextmanager
def _search_path(connection: Connection, quoted_schema: str) -> Iterator[None]:
    """``search_path`` = the schema alone for the enclosed reads, then the previous value again.

    Transaction-local inside a transaction; on a driver in autocommit mode (no transaction block
    for ``SET LOCAL`` to last in) the session value, restored afterwards.
    """
    local = not driver_autocommit(connection)
    previous = connection.exec_driver_sql("SELECT current_setting('search_path')").scalar_one()
    statement = text("SELECT set_config('search_path', :path, :local)")
    connection.execute(statement, {"path": quoted_schema, "local": local})
    try:
        yield
    finally:
        connection.execute(statement, {"path": previous, "local": local})


def _default(expression: Any, identity: str, generated: str) -> str | None:
    if identity:
        return "generated always as identity" if identity == "a" else "generated by default as identity"
    if generated:
        return f"generated always as ({expression}) stored"
    return None if expression is None else str(expression)


def _unqualified(definition: str, quoted_schema: str) -> str:
    """``pg_get_indexdef``/``pg_get_triggerdef`` text without the ``ON <schema>.`` qualifier."""
    for on in (" ON ", " ON ONLY "):
        definition = definition.replace(f"{on}{quoted_schema}.", on, 1)
    return definition


def _new_table(row: Any) -> dict[str, Any]:
    return {
        "kind": str(row[1]),
        "persistence": str(row[2]),
        "rowSecurity": [bool(row[3]), bool(row[4])],
        "columns": [],
        "constraints": [],
        "indexes": [],
        "triggers": [],
        "rules": [],
    }


def describe(connection: Connection, target: SchemaTarget) -> dict[str, Any]:
    """The canonical, schema-name-independent description the fingerprint hashes."""
    found = namespace(connection, target)
    if found is None:
        return {"tables": {}, "objects": []}
    oid, quoted = found
    params = {"ns": oid}
    with _search_path(connection, quoted):
        relations = connection.execute(_RELATIONS, params).all()
        tables = {str(row[0]): _new_table(row) for row in relations if row[1] in TABLE_KINDS}

        def add(part: str, query: Any, entry: Any) -> None:
            # Indexes, triggers and rules of a view or materialized view: that relation is already
            # an unexpected object of its own.
            for row in connection.execute(query, params):
                if row[0] in tables:
                    tables[row[0]][part].append(entry(row))

        add("columns", _COLUMNS, lambda r: [r[1], r[2], bool(r[3]), _default(r[4], r[5], r[6]), r[7]])
        add("constraints", _CONSTRAINTS, lambda r: [r[1], r[2], r[3]])
        add("indexes", _INDEXES, lambda r: [r[1], _unqualified(r[2], quoted), bool(r[3])])
        add("triggers", _TRIGGERS, lambda r: [r[1], _unqualified(r[2], quoted)])
        add("rules", _RULES, lambda r: [r[1], r[2]])
    return {"tables": tables, "objects": list_objects(connection, target)}


def fingerprint(connection: Connection, target: SchemaTarget) -> str:
    """sha256 (hex) of :func:`describe` as sorted, compact JSON."""
    encoded = json.dumps(
        describe(connection, target), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------- verification


def expected_shape(table_name: str, version: int) -> list[PgColumnShape]:
    """(name, format_type, not-null) of each column of ``table_name`` at ``version``."""
    table = metadata.tables[table_name]
    return [
        (
            column.name,
            "bigint" if isinstance(column.type, Integer) else "text",
            bool(column.primary_key or not column.nullable),
        )
        for column in columns_at(table, version)
    ]


def _actual_shapes(connection: Connection, target: SchemaTarget) -> dict[str, list[PgColumnShape]]:
    found = namespace(connection, target)
    shapes: dict[str, list[PgColumnShape]] = {}
    if found is not None:
        for row in connection.execute(_COLUMNS, {"ns": found[0]}):
            shapes.setdefault(str(row[0]), []).append((str(row[1]), str(row[2]), bool(row[3])))
    return shapes


def verify_tables(connection: Connection, version: int, target: SchemaTarget) -> list[str]:
    return require_tables(list_tables(connection, target), version)


def verify_shapes(connection: Connection, tables: list[str], version: int, target: SchemaTarget) -> None:
    shapes = _actual_shapes(connection, target)
    for table in tables:
        expected = expected_shape(table, version)
        actual = shapes.get(table, [])
        if actual != expected:
            raise schema_error(
                SCHEMA_CORRUPT,
                f"Scheduler table shape is invalid: {table}",
                {"expected": [list(c) for c in expected], "actual": [list(c) for c in actual]},
            )


def verify_history(connection: Connection, version: int, target: SchemaTarget) -> None:
    require_history(read_history(connection, target), version)


def verify_fingerprint(connection: Connection, version: int, target: SchemaTarget) -> None:
    expected = ddl.PG_SCHEMA_FINGERPRINTS[version]
    actual = fingerprint(connection, target)
    if actual != expected:
        raise schema_error(
            SCHEMA_CORRUPT,
            f"Scheduler pg_catalog description does not match v{version}",
            {"expected": expected, "actual": actual},
        )


def verify_catalog(connection: Connection, version: int, target: SchemaTarget) -> None:
    """Tables (UNKNOWN), history (UNKNOWN), column shapes (CORRUPT), fingerprint (CORRUPT). Read-only.

    The history stands where SQLite checks ``application_id``/``user_version`` (the seed's order);
    the ``migrations`` table's own shape is checked before it is read.
    """
    check_version(version)
    tables = verify_tables(connection, version, target)
    verify_shapes(connection, ["migrations"], version, target)
    verify_history(connection, version, target)
    verify_shapes(connection, tables, version, target)
    verify_fingerprint(connection, version, target)


def recorded_version(connection: Connection, target: SchemaTarget) -> int:
    """The version the ``migrations`` history records (0 = an empty or absent schema).

    A schema with objects but no ``migrations`` table is ``SCHEDULER_SCHEMA_UNKNOWN``
    (``{"tables", "objects"}``), so is a history that is not versions 1..N of the known one.
    Reads only the history, not the rest of the catalog.
    """
    tables = list_tables(connection, target)
    objects = list_objects(connection, target)
    if not tables and not objects:
        return 0
    if "migrations" not in tables:
        raise schema_error(
            SCHEMA_UNKNOWN,
            "Refusing a non-empty database without scheduler migration history",
            {"tables": tables, "objects": objects},
        )
    verify_shapes(connection, ["migrations"], 1, target)
    return version_of_history(read_history(connection, target))


def inspect(connection: Connection, target: SchemaTarget) -> int:
    """The version to upgrade from (0 = no schema or an empty one), after the refusal checks.

    :func:`recorded_version`, then a v1..v5 schema is verified exactly as that version; for v6
    the caller verifies. Read-only.
    """
    version = recorded_version(connection, target)
    if 1 <= version < ddl.SCHEDULER_STORE_SCHEMA_VERSION:
        verify_catalog(connection, version, target)
    return version
