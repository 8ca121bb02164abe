"""``AsyncSchedulerStore``: every ``SchedulerStore`` method as a coroutine over an async driver.

Each method awaits the synchronous store's own method, run in a greenlet on the async driver's
connection (:mod:`scheduler.aio.calls`): the same validation, queries, transactions, results and
errors, not a copy of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import wraps
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from scheduler.aio.calls import CallGuard, run_in_greenlet
from scheduler.contract.errors import invalid_argument
from scheduler.store.facade import SchedulerStore

P = ParamSpec("P")
R = TypeVar("R")


def _coroutine(
    method: Callable[Concatenate[SchedulerStore, P], R],
) -> Callable[Concatenate[AsyncSchedulerStore, P], Coroutine[Any, Any, R]]:
    """The async form of a ``SchedulerStore`` method: same arguments, result and errors."""
    name = method.__name__

    @wraps(method)
    async def call(self: AsyncSchedulerStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        async with self._guard.hold():
            bound: Callable[P, R] = getattr(self._store, name)
            return await run_in_greenlet(bound, *args, **kwargs)

    return call


class AsyncSchedulerStore:
    """A scheduler store for asyncio code: open one with :func:`scheduler.aio.open_async_store`.

    Every method of :class:`~scheduler.SchedulerStore` is here as a coroutine with the same
    arguments, results and errors (``SchedulerKernelError`` with the same codes and details);
    ``transaction()`` is an ``async with`` block; ``close()`` is a coroutine and
    ``async with store:`` closes on exit. Calls from several tasks run one at a time, in turn.
    ``restore_domain_migration_entry_source``'s ``restore_source`` stays a synchronous callable
    (it runs inside the write transaction, on the event loop's thread).
    """

    __slots__ = ("_guard", "_store")

    def __init__(self, store: SchedulerStore) -> None:
        """Wrap a ``SchedulerStore`` whose connection is an async driver's (made by
        ``open_async_store`` or :meth:`on_connection`; not for a sync store)."""
        self._store = store
        self._guard = CallGuard()

    @classmethod
    async def on_connection(
        cls,
        connection: AsyncConnection,
        *,
        clock: Any = None,
        uuid_factory: Callable[[], str] | None = None,
        schema: str | None = None,
    ) -> AsyncSchedulerStore:
        """A store bound to a caller-owned ``AsyncConnection`` inside the caller's transaction
        (transactional outbox), as ``SchedulerStore.on_connection``: it never commits or rolls
        back the caller's transaction; each call runs in a SAVEPOINT. Raises
        ``SCHEDULER_INVALID_ARGUMENT`` for a bad connection, clock or schema."""
        if not isinstance(connection, AsyncConnection):
            raise invalid_argument("connection must be a sqlalchemy.ext.asyncio.AsyncConnection")
        store = await run_in_greenlet(
            SchedulerStore.on_connection,
            connection.sync_connection,  # type: ignore[arg-type]  # None only before connect
            clock=clock,
            uuid_factory=uuid_factory,
            schema=schema,
        )
        return cls(store)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSchedulerStore]:
        """``async with store.transaction() as tx:`` — the calls on ``tx`` commit (on normal
        exit) or roll back together, as ``SchedulerStore.transaction()``; the store's other
        callers wait until the block ends. A cancelled block rolls back."""
        async with self._guard.hold():
            block = self._store.transaction()
            view = await run_in_greenlet(block.__enter__)
            try:
                yield AsyncSchedulerStore(view)
            except BaseException as error:
                if not await run_in_greenlet(block.__exit__, type(error), error, error.__traceback__):
                    raise
            else:
                await run_in_greenlet(block.__exit__, None, None, None)

    async def run_sync(self, function: Callable[[SchedulerStore], R]) -> R:
        """``function(sync_store)`` run like the methods (in the store's greenlet, in turn with
        the other calls): for a synchronous helper over the store, e.g.
        ``await store.run_sync(scheduler.testing.dump_tables)``. ``function`` gets the
        ``SchedulerStore`` this store runs on; it must not keep it past the call. A closed store
        raises ``SCHEDULER_STORE_CLOSED`` (as every call), a non-callable
        ``SCHEDULER_INVALID_ARGUMENT``."""
        if not callable(function):
            raise invalid_argument("function must be a callable taking the SchedulerStore")
        async with self._guard.hold():
            self._store._assert_open()
            return await run_in_greenlet(function, self._store)

    @property
    def closed(self) -> bool:
        """Whether calls are refused (closed, or a finished transaction view)."""
        return self._store.closed

    async def close(self) -> None:
        """Close the store and release its connection (disposing of an engine it created);
        idempotent. Every later call raises ``SCHEDULER_STORE_CLOSED``."""
        async with self._guard.hold():
            await run_in_greenlet(self._store.close)

    async def __aenter__(self) -> AsyncSchedulerStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncSchedulerStore {'closed' if self.closed else 'open'}>"

    # Jobs and occurrences
    create_job = _coroutine(SchedulerStore.create_job)
    get_job = _coroutine(SchedulerStore.get_job)
    update_job = _coroutine(SchedulerStore.update_job)
    enqueue_occurrence = _coroutine(SchedulerStore.enqueue_occurrence)
    enqueue_occurrence_once_per_trigger = _coroutine(SchedulerStore.enqueue_occurrence_once_per_trigger)
    enqueue_many = _coroutine(SchedulerStore.enqueue_many)
    get_occurrence = _coroutine(SchedulerStore.get_occurrence)
    list_occurrences_by_trigger = _coroutine(SchedulerStore.list_occurrences_by_trigger)
    claim_next = _coroutine(SchedulerStore.claim_next)
    claim_occurrence = _coroutine(SchedulerStore.claim_occurrence)
    claim_batch = _coroutine(SchedulerStore.claim_batch)
    renew = _coroutine(SchedulerStore.renew)
    settle = _coroutine(SchedulerStore.settle)
    settle_many = _coroutine(SchedulerStore.settle_many)
    settle_and_claim = _coroutine(SchedulerStore.settle_and_claim)
    settle_many_and_claim = _coroutine(SchedulerStore.settle_many_and_claim)
    release_lease = _coroutine(SchedulerStore.release_lease)
    history = _coroutine(SchedulerStore.history)
    list_dead_letters = _coroutine(SchedulerStore.list_dead_letters)
    schema_info = _coroutine(SchedulerStore.schema_info)
    # Authority (v2)
    set_authority_policy = _coroutine(SchedulerStore.set_authority_policy)
    get_authority_policy = _coroutine(SchedulerStore.get_authority_policy)
    ensure_authority_policy = _coroutine(SchedulerStore.ensure_authority_policy)
    get_authority_reservation = _coroutine(SchedulerStore.get_authority_reservation)
    reserve_authority = _coroutine(SchedulerStore.reserve_authority)
    # Adjudication (v3)
    get_adjudication_case = _coroutine(SchedulerStore.get_adjudication_case)
    list_adjudication_cases = _coroutine(SchedulerStore.list_adjudication_cases)
    get_occurrence_adjudication = _coroutine(SchedulerStore.get_occurrence_adjudication)
    adjudicate_occurrence = _coroutine(SchedulerStore.adjudicate_occurrence)
    # Domain migration journal (v4, v5)
    prepare_domain_migration = _coroutine(SchedulerStore.prepare_domain_migration)
    apply_domain_migration = _coroutine(SchedulerStore.apply_domain_migration)
    verify_domain_migration = _coroutine(SchedulerStore.verify_domain_migration)
    begin_domain_migration_retirement = _coroutine(SchedulerStore.begin_domain_migration_retirement)
    confirm_domain_migration_entry_retired = _coroutine(SchedulerStore.confirm_domain_migration_entry_retired)
    begin_domain_migration_rollback = _coroutine(SchedulerStore.begin_domain_migration_rollback)
    rollback_domain_migration_targets = _coroutine(SchedulerStore.rollback_domain_migration_targets)
    restore_domain_migration_entry_source = _coroutine(SchedulerStore.restore_domain_migration_entry_source)
    confirm_domain_migration_entry_source_restored = _coroutine(
        SchedulerStore.confirm_domain_migration_entry_source_restored
    )
    get_domain_migration = _coroutine(SchedulerStore.get_domain_migration)
    list_domain_migrations = _coroutine(SchedulerStore.list_domain_migrations)
    get_active_domain_migration_by_source = _coroutine(SchedulerStore.get_active_domain_migration_by_source)
    bind_domain_migration_source_locator = _coroutine(SchedulerStore.bind_domain_migration_source_locator)
    # Runtime control (v6)
    get_occurrence_control = _coroutine(SchedulerStore.get_occurrence_control)
    list_runtime_control_occurrences = _coroutine(SchedulerStore.list_runtime_control_occurrences)
    request_occurrence_pause = _coroutine(SchedulerStore.request_occurrence_pause)
    ack_occurrence_pause = _coroutine(SchedulerStore.ack_occurrence_pause)
    resume_occurrence = _coroutine(SchedulerStore.resume_occurrence)
    requeue_dead_letter = _coroutine(SchedulerStore.requeue_dead_letter)
    # Cancellation (beyond the original)
    cancel_occurrence = _coroutine(SchedulerStore.cancel_occurrence)
    # Worker reads and periodic ticks, statistics, pruning (beyond the original)
    get_occurrence_runtime = _coroutine(SchedulerStore.get_occurrence_runtime)
    list_controllable_occurrences = _coroutine(SchedulerStore.list_controllable_occurrences)
    list_periodic_jobs = _coroutine(SchedulerStore.list_periodic_jobs)
    latest_trigger_ticks = _coroutine(SchedulerStore.latest_trigger_ticks)
    periodic_state = _coroutine(SchedulerStore.periodic_state)
    enqueue_periodic_tick = _coroutine(SchedulerStore.enqueue_periodic_tick)
    queue_depth = _coroutine(SchedulerStore.queue_depth)
    stats = _coroutine(SchedulerStore.stats)
    prune = _coroutine(SchedulerStore.prune)
    notify_workers = _coroutine(SchedulerStore.notify_workers)

    @property
    def wake_channel(self) -> str | None:
        """The channel idle workers ``LISTEN`` on (PostgreSQL), ``None`` on SQLite."""
        return self._store.wake_channel


__all__ = ["AsyncSchedulerStore"]
