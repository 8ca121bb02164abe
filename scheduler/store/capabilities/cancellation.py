"""Cancellation of an occurrence by an operator or the application (API §12, beyond the original).

A cancelled occurrence is a dead letter with ``lastError.code == "CANCELLED"`` and its fence
increased by one. It is written like a settlement's dead letter (``settlement.py``): an open
authority reservation is failed, an open runtime control terminalized and a pending adjudication
applied, and ``occurrence_dead_lettered`` is appended at ``settled_at`` (so the dead-letter
listing's event walk, ``dead_letters.py``, finds it). Before it, ``occurrence_cancelled`` records
what was cancelled; a run cancelled while ``running`` is marked ``outcomeUnknown`` there (its
effects may be partly applied), but its error code is no ``*_OUTCOME_UNKNOWN`` code, so it is no
adjudication case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import bindparam, update

from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import (
    CANCELLED_ERROR_CODE,
    DEAD_LETTER,
    MAX_CANCEL_REASON_CHARS,
    QUEUED,
    RETRY_WAIT,
    RUNNING,
)
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import lock_occurrence_row, occurrence_not_found
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.capabilities.settlement import (
    CURRENT_ROWS,
    TERMINALIZE_CONTROL,
    settle_adjudication,
    settle_reservation,
    settlement_event_data,
)
from scheduler.store.plumbing.constructs import row_check
from scheduler.store.plumbing.rows import read_optional_json
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

CANCELLABLE: Final = frozenset({QUEUED, RETRY_WAIT, RUNNING})
DEFAULT_CANCEL_MESSAGE: Final = "cancelled"
_OPEN_CONTROL_STATES: Final = frozenset({"pause_requested", "paused", "resumed"})

_o = t.occurrences
_READ: Final = Prepared(CURRENT_ROWS.where(_o.c.occurrence_id == bindparam("p_id")))
"""The occurrence with its control, reservation and adjudication, read after its row is locked
(a statement of its own, so on PostgreSQL it sees what the transaction it waited for wrote)."""
_CANCEL: Final = Prepared(
    update(_o)
    .where(
        _o.c.occurrence_id == bindparam("p_id"),
        row_check(_o.c.status == bindparam("p_status")),
        _o.c.fence == bindparam("p_fence"),
    )
    .values(
        status=DEAD_LETTER,
        fence=bindparam("p_next_fence"),
        lease_owner=None,
        lease_expires_at=None,
        last_error_json=bindparam("p_error"),
        updated_at=bindparam("p_now"),
        settled_at=bindparam("p_now"),
    )
)


def normalize_cancel_reason(value: Any) -> str | None:
    """``None`` or a string of at most ``MAX_CANCEL_REASON_CHARS`` characters (kept inside JSON,
    so any text is storable)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_argument("reason must be a string")
    if len(value) > MAX_CANCEL_REASON_CHARS:
        raise invalid_argument(f"reason must be at most {MAX_CANCEL_REASON_CHARS} characters")
    return value


def is_cancelled(status: str, last_error: Any) -> bool:
    """Whether an occurrence's status and ``lastError`` say it was cancelled."""
    return (
        status == DEAD_LETTER
        and isinstance(last_error, dict)
        and last_error.get("code") == CANCELLED_ERROR_CODE
    )


def _terminalize_control(tx: Tx, current: Mapping[str, Any]) -> bool:
    state = current["control_state"]
    if state not in _OPEN_CONTROL_STATES:
        return False
    params = {"p_id": current["occurrence_id"], "p_state": state, "p_now": tx.now}
    return tx.changes(TERMINALIZE_CONTROL, params) == 1


