"""Offline (``--sql``) scripts: the upgrade steps as SQL text that never leaves a refused database.

A script is generated without a database, for the state it assumes (empty, or at version N):

* every step first checks that assumption *at run time* (a guard) and stops the whole script
  with a clear message if it does not hold, so a script run against another state changes
  nothing: SQLite scripts are for the ``sqlite3`` shell and start with ``.bail on`` (its
  first error ends the run and the open transaction is rolled back); PostgreSQL scripts are for
  ``psql`` (``\\set ON_ERROR_STOP on``; an error inside ``BEGIN`` aborts the transaction anyway);
* each step is the same DDL ``apply_step`` runs online (SQLite: the canonical text; PostgreSQL:
  ``pg_ddl``'s constructs compiled for the target schema), its ``migrations`` row, and on an
  exclusive SQLite file ``PRAGMA user_version`` (step 1: ``application_id``);
* the v2 authority backfill rewrites stored JSON with canonical encodings and digests that SQL
  cannot compute. Its effect on a v1 database holding no jobs and no occurrences is nothing, so
  the v2 step carries a guard that refuses a v1 database with such rows (upgrade it online);
* an attached SQLite database cannot be addressed by a script (its ``ATTACH`` belongs to the
  application's connection): refused when the script is asked for.

The caller wraps the statements in one transaction (:func:`offline_script` does, for the CLI;
an Alembic environment emits its own ``BEGIN``/``COMMIT`` where its dialect has transactional DDL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateColumn

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.schema import ddl, pg_ddl
from scheduler.schema import tables as t
from scheduler.schema.target import FLAVOURS, SchemaTarget, quote_identifier
from scheduler.schema.upgrade import (
    LATEST_VERSION,
    UPGRADE_STEPS,
    ddl_statements,
    qualified_statement,
    validate_now,
)

OFFLINE_REFUSED: Final = "SCHEDULER_INVALID_ARGUMENT"
GUARD_TABLE: Final = "scheduler_offline_guard"
_PG_DIALECT: Final = postgresql.dialect()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Guard:
    """A run-time precondition: ``condition`` (SQL, true when it holds) else stop with ``message``."""

    condition: str
    message: str


def offline_target(dialect: str, schema: str | None = None, exclusive: bool = True) -> SchemaTarget:
    """A :class:`SchemaTarget` for a script (no connection); refuses what a script cannot address.

    ``SCHEDULER_INVALID_ARGUMENT``: another dialect, ``exclusive=False`` on PostgreSQL, or an
    SQLite schema other than ``main`` (an attached database exists only on the application's
    connection).
    """
    flavour = FLAVOURS.get(dialect)
    if flavour is None:
        raise invalid_argument(f"offline scripts support SQLite and PostgreSQL, not {dialect}")
    name = flavour.default_schema if schema is None else schema
    if not isinstance(name, str) or not name or "\x00" in name:
        raise invalid_argument("schema must be a non-empty string")
    if flavour.own_schema and not exclusive:
        raise invalid_argument("exclusive=False applies to SQLite only")
    if not flavour.own_schema and name.lower() != flavour.default_schema:
        raise invalid_argument(
            f"An offline script cannot address the attached SQLite database {name!r}: its ATTACH "
            "belongs to the application's connection. Run the upgrade online (alembic without "
            "--sql, or open_store)."
        )
    return SchemaTarget(dialect, name if flavour.own_schema else flavour.default_schema, exclusive)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# ----------------------------------------------------------------- guards


def _scheduler_names_sql() -> str:
    names = sorted({table.name for table in t.ALL_TABLES})
    return ", ".join(_literal(name) for name in names)


def _empty_guard(target: SchemaTarget) -> Guard:
    if target.own_schema:
        condition = (
            "NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            f"ON n.oid = c.relnamespace WHERE n.nspname = {_literal(target.schema)})"
        )
        where = f"schema {target.schema!r}"
    elif target.exclusive:
        condition = (
            "(SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%') = 0"
        )
        where = "database"
    else:
        condition = f"(SELECT count(*) FROM sqlite_master WHERE tbl_name IN ({_scheduler_names_sql()})) = 0"
        where = "database (shared file)"
    return Guard(
        condition,
        f"scheduler: this script creates the scheduler schema and needs a {where} without "
        "scheduler tables; nothing was changed (upgrade this database online)",
    )


def _version_guard(target: SchemaTarget, version: int) -> Guard:
    expected = version - 1
    if target.own_schema:
        migrations = f"{quote_identifier(target.schema)}.migrations"
        condition = (
            f"to_regclass({_literal(migrations)}) IS NOT NULL AND "
            f"(SELECT coalesce(max(version), 0) FROM {migrations}) = {expected}"
        )
    elif target.exclusive:
        condition = f"(SELECT user_version FROM pragma_user_version) = {expected}"
    else:
        condition = f"(SELECT coalesce(max(version), 0) FROM migrations) = {expected}"
    return Guard(
        condition,
        f"scheduler: step v{version} of this script needs a v{expected} database; "
        "nothing was changed (generate the script for the database's current version)",
    )


def _backfill_guard(target: SchemaTarget) -> Guard:
    jobs, occurrences = target.qualify("jobs"), target.qualify("occurrences")
    return Guard(
        f"NOT EXISTS (SELECT 1 FROM {jobs}) AND NOT EXISTS (SELECT 1 FROM {occurrences})",
        "scheduler: the v2 authority backfill rewrites existing jobs and occurrences, which an "
        "offline script cannot do; nothing was changed (upgrade this v1 database online)",
    )


def _guard_statements(guard: Guard, target: SchemaTarget, label: str) -> list[str]:
    if target.flavour.script_blocks:
        return [
            f"DO $scheduler$ BEGIN IF NOT ({guard.condition}) THEN "
            f"RAISE EXCEPTION {_literal(guard.message)}; END IF; END $scheduler$"
        ]
    # SQLite has no RAISE outside a trigger: a TEMP trigger on a TEMP table refuses the insert.
    trigger = f"temp.{GUARD_TABLE}_{label}"
    return [
        f"CREATE TEMP TABLE IF NOT EXISTS {GUARD_TABLE} (ok INTEGER NOT NULL)",
        f"CREATE TRIGGER {trigger} BEFORE INSERT ON {GUARD_TABLE} WHEN NOT NEW.ok "
        f"BEGIN SELECT RAISE(ABORT, {_literal(guard.message)}); END",
        f"INSERT INTO temp.{GUARD_TABLE} (ok) SELECT ({guard.condition})",
        f"DROP TRIGGER {trigger}",
    ]


# ----------------------------------------------------------------- steps


def _ddl(version: int, target: SchemaTarget) -> list[str]:
    if not target.own_schema:
        return [qualified_statement(s, target) for s in ddl_statements(ddl.MIGRATION_SQL[version])]
    translate = {None: target.schema}
    statements = [
        str(
            statement.compile(
                dialect=_PG_DIALECT, schema_translate_map=translate, render_schema_translate=True
            )
        ).strip()
        for statement in pg_ddl.step_statements(version)
    ]
    for table, column in pg_ddl.added_columns(version):
        column_sql = CreateColumn(column).compile(dialect=_PG_DIALECT)
        statements.append(f"ALTER TABLE {target.qualify(table.name)} ADD COLUMN {column_sql}")
    return statements


def _migration_row(version: int, now: int, target: SchemaTarget) -> str:
    step = UPGRADE_STEPS[version - 1]
    return (
        f"INSERT INTO {target.qualify('migrations')} (version, name, checksum, applied_at) VALUES "
        f"({int(step.version)}, {_literal(step.name)}, {_literal(step.checksum)}, {int(now)})"
    )


def step_statements(version: int, now: int, target: SchemaTarget) -> list[str]:
    """The statements of step ``version`` (guards first), without a terminating ``;``."""
    statements = _guard_statements(
        _empty_guard(target) if version == 1 else _version_guard(target, version), target, f"v{version}"
    )
    if target.own_schema:
        classid, objid = pg_ddl.lock_key(target.schema)
        statements.append(
            f"DO $scheduler$ BEGIN PERFORM pg_advisory_xact_lock({classid}, {objid}); END $scheduler$"
        )
        if version == 1:
            statements.append(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(target.schema)}")
    statements += _ddl(version, target)
    if version == 2:
        statements += _guard_statements(_backfill_guard(target), target, "v2_backfill")
    statements.append(_migration_row(version, now, target))
    if target.owns_file_header:
        if version == 1:
            statements.append(f"PRAGMA application_id = {int(ddl.SCHEDULER_APPLICATION_ID)}")
        statements.append(f"PRAGMA user_version = {int(version)}")
    return statements


def upgrade_statements(
    target: SchemaTarget, from_version: int, now: int, to_version: int = LATEST_VERSION
) -> list[str]:
    """Every statement from ``from_version`` (0 = empty) to ``to_version``, guards included."""
    validate_now(now)
    if not 0 <= from_version <= to_version <= LATEST_VERSION:
        raise invalid_argument(f"cannot script an upgrade from v{from_version} to v{to_version}")
    statements: list[str] = []
    for version in range(from_version + 1, to_version + 1):
        statements += step_statements(version, now, target)
    if statements and not target.flavour.script_blocks:
        statements.append(f"DROP TABLE IF EXISTS temp.{GUARD_TABLE}")
    return statements


def offline_script(
    target: SchemaTarget, from_version: int, now: int, to_version: int = LATEST_VERSION
) -> str:
    """A complete script for ``sqlite3``/``psql``: preamble, ONE transaction, every step, COMMIT."""
    statements = upgrade_statements(target, from_version, now, to_version)
    head = [target.flavour.script_preamble, target.flavour.script_begin]
    body = [statement + ";" for statement in statements]
    return "\n".join([*head, *body, "COMMIT;"]) + "\n"


def refusal(message: str) -> SchedulerKernelError:
    """The error a ``--sql`` request that cannot be scripted raises (nothing is printed)."""
    return invalid_argument(message)


__all__ = [
    "Guard",
    "offline_script",
    "offline_target",
    "refusal",
    "step_statements",
    "upgrade_statements",
]
