"""Domain migration plans: pure normalization, entry identities and the manifest digest.

Seed: ``normalizeDomainMigrationEntry`` and ``normalizeDomainMigrationPlan``. A plan is the wire
document ``{"entries": [...]}``; each entry names one legacy source and the scheduler job that
replaces it. Everything here is deterministic: entry ids and the plan digest depend only on the
plan. The per-attempt manifest (with its random attempt id) is built by :func:`attempt_manifest`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from scheduler.contract.canonical import sha256_payload_digest
from scheduler.contract.constants import SCHEDULER_MIGRATION_DOMAINS
from scheduler.contract.digests import scheduler_migration_scope_digest, scheduler_migration_source_digest
from scheduler.contract.errors import invalid_argument
from scheduler.contract.jobs import scheduler_job_definition_digest
from scheduler.contract.scalars import MISSING, utf16_sorted
from scheduler.contract.storable import normalize_key, normalize_stored_job
from scheduler.store.capabilities.domain_migrations.locators import normalize_source_locator

MIN_PLAN_ENTRIES: Final = 1
MAX_PLAN_ENTRIES: Final = 1_000
ROLLBACK_STRATEGIES: Final = ("restore", "disable")
DEFAULT_ROLLBACK_STRATEGY: Final = "restore"
ENTRY_FIELDS: Final = frozenset(
    {"domain", "sourceId", "sourceScope", "sourceLocator", "source", "targetJob", "rollbackStrategy"}
)
ENTRY_ID_PREFIX: Final = "scheduler-migration-entry-"
MIGRATION_ID_PREFIX: Final = "scheduler-domain-migration-"
SHA256_PREFIX: Final = "sha256:"


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """One normalized plan entry (the seed's entry object, snake_case)."""

    entry_id: str
    domain: str
    source_id: str
    source_scope_digest: str
    source_digest: str
    target_job_id: str
    target_job_digest: str
    rollback_strategy: str
    source_locator: dict[str, Any] | None
    target_job: dict[str, Any]

    def identity(self) -> dict[str, Any]:
        """The fields the entry id is derived from (and the conflict comparison shows)."""
        return {
            "schemaVersion": 1,
            "domain": self.domain,
            "sourceId": self.source_id,
            "sourceScopeDigest": self.source_scope_digest,
            "sourceDigest": self.source_digest,
            "targetJobId": self.target_job_id,
            "targetJobDigest": self.target_job_digest,
            "rollbackStrategy": self.rollback_strategy,
        }

    def manifest_entry(self) -> dict[str, Any]:
        return {**self.identity(), "entryId": self.entry_id, "targetJob": self.target_job}


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """A normalized plan: entries sorted by entry id, the plan manifest and its digest."""

    plan_digest: str
    manifest: dict[str, Any]
    entries: tuple[PlanEntry, ...]


def digest_hex(digest: str) -> str:
    return digest[len(SHA256_PREFIX) :]


def _is_object(value: object) -> bool:
    return isinstance(value, Mapping) and not isinstance(value, list)


def _reject_unknown(value: Mapping[Any, Any], allowed: frozenset[str], field: str) -> None:
    unknown = [key if isinstance(key, str) else str(key) for key in value if key not in allowed]
    if unknown:
        raise invalid_argument(f"{field} contains unknown fields", {"fields": utf16_sorted(unknown)})


def _rollback_strategy(value: object, index: int) -> str:
    strategy = DEFAULT_ROLLBACK_STRATEGY if value is None or value is MISSING else value
    if not isinstance(strategy, str) or strategy not in ROLLBACK_STRATEGIES:
        raise invalid_argument(f"entries[{index}].rollbackStrategy must be restore or disable")
    return strategy


def normalize_domain_migration_entry(value: object, index: int) -> PlanEntry:
    """Validate one plan entry in the seed's order and derive its entry id."""
    if not _is_object(value):
        raise invalid_argument(f"entries[{index}] must be an object")
    assert isinstance(value, Mapping)
    _reject_unknown(value, ENTRY_FIELDS, f"entries[{index}]")
    domain = value.get("domain")
    if not isinstance(domain, str) or domain not in SCHEDULER_MIGRATION_DOMAINS:
        raise invalid_argument(f"entries[{index}].domain must be a supported scheduler migration domain")
    source_id = normalize_key(value.get("sourceId"), f"entries[{index}].sourceId")
    scope_digest = scheduler_migration_scope_digest(value.get("sourceScope", MISSING))
    locator = normalize_source_locator(
        value.get("sourceLocator"), domain, scope_digest, f"entries[{index}].sourceLocator"
    )
    source_digest = scheduler_migration_source_digest(value.get("source", MISSING))
    target_job = normalize_stored_job(value.get("targetJob"))
    entry = PlanEntry(
        entry_id="",
        domain=domain,
        source_id=source_id,
        source_scope_digest=scope_digest,
        source_digest=source_digest,
        target_job_id=target_job["id"],
        target_job_digest=scheduler_job_definition_digest(target_job),
        rollback_strategy=_rollback_strategy(value.get("rollbackStrategy", MISSING), index),
        source_locator=locator,
        target_job=target_job,
    )
    entry_digest = sha256_payload_digest(entry.identity(), f"schedulerMigration.entries[{index}]")
    return dataclasses.replace(entry, entry_id=ENTRY_ID_PREFIX + digest_hex(entry_digest))


def _assert_unique(entries: list[PlanEntry]) -> None:
    entry_ids: set[str] = set()
    sources: set[tuple[str, str, str]] = set()
    targets: set[str] = set()
    for entry in entries:
        source_key = (entry.domain, entry.source_scope_digest, entry.source_id)
        if entry.entry_id in entry_ids or source_key in sources:
            raise invalid_argument("scheduler migration plan contains duplicate sources")
        if entry.target_job_id in targets:
            raise invalid_argument("scheduler migration plan contains duplicate target jobs")
        entry_ids.add(entry.entry_id)
        sources.add(source_key)
        targets.add(entry.target_job_id)


def normalize_domain_migration_plan(value: object) -> MigrationPlan:
    """Validate a plan ``{"entries": [...]}`` (1..1000 entries) and build its manifest.

    Entries are sorted by entry id. The seed sorts with ``localeCompare``; entry ids are one ASCII
    prefix plus 64 lowercase hex digits, where locale order equals code-point order.
    """
    if not _is_object(value):
        raise invalid_argument("scheduler migration plan must be an object")
    assert isinstance(value, Mapping)
    _reject_unknown(value, frozenset({"entries"}), "scheduler migration plan")
    raw_entries = value.get("entries")
    if not isinstance(raw_entries, list) or not MIN_PLAN_ENTRIES <= len(raw_entries) <= MAX_PLAN_ENTRIES:
        raise invalid_argument("scheduler migration plan must contain between 1 and 1000 entries")
    entries = sorted(
        (normalize_domain_migration_entry(entry, index) for index, entry in enumerate(raw_entries)),
        key=lambda entry: entry.entry_id,
    )
    _assert_unique(entries)
    manifest = {"schemaVersion": 1, "entries": [entry.manifest_entry() for entry in entries]}
    plan_digest = sha256_payload_digest(manifest, "schedulerMigration.manifest")
    return MigrationPlan(plan_digest=plan_digest, manifest=manifest, entries=tuple(entries))


def attempt_manifest(plan: MigrationPlan, attempt_id: str) -> tuple[dict[str, Any], str, str]:
    """The stored manifest of one attempt: ``(manifest, manifest digest, migration id)``."""
    manifest = {**plan.manifest, "schemaVersion": 2, "planDigest": plan.plan_digest, "attemptId": attempt_id}
    digest = sha256_payload_digest(manifest, "schedulerMigration.attemptManifest")
    return manifest, digest, MIGRATION_ID_PREFIX + digest_hex(digest)
