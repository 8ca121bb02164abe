"""Transactions: how every store operation gets its connection, clock sample and atomicity.

A ``Runner`` executes one operation callback inside a transaction:

* ``OwnedRunner`` — the store owns its connection: each write is ``BEGIN IMMEDIATE`` … ``COMMIT``,
  each read a deferred ``BEGIN`` (one consistent snapshot).
* ``NestedRunner`` — an outer transaction already exists (``store.transaction()`` or a caller's
  connection via ``SchedulerStore.on_connection``): each operation runs in a ``SAVEPOINT`` so a
  failed call leaves nothing behind, and nothing is ever committed here.

Storage failures anywhere in the cause chain become ``SCHEDULER_STORAGE_UNAVAILABLE`` with a
truthful ``commitState``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final, Protocol, TypeVar

from sqlalchemy import Connection

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema.target import DEFAULT_SCHEMAS, SchemaTarget
from scheduler.store import dialects, lifecycle
from scheduler.store.checkpoints import WalCheckpoints
from scheduler.store.dialect import StoreDialect
from scheduler.store.dialects.postgresql import IN_FAILED_TRANSACTION
from scheduler.store.dialects.sqlite import BEGIN_READ, BEGIN_WRITE
from scheduler.store.failures import classify_storage_failure, missing_tables, storage_unavailable
from scheduler.store.fastpath import FastPath
from scheduler.store.telemetry import StateChanges, collect, emit_all
from scheduler.store.tx import Clock, RestartTransaction, Tx, WholeCycleMissed, read_clock
from scheduler.store.wakeups import send_wakeup, wake_channel, wakes_workers

T = TypeVar("T")


def _server_clock_marker() -> int:
    raise RuntimeError("the server clock is read inside a transaction (Tx.now)")


SERVER_CLOCK: Final[Clock] = _server_clock_marker
"""The runner clock meaning "the database server's clock" (PostgreSQL with ``clock=None``)."""


class Runner(Protocol):
    conn: Connection
    target: SchemaTarget

    @property
    def closed(self) -> bool: ...

    def write(self, operation: Callable[[Tx], T]) -> T: ...

    def read(self, operation: Callable[[Tx], T]) -> T: ...

    def assert_usable(self) -> None: ...

    def close(self, release: Callable[[], None] | None = None) -> None: ...

    def idle(self) -> None: ...


def statement_options(target: SchemaTarget) -> dict[str, Any] | None:
    """Per-statement execution options sending Core statements to ``target``'s schema
    (``None`` for SQLite ``main``: the original's unqualified statements). On PostgreSQL they
    also keep the driver's row count of an INSERT (``Tx.changes``), which SQLAlchemy drops
    unless asked."""
    mapping = target.translate_map
    options: dict[str, Any] = {} if mapping is None else {"schema_translate_map": mapping}
    if target.is_postgresql:
        options["preserve_rowcount"] = True
    return options or None


class _Base:
    """A connection, clock and uuid factory, and when operations may use them.

    Every call holds ``lock`` (a store shared by threads runs one call at a time; a
    ``transaction()`` block holds it for the whole block) and is refused, before anything is
    read or written, when the runner is closed, was inherited by a forked process, or is
    already running a call or block on this thread (see :mod:`scheduler.store.lifecycle`).
    """

    def __init__(
        self,
        conn: Connection,
        clock: Clock,
        uuid_factory: Callable[[], str],
        fastpath: FastPath | None = None,
        lock: threading.RLock | None = None,
        target: SchemaTarget | None = None,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.uuid_factory = uuid_factory
        self.lock = lock or threading.RLock()
        self.dialect: StoreDialect = dialects.for_connection(conn)
        self.target = target or SchemaTarget(conn.dialect.name, DEFAULT_SCHEMAS[conn.dialect.name])
        self.options = statement_options(self.target)
        self.key_locks = self.dialect.key_locks(self.target)
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
        restartable: bool = False,
        clock_sample: int | None = None,
        whole_cycles: bool = True,
    ) -> Tx:
        """``clock_sample``: the injected clock's sample of the call's first attempt, for the call
        run again (the call reads an injected clock once; the server clock is read again after the
        new attempt's locks)."""
        now: int | None = None
        sampler: Clock | None = None
        if self.clock is SERVER_CLOCK:
            conn, now_of = self.conn, self.dialect.server_now
            sampler = lambda: now_of(conn, fast)  # noqa: E731 - read lazily, after the rows are locked
        elif clock_sample is not None:
            now = clock_sample
        else:
            now = read_clock(self.clock) if sample_clock else 0
        dialect = self.dialect
        return Tx(
            self.conn,
            now,
            self.uuid_factory,
            fast,
            self.options,
            sampler,
            self.key_locks,
            concurrent=dialect.CONCURRENT_WRITERS,
            combines_writes=dialect.COMBINES_WRITES,
            restartable=restartable,
            whole_cycles=whole_cycles,
        )

    def idle(self) -> None:
        """The store found nothing to do (a claim without work); a moment for housekeeping."""

    def _child(self) -> NestedRunner:
        """A runner for the operations of a block, sharing this connection, lock and fast path;
        it keeps the block's state changes for the end of the block (``sink``)."""
        child = NestedRunner(
            self.conn,
            self.clock,
            self.uuid_factory,
            lock=self.lock,
            fastpath=self.fastpath,
            target=self.target,
        )
        child.sink = []
        child.owned_block = isinstance(self, OwnedRunner) or getattr(self, "owned_block", False)
        return child

    def _finish(self) -> None:
        """End a block's view: every later call raises ``SCHEDULER_STORE_CLOSED``."""
        self._closed = lifecycle.TRANSACTION_FINISHED


class OwnedRunner(_Base):
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
    wal: WalCheckpoints | None = None

    @property
    def wake_channel(self) -> str | None:
        """Where committed writes that made work claimable notify idle workers (PostgreSQL)."""
        return wake_channel(self.target.schema) if self.target.is_postgresql else None

    def write(self, operation: Callable[[Tx], T]) -> T:
        return self._guarded(lambda: self._write_and_count(operation))

    def _write_and_count(self, operation: Callable[[Tx], T]) -> T:
        result = self._run(operation, BEGIN_WRITE)
        if self.wal is not None:
            self.wal.after_write(self.conn)
        return result

    def idle(self) -> None:
        wal = self.wal
        if wal is None:
            return
        with suppress(SchedulerKernelError):  # closed meanwhile: the housekeeping is optional
            self._guarded(lambda: wal.idle(self.conn))

    def read(self, operation: Callable[[Tx], T]) -> T:
        return self._guarded(lambda: self._run(operation, BEGIN_READ, sample_clock=False))

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
            classified = classify_storage_failure(error, phase="write", commit_state="not_committed")
            if classified is None:
                raise
            raise classified from error

    def _run(self, operation: Callable[[Tx], T], begin: str, sample_clock: bool = True) -> T:
        """Run ``operation`` in a transaction of its own; a write among concurrent writers is
        restartable (``Tx.restartable``): run once more, with savepoints, if it asks to be. A quiet
        cycle whose one statement missed (``WholeCycleMissed``) first runs once more restartable,
        the usual way."""
        restartable = begin == BEGIN_WRITE and self.dialect.CONCURRENT_WRITERS
        try:
            try:
                return self._attempt(operation, begin, sample_clock, restartable=restartable)
            except WholeCycleMissed as missed:  # the cycle the usual way, still restartable
                return self._attempt(
                    operation,
                    begin,
                    sample_clock,
                    restartable=restartable,
                    clock_sample=missed.clock_sample,
                    whole_cycles=False,
                )
        except RestartTransaction as restart:
            return self._attempt(
                operation, begin, sample_clock, restartable=False, clock_sample=restart.clock_sample
            )

    def _attempt(
        self,
        operation: Callable[[Tx], T],
        begin: str,
        sample_clock: bool,
        *,
        restartable: bool,
        clock_sample: int | None = None,
        whole_cycles: bool = True,
    ) -> T:
        returned = False
        tx: Tx | None = None
        self._prepare_driver()
        fast = self._usable_fastpath()
        # With the fast path the transaction is the driver's own (BEGIN … COMMIT on it): the
        # SQLAlchemy Connection only begins one if a statement falls back to its execution.
        transaction = None if fast is not None else self.conn.begin()
        try:
            self.dialect.begin(self.conn, write=begin == BEGIN_WRITE, fast=fast)
            tx = self._tx(
                sample_clock,
                fast,
                restartable=restartable,
                clock_sample=clock_sample,
                whole_cycles=whole_cycles,
            )
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
            # applied: only a failure before it, with the transaction provably closed, is
            # "not_committed" (seed: _write).
            sent = returned or (fast is not None and fast.commit_sent)
            classified = classify_storage_failure(
                error, phase="write", commit_state="not_committed" if closed and not sent else "unknown"
            )
            if classified is None:
                raise
            raise classified from error

    def _finish_writes(self, tx: Tx, fast: FastPath | None) -> None:
        """Send what the call kept for its end, with the ``COMMIT`` where it can go with it (a
        restartable call with named statements that wakes no worker: the notification must
        precede the ``COMMIT``)."""
        woken = wakes_workers(tx.events)
        if fast is not None and fast.sends_commit and tx.restartable and not woken:
            tx.flush_writes(commit=True)
            return
        tx.flush_writes()
        self._notify_if_woken(woken)

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

    def _notify_if_woken(self, woken: bool) -> None:
        """One ``NOTIFY`` in this store-owned transaction when it made work claimable (API §9)."""
        channel = self.wake_channel
        if woken and channel is not None:
            if self.fastpath is not None:
                self.fastpath.ensure_begun(self.conn)
            send_wakeup(self.conn, channel)

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
        in_transaction = self.dialect.driver_in_transaction
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
                self._commit_block(transaction, inner.wakes)
                emit_all(inner.sink or ())
            finally:
                inner._finish()
        finally:
            self._leave()

    def _begin_block(self) -> tuple[Any, NestedRunner]:
        self._prepare_driver()
        transaction = self.conn.begin()
        try:
            self.dialect.begin(self.conn, write=True, fast=None)
        except Exception as error:  # e.g. SQLITE_BUSY: nothing ran yet, the block may be retried
            closed = self._rollback(transaction)
            classified = classify_storage_failure(
                error, phase="write", commit_state="not_committed" if closed else "unknown"
            )
            if classified is None:
                raise
            raise classified from error
        return transaction, self._child()

    def _commit_block(self, transaction: Any, woken: bool) -> None:
        notified = False
        try:
            self._notify_if_woken(woken)
            notified = True
            transaction.commit()
        except Exception as error:
            closed = self._rollback(transaction)
            classified = classify_storage_failure(
                error,
                phase="commit",
                commit_state="not_committed" if closed and not notified else "unknown",
                owns_transaction=False,
            )
            if classified is None:
                raise
            raise classified from error


def _enclosing_rollback_error(phase: str, storage_code: str) -> SchedulerKernelError:
    error = storage_unavailable(phase=phase, storage_code=storage_code, commit_state="not_committed")
    error.message = "Scheduler storage is unavailable; SQLite rolled back the enclosing transaction"
    error.args = (error.message,)
    return error


class NestedRunner(_Base):
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
    ) -> None:
        super().__init__(conn, clock, uuid_factory, fastpath, lock, target)
        self._enclosing_rolled_back = False
        self.sink: list[StateChanges] | None = None
        """Where a block's state changes wait for the block's end (``None``: log per operation)."""
        self.owned_block = False
        """A ``transaction()`` block of a store that owns its transaction (it may ``NOTIFY``)."""
        self.wakes = False
        """A block's operations made work claimable (the owning store notifies at COMMIT)."""

    def mark_wakes(self) -> None:
        """Ask the owning store to wake idle workers when this block commits."""
        self.wakes = True

    def write(self, operation: Callable[[Tx], T]) -> T:
        return self._guarded(lambda: self._run(operation, sample_clock=True))

    def read(self, operation: Callable[[Tx], T]) -> T:
        return self._guarded(lambda: self._read(operation))

    def _read(self, operation: Callable[[Tx], T]) -> T:
        if not self._enclosing_rolled_back and self._found_no_transaction():
            return self._read_in_own_snapshot(operation)
        return self._run(operation, sample_clock=False)

    def _found_no_transaction(self) -> bool:
        """No transaction to join: SQLite's driver has none open (pysqlite begins lazily), or
        the connection is outside any transaction (other drivers)."""
        if self.conn.dialect.name == "sqlite":
            return self.dialect.driver_in_transaction(self.conn) is False
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
        driver: Any = self.conn.connection.dbapi_connection if self.conn.dialect.name == "sqlite" else None
        try:
            if not had_transaction:
                self.conn.begin()  # first: an engine's "begin" event may emit BEGIN itself
            if driver is not None and self.dialect.driver_in_transaction(self.conn) is False:
                driver.execute(BEGIN_READ).close()
            return operation(self._tx(False, self._usable_fastpath()))
        except BaseException as error:
            if isinstance(error, SchedulerKernelError):
                raise
            classified = classify_storage_failure(
                error, phase="read", commit_state="not_committed", owns_transaction=False
            ) or missing_tables(error, self.target.schema)
            if classified is None:
                raise
            raise classified from error
        finally:
            if driver is not None and self.dialect.driver_in_transaction(self.conn):
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
            self.wakes = self.wakes or (self.owned_block and wakes_workers(tx.events))
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
            enclosing_gone = not rolled_back and self.dialect.driver_in_transaction(self.conn) is False
            classified = classify_storage_failure(
                error,
                phase="write",
                commit_state="not_committed" if rolled_back or enclosing_gone else "unknown",
                owns_transaction=False,
            )
            if classified is None:
                missing = missing_tables(error, self.target.schema)
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
            inner = self._child()
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
                inner._finish()
        finally:
            self._leave()

    def _savepoint(self, phase: str = "write") -> Any:
        """A SAVEPOINT for one operation or block (beginning the caller's transaction if needed)."""
        try:
            self._ensure_sqlite_transaction()
            return self.conn.begin_nested()
        except Exception as error:  # e.g. SQLITE_BUSY: another connection holds the write lock
            classified = classify_storage_failure(
                error, phase=phase, commit_state="not_committed", owns_transaction=False
            )
            if classified is None:
                raise
            raise classified from error

    def _ensure_sqlite_transaction(self) -> None:
        self.dialect.ensure_transaction(self.conn)
