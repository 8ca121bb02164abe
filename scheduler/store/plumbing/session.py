"""Transactions: how every store operation gets its connection, clock sample and atomicity.

A ``Runner`` (``runner_base``) executes one operation callback inside a transaction:

* ``OwnedRunner`` (here) — the store owns its connection: each write is ``BEGIN IMMEDIATE`` …
  ``COMMIT``, each read a deferred ``BEGIN`` (one consistent snapshot); a ``transaction()`` block
  is one such transaction, its operations run by a ``NestedRunner``.
* ``NestedRunner`` (``nested_runner``) — an outer transaction already exists
  (``store.transaction()`` or a caller's connection via ``SchedulerStore.on_connection``): each
  operation runs in a ``SAVEPOINT`` so a failed call leaves nothing behind, and nothing is ever
  committed here.

Storage failures anywhere in the cause chain become ``SCHEDULER_STORAGE_UNAVAILABLE`` with a
truthful ``commitState``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Protocol

from sqlalchemy import Connection

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.plumbing.failures import (
    IN_FAILED_TRANSACTION,
    classify_storage_failure,
    rolled_back,
    storage_unavailable,
)
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.nested_runner import NestedRunner, block_runner
from scheduler.store.plumbing.runner_base import RunnerBase, T
from scheduler.store.plumbing.telemetry import collect, emit_all
from scheduler.store.plumbing.tx import CallMode, RestartTransaction, Tx, WholeCycleMissed
from scheduler.store.plumbing.wake_events import settles_runs, wakes_workers


class Housekeeping(Protocol):
    """Upkeep of a store's storage between calls (SQLite: ``checkpoints.WalCheckpoints``)."""

    def after_write(self, conn: Connection) -> None:
        """After each committed write."""

    def idle(self, conn: Connection) -> None:
        """When the store found nothing to do."""


