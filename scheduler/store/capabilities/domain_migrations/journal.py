"""The journal state machine: one function per transition, each run inside one write ``Tx``.

Migration states: prepared → applied → verified → retiring → retired, and from any of those
rolling_back → rolled_back. Entry states follow (plus ``rollback_target_disabled``). Every
transition re-reads the journal, fails closed on any drift, and is idempotent when repeated
(``deduplicated: True``). Arguments arrive already validated (see ``operations.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy.exc import IntegrityError

from scheduler.contract.canonical import canonical_json
from scheduler.contract.digests import scheduler_migration_source_digest
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.store.capabilities.domain_migrations import queries as q
from scheduler.store.capabilities.domain_migrations import targets
from scheduler.store.capabilities.domain_migrations.locators import (
    encode_source_locator,
    normalize_source_locator,
)
from scheduler.store.capabilities.domain_migrations.mapping import map_domain_migration_entry
from scheduler.store.capabilities.domain_migrations.plan import MigrationPlan, PlanEntry, attempt_manifest
from scheduler.store.capabilities.domain_migrations.queries import migration_error
from scheduler.store.capabilities.jobs import load_job
from scheduler.store.plumbing.rows import data_corrupt
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import DomainMigration, DomainMigrationEntry, Job

STATE_CONFLICT: Final = "SCHEDULER_MIGRATION_STATE_CONFLICT"
CONFLICT: Final = "SCHEDULER_MIGRATION_CONFLICT"
SOURCE_MISMATCH: Final = "SCHEDULER_MIGRATION_SOURCE_MISMATCH"
SOURCE_CHANGED: Final = "SCHEDULER_MIGRATION_SOURCE_CHANGED"
ROLLBACK_FROM: Final = ("prepared", "applied", "verified", "retiring", "retired")
ENTRY_STATES: Final = (
    "prepared",
    "applied",
    "verified",
    "retired",
    "retiring",
    "source_restored",
    "rollback_target_disabled",
    "rolled_back",
)
NO_TARGET_WORK: Final = ("prepared", "rollback_target_disabled", "rolled_back")
TARGET_ROLLBACK_FROM: Final = ("applied", "verified", "retiring", "retired", "source_restored")


def _dedup(migration: DomainMigration, deduplicated: bool) -> DomainMigration:
    result: DomainMigration = migration.replace(deduplicated=deduplicated)
    return result


def _dedup_entry(entry: DomainMigrationEntry, deduplicated: bool) -> DomainMigrationEntry:
    result: DomainMigrationEntry = entry.replace(deduplicated=deduplicated)
    return result


def _state_conflict(message: str, details: Any = None) -> SchedulerKernelError:
    return migration_error(STATE_CONFLICT, message, details)


# --------------------------------------------------------------------------- prepare


def _locators_agree(active: dict[str, Any] | None, requested: dict[str, Any] | None) -> bool:
    if active is None or requested is None:
        return True
    return encode_source_locator(active) == encode_source_locator(requested)


def _match(entry: DomainMigrationEntry, plan: MigrationPlan) -> PlanEntry | None:
    """The plan entry for the same source and target, if it is the same entry in every respect."""
    candidate = next(
        (
            item
            for item in plan.entries
            if item.domain == entry.domain
            and item.source_id == entry.source_id
            and item.source_scope_digest == entry.source_scope_digest
            and item.target_job_id == entry.target_job_id
        ),
        None,
    )
    if (
        candidate is None
        or not _locators_agree(entry.source_locator, candidate.source_locator)
        or candidate.source_digest != entry.source_digest
        or candidate.target_job_digest != entry.target_job_digest
        or candidate.rollback_strategy != entry.rollback_strategy
    ):
        return None
    return candidate


def _comparison_row(entry: DomainMigrationEntry | PlanEntry) -> dict[str, Any]:
    return {
        "domain": entry.domain,
        "sourceId": entry.source_id,
        "sourceScopeDigest": entry.source_scope_digest,
        "sourceDigest": entry.source_digest,
        "targetJobId": entry.target_job_id,
        "targetJobDigest": entry.target_job_digest,
        "rollbackStrategy": entry.rollback_strategy,
    }


def _active_migration_ids(tx: Tx, plan: MigrationPlan) -> list[str]:
    found: list[str] = []
    for entry in plan.entries:
        for migration_id in (
            q.active_migration_id_by_source(tx, entry.domain, entry.source_scope_digest, entry.source_id),
            q.active_migration_id_by_target(tx, entry.target_job_id),
        ):
            if migration_id is not None and migration_id not in found:
                found.append(migration_id)
    return found


def _matched_entries(
    active: DomainMigration, plan: MigrationPlan
) -> list[tuple[DomainMigrationEntry, PlanEntry]]:
    entries = active.entries or ()
    matched: list[tuple[DomainMigrationEntry, PlanEntry]] = []
    if len(entries) == len(plan.entries):
        for entry in entries:
            candidate = _match(entry, plan)
            if candidate is None:
                break
            matched.append((entry, candidate))
    if len(matched) != len(plan.entries) or len(matched) != len(entries):
        raise migration_error(
            CONFLICT,
            "A scheduler source or target already has a different active migration",
            {
                "active": [_comparison_row(entry) for entry in entries],
                "requested": [_comparison_row(entry) for entry in plan.entries],
            },
        )
    return matched


def _dedupe_to_active(tx: Tx, migration_id: str, plan: MigrationPlan) -> DomainMigration:
    if not q.migration_exists(tx, migration_id):
        raise data_corrupt("Active scheduler migration entry has no parent journal")
    active = q.load_migration(tx, migration_id)
    backfilled = False
    for entry, candidate in _matched_entries(active, plan):
        if entry.source_locator is not None or candidate.source_locator is None:
            continue
        encoded = encode_source_locator(candidate.source_locator)
        if q.backfill_entry_locator(tx, migration_id, entry.entry_id, encoded) != 1:
            raise data_corrupt("Scheduler migration source locator changed during binding")
        backfilled = True
    if backfilled:
        q.update_migration(tx, migration_id, None)
        active = q.load_migration(tx, migration_id)
    return _dedup(active, True)


def _insert_attempt(tx: Tx, plan: MigrationPlan) -> str:
    manifest, digest, migration_id = attempt_manifest(plan, tx.new_uuid())
    try:
        q.insert_migration(
            tx,
            migration_id,
            digest,
            canonical_json(manifest, "schedulerMigration.manifest"),
            len(plan.entries),
        )
    except IntegrityError as cause:
        raise migration_error(
            CONFLICT, "Scheduler migration attempt is already journaled", {"migrationId": migration_id}
        ) from cause
    for entry in plan.entries:
        try:
            q.insert_entry(tx, migration_id, entry)
        except IntegrityError as cause:
            raise migration_error(
                CONFLICT,
                "A scheduler source or target already has an active migration",
                {"domain": entry.domain, "sourceId": entry.source_id, "targetJobId": entry.target_job_id},
            ) from cause
    return migration_id


MIGRATION_LOCKS: Final = "domain_migration"
SOURCE_LOCKS: Final = "domain_migration_source"
TARGET_LOCKS: Final = "domain_migration_target"


def lock_migration(tx: Tx, migration_id: str) -> None:
    """Hold one migration's journal until the transaction ends (``Tx.lock_keys``)."""
    tx.lock_keys(MIGRATION_LOCKS, [migration_id])


