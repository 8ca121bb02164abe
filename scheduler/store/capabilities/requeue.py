"""Dead-letter requeue with evidence compare-and-set (schema v6; seed 000: requeueDeadLetter).

The request row (``scheduler_occurrence_retries``) lets the next claim at the same fence run
without consuming an attempt; that claim bookkeeping lives in ``claim_writes.py``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update

from scheduler.contract.constants import DEAD_LETTER
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.scalars import assert_positive_safe_int
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import (
    load_occurrence,
    load_occurrence_row,
    lock_occurrence_row,
    occurrence_not_found,
)
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.plumbing.constructs import row_check
from scheduler.store.plumbing.rows import read_optional_json
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence, RequeueResult

REQUEUE_CONFLICT = "SCHEDULER_REQUEUE_CONFLICT"


def _current(tx: Tx, occurrence_id: str) -> Occurrence:
    occurrence = load_occurrence(tx, occurrence_id)
    assert occurrence is not None
    return occurrence


def _deduplicated(
    tx: Tx, occurrence_id: str, fence: int, error_code: str, request_id: str
) -> RequeueResult | None:
    r = t.occurrence_retries
    existing = tx.first(select(r).where(r.c.request_id == request_id))
    if existing is None:
        return None
    if (
        existing.occurrence_id != occurrence_id
        or existing.expected_fence != fence
        or existing.expected_error_code != error_code
    ):
        raise SchedulerKernelError(REQUEUE_CONFLICT, "Scheduler retry request evidence changed")
    return RequeueResult(occurrence=_current(tx, occurrence_id), request_id=request_id, deduplicated=True)


def requeue_dead_letter_in(
    tx: Tx, occurrence_id: str, fence: int, error_code: str, request_id: str
) -> RequeueResult:
    """Send a dead letter back to ``retry_wait`` if it is still the one the caller inspected."""
    lock_occurrence_row(tx, occurrence_id)
    replay = _deduplicated(tx, occurrence_id, fence, error_code, request_id)
    if replay is not None:
        return replay
    row = load_occurrence_row(tx, occurrence_id)
    if row is None:
        raise occurrence_not_found(occurrence_id)
    last_error = read_optional_json(row.last_error_json, "occurrence error")
    actual_code = last_error.get("code") if isinstance(last_error, dict) else None
    if row.status != DEAD_LETTER or row.fence != fence or actual_code != error_code:
        raise SchedulerKernelError(
            "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT",
            f"Scheduler dead-letter evidence changed: {occurrence_id}",
            {
                "status": row.status,
                "expectedFence": fence,
                "actualFence": row.fence,
                "expectedErrorCode": error_code,
                "actualErrorCode": actual_code,
            },
        )
    tx.execute(
        insert(t.occurrence_retries).values(
            occurrence_id=occurrence_id,
            request_id=request_id,
            expected_fence=fence,
            expected_error_code=error_code,
            created_at=tx.now,
            claimed_at=None,
        )
    )
    o = t.occurrences
    changed = tx.changes(
        update(o)
        .where(o.c.occurrence_id == occurrence_id, row_check(o.c.status == DEAD_LETTER), o.c.fence == fence)
        .values(status="retry_wait", available_at=tx.now, updated_at=tx.now, settled_at=None)
    )
    if changed != 1:
        raise SchedulerKernelError(
            REQUEUE_CONFLICT, f"Scheduler dead letter changed during requeue: {occurrence_id}"
        )
    tx.append_event(
        job_id=row.job_id,
        occurrence_id=occurrence_id,
        type="occurrence_requeued",
        fence=fence,
        data={"requestId": request_id, "expectedErrorCode": error_code},
    )
    return RequeueResult(occurrence=_current(tx, occurrence_id), request_id=request_id, deduplicated=False)


class RequeueOperations(StoreBase):
    """``requeue_dead_letter``; mixed into ``RuntimeControlOperations``."""

    def requeue_dead_letter(
        self, *, occurrence_id: Any, expected_fence: Any, expected_error_code: Any, request_id: Any
    ) -> RequeueResult:
        """Requeue a dead letter whose fence and error code still match (idempotent by ``request_id``).

        The next claim of the requeued occurrence does not consume an attempt (a run cancelled before
        any claim used none: its first claim is attempt 1).
        """
        identifier = normalize_key(occurrence_id, "occurrenceId")
        fence = assert_positive_safe_int(expected_fence, "expectedFence")
        error_code = normalize_key(expected_error_code, "expectedErrorCode", 128)
        request = normalize_key(request_id, "requestId", 128)
        return self._write(lambda tx: requeue_dead_letter_in(tx, identifier, fence, error_code, request))
