"""Reads and guarded writes on the two journal tables (Core expressions over ``Tx``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from sqlalchemy import Row, func, insert, select, update

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import tables as t
from scheduler.store.capabilities.domain_migrations.locators import encode_optional_source_locator
from scheduler.store.capabilities.domain_migrations.mapping import (
    map_domain_migration,
    map_domain_migration_entry,
)
from scheduler.store.capabilities.domain_migrations.plan import PlanEntry
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import DomainMigration, DomainMigrationEntry

MIGRATION_NOT_FOUND: Final = "SCHEDULER_MIGRATION_NOT_FOUND"
ROLLED_BACK: Final = "rolled_back"

m = t.domain_migrations
e = t.domain_migration_entries


def migration_error(code: str, message: str, details: Any = None) -> SchedulerKernelError:
    return SchedulerKernelError(code, message, details)


def load_migration(tx: Tx, migration_id: str) -> DomainMigration:
    """The migration with its entries (seed ``_domainMigration``); ``SCHEDULER_MIGRATION_NOT_FOUND``."""
    row = tx.first(select(m).where(m.c.migration_id == migration_id))
    if row is None:
        raise migration_error(
            MIGRATION_NOT_FOUND, f"Scheduler domain migration does not exist: {migration_id}"
        )
    rows = tx.execute(select(e).where(e.c.migration_id == migration_id).order_by(e.c.entry_id)).all()
    return map_domain_migration(row, (map_domain_migration_entry(entry) for entry in rows))


def migration_exists(tx: Tx, migration_id: str) -> bool:
    return tx.first(select(m.c.migration_id).where(m.c.migration_id == migration_id)) is not None


def load_entry_row(tx: Tx, migration_id: str, entry_id: str) -> Row[Any] | None:
    return tx.first(select(e).where(e.c.migration_id == migration_id, e.c.entry_id == entry_id))


def load_entry(tx: Tx, migration_id: str, entry_id: str) -> DomainMigrationEntry | None:
    row = load_entry_row(tx, migration_id, entry_id)
    return None if row is None else map_domain_migration_entry(row)


def reload_entry(tx: Tx, migration_id: str, entry_id: str) -> DomainMigrationEntry:
    entry = load_entry(tx, migration_id, entry_id)
    assert entry is not None
    return entry


def active_migration_id_by_source(tx: Tx, domain: str, scope_digest: str, source_id: str) -> str | None:
    """The migration holding this source in a state other than ``rolled_back``."""
    value: str | None = tx.scalar(
        select(e.c.migration_id).where(
            e.c.domain == domain,
            e.c.source_scope_digest == scope_digest,
            e.c.source_id == source_id,
            e.c.state != ROLLED_BACK,
        )
    )
    return value


def active_migration_id_by_target(tx: Tx, target_job_id: str) -> str | None:
    value: str | None = tx.scalar(
        select(e.c.migration_id).where(e.c.target_job_id == target_job_id, e.c.state != ROLLED_BACK)
    )
    return value


def list_migration_rows(tx: Tx, state: str | None, limit: int) -> list[Row[Any]]:
    query = select(m).order_by(m.c.updated_at.desc(), m.c.migration_id).limit(limit)
    if state is not None:
        query = query.where(m.c.state == state)
    return list(tx.execute(query).all())


def count_entries_not_in_state(tx: Tx, migration_id: str, state: str) -> int:
    return int(
        tx.scalar(
            select(func.count()).select_from(e).where(e.c.migration_id == migration_id, e.c.state != state)
        )
    )


def update_entry(
    tx: Tx, migration_id: str, entry_id: str | None, states: Iterable[str] | None, **values: Any
) -> int:
    """Update one entry (or every entry when ``entry_id`` is None) guarded by its current state."""
    statement = update(e).where(e.c.migration_id == migration_id).values(updated_at=tx.now, **values)
    if entry_id is not None:
        statement = statement.where(e.c.entry_id == entry_id)
    if states is not None:
        statement = statement.where(e.c.state.in_(tuple(states)))
    return tx.changes(statement)


def update_migration(tx: Tx, migration_id: str, states: Iterable[str] | None, **values: Any) -> int:
    """Update the journal row guarded by its current state (``updated_at`` is always ``now``)."""
    statement = update(m).where(m.c.migration_id == migration_id).values(updated_at=tx.now, **values)
    if states is not None:
        statement = statement.where(m.c.state.in_(tuple(states)))
    return tx.changes(statement)


def insert_migration(
    tx: Tx, migration_id: str, manifest_digest: str, manifest_json: str, entry_count: int
) -> None:
    tx.execute(
        insert(m).values(
            migration_id=migration_id,
            manifest_digest=manifest_digest,
            manifest_json=manifest_json,
            state="prepared",
            entry_count=entry_count,
            created_at=tx.now,
            updated_at=tx.now,
            completed_at=None,
            last_error_json=None,
        )
    )


def insert_entry(tx: Tx, migration_id: str, entry: PlanEntry) -> None:
    tx.execute(
        insert(e).values(
            migration_id=migration_id,
            entry_id=entry.entry_id,
            domain=entry.domain,
            source_id=entry.source_id,
            source_scope_digest=entry.source_scope_digest,
            source_locator_json=encode_optional_source_locator(entry.source_locator),
            source_digest=entry.source_digest,
            target_job_id=entry.target_job_id,
            target_job_digest=entry.target_job_digest,
            rollback_strategy=entry.rollback_strategy,
            state="prepared",
            created_at=tx.now,
            updated_at=tx.now,
        )
    )


def backfill_entry_locator(tx: Tx, migration_id: str, entry_id: str, encoded: str) -> int:
    """Store a locator on an entry that has none yet."""
    return tx.changes(
        update(e)
        .where(e.c.migration_id == migration_id, e.c.entry_id == entry_id, e.c.source_locator_json.is_(None))
        .values(source_locator_json=encoded, updated_at=tx.now)
    )


def bind_entry_locator(
    tx: Tx, migration_id: str, entry_id: str, encoded: str, source_digest: str, target_job_id: str
) -> int:
    """Store a locator on an unbound entry whose source digest and target still match."""
    return tx.changes(
        update(e)
        .where(
            e.c.migration_id == migration_id,
            e.c.entry_id == entry_id,
            e.c.source_locator_json.is_(None),
            e.c.source_digest == source_digest,
            e.c.target_job_id == target_job_id,
        )
        .values(source_locator_json=encoded, updated_at=tx.now)
    )


def retire_entry(tx: Tx, migration_id: str, entry_id: str, token: str, retirement_digest: str) -> int:
    """``retiring`` → ``retired`` for the holder of the entry's retirement token."""
    return tx.changes(
        update(e)
        .where(
            e.c.migration_id == migration_id,
            e.c.entry_id == entry_id,
            e.c.state == "retiring",
            e.c.retirement_token == token,
        )
        .values(state="retired", source_retirement_digest=retirement_digest, updated_at=tx.now)
    )


def clear_restored_digests(tx: Tx, migration_id: str) -> int:
    """Forget restoration evidence of entries whose targets were just rolled back again."""
    return tx.changes(
        update(e)
        .where(
            e.c.migration_id == migration_id,
            e.c.state == "rollback_target_disabled",
            e.c.source_restored_digest.is_not(None),
        )
        .values(source_restored_digest=None, updated_at=tx.now)
    )
