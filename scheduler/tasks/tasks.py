"""``Tasks``: the application developer's front door over the store and the worker (API §10)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import is_safe_int
from scheduler.contract.storable import normalize_key, normalize_stored_authority
from scheduler.store.capabilities.occurrence_rows import with_index
from scheduler.store.facade import SchedulerStore
from scheduler.store.plumbing.lifecycle import keep_forever, reset_after_fork
from scheduler.store.records import Job, Occurrence
from scheduler.tasks.asyncio_layer import async_api, is_async_connection, is_async_session
from scheduler.tasks.deferring import DeferCall, defer_on
from scheduler.tasks.definition import DEFAULT_QUEUE, TaskDefinition, define_task, periodic_trigger
from scheduler.tasks.operations import cancel_matching, cancel_run, retry_matching, retry_run
from scheduler.tasks.registry import is_registered, register_task
from scheduler.tasks.run import TaskRun
from scheduler.tasks.stores import StoreOptions, StoreSource
from scheduler.tasks.task import Task
from scheduler.tasks.waiting import SettleSignal, wait_until_ended, wait_until_ended_async

if TYPE_CHECKING:
    from scheduler.aio import AsyncSchedulerStore
    from scheduler.tasks.worker import TaskWorker

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

DEFAULT_PRINCIPAL: Final = {"type": "service", "id": "app"}
QUEUE_OPTIONS: Final = frozenset({"concurrency"})
MAX_QUEUE_CONCURRENCY: Final = 100_000


def _queues(value: Any) -> dict[str, dict[str, Any]]:
    """``queues={name: {"concurrency": N}}`` checked (order kept: the workers' claim order)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise invalid_argument("queues must be a dict of queue name to options")
    queues: dict[str, dict[str, Any]] = {}
    for name, options in value.items():
        queue = normalize_key(name, "queue", 128)
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise invalid_argument(f"the options of queue {queue!r} must be a dict")
        unknown = sorted(str(key) for key in options if key not in QUEUE_OPTIONS)
        if unknown:
            raise invalid_argument(f"unknown options of queue {queue!r}", {"fields": unknown})
        concurrency = options.get("concurrency")
        if concurrency is not None and (
            not is_safe_int(concurrency) or not 1 <= concurrency <= MAX_QUEUE_CONCURRENCY
        ):
            raise invalid_argument(
                f"concurrency of queue {queue!r} must be an integer between 1 and {MAX_QUEUE_CONCURRENCY}"
            )
        queues[queue] = {"concurrency": concurrency}
    return queues


def _task_options(
    name: Any, queue: Any, max_attempts: Any, retry: Any, timeout_ms: Any, pausable: Any
) -> dict[str, Any]:
    """``define_task``'s keyword arguments from ``task`` / ``periodic``'s."""
    return {
        "name": name,
        "queue": queue,
        "max_attempts": max_attempts,
        "retry": retry,
        "timeout_ms": timeout_ms,
        "pausable": pausable,
    }


def defer_items(items: Any, make: Callable[[Any], DeferCall]) -> list[DeferCall]:
    """Each item of a ``defer_many`` list checked by ``make``; a bad one's error carries its index."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise invalid_argument("defer_many takes a list of dicts")
    calls: list[DeferCall] = []
    for index, item in enumerate(items):
        try:
            calls.append(make(item))
        except SchedulerKernelError as error:
            raise with_index(error, index) from error.__cause__
    return calls


class Tasks:
    """Tasks over one scheduler database: define them with :meth:`task` / :meth:`periodic`, queue runs
    with ``Task.defer``, read and wait for them, and run them with :meth:`worker`.

    ``target``: a URL, a path, ``None`` (the default path), an ``Engine``/``AsyncEngine``, or an open
    ``SchedulerStore``/``AsyncSchedulerStore``; nothing is opened until it is needed. ``principal``:
    the authority every task runs under (default ``{"type": "service", "id": "app"}``).
    ``queues``: ``{name: {"concurrency": N}}`` — the workers' claim order (first = served first)
    and a cap on the runs of that queue running at once across all workers. The other keywords
    are :func:`scheduler.open_store`'s options. Bad options are ``SCHEDULER_INVALID_ARGUMENT``.
    """

    def __init__(
        self,
        target: Any = None,
        *,
        principal: Any = None,
        queues: Any = None,
        clock: Any = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        uuid_factory: Any = None,
        schema: str | None = None,
        exclusive: bool = True,
    ) -> None:
        self.authority: dict[str, Any] = normalize_stored_authority(
            {"principal": DEFAULT_PRINCIPAL if principal is None else principal}
        )
        self.queues = _queues(queues)
        self._options = StoreOptions(clock, busy_timeout_ms, uuid_factory, schema, exclusive)
        self._source = StoreSource(target, self._options)
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self.signal = SettleSignal()
        """Wakes the waiters of :meth:`TaskRun.result` (see :mod:`scheduler.tasks.waiting`)."""
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: new locks, and a new signal (the parent's LISTEN thread is not here;
        its connection, the parent's, is never touched)."""
        self._lock = threading.Lock()
        keep_forever(self.signal)
        self.signal = SettleSignal()

    @property
    def schema(self) -> str | None:
        """The PostgreSQL schema of the scheduler's tables (``None``: the default, ``scheduler``):
        ``Tasks(schema=…)``, or an open store's own. ``scheduler worker`` given ``--db`` without
        ``--schema`` uses it."""
        return self._source.schema

    # ------------------------------------------------------------------ definitions

    @overload
    def task(self, function: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = 3,
        retry: Any = None,
        timeout_ms: int | None = None,
        pausable: bool = False,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]  # the overloads above are the typed forms
        self,
        function: Any = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = 3,
        retry: Any = None,
        timeout_ms: int | None = None,
        pausable: bool = False,
    ) -> Any:
        """``@tasks.task`` or ``@tasks.task(name=, queue=, max_attempts=, retry=RetryPolicy(...),
        timeout_ms=, pausable=)``: make the function a task (checked now:
        ``SCHEDULER_INVALID_ARGUMENT`` for a bad option or a parameter named ``key``, ``run_at`` or
        ``connection``). Returns a :class:`Task`."""
        options = _task_options(name, queue, max_attempts, retry, timeout_ms, pausable)
        return self._decorate(function, options, trigger=None)

    def periodic(
        self,
        function: Any = None,
        /,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        every_ms: int | None = None,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = 3,
        retry: Any = None,
        timeout_ms: int | None = None,
        pausable: bool = False,
    ) -> Any:
        """``@tasks.periodic(cron="0 8 * * *", timezone="Europe/Berlin")`` or ``(every_ms=N)``, plus
        :meth:`task`'s options: a task that runs on that schedule while a worker serves its queue
        (each tick once, however many workers). The function gets the tick (epoch ms) as its one
        positional argument if it takes one. A schedule that can never fire is
        ``SCHEDULER_INVALID_ARGUMENT``."""
        trigger = periodic_trigger(cron, timezone, every_ms)
        options = _task_options(name, queue, max_attempts, retry, timeout_ms, pausable)
        return self._decorate(function, options, trigger=trigger)

    def _decorate(self, function: Any, options: dict[str, Any], trigger: dict[str, Any] | None) -> Any:
        def decorate(target: Callable[..., Any]) -> Task[Any, Any]:
            definition = define_task(target, trigger=trigger, **options)
            return self._add(definition)

        return decorate if function is None else decorate(function)

    def _add(self, definition: TaskDefinition) -> Task[Any, Any]:
        with self._lock:
            existing = self._tasks.get(definition.name)
            if existing is not None and existing.definition.function is not definition.function:
                raise invalid_argument(f"two tasks are named {definition.name!r}: give one of them name=")
            task: Task[Any, Any] = Task(self, definition)
            self._tasks[definition.name] = task
            self._registered.discard(definition.name)
        return task

    @property
    def tasks(self) -> dict[str, Task[Any, Any]]:
        """The defined tasks by name."""
        with self._lock:
            return dict(self._tasks)

    def __getitem__(self, name: str) -> Task[Any, Any]:
        return self._tasks[name]

    @property
    def store(self) -> SchedulerStore:
        """The sync store these tasks use (opened on first use; :meth:`close` closes it if this
        object opened it): what ``scheduler.dashboard.create_app(tasks)`` shows and acts on."""
        return self._source.sync()

    def definition(self, name: str) -> TaskDefinition | None:
        """The definition of the task named ``name`` (a job id), or ``None``."""
        task = self._tasks.get(name)
        return None if task is None else task.definition

    def queue_order(self) -> list[str]:
        """The queues a worker serves by default, in claim order: ``Tasks(queues=…)``'s order, then
        the other queues of the defined tasks alphabetically."""
        declared = list(self.queues)
        others = sorted({task.queue for task in self.tasks.values()} - set(declared))
        return declared + others

    def register(self, store: SchedulerStore | None = None) -> list[Job]:
        """Create or update the job of every defined task (each in a transaction of its own);
        the jobs. Workers do this when they start, ``defer`` for its task on first use."""
        target = store or self._source.sync()
        jobs = [register_task(target, task.definition, self.authority) for task in self.tasks.values()]
        with self._lock:
            self._registered.update(job.id for job in jobs)
        return jobs

    def _unregistered(self, calls: Iterable[DeferCall]) -> list[TaskDefinition]:
        with self._lock:
            wanted = {call.definition.name: call.definition for call in calls}
            return [definition for name, definition in wanted.items() if name not in self._registered]

    def _mark_registered(self, definitions: Iterable[TaskDefinition]) -> None:
        with self._lock:
            self._registered.update(definition.name for definition in definitions)

    def _register_on(self, store: SchedulerStore, definitions: Sequence[TaskDefinition]) -> None:
        for definition in definitions:
            register_task(store, definition, self.authority)

    def _still_unregistered(
        self, caller: SchedulerStore, pending: Sequence[TaskDefinition]
    ) -> list[TaskDefinition]:
        """Of ``pending``, those whose job the caller's transaction does not see as defined
        (registering is never done inside it); on SQLite, where the caller's transaction may hold
        the one write lock, they cannot be registered now: ``SCHEDULER_TRANSACTION_ACTIVE``."""
        found = [definition for definition in pending if is_registered(caller, definition, self.authority)]
        self._mark_registered(found)
        missing = [definition for definition in pending if definition not in found]
        connection = caller.connection
        if missing and caller._runner.backend.serializes_writers and connection.in_transaction():
            raise SchedulerKernelError(
                "SCHEDULER_TRANSACTION_ACTIVE",
                "task "
                + ", ".join(definition.name for definition in missing)
                + " is not registered yet and SQLite has one writer, which your transaction may hold: "
                "call tasks.register() once at startup, before deferring inside your transactions",
                {"tasks": [definition.name for definition in missing]},
            )
        return missing

    # ------------------------------------------------------------------ defer

    def _caller_store(self, connection: Any) -> SchedulerStore:
        if isinstance(connection, Session):
            connection = connection.connection()
        if is_async_connection(connection):
            raise invalid_argument("an async connection is for defer_async")
        if not isinstance(connection, Connection):
            raise invalid_argument("connection must be a sqlalchemy Connection or ORM Session")
        options = self._options
        return SchedulerStore.on_connection(
            connection, clock=options.clock, uuid_factory=options.uuid_factory, schema=options.schema
        )

    def _runs(self, occurrences: Sequence[Occurrence], calls: Sequence[DeferCall]) -> list[TaskRun]:
        return [
            TaskRun.of(occurrence, call.definition.queue, self, occurrence.deduplicated)
            for occurrence, call in zip(occurrences, calls, strict=True)
        ]

    def _defer(self, calls: list[DeferCall], connection: Any) -> list[TaskRun]:
        caller = None if connection is None else self._caller_store(connection)  # checked first
        pending = self._unregistered(calls)
        if pending and caller is not None:
            pending = self._still_unregistered(caller, pending)
        if pending:
            self._register_on(self._source.sync(), pending)
            self._mark_registered(pending)
        store = caller or self._source.sync()
        return self._runs(defer_on(store, calls), calls)

    async def _async_caller(self, connection: Any) -> AsyncSchedulerStore:
        if is_async_session(connection):
            connection = await connection.connection()
        if not is_async_connection(connection):
            raise invalid_argument("connection must be a sqlalchemy AsyncConnection or AsyncSession")
        options = self._options
        store: AsyncSchedulerStore = await async_api().AsyncSchedulerStore.on_connection(
            connection, clock=options.clock, uuid_factory=options.uuid_factory, schema=options.schema
        )
        return store

    async def _on_async(self, function: Callable[[SchedulerStore], T]) -> T:
        """``function(store)`` on the async store of this loop (or the sync store in a thread)."""
        if self._source.has_async:
            store = await self._source.async_store()
            return await store.run_sync(function)
        return await asyncio.to_thread(lambda: function(self._source.sync()))

    async def _defer_async(self, calls: list[DeferCall], connection: Any) -> list[TaskRun]:
        caller = None if connection is None else await self._async_caller(connection)
        pending = self._unregistered(calls)
        if pending and caller is not None:
            pending = await caller.run_sync(lambda store: self._still_unregistered(store, pending))
        if pending:
            await self._on_async(lambda store: self._register_on(store, pending))
            self._mark_registered(pending)
        if caller is not None:
            occurrences = await caller.run_sync(lambda store: defer_on(store, calls))
        else:
            occurrences = await self._on_async(lambda store: defer_on(store, calls))
        return self._runs(occurrences, calls)

    def _call_of(self, item: Any) -> DeferCall:
        from scheduler.tasks.deferring import make_item

        if not isinstance(item, Mapping) or "task" not in item:
            raise invalid_argument('each item must be a dict with "task" (a Task or its name)')
        task = item["task"]
        name = task.name if isinstance(task, Task) else task
        definition = self.definition(name) if isinstance(name, str) else None
        if definition is None:
            raise invalid_argument(f"unknown task {name!r}")
        return make_item(definition, {key: value for key, value in item.items() if key != "task"})

    def defer_many(self, items: Sequence[dict[str, Any]], *, connection: Any = None) -> list[TaskRun]:
        """Queue runs of any tasks in ONE transaction (all or none). Each item is a dict with
        ``"task"`` (a :class:`Task` or its name), the call's keyword arguments, and ``key`` /
        ``run_at`` if wanted. A failing item's error carries ``details["index"]``."""
        return self._defer(defer_items(items, self._call_of), connection)

    async def defer_many_async(
        self, items: Sequence[dict[str, Any]], *, connection: Any = None
    ) -> list[TaskRun]:
        """:meth:`defer_many` for asyncio code."""
        return await self._defer_async(defer_items(items, self._call_of), connection)

    # ------------------------------------------------------------------ runs

    def _queue_of(self, store: SchedulerStore, job_id: str) -> str | None:
        definition = self.definition(job_id)
        if definition is not None:
            return definition.queue
        job = store.get_job(job_id)
        return None if job is None else job.kind

    def _read_run(self, store: SchedulerStore, run_id: str) -> TaskRun | None:
        occurrence = store.get_occurrence(run_id)
        if occurrence is None:
            return None
        return TaskRun.of(occurrence, self._queue_of(store, occurrence.job_id), self)

    def get(self, run_id: str) -> TaskRun | None:
        """The run as it is now, or ``None`` if there is no such run."""
        return self._read_run(self._source.sync(), normalize_key(run_id, "runId"))

    async def get_async(self, run_id: str) -> TaskRun | None:
        """:meth:`get` for asyncio code."""
        identifier = normalize_key(run_id, "runId")
        return await self._on_async(lambda store: self._read_run(store, identifier))

    def _wait(self, run: TaskRun, timeout_s: object) -> TaskRun:
        store = self._source.sync()
        self.signal.listen(store)
        ended = wait_until_ended(self.signal, lambda: store.get_occurrence(run.id), run.id, timeout_s)
        return TaskRun.of(ended, run.queue, self)

    async def _wait_async(self, run: TaskRun, timeout_s: object) -> TaskRun:
        if not self.signal.listening and await self._on_async(lambda store: store.wake_channel is not None):
            await asyncio.to_thread(self._listen_quietly)

        async def read() -> Occurrence | None:
            return await self._on_async(lambda store: store.get_occurrence(run.id))

        ended = await wait_until_ended_async(self.signal, read, run.id, timeout_s)
        return TaskRun.of(ended, run.queue, self)

    def _listen_quietly(self) -> None:
        """Start the LISTEN connection when a sync store can be had (else waiters poll)."""
        with contextlib.suppress(SchedulerKernelError):
            self.signal.listen(self._source.sync())

    def cancel(self, run_id: str, reason: str | None = None) -> TaskRun:
        """Cancel a run (API §12): one still waiting never starts; a running one is told at its next
        lease renewal (``ctx.should_stop``; an async task is cancelled). The run as cancelled."""
        store = self._source.sync()
        occurrence = cancel_run(store, normalize_key(run_id, "runId"), reason)
        self.signal.notify()
        return TaskRun.of(occurrence, self._queue_of(store, occurrence.job_id), self)

    def retry(self, run_id: str) -> TaskRun:
        """Put a dead letter (failed or cancelled) back in its queue (``requeue_dead_letter``)."""
        store = self._source.sync()
        occurrence = retry_run(store, normalize_key(run_id, "runId"))
        return TaskRun.of(occurrence, self._queue_of(store, occurrence.job_id), self)

    def _filters(self, queue: Any, task: Any) -> tuple[list[str] | None, list[str] | None]:
        if isinstance(task, Task):
            task = task.name
        jobs = None if task is None else [normalize_key(task, "task")]
        kinds = None if queue is None else [normalize_key(queue, "queue", 128)]
        if jobs is None and kinds is None:
            jobs = sorted(self.tasks)  # every task of this Tasks object
        return jobs, kinds

    def cancel_all(self, *, queue: str | None = None, task: Any = None, status: Any = "queued") -> int:
        """Cancel every run of ``queue`` and/or ``task`` (default: of every task defined here) whose
        status is ``status`` (``"queued"``, ``"retry_wait"``, ``"running"``, or a list of them);
        how many were cancelled."""
        jobs, kinds = self._filters(queue, task)
        count = cancel_matching(self._source.sync(), jobs, kinds, status)
        if count:
            self.signal.notify()
        return count

    def retry_all(self, *, queue: str | None = None, task: Any = None, code: str | None = None) -> int:
        """Requeue every dead letter of ``queue`` and/or ``task`` (default: of every task defined
        here) whose error code is ``code`` (any when ``None``); how many were requeued."""
        jobs, kinds = self._filters(queue, task)
        return retry_matching(self._source.sync(), jobs, kinds, code)

    # ------------------------------------------------------------------ workers

    def worker(
        self,
        queues: Sequence[str] | None = None,
        *,
        concurrency: int = 1,
        store: SchedulerStore | None = None,
        **options: Any,
    ) -> TaskWorker:
        """A :class:`~scheduler.worker.Worker` running these tasks (API §9: ``run()``, ``stop()``).

        ``queues``: the queues it serves, claimed in strict order (the first one's runs before any
        other's); default :meth:`queue_order`. ``concurrency``: runs at once in this worker. A
        worker opens a store of its own (closed when ``run()`` returns) unless ``store`` is given
        or this ``Tasks`` was built on an open store. Other keywords are ``Worker``'s
        (``lease_ms``, ``retry``, ``shutdown_grace_ms``, …).
        """
        from scheduler.tasks.worker import TaskWorker

        return TaskWorker(self, queues=queues, concurrency=concurrency, store=store, **options)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop listening and close the stores this object opened (idempotent)."""
        self.signal.close()
        self._source.close()

    async def aclose(self) -> None:
        """:meth:`close` for asyncio code (also closes the async store of the running loop)."""
        self.signal.close()
        await self._source.aclose()

    def __enter__(self) -> Tasks:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Tasks {len(self._tasks)} task(s), queues {self.queue_order()}>"


__all__ = ["DEFAULT_PRINCIPAL", "Tasks"]
