"""``SchedulerStore``: the public facade, composed of one mixin per capability."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from sqlalchemy import Connection, select

from scheduler.backends import Backend, backend_for
from scheduler.contract.errors import invalid_argument
from scheduler.schema import tables as t
from scheduler.schema.target import SchemaTarget, schema_target
from scheduler.store.capabilities.adjudication import AdjudicationOperations
from scheduler.store.capabilities.authority import AuthorityOperations
from scheduler.store.capabilities.cancellation import CancellationOperations
from scheduler.store.capabilities.domain_migrations import DomainMigrationOperations
from scheduler.store.capabilities.history import HistoryOperations
from scheduler.store.capabilities.jobs import JobOperations
from scheduler.store.capabilities.leases import LeaseOperations
from scheduler.store.capabilities.notify import NotifyOperations
from scheduler.store.capabilities.occurrences import OccurrenceOperations
from scheduler.store.capabilities.periodic_ticks import PeriodicTickOperations
from scheduler.store.capabilities.prune import PruneOperations
from scheduler.store.capabilities.release import ReleaseOperations
from scheduler.store.capabilities.runtime_control import RuntimeControlOperations
from scheduler.store.capabilities.stats import StatsOperations
from scheduler.store.capabilities.worker_reads import WorkerReadOperations
from scheduler.store.clock import default_uuid, wall_clock
from scheduler.store.plumbing.nested_runner import NestedRunner
from scheduler.store.plumbing.runner_base import SERVER_CLOCK, Runner
from scheduler.store.plumbing.session import OwnedRunner
from scheduler.store.plumbing.tx import Clock, Tx
from scheduler.store.records import MigrationRecord, SchemaInfo


def _schema_info(tx: Tx, target: SchemaTarget, backend: Backend) -> SchemaInfo:
    application_id, schema_version = backend.schema_header(tx.conn, target)
    row = tx.first(select(t.migrations).order_by(t.migrations.c.version.desc()).limit(1))
    if schema_version is None:  # the version is the migrations history
        schema_version = 0 if row is None else int(row.version)
    migration = (
        None
        if row is None
        else MigrationRecord(
            version=row.version, name=row.name, checksum=row.checksum, applied_at=row.applied_at
        )
    )
    return SchemaInfo(application_id=application_id, schema_version=schema_version, migration=migration)


class SchedulerStore(
    JobOperations,
    OccurrenceOperations,
    LeaseOperations,
    ReleaseOperations,
    HistoryOperations,
    AuthorityOperations,
    AdjudicationOperations,
    RuntimeControlOperations,
    CancellationOperations,
    DomainMigrationOperations,
    WorkerReadOperations,
    PeriodicTickOperations,
    StatsOperations,
    PruneOperations,
    NotifyOperations,
):
    """A durable job scheduler store over one SQLAlchemy connection.

    Open one with :func:`scheduler.open_store`; bind one to a caller-owned transaction with
    :meth:`on_connection`. Every write method is one atomic write transaction.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        clock: Clock,
        uuid_factory: Callable[[], str],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._init_base(runner, clock, uuid_factory, on_close)

    @classmethod
    def on_connection(
        cls,
        connection: Connection,
        *,
        clock: Clock | None = None,
        uuid_factory: Callable[[], str] | None = None,
        schema: str | None = None,
    ) -> SchedulerStore:
        """A store bound to a caller-owned ``Connection`` inside the caller's transaction.

        It never commits or rolls back the caller's transaction; each operation runs in a
        SAVEPOINT, so a failed call leaves no partial write (transactional outbox pattern).
        The database must already be at schema v6 (open it once with ``open_store``).
        ``schema`` is where the scheduler's tables live: SQLite ``"main"`` (default) or an
        attached database's name, PostgreSQL a schema (default ``"scheduler"``); every statement
        addresses them there, per statement, so the connection's own options stay untouched.
        Raises ``SCHEDULER_INVALID_ARGUMENT`` for a bad connection, clock or schema.
        """
        if not isinstance(connection, Connection):
            raise invalid_argument("connection must be a sqlalchemy.Connection")
        if clock is not None and not callable(clock):
            raise invalid_argument("clock must be a function")
        backend = backend_for(connection)
        chosen_clock = clock or (SERVER_CLOCK if backend.has_server_clock else wall_clock)
        chosen_uuid = uuid_factory or default_uuid
        target = schema_target(connection, schema)
        runner = NestedRunner(connection, chosen_clock, chosen_uuid, target=target, backend=backend)
        return cls(runner, clock=chosen_clock, uuid_factory=chosen_uuid)

    @contextmanager
    def transaction(self) -> Iterator[SchedulerStore]:
        """A store view whose calls all commit (on normal exit) or roll back together.

        The block is one ``BEGIN IMMEDIATE`` transaction; it holds the store's lock, so other
        threads calling this store wait until the block ends. On a store from
        :meth:`on_connection` the block is a SAVEPOINT inside the caller's transaction: an
        exception rolls the block back; the caller still owns the commit.

        Errors: inside the block, calling (or closing) the outer store on the same thread raises
        ``SCHEDULER_TRANSACTION_ACTIVE`` (call the view). After the block, the view refuses
        every call with ``SCHEDULER_STORE_CLOSED`` (``details.reason == "transaction_finished"``)
        and writes nothing. ``SCHEDULER_STORAGE_UNAVAILABLE`` from a call inside the block is
        never ``retryable``: retry the whole block.
        """
        runner = self._runner
        if not isinstance(runner, (OwnedRunner, NestedRunner)):
            raise TypeError(f"unsupported runner {type(runner).__name__}")
        with runner.outer_transaction() as nested:
            yield type(self)(nested, clock=self._clock, uuid_factory=self._uuid_factory)

    def schema_info(self) -> SchemaInfo:
        """Application id, schema version and the newest ``migrations`` row."""
        runner = self._runner
        return self._read(lambda tx: _schema_info(tx, runner.target, runner.backend))

    def __enter__(self) -> SchedulerStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<SchedulerStore {state}>"


__all__ = ["SchedulerStore"]
