"""Create or upgrade a scheduler SQLite database to schema v6 (seed: initializeOrVerifySchema).

The upgrade is one ordered list of steps, ``UPGRADE_STEPS``; step N takes a valid vN-1 database
to a valid vN database: it runs the canonical DDL text of version N (v2 also runs the seed's
authority backfill, ``migrateAuthorityV2``), records the ``migrations`` row with
``applied_at = now`` and sets ``PRAGMA user_version = N`` (step 1 also sets the
``application_id``). Nothing here begins or commits: the caller owns the write transaction
(``BEGIN IMMEDIATE``), so a failed upgrade leaves the file untouched.

``inspect_database`` performs the seed's refusal checks before an upgrade and tells from which
version to start; ``apply_upgrade`` runs the steps; ``apply_step`` runs one (Alembic revisions).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, insert, select, update

from scheduler.contract.authority import normalize_authority_envelope
from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import (
    DEFAULT_AUTHORITY_MAX_RUNS,
    DEFAULT_AUTHORITY_MAX_UNITS,
    DEFAULT_AUTHORITY_WINDOW_MS,
    TERMINAL_STATUSES,
)
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import normalize_epoch_ms, utf16_sorted
from scheduler.schema import ddl
from scheduler.schema import tables as t
from scheduler.schema.catalog import (
    SCHEMA_UNKNOWN,
    assert_database_integrity,
    list_user_tables,
    read_pragma_int,
    schema_error,
    verify_schema,
)

DATA_CORRUPT: Final = "SCHEDULER_DATA_CORRUPT"
SCHEDULER_POLICY_REVISION_REF: Final = "scheduler-authority:1"
"""The ``authorizationRefs.schedulerPolicyRevision`` the v2 backfill binds every live authority to."""

_STATEMENT_END: Final = re.compile(r";[ \t]*(?:\n|$)")


@dataclass(frozen=True)
class UpgradeStep:
    """One schema version: its ``migrations`` row and how to apply it to a vN-1 database."""

    version: int
    name: str
    checksum: str
    apply: Callable[[Connection, int], None]


# ----------------------------------------------------------------- DDL


def ddl_statements(sql: str) -> list[str]:
    """Split a canonical migration text into its statements (each ends with ``;`` at a line end).

    pysqlite executes one statement per call; ``executescript`` would COMMIT first, so the
    texts are split instead (they contain no ``;`` inside a statement).
    """
    return [part.strip() for part in _STATEMENT_END.split(sql) if part.strip()]


def _run_ddl(connection: Connection, version: int) -> None:
    for statement in ddl_statements(ddl.MIGRATION_SQL[version]):
        connection.exec_driver_sql(statement)


def _create_v1(connection: Connection, now: int) -> None:
    _run_ddl(connection, 1)
    connection.exec_driver_sql(f"PRAGMA application_id = {int(ddl.SCHEDULER_APPLICATION_ID)}")


def _ddl_only(version: int) -> Callable[[Connection, int], None]:
    def apply(connection: Connection, now: int) -> None:
        _run_ddl(connection, version)

    apply.__name__ = f"apply_v{version}"
    return apply


# ----------------------------------------------------------------- v2 authority backfill


def _data_corrupt(message: str, cause: BaseException | None = None) -> SchedulerKernelError:
    error = SchedulerKernelError(DATA_CORRUPT, message)
    error.__cause__ = cause
    return error


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def _read_stored_authority(encoded: str, field: str) -> dict[str, Any]:
    """The seed's ``readStoredAuthority``: parse and normalize, else ``SCHEDULER_DATA_CORRUPT``."""
    try:
        value = json.loads(encoded, parse_constant=_reject_constant)
    except (TypeError, ValueError) as cause:
        raise _data_corrupt(f"Stored {field} is not valid JSON", cause) from cause
    try:
        return normalize_authority_envelope(value)
    except SchedulerKernelError as cause:
        if cause.code == DATA_CORRUPT:
            raise
        raise _data_corrupt(f"Stored {field} does not match authority envelope v1", cause) from cause
    except (TypeError, ValueError) as cause:
        raise _data_corrupt(f"Stored {field} does not match authority envelope v1", cause) from cause


