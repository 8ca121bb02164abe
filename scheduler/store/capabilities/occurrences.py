"""Occurrences: idempotent enqueue, reads, and enqueue_many (seed: _enqueueOccurrence & co)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from sqlalchemy import bindparam, select

from scheduler.contract.canonical import canonical_json, normalize_and_encode_json
from scheduler.contract.constants import QUEUED
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.identity import derive_occurrence_identity
from scheduler.contract.scalars import MISSING, is_safe_int, normalize_epoch_ms
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.jobs import lock_job_row, not_found
from scheduler.store.capabilities.occurrence_rows import (
    EventLog,
    chunks,
    occurrence_record,
    reject_unknown_fields,
    validate_batch,
    with_index,
)
from scheduler.store.plumbing.constructs import insert_ignoring_conflict
from scheduler.store.plumbing.row_inserts import COPY_AT_LEAST, chunked, rows_insert, rows_parameters
from scheduler.store.plumbing.rows import data_corrupt, map_job
from scheduler.store.plumbing.statement_plans import Prepared, per_backend
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

if TYPE_CHECKING:
    from scheduler.backends.interface import Backend

OMITTED: Final[Any] = MISSING  # payload not given: the job's payload is used
"""Default of ``payload``: the job's payload is used (``None`` is the JSON ``null``)."""

DEFAULT_TRIGGER_LIST_LIMIT: Final = 2
MAX_TRIGGER_LIST_LIMIT: Final = 200
ENQUEUE_FIELDS: Final = frozenset({"job_id", "scheduled_for", "trigger_key", "available_at", "payload"})

