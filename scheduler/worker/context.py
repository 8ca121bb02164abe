"""``ctx``: what a handler gets besides its occurrence (API §9)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final

from scheduler.contract.constants import SAFE_POINT_ADAPTER_CHECKPOINT, SAFE_POINT_BEFORE_EXECUTE
from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.records import Occurrence, OccurrenceControl
from scheduler.worker.lease_keeper import LEASE_LOST, Lease, LeaseKeeper
from scheduler.worker.policy import Paused

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

HANDLER_LOGGER: Final = "scheduler.worker.handler"
_CHANGED_UNDERNEATH: Final = (
    "SCHEDULER_REVISION_CONFLICT",
    "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT",
    "SCHEDULER_NOT_FOUND",
    "SCHEDULER_STORAGE_UNAVAILABLE",
)
log = logging.getLogger("scheduler.worker")


def resumed_data(control: OccurrenceControl | None, fence: int) -> Any:
    """The checkpoint ``state`` a paused run left, when this claim resumes it (else ``None``)."""
    if control is None or control.state != "resumed" or control.expected_fence != fence:
        return None
    checkpoint = control.checkpoint
    return checkpoint.get("data") if isinstance(checkpoint, dict) else None


class HandlerContext:
    """The handler's view of its claim.

    Attributes: ``store`` (the worker's store), ``occurrence``, ``kind`` (the job kind),
    ``owner_id``, ``fence``, ``logger`` (a ``LoggerAdapter`` of ``scheduler.worker.handler`` carrying
    ``occurrence``/``job``/``kind``/``owner``/``fence``/``attempt`` extra fields), ``resumed_checkpoint``.
    """

    def __init__(
        self,
        *,
        store: SchedulerStore,
        lease: Lease,
        keeper: LeaseKeeper,
        kind: str,
        control: OccurrenceControl | None,
        pause_check_ms: int,
    ) -> None:
        self.store = store
        self.occurrence: Occurrence = lease.occurrence
        self.kind = kind
        self.owner_id = lease.owner_id
        self.fence = lease.fence
        self._lease = lease
        self._keeper = keeper
        self._control = control
        self._pause_check_s = pause_check_ms / 1000
        self._checked_at: float | None = None
        self.resumed_checkpoint: Any = resumed_data(control, lease.fence)
        """The ``state`` given to ``ctx.checkpoint(state)`` by the run that paused, when this run
        resumes it; ``None`` otherwise."""
        self.logger = logging.LoggerAdapter(
            logging.getLogger(HANDLER_LOGGER), {**lease.extra(), "kind": kind}
        )

    @property
    def should_stop(self) -> bool:
        """True once the result can no longer be settled (lease lost, or the shutdown grace period
        is over): stop working and return; whatever the handler returns is discarded."""
        return self._lease.lost or self._lease.abandoned

    def renew(self) -> Occurrence:
        """Renew the lease now (the worker also renews in the background).

        Raises ``SchedulerKernelError`` (``SCHEDULER_LEASE_LOST`` also sets ``should_stop``).
        """
        return self._keeper.renew_now(self._lease)

    def checkpoint(self, state: Any = None) -> None:
        """A safe point. If a pause was requested for this run, acknowledge it with ``state`` (JSON,
        at most 64 KiB encoded) and raise :class:`~scheduler.worker.Paused`; otherwise return.

        The store is asked at most once per ``pause_check_ms`` (the first call always asks). A
        ``state`` that is not JSON raises ``SCHEDULER_INVALID_ARGUMENT`` when a pause is acknowledged.
        """
        if self._lease.parked:
            raise Paused(self.occurrence.id, state)
        if self.should_stop:
            return
        now = time.monotonic()
        if self._checked_at is not None and now - self._checked_at < self._pause_check_s:
            return
        self._checked_at = now
        try:
            control = self.store.get_occurrence_control(self.occurrence.id)
        except SchedulerKernelError as error:
            log.debug("pause check failed: %s", error.code, extra=self._lease.extra())
            return
        self.pause_if_requested(control, SAFE_POINT_ADAPTER_CHECKPOINT, state)

    def pause_if_requested(
        self, control: OccurrenceControl | None, safe_point: str, state: Any = None
    ) -> None:
        """Acknowledge a pending pause at ``safe_point`` if the request declared it; raise ``Paused``."""
        if (
            control is None
            or control.state != "pause_requested"
            or control.expected_fence != self.fence
            or safe_point not in control.capability.get("safePoints", ())
        ):
            return
        lease = self._lease
        lease.parked = True  # the keeper stops renewing: after the ack the lease is gone
        try:
            self.store.ack_occurrence_pause(
                occurrence_id=self.occurrence.id,
                owner_id=self.owner_id,
                fence=self.fence,
                request_id=control.pause_request_id,
                expected_revision=control.revision,
                safe_point=safe_point,
                checkpoint=state,
            )
        except SchedulerKernelError as error:
            lease.parked = False
            if error.code == LEASE_LOST:
                lease.lost = True
                return
            if error.code in _CHANGED_UNDERNEATH:
                self._checked_at = None  # ask again at the next safe point
                return
            raise
        lease.log(log, logging.INFO, "paused at %s", safe_point)
        raise Paused(self.occurrence.id, state)

    def pause_before_execute(self) -> None:
        """The ``before_execute`` safe point: honoured before the handler is called."""
        self.pause_if_requested(self._control, SAFE_POINT_BEFORE_EXECUTE)
