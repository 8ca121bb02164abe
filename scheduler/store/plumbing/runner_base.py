"""What every runner shares: the connection, clock, uuid factory and fast path, the lock that
lets one call run at a time, and the refusals of a closed, forked or re-entered runner.

A ``Runner`` executes one operation callback inside a transaction; the two kinds are
``session.OwnedRunner`` (the store owns its transactions) and ``nested_runner.NestedRunner``
(each operation in a ``SAVEPOINT`` of a transaction someone else owns). ``SERVER_CLOCK`` is the
clock that means "the database server's clock".
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from sqlalchemy import Connection

from scheduler.backends.interface import Backend
from scheduler.schema.target import DEFAULT_SCHEMAS, SchemaTarget
from scheduler.store.plumbing import lifecycle
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.tx import NESTED, CallMode, Clock, Tx, read_clock

T = TypeVar("T")


def _server_clock_marker() -> int:
    raise RuntimeError("the server clock is read inside a transaction (Tx.now)")


SERVER_CLOCK: Final[Clock] = _server_clock_marker
"""The runner clock meaning "the database server's clock" (PostgreSQL with ``clock=None``)."""


class Runner(Protocol):
    conn: Connection
    target: SchemaTarget
    backend: Backend

    @property
    def closed(self) -> bool: ...

    def write(self, operation: Callable[[Tx], T]) -> T: ...

    def read(self, operation: Callable[[Tx], T], *, one_statement: bool = False) -> T: ...

    def assert_usable(self) -> None: ...

    def close(self, release: Callable[[], None] | None = None) -> None: ...

    def idle(self) -> None: ...


def statement_options(target: SchemaTarget, backend: Backend) -> dict[str, Any] | None:
    """Per-statement execution options sending Core statements to ``target``'s schema
    (``None`` for SQLite ``main``: the original's unqualified statements), with the backend's
    own (``Backend.statement_options``)."""
    mapping = target.translate_map
    options: dict[str, Any] = {} if mapping is None else {"schema_translate_map": mapping}
    options.update(backend.statement_options)
    return options or None


class RunnerBase:
    """A connection, clock and uuid factory, and when operations may use them.

    Every call holds ``lock`` (a store shared by threads runs one call at a time; a
    ``transaction()`` block holds it for the whole block) and is refused, before anything is
    read or written, when the runner is closed, was inherited by a forked process, or is
    already running a call or block on this thread (see :mod:`scheduler.store.plumbing.lifecycle`).
    """

    def __init__(
        self,
        conn: Connection,
        clock: Clock,
        uuid_factory: Callable[[], str],
        fastpath: FastPath | None = None,
        lock: threading.RLock | None = None,
        target: SchemaTarget | None = None,
        *,
        backend: Backend,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.uuid_factory = uuid_factory
        self.lock = lock or threading.RLock()
        self.backend = backend
        """The database the runner's connection reaches (``scheduler.backends.backend_for``)."""
        self.target = target or SchemaTarget(backend.name, DEFAULT_SCHEMAS[backend.name])
        self.options = statement_options(self.target, backend)
        self.key_locks = backend.key_locks(self.target)
        self._owns_fastpath = fastpath is None
        self.fastpath = fastpath or FastPath.for_connection(conn, self.target.translate_map)
        self._pid = os.getpid()
        self._closed: str | None = None  # why it is closed (lifecycle.store_closed)
        self._busy = False  # a call or block of this runner is running (on the lock's thread)
        self._quarantined = False
        lifecycle.track(self)

    @property
    def closed(self) -> bool:
        return self._closed is not None or os.getpid() != self._pid

    def mark_forked(self) -> None:
        """In a child process: refuse every call and never touch the inherited connection."""
        if not self._quarantined:
            self._quarantined = True
            lifecycle.keep_forever(self)

    def _enter(self) -> None:
        """Take the lock and mark this runner busy, or raise without touching the connection."""
        if os.getpid() != self._pid:
            self.mark_forked()
            raise lifecycle.opened_in_another_process(self._pid)
        self.lock.acquire()
        if self._closed is not None or self._busy:
            self.lock.release()
            if self._closed is not None:
                raise lifecycle.store_closed(self._closed)
            raise lifecycle.transaction_active()
        self._busy = True

    def _leave(self) -> None:
        self._busy = False
        self.lock.release()

    def _guarded(self, body: Callable[[], T]) -> T:
        """Run ``body`` holding the lock, refusing a closed, inherited or re-entered runner."""
        self._enter()
        try:
            return body()
        finally:
            self._leave()

    def assert_usable(self) -> None:
        """Raise what a call would raise now (closed, forked, re-entered); else nothing."""
        self._guarded(lambda: None)

    def close(self, release: Callable[[], None] | None = None) -> None:
        """Close once: wait for the call or block in flight, then ``release`` the connection.

        Idempotent. In a forked child it only marks the runner closed (the inherited connection
        is never touched). From inside one of its own calls or blocks it raises
        ``SCHEDULER_TRANSACTION_ACTIVE`` and stays open.
        """
        if os.getpid() != self._pid:
            self.mark_forked()
            self._closed = self._closed or "closed"
            return
        with self.lock:
            if self._busy:
                raise lifecycle.transaction_active()
            if self._closed is not None:
                return
            self._closed = "closed"
            if self._owns_fastpath and self.fastpath is not None:
                self.fastpath.release()
            if release is not None:
                release()

    def _usable_fastpath(self) -> FastPath | None:
        fast = self.fastpath
        return fast if fast is not None and fast.usable(self.conn) else None

    def _tx(
        self,
        sample_clock: bool,
        fast: FastPath | None,
        *,
        call: CallMode = NESTED,
        clock_sample: int | None = None,
    ) -> Tx:
        """``clock_sample``: the injected clock's sample of the call's first attempt, for the call
        run again (the call reads an injected clock once; the server clock is read again after the
        new attempt's locks)."""
        now: int | None = None
        sampler: Clock | None = None
        if self.clock is SERVER_CLOCK:
            conn, now_of = self.conn, self.backend.server_now
            sampler = lambda: now_of(conn, fast)  # noqa: E731 - read lazily, after the rows are locked
        elif clock_sample is not None:
            now = clock_sample
        else:
            now = read_clock(self.clock) if sample_clock else 0
        return Tx(
            self.conn,
            now,
            self.uuid_factory,
            fast,
            self.options,
            sampler,
            self.key_locks,
            backend=self.backend,
            call=call,
        )

    def idle(self) -> None:
        """The store found nothing to do (a claim without work); a moment for housekeeping."""

    def finish(self) -> None:
        """End a block's view: every later call raises ``SCHEDULER_STORE_CLOSED``."""
        self._closed = lifecycle.TRANSACTION_FINISHED
