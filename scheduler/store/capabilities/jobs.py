"""Jobs: create, read, and update with revision compare-and-set (seed: createJob/getJob/updateJob)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import bindparam, select, update

from scheduler.contract.canonical import canonical_json, normalize_json
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import (
    MISSING,
    assert_positive_safe_int,
    normalize_boolean,
    normalize_max_attempts,
)
from scheduler.contract.storable import normalize_key, normalize_stored_authority, normalize_stored_job
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.plumbing.constructs import insert_ignoring_conflict
from scheduler.store.plumbing.rows import map_job
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Job

_OMITTED: Any = MISSING
PATCH_FIELDS = ("kind", "trigger", "payload", "authority", "enabled", "maxAttempts")


def not_found(kind: str, identifier: str) -> SchedulerKernelError:
    return SchedulerKernelError("SCHEDULER_NOT_FOUND", f"Scheduler {kind} does not exist: {identifier}")


_JOB: Final = Prepared(select(t.jobs).where(t.jobs.c.job_id == bindparam("job_id")))
_JOB_LOCKED: Final = Prepared(select(t.jobs).where(t.jobs.c.job_id == bindparam("job_id")).with_for_update())
"""The job row, locked until the transaction ends (PostgreSQL; SQLite writers are serialized)."""
_INSERT_JOB: Final = insert_ignoring_conflict(t.jobs, "job_id")
_JOB_EXISTS: Final = Prepared(select(t.jobs.c.job_id).where(t.jobs.c.job_id == bindparam("job_id")))
_LOCK_JOB: Final = Prepared(
    select(t.jobs.c.job_id).where(t.jobs.c.job_id == bindparam("job_id")).with_for_update()
)


def lock_job_row(tx: Tx, job_id: str) -> bool:
    """Hold the job's row until the transaction ends (PostgreSQL ``FOR UPDATE``; on SQLite the
    write transaction already excludes other writers); whether it exists."""
    return tx.first(_LOCK_JOB, {"job_id": job_id}) is not None


def load_job(tx: Tx, job_id: str, *, lock: bool = False) -> Job | None:
    """The job, or ``None``; ``lock`` holds its row for the rest of the transaction (the row
    that decides a compare-and-set update or a once-per-trigger enqueue)."""
    return map_job(tx.first(_JOB_LOCKED if lock else _JOB, {"job_id": job_id}))


_e = t.events
_TRIGGER_UPDATES: Final = Prepared(
    select(_e.c.occurred_at, _e.c.data_json)
    .where(
        _e.c.job_id == bindparam("job_id"),
        _e.c.occurrence_id.is_(None),
        _e.c.event_type == "job_updated",
        _e.c.data_json.like('%"trigger"%'),  # canonical JSON: only a changedFields entry matches
    )
    .order_by(_e.c.event_id.desc())
)


def trigger_changed_at(tx: Tx, job: Job) -> int | None:
    """When the job's trigger was last set by ``update_job`` (its ``job_updated`` event listing
    ``trigger``, at ``occurred_at``), or ``None`` if it is still the one the job was created with.

    Job-level events are never pruned, so every reader of any later state gets the same answer.
    Setting the trigger to the value it already had counts as a change (the event does not say).
    """
    if job.revision == 1:
        return None
    for row in tx.all(_TRIGGER_UPDATES, {"job_id": job.id}):
        if "trigger" in json.loads(row.data_json).get("changedFields", ()):
            return int(row.occurred_at)
    return None


def _job_values(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": job["kind"],
        "trigger_json": canonical_json(job["trigger"], "job.trigger"),
        "payload_json": canonical_json(job["payload"], "job.payload"),
        "authority_json": canonical_json(job["authority"], "job.authority"),
        "enabled": 1 if job["enabled"] else 0,
        "max_attempts": job["maxAttempts"],
    }


def create_job_in(tx: Tx, job: dict[str, Any]) -> Job:
    """Insert a normalized wire-format job at revision 1 and record ``job_created``."""
    conflict = SchedulerKernelError("SCHEDULER_CONFLICT", f"Scheduler job already exists: {job['id']}")
    if tx.first(_JOB_EXISTS, {"job_id": job["id"]}) is not None:
        raise conflict
    values = {"job_id": job["id"], "revision": 1, "created_at": tx.now, "updated_at": tx.now}
    if tx.changes(_INSERT_JOB.values(**values, **_job_values(job))) != 1:
        raise conflict  # a concurrent create_job committed the same id first (PostgreSQL)
    tx.append_event(job_id=job["id"], type="job_created", data={"revision": 1})
    created = load_job(tx, job["id"])
    assert created is not None
    return created


def update_job_in(tx: Tx, job_id: str, expected_revision: int, patch: dict[str, Any]) -> Job:
    """Apply a normalized patch if the job is still at ``expected_revision``; record ``job_updated``."""
    current = load_job(tx, job_id, lock=True)
    if current is None:
        raise not_found("job", job_id)
    if current.revision != expected_revision:
        raise SchedulerKernelError(
            "SCHEDULER_REVISION_CONFLICT",
            f"Scheduler job revision changed: {job_id}",
            {"expectedRevision": expected_revision, "actualRevision": current.revision},
        )
    merged = {**current.definition(), **patch}
    next_revision = current.revision + 1
    changed = tx.changes(
        update(t.jobs)
        .where(t.jobs.c.job_id == job_id, t.jobs.c.revision == expected_revision)
        .values(revision=next_revision, updated_at=tx.now, **_job_values(merged))
    )
    if changed != 1:
        raise SchedulerKernelError(
            "SCHEDULER_REVISION_CONFLICT", f"Scheduler job revision changed during update: {job_id}"
        )
    tx.append_event(
        job_id=job_id,
        type="job_updated",
        data={"fromRevision": expected_revision, "toRevision": next_revision, "changedFields": sorted(patch)},
    )
    updated = load_job(tx, job_id)
    assert updated is not None
    return updated


def normalize_job_patch(fields: dict[str, Any]) -> dict[str, Any]:
    """Validate a wire-format patch (seed: normalizeJobPatch); omitted fields are absent."""
    if not fields:
        raise invalid_argument("job patch must not be empty")
    normalizers: dict[str, Callable[[Any], Any]] = {
        "kind": lambda v: normalize_key(v, "job.kind", 128),
        "trigger": lambda v: normalize_json(v, "job.trigger"),
        "payload": lambda v: normalize_json(v, "job.payload"),
        "authority": normalize_stored_authority,
        "enabled": lambda v: normalize_boolean(v, "job.enabled"),
        "maxAttempts": normalize_max_attempts,
    }
    return {key: normalizers[key](value) for key, value in fields.items()}


class JobOperations(StoreBase):
    """Public job methods of ``SchedulerStore``."""

    def create_job(
        self,
        *,
        id: str,
        kind: str,
        authority: Any,
        trigger: Any = None,
        payload: Any = None,
        enabled: bool = True,
        max_attempts: int = 3,
    ) -> Job:
        """Create a job at revision 1 (``SCHEDULER_CONFLICT`` if the id exists)."""
        job = normalize_stored_job(
            {
                "id": id,
                "kind": kind,
                "trigger": trigger,
                "payload": payload,
                "authority": authority,
                "enabled": enabled,
                "maxAttempts": max_attempts,
            }
        )
        return self._write(lambda tx: create_job_in(tx, job))

    def get_job(self, job_id: str) -> Job | None:
        """The job, or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(job_id, "jobId")
        return self._read(lambda tx: load_job(tx, identifier))

    def update_job(
        self,
        job_id: str,
        expected_revision: int,
        *,
        kind: Any = _OMITTED,
        trigger: Any = _OMITTED,
        payload: Any = _OMITTED,
        authority: Any = _OMITTED,
        enabled: Any = _OMITTED,
        max_attempts: Any = _OMITTED,
    ) -> Job:
        """Change the given fields if the job is at ``expected_revision`` (compare-and-set)."""
        identifier = normalize_key(job_id, "jobId")
        revision = assert_positive_safe_int(expected_revision, "expectedRevision")
        given = {
            "kind": kind,
            "trigger": trigger,
            "payload": payload,
            "authority": authority,
            "enabled": enabled,
            "maxAttempts": max_attempts,
        }
        patch = normalize_job_patch({key: value for key, value in given.items() if value is not _OMITTED})
        return self._write(lambda tx: update_job_in(tx, identifier, revision, patch))
