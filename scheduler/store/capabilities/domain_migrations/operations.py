"""Public domain-migration methods of ``SchedulerStore``.

Each method validates its arguments (nothing touches the database before that), then runs one
transition of ``journal.py`` in one write transaction, or one read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from scheduler.contract.constants import SCHEDULER_MIGRATION_DOMAINS, SCHEDULER_MIGRATION_STATES
from scheduler.contract.digests import scheduler_migration_scope_digest, scheduler_migration_source_digest
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import MISSING, is_safe_int, normalize_sha256_digest
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.domain_migrations import journal
from scheduler.store.capabilities.domain_migrations import queries as q
from scheduler.store.capabilities.domain_migrations.mapping import map_domain_migration
from scheduler.store.capabilities.domain_migrations.plan import normalize_domain_migration_plan
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import DomainMigration, DomainMigrationEntry

T = TypeVar("T")

DEFAULT_MIGRATION_LIST_LIMIT = 50
MAX_MIGRATION_LIST_LIMIT = 200


def _migration_id(value: object) -> str:
    return normalize_key(value, "migrationId")


def _supplied_sources(sources: object) -> dict[str, str]:
    """``[{entryId, source}, ...]`` → ``{entryId: source digest}`` (duplicates refused)."""
    if not isinstance(sources, list):
        raise invalid_argument("sources must be an array")
    supplied: dict[str, str] = {}
    for index, item in enumerate(sources):
        if not isinstance(item, Mapping):
            raise invalid_argument(f"sources[{index}] must be an object")
        entry_id = normalize_key(item.get("entryId"), f"sources[{index}].entryId")
        if entry_id in supplied:
            raise invalid_argument("sources contains duplicate migration entries")
        supplied[entry_id] = scheduler_migration_source_digest(item.get("source", MISSING))
    return supplied


def _optional_token(value: object) -> str | None:
    return None if value is None else normalize_key(value, "retirementToken")


def _list_limit(limit: object) -> int:
    if not is_safe_int(limit):
        raise invalid_argument("limit must be an integer")
    return min(MAX_MIGRATION_LIST_LIMIT, max(1, int(limit)))


def _list_state(state: object) -> str | None:
    if state is None:
        return None
    normalized = normalize_key(state, "state", 32)
    if normalized not in SCHEDULER_MIGRATION_STATES:
        raise invalid_argument("state is not a scheduler migration state")
    return normalized


class DomainMigrationOperations(StoreBase):
    """Public methods of ``SchedulerStore`` for the domain migration journal."""

    def _migration_write(self, migration_id: str, operation: Callable[[Tx], T]) -> T:
        """A write on one migration: its journal is held first, so concurrent calls on the same
        migration run as in some serial order (``journal.lock_migration``)."""

        def locked(tx: Tx) -> T:
            journal.lock_migration(tx, migration_id)
            return operation(tx)

        return self._write(locked)

    def prepare_domain_migration(self, plan: Any) -> DomainMigration:
        """Journal a plan ``{"entries": [...]}`` as a new attempt (or return the active one)."""
        normalized = normalize_domain_migration_plan(plan)
        return self._write(lambda tx: journal.prepare(tx, normalized))

    def apply_domain_migration(self, migration_id: str) -> DomainMigration:
        """Create, update or reuse every target job, staged disabled."""
        identifier = _migration_id(migration_id)
        return self._migration_write(identifier, lambda tx: journal.apply(tx, identifier))

    def verify_domain_migration(self, migration_id: str, *, sources: Any) -> DomainMigration:
        """Check every legacy source (``[{"entryId", "source"}]``) and target is unchanged."""
        identifier = _migration_id(migration_id)
        supplied = _supplied_sources(sources)
        return self._migration_write(identifier, lambda tx: journal.verify(tx, identifier, supplied))

    def begin_domain_migration_retirement(self, migration_id: str) -> DomainMigration:
        """Issue one retirement token per entry."""
        identifier = _migration_id(migration_id)
        return self._migration_write(identifier, lambda tx: journal.begin_retirement(tx, identifier))

    def confirm_domain_migration_entry_retired(
        self, *, migration_id: str, entry_id: str, retirement_token: str, source: Any
    ) -> DomainMigrationEntry:
        """Record one retired source (``source`` is its retired form, a JSON value)."""
        identifier = _migration_id(migration_id)
        entry = normalize_key(entry_id, "entryId")
        token = normalize_key(retirement_token, "retirementToken")
        digest = scheduler_migration_source_digest(source)
        return self._migration_write(
            identifier, lambda tx: journal.confirm_retired(tx, identifier, entry, token, digest)
        )

    def begin_domain_migration_rollback(self, migration_id: str) -> DomainMigration:
        """Enter ``rolling_back`` and roll every target back (disable or restore)."""
        identifier = _migration_id(migration_id)
        return self._migration_write(identifier, lambda tx: journal.begin_rollback(tx, identifier))

    def rollback_domain_migration_targets(self, migration_id: str) -> DomainMigration:
        """Repeat the target rollback of a migration that is rolling back."""
        identifier = _migration_id(migration_id)
        return self._migration_write(identifier, lambda tx: journal.continue_rollback(tx, identifier))

    def restore_domain_migration_entry_source(
        self,
        *,
        migration_id: str,
        entry_id: str,
        retirement_token: str | None = None,
        restore_source: Callable[[], Any],
    ) -> DomainMigrationEntry:
        """Run ``restore_source()`` inside the write transaction; its result must match the source digest.

        ``retirement_token=None`` means the entry never received a token. The callable must be
        synchronous: an awaitable result is ``SCHEDULER_INVALID_ARGUMENT``.
        """
        if not callable(restore_source):
            raise invalid_argument("restoreSource must be a function")
        identifier = _migration_id(migration_id)
        entry = normalize_key(entry_id, "entryId")
        token = _optional_token(retirement_token)
        return self._migration_write(
            identifier, lambda tx: journal.restore_source(tx, identifier, entry, token, restore_source)
        )

    def confirm_domain_migration_entry_source_restored(
        self, *, migration_id: str, entry_id: str, retirement_token: str | None = None, source: Any
    ) -> DomainMigrationEntry:
        """Record a source the caller already restored (``source`` is the restored JSON value)."""
        return self.restore_domain_migration_entry_source(
            migration_id=migration_id,
            entry_id=entry_id,
            retirement_token=retirement_token,
            restore_source=lambda: source,
        )

    def get_domain_migration(self, migration_id: str) -> DomainMigration:
        """The migration with its entries (``SCHEDULER_MIGRATION_NOT_FOUND`` if absent)."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = _migration_id(migration_id)
        return self._read(lambda tx: q.load_migration(tx, identifier))

    def list_domain_migrations(self, *, state: str | None = None, limit: int = 50) -> list[DomainMigration]:
        """Migrations (without entries), most recently updated first; ``limit`` clamped to 1..200."""
        self._assert_open()  # seed: a read checks the store before its arguments
        normalized_state = _list_state(state)
        bounded = _list_limit(limit)

        def read(tx: Tx) -> list[DomainMigration]:
            return [map_domain_migration(row) for row in q.list_migration_rows(tx, normalized_state, bounded)]

        return self._read(read)

    def get_active_domain_migration_by_source(
        self, *, domain: str, source_scope: Any, source_id: str
    ) -> DomainMigration | None:
        """The migration currently holding this legacy source (not rolled back), or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        if not isinstance(domain, str) or domain not in SCHEDULER_MIGRATION_DOMAINS:
            raise invalid_argument("domain must be a supported scheduler migration domain")
        scope_digest = scheduler_migration_scope_digest(source_scope)
        identifier = normalize_key(source_id, "sourceId")

        def read(tx: Tx) -> DomainMigration | None:
            found = q.active_migration_id_by_source(tx, domain, scope_digest, identifier)
            return None if found is None else q.load_migration(tx, found)

        return self._read(read)

    def bind_domain_migration_source_locator(
        self,
        *,
        migration_id: str,
        entry_id: str,
        source_locator: Any,
        expected_source_digest: str,
        expected_target_job_id: str,
    ) -> DomainMigrationEntry:
        """Bind a typed source locator to an entry, given its source digest and target as evidence."""
        identifier = _migration_id(migration_id)
        entry = normalize_key(entry_id, "entryId")
        digest = normalize_sha256_digest(expected_source_digest, "expectedSourceDigest")
        target = normalize_key(expected_target_job_id, "expectedTargetJobId")
        return self._migration_write(
            identifier, lambda tx: journal.bind_locator(tx, identifier, entry, source_locator, digest, target)
        )
