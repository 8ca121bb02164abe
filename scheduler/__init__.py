"""scheduler — a durable job scheduler store on SQLAlchemy Core and Alembic.

Start with :func:`open_store`; see ``docs/`` for the architecture and guides.
"""

from __future__ import annotations

import logging

from scheduler.contract import (
    OccurrenceIdentity,
    SchedulerKernelError,
    canonical_json,
    derive_occurrence_identity,
    is_canonical_scheduler_source_path,
    normalize_authority_envelope,
    normalize_json,
    normalize_runtime_control_capability,
    scheduler_adjudication_operator_digest,
    scheduler_adjudication_reason_digest,
    scheduler_job_definition_digest,
    scheduler_migration_scope_digest,
    scheduler_migration_source_digest,
    scheduler_runtime_control_capability_digest,
)
from scheduler.contract.constants import RUNTIME_CONTROL_JOB_KINDS, RUNTIME_CONTROL_OCCURRENCE_STATUSES
from scheduler.store import SchedulerStore, default_database_path, open_store
from scheduler.store.clock import monotonic_wall_clock
from scheduler.store.records import (
    Adjudication,
    AdjudicationCase,
    AuthorityPolicy,
    AuthorityReservation,
    ControlResult,
    DomainMigration,
    DomainMigrationEntry,
    Event,
    Job,
    Occurrence,
    OccurrenceControl,
    RequeueResult,
    RuntimeControlOccurrence,
    SchemaInfo,
)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "RUNTIME_CONTROL_JOB_KINDS",
    "RUNTIME_CONTROL_OCCURRENCE_STATUSES",
    "Adjudication",
    "AdjudicationCase",
    "AuthorityPolicy",
    "AuthorityReservation",
    "ControlResult",
    "DomainMigration",
    "DomainMigrationEntry",
    "Event",
    "Job",
    "Occurrence",
    "OccurrenceControl",
    "OccurrenceIdentity",
    "RequeueResult",
    "RuntimeControlOccurrence",
    "SchedulerKernelError",
    "SchedulerStore",
    "SchemaInfo",
    "canonical_json",
    "default_database_path",
    "derive_occurrence_identity",
    "is_canonical_scheduler_source_path",
    "monotonic_wall_clock",
    "normalize_authority_envelope",
    "normalize_json",
    "normalize_runtime_control_capability",
    "open_store",
    "scheduler_adjudication_operator_digest",
    "scheduler_adjudication_reason_digest",
    "scheduler_job_definition_digest",
    "scheduler_migration_scope_digest",
    "scheduler_migration_source_digest",
    "scheduler_runtime_control_capability_digest",
]
