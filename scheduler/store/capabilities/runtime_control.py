"""Durable pause/resume with checkpoints and dead-letter requeue (schema v6).

Seed 000: ``getOccurrenceControl``, ``listRuntimeControlOccurrences``, ``requestOccurrencePause``,
``ackOccurrencePause``, ``resumeOccurrence`` (``requeueDeadLetter`` is in ``requeue.py``). How a
control reacts to claims and the expired-lease sweep lives in ``claim_writes.py``, to
settlements in ``settlement.py``.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Row

from scheduler.contract.canonical import canonical_json, normalize_and_encode_json, sha256_payload_digest
from scheduler.contract.constants import (
    MAX_RUNTIME_CHECKPOINT_BYTES,
    PAUSE_RESUME_CHECKPOINT_V1,
    RETRY_WAIT,
    RUNNING,
    RUNTIME_CONTROL_JOB_KINDS,
    RUNTIME_CONTROL_OCCURRENCE_STATUSES,
    RUNTIME_CONTROL_SAFE_POINTS,
)
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.runtime_control import (
    normalize_runtime_control_capability,
    scheduler_runtime_control_capability_digest,
)
from scheduler.contract.scalars import (
    assert_positive_safe_int,
    is_safe_int,
    utf8_byte_length,
)
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import (
    load_occurrence,
    load_occurrence_row,
    lock_occurrence_row,
    occurrence_not_found,
)
from scheduler.store.capabilities.cancellation import is_cancelled
from scheduler.store.capabilities.requeue import RequeueOperations
from scheduler.store.capabilities.runtime_reads import (
    control_row,
    list_runtime_control_occurrences_in,
    load_occurrence_control,
    map_occurrence_control,
    normalize_runtime_control_enumeration,
    normalize_runtime_control_limit,
)
from scheduler.store.capabilities.settlement import lease_lost
from scheduler.store.plumbing.constructs import row_check
from scheduler.store.plumbing.rows import read_optional_json
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import ControlResult, OccurrenceControl, RuntimeControlOccurrence

RESUME_REQUEST_LOCKS = "resume_request"

__all__ = [
    "RuntimeControlOperations",
    "lease_lost",
    "load_occurrence_control",
    "map_occurrence_control",
    "normalize_runtime_checkpoint",
]

CONTROL_CONFLICT: Final = "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT"
REVISION_CONFLICT: Final = "SCHEDULER_REVISION_CONFLICT"


def _revision_conflict(occurrence_id: str, expected: int, actual: int) -> SchedulerKernelError:
    return SchedulerKernelError(
        REVISION_CONFLICT,
        f"Scheduler occurrence control revision changed: {occurrence_id}",
        {"expectedRevision": expected, "actualRevision": actual},
    )


def _current_control(tx: Tx, occurrence_id: str) -> OccurrenceControl:
    control = load_occurrence_control(tx, occurrence_id)
    assert control is not None
    return control


def _control_result(tx: Tx, occurrence_id: str) -> ControlResult:
    occurrence = load_occurrence(tx, occurrence_id)
    assert occurrence is not None
    return ControlResult(control=_current_control(tx, occurrence_id), occurrence=occurrence)


# --------------------------------------------------------------------------- argument rules


def normalize_runtime_checkpoint(safe_point: str, data: object) -> tuple[Any, str]:
    """The stored checkpoint ``{schemaVersion: 1, safePoint, data}`` and its canonical text (≤ 64 KiB)."""
    field = "runtimeControl.checkpoint"
    checkpoint, encoded = normalize_and_encode_json(
        {"schemaVersion": 1, "safePoint": safe_point, "data": data}, field
    )
    if utf8_byte_length(encoded) > MAX_RUNTIME_CHECKPOINT_BYTES:
        raise invalid_argument(f"{field} exceeds {MAX_RUNTIME_CHECKPOINT_BYTES} encoded bytes")
    return checkpoint, encoded


def _normalize_pause_expected_revision(value: object) -> int | None:
    if value is None:
        return None
    if not is_safe_int(value) or value < 0:
        raise invalid_argument("expectedRevision must be a non-negative integer")
    return int(value)


def _normalize_safe_point(value: object) -> str:
    point = normalize_key(value, "safePoint", 64)
    if point not in RUNTIME_CONTROL_SAFE_POINTS:
        raise invalid_argument("safePoint is not a scheduler runtime safe point")
    return point


# --------------------------------------------------------------------------- pause request


def _replayed_pause(
    tx: Tx, occurrence_id: str, request: dict[str, Any], current: Row[Any] | None
) -> OccurrenceControl | None:
    """The existing control when this request was already recorded (``None`` otherwise)."""
    c = t.occurrence_controls
    owner = tx.first(select(c.c.occurrence_id).where(c.c.pause_request_id == request["request_id"]))
    if owner is not None and owner.occurrence_id != occurrence_id:
        raise SchedulerKernelError(
            CONTROL_CONFLICT, "Scheduler pause request is already bound to another occurrence"
        )
    if current is None or current.pause_request_id != request["request_id"]:
        return None
    if (
        current.expected_fence != request["fence"]
        or current.capability_digest != request["capability_digest"]
    ):
        raise SchedulerKernelError(
            CONTROL_CONFLICT, f"Scheduler pause request evidence changed: {occurrence_id}"
        )
    control = map_occurrence_control(current)
    assert control is not None
    replayed: OccurrenceControl = control.replace(deduplicated=True)
    return replayed


def _assert_pausable(tx: Tx, occurrence: Row[Any], current: Row[Any] | None, request: dict[str, Any]) -> None:
    occurrence_id = occurrence.occurrence_id
    actual_revision = 0 if current is None else int(current.revision)
    expected_revision = request["expected_revision"]
    if expected_revision is not None and actual_revision != expected_revision:
        raise _revision_conflict(occurrence_id, expected_revision, actual_revision)
    if current is not None and current.state != "terminal":
        raise SchedulerKernelError(
            CONTROL_CONFLICT,
            f"Scheduler occurrence already has an active runtime control: {occurrence_id}",
            {"state": current.state, "revision": current.revision},
        )
    if occurrence.status != RUNNING:
        raise SchedulerKernelError(
            "SCHEDULER_OCCURRENCE_NOT_RUNNING",
            f"Scheduler occurrence is not running: {occurrence_id}",
            {"status": occurrence.status},
        )
    if occurrence.fence != request["fence"]:
        raise SchedulerKernelError(
            "SCHEDULER_FENCE_CONFLICT",
            f"Scheduler occurrence fence changed: {occurrence_id}",
            {"expectedFence": request["fence"], "actualFence": occurrence.fence},
        )
    if occurrence.lease_expires_at <= tx.now:
        raise lease_lost(occurrence_id)


def _write_pause_request(
    tx: Tx, occurrence_id: str, current: Row[Any] | None, request: dict[str, Any]
) -> None:
    c = t.occurrence_controls
    values = {
        "capability_json": request["capability_json"],
        "capability_digest": request["capability_digest"],
        "state": "pause_requested",
        "pause_request_id": request["request_id"],
        "resume_request_id": None,
        "expected_fence": request["fence"],
        "checkpoint_json": None,
        "requested_at": tx.now,
        "paused_at": None,
        "resumed_at": None,
        "terminal_at": None,
        "updated_at": tx.now,
    }
    if current is None:
        tx.execute(insert(c).values(occurrence_id=occurrence_id, revision=1, **values))
    else:
        tx.execute(
            update(c)
            .where(c.c.occurrence_id == occurrence_id, c.c.state == "terminal")
            .values(revision=c.c.revision + 1, **values)
        )


def request_occurrence_pause_in(tx: Tx, occurrence_id: str, request: dict[str, Any]) -> OccurrenceControl:
    """Ask the running owner to pause at a declared safe point (idempotent by request id)."""
    lock_occurrence_row(tx, occurrence_id)
    occurrence = load_occurrence_row(tx, occurrence_id)
    if occurrence is None:
        raise occurrence_not_found(occurrence_id)
    current = control_row(tx, occurrence_id)
    replayed = _replayed_pause(tx, occurrence_id, request, current)
    if replayed is not None:
        return replayed
    _assert_pausable(tx, occurrence, current, request)
    _write_pause_request(tx, occurrence_id, current, request)
    control = _current_control(tx, occurrence_id)
    tx.append_event(
        job_id=occurrence.job_id,
        occurrence_id=occurrence_id,
        type="occurrence_pause_requested",
        fence=request["fence"],
        data={
            "requestId": request["request_id"],
            "controlRevision": control.revision,
            "capabilityDigest": request["capability_digest"],
        },
    )
    created: OccurrenceControl = control.replace(deduplicated=False)
    return created


# --------------------------------------------------------------------------- pause acknowledgement


def _loaded_pair(
    tx: Tx, occurrence_id: str, *, refuse_cancelled: bool = False
) -> tuple[Row[Any], OccurrenceControl]:
    occurrence = load_occurrence_row(tx, occurrence_id)
    if (
        refuse_cancelled
        and occurrence is not None
        and is_cancelled(
            occurrence.status, read_optional_json(occurrence.last_error_json, "occurrence error")
        )
    ):
        # cancel_occurrence fenced the owner out (and terminalized any control): the lease is gone
        raise lease_lost(occurrence_id)
    control = load_occurrence_control(tx, occurrence_id)
    if occurrence is None or control is None:
        raise SchedulerKernelError(
            "SCHEDULER_NOT_FOUND", f"Scheduler occurrence control does not exist: {occurrence_id}"
        )
    return occurrence, control


def _assert_ack(tx: Tx, occurrence: Row[Any], control: OccurrenceControl, ack: dict[str, Any]) -> None:
    occurrence_id = control.occurrence_id
    if control.state != "pause_requested" or control.pause_request_id != ack["request_id"]:
        raise SchedulerKernelError(
            CONTROL_CONFLICT,
            f"Scheduler pause request is no longer pending: {occurrence_id}",
            {"state": control.state, "revision": control.revision},
        )
    if control.revision != ack["revision"]:
        raise _revision_conflict(occurrence_id, ack["revision"], control.revision)
    if (
        control.expected_fence != ack["fence"]
        or occurrence.status != RUNNING
        or occurrence.fence != ack["fence"]
        or occurrence.lease_owner != ack["owner_id"]
        or occurrence.lease_expires_at <= tx.now
    ):
        raise lease_lost(occurrence_id)
    if ack["safe_point"] not in control.capability["safePoints"]:
        raise SchedulerKernelError(
            "SCHEDULER_PAUSE_UNSUPPORTED_SAFE_POINT",
            f"Scheduler adapter did not declare pause safety at {ack['safe_point']}",
        )


def _park_occurrence(tx: Tx, occurrence_id: str, ack: dict[str, Any]) -> None:
    o = t.occurrences
    changed = tx.changes(
        update(o)
        .where(
            o.c.occurrence_id == occurrence_id,
            row_check(o.c.status == RUNNING),
            o.c.lease_owner == ack["owner_id"],
            o.c.fence == ack["fence"],
            o.c.lease_expires_at > tx.now,
        )
        .values(
            status=RETRY_WAIT,
            available_at=tx.now,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=tx.now,
            settled_at=None,
        )
    )
    if changed != 1:
        raise lease_lost(occurrence_id)


def _mark_paused(tx: Tx, occurrence_id: str, ack: dict[str, Any]) -> None:
    c = t.occurrence_controls
    changed = tx.changes(
        update(c)
        .where(
            c.c.occurrence_id == occurrence_id,
            c.c.state == "pause_requested",
            c.c.revision == ack["revision"],
            c.c.pause_request_id == ack["request_id"],
            c.c.expected_fence == ack["fence"],
        )
        .values(
            state="paused",
            revision=c.c.revision + 1,
            checkpoint_json=ack["checkpoint_json"],
            paused_at=tx.now,
            updated_at=tx.now,
        )
    )
    if changed != 1:
        raise SchedulerKernelError(
            CONTROL_CONFLICT, f"Scheduler pause acknowledgement lost its CAS: {occurrence_id}"
        )


def ack_occurrence_pause_in(tx: Tx, occurrence_id: str, ack: dict[str, Any]) -> ControlResult:
    """The owner confirms the pause: store the checkpoint, park the occurrence without using an attempt."""
    lock_occurrence_row(tx, occurrence_id)
    occurrence, control = _loaded_pair(tx, occurrence_id, refuse_cancelled=True)
    _assert_ack(tx, occurrence, control, ack)
    _park_occurrence(tx, occurrence_id, ack)
    _mark_paused(tx, occurrence_id, ack)
    tx.append_event(
        job_id=occurrence.job_id,
        occurrence_id=occurrence_id,
        type="occurrence_paused",
        fence=ack["fence"],
        data={
            "requestId": ack["request_id"],
            "safePoint": ack["safe_point"],
            "checkpointDigest": sha256_payload_digest(ack["checkpoint"], "runtimeControl.checkpoint"),
        },
    )
    return _control_result(tx, occurrence_id)


# --------------------------------------------------------------------------- resume


def _assert_resumable(occurrence: Row[Any], control: OccurrenceControl, revision: int) -> None:
    occurrence_id = control.occurrence_id
    if control.state != "paused":
        raise SchedulerKernelError(
            CONTROL_CONFLICT,
            f"Scheduler occurrence is not paused: {occurrence_id}",
            {"state": control.state, "revision": control.revision},
        )
    if control.revision != revision:
        raise _revision_conflict(occurrence_id, revision, control.revision)
    if (
        occurrence.status != RETRY_WAIT
        or occurrence.lease_owner is not None
        or occurrence.lease_expires_at is not None
    ):
        raise SchedulerKernelError(
            CONTROL_CONFLICT, f"Paused occurrence state is inconsistent: {occurrence_id}"
        )


def resume_occurrence_in(tx: Tx, occurrence_id: str, revision: int, request_id: str) -> ControlResult:
    """Make a paused occurrence claimable again (idempotent by resume request id).

    The request id is held first (it binds to one occurrence), then the occurrence's row."""
    tx.lock_keys(RESUME_REQUEST_LOCKS, [request_id])
    lock_occurrence_row(tx, occurrence_id)
    occurrence, control = _loaded_pair(tx, occurrence_id)
    c = t.occurrence_controls
    owner = tx.first(select(c.c.occurrence_id).where(c.c.resume_request_id == request_id))
    if owner is not None and owner.occurrence_id != occurrence_id:
        raise SchedulerKernelError(
            CONTROL_CONFLICT, "Scheduler resume request is already bound to another occurrence"
        )
    if control.resume_request_id == request_id:
        current = load_occurrence(tx, occurrence_id)
        assert current is not None
        return ControlResult(control=control.replace(deduplicated=True), occurrence=current)
    _assert_resumable(occurrence, control, revision)
    changed = tx.changes(
        update(c)
        .where(c.c.occurrence_id == occurrence_id, c.c.state == "paused", c.c.revision == revision)
        .values(
            state="resumed",
            revision=c.c.revision + 1,
            resume_request_id=request_id,
            resumed_at=tx.now,
            updated_at=tx.now,
        )
    )
    if changed != 1:
        raise SchedulerKernelError(
            CONTROL_CONFLICT, f"Scheduler resume request lost its CAS: {occurrence_id}"
        )
    o = t.occurrences
    tx.execute(
        update(o)
        .where(o.c.occurrence_id == occurrence_id, row_check(o.c.status == RETRY_WAIT))
        .values(available_at=tx.now, updated_at=tx.now)
    )
    tx.append_event(
        job_id=occurrence.job_id,
        occurrence_id=occurrence_id,
        type="occurrence_resume_requested",
        fence=occurrence.fence,
        data={"requestId": request_id, "controlRevision": revision + 1},
    )
    return _control_result(tx, occurrence_id)


