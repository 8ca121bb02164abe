"""The state every capability mixin shares: a runner, the clock, open/closed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.session import Clock, Runner, Tx

T = TypeVar("T")

STORE_CLOSED = "SCHEDULER_STORE_CLOSED"


class StoreBase:
    """Shared plumbing. Capability mixins validate arguments first, then call ``_write``/``_read``.

    Argument validation happens before the closed check and before the clock is read, as in
    the original.
    """

    _runner: Runner
    _clock: Clock
    _uuid_factory: Callable[[], str]
    _closed: bool
    _on_close: Callable[[], None] | None

    def _init_base(
        self,
        runner: Runner,
        clock: Clock,
        uuid_factory: Callable[[], str],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._runner = runner
        self._clock = clock
        self._uuid_factory = uuid_factory
        self._closed = False
        self._on_close = on_close

    def _assert_open(self) -> None:
        if self._closed:
            raise SchedulerKernelError(STORE_CLOSED, "Scheduler store is closed")

    def _write(self, operation: Callable[[Tx], T]) -> T:
        """Run ``operation`` in one write transaction (clock sampled inside it)."""
        self._assert_open()
        return self._runner.write(operation)

    def _read(self, operation: Callable[[Tx], T]) -> T:
        """Run ``operation`` in one read snapshot."""
        self._assert_open()
        return self._runner.read(operation)

    @property
    def connection(self) -> Connection:
        """The SQLAlchemy connection operations run on (for inspection, not for writes)."""
        return self._runner.conn

    @property
    def clock(self) -> Clock:
        """The store's clock: a zero-argument callable returning epoch milliseconds."""
        return self._clock

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the store; idempotent. Every later call raises ``SCHEDULER_STORE_CLOSED``."""
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close()
