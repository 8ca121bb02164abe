"""Time limits and cancellation of running task runs (API §10 ``timeout_ms`` and ``cancel``).

One thread per task worker keeps the deadlines of the runs it holds. When a run's ``timeout_ms``
passes first, the supervisor takes the run from the worker (its lease is marked ``abandoned``, so
``ctx.should_stop`` turns true, the lease is no longer renewed and the worker will not settle
it), cancels it if it is an ``async def`` task, and settles it ``failed`` with code
``TASK_TIMEOUT``, retryable under the task's retry policy. A sync task cannot be interrupted: it
keeps its lane until it returns, and what it returns is discarded.

A run whose lease is lost (a renewal got ``SCHEDULER_LEASE_LOST``: cancelled, or reclaimed after
the lease expired) is cancelled the same way if it is async; a sync one sees ``ctx.should_stop``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from scheduler.store.facade import SchedulerStore
from scheduler.tasks.definition import TaskDefinition
from scheduler.worker.lease_keeper import Lease, LeaseKeeper

TASK_TIMEOUT: Final = "TASK_TIMEOUT"
log = logging.getLogger("scheduler.tasks")


class Watch:
    """The deadline of one run; :meth:`cancel` before it fires keeps the run the worker's."""

    def __init__(self, lease: Lease, definition: TaskDefinition, deadline: float) -> None:
        self.lease = lease
        self.definition = definition
        self.deadline = deadline
        self.fired = False
        self._done = False
        self._lock = threading.Lock()

    def cancel(self) -> bool:
        """Stop watching; ``False`` if the deadline already fired (the run is the supervisor's)."""
        with self._lock:
            self._done = True
            return not self.fired

    def fire(self) -> bool:
        """Take the run (``True``) unless it was no longer watched."""
        with self._lock:
            if self._done:
                return False
            self._done = self.fired = True
            self.lease.abandoned = True  # no renewal, no settlement by the worker, should_stop
            return True


class Supervisor:
    """Deadlines of the runs a worker holds, and the async ones to cancel on timeout or lease loss."""

    def __init__(self, on_timeout: Callable[[Watch], None]) -> None:
        self._on_timeout = on_timeout
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._async: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = {}
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._condition:
            if self._thread is None:
                self._stopped = False
                self._thread = threading.Thread(
                    target=self._loop, name="scheduler-task-deadlines", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def watch(self, lease: Lease, definition: TaskDefinition) -> Watch | None:
        """Watch the run's ``timeout_ms`` (``None`` when the task has none)."""
        if definition.timeout_ms is None:
            return None
        watch = Watch(lease, definition, time.monotonic() + definition.timeout_ms / 1000)
        with self._condition:
            heapq.heappush(self._heap, (watch.deadline, next(self._order), watch))
            self._condition.notify_all()
        return watch

    def running_async(self, occurrence_id: str, task: asyncio.Task[Any]) -> None:
        """An async run started (on its event loop): cancel it on timeout or lease loss."""
        with self._condition:
            self._async[occurrence_id] = (task.get_loop(), task)

    def finished_async(self, occurrence_id: str) -> None:
        with self._condition:
            self._async.pop(occurrence_id, None)

    def cancel_async(self, occurrence_id: str) -> None:
        with self._condition:
            entry = self._async.get(occurrence_id)
        if entry is not None:
            loop, task = entry
            loop.call_soon_threadsafe(task.cancel)

    def lost(self, lease: Lease) -> None:
        """A renewal reported the lease lost: cancel the run if it is async."""
        self.cancel_async(lease.occurrence_id)

    def _next_due(self) -> tuple[list[Watch], float | None]:
        now = time.monotonic()
        due: list[Watch] = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        wait = None if not self._heap else self._heap[0][0] - now
        return due, wait

    def _loop(self) -> None:
        while True:
            with self._condition:
                if self._stopped:
                    return
                due, wait = self._next_due()
                if not due:
                    self._condition.wait(timeout=wait)
                    continue
            for watch in due:
                if watch.fire():
                    self.cancel_async(watch.lease.occurrence_id)
                    try:
                        self._on_timeout(watch)
                    except Exception:  # the lease expires and the run is reclaimed: never lost
                        log.exception("settling a timed-out run failed", extra=watch.lease.extra())


class TaskLeaseKeeper(LeaseKeeper):
    """The worker's lease keeper, telling the supervisor when a lease was lost."""

    def __init__(self, store: SchedulerStore, lease_ms: int, on_lost: Callable[[Lease], None]) -> None:
        super().__init__(store, lease_ms)
        self._on_lost = on_lost

    def _mark_lost(self, lease: Lease) -> None:
        was_lost = lease.lost
        super()._mark_lost(lease)
        if lease.lost and not was_lost:
            self._on_lost(lease)


__all__ = ["TASK_TIMEOUT", "Supervisor", "TaskLeaseKeeper", "Watch"]
