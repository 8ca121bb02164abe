"""Create or upgrade the scheduler schema to v6 (seed: initializeOrVerifySchema), on both backends.

The upgrade is one ordered list of steps, ``UPGRADE_STEPS``; step N takes a valid vN-1 database
to a valid vN database: it runs the DDL of version N (SQLite: the canonical text; PostgreSQL:
``pg_ddl``, derived from the same Core tables), v2 also runs the seed's authority backfill
(``backfill.py``, dialect-free Core), then records the ``migrations`` row with
``applied_at = now``. On an exclusive SQLite database it also sets ``PRAGMA user_version = N``
(step 1: ``application_id``); a shared SQLite file and a PostgreSQL schema keep their version in
the ``migrations`` table alone. Nothing here begins or commits: the caller owns the write
transaction (``BEGIN IMMEDIATE`` on SQLite, a READ COMMITTED transaction on PostgreSQL), so a
failed upgrade leaves the database untouched.

Every function takes ``schema=`` (``None``: ``"main"`` / ``"scheduler"``) and ``exclusive=``
(SQLite only), see ``target.py``.

``inspect_database`` performs the seed's refusal checks before an upgrade and tells from which
version to start; ``apply_upgrade`` runs the steps; ``apply_step`` runs one (Alembic revisions);
``initialize_or_upgrade`` does the whole open-time sequence in the caller's transaction.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, insert

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema import ddl, pg_catalog, pg_ddl
from scheduler.schema import tables as t
from scheduler.schema.backfill import backfill_authority_v2
from scheduler.schema.catalog import (
    inspect_sqlite,
    list_user_tables,
    read_pragma_int,
    read_shared_version,
    shared_objects,
    verify_catalog,
    verify_schema,
)
from scheduler.schema.target import (
    SCHEMA_UNKNOWN,
    SchemaTarget,
    driver_autocommit,
    resolve,
    schema_error,
    sqlite_driver_in_transaction,
)

_STATEMENT_END: Final = re.compile(r";[ \t]*(?:\n|$)")
_CREATED_NAME: Final = re.compile(r"^(CREATE TABLE |CREATE INDEX |CREATE UNIQUE INDEX |ALTER TABLE )(\w+)")

StepFunction = Callable[[Connection, int, SchemaTarget], None]


@dataclass(frozen=True)
class UpgradeStep:
    """One schema version: its ``migrations`` row and how to apply it to a vN-1 database."""

    version: int
    name: str
    checksum: str
    apply: StepFunction


# ----------------------------------------------------------------- DDL


def ddl_statements(sql: str) -> list[str]:
    """Split a canonical migration text into its statements (each ends with ``;`` at a line end).

    pysqlite executes one statement per call; ``executescript`` would COMMIT first, so the
    texts are split instead (they contain no ``;`` inside a statement).
    """
    return [part.strip() for part in _STATEMENT_END.split(sql) if part.strip()]


def qualified_statement(statement: str, target: SchemaTarget) -> str:
    """A canonical statement addressed to ``target``'s database (unchanged for ``main``).

    SQLite stores the created object's SQL without the schema qualifier, so the attached
    database's catalog text is the canonical one.
    """
    return _CREATED_NAME.sub(lambda m: f"{m.group(1)}{target.qualify(m.group(2))}", statement, count=1)


def _run_ddl(connection: Connection, version: int, target: SchemaTarget) -> None:
    if target.own_schema:
        pg_ddl.run_step_ddl(connection, version, target)
        return
    for statement in ddl_statements(ddl.MIGRATION_SQL[version]):
        connection.exec_driver_sql(qualified_statement(statement, target))


def _create_v1(connection: Connection, now: int, target: SchemaTarget) -> None:
    if target.own_schema:
        pg_ddl.create_schema(connection, target)
    _run_ddl(connection, 1, target)
    if target.owns_file_header:
        connection.exec_driver_sql(target.pragma(f"application_id = {int(ddl.SCHEDULER_APPLICATION_ID)}"))


def _ddl_only(version: int) -> StepFunction:
    def apply(connection: Connection, now: int, target: SchemaTarget) -> None:
        _run_ddl(connection, version, target)

    apply.__name__ = f"apply_v{version}"
    return apply


def migrate_authority_v2(connection: Connection, now: int, target: SchemaTarget | None = None) -> None:
    """Schema v2: the authority tables plus the seed's ``migrateAuthorityV2`` backfill."""
    place = resolve(connection, target)
    _run_ddl(connection, 2, place)
    with place.bound(connection) as bound:
        backfill_authority_v2(bound, now)


# ----------------------------------------------------------------- the ordered steps


