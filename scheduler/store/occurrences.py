"""Occurrences: idempotent enqueue, reads, and enqueue_many (seed: _enqueueOccurrence & co)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from sqlalchemy import bindparam, select

from scheduler.contract.canonical import canonical_json, normalize_and_encode_json
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.identity import derive_occurrence_identity
from scheduler.contract.scalars import is_safe_int, normalize_epoch_ms, normalize_identifier
from scheduler.schema import tables as t
from scheduler.store.base import StoreBase
from scheduler.store.dialect import insert_ignoring_conflict
from scheduler.store.jobs import load_job, not_found
from scheduler.store.records import Job, Occurrence
from scheduler.store.rows import data_corrupt, map_occurrence
from scheduler.store.session import Tx

T = TypeVar("T")

OMITTED: Final[Any] = object()
"""Default of ``payload``: the job's payload is used (``None`` is the JSON ``null``)."""

DEFAULT_TRIGGER_LIST_LIMIT: Final = 2
MAX_TRIGGER_LIST_LIMIT: Final = 200
ENQUEUE_FIELDS: Final = frozenset({"job_id", "scheduled_for", "trigger_key", "available_at", "payload"})
REQUIRED_ENQUEUE_FIELDS: Final = ("job_id", "scheduled_for", "trigger_key")

_o = t.occurrences
_INSERT: Final = insert_ignoring_conflict(_o, "idempotency_key").returning(*_o.c)
_BY_KEY: Final = select(_o).where(_o.c.idempotency_key == bindparam("key"))
_BY_ID: Final = select(_o).where(_o.c.occurrence_id == bindparam("id"))
_BY_TRIGGER: Final = (
    select(_o)
    .where(_o.c.job_id == bindparam("job_id"), _o.c.trigger_key == bindparam("trigger_key"))
    .order_by(_o.c.created_at.asc(), _o.c.occurrence_id.asc())
    .limit(bindparam("limit"))
)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A validated enqueue: ``payload_json`` is ``None`` when the job's payload is to be used."""

    job_id: str
    scheduled_for: int
    trigger_key: str
    available_at: int
    payload_json: str | None


def normalize_enqueue(
    job_id: Any, scheduled_for: Any, trigger_key: Any, available_at: Any, payload: Any
) -> EnqueueRequest:
    """Validate enqueue arguments in the seed's order (jobId, scheduledFor, triggerKey, availableAt)."""
    identifier = normalize_identifier(job_id, "jobId")
    scheduled = normalize_epoch_ms(scheduled_for, "scheduledFor")
    key = normalize_identifier(trigger_key, "triggerKey")
    available = normalize_epoch_ms(scheduled if available_at is None else available_at, "availableAt")
    payload_json = None if payload is OMITTED else normalize_and_encode_json(payload, "occurrence.payload")[1]
    return EnqueueRequest(identifier, scheduled, key, available, payload_json)


def normalize_enqueue_mapping(request: Any) -> EnqueueRequest:
    """One ``enqueue_many`` item: a dict of ``enqueue_occurrence`` keyword arguments."""
    if not isinstance(request, Mapping):
        raise invalid_argument("enqueue request must be a dict")
    unknown = sorted(str(key) for key in request if key not in ENQUEUE_FIELDS)
    if unknown:
        raise invalid_argument("enqueue request contains unknown fields", {"fields": unknown})
    return normalize_enqueue(
        request.get("job_id"),
        request.get("scheduled_for"),
        request.get("trigger_key"),
        request.get("available_at"),
        request.get("payload", OMITTED),
    )


def normalize_trigger_list_limit(limit: Any) -> int:
    """An ``int`` clamped to 1..200 (the seed clamps the same way)."""
    if not is_safe_int(limit):
        raise invalid_argument("limit must be an integer")
    return min(MAX_TRIGGER_LIST_LIMIT, max(1, limit))