def _lock_plan(tx: Tx, plan: MigrationPlan) -> None:
    """Hold every source and target of a plan: two ``prepare`` calls naming one of them run one
    after the other, so the second finds the first's active migration."""
    sources = [
        f"{entry.domain}\x1f{entry.source_scope_digest}\x1f{entry.source_id}" for entry in plan.entries
    ]
    tx.lock_keys(SOURCE_LOCKS, sources)
    tx.lock_keys(TARGET_LOCKS, [entry.target_job_id for entry in plan.entries])


def prepare(tx: Tx, plan: MigrationPlan) -> DomainMigration:
    """Journal a new attempt, or return the active migration of the same plan (``deduplicated``)."""
    _lock_plan(tx, plan)
    active_ids = _active_migration_ids(tx, plan)
    if len(active_ids) > 1:
        raise migration_error(
            CONFLICT, "Scheduler migration sources or targets belong to different active migrations"
        )
    if active_ids:
        return _dedupe_to_active(tx, active_ids[0], plan)
    return _dedup(q.load_migration(tx, _insert_attempt(tx, plan)), False)


# --------------------------------------------------------------------------- apply / verify


def apply(tx: Tx, migration_id: str) -> DomainMigration:
    """Stage every target (disabled) and record what was done to it."""
    migration = q.load_migration(tx, migration_id)
    if migration.state != "prepared":
        if migration.state in ("applied", "verified", "retiring", "retired"):
            return _dedup(migration, True)
        raise _state_conflict(f"Scheduler migration cannot be applied from state {migration.state}")
    for entry in migration.entries or ():
        staged = targets.stage_target(tx, migration, entry)
        changed = q.update_entry(
            tx,
            migration_id,
            entry.entry_id,
            ("prepared",),
            state="applied",
            target_action=staged.action,
            target_before_json=staged.before_json,
            target_applied_revision=staged.applied_revision,
            target_applied_at=tx.now,
            target_occurrence_count_before=staged.occurrence_count,
            target_execution_event_count_before=staged.execution_event_count,
        )
        if changed != 1:
            raise _state_conflict("Scheduler migration entry changed while it was being applied")
    q.update_migration(tx, migration_id, ("prepared",), state="applied")
    return _dedup(q.load_migration(tx, migration_id), False)


