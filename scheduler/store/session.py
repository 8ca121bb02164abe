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

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Row, insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.sql import Executable

from scheduler.contract.canonical import canonical_json
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema import tables as t
from scheduler.store.dialect import BEGIN_READ, BEGIN_WRITE
from scheduler.store.failures import (
    CONTENTION_CODES,
    CommitState,
    find_storage_failure_code,
    storage_unavailable,
)

T = TypeVar("T")
Clock = Callable[[], int]


class Tx:
    """One transaction as seen by an operation: the connection, ``now`` and small helpers."""

    __slots__ = ("_uuid_factory", "conn", "now")

    def __init__(self, conn: Connection, now: int, uuid_factory: Callable[[], str]) -> None:
        self.conn = conn
        self.now = now
        self._uuid_factory = uuid_factory

    def execute(self, statement: Executable, parameters: Any = None) -> CursorResult[Any]:
        return self.conn.execute(statement, parameters)

    def first(self, statement: Executable, parameters: Any = None) -> Row[Any] | None:
        return self.conn.execute(statement, parameters).first()

    def scalar(self, statement: Executable, parameters: Any = None) -> Any:
        return self.conn.execute(statement, parameters).scalar()

    def changes(self, statement: Executable, parameters: Any = None) -> int:
        """Run a DML statement and return how many rows it changed."""
        return int(self.conn.execute(statement, parameters).rowcount)

    def new_uuid(self) -> str:
        value = self._uuid_factory()
        if not isinstance(value, str):
            raise SchedulerKernelError("SCHEDULER_INVALID_ARGUMENT", "uuidFactory must return a string")
        return value

    def append_event(
        self,
        *,
        job_id: str,
        type: str,
        occurrence_id: str | None = None,
        owner_id: str | None = None,
        fence: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append one row to the event history (occurred at ``now``)."""
        self.conn.execute(
            insert(t.events),
            {
                "job_id": job_id,
                "occurrence_id": occurrence_id,
                "event_type": type,
                "occurred_at": self.now,
                "owner_id": owner_id,
                "fence": fence,
                "data_json": canonical_json({} if data is None else data, "event.data"),
            },
        )


class Runner(Protocol):
    conn: Connection

    def write(self, operation: Callable[[Tx], T]) -> T: ...

    def read(self, operation: Callable[[Tx], T]) -> T: ...


def _sample_clock(clock: Clock) -> int:
    return normalize_epoch_ms(clock(), "clock result")


def begin_sqlite_transaction(conn: Connection, begin: str = BEGIN_WRITE) -> None:
    """Start the SQLite transaction explicitly unless the engine's own "begin" hook already did.

    (SQLAlchemy's pysqlite recipe emits BEGIN from a "begin" event; a second BEGIN would fail.)
    """
    if _dbapi_in_transaction(conn) is not True:
        conn.exec_driver_sql(begin)


def _dbapi_in_transaction(conn: Connection) -> bool | None:
    try:
        return bool(conn.connection.dbapi_connection.in_transaction)  # type: ignore[union-attr]
    except Exception:
        return None


def _classify(
    error: BaseException,
    *,
    phase: str,
    commit_state: CommitState,
    contention_state: CommitState | None = None,
) -> SchedulerKernelError | None:
    """Map a storage failure to ``SCHEDULER_STORAGE_UNAVAILABLE``; ``None`` if it is not one.

    Lock contention (``SQLITE_BUSY``) is reported the same way but is retryable when nothing
    was committed; ``contention_state`` may prove that even before the body started.
    """
    storage_code = find_storage_failure_code(error)
    if storage_code:
        return storage_unavailable(phase=phase, storage_code=storage_code, commit_state=commit_state)
    contention = find_storage_failure_code(error, CONTENTION_CODES)
    if contention:
        state = contention_state or commit_state
        return storage_unavailable(
            phase=phase, storage_code=contention, commit_state=state, retryable=state == "not_committed"
        )
    return None


class _Base:
    def __init__(self, conn: Connection, clock: Clock, uuid_factory: Callable[[], str]) -> None:
        self.conn = conn
        self.clock = clock
        self.uuid_factory = uuid_factory
        self.lock = threading.RLock()

    def _tx(self) -> Tx:
        return Tx(self.conn, _sample_clock(self.clock), self.uuid_factory)


class OwnedRunner(_Base):
    """Runs each operation in its own transaction on a connection the store owns."""

    def write(self, operation: Callable[[Tx], T]) -> T:
        with self.lock:
            return self._run(operation, BEGIN_WRITE)

    def read(self, operation: Callable[[Tx], T]) -> T:
        with self.lock:
            return self._run(operation, BEGIN_READ, sample_clock=False)

    def _run(self, operation: Callable[[Tx], T], begin: str, sample_clock: bool = True) -> T:
        state = "not_started"
        transaction = self.conn.begin()
        try:
            begin_sqlite_transaction(self.conn, begin)
            state = "running"
            tx = self._tx() if sample_clock else Tx(self.conn, 0, self.uuid_factory)
            result = operation(tx)
            state = "returned"
            transaction.commit()
            return result
        except BaseException as error:
            closed = self._rollback(transaction)
            if isinstance(error, SchedulerKernelError):
                raise
            # Once the body returned, COMMIT may have been applied: only a failure inside the
            # body with the transaction provably closed is "not_committed" (seed: _write).
            classified = _classify(
                error,
                phase="write",
                commit_state="not_committed" if state == "running" and closed else "unknown",
                contention_state="not_committed" if state != "returned" and closed else "unknown",
            )
            if classified is None:
                raise
            raise classified from error

    def _rollback(self, transaction: Any) -> bool:
        # Also closes a transaction that a failed COMMIT left inactive (else the next begin() fails).
        with suppress(Exception):
            transaction.rollback()
        if _dbapi_in_transaction(self.conn):
            # SQLAlchemy skips the driver rollback of an inactive transaction: do not keep the lock.
            with suppress(Exception):
                self.conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
        return _dbapi_in_transaction(self.conn) is False

    @contextmanager
    def outer_transaction(self) -> Iterator[NestedRunner]:
        """``BEGIN IMMEDIATE`` for a block of operations that commit or roll back together."""
        with self.lock:
            transaction = self.conn.begin()
            begin_sqlite_transaction(self.conn)
            try:
                yield NestedRunner(self.conn, self.clock, self.uuid_factory, lock=self.lock)
            except BaseException:
                self._rollback(transaction)
                raise
            try:
                transaction.commit()
            except Exception as error:
                self._rollback(transaction)
                classified = _classify(error, phase="commit", commit_state="unknown")
                if classified is None:
                    raise
                raise classified from error


class NestedRunner(_Base):
    """Runs each operation in a SAVEPOINT inside a transaction someone else owns."""

    def __init__(
        self,
        conn: Connection,
        clock: Clock,
        uuid_factory: Callable[[], str],
        *,
        lock: threading.RLock | None = None,
    ) -> None:
        super().__init__(conn, clock, uuid_factory)
        if lock is not None:
            self.lock = lock

    def write(self, operation: Callable[[Tx], T]) -> T:
        return self._run(operation, sample_clock=True)

    def read(self, operation: Callable[[Tx], T]) -> T:
        return self._run(operation, sample_clock=False)

    def _run(self, operation: Callable[[Tx], T], *, sample_clock: bool) -> T:
        with self.lock:
            self._ensure_sqlite_transaction()
            savepoint = self.conn.begin_nested()
            try:
                tx = self._tx() if sample_clock else Tx(self.conn, 0, self.uuid_factory)
                result = operation(tx)
                savepoint.commit()
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
                classified = _classify(
                    error, phase="write", commit_state="not_committed" if rolled_back else "unknown"
                )
                if classified is None:
                    raise
                raise classified from error

    def _ensure_sqlite_transaction(self) -> None:
        # pysqlite starts its implicit transaction lazily; a SAVEPOINT opened outside one would
        # become the outermost transaction and its RELEASE would commit the caller's work.
        if self.conn.dialect.name == "sqlite" and _dbapi_in_transaction(self.conn) is False:
            self.conn.exec_driver_sql(BEGIN_WRITE)
