"""How an idle worker waits for work: capped backoff polling, woken early by a :class:`Waker`.

A worker polls with a growing delay while it finds nothing (``IdleBackoff``) and sleeps in
``Waker.wait``. ``PollingWaker`` is woken only from inside the process (``stop()``, a periodic
tick this worker enqueued). ``ListenWaker`` (PostgreSQL) is also woken by the ``NOTIFY`` that
the store sends from its own transactions when they make work claimable
(:mod:`scheduler.backends.postgresql.wakeups`). Workers still poll with the capped backoff, so a lost
notification (or an outbox enqueue, which never notifies) only delays work, never loses it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final, Protocol

from scheduler.contract.errors import invalid_argument
from scheduler.schema.target import quote_identifier

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

log = logging.getLogger("scheduler.worker")


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

    @property
    def generation(self) -> int:
        """How many times :meth:`notify` was called: pass it to :meth:`wait` as ``since`` to be
        woken by a notification that came after it was read, even before ``wait`` began."""
        with self._condition:
            return self._generation

    def wait(self, timeout_s: float, since: int | None = None) -> bool:
        with self._condition:
            generation = self._generation if since is None else since
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


_LISTEN_POLL_S: Final = 0.05
"""How long the listener waits for a notification before it checks whether it should stop: what
``close()``, hence a worker's shutdown, waits for at most. A wait that ends empty reads the
socket, not the server, so an idle listener costs 20 wake-ups a second."""
_CLOSE_WAIT_S: Final = 2.0
"""How long ``close()`` waits for the listener to close its connection."""
_RECONNECT_MAX_S: Final = 30.0


class ListenWaker:
    """A :class:`PollingWaker` also woken by PostgreSQL ``NOTIFY`` on the store's wake channel.

    :meth:`start` opens one connection of its own (from the store's engine, detached from any
    pool, autocommit) and ``LISTEN``\\ s on ``store.wake_channel`` in a daemon thread; every
    notification wakes every waiting lane. A broken connection is reopened with a capped backoff
    (the lanes are woken too, since notifications may have been missed); the lanes' polling
    covers the gap. :meth:`close` stops the thread and closes the connection (within about
    50 ms). ``Worker`` uses one by default on PostgreSQL and starts and closes it in ``run()``.
    ``channels``: listen on these instead (e.g. the settle channel too, for result waiters).
    """

    def __init__(self, store: SchedulerStore, channels: Sequence[str] | None = None) -> None:
        channel = store.wake_channel
        if channel is None:
            raise invalid_argument("ListenWaker needs a store on PostgreSQL")
        self.channel: str = channel
        self.channels: tuple[str, ...] = tuple(channels) if channels else (channel,)
        self._engine = store.connection.engine
        self._inner = PollingWaker()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self.notifications = 0
        """Notifications received so far (for tests and diagnostics)."""

    @property
    def generation(self) -> int:
        """See :attr:`PollingWaker.generation`."""
        return self._inner.generation

    def wait(self, timeout_s: float, since: int | None = None) -> bool:
        return self._inner.wait(timeout_s, since)

    def notify(self) -> None:
        self._inner.notify()

    def start(self) -> None:
        """Start listening (idempotent while running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._listening.clear()
        self._thread = threading.Thread(target=self._listen_forever, name="scheduler-listen", daemon=True)
        self._thread.start()

    def wait_listening(self, timeout_s: float) -> bool:
        """Block until ``LISTEN`` is in effect (``True``) or ``timeout_s`` passed (``False``)."""
        return self._listening.wait(timeout_s)

    def close(self) -> None:
        """Stop listening and close the connection; idempotent."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=_CLOSE_WAIT_S)
        self._thread = None

    def _listen_forever(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                self._listen_once()
                delay = 0.1
            except Exception as error:  # the server went away: poll meanwhile, then listen again
                log.warning("LISTEN %s failed (%s); reconnecting", self.channel, type(error).__name__)
            self._listening.clear()
            self._inner.notify()  # notifications may have been missed while not listening
            if self._stopping.wait(delay):
                return
            delay = min(_RECONNECT_MAX_S, delay * 2)

    def _listen_once(self) -> None:
        pooled = self._engine.raw_connection()
        driver: Any = pooled.driver_connection  # psycopg's connection
        pooled.detach()  # LISTEN state must never go back to a pool
        try:
            driver.autocommit = True
            for channel in self.channels:
                driver.execute("LISTEN " + quote_identifier(channel))
            self._listening.set()
            self._inner.notify()  # work enqueued before LISTEN took effect
            while not self._stopping.is_set():
                for _ in driver.notifies(timeout=_LISTEN_POLL_S):
                    self.notifications += 1
                    self._inner.notify()
        finally:
            # Closed directly: the pool's close would first roll back, and on a connection the
            # server ended (the failure logged above) log that rollback's error with a traceback.
            with suppress(Exception):
                driver.close()