def verify(tx: Tx, migration_id: str, supplied: dict[str, str]) -> DomainMigration:
    """Every source supplied once with an unchanged digest, every target unchanged → verified."""
    migration = q.load_migration(tx, migration_id)
    if migration.state == "verified":
        return _dedup(migration, True)
    if migration.state != "applied":
        raise _state_conflict(f"Scheduler migration cannot be verified from state {migration.state}")
    entries = migration.entries or ()
    if len(supplied) != len(entries):
        raise migration_error(
            SOURCE_MISMATCH, "Verification must provide every scheduler migration source exactly once"
        )
    for entry in entries:
        if supplied.get(entry.entry_id) != entry.source_digest:
            raise migration_error(
                SOURCE_CHANGED,
                f"Scheduler migration source changed before verification: {entry.source_id}",
                {"entryId": entry.entry_id, "sourceId": entry.source_id},
            )
        targets.assert_target_staged(tx, migration, entry)
    if q.update_entry(tx, migration_id, None, ("applied",), state="verified") != len(entries):
        raise _state_conflict("Scheduler migration entries changed during verification")
    q.update_migration(tx, migration_id, ("applied",), state="verified")
    return _dedup(q.load_migration(tx, migration_id), False)


# --------------------------------------------------------------------------- retirement


def begin_retirement(tx: Tx, migration_id: str) -> DomainMigration:
    """Hand out one random retirement token per entry (entry-id order)."""
    migration = q.load_migration(tx, migration_id)
    if migration.state == "retiring":
        return _dedup(migration, True)
    if migration.state != "verified":
        raise _state_conflict(f"Scheduler migration cannot retire sources from state {migration.state}")
    for entry in migration.entries or ():
        token = f"scheduler-retirement-{tx.new_uuid()}"
        if (
            q.update_entry(
                tx, migration_id, entry.entry_id, ("verified",), state="retiring", retirement_token=token
            )
            != 1
        ):
            raise _state_conflict("Scheduler migration entry changed during retirement preparation")
    q.update_migration(tx, migration_id, ("verified",), state="retiring")
    return _dedup(q.load_migration(tx, migration_id), False)


def _activate_all(tx: Tx, migration_id: str) -> None:
    """The last retirement: enable every target atomically, or fail closed (nothing changes)."""
    migration = q.load_migration(tx, migration_id)
    activations, already_active = targets.plan_activations(tx, migration)
    for entry_id, revision in already_active.items():
        q.update_entry(tx, migration_id, entry_id, ("retired",), target_applied_revision=revision)
    for activation in activations:
        activated = targets.activate_target(tx, activation)
        q.update_entry(
            tx,
            migration_id,
            activation.entry.entry_id,
            ("retired",),
            target_applied_revision=activated.revision,
        )
    q.update_migration(tx, migration_id, ("retiring",), state="retired", completed_at=tx.now)


