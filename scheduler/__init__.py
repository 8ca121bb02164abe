"""scheduler — a durable job scheduler store on SQLAlchemy Core and Alembic.

Start with :func:`open_store`; see ``docs/`` for the architecture and guides.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from scheduler.schema.autogenerate import alembic_filters
from scheduler.store import SchedulerStore, default_database_path, mark_writer, open_store, sqlite_engine
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
    SettledAndClaimed,
    SettledManyAndClaimed,
)

if TYPE_CHECKING:
    from scheduler.tasks import TaskCancelled, TaskFailed, TaskRun, Tasks
    from scheduler.worker import RetryPolicy

logging.getLogger(__name__).addHandler(logging.NullHandler())

_LAZY = {
    "Tasks": "scheduler.tasks",
    "TaskRun": "scheduler.tasks",
    "TaskFailed": "scheduler.tasks",
    "TaskCancelled": "scheduler.tasks",
    "RetryPolicy": "scheduler.worker",
}
"""The Tasks layer, imported on first use (it brings the worker runtime and the async API)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

__version__ = "0.1.0"

ALEMBIC_VERSION_LOCATION = "scheduler:revisions/versions"
"""The revisions in Alembic's ``package:dir`` notation, for a host's ``version_locations``."""


def alembic_version_location() -> str:
    """The directory of the scheduler's Alembic revisions ``v1`` … ``v6`` (branch ``scheduler``).

    Shipped inside the package (a wheel included). A host application mounts them by adding
    this directory (or ``scheduler:revisions/versions``) to its own ``version_locations``; see
    ``scheduler.revisions`` for the schema and clock a mounted revision uses.
    """
    return str(Path(__file__).resolve().parent / "revisions" / "versions")


__all__ = [
    "ALEMBIC_VERSION_LOCATION",
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
    "RetryPolicy",
    "RuntimeControlOccurrence",
    "SchedulerKernelError",
    "SchedulerStore",
    "SchemaInfo",
    "SettledAndClaimed",
    "SettledManyAndClaimed",
    "TaskCancelled",
    "TaskFailed",
    "TaskRun",
    "Tasks",
    "alembic_filters",
    "alembic_version_location",
    "canonical_json",
    "default_database_path",
    "derive_occurrence_identity",
    "is_canonical_scheduler_source_path",
    "mark_writer",
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
    "sqlite_engine",
]
