"""Frozen records returned by the store.

Attributes are snake_case; ``to_dict()`` returns exactly the object the original
JavaScript store returns (camelCase keys, same nesting). ``deduplicated`` and
``entries`` are omitted from ``to_dict()`` when they are ``None``, as the original
only includes them on some operations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

JSON = Any

_OPTIONAL_KEYS = frozenset({"deduplicated", "entries"})


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class Record:
    """Mixin giving dataclass records the original's dict shape."""

    _KEYS: ClassVar[dict[str, str]] = {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if field.name in _OPTIONAL_KEYS and value is None:
                continue
            out[self._KEYS.get(field.name, _camel(field.name))] = _plain(value)
        return out

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True, slots=True)
class Job(Record):
    id: str
    kind: str
    trigger: JSON
    payload: JSON
    authority: dict[str, Any]
    enabled: bool
    revision: int
    max_attempts: int
    created_at: int
    updated_at: int

    def definition(self) -> dict[str, Any]:
        """The wire-format job definition (the seed's ``schedulerJobDefinition``)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "trigger": self.trigger,
            "payload": self.payload,
            "authority": self.authority,
            "enabled": self.enabled,
            "maxAttempts": self.max_attempts,
        }


@dataclass(frozen=True, slots=True)
class Occurrence(Record):
    id: str
    job_id: str
    job_revision: int
    idempotency_key: str
    trigger_key: str
    scheduled_for: int
    available_at: int
    status: str
    attempt: int
    max_attempts: int
    fence: int
    lease_owner: str | None
    lease_expires_at: int | None
    authority: dict[str, Any]
    payload: JSON
    last_error: JSON
    result: JSON
    created_at: int
    updated_at: int
    settled_at: int | None
    deduplicated: bool | None = None


@dataclass(frozen=True, slots=True)
class SettledAndClaimed(Record):
    """The result of ``settle_and_claim``: the settled occurrence and the next one claimed (or ``None``)."""

    settled: Occurrence
    claimed: Occurrence | None


@dataclass(frozen=True, slots=True)
class SettledManyAndClaimed(Record):
    """The result of ``settle_many_and_claim``: the settled occurrences, in the order of the
    settlements, and the occurrences claimed after them, in claim order."""

    settled: list[Occurrence]
    claimed: list[Occurrence]


@dataclass(frozen=True, slots=True)
class Event(Record):
    event_id: int
    job_id: str
    occurrence_id: str | None
    type: str
    occurred_at: int
    owner_id: str | None
    fence: int | None
    data: JSON


@dataclass(frozen=True, slots=True)
class MigrationRecord(Record):
    version: int
    name: str
    checksum: str
    applied_at: int


@dataclass(frozen=True, slots=True)
class SchemaInfo(Record):
    application_id: int
    schema_version: int
    migration: MigrationRecord | None


@dataclass(frozen=True, slots=True)
class AuthorityPolicy(Record):
    principal: dict[str, str]
    revision: int
    enabled: bool
    capabilities: list[str]
    window_ms: int
    max_runs: int
    max_units: int
    created_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class AuthorityReservation(Record):
    occurrence_id: str
    job_id: str
    principal: dict[str, str]
    policy_revision: int
    window_started_at: int
    units: int
    status: str
    outcome: JSON
    created_at: int
    settled_at: int | None
    deduplicated: bool | None = None


@dataclass(frozen=True, slots=True)
class Adjudication(Record):
    occurrence_id: str
    job_id: str
    request_id: str
    decision: str
    authority: str
    evidence_digest: str
    expected_attempt: int
    expected_fence: int
    reason_digest: str
    operator_digest: str
    status: str
    created_at: int
    applied_at: int | None
    retry_settled_at: int | None
    retry_outcome: JSON


@dataclass(frozen=True, slots=True)
class ReservationSummary(Record):
    policy_revision: int
    units: int
    status: str


@dataclass(frozen=True, slots=True)
class AdjudicationCase(Record):
    occurrence_id: str
    job_id: str
    status: str
    attempt: int
    max_attempts: int
    fence: int
    settled_at: int | None
    error_code: str | None
    authority_principal: dict[str, str]
    reservation: ReservationSummary | None
    eligible: bool
    evidence_digest: str | None
    adjudication: Adjudication | None


@dataclass(frozen=True, slots=True)
class DomainMigrationEntry(Record):
    migration_id: str
    entry_id: str
    domain: str
    source_id: str
    source_scope_digest: str
    source_locator: JSON
    source_locator_digest: str | None
    source_digest: str
    target_job_id: str
    target_job_digest: str
    rollback_strategy: str
    state: str
    target_action: str | None
    target_before: JSON
    target_applied_revision: int | None
    target_applied_at: int | None
    target_occurrence_count_before: int | None
    target_execution_event_count_before: int | None
    target_rollback_revision: int | None
    retirement_token: str | None
    source_retirement_digest: str | None
    source_restored_digest: str | None
    created_at: int
    updated_at: int
    deduplicated: bool | None = None


@dataclass(frozen=True, slots=True)
class DomainMigration(Record):
    id: str
    manifest_digest: str
    manifest: JSON
    state: str
    entry_count: int
    created_at: int
    updated_at: int
    completed_at: int | None
    last_error: JSON
    entries: tuple[DomainMigrationEntry, ...] | None = None
    deduplicated: bool | None = None


@dataclass(frozen=True, slots=True)
class OccurrenceControl(Record):
    occurrence_id: str
    capability: dict[str, Any]
    capability_digest: str
    state: str
    revision: int
    pause_request_id: str
    resume_request_id: str | None
    expected_fence: int
    checkpoint: JSON
    requested_at: int
    paused_at: int | None
    resumed_at: int | None
    terminal_at: int | None
    updated_at: int
    deduplicated: bool | None = None


@dataclass(frozen=True, slots=True)
class ControlSummary(Record):
    state: str
    revision: int
    expected_fence: int
    capability_digest: str
    requested_at: int
    paused_at: int | None
    updated_at: int


@dataclass(frozen=True, slots=True)
class RuntimeControlOccurrence(Record):
    id: str
    job_id: str
    job_kind: str
    runtime_status: str
    occurrence_status: str
    scheduled_for: int
    attempt: int
    max_attempts: int
    fence: int
    created_at: int
    updated_at: int
    control: ControlSummary | None


@dataclass(frozen=True, slots=True)
class ControlResult(Record):
    """Result of ``ack_occurrence_pause`` / ``resume_occurrence``: ``{control, occurrence}``."""

    control: OccurrenceControl
    occurrence: Occurrence


@dataclass(frozen=True, slots=True)
class RequeueResult(Record):
    """Result of ``requeue_dead_letter``: ``{occurrence, requestId, deduplicated}``."""

    occurrence: Occurrence
    request_id: str
    deduplicated: bool


__all__ = [
    "Adjudication",
    "AdjudicationCase",
    "AuthorityPolicy",
    "AuthorityReservation",
    "ControlResult",
    "ControlSummary",
    "DomainMigration",
    "DomainMigrationEntry",
    "Event",
    "Job",
    "MigrationRecord",
    "Occurrence",
    "OccurrenceControl",
    "Record",
    "RequeueResult",
    "ReservationSummary",
    "RuntimeControlOccurrence",
    "SchemaInfo",
]