class _PolicyCollector:
    """Principals seen by the backfill, in first-seen order, with their capability union."""

    def __init__(self) -> None:
        self.policies: dict[str, tuple[dict[str, Any], set[str]]] = {}

    def bind(self, encoded: str, field: str) -> dict[str, Any]:
        """Record the authority's principal and capabilities; return it bound to the policy."""
        authority = _read_stored_authority(encoded, field)
        principal = authority["principal"]
        key = canonical_json(principal, f"{field}.principal")
        _, capabilities = self.policies.setdefault(key, (principal, set()))
        capabilities.update(authority["requestedCapabilities"])
        refs = dict(authority.get("authorizationRefs") or {})
        refs["schedulerPolicyRevision"] = SCHEDULER_POLICY_REVISION_REF
        return {**authority, "authorizationRefs": refs}

    def rows(self, now: int) -> list[dict[str, Any]]:
        """One ``scheduler_authority_policies`` row per principal, in first-seen order."""
        return [
            {
                "principal_type": principal["type"],
                "principal_id": principal["id"],
                "revision": 1,
                "enabled": 1,
                "capabilities_json": canonical_json(
                    utf16_sorted(capabilities), "authorityPolicy.capabilities"
                ),
                "window_ms": DEFAULT_AUTHORITY_WINDOW_MS,
                "max_runs": DEFAULT_AUTHORITY_MAX_RUNS,
                "max_units": DEFAULT_AUTHORITY_MAX_UNITS,
                "created_at": now,
                "updated_at": now,
            }
            for principal, capabilities in self.policies.values()
        ]


def _bind_jobs(connection: Connection, collector: _PolicyCollector) -> list[tuple[str, dict[str, Any]]]:
    rows = connection.execute(
        select(t.jobs.c.job_id, t.jobs.c.authority_json).order_by(t.jobs.c.job_id)
    ).all()
    return [(row.job_id, collector.bind(row.authority_json, f"job {row.job_id} authority")) for row in rows]


def _bind_occurrences(
    connection: Connection, collector: _PolicyCollector
) -> list[tuple[str, dict[str, Any]]]:
    """Bind every non-terminal occurrence; terminal ones are validated but not rewritten."""
    occ = t.occurrences.c
    rows = connection.execute(
        select(occ.occurrence_id, occ.status, occ.authority_json).order_by(occ.occurrence_id)
    ).all()
    bound: list[tuple[str, dict[str, Any]]] = []
    for row in rows:
        field = f"occurrence {row.occurrence_id} authority"
        if row.status in TERMINAL_STATUSES:
            _read_stored_authority(row.authority_json, field)
        else:
            bound.append((row.occurrence_id, collector.bind(row.authority_json, field)))
    return bound


def migrate_authority_v2(connection: Connection, now: int) -> None:
    """Schema v2: the authority tables plus the seed's ``migrateAuthorityV2`` backfill.

    Every job and every non-terminal occurrence gets a policy for its principal (capabilities:
    the sorted union of what they request; default window and budgets; timestamps ``now``)
    and its stored authority bound to ``schedulerPolicyRevision = "scheduler-authority:1"``.
    Terminal occurrences are validated (``SCHEDULER_DATA_CORRUPT``) but left as they are.
    """
    _run_ddl(connection, 2)
    collector = _PolicyCollector()
    bound_jobs = _bind_jobs(connection, collector)
    bound_occurrences = _bind_occurrences(connection, collector)
    policy_rows = collector.rows(now)
    if policy_rows:
        connection.execute(insert(t.authority_policies), policy_rows)
    for job_id, authority in bound_jobs:
        connection.execute(
            update(t.jobs)
            .where(t.jobs.c.job_id == job_id)
            .values(authority_json=canonical_json(authority, "job.authority"))
        )
    for occurrence_id, authority in bound_occurrences:
        connection.execute(
            update(t.occurrences)
            .where(t.occurrences.c.occurrence_id == occurrence_id)
            .values(authority_json=canonical_json(authority, "occurrence.authority"))
        )


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


