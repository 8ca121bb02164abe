"""How an idle worker waits for work: capped backoff polling, woken early by a :class:`Waker`.

A worker polls with a growing delay while it finds nothing (``IdleBackoff``) and sleeps in
``Waker.wait``. ``PollingWaker`` is woken only from inside the process (``stop()``, a periodic
tick this worker enqueued). A PostgreSQL implementation backed by ``LISTEN/NOTIFY`` can implement
the same two methods; workers still poll with the capped backoff, so a lost notification only
delays work, never loses it.
"""

from __future__ import annotations

import random
import threading
from typing import Protocol


class Waker(Protocol):
    """Wakes idle worker lanes when new work may be claimable."""

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s`` seconds; ``True`` if woken early by :meth:`notify`."""
        ...

    def notify(self) -> None:
        """Wake every lane waiting in :meth:`wait`."""
        ...


class PollingWaker:
    """An in-process waker: ``notify`` wakes all current waiters (a generation counter, no lost wake-ups)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._generation = 0

    def wait(self, timeout_s: float) -> bool:
        with self._condition:
            generation = self._generation
            return self._condition.wait_for(
                lambda: self._generation != generation, timeout=max(0.0, timeout_s)
            )

    def notify(self) -> None:
        with self._condition:
            self._generation += 1
            self._condition.notify_all()


class IdleBackoff:
    """Delays between polls that find nothing: ``min_ms`` doubling to ``max_ms``, with ±20 % jitter
    so several lanes and processes do not poll in step. ``reset()`` after finding work."""

    def __init__(self, min_ms: int, max_ms: int) -> None:
        self.min_ms = max(1, min_ms)
        self.max_ms = max(self.min_ms, max_ms)
        self._next_ms = self.min_ms

    def next_s(self) -> float:
        """The next delay in seconds (and grow the one after it)."""
        delay = self._next_ms
        self._next_ms = min(self.max_ms, self._next_ms * 2)
        return delay * random.uniform(0.8, 1.2) / 1000

    def reset(self) -> None:
        self._next_ms = self.min_ms
