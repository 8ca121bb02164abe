"""``NestedRunner``: each operation in a ``SAVEPOINT`` inside a transaction someone else owns.

An outer transaction already exists (``store.transaction()``, or a caller's connection via
``SchedulerStore.on_connection``): a failed call leaves nothing behind, and nothing is ever
committed here. ``block_runner`` makes the runner of a ``transaction()`` block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy import Connection

from scheduler.backends.interface import Backend
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema.target import SchemaTarget
from scheduler.store.plumbing.failures import classify_storage_failure, missing_tables, storage_unavailable
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.runner_base import RunnerBase, T
from scheduler.store.plumbing.telemetry import StateChanges, collect, emit_all
from scheduler.store.plumbing.tx import Clock, Tx
from scheduler.store.plumbing.wake_events import settles_runs, wakes_workers


def _enclosing_rollback_error(phase: str, storage_code: str) -> SchedulerKernelError:
    error = storage_unavailable(phase=phase, storage_code=storage_code, commit_state="not_committed")
    error.message = "Scheduler storage is unavailable; SQLite rolled back the enclosing transaction"
    error.args = (error.message,)
    return error


class NestedRunner(RunnerBase):
    """Runs each operation in a SAVEPOINT inside a transaction someone else owns.

    Storage failures here are never ``retryable``: the enclosing transaction is not the store's
    to retry (API §8).
    """

    def __init__(
        self,
        conn: Connection,
        clock: Clock,
        uuid_factory: Callable[[], str],
        *,
        lock: threading.RLock | None = None,
        fastpath: FastPath | None = None,
        target: SchemaTarget | None = None,
        backend: Backend,
    ) -> None:
        super().__init__(conn, clock, uuid_factory, fastpath, lock, target, backend=backend)
        self._enclosing_rolled_back = False
        self.sink: list[StateChanges] | None = None
        """Where a block's state changes wait for the block's end (``None``: log per operation)."""
        self.owned_block = False
        """A ``transaction()`` block of a store that owns its transaction (it may ``NOTIFY``)."""
        self.wakes = False
        """A block's operations made work claimable (the owning store notifies at COMMIT)."""
        self.settles = False
        """A block's operations ended an occurrence (see ``OwnedRunner.notify_settled``)."""

    def mark_wakes(self) -> None:
        """Ask the owning store to wake idle workers when this block commits."""
        self.wakes = True

    def write(self, operation: Callable[[Tx], T]) -> T:
        return self._guarded(lambda: self._run(operation, sample_clock=True))

    def read(self, operation: Callable[[Tx], T], *, one_statement: bool = False) -> T:
        return self._guarded(lambda: self._read(operation))

    def _read(self, operation: Callable[[Tx], T]) -> T:
        if not self._enclosing_rolled_back and self._found_no_transaction():
            return self._read_in_own_snapshot(operation)
        return self._run(operation, sample_clock=False)

    def _found_no_transaction(self) -> bool:
        """No transaction to join: a driver that begins lazily (pysqlite) has none open, or the
        connection is outside any transaction (other drivers)."""
        if self.backend.lazy_read_begin is not None:
            return self.backend.driver_in_transaction(self.conn) is False
        return not self.conn.in_transaction()

    def _read_in_own_snapshot(self, operation: Callable[[Tx], T]) -> T:
        """A read that leaves no transaction behind: a deferred snapshot, ended after the read.

        SQLite: a driver-level deferred ``BEGIN`` … ``ROLLBACK``, so no lock outlives the call
        (a lingering transaction would make every other process's writes fail ``SQLITE_BUSY``);
        the caller's own logical transaction, if any, is left as it was. Other drivers: the
        transaction the read began is rolled back (begun through SQLAlchemy even when the fast
        path runs the statements on the driver, which SQLAlchemy would not see: psycopg's implicit
        transaction would stay open, holding its snapshot and locks).
        """
        had_transaction = self.conn.in_transaction()
        begin = self.backend.lazy_read_begin
        driver: Any = self.conn.connection.dbapi_connection if begin is not None else None
        try:
            if not had_transaction:
                self.conn.begin()  # first: an engine's "begin" event may emit BEGIN itself
            if driver is not None and self.backend.driver_in_transaction(self.conn) is False:
                driver.execute(begin).close()
            return operation(self._tx(False, self._usable_fastpath()))
        except BaseException as error:
            if isinstance(error, SchedulerKernelError):
                raise
            classified = classify_storage_failure(
                error, self.backend, phase="read", commit_state="not_committed", owns_transaction=False
            ) or missing_tables(error, self.target.schema, self.backend)
            if classified is None:
                raise
            raise classified from error
        finally:
            if driver is not None and self.backend.driver_in_transaction(self.conn):
                with suppress(Exception):
                    driver.rollback()
            if not had_transaction and self.conn.in_transaction():
                with suppress(Exception):
                    self.conn.rollback()

    def _run(self, operation: Callable[[Tx], T], *, sample_clock: bool) -> T:
        if self._enclosing_rolled_back:
            # Never silently start a new transaction in place of the one SQLite discarded.
            raise _enclosing_rollback_error("write", "SQLITE_ABORT")
        savepoint = self._savepoint("write" if sample_clock else "read")
        try:
            tx = self._tx(sample_clock, self._usable_fastpath())
            result = operation(tx)
            tx.flush_writes()
            changes = collect(tx)
            savepoint.commit()
            if self.owned_block:
                self.wakes = self.wakes or wakes_workers(tx.events)
                self.settles = self.settles or settles_runs(tx.events)
            if self.sink is None:
                changes.emit()
            else:
                self.sink.append(changes)
            return result
        except BaseException as error:
            try:
                if savepoint.is_active:
                    savepoint.rollback()
                rolled_back = True
            except Exception:
                rolled_back = False
            if isinstance(error, SchedulerKernelError):
                raise
            # On SQLITE_FULL / IOERR SQLite may roll back the whole enclosing transaction
            # itself: the savepoint is gone, but provably nothing of it was committed.
            enclosing_gone = not rolled_back and self.backend.driver_in_transaction(self.conn) is False
            classified = classify_storage_failure(
                error,
                self.backend,
                phase="write",
                commit_state="not_committed" if rolled_back or enclosing_gone else "unknown",
                owns_transaction=False,
            )
            if classified is None:
                missing = missing_tables(error, self.target.schema, self.backend)
                if missing is None:
                    raise
                raise missing from error
            if enclosing_gone:
                self._enclosing_rolled_back = True
                details = classified.details
                classified = _enclosing_rollback_error(details["phase"], details["storageCode"])
            raise classified from error

    def raise_if_enclosing_rolled_back(self) -> None:
        """Refuse to report success for a block whose transaction SQLite already discarded."""
        if self._enclosing_rolled_back:
            raise _enclosing_rollback_error("commit", "SQLITE_ABORT")

    @contextmanager
    def outer_transaction(self) -> Iterator[NestedRunner]:
        """A SAVEPOINT around a block of operations inside the enclosing transaction."""
        self._enter()
        try:
            if self._enclosing_rolled_back:
                raise _enclosing_rollback_error("write", "SQLITE_ABORT")
            savepoint = self._savepoint()
            inner = block_runner(self, owned_block=self.owned_block)
            try:
                try:
                    yield inner
                    inner.raise_if_enclosing_rolled_back()
                except BaseException:
                    self._enclosing_rolled_back = self._enclosing_rolled_back or inner._enclosing_rolled_back
                    with suppress(Exception):
                        if savepoint.is_active:
                            savepoint.rollback()
                    raise
                savepoint.commit()
                self.wakes = self.wakes or inner.wakes
                if self.sink is None:
                    emit_all(inner.sink or ())
                else:
                    self.sink.extend(inner.sink or ())
            finally:
                inner.finish()
        finally:
            self._leave()

    def _savepoint(self, phase: str = "write") -> Any:
        """A SAVEPOINT for one operation or block (beginning the caller's transaction if needed)."""
        try:
            self._ensure_sqlite_transaction()
            return self.conn.begin_nested()
        except Exception as error:  # e.g. SQLITE_BUSY: another connection holds the write lock
            classified = classify_storage_failure(
                error, self.backend, phase=phase, commit_state="not_committed", owns_transaction=False
            )
            if classified is None:
                raise
            raise classified from error

    def _ensure_sqlite_transaction(self) -> None:
        self.backend.ensure_transaction(self.conn)


def block_runner(parent: RunnerBase, *, owned_block: bool) -> NestedRunner:
    """A runner for the operations of a block, sharing ``parent``'s connection, lock and fast
    path; it keeps the block's state changes for the end of the block (``sink``).
    ``owned_block``: the block is in a transaction the store owns (it may ``NOTIFY``)."""
    child = NestedRunner(
        parent.conn,
        parent.clock,
        parent.uuid_factory,
        lock=parent.lock,
        fastpath=parent.fastpath,
        target=parent.target,
        backend=parent.backend,
    )
    child.sink = []
    child.owned_block = owned_block
    return child