def with_index(error: SchedulerKernelError, index: int) -> SchedulerKernelError:
    """Tag a batch item's error with its position (merged into a dict ``details``)."""
    if error.details is None:
        error.details = {"index": index}
    elif isinstance(error.details, dict):
        error.details = {**error.details, "index": index}
    return error


def validate_batch(items: Any, normalize: Callable[[Any], T], field: str) -> list[T]:
    """Validate every item of a batch before any transaction opens."""
    if not isinstance(items, (list, tuple)):
        raise invalid_argument(f"{field} must be a list")
    normalized: list[T] = []
    for index, item in enumerate(items):
        try:
            normalized.append(normalize(item))
        except SchedulerKernelError as error:
            with_index(error, index)
            raise
    return normalized


def run_batch(tx: Tx, items: Sequence[T], operation: Callable[[Tx, T], Any]) -> list[Any]:
    """Run ``operation`` for each item in order; a failure carries the item's index."""
    results: list[Any] = []
    for index, item in enumerate(items):
        try:
            results.append(operation(tx, item))
        except SchedulerKernelError as error:
            with_index(error, index)
            raise
    return results


class _JobCache:
    """Enabled-job lookups for one enqueue call or batch (enqueueing never changes a job)."""

    __slots__ = ("_jobs",)

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[Job, str, str]] = {}

    def get(self, tx: Tx, job_id: str) -> tuple[Job, str, str]:
        """(job, canonical authority, canonical payload) of an existing, enabled job."""
        cached = self._jobs.get(job_id)
        if cached is not None:
            return cached
        job = load_job(tx, job_id)
        if job is None:
            raise not_found("job", job_id)
        if not job.enabled:
            raise SchedulerKernelError("SCHEDULER_JOB_DISABLED", f"Scheduler job is disabled: {job_id}")
        entry = (
            job,
            canonical_json(job.authority, "occurrence.authority"),
            canonical_json(job.payload, "occurrence.payload"),
        )
        self._jobs[job_id] = entry
        return entry


def enqueue_in(tx: Tx, request: EnqueueRequest, jobs: _JobCache | None = None) -> Occurrence:
    """Insert the occurrence unless its identity exists; ``deduplicated`` tells which happened."""
    job, authority_json, job_payload_json = (jobs or _JobCache()).get(tx, request.job_id)
    identity = derive_occurrence_identity(
        job_id=request.job_id,
        job_revision=job.revision,
        scheduled_for=request.scheduled_for,
        trigger_key=request.trigger_key,
    )
    payload_json = job_payload_json if request.payload_json is None else request.payload_json
    inserted = tx.first(
        _INSERT,
        {
            "occurrence_id": identity.occurrence_id,
            "job_id": request.job_id,
            "job_revision": job.revision,
            "idempotency_key": identity.idempotency_key,
            "trigger_key": request.trigger_key,
            "scheduled_for": request.scheduled_for,
            "available_at": request.available_at,
            "status": "queued",
            "attempt": 0,
            "max_attempts": job.max_attempts,
            "fence": 0,
            "lease_owner": None,
            "lease_expires_at": None,
            "authority_json": authority_json,
            "payload_json": payload_json,
            "last_error_json": None,
            "result_json": None,
            "created_at": tx.now,
            "updated_at": tx.now,
            "settled_at": None,
        },
    )
    row = inserted if inserted is not None else tx.first(_BY_KEY, {"key": identity.idempotency_key})
    if row is None or row.occurrence_id != identity.occurrence_id:
        raise data_corrupt("Occurrence idempotency identity does not match stored data")
    if row.payload_json != payload_json:
        raise SchedulerKernelError(
            "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH",
            "Occurrence idempotency identity was reused with a different payload",
            {"jobId": request.job_id, "triggerKey": request.trigger_key},
        )
    if inserted is not None:
        tx.append_event(
            job_id=request.job_id,
            occurrence_id=identity.occurrence_id,
            type="occurrence_enqueued",
            data={
                "jobRevision": job.revision,
                "scheduledFor": request.scheduled_for,
                "triggerKey": request.trigger_key,
            },
        )
    occurrence = map_occurrence(row, deduplicated=inserted is None)
    assert occurrence is not None
    return occurrence


