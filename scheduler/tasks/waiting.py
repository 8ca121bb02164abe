"""Waiting for a run to end: ``TaskRun.result()`` and ``await run.wait()`` (API §10).

A waiter reads the run, and until it ended (``succeeded`` or ``dead_letter``) sleeps on a
:class:`SettleSignal`, then reads again:

* PostgreSQL: one ``LISTEN`` connection per ``Tasks`` object (opened on the first wait, a
  :class:`~scheduler.worker.ListenWaker` on the work and settle channels). Workers of a ``Tasks``
  object notify the settle channel when a run ends
  (:func:`scheduler.store.capabilities.queues.notify_settlements`);
  a waiter also re-reads at least every second, which covers runs ended by other stores.
* Elsewhere (SQLite): polling, from 5 ms doubling to 100 ms; a worker in the same process wakes
  the waiters at once.

The signal's generation is read *before* the run, so a notification between the read and the
sleep is never lost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final

from scheduler.contract.constants import TERMINAL_STATUSES
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.store.capabilities.queues import notify_settlements
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Occurrence
from scheduler.worker.waker import ListenWaker, PollingWaker

POLL_MIN_S: Final = 0.005
POLL_MAX_S: Final = 0.1
LISTEN_POLL_S: Final = 1.0
_ASYNC_TICK_S: Final = 0.005


def _timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise invalid_argument("timeout_s must be a number >= 0 (seconds) or None")
    return float(value)


def _not_found(run_id: str) -> SchedulerKernelError:
    return SchedulerKernelError("SCHEDULER_NOT_FOUND", f"Scheduler occurrence not found: {run_id}")


class SettleSignal:
    """What waiters sleep on: notified when runs may have ended (see the module doc)."""

    def __init__(self) -> None:
        self._local = PollingWaker()
        self._listener: ListenWaker | None = None
        self._lock = threading.Lock()

    def listen(self, store: SchedulerStore) -> None:
        """Start listening on ``store``'s database (PostgreSQL; idempotent, no-op elsewhere)."""
        with self._lock:
            if self._listener is not None or store.wake_channel is None:
                return
            settle = notify_settlements(store)
            listener = ListenWaker(store, channels=[store.wake_channel, *([settle] if settle else [])])
            listener.start()
            self._listener = listener

    @property
    def _waker(self) -> ListenWaker | PollingWaker:
        return self._listener or self._local

    @property
    def listening(self) -> bool:
        return self._listener is not None

    @property
    def generation(self) -> int:
        return self._waker.generation

    def notify(self) -> None:
        """Wake this process's waiters (a run ended here)."""
        self._waker.notify()

    def wait(self, timeout_s: float, since: int) -> bool:
        return self._waker.wait(timeout_s, since)

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()


class _Pace:
    """How long a waiter sleeps between reads: capped backoff, or a slow safety poll when listening."""

    def __init__(self, listening: bool, deadline: float | None) -> None:
        self._next = LISTEN_POLL_S if listening else POLL_MIN_S
        self._cap = LISTEN_POLL_S if listening else POLL_MAX_S
        self._deadline = deadline

    def next_s(self) -> float:
        """The next sleep; ``TimeoutError`` when the deadline passed."""
        delay = self._next
        self._next = min(self._cap, self._next * 2)
        if self._deadline is None:
            return delay
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the run did not end in time")
        return min(delay, remaining)


def wait_until_ended(
    signal: SettleSignal, read: Callable[[], Occurrence | None], run_id: str, timeout_s: object
) -> Occurrence:
    """The run's occurrence once it ended; ``TimeoutError`` after ``timeout_s`` (``None``: no limit)."""
    limit = _timeout(timeout_s)
    pace = _Pace(signal.listening, None if limit is None else time.monotonic() + limit)
    while True:
        generation = signal.generation
        occurrence = read()
        if occurrence is None:
            raise _not_found(run_id)
        if occurrence.status in TERMINAL_STATUSES:
            return occurrence
        signal.wait(pace.next_s(), generation)


async def wait_until_ended_async(
    signal: SettleSignal, read: Callable[[], Awaitable[Occurrence | None]], run_id: str, timeout_s: object
) -> Occurrence:
    """:func:`wait_until_ended` for asyncio code: the loop is never blocked (the signal's generation
    is checked every few milliseconds while sleeping)."""
    limit = _timeout(timeout_s)
    pace = _Pace(signal.listening, None if limit is None else time.monotonic() + limit)
    while True:
        generation = signal.generation
        occurrence = await read()
        if occurrence is None:
            raise _not_found(run_id)
        if occurrence.status in TERMINAL_STATUSES:
            return occurrence
        until = time.monotonic() + pace.next_s()
        while signal.generation == generation and (left := until - time.monotonic()) > 0:
            await asyncio.sleep(min(_ASYNC_TICK_S, left))


__all__ = ["SettleSignal", "wait_until_ended", "wait_until_ended_async"]
