"""Background lease renewal for the occurrences a worker holds.

One thread renews every held lease at most a third of ``lease_ms`` after its claim or last renewal.
A renewal that reports ``SCHEDULER_LEASE_LOST`` marks the lease lost (``ctx.should_stop`` becomes
true and the worker will not settle the result); a transient storage failure is retried sooner.
Scheduling uses the monotonic clock; whether a lease is live is the store's decision.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.plumbing.telemetry import describe
from scheduler.store.records import Occurrence

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

LEASE_LOST: Final = "SCHEDULER_LEASE_LOST"
STORAGE_UNAVAILABLE: Final = "SCHEDULER_STORAGE_UNAVAILABLE"
STORE_CLOSED: Final = "SCHEDULER_STORE_CLOSED"
_RETRY_AFTER_FAILURE_S: Final = 0.5
_GIVE_BACK_RETRIES_S: Final = (0.05, 0.2, None)
"""Pauses between the tries of a release that met a transient storage failure (``None``: the last)."""

log = logging.getLogger("scheduler.worker.leases")


@dataclass(eq=False)
class Lease:
    """A claimed occurrence this worker holds (mutable: shared by its lane, its ctx and the keeper)."""

    occurrence: Occurrence
    owner_id: str
    lease_ms: int
    renewed_at: float = field(default_factory=time.monotonic)
    lost: bool = False
    """A renew or settle reported ``SCHEDULER_LEASE_LOST``: the result must not be settled."""
    abandoned: bool = False
    """The worker gave up on it (shutdown grace period over): the result must not be settled."""
    parked: bool = False
    """Paused (or being paused) at a checkpoint: no more renewals, no settlement."""
    kind: str | None = None
    """The job kind, once the worker read it (for log records)."""

    @property
    def occurrence_id(self) -> str:
        return self.occurrence.id

    @property
    def fence(self) -> int:
        return self.occurrence.fence

    @property
    def settleable(self) -> bool:
        return not (self.lost or self.abandoned or self.parked)

    def log(
        self,
        logger: logging.Logger,
        level: int,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
        **fields: object,
    ) -> None:
        """``message % args`` about this lease, naming it (``describe``) in the text and in ``extra``
        (with ``fields`` added there)."""
        extra = {**self.extra(), **fields}
        logger.log(level, f"{message} %s", *args, describe(extra), exc_info=exc_info, extra=extra)

    def extra(self) -> dict[str, object]:
        """Structured ``extra`` fields for log records about this lease."""
        return {
            "occurrence": self.occurrence.id,
            "job": self.occurrence.job_id,
            "owner": self.owner_id,
            "kind": self.kind,
            "fence": self.occurrence.fence,
            "attempt": self.occurrence.attempt,
        }


class LeaseKeeper:
    """Renews held leases from one daemon thread, each at most ``lease_ms / 3`` apart."""

    def __init__(self, store: SchedulerStore, lease_ms: int) -> None:
        self._store = store
        self._interval_s = lease_ms / 3 / 1000
        self._leases: dict[str, Lease] = {}
        self._retry_at: dict[str, float] = {}
        self._condition = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._condition:
            if self._thread is None:
                self._stopped = False
                self._thread = threading.Thread(target=self._loop, name="scheduler-lease-keeper", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def hold(self, occurrence: Occurrence, owner_id: str, lease_ms: int) -> Lease:
        lease = Lease(occurrence, owner_id, lease_ms)
        with self._condition:
            self._leases[occurrence.id] = lease
            self._condition.notify_all()
        return lease

    def release(self, lease: Lease) -> None:
        with self._condition:
            if self._leases.get(lease.occurrence_id) is lease:
                del self._leases[lease.occurrence_id]
                self._retry_at.pop(lease.occurrence_id, None)

    def held(self) -> list[Lease]:
        with self._condition:
            return list(self._leases.values())

    def renew_now(self, lease: Lease) -> Occurrence:
        """Renew one lease at once (``ctx.renew()``); ``SCHEDULER_LEASE_LOST`` marks it lost and is raised."""
        try:
            renewed = self._store.renew(
                occurrence_id=lease.occurrence_id,
                owner_id=lease.owner_id,
                fence=lease.fence,
                lease_ms=lease.lease_ms,
            )
        except SchedulerKernelError as error:
            if error.code == LEASE_LOST:
                self._mark_lost(lease)
            raise
        lease.renewed_at = time.monotonic()
        return renewed

    def give_back(self, lease: Lease, reason: str) -> bool:
        """Release ``lease`` in the store (``release_lease``) so another worker can claim it at
        once, the attempt given back; whether it was released. A store that cannot (lost lease,
        pending pause, closed, still unavailable after a few tries) leaves it to expire."""
        release = getattr(self._store, "release_lease", None)
        if not callable(release):
            return False
        for delay in _GIVE_BACK_RETRIES_S:
            try:
                release(occurrence_id=lease.occurrence_id, owner_id=lease.owner_id, fence=lease.fence)
            except SchedulerKernelError as error:
                if error.code == STORAGE_UNAVAILABLE and delay is not None:
                    time.sleep(delay)
                    continue
                level = logging.INFO if error.code == LEASE_LOST else logging.WARNING
                lease.log(log, level, "not released (%s): %s", reason, error.code)
                return False
            lease.log(log, logging.INFO, "released (%s)", reason)
            return True
        return False

    def _mark_lost(self, lease: Lease) -> None:
        if lease.parked or lease.lost:
            return
        lease.lost = True
        lease.log(log, logging.WARNING, "lease lost")
        self.release(lease)

    def _due(self, now: float) -> tuple[list[Lease], float]:
        """Leases due for renewal now, and seconds until the next one is due."""
        due: list[Lease] = []
        wait = self._interval_s
        for lease in self._leases.values():
            if not lease.settleable:
                continue
            at = self._retry_at.get(lease.occurrence_id, lease.renewed_at + self._interval_s)
            if at <= now:
                due.append(lease)
            else:
                wait = min(wait, at - now)
        return due, wait

    def _loop(self) -> None:
        while True:
            with self._condition:
                if self._stopped:
                    return
                due, wait = self._due(time.monotonic())
                if not due:
                    self._condition.wait(timeout=wait)
                    continue
            for lease in due:
                self._renew(lease)

    def _renew(self, lease: Lease) -> None:
        try:
            self.renew_now(lease)
            self._retry_at.pop(lease.occurrence_id, None)
        except SchedulerKernelError as error:
            if error.code == LEASE_LOST:
                return
            if error.code == STORE_CLOSED:
                self._mark_lost(lease)
                return
            level = logging.DEBUG if error.code == STORAGE_UNAVAILABLE else logging.WARNING
            lease.log(log, level, "lease renewal failed, retrying: %s", error.code)
            self._retry_at[lease.occurrence_id] = time.monotonic() + min(
                _RETRY_AFTER_FAILURE_S, self._interval_s
            )
        except Exception as error:
            lease.log(log, logging.ERROR, "lease renewal failed unexpectedly", exc_info=error)
            self._retry_at[lease.occurrence_id] = time.monotonic() + min(
                _RETRY_AFTER_FAILURE_S, self._interval_s
            )