def list_by_trigger(tx: Tx, job_id: str, trigger_key: str, limit: int) -> list[Occurrence]:
    rows = tx.execute(_BY_TRIGGER, {"job_id": job_id, "trigger_key": trigger_key, "limit": limit})
    return [occurrence for occurrence in map(map_occurrence, rows) if occurrence is not None]


def enqueue_once_in(tx: Tx, request: EnqueueRequest) -> Occurrence:
    """Return any earlier occurrence of the job + trigger (no payload check), else enqueue."""
    prior = tx.execute(
        _BY_TRIGGER, {"job_id": request.job_id, "trigger_key": request.trigger_key, "limit": 2}
    )
    rows = prior.all()
    if len(rows) > 1:
        raise data_corrupt("Multiple occurrences exist for a unique job trigger")
    if rows:
        occurrence = map_occurrence(rows[0], deduplicated=True)
        assert occurrence is not None
        return occurrence
    return enqueue_in(tx, request)


def load_occurrence(tx: Tx, occurrence_id: str) -> Occurrence | None:
    return map_occurrence(tx.first(_BY_ID, {"id": occurrence_id}))


class OccurrenceOperations(StoreBase):
    """Public occurrence methods of ``SchedulerStore``."""

    def enqueue_occurrence(
        self,
        *,
        job_id: str,
        scheduled_for: int,
        trigger_key: str,
        available_at: int | None = None,
        payload: Any = OMITTED,
    ) -> Occurrence:
        """Enqueue one firing of a job; an existing identity returns it with ``deduplicated=True``.

        ``available_at`` defaults to ``scheduled_for``; an omitted ``payload`` means the job's
        payload (``payload=None`` stores JSON ``null``). Reusing an identity with another payload
        is ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH``.
        """
        request = normalize_enqueue(job_id, scheduled_for, trigger_key, available_at, payload)
        return self._write(lambda tx: enqueue_in(tx, request))

    def enqueue_occurrence_once_per_trigger(
        self,
        *,
        job_id: str,
        scheduled_for: int,
        trigger_key: str,
        available_at: int | None = None,
        payload: Any = OMITTED,
    ) -> Occurrence:
        """Like ``enqueue_occurrence``, but any earlier occurrence of the job + trigger wins."""
        request = normalize_enqueue(job_id, scheduled_for, trigger_key, available_at, payload)
        return self._write(lambda tx: enqueue_once_in(tx, request))

    def get_occurrence(self, occurrence_id: str) -> Occurrence | None:
        """The occurrence, or ``None``."""
        identifier = normalize_identifier(occurrence_id, "occurrenceId")
        return self._read(lambda tx: load_occurrence(tx, identifier))

    def list_occurrences_by_trigger(
        self, *, job_id: str, trigger_key: str, limit: int = DEFAULT_TRIGGER_LIST_LIMIT
    ) -> list[Occurrence]:
        """Occurrences of one job + trigger, oldest first (``limit`` clamped to 1..200)."""
        identifier = normalize_identifier(job_id, "jobId")
        key = normalize_identifier(trigger_key, "triggerKey")
        bounded = normalize_trigger_list_limit(limit)
        return self._read(lambda tx: list_by_trigger(tx, identifier, key, bounded))

    def enqueue_many(self, requests: Sequence[Mapping[str, Any]]) -> list[Occurrence]:
        """``enqueue_occurrence`` for each request dict, in order, in one transaction.

        A failing item rolls the whole batch back; its error carries ``details["index"]``.
        """
        normalized = validate_batch(requests, normalize_enqueue_mapping, "requests")
        if not normalized:
            self._assert_open()
            return []

        def operation(tx: Tx) -> list[Occurrence]:
            jobs = _JobCache()
            return run_batch(tx, normalized, lambda inner, request: enqueue_in(inner, request, jobs))

        return self._write(operation)
