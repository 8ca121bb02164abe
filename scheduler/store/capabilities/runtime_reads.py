"""Runtime-control reads (schema v6): the control record and the narrow listing read model.

Seed 000: ``mapOccurrenceControl``, ``mapRuntimeControlOccurrence``,
``normalizeRuntimeControlEnumeration`` and the ``listRuntimeControlOccurrences`` query.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, case, or_, select
from sqlalchemy.engine import Row

from scheduler.contract.constants import MAX_RUNTIME_CONTROL_OCCURRENCES, RETRY_WAIT, RUNNING
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.runtime_control import (
    normalize_runtime_control_capability,
    scheduler_runtime_control_capability_digest,
)
from scheduler.contract.scalars import is_safe_int, utf16_sorted
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.plumbing.rows import data_corrupt, read_stored_json
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import ControlSummary, OccurrenceControl, RuntimeControlOccurrence

# --------------------------------------------------------------------------- mapping


def _stored_capability(row: Row[Any]) -> dict[str, Any]:
    value = read_stored_json(row.capability_json, "scheduler runtime control capability")
    try:
        return normalize_runtime_control_capability(value)
    except SchedulerKernelError as cause:
        raise data_corrupt(
            f"Stored scheduler runtime-control capability is invalid: {row.occurrence_id}", cause
        ) from cause


def map_occurrence_control(row: Row[Any] | None) -> OccurrenceControl | None:
    """Seed: mapOccurrenceControl (the stored capability digest is re-verified)."""
    if row is None:
        return None
    capability = _stored_capability(row)
    digest = scheduler_runtime_control_capability_digest(capability)
    if digest != row.capability_digest:
        raise data_corrupt(f"Scheduler runtime-control capability digest is invalid: {row.occurrence_id}")
    return OccurrenceControl(
        occurrence_id=row.occurrence_id,
        capability=capability,
        capability_digest=digest,
        state=row.state,
        revision=row.revision,
        pause_request_id=row.pause_request_id,
        resume_request_id=row.resume_request_id,
        expected_fence=row.expected_fence,
        checkpoint=None
        if row.checkpoint_json is None
        else read_stored_json(row.checkpoint_json, "scheduler runtime control checkpoint"),
        requested_at=row.requested_at,
        paused_at=row.paused_at,
        resumed_at=row.resumed_at,
        terminal_at=row.terminal_at,
        updated_at=row.updated_at,
    )


def control_row(tx: Tx, occurrence_id: str) -> Row[Any] | None:
    c = t.occurrence_controls
    return tx.first(select(c).where(c.c.occurrence_id == occurrence_id))


def load_occurrence_control(tx: Tx, occurrence_id: str) -> OccurrenceControl | None:
    return map_occurrence_control(control_row(tx, occurrence_id))


def _current_control(tx: Tx, occurrence_id: str) -> OccurrenceControl:
    control = load_occurrence_control(tx, occurrence_id)
    assert control is not None
    return control


# --------------------------------------------------------------------------- argument rules


def normalize_runtime_control_enumeration(values: object, allowed: Iterable[str], field: str) -> list[str]:
    """A non-empty list/tuple of allowed identifiers, deduplicated and sorted."""
    if not isinstance(values, (list, tuple)) or not values:
        raise invalid_argument(f"{field} must be a non-empty array")
    normalized = list(
        dict.fromkeys(normalize_key(value, f"{field}[{index}]", 128) for index, value in enumerate(values))
    )
    permitted = set(allowed)
    unsupported = [value for value in normalized if value not in permitted]
    if unsupported:
        raise invalid_argument(f"{field} contains unsupported values", {"values": utf16_sorted(unsupported)})
    return utf16_sorted(normalized)


def normalize_runtime_control_limit(value: object) -> int:
    if not is_safe_int(value) or value < 1:
        raise invalid_argument("limit must be a positive integer")
    return min(int(value), MAX_RUNTIME_CONTROL_OCCURRENCES)


# --------------------------------------------------------------------------- listing


def _runtime_status() -> Any:
    c = t.occurrence_controls
    return case(
        (c.c.state == "pause_requested", "pause_requested"),
        (c.c.state == "paused", "paused"),
        else_="running",
    )


def list_runtime_control_occurrences_in(
    tx: Tx, statuses: list[str], job_kinds: list[str] | None, limit: int
) -> list[RuntimeControlOccurrence]:
    """The narrow read model: no payload, authority, lease owner, checkpoint, result or error.

    ``job_kinds=None``: every kind (``list_controllable_occurrences``)."""
    o, j, c = t.occurrences, t.jobs, t.occurrence_controls
    runtime_status = _runtime_status()
    controllable = or_(
        and_(o.c.status == RUNNING, c.c.occurrence_id.is_(None)),
        and_(o.c.status == RUNNING, c.c.state == "pause_requested"),
        and_(o.c.status == RUNNING, c.c.state == "resumed"),
        and_(o.c.status == RETRY_WAIT, c.c.state == "paused"),
    )
    query = (
        select(
            o.c.occurrence_id,
            o.c.job_id,
            j.c.kind.label("job_kind"),
            runtime_status.label("runtime_status"),
            o.c.status.label("occurrence_status"),
            o.c.scheduled_for,
            o.c.attempt,
            o.c.max_attempts,
            o.c.fence,
            o.c.created_at,
            o.c.updated_at,
            c.c.state.label("control_state"),
            c.c.revision.label("control_revision"),
            c.c.expected_fence.label("control_expected_fence"),
            c.c.capability_digest.label("control_capability_digest"),
            c.c.requested_at.label("control_requested_at"),
            c.c.paused_at.label("control_paused_at"),
            c.c.updated_at.label("control_updated_at"),
        )
        .select_from(o.join(j, j.c.job_id == o.c.job_id).outerjoin(c, c.c.occurrence_id == o.c.occurrence_id))
        # The IN repeats what ``controllable`` requires, as an index condition: the store's
        # connection plans without bitmap scans (``opening_postgresql.PLANNER_SQL``), so an OR alone
        # would read every occurrence.
        .where(o.c.status.in_((RUNNING, RETRY_WAIT)), controllable, runtime_status.in_(statuses))
        .order_by(o.c.updated_at.desc(), o.c.occurrence_id.asc())
        .limit(limit)
    )
    if job_kinds is not None:
        query = query.where(j.c.kind.in_(job_kinds))
    return [_map_runtime_control_occurrence(row) for row in tx.execute(query)]


def _map_runtime_control_occurrence(row: Row[Any]) -> RuntimeControlOccurrence:
    control = (
        None
        if row.control_state is None
        else ControlSummary(
            state=row.control_state,
            revision=row.control_revision,
            expected_fence=row.control_expected_fence,
            capability_digest=row.control_capability_digest,
            requested_at=row.control_requested_at,
            paused_at=row.control_paused_at,
            updated_at=row.control_updated_at,
        )
    )
    return RuntimeControlOccurrence(
        id=row.occurrence_id,
        job_id=row.job_id,
        job_kind=row.job_kind,
        runtime_status=row.runtime_status,
        occurrence_status=row.occurrence_status,
        scheduled_for=row.scheduled_for,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        fence=row.fence,
        created_at=row.created_at,
        updated_at=row.updated_at,
        control=control,
    )