class OwnedRunner(RunnerBase):
    """Runs each operation in its own transaction on a connection the store owns.

    After a lost connection (PostgreSQL) the next call runs on a new driver connection: the
    failed one was invalidated, and SQLAlchemy checks out a new one when the runner next uses it.
    On a database file, ``wal`` keeps the write-ahead log in bounds (``checkpoints.py``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.fastpath is not None and self._owns_fastpath:
            self.fastpath.serve_named()

    session_setup: Callable[[Connection], None] | None = None
    """Run on each new driver connection before its first transaction (PostgreSQL: the lock
    timeout and isolation level), so a store that reconnected runs exactly as before."""
    _prepared_driver: Any = None
    wal: Housekeeping | None = None
    notify_settled: bool = False
    """Also notify the settle channel from a transaction that ended an occurrence
    (:mod:`scheduler.backends.postgresql.wakeups`; the Tasks layer's result waiters listen there)."""

    @property
    def wake_channel(self) -> str | None:
        """Where committed writes that made work claimable notify idle workers (``None``: the
        backend has no ``NOTIFY``)."""
        return self.backend.wake_channel(self.target.schema)

    def write(self, operation: Callable[[Tx], T]) -> T:
        return self._guarded(lambda: self._write_and_count(operation))

    def _write_and_count(self, operation: Callable[[Tx], T]) -> T:
        result = self._run(operation, write=True)
        if self.wal is not None:
            self.wal.after_write(self.conn)
        return result

    def idle(self) -> None:
        wal = self.wal
        if wal is None:
            return
        with suppress(SchedulerKernelError):  # closed meanwhile: the housekeeping is optional
            self._guarded(lambda: wal.idle(self.conn))

    def read(self, operation: Callable[[Tx], T], *, one_statement: bool = False) -> T:
        """``one_statement``: ``operation`` runs exactly one statement (the backend may then
        begin no transaction for it: ``Backend.begin``)."""
        return self._guarded(
            lambda: self._run(operation, write=False, sample_clock=False, one_statement=one_statement)
        )

    def _prepare_driver(self) -> None:
        """``session_setup`` once per driver connection (accessing it reconnects if needed).

        A reconnect that fails (the server is unreachable) is ``SCHEDULER_STORAGE_UNAVAILABLE``,
        ``not_committed``: nothing was sent.
        """
        if self.session_setup is None:
            return
        try:
            driver = self.conn.connection.dbapi_connection
            if driver is not self._prepared_driver:
                self.session_setup(self.conn)
                self._prepared_driver = driver
        except Exception as error:
            classified = classify_storage_failure(
                error, self.backend, phase="write", commit_state="not_committed"
            )
            if classified is None:
                raise
            raise classified from error

    def _run(
        self,
        operation: Callable[[Tx], T],
        *,
        write: bool,
        sample_clock: bool = True,
        one_statement: bool = False,
    ) -> T:
        """Run ``operation`` in a transaction of its own; a write on a backend that runs owned
        writes again (``Backend.reruns_owned_writes``) may ask to (``CallMode.may_run_again``):
        it runs once more, with savepoints. A quiet cycle whose one statement missed
        (``WholeCycleMissed``) first runs once more as it may be run again, the usual way."""
        first = CallMode(may_run_again=write and self.backend.reruns_owned_writes)
        try:
            try:
                return self._attempt(operation, write, sample_clock, call=first, one_statement=one_statement)
            except WholeCycleMissed as missed:  # the cycle the usual way, still may run again
                return self._attempt(
                    operation,
                    write,
                    sample_clock,
                    call=CallMode(may_run_again=first.may_run_again, as_one_statement=False),
                    clock_sample=missed.clock_sample,
                    one_statement=one_statement,
                )
        except RestartTransaction as restart:
            return self._attempt(
                operation,
                write,
                sample_clock,
                call=CallMode(),
                clock_sample=restart.clock_sample,
                one_statement=one_statement,
            )

    def _attempt(
        self,
        operation: Callable[[Tx], T],
        write: bool,
        sample_clock: bool,
        *,
        call: CallMode,
        clock_sample: int | None = None,
        one_statement: bool = False,
    ) -> T:
        returned = False
        tx: Tx | None = None
        self._prepare_driver()
        fast = self._usable_fastpath()
        # With the fast path the transaction is the driver's own (BEGIN … COMMIT on it): the
        # SQLAlchemy Connection only begins one if a statement falls back to its execution.
        transaction = None if fast is not None else self.conn.begin()
        try:
            self.backend.begin(self.conn, write=write, fast=fast, one_statement=one_statement)
            tx = self._tx(sample_clock, fast, call=call, clock_sample=clock_sample)
            result = operation(tx)
            changes = collect(tx)  # inside the transaction: before a COMMIT sent with the writes
            self._finish_writes(tx, fast)
            if tx.finish is not None:
                result = tx.finish(result)
            returned = True
            self._commit(transaction, fast)  # also ends SQLAlchemy's record of a transaction
            if fast is not None:
                fast.end_transaction()
            changes.emit()
            return result
        except BaseException as error:
            closed = self._rollback(transaction or self.conn.get_transaction())
            if isinstance(error, RestartTransaction):
                error.clock_sample = None if tx is None else tx.clock_sample
                raise
            if isinstance(error, SchedulerKernelError):
                raise
            # Once COMMIT was sent (after the body, or with its last writes), it may have been
            # applied: only a failure before it, or one the server answered it with that aborts
            # the transaction, with the transaction provably closed, is "not_committed" (seed:
            # _write).
            sent = returned or (fast is not None and fast.commit_sent)
            refused = closed and sent and rolled_back(error, self.backend)
            classified = classify_storage_failure(
                error,
                self.backend,
                phase="write",
                commit_state="not_committed" if closed and (not sent or refused) else "unknown",
            )
            if classified is None:
                raise
            raise classified from error

    def _finish_writes(self, tx: Tx, fast: FastPath | None) -> None:
        """Send what the call kept for its end, with the ``COMMIT`` where it can go with it (a
        call the store may run again, with named statements, that wakes no worker: the
        notification must precede the ``COMMIT``)."""
        woken = wakes_workers(tx.events)
        watched = not woken and self.notify_settled and self._may_settle(tx)
        if fast is not None and fast.sends_commit and tx.call.may_run_again and not woken and not watched:
            tx.flush_writes(commit=True)
            return
        tx.flush_writes()
        self._notify_if_woken(woken, settled=watched and settles_runs(tx.events))

    @staticmethod
    def _may_settle(tx: Tx) -> bool:
        """Whether the call ended an occurrence, or may have in its writes statement (a whole
        cycle left to it: its settlement's events are known once it ran)."""
        return (tx.pick is not None and tx.pick.settles) or settles_runs(tx.events)

    def _commit(self, transaction: Any, fast: FastPath | None) -> None:
        """COMMIT: the SQLAlchemy transaction begun (or auto-begun by a statement SQLAlchemy
        executed), else the driver's own transaction of the fast path (nothing is sent when the
        ``COMMIT`` went with the call's last writes).

        An aborted transaction is never committed (PostgreSQL would roll it back and report no
        error): ``SCHEDULER_STORAGE_UNAVAILABLE``, 25P02, ``not_committed``.
        """
        if fast is not None and fast.transaction_failed():
            raise storage_unavailable(
                phase="write", storage_code=IN_FAILED_TRANSACTION, commit_state="not_committed"
            )
        transaction = transaction or self.conn.get_transaction()
        if transaction is not None:
            transaction.commit()
        elif fast is not None:
            fast.commit(self.conn)

    def _notify_if_woken(self, woken: bool, *, settled: bool = False) -> None:
        """At most one ``NOTIFY`` in this store-owned transaction: on the work channel when it
        made work claimable (API §9), else on the settle channel when it ended an occurrence and
        ``notify_settled`` is on."""
        if not (woken or settled):
            return
        backend, schema = self.backend, self.target.schema
        channel = backend.wake_channel(schema) if woken else backend.settle_channel(schema)
        if channel is None:
            return
        if self.fastpath is not None:
            self.fastpath.ensure_begun(self.conn)
        backend.send_wakeup(self.conn, channel)

    def _rollback(self, transaction: Any) -> bool:
        fast = self.fastpath
        if fast is not None and not self.conn.invalidated:
            with suppress(Exception):  # closed meanwhile: the rollback below handles it
                fast.rollback_keeping_prepared(self.conn)
        try:
            return self._rollback_driver(transaction)
        finally:
            if fast is not None:
                fast.end_transaction()

    def _rollback_driver(self, transaction: Any) -> bool:
        # Also closes a transaction that a failed COMMIT left inactive (else the next begin() fails).
        with suppress(Exception):
            transaction.rollback()
        if self.conn.invalidated:
            # The driver connection is gone, and the server rolls back what it had not committed.
            # Asking the driver now would reconnect (and raise if the server is unreachable);
            # the next call reconnects.
            return True
        in_transaction = self.backend.driver_in_transaction
        try:
            if in_transaction(self.conn):
                # SQLAlchemy skips the driver rollback of an inactive transaction: do not keep the lock.
                with suppress(Exception):
                    self.conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            return in_transaction(self.conn) is False
        except Exception:  # the state cannot be read: the transaction may still be open
            return False

    @contextmanager
    def outer_transaction(self) -> Iterator[NestedRunner]:
        """``BEGIN IMMEDIATE`` for a block of operations that commit or roll back together.

        The lock is held for the whole block (other threads wait); the block's runner is
        finished when the block ends, whatever the outcome.
        """
        self._enter()
        try:
            transaction, inner = self._begin_block()
            try:
                try:
                    yield inner
                    inner.raise_if_enclosing_rolled_back()
                except BaseException:
                    self._rollback(transaction)
                    raise
                self._commit_block(transaction, inner.wakes, settled=self.notify_settled and inner.settles)
                emit_all(inner.sink or ())
            finally:
                inner.finish()
        finally:
            self._leave()

    def _begin_block(self) -> tuple[Any, NestedRunner]:
        self._prepare_driver()
        transaction = self.conn.begin()
        try:
            self.backend.begin(self.conn, write=True, fast=None)
        except Exception as error:  # e.g. SQLITE_BUSY: nothing ran yet, the block may be retried
            closed = self._rollback(transaction)
            classified = classify_storage_failure(
                error, self.backend, phase="write", commit_state="not_committed" if closed else "unknown"
            )
            if classified is None:
                raise
            raise classified from error
        return transaction, block_runner(self, owned_block=True)

    def _commit_block(self, transaction: Any, woken: bool, *, settled: bool = False) -> None:
        notified = False
        try:
            self._notify_if_woken(woken, settled=settled)
            notified = True
            transaction.commit()
        except Exception as error:
            closed = self._rollback(transaction)
            classified = classify_storage_failure(
                error,
                self.backend,
                phase="commit",
                commit_state="not_committed"
                if closed and (not notified or rolled_back(error, self.backend))
                else "unknown",
                owns_transaction=False,
            )
            if classified is None:
                raise
            raise classified from error
