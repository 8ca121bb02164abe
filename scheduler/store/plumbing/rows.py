"""Mapping stored rows to records, validating what was stored (seed: map*, readStored*)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row

from scheduler.contract.authority import normalize_authority_envelope
from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.records import Event, Job, Occurrence

DATA_CORRUPT = "SCHEDULER_DATA_CORRUPT"


def data_corrupt(message: str, cause: BaseException | None = None) -> SchedulerKernelError:
    error = SchedulerKernelError(DATA_CORRUPT, message)
    error.__cause__ = cause
    return error


def read_stored_json(encoded: str, field: str) -> Any:
    try:
        return json.loads(encoded)
    except (TypeError, ValueError) as cause:
        raise data_corrupt(f"Stored {field} is not valid JSON", cause) from cause


def read_optional_json(encoded: str | None, field: str) -> Any:
    return None if encoded is None else read_stored_json(encoded, field)


def read_stored_authority(encoded: str, field: str) -> dict[str, Any]:
    value = read_stored_json(encoded, field)
    try:
        return normalize_authority_envelope(value)
    except SchedulerKernelError as cause:
        raise data_corrupt(f"Stored {field} does not match authority envelope v1", cause) from cause


def map_job(row: Row[Any] | None) -> Job | None:
    if row is None:
        return None
    return Job(
        id=row.job_id,
        kind=row.kind,
        trigger=read_stored_json(row.trigger_json, "job trigger"),
        payload=read_stored_json(row.payload_json, "job payload"),
        authority=read_stored_authority(row.authority_json, "job authority"),
        enabled=row.enabled == 1,
        revision=row.revision,
        max_attempts=row.max_attempts,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def map_occurrence(row: Row[Any] | None, deduplicated: bool | None = None) -> Occurrence | None:
    if row is None:
        return None
    return Occurrence(
        id=row.occurrence_id,
        job_id=row.job_id,
        job_revision=row.job_revision,
        idempotency_key=row.idempotency_key,
        trigger_key=row.trigger_key,
        scheduled_for=row.scheduled_for,
        available_at=row.available_at,
        status=row.status,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        fence=row.fence,
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
        authority=read_stored_authority(row.authority_json, "occurrence authority"),
        payload=read_stored_json(row.payload_json, "occurrence payload"),
        last_error=read_optional_json(row.last_error_json, "occurrence error"),
        result=read_optional_json(row.result_json, "occurrence result"),
        created_at=row.created_at,
        updated_at=row.updated_at,
        settled_at=row.settled_at,
        deduplicated=deduplicated,
    )


def map_event(row: Row[Any]) -> Event:
    return Event(
        event_id=row.event_id,
        job_id=row.job_id,
        occurrence_id=row.occurrence_id,
        type=row.event_type,
        occurred_at=row.occurred_at,
        owner_id=row.owner_id,
        fence=row.fence,
        data=read_stored_json(row.data_json, "event data"),
    )
