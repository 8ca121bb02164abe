"""Registering task definitions as jobs: idempotent, safe with many processes starting at once.

For each task, in a transaction of its own (never a caller's): read the job; create it if missing;
if its kind, trigger, payload, authority or ``max_attempts`` differ from the definition, update it
with a revision compare-and-set. A concurrent creator (``SCHEDULER_CONFLICT``) or updater
(``SCHEDULER_REVISION_CONFLICT``) makes it read again and decide again, so every process starting
with the same definitions succeeds and the job ends up as defined. Whether an operator disabled the
job is left alone (``enabled`` is not part of a task's definition).
"""

from __future__ import annotations

import time
from typing import Any, Final

from scheduler.contract.canonical import canonical_json
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.storable import normalize_stored_authority
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Job
from scheduler.tasks.definition import TaskDefinition

_RACES: Final = ("SCHEDULER_CONFLICT", "SCHEDULER_REVISION_CONFLICT")
_ATTEMPTS: Final = 20
_FIELDS: Final = {
    "kind": "kind",
    "trigger": "trigger",
    "payload": "payload",
    "authority": "authority",
    "max_attempts": "max_attempts",
}


def _changes(job: Job, wanted: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``wanted`` whose value differs from the job's (compared as canonical JSON)."""
    return {
        name: value
        for name, value in wanted.items()
        if canonical_json(getattr(job, _FIELDS[name])) != canonical_json(value)
    }


def _retryable(error: SchedulerKernelError) -> bool:
    return error.code in _RACES or bool(
        error.code == "SCHEDULER_STORAGE_UNAVAILABLE" and (error.details or {}).get("retryable")
    )


def is_registered(store: SchedulerStore, definition: TaskDefinition, authority: dict[str, Any]) -> bool:
    """Whether the task's job exists as defined (a read: nothing is written)."""
    job = store.get_job(definition.name)
    return job is not None and not _changes(job, definition.job_fields(normalize_stored_authority(authority)))


def register_task(store: SchedulerStore, definition: TaskDefinition, authority: dict[str, Any]) -> Job:
    """Make the task's job match its definition; return the job."""
    wanted = definition.job_fields(normalize_stored_authority(authority))
    delay = 0.005
    for attempt in range(_ATTEMPTS):
        try:
            job = store.get_job(definition.name)
            if job is None:
                return store.create_job(id=definition.name, **wanted)
            changes = _changes(job, wanted)
            if not changes:
                return job
            return store.update_job(definition.name, job.revision, **changes)
        except SchedulerKernelError as error:
            if not _retryable(error) or attempt == _ATTEMPTS - 1:
                raise
        time.sleep(delay)
        delay = min(0.25, delay * 2)
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["is_registered", "register_task"]