def confirm_retired(
    tx: Tx, migration_id: str, entry_id: str, token: str, retirement_digest: str
) -> DomainMigrationEntry:
    """Record that the caller retired one source; the last confirmation activates all targets."""
    entry = q.load_entry(tx, migration_id, entry_id)
    if entry is None:
        raise migration_error(q.MIGRATION_NOT_FOUND, f"Scheduler migration entry does not exist: {entry_id}")
    if entry.state == "retired":
        if entry.retirement_token != token or entry.source_retirement_digest != retirement_digest:
            raise migration_error(
                SOURCE_MISMATCH, "Retired scheduler source evidence does not match the journal"
            )
        return _dedup_entry(entry, True)
    if entry.state != "retiring" or entry.retirement_token != token:
        raise _state_conflict("Scheduler migration entry is not waiting for this retirement token")
    if q.retire_entry(tx, migration_id, entry_id, token, retirement_digest) != 1:
        raise _state_conflict("Scheduler migration entry changed while retirement was confirmed")
    if q.count_entries_not_in_state(tx, migration_id, "retired") == 0:
        _activate_all(tx, migration_id)
    return _dedup_entry(q.reload_entry(tx, migration_id, entry_id), False)


# --------------------------------------------------------------------------- rollback


def begin_rollback(tx: Tx, migration_id: str) -> DomainMigration:
    """Enter ``rolling_back`` and roll the targets back (resumes an interrupted rollback)."""
    migration = q.load_migration(tx, migration_id)
    if migration.state == "rolling_back":
        return roll_back_targets(tx, migration_id)
    if migration.state == "rolled_back":
        return _dedup(migration, True)
    if migration.state not in ROLLBACK_FROM:
        raise _state_conflict(f"Scheduler migration cannot roll back from state {migration.state}")
    q.update_migration(tx, migration_id, ROLLBACK_FROM, state="rolling_back", completed_at=None)
    return roll_back_targets(tx, migration_id, migration.state)


def continue_rollback(tx: Tx, migration_id: str) -> DomainMigration:
    """``rollback_domain_migration_targets``: only while rolling back."""
    migration = q.load_migration(tx, migration_id)
    if migration.state == "rolled_back":
        return _dedup(migration, True)
    if migration.state != "rolling_back":
        raise _state_conflict("Scheduler migration is not rolling back")
    return roll_back_targets(tx, migration_id)


def _pending_target_snapshots(
    tx: Tx, migration: DomainMigration, from_state: str | None
) -> list[tuple[DomainMigrationEntry, Job]]:
    entries = migration.entries or ()
    for entry in entries:
        if entry.state == "rollback_target_disabled":
            targets.assert_rollback_target(tx, migration, entry)
    pending = [entry for entry in reversed(entries) if entry.state not in NO_TARGET_WORK]
    snapshots: list[tuple[DomainMigrationEntry, Job]] = []
    for entry in pending:
        current = targets.assert_target_revision(entry, load_job(tx, entry.target_job_id))
        targets.assert_target_before_rollback(migration, entry, current, from_state)
        targets.assert_execution_evidence(tx, entry)
        snapshots.append((entry, current))
    return snapshots


def roll_back_targets(tx: Tx, migration_id: str, from_state: str | None = None) -> DomainMigration:
    """Check every pending target first, then disable or restore each (reverse entry order)."""
    migration = q.load_migration(tx, migration_id)
    invalid = [entry.entry_id for entry in migration.entries or () if entry.state not in ENTRY_STATES]
    if invalid:
        raise _state_conflict(
            "Scheduler migration entries are not ready for target rollback", {"entryIds": invalid}
        )
    snapshots = _pending_target_snapshots(tx, migration, from_state)
    for entry, current in snapshots:
        rolled_back = targets.roll_back_target(tx, entry, current)
        q.update_entry(
            tx,
            migration_id,
            entry.entry_id,
            TARGET_ROLLBACK_FROM,
            state="rollback_target_disabled",
            target_rollback_revision=rolled_back.revision,
        )
    q.clear_restored_digests(tx, migration_id)
    return _dedup(q.load_migration(tx, migration_id), not snapshots)