def cancel_in(tx: Tx, occurrence_id: str, reason: str | None) -> Occurrence:
    """Dead-letter a queued, waiting or running occurrence as ``CANCELLED`` (see the module doc)."""
    lock_occurrence_row(tx, occurrence_id)
    row = tx.first(_READ, {"p_id": occurrence_id})
    if row is None:
        raise occurrence_not_found(occurrence_id)
    current: dict[str, Any] = dict(row._mapping)
    status = current["status"]
    last_error = read_optional_json(current["last_error_json"], "occurrence error")
    if is_cancelled(status, last_error):
        return occurrence_record(current)
    if status not in CANCELLABLE:
        code = last_error.get("code") if isinstance(last_error, dict) else None
        raise SchedulerKernelError(
            "SCHEDULER_CONFLICT",
            f"Scheduler occurrence is already settled and cannot be cancelled: {occurrence_id}",
            {"status": status, "errorCode": code},
        )
    now, fence = tx.now, current["fence"]
    error = {"code": CANCELLED_ERROR_CODE, "message": reason or DEFAULT_CANCEL_MESSAGE}
    error_json = canonical_json(error, "occurrence.error")
    params = {
        "p_id": occurrence_id,
        "p_status": status,
        "p_fence": fence,
        "p_next_fence": fence + 1,
        "p_error": error_json,
        "p_now": now,
    }
    if tx.changes(_CANCEL, params) != 1:  # the row is locked: only a broken invariant gets here
        raise SchedulerKernelError("SCHEDULER_CONFLICT", f"Scheduler occurrence changed: {occurrence_id}")
    terminalized = _terminalize_control(tx, current)
    outcome = {"status": DEAD_LETTER, "error": error}
    settle_reservation(tx, current, DEAD_LETTER, outcome)
    pending_adjudication = current["adjudication_status"] == "pending"
    settle_adjudication(tx, current, DEAD_LETTER, outcome)
    cancelled: dict[str, Any] = {
        "reason": reason,
        "previousStatus": status,
        "previousFence": fence,
        "previousOwner": current["lease_owner"],
    }
    if status == RUNNING:
        cancelled["outcomeUnknown"] = True
    dead_lettered = settlement_event_data(
        current, DEAD_LETTER, current["available_at"], pending_adjudication, terminalized
    )
    dead_lettered["reason"] = "cancelled"
    for event_type, data in (
        ("occurrence_cancelled", cancelled),
        ("occurrence_dead_lettered", dead_lettered),
    ):
        tx.append_event(
            job_id=current["job_id"], occurrence_id=occurrence_id, type=event_type, fence=fence + 1, data=data
        )
    changes = {
        "status": DEAD_LETTER,
        "fence": fence + 1,
        "lease_owner": None,
        "lease_expires_at": None,
        "last_error_json": error_json,
        "updated_at": now,
        "settled_at": now,
    }
    return occurrence_record(current, changes)


class CancellationOperations(StoreBase):
    """``cancel_occurrence`` of ``SchedulerStore``."""

    def cancel_occurrence(self, *, occurrence_id: str, reason: str | None = None) -> Occurrence:
        """Cancel a ``queued``, ``retry_wait`` or ``running`` occurrence: it becomes a dead letter.

        One write transaction. ``lastError`` becomes ``{"code": "CANCELLED", "message": reason or
        "cancelled"}`` and the fence increases by one, so the former lease owner's ``renew``,
        ``settle`` and ``ack_occurrence_pause`` get ``SCHEDULER_LEASE_LOST`` and write nothing,
        and ``requeue_dead_letter(expected_error_code="CANCELLED", expected_fence=<the new
        fence>)`` can put it back. Any lease state is cancelled (an expired lease is not swept
        first), a paused or pause-requested one included: an open runtime control is
        terminalized, an open authority reservation failed and a pending adjudication applied,
        as for a settlement's dead letter. Events: ``occurrence_cancelled`` (``reason``,
        ``previousStatus``, ``previousFence``, ``previousOwner``, and ``"outcomeUnknown": true``
        when it was running: its effects may be partly applied) then ``occurrence_dead_lettered``
        (``"reason": "cancelled"``); it is not an adjudication case.

        An occurrence already cancelled is returned unchanged (nothing written). Errors:
        ``SCHEDULER_CONFLICT`` for a ``succeeded`` occurrence or a dead letter for another reason
        (``details``: ``status``, ``errorCode``); ``SCHEDULER_NOT_FOUND`` for an unknown id;
        ``SCHEDULER_INVALID_ARGUMENT`` for an invalid id or a ``reason`` that is not a string of
        at most 2,000 characters (checked before anything is read).
        """
        identifier = normalize_key(occurrence_id, "occurrenceId")
        normalized = normalize_cancel_reason(reason)
        return self._write(lambda tx: cancel_in(tx, identifier, normalized))