UPGRADE_STEPS: Final[tuple[UpgradeStep, ...]] = tuple(
    UpgradeStep(
        version,
        ddl.MIGRATION_NAMES[version],
        ddl.MIGRATION_CHECKSUMS[version],
        {1: _create_v1, 2: migrate_authority_v2}.get(version) or _ddl_only(version),
    )
    for version in sorted(ddl.MIGRATION_SQL)
)
"""Schema versions 1..6 in order; ``UPGRADE_STEPS[n - 1].version == n``."""

LATEST_VERSION: Final = UPGRADE_STEPS[-1].version


# ----------------------------------------------------------------- validation helpers


def wall_clock_ms() -> int:
    """The current wall-clock time in epoch milliseconds (the default ``now``)."""
    return time.time_ns() // 1_000_000


def validate_now(now: object) -> int:
    """``now`` must be epoch milliseconds: a non-negative safe integer (``bool`` is not one)."""
    return normalize_epoch_ms(now, "now")


def _validate_version(value: object, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid_argument(f"{field} must be an integer between {low} and {high}")
    return value


def _require_transaction(connection: Connection, target: SchemaTarget) -> None:
    """Refuse to run DDL outside a real transaction (it would not be atomic)."""
    if target.own_schema:
        if connection.in_transaction() and not driver_autocommit(connection):
            return
        raise invalid_argument(
            "Scheduler schema upgrade must run inside an open transaction (not autocommit) on PostgreSQL"
        )
    if sqlite_driver_in_transaction(connection) is False:
        raise invalid_argument(
            "Scheduler schema upgrade must run inside an open write transaction (BEGIN IMMEDIATE)"
        )


def _current_version(connection: Connection, target: SchemaTarget) -> int:
    if target.own_schema:
        return pg_catalog.recorded_version(connection, target)
    if target.exclusive:
        return read_pragma_int(connection, "user_version", target)
    return read_shared_version(connection, target)


def _existing_objects(connection: Connection, target: SchemaTarget) -> dict[str, Any]:
    """What step 1 finds in its way: every table (exclusive SQLite), the scheduler's objects
    (shared SQLite) or every object of the schema (PostgreSQL)."""
    if target.own_schema:
        tables = pg_catalog.list_tables(connection, target)
        objects = pg_catalog.list_objects(connection, target)
        return {"tables": tables, "objects": objects} if tables or objects else {}
    if target.exclusive:
        tables = list_user_tables(connection, target)
        return {"tables": tables} if tables else {}
    names = sorted({row[1] for row in shared_objects(connection, target)})
    return {"objects": names} if names else {}


def _require_version(connection: Connection, version: int, target: SchemaTarget) -> None:
    """Step 1 needs a database without tables (any header, as the seed); step N a vN-1 one."""
    if version == 1:
        found = _existing_objects(connection, target)
        if found:
            raise schema_error(
                SCHEMA_UNKNOWN, "Refusing to create the scheduler schema in a non-empty database", found
            )
        return
    current = _current_version(connection, target)
    if current != version - 1:
        raise schema_error(
            SCHEMA_UNKNOWN,
            f"Scheduler schema step v{version} needs a v{version - 1} database",
            {"expected": version - 1, "actual": current},
        )


# ----------------------------------------------------------------- public API


def inspect_database(connection: Connection, *, schema: str | None = None, exclusive: bool = True) -> int:
    """Return the schema version to upgrade from (0 = empty) after the seed's refusal checks.

    Integrity must pass (SQLite ``quick_check``; per scheduler table when shared); a non-empty
    database (shared SQLite: any object of the scheduler's; PostgreSQL: any object in the
    schema) needs a ``migrations`` table (``SCHEDULER_SCHEMA_UNKNOWN``, details
    ``{"tables": [...]}``); a v1..v5 database is verified exactly as that version; for v6 the
    caller verifies (``verify_schema``). The version is ``user_version`` on an exclusive SQLite
    database and the ``migrations`` history otherwise. A stray 1-byte file, which SQLite itself
    takes for an empty database, is ``SCHEDULER_SCHEMA_CORRUPT`` like any file that is not an
    SQLite database. Read-only.
    """
    target = resolve(connection, schema, exclusive)
    if target.own_schema:
        return pg_catalog.inspect(connection, target)
    return inspect_sqlite(connection, target)


def apply_step(
    connection: Connection, version: int, now: int, *, schema: str | None = None, exclusive: bool = True
) -> None:
    """Take a valid v``version - 1`` database to v``version`` (inside the caller's transaction).

    Runs the step and inserts its ``migrations`` row (``applied_at = now``); on an exclusive
    SQLite database also sets ``PRAGMA user_version = version`` (step 1: ``application_id``).
    On PostgreSQL it first takes the schema's advisory lock and step 1 creates the schema if
    absent. Refuses (``SCHEDULER_SCHEMA_UNKNOWN``) when the database is not at ``version - 1``
    or, for step 1, when it already has objects in the way.
    """
    _validate_version(version, "version", 1, LATEST_VERSION)
    validate_now(now)
    target = resolve(connection, schema, exclusive)
    _require_transaction(connection, target)
    if target.own_schema:
        pg_ddl.lock_schema(connection, target)
    _require_version(connection, version, target)
    step = UPGRADE_STEPS[version - 1]
    step.apply(connection, now, target)
    with target.bound(connection) as bound:
        bound.execute(
            insert(t.migrations).values(
                version=step.version, name=step.name, checksum=step.checksum, applied_at=now
            )
        )
    if target.owns_file_header:
        connection.exec_driver_sql(target.pragma(f"user_version = {int(step.version)}"))


def apply_upgrade(
    connection: Connection,
    from_version: int,
    now: int,
    to_version: int = LATEST_VERSION,
    *,
    schema: str | None = None,
    exclusive: bool = True,
) -> None:
    """Run every step after ``from_version`` up to ``to_version`` (default 6) in order.

    ``from_version`` is what ``inspect_database`` returned (0 = create from empty). The result
    equals the seed's one-transaction upgrade: tables, backfill, one ``migrations`` row per
    step with ``applied_at = now`` (and, exclusive SQLite, ``application_id`` when created from
    empty and ``user_version = to_version``). Does not begin or commit.
    """
    _validate_version(from_version, "from_version", 0, LATEST_VERSION)
    _validate_version(to_version, "to_version", from_version, LATEST_VERSION)
    validate_now(now)
    target = resolve(connection, schema, exclusive)
    for step in UPGRADE_STEPS[from_version:to_version]:
        apply_step(connection, step.version, now, schema=target.schema, exclusive=target.exclusive)


def initialize_or_upgrade(
    connection: Connection, *, now: int, schema: str | None = None, exclusive: bool = True
) -> int:
    """Bring the scheduler schema to v6 inside the caller's write transaction; return the start version.

    Inspect (refusing what the seed refuses), then create or upgrade, then verify the whole v6
    catalog. SQLite: the caller's transaction must be ``BEGIN IMMEDIATE`` (the write lock makes
    inspect-then-upgrade atomic). PostgreSQL: a READ COMMITTED transaction; when something is
    to be done the schema's advisory lock is taken and the schema re-inspected under it, so of
    two processes opening an empty or older schema one creates or upgrades it and the other
    waits, then verifies; an unlocked inspection that another process's upgrade changed under
    it is decided again under the lock. Raises ``SCHEDULER_SCHEMA_*`` (nothing written: the
    caller rolls back).
    """
    validate_now(now)
    target = resolve(connection, schema, exclusive)
    try:
        version = inspect_database(connection, schema=target.schema, exclusive=target.exclusive)
        if version == LATEST_VERSION:
            verify_catalog(connection, LATEST_VERSION, schema=target.schema, exclusive=target.exclusive)
            return version
    except SchedulerKernelError as refusal:
        if not _may_be_a_concurrent_upgrade(refusal, target):
            raise
    _require_transaction(connection, target)
    if target.own_schema:
        pg_ddl.lock_schema(connection, target)
        version = inspect_database(connection, schema=target.schema)
    apply_upgrade(connection, version, now, schema=target.schema, exclusive=target.exclusive)
    verify_schema(connection, LATEST_VERSION, schema=target.schema, exclusive=target.exclusive)
    return version


def _may_be_a_concurrent_upgrade(refusal: SchedulerKernelError, target: SchemaTarget) -> bool:
    """Whether a refusal of the unlocked inspection is decided again under the schema's lock.

    On PostgreSQL (READ COMMITTED) each statement of the inspection reads the latest commit, so
    another process's upgrade committing between two of them shows half the old catalog and half
    the new one. Once the lock is held (that upgrade committed), the inspection is repeated and
    its answer stands. A check that could not run (a driver error) is not repeated: the
    transaction is aborted. On SQLite the caller's transaction is one snapshot already.
    """
    return (
        target.flavour.latest_per_statement
        and refusal.code.startswith("SCHEDULER_SCHEMA_")
        and refusal.__cause__ is None
    )


__all__ = [
    "LATEST_VERSION",
    "UPGRADE_STEPS",
    "UpgradeStep",
    "apply_step",
    "apply_upgrade",
    "ddl_statements",
    "initialize_or_upgrade",
    "inspect_database",
    "migrate_authority_v2",
    "qualified_statement",
    "validate_now",
    "wall_clock_ms",
]