def _require_transaction(connection: Connection) -> None:
    """Refuse to run DDL outside a real SQLite transaction (it would not be atomic)."""
    driver = connection.connection.dbapi_connection
    if getattr(driver, "in_transaction", True) is False:
        raise invalid_argument(
            "Scheduler schema upgrade must run inside an open write transaction (BEGIN IMMEDIATE)"
        )


def _require_version(connection: Connection, version: int) -> None:
    """Step 1 needs a database without tables (any header, as the seed); step N a vN-1 header."""
    if version == 1:
        tables = list_user_tables(connection)
        if tables:
            raise schema_error(
                SCHEMA_UNKNOWN,
                "Refusing to create the scheduler schema in a non-empty database",
                {"tables": tables},
            )
        return
    current = read_pragma_int(connection, "user_version")
    if current != version - 1:
        raise schema_error(
            SCHEMA_UNKNOWN,
            f"Scheduler schema step v{version} needs a v{version - 1} database",
            {"expected": version - 1, "actual": current},
        )


# ----------------------------------------------------------------- public API


def inspect_database(connection: Connection) -> int:
    """Return the schema version to upgrade from (0 = empty) after the seed's refusal checks.

    quick_check must pass; a non-empty database needs a ``migrations`` table
    (``SCHEDULER_SCHEMA_UNKNOWN``, details ``{"tables": [...]}``); a v1..v5 database is
    verified exactly as that version; for v6 the caller verifies (``verify_schema``); any other
    ``user_version`` raises what ``verify_schema(connection, 6)`` raises. Read-only.
    """
    assert_database_integrity(connection)
    tables = list_user_tables(connection)
    if not tables:
        return 0
    if "migrations" not in tables:
        raise schema_error(
            SCHEMA_UNKNOWN,
            "Refusing a non-empty database without scheduler migration history",
            {"tables": tables},
        )
    user_version = read_pragma_int(connection, "user_version")
    if 1 <= user_version < LATEST_VERSION:
        verify_schema(connection, user_version)
        return user_version
    if user_version == LATEST_VERSION:
        return user_version
    verify_schema(connection, LATEST_VERSION)
    raise schema_error(  # unreachable: verify_schema refuses a foreign user_version
        SCHEMA_UNKNOWN,
        "Scheduler schema version or application identity is unknown",
        {"applicationId": read_pragma_int(connection, "application_id"), "userVersion": user_version},
    )


def apply_step(connection: Connection, version: int, now: int) -> None:
    """Take a valid v``version - 1`` database to v``version`` (inside the caller's transaction).

    Runs the step, inserts its ``migrations`` row (``applied_at = now``) and sets
    ``PRAGMA user_version = version``; step 1 also sets ``PRAGMA application_id``.
    Refuses (``SCHEDULER_SCHEMA_UNKNOWN``) when ``user_version`` is not ``version - 1`` or,
    for step 1, when the database already has tables.
    """
    _validate_version(version, "version", 1, LATEST_VERSION)
    validate_now(now)
    _require_transaction(connection)
    _require_version(connection, version)
    step = UPGRADE_STEPS[version - 1]
    step.apply(connection, now)
    connection.execute(
        insert(t.migrations).values(
            version=step.version, name=step.name, checksum=step.checksum, applied_at=now
        )
    )
    connection.exec_driver_sql(f"PRAGMA user_version = {int(step.version)}")


def apply_upgrade(
    connection: Connection, from_version: int, now: int, to_version: int = LATEST_VERSION
) -> None:
    """Run every step after ``from_version`` up to ``to_version`` (default 6) in order.

    ``from_version`` is what ``inspect_database`` returned (0 = create from empty). The result
    equals the seed's one-transaction upgrade: tables, backfill, one ``migrations`` row per
    step with ``applied_at = now``, ``application_id`` when created from empty, and
    ``user_version = to_version``. Does not begin or commit.
    """
    _validate_version(from_version, "from_version", 0, LATEST_VERSION)
    _validate_version(to_version, "to_version", from_version, LATEST_VERSION)
    validate_now(now)
    for step in UPGRADE_STEPS[from_version:to_version]:
        apply_step(connection, step.version, now)
