"""Clocks for ``open_store(clock=…)``: zero-argument callables returning epoch milliseconds.

The store samples its clock once per write, inside the write transaction, and compares the
sample with stored times (``available_at``, ``lease_expires_at``, authority windows). A wall
clock that steps backwards (an NTP step, a manual change) therefore delays time-based progress;
see "Clocks" in ``docs/operations.md``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from scheduler.store.plumbing.lifecycle import reset_after_fork


def default_uuid() -> str:
    """A random UUID (version 4) as text (``uuid_factory=None``)."""
    return str(uuid.uuid4())


def wall_clock() -> int:
    """Epoch milliseconds from the system clock (``clock=None``)."""
    return time.time_ns() // 1_000_000


class NonDecreasingClock:
    """A clock that never returns less than it returned before: it holds still while its
    source is behind (after the source stepped backwards) and follows it again once the source
    passes the last value. It never runs ahead of the largest value the source returned.

    Thread-safe; a forked child continues from the parent's last value.
    """

    def __init__(self, source: Callable[[], int] = wall_clock) -> None:
        self._source = source
        self._last: int | None = None
        self._lock = threading.Lock()
        reset_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at fork stays held forever

    def __call__(self) -> int:
        value = self._source()
        with self._lock:
            last = self._last
            if last is not None and value < last:
                return last
            self._last = value
            return value



_PROCESS_CLOCK = NonDecreasingClock()


def monotonic_wall_clock() -> int:
    """Epoch milliseconds from the wall clock, never less than a value it returned before in
    this process (``open_store(path, clock=scheduler.monotonic_wall_clock)``).

    After the system clock steps back by D, it returns the same value for D (time holds still)
    instead of going back: work that was due stays due, and leases and retries neither expire
    early nor move; they simply wait until the wall clock catches up. Processes do not share
    it: each process guards only its own samples.
    """
    return _PROCESS_CLOCK()
