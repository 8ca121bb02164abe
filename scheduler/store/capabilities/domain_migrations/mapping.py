"""Journal rows to ``DomainMigration`` / ``DomainMigrationEntry`` records.

Seed: ``mapDomainMigrationEntry`` and ``mapDomainMigration``. A stored source locator is validated
again on every read (bound to the row's domain and scope digest, legacy automation ``current``
scope allowed); anything wrong with it is ``SCHEDULER_DATA_CORRUPT``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Row

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.capabilities.domain_migrations.locators import (
    normalize_source_locator,
    source_locator_digest,
)
from scheduler.store.plumbing.rows import DATA_CORRUPT, data_corrupt, read_optional_json, read_stored_json
from scheduler.store.records import DomainMigration, DomainMigrationEntry

LOCATOR_LABEL = "scheduler migration source locator"


def read_stored_source_locator(row: Row[Any]) -> dict[str, Any] | None:
    """The entry's stored locator, re-validated; damage is ``SCHEDULER_DATA_CORRUPT``."""
    if row.source_locator_json is None:
        return None
    try:
        return normalize_source_locator(
            read_stored_json(row.source_locator_json, LOCATOR_LABEL),
            row.domain,
            row.source_scope_digest,
            LOCATOR_LABEL,
            allow_legacy_automation_current=True,
        )
    except SchedulerKernelError as cause:
        if cause.code == DATA_CORRUPT:
            raise
        raise data_corrupt(
            "Stored scheduler migration source locator is invalid or unbound", cause
        ) from cause


def map_domain_migration_entry(row: Row[Any]) -> DomainMigrationEntry:
    locator = read_stored_source_locator(row)
    return DomainMigrationEntry(
        migration_id=row.migration_id,
        entry_id=row.entry_id,
        domain=row.domain,
        source_id=row.source_id,
        source_scope_digest=row.source_scope_digest,
        source_locator=locator,
        source_locator_digest=None if locator is None else source_locator_digest(locator),
        source_digest=row.source_digest,
        target_job_id=row.target_job_id,
        target_job_digest=row.target_job_digest,
        rollback_strategy=row.rollback_strategy,
        state=row.state,
        target_action=row.target_action,
        target_before=read_optional_json(row.target_before_json, "scheduler migration target before"),
        target_applied_revision=row.target_applied_revision,
        target_applied_at=row.target_applied_at,
        target_occurrence_count_before=row.target_occurrence_count_before,
        target_execution_event_count_before=row.target_execution_event_count_before,
        target_rollback_revision=row.target_rollback_revision,
        retirement_token=row.retirement_token,
        source_retirement_digest=row.source_retirement_digest,
        source_restored_digest=row.source_restored_digest,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def map_domain_migration(
    row: Row[Any], entries: Iterable[DomainMigrationEntry] | None = None
) -> DomainMigration:
    """The migration record; ``entries=None`` leaves them out (as ``listDomainMigrations`` does)."""
    return DomainMigration(
        id=row.migration_id,
        manifest_digest=row.manifest_digest,
        manifest=read_stored_json(row.manifest_json, "scheduler migration manifest"),
        state=row.state,
        entry_count=row.entry_count,
        created_at=row.created_at,
        updated_at=row.updated_at,
        completed_at=row.completed_at,
        last_error=read_optional_json(row.last_error_json, "scheduler migration error"),
        entries=None if entries is None else tuple(entries),
    )
