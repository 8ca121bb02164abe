"""Target jobs of a migration: staging, activation, rollback, and the fail-closed assertions.

Seed: the target parts of ``applyDomainMigration``, ``verifyDomainMigration``,
``confirmDomainMigrationEntryRetired`` and ``_rollbackDomainMigrationTargetsInTransaction``, plus
``_assertDomainMigrationTargetBeforeRollback``, ``_assertDomainMigrationRollbackTarget``,
``_isExpectedDomainMigrationRollbackTarget`` and ``_assertDomainMigrationTargetExecutionEvidence``.
Jobs change only through ``create_job_in`` / ``update_job_in`` (which record job events).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import func, select

from scheduler.contract.canonical import canonical_json
from scheduler.contract.jobs import normalize_job_definition, scheduler_job_definition_digest
from scheduler.schema import tables as t
from scheduler.store.capabilities.domain_migrations.queries import migration_error
from scheduler.store.capabilities.jobs import create_job_in, load_job, update_job_in
from scheduler.store.plumbing.rows import data_corrupt
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import DomainMigration, DomainMigrationEntry, Job

TARGET_CHANGED: Final = "SCHEDULER_MIGRATION_TARGET_CHANGED"
EXECUTION_EVIDENCE: Final = "SCHEDULER_MIGRATION_EXECUTION_EVIDENCE"
PATCH_FIELDS: Final = ("kind", "trigger", "payload", "authority", "enabled", "maxAttempts")


@dataclass(frozen=True, slots=True)
class StagedTarget:
    """What applying one entry did to its target job (the entry's apply columns)."""

    action: str
    before_json: str | None
    applied_revision: int
    occurrence_count: int
    execution_event_count: int


def job_digest(job: Job | dict[str, Any]) -> str:
    return scheduler_job_definition_digest(job.definition() if isinstance(job, Job) else job)


def staged(job: dict[str, Any]) -> dict[str, Any]:
    """The target as applied: the intended definition, disabled until retirement completes."""
    return {**job, "enabled": False}


def definition_patch(job: dict[str, Any]) -> dict[str, Any]:
    return {field: job[field] for field in PATCH_FIELDS}


def manifest_entry(migration: DomainMigration, entry_id: str) -> dict[str, Any]:
    for candidate in migration.manifest["entries"]:
        if candidate.get("entryId") == entry_id:
            found: dict[str, Any] = candidate
            return found
    raise data_corrupt("Scheduler migration entry is absent from its manifest")


def intended_target(migration: DomainMigration, entry_id: str) -> dict[str, Any]:
    """The normalized ``targetJob`` the manifest holds for the entry."""
    return normalize_job_definition(manifest_entry(migration, entry_id)["targetJob"])


def evidence_counts(tx: Tx, job_id: str) -> tuple[int, int]:
    """``(occurrences, execution events)`` of a job: events tied to an occurrence count."""
    occurrences = tx.scalar(
        select(func.count()).select_from(t.occurrences).where(t.occurrences.c.job_id == job_id)
    )
    events = tx.scalar(
        select(func.count())
        .select_from(t.events)
        .where(t.events.c.job_id == job_id, t.events.c.occurrence_id.is_not(None))
    )
    return int(occurrences), int(events)


def stage_target(tx: Tx, migration: DomainMigration, entry: DomainMigrationEntry) -> StagedTarget:
    """Create, update or reuse the target job, disabled; remember its before-image and evidence."""
    target = intended_target(migration, entry.entry_id)
    if target["id"] != entry.target_job_id or job_digest(target) != entry.target_job_digest:
        raise data_corrupt("Scheduler migration target does not match its stored digest")
    current = load_job(tx, entry.target_job_id, lock=True)
    target = staged(target)
    occurrences, events = evidence_counts(tx, entry.target_job_id)
    if current is None:
        applied, action = create_job_in(tx, target), "created"
    elif job_digest(current) == job_digest(target):
        applied, action = current, "reused"
    else:
        applied = update_job_in(tx, current.id, current.revision, definition_patch(target))
        action = "updated"
    before = (
        None if current is None else canonical_json(current.definition(), "schedulerMigration.targetBefore")
    )
    return StagedTarget(action, before, applied.revision, occurrences, events)


def assert_target_staged(tx: Tx, migration: DomainMigration, entry: DomainMigrationEntry) -> None:
    """Verification: the target is still exactly what apply left (revision and definition)."""
    job = load_job(tx, entry.target_job_id, lock=True)
    staged_digest = job_digest(staged(intended_target(migration, entry.entry_id)))
    if job is None or job.revision != entry.target_applied_revision or job_digest(job) != staged_digest:
        raise migration_error(
            TARGET_CHANGED,
            f"Scheduler migration target changed before verification: {entry.target_job_id}",
            {"entryId": entry.entry_id, "targetJobId": entry.target_job_id},
        )


@dataclass(frozen=True, slots=True)
class Activation:
    entry: DomainMigrationEntry
    current: Job
    intended: dict[str, Any]


def plan_activations(tx: Tx, migration: DomainMigration) -> tuple[list[Activation], dict[str, int]]:
    """Check every target before any is enabled.

    Returns the staged targets to activate and, for targets already active as intended, their
    current revision. A target that is neither raises ``SCHEDULER_MIGRATION_TARGET_CHANGED``.
    """
    activations: list[Activation] = []
    already_active: dict[str, int] = {}
    for entry in migration.entries or ():
        intended = intended_target(migration, entry.entry_id)
        current = load_job(tx, entry.target_job_id, lock=True)
        if current is not None and job_digest(current) == entry.target_job_digest:
            already_active[entry.entry_id] = current.revision
            continue
        if (
            current is None
            or current.revision != entry.target_applied_revision
            or job_digest(current) != job_digest(staged(intended))
        ):
            raise migration_error(
                TARGET_CHANGED,
                f"Scheduler migration target changed before activation: {entry.target_job_id}",
                {"entryId": entry.entry_id, "targetJobId": entry.target_job_id},
            )
        activations.append(Activation(entry, current, intended))
    return activations, already_active


def activate_target(tx: Tx, activation: Activation) -> Job:
    """Give the staged target its intended definition (``enabled`` included)."""
    current = activation.current
    if job_digest(current) == activation.entry.target_job_digest:
        return current
    return update_job_in(tx, current.id, current.revision, definition_patch(activation.intended))


def roll_back_target(tx: Tx, entry: DomainMigrationEntry, current: Job) -> Job:
    """Disable a created target (or any target under ``disable``); else restore its before-image."""
    if entry.target_action == "created" or entry.rollback_strategy == "disable":
        return (
            update_job_in(tx, current.id, current.revision, {"enabled": False})
            if current.enabled
            else current
        )
    before = normalize_job_definition(entry.target_before)
    if job_digest(current) == job_digest(before):
        return current
    return update_job_in(tx, current.id, current.revision, definition_patch(before))


def assert_target_revision(entry: DomainMigrationEntry, current: Job | None) -> Job:
    """Before rollback the target must still be at the revision the migration left it."""
    if current is None or current.revision != entry.target_applied_revision:
        raise migration_error(
            TARGET_CHANGED,
            f"Scheduler migration target revision changed before rollback: {entry.target_job_id}",
            {
                "expectedRevision": entry.target_applied_revision,
                "actualRevision": None if current is None else current.revision,
            },
        )
    return current


def _target_was_activated(
    migration: DomainMigration, entry: DomainMigrationEntry, from_state: str | None
) -> bool:
    if from_state == "retired":
        return True
    settled = ("retired", "rollback_target_disabled", "rolled_back")
    return (
        from_state is None
        and entry.state == "retired"
        and all(candidate.state in settled for candidate in migration.entries or ())
    )


def assert_target_before_rollback(
    migration: DomainMigration, entry: DomainMigrationEntry, current: Job, from_state: str | None
) -> None:
    """The target's definition is the staged one, or the intended one once it was activated."""
    intended = intended_target(migration, entry.entry_id)
    expected = intended if _target_was_activated(migration, entry, from_state) else staged(intended)
    expected_digest, actual_digest = job_digest(expected), job_digest(current)
    if actual_digest != expected_digest:
        raise migration_error(
            TARGET_CHANGED,
            f"Scheduler migration target definition changed before rollback: {entry.target_job_id}",
            {
                "expectedRevision": entry.target_applied_revision,
                "actualRevision": current.revision,
                "expectedDefinitionDigest": expected_digest,
                "actualDefinitionDigest": actual_digest,
            },
        )


def is_expected_rollback_target(entry: DomainMigrationEntry, current: Job, target_job: Any) -> bool:
    """Whether ``current`` is what rolling the entry's target back produced."""
    if entry.target_action == "created" or entry.rollback_strategy == "disable":
        return job_digest(current) == job_digest(staged(normalize_job_definition(target_job)))
    return entry.target_before is not None and job_digest(current) == job_digest(entry.target_before)


def assert_rollback_target(tx: Tx, migration: DomainMigration, entry: DomainMigrationEntry) -> None:
    """A rolled-back target is unchanged since (revision and definition) and was never executed."""
    current = load_job(tx, entry.target_job_id, lock=True)
    candidates = [c for c in migration.manifest["entries"] if c.get("entryId") == entry.entry_id]
    if (
        current is None
        or current.revision != entry.target_rollback_revision
        or not candidates
        or not is_expected_rollback_target(entry, current, candidates[0]["targetJob"])
    ):
        raise migration_error(
            TARGET_CHANGED,
            f"Scheduler migration target changed after rollback: {entry.target_job_id}",
            {
                "expectedRevision": entry.target_rollback_revision,
                "actualRevision": None if current is None else current.revision,
            },
        )
    assert_execution_evidence(tx, entry)


def assert_execution_evidence(tx: Tx, entry: DomainMigrationEntry) -> None:
    """No occurrence and no execution event of the target since apply (else it ran: no rollback)."""
    occurrences, events = evidence_counts(tx, entry.target_job_id)
    if (
        occurrences != entry.target_occurrence_count_before
        or events != entry.target_execution_event_count_before
    ):
        raise migration_error(
            EXECUTION_EVIDENCE,
            "Scheduler migration target has execution evidence and cannot be rolled back: "
            f"{entry.target_job_id}",
            {
                "occurrenceCountBefore": entry.target_occurrence_count_before,
                "occurrenceCountNow": occurrences,
                "executionEventCountBefore": entry.target_execution_event_count_before,
                "executionEventCountNow": events,
            },
        )