_o = t.occurrences
_INSERT: Final = Prepared(insert_ignoring_conflict(_o, "idempotency_key"))
_BY_KEY: Final = Prepared(select(_o).where(_o.c.idempotency_key == bindparam("key")))
_JOB: Final = Prepared(select(t.jobs).where(t.jobs.c.job_id == bindparam("id")))
_BY_ID: Final = Prepared(select(_o).where(_o.c.occurrence_id == bindparam("id")))
_BY_TRIGGER: Final = Prepared(
    select(_o)
    .where(_o.c.job_id == bindparam("job_id"), _o.c.trigger_key == bindparam("trigger_key"))
    .order_by(_o.c.created_at.asc(), _o.c.occurrence_id.asc())
    .limit(bindparam("limit"))
)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A validated enqueue. ``payload`` is the caller's value (``OMITTED``: the job's payload); as in
    the seed it is validated only once the job is known to exist and be enabled (``_plan``)."""

    job_id: str
    scheduled_for: int
    trigger_key: str
    available_at: int
    payload: Any


def normalize_enqueue(
    job_id: Any, scheduled_for: Any, trigger_key: Any, available_at: Any, payload: Any
) -> EnqueueRequest:
    """Validate enqueue arguments in the seed's order (jobId, scheduledFor, triggerKey, availableAt).

    The payload is validated later, inside the transaction, after the job lookup (seed:
    ``_enqueueOccurrence``): a missing or disabled job is reported before a bad payload, and
    ``enqueue_occurrence_once_per_trigger`` returning an earlier occurrence never looks at it.
    """
    identifier = normalize_key(job_id, "jobId")
    scheduled = normalize_epoch_ms(scheduled_for, "scheduledFor")
    key = normalize_key(trigger_key, "triggerKey")
    available = normalize_epoch_ms(scheduled if available_at is None else available_at, "availableAt")
    return EnqueueRequest(identifier, scheduled, key, available, payload)


def normalize_enqueue_mapping(request: Any) -> EnqueueRequest:
    """One ``enqueue_many`` item: a dict of ``enqueue_occurrence`` keyword arguments."""
    fields = reject_unknown_fields(request, ENQUEUE_FIELDS, "enqueue request")
    return normalize_enqueue(
        fields.get("job_id"),
        fields.get("scheduled_for"),
        fields.get("trigger_key"),
        fields.get("available_at"),
        fields.get("payload", OMITTED),
    )


def normalize_trigger_list_limit(limit: Any) -> int:
    """An ``int`` clamped to 1..200 (the seed clamps the same way)."""
    if not is_safe_int(limit):
        raise invalid_argument("limit must be an integer")
    return min(MAX_TRIGGER_LIST_LIMIT, max(1, limit))


_job_texts: dict[tuple[str, str, str], tuple[str, str]] = {}


class _JobCache:
    """Enabled-job lookups for one enqueue call or batch (enqueueing never changes a job)."""

    __slots__ = ("_jobs",)

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[Any, str, str]] = {}

    def get(self, tx: Tx, job_id: str) -> tuple[Any, str, str]:
        """(job row, canonical authority, canonical payload) of an existing, enabled job.

        The seed maps the job (validating its stored JSON) and re-encodes authority and payload;
        both depend only on the stored texts, so they are memoized by those texts.
        """
        cached = self._jobs.get(job_id)
        if cached is not None:
            return cached
        row = tx.first(_JOB, {"id": job_id})
        if row is None:
            raise not_found("job", job_id)
        texts_key = (row.authority_json, row.payload_json, row.trigger_json)
        texts = _job_texts.get(texts_key)
        if texts is None:
            job = map_job(row)
            assert job is not None
            texts = (
                canonical_json(job.authority, "occurrence.authority"),
                canonical_json(job.payload, "occurrence.payload"),
            )
            if len(_job_texts) >= 256:
                _job_texts.clear()
            _job_texts[texts_key] = texts
        if row.enabled != 1:
            raise SchedulerKernelError("SCHEDULER_JOB_DISABLED", f"Scheduler job is disabled: {job_id}")
        entry = (row, *texts)
        self._jobs[job_id] = entry
        return entry


@dataclass(frozen=True, slots=True)
class _Planned:
    """An enqueue request with its job resolved (or the job's error, raised in order)."""

    request: EnqueueRequest
    values: dict[str, Any] | None
    error: SchedulerKernelError | None


def _plan(tx: Tx, request: EnqueueRequest, jobs: _JobCache) -> dict[str, Any]:
    """The occurrence row an enqueue would insert (identity derived from the job's revision)."""
    job, authority_json, job_payload_json = jobs.get(tx, request.job_id)
    payload_json = (
        job_payload_json
        if request.payload is OMITTED
        else normalize_and_encode_json(request.payload, "occurrence.payload")[1]
    )
    identity = derive_occurrence_identity(
        job_id=request.job_id,
        job_revision=job.revision,
        scheduled_for=request.scheduled_for,
        trigger_key=request.trigger_key,
    )
    return {
        "occurrence_id": identity.occurrence_id,
        "job_id": request.job_id,
        "job_revision": job.revision,
        "idempotency_key": identity.idempotency_key,
        "trigger_key": request.trigger_key,
        "scheduled_for": request.scheduled_for,
        "available_at": request.available_at,
        "status": QUEUED,
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
    }


def _check_existing(existing: Any, values: dict[str, Any]) -> None:
    """The stored row of an identity must be that identity, with the same payload."""
    if existing is None or existing["occurrence_id"] != values["occurrence_id"]:
        raise data_corrupt("Occurrence idempotency identity does not match stored data")
    if existing["payload_json"] != values["payload_json"]:
        raise SchedulerKernelError(
            "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH",
            "Occurrence idempotency identity was reused with a different payload",
            {"jobId": values["job_id"], "triggerKey": values["trigger_key"]},
        )


def _enqueued(events: EventLog, values: dict[str, Any]) -> None:
    events.add(
        job_id=values["job_id"],
        occurrence_id=values["occurrence_id"],
        type="occurrence_enqueued",
        data={
            "jobRevision": values["job_revision"],
            "scheduledFor": values["scheduled_for"],
            "triggerKey": values["trigger_key"],
        },
    )


ENQUEUE_LOCKS: Final = "enqueue"


def _identity_lock(request: EnqueueRequest) -> str:
    """The key an enqueue holds (``Tx.lock_keys``): every identity of the same job, time and
    trigger key, whatever the job's revision, so two writers of one identity run one at a time."""
    return f"{request.job_id}\x1f{request.scheduled_for}\x1f{request.trigger_key}"


def enqueue_in(tx: Tx, request: EnqueueRequest) -> Occurrence:
    """Insert the occurrence unless its identity exists; ``deduplicated`` tells which happened."""
    tx.lock_keys(ENQUEUE_LOCKS, [_identity_lock(request)])
    values = _plan(tx, request, _JobCache())
    if tx.changes(_INSERT, values) == 1:
        events = EventLog(tx)
        _enqueued(events, values)
        events.flush(tx)
        return occurrence_record(values, deduplicated=False)
    existing = tx.first(_BY_KEY, {"key": values["idempotency_key"]})
    _check_existing(None if existing is None else existing._mapping, values)
    assert existing is not None
    return occurrence_record(existing, deduplicated=True)


def _insert_new(tx: Tx, rows: list[dict[str, Any]]) -> set[str]:
    """Insert ``rows`` (distinct identities) but those whose identity is stored already; the
    identities inserted."""
    parts, _ = chunked(rows)
    inserted: set[str] = set()
    for chunk in parts:
        statement = rows_insert(_o, t.OCCURRENCE_COLUMNS, len(chunk), skip_conflicts_on="idempotency_key")
        inserted.update(row[0] for row in tx.all(statement, rows_parameters(t.OCCURRENCE_COLUMNS, chunk)))
    return inserted


def _by_keys(backend: Backend) -> Prepared:
    """The occurrences of the identities ``:keys`` (``_keys_parameter``), one index probe each.

    Where the backend names its statements (PostgreSQL), over a table of the bound values
    (``Backend.text_values``), planned for each call: a named statement's generic plan, made
    while the table was small, scanned it whole as it grew (an ``IN`` list of 100 parameters
    as well). Elsewhere an ``IN`` list."""

    def build() -> Prepared:
        key = _o.c.idempotency_key
        if backend.names_statements:
            wanted = key == backend.text_values("keys")
        else:
            wanted = key.in_(bindparam("keys", expanding=True))
        return Prepared(select(_o).where(wanted), planned_per_call=True)

    return per_backend(("stored identities", backend.name), build)


def _keys_parameter(backend: Backend, keys: list[str]) -> Any:
    return backend.text_values_parameter(keys) if backend.names_statements else keys


def _stored(tx: Tx, keys: list[str]) -> dict[str, Mapping[Any, Any]]:
    """The stored rows of the identities ``keys``, by identity."""
    return {
        row.idempotency_key: row._mapping
        for chunk in chunks(keys)
        for row in tx.all(_by_keys(tx.backend), {"keys": _keys_parameter(tx.backend, list(chunk))})
    }


def enqueue_batch_in(tx: Tx, requests: Sequence[EnqueueRequest]) -> list[Occurrence]:
    """``enqueue_in`` for each request in order, all or nothing.

    Where the backend writes multi-row inserts, the rows of the requests before the first that
    cannot be planned (each identity once) are inserted first, skipping identities already
    stored, and only those are read back; elsewhere, and for :data:`COPY_AT_LEAST` identities or
    more where the backend copies rows, the identities are read first and the new rows inserted
    (or copied) at the end. Every item is judged in order either way, so the error raised is
    the first item's, as if each were enqueued in turn (a failure rolls back any insert with
    the transaction).
    """
    tx.lock_keys(ENQUEUE_LOCKS, map(_identity_lock, requests))
    jobs = _JobCache()
    planned: list[_Planned] = []
    for request in requests:
        try:
            planned.append(_Planned(request, _plan(tx, request, jobs), None))
        except SchedulerKernelError as error:  # raised when its turn comes, after earlier items
            planned.append(_Planned(request, None, error))
            break  # no later item is reached
    firsts: dict[str, dict[str, Any]] = {}
    for item in planned:
        if item.values is not None:
            firsts.setdefault(item.values["idempotency_key"], item.values)
    later: list[dict[str, Any]] = []
    copied = len(firsts) >= COPY_AT_LEAST and tx.copies_rows
    if tx.backend.multi_row_inserts and not copied:
        inserted = _insert_new(tx, list(firsts.values()))
        stored = _stored(tx, [key for key in firsts if key not in inserted])
    else:  # read first, insert once every item is judged
        stored = _stored(tx, list(firsts))
        later = [values for key, values in firsts.items() if key not in stored]
        inserted = {values["idempotency_key"] for values in later}
    events = EventLog(tx)
    results: list[Occurrence] = []
    for index, item in enumerate(planned):
        try:
            if item.values is None:
                assert item.error is not None
                raise item.error
            key = item.values["idempotency_key"]
            existing = stored.get(key)
            if existing is None and key not in inserted:
                raise data_corrupt("Occurrence idempotency identity does not match stored data")
            if existing is not None:
                _check_existing(existing, item.values)
                results.append(occurrence_record(existing, deduplicated=True))
                continue
            stored[key] = item.values  # a later item of the same identity is deduplicated
            _enqueued(events, item.values)
            results.append(occurrence_record(item.values, deduplicated=False))
        except SchedulerKernelError as error:
            with_index(error, index)
            raise
    # A COPY skips no row, and need not: every identity was read under its ``enqueue`` lock,
    # which every insert of an occurrence holds.
    if (
        later
        and not (copied and tx.copy_rows(_o, t.OCCURRENCE_COLUMNS, later))
        and tx.changes(_INSERT, later) != len(later)
    ):
        raise data_corrupt("Occurrence idempotency identity does not match stored data")
    events.flush(tx)
    return results


def list_by_trigger(tx: Tx, job_id: str, trigger_key: str, limit: int) -> list[Occurrence]:
    rows = tx.all(_BY_TRIGGER, {"job_id": job_id, "trigger_key": trigger_key, "limit": limit})
    return [occurrence_record(row) for row in rows]


def enqueue_once_in(tx: Tx, request: EnqueueRequest) -> Occurrence:
    """Return any earlier occurrence of the job + trigger (no payload check), else enqueue.

    The job's row is locked first, so concurrent calls for one job run one at a time and a tick
    is enqueued once."""
    lock_job_row(tx, request.job_id)
    prior = tx.all(_BY_TRIGGER, {"job_id": request.job_id, "trigger_key": request.trigger_key, "limit": 2})
    if len(prior) > 1:
        raise data_corrupt("Multiple occurrences exist for a unique job trigger")
    if prior:
        return occurrence_record(prior[0], deduplicated=True)
    return enqueue_in(tx, request)


def load_occurrence(tx: Tx, occurrence_id: str) -> Occurrence | None:
    row = tx.first(_BY_ID, {"id": occurrence_id})
    return None if row is None else occurrence_record(row)


def enqueue_one_in(tx: Tx, request: EnqueueRequest) -> Occurrence:
    """``enqueue_in`` for an ``enqueue_occurrence`` call: left whole to its writes statement where
    the backend does (``Backend.leave_enqueue_to_writes``; a case that statement does not decide
    runs the call again, the usual way)."""
    if tx.backend.leave_enqueue_to_writes(tx, request, (ENQUEUE_LOCKS, _identity_lock(request))):
        pick = tx.pick
        assert pick is not None
        tx.finish = pick.completed
        return cast(Occurrence, None)  # replaced by tx.finish once the statement ran
    return enqueue_in(tx, request)


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
        is ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH``. As in the seed, the payload is validated
        inside the transaction, after the job lookup: a missing job (``SCHEDULER_NOT_FOUND``) or a
        disabled one (``SCHEDULER_JOB_DISABLED``) is reported before an invalid payload.
        """
        request = normalize_enqueue(job_id, scheduled_for, trigger_key, available_at, payload)
        return self._write(lambda tx: enqueue_one_in(tx, request))

    def enqueue_occurrence_once_per_trigger(
        self,
        *,
        job_id: str,
        scheduled_for: int,
        trigger_key: str,
        available_at: int | None = None,
        payload: Any = OMITTED,
    ) -> Occurrence:
        """Like ``enqueue_occurrence``, but any earlier occurrence of the job + trigger wins.

        The earlier occurrence is returned (``deduplicated=True``) without comparing, or
        validating, ``payload`` (seed: enqueueOccurrenceOncePerTrigger).
        """
        request = normalize_enqueue(job_id, scheduled_for, trigger_key, available_at, payload)
        return self._write(lambda tx: enqueue_once_in(tx, request))

    def get_occurrence(self, occurrence_id: str) -> Occurrence | None:
        """The occurrence, or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(occurrence_id, "occurrenceId")
        return self._read(lambda tx: load_occurrence(tx, identifier))

    def list_occurrences_by_trigger(
        self, *, job_id: str, trigger_key: str, limit: int = DEFAULT_TRIGGER_LIST_LIMIT
    ) -> list[Occurrence]:
        """Occurrences of one job + trigger, oldest first (``limit`` clamped to 1..200)."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(job_id, "jobId")
        key = normalize_key(trigger_key, "triggerKey")
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
        return self._write(lambda tx: enqueue_batch_in(tx, normalized))