def restore_source(
    tx: Tx, migration_id: str, entry_id: str, token: str | None, restore: Callable[[], Any]
) -> DomainMigrationEntry:
    """Record a source restored to its pre-migration digest; the last one completes the rollback."""
    migration = q.load_migration(tx, migration_id)
    if migration.state not in ("rolling_back", "rolled_back"):
        raise _state_conflict("Scheduler migration is not rolling back")
    entry = q.load_entry(tx, migration_id, entry_id)
    if entry is None or entry.retirement_token != token:
        raise _state_conflict("Scheduler migration source restoration token does not match")
    if entry.state == "rolled_back":
        if entry.source_restored_digest != entry.source_digest:
            raise migration_error(
                SOURCE_MISMATCH, "Restored scheduler source evidence does not match the journal"
            )
        return _dedup_entry(entry, True)
    if entry.state == "rollback_target_disabled":
        targets.assert_rollback_target(tx, migration, entry)
    elif entry.state != "prepared":
        raise _state_conflict(f"Scheduler migration entry cannot restore its source from state {entry.state}")
    restored_digest = scheduler_migration_source_digest(_call_restore(restore))
    if restored_digest != entry.source_digest:
        raise migration_error(
            SOURCE_CHANGED,
            "Restored scheduler source does not match its pre-migration digest",
            {"entryId": entry_id, "sourceId": entry.source_id},
        )
    changed = q.update_entry(
        tx,
        migration_id,
        entry_id,
        ("prepared", "rollback_target_disabled"),
        state="rolled_back",
        source_restored_digest=restored_digest,
    )
    if changed != 1:
        raise _state_conflict("Scheduler migration source restoration lost its journal fence")
    if q.count_entries_not_in_state(tx, migration_id, "rolled_back") == 0:
        q.update_migration(tx, migration_id, ("rolling_back",), state="rolled_back", completed_at=tx.now)
    return _dedup_entry(q.reload_entry(tx, migration_id, entry_id), False)


def _call_restore(restore: Callable[[], Any]) -> Any:
    result = restore()
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise invalid_argument("restoreSource must complete synchronously")
    return result


# --------------------------------------------------------------------------- locators


def bind_locator(
    tx: Tx,
    migration_id: str,
    entry_id: str,
    locator_input: Any,
    source_digest: str,
    target_job_id: str,
) -> DomainMigrationEntry:
    """Bind a source locator to an entry whose journal evidence matches; idempotent, never rebinds."""
    row = q.load_entry_row(tx, migration_id, entry_id)
    if row is None:
        raise migration_error(q.MIGRATION_NOT_FOUND, f"Scheduler migration entry does not exist: {entry_id}")
    if row.source_digest != source_digest or row.target_job_id != target_job_id:
        raise migration_error(
            SOURCE_MISMATCH, "Scheduler migration locator evidence does not match the journal"
        )
    locator = normalize_source_locator(
        locator_input,
        row.domain,
        row.source_scope_digest,
        "sourceLocator",
        allow_legacy_automation_current=True,
    )
    if locator is None:
        raise invalid_argument("sourceLocator is required")
    encoded = encode_source_locator(locator)
    if row.source_locator_json is not None:
        if row.source_locator_json != encoded:
            raise migration_error(
                "SCHEDULER_MIGRATION_LOCATOR_CONFLICT",
                "Scheduler migration source locator is already bound differently",
            )
        return _dedup_entry(map_domain_migration_entry(row), True)
    if q.bind_entry_locator(tx, migration_id, entry_id, encoded, source_digest, target_job_id) != 1:
        raise migration_error(
            "SCHEDULER_MIGRATION_LOCATOR_CONFLICT",
            "Scheduler migration source locator changed during binding",
        )
    q.update_migration(tx, migration_id, None)
    return _dedup_entry(q.reload_entry(tx, migration_id, entry_id), False)