class RuntimeControlOperations(RequeueOperations):
    """Public runtime-control methods of ``SchedulerStore`` (plus ``requeue_dead_letter``)."""

    def get_occurrence_control(self, occurrence_id: Any) -> OccurrenceControl | None:
        """The occurrence's runtime control, or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(occurrence_id, "occurrenceId")
        return self._read(lambda tx: load_occurrence_control(tx, identifier))

    def list_runtime_control_occurrences(
        self,
        *,
        statuses: Any = RUNTIME_CONTROL_OCCURRENCE_STATUSES,
        job_kinds: Any = RUNTIME_CONTROL_JOB_KINDS,
        limit: Any = 50,
    ) -> list[RuntimeControlOccurrence]:
        """Running, pause-requested and paused occurrences of the given kinds, most recently updated first."""
        self._assert_open()  # seed: a read checks the store before its arguments
        selected_statuses = normalize_runtime_control_enumeration(
            statuses, RUNTIME_CONTROL_OCCURRENCE_STATUSES, "statuses"
        )
        selected_kinds = normalize_runtime_control_enumeration(
            job_kinds, RUNTIME_CONTROL_JOB_KINDS, "jobKinds"
        )
        bounded = normalize_runtime_control_limit(limit)
        return self._read(
            lambda tx: list_runtime_control_occurrences_in(tx, selected_statuses, selected_kinds, bounded)
        )

    def request_occurrence_pause(
        self,
        *,
        occurrence_id: Any,
        expected_fence: Any,
        request_id: Any,
        capability: Any = None,
        expected_revision: Any = None,
    ) -> OccurrenceControl:
        """Request a durable pause of a running occurrence whose adapter declares ``checkpoint_v1``.

        ``capability``: ``{"pauseResume": "checkpoint_v1", "safePoints": [...]}``, the safe points
        drawn from ``scheduler.contract.RUNTIME_CONTROL_SAFE_POINTS`` (``"before_execute"``,
        ``"adapter_checkpoint"``; any other is ``SCHEDULER_INVALID_ARGUMENT``). ``None`` declares
        nothing: ``SCHEDULER_PAUSE_UNSUPPORTED``. Idempotent by ``request_id`` (seed:
        ``requestOccurrencePause``)."""
        identifier = normalize_key(occurrence_id, "occurrenceId")
        fence = assert_positive_safe_int(expected_fence, "expectedFence")
        request = normalize_key(request_id, "requestId", 128)
        revision = _normalize_pause_expected_revision(expected_revision)
        declared = normalize_runtime_control_capability(capability)
        if declared["pauseResume"] != PAUSE_RESUME_CHECKPOINT_V1:
            raise SchedulerKernelError(
                "SCHEDULER_PAUSE_UNSUPPORTED",
                "Scheduler adapter does not declare durable checkpoint pause/resume",
            )
        pause = {
            "fence": fence,
            "request_id": request,
            "expected_revision": revision,
            "capability_json": canonical_json(declared, "runtimeControl.capability"),
            "capability_digest": scheduler_runtime_control_capability_digest(declared),
        }
        return self._write(lambda tx: request_occurrence_pause_in(tx, identifier, pause))

    def ack_occurrence_pause(
        self,
        *,
        occurrence_id: Any,
        owner_id: Any,
        fence: Any,
        request_id: Any,
        expected_revision: Any,
        safe_point: Any,
        checkpoint: Any = None,
    ) -> ControlResult:
        """The lease owner acknowledges a pending pause at ``safe_point`` with an optional checkpoint."""
        identifier = normalize_key(occurrence_id, "occurrenceId")
        ack: dict[str, Any] = {
            "owner_id": normalize_key(owner_id, "ownerId"),
            "fence": assert_positive_safe_int(fence, "fence"),
            "request_id": normalize_key(request_id, "requestId", 128),
            "revision": assert_positive_safe_int(expected_revision, "expectedRevision"),
            "safe_point": _normalize_safe_point(safe_point),
        }
        ack["checkpoint"], ack["checkpoint_json"] = normalize_runtime_checkpoint(
            ack["safe_point"], checkpoint
        )
        return self._write(lambda tx: ack_occurrence_pause_in(tx, identifier, ack))

    def resume_occurrence(
        self, *, occurrence_id: Any, expected_revision: Any, request_id: Any
    ) -> ControlResult:
        """Resume a paused occurrence; its next claim does not consume an attempt."""
        identifier = normalize_key(occurrence_id, "occurrenceId")
        revision = assert_positive_safe_int(expected_revision, "expectedRevision")
        request = normalize_key(request_id, "requestId", 128)
        return self._write(lambda tx: resume_occurrence_in(tx, identifier, revision, request))
