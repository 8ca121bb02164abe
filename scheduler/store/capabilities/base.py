"""The state every capability mixin shares: a runner, the clock, open/closed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection

from scheduler.store.capabilities.claim_plan import ClaimContention
from scheduler.store.plumbing.runner_base import SERVER_CLOCK, Runner
from scheduler.store.plumbing.tx import Clock, Tx

T = TypeVar("T")


class StoreBase:
    """Shared plumbing. Capability mixins validate arguments first, then call ``_write``/``_read``.

    Argument validation happens before the closed check and before the clock is read, as in
    the original. Whether a call may run (open, closed, forked, re-entered) is the runner's
    decision, taken under its lock (:mod:`scheduler.store.plumbing.lifecycle`).
    """

    _runner: Runner
    _clock: Clock
    _uuid_factory: Callable[[], str]
    _on_close: Callable[[], None] | None
    _claims: ClaimContention

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
        self._on_close = on_close
        self._claims = ClaimContention()

    def _assert_open(self) -> None:
        """Raise ``SCHEDULER_STORE_CLOSED`` / ``SCHEDULER_TRANSACTION_ACTIVE`` as a call would."""
        self._runner.assert_usable()

    def _write(self, operation: Callable[[Tx], T]) -> T:
        """Run ``operation`` in one write transaction (clock sampled inside it)."""
        return self._runner.write(operation)

    def _idle(self) -> None:
        """Tell the runner the store found no work (it may checkpoint the WAL)."""
        self._runner.idle()

    def _read(self, operation: Callable[[Tx], T], *, one_statement: bool = False) -> T:
        """Run ``operation`` in one read snapshot. ``one_statement``: it runs exactly one
        statement, which is its snapshot (then sent alone, without a transaction of its own)."""
        return self._runner.read(operation, one_statement=one_statement)

    @property
    def connection(self) -> Connection:
        """The SQLAlchemy connection operations run on (for inspection, not for writes)."""
        return self._runner.conn

    @property
    def clock(self) -> Clock:
        """The store's clock: a zero-argument callable returning epoch milliseconds (on
        PostgreSQL with ``clock=None``, a read of the server's ``clock_timestamp()``)."""
        if self._clock is SERVER_CLOCK:
            return self._server_now
        return self._clock

    def _server_now(self) -> int:
        return self._read(lambda tx: tx.now, one_statement=True)

    @property
    def closed(self) -> bool:
        """Whether calls are refused (closed, a finished transaction view, or inherited by fork)."""
        return self._runner.closed

    def close(self) -> None:
        """Close the store; idempotent. Every later call raises ``SCHEDULER_STORE_CLOSED``.

        Safe from any thread: it waits for the call or ``transaction()`` block in flight, then
        releases the connection the store owns (never a caller's engine or connection). A file
        database is checkpointed first (``wal_checkpoint(TRUNCATE)``, degrading to a passive
        checkpoint while other connections read), so when this was the last connection only the
        main file remains and it holds every committed write. Inside one of its own calls or
        blocks (same thread) it raises ``SCHEDULER_TRANSACTION_ACTIVE``; in a process forked
        after the store was opened it marks the store closed without touching the connection.
        It never raises a driver error.
        """
        self._runner.close(self._on_close)
