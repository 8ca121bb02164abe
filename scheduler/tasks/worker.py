"""``TaskWorker``: the worker runtime (API §9) running a ``Tasks`` object's tasks (API §10).

It is a :class:`~scheduler.worker.Worker` whose handlers are the tasks' queues, with four changes:

* **strict queue order** — a claim tries the queues one at a time in the worker's order, so a run
  of the first queue is always taken before any run of the next (a busy cycle settles and claims
  the first queue in one transaction, then tries the others);
* **queue caps** — a queue with ``concurrency`` in ``Tasks(queues=…)`` is claimed through
  :func:`scheduler.store.capabilities.queues.claim_next_capped`, which never lets more than that many of its
  runs hold a live lease at once, across every worker, process and host;
* **time limits and cancellation** — :mod:`scheduler.tasks.supervision`;
* **the call** — a run's stored arguments are bound back to the task function (``ctx`` passed when
  the function declares it), in a trace span whose parent is the caller's, and a failure is retried
  under the task's own ``RetryPolicy`` when it has one.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Final

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.queues import claim_next_capped, notify_settlements
from scheduler.store.capabilities.worker_groups import GroupClaims, group_claims
from scheduler.store.capabilities.worker_reads import OccurrenceRuntime
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Job, Occurrence
from scheduler.tasks.arguments import call_of, trace_of
from scheduler.tasks.definition import TaskDefinition
from scheduler.tasks.supervision import TASK_TIMEOUT, Supervisor, TaskLeaseKeeper, Watch
from scheduler.tasks.tracing import task_span
from scheduler.worker.context import HandlerContext
from scheduler.worker.execution import Settlement
from scheduler.worker.lease_keeper import LEASE_LOST, STORAGE_UNAVAILABLE, Lease
from scheduler.worker.policy import PermanentError
from scheduler.worker.runtime import Worker

if TYPE_CHECKING:
    from scheduler.tasks.tasks import Tasks

TASK_NOT_FOUND: Final = "TASK_NOT_FOUND"
TASK_ARGUMENTS: Final = "TASK_ARGUMENTS_INVALID"
_TIMEOUT_SETTLE_TRIES: Final = 5
log = logging.getLogger("scheduler.tasks")


def _queues(tasks: Tasks, queues: Sequence[str] | None) -> list[str]:
    if queues is None:
        order = tasks.queue_order()
    elif isinstance(queues, str) or not isinstance(queues, (list, tuple)) or not queues:
        raise invalid_argument("queues must be a non-empty list of queue names")
    else:
        order = list(dict.fromkeys(normalize_key(queue, "queue", 128) for queue in queues))
    if not order:
        raise invalid_argument("no queue to serve: define a task (or name the queues) first")
    return order


class TaskWorker(Worker):
    """Runs the tasks of a :class:`~scheduler.tasks.Tasks` object: ``run()`` / ``stop()`` as any
    ``Worker``; made by ``tasks.worker(queues=[...], concurrency=N)``. ``run()`` registers the task
    definitions first; a store the worker opened itself is closed when ``run()`` returns."""

    def __init__(
        self,
        tasks: Tasks,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        store: SchedulerStore | None = None,
        **options: Any,
    ) -> None:
        order = _queues(tasks, queues)
        source = tasks._source
        self._owns_store = store is None and not source.shares_one_store
        chosen = store or (source.open_sync() if self._owns_store else source.sync())
        notify_settlements(chosen)
        self.tasks = tasks
        try:
            super().__init__(
                chosen,
                {queue: self._dispatch for queue in order},
                concurrency=concurrency,
                kinds=order,
                **options,
            )
        except BaseException:
            if self._owns_store:
                chosen.close()
            raise
        self.caps: dict[str, int] = {
            queue: cap
            for queue in order
            if (cap := tasks.queues.get(queue, {}).get("concurrency")) is not None
        }
        self._supervisor = Supervisor(self._settle_timeout)
        self._keeper = TaskLeaseKeeper(chosen, self.lease_ms, self._supervisor.lost)
        self._from_queue = threading.local()

    # ------------------------------------------------------------------ lifecycle

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Register the tasks, then work until :meth:`stop` (or SIGTERM/SIGINT), as ``Worker.run``."""
        try:
            self.tasks.register(self.store)
            self._supervisor.start()
            super().run(install_signal_handlers=install_signal_handlers)
        finally:
            self._supervisor.stop()
            self.close()

    def run_until_idle(self) -> int:
        """Register the tasks, then ``Worker.run_until_idle`` (the store stays open)."""
        self.tasks.register(self.store)
        self._supervisor.start()
        try:
            return super().run_until_idle()
        finally:
            self._supervisor.stop()

    def close(self) -> None:
        """Close the store this worker opened (none if it was given one); idempotent."""
        if self._owns_store:
            self.store.close()

    # ------------------------------------------------------------------ claims

    def _claim_next(self) -> Occurrence | None:
        """The first queue (in order) that has a claimable run; capped queues below their cap."""
        for queue in self.kinds[getattr(self._from_queue, "index", 0) :]:
            cap = self.caps.get(queue)
            if cap is None:
                claimed = self.store.claim_next(
                    owner_id=self.owner_id, lease_ms=self.lease_ms, job_kind=queue
                )
            else:
                claimed = claim_next_capped(
                    self.store, owner_id=self.owner_id, lease_ms=self.lease_ms, job_kind=queue, cap=cap
                )
            if claimed is not None:
                return claimed
        return None

    def _group_claims(self) -> GroupClaims:
        """The batched cycles' claims: the queues in order (each drained before the next is tried),
        a capped queue only below its cap (its lock counts the runs the group already claimed)."""
        return group_claims(
            self.owner_id, self.lease_ms, [(queue, self.caps.get(queue)) for queue in self.kinds]
        )

    def _after_settle(self) -> None:
        self.tasks.signal.notify()

    def _claim_kinds(self) -> str:
        """What the one-commit cycle (``Worker._settle_once``'s ``settle_and_claim``) claims: the
        first queue only, so the order stays strict."""
        return self.kinds[0]

    def _settle_once(self, arguments: dict[str, Any], claim_next: bool) -> Occurrence | None:
        """``Worker._settle_once`` (settle, and in the same commit claim from the first queue unless
        it is capped), then the other queues in order when the first had nothing."""
        head_capped = self.kinds[0] in self.caps
        claimed = super()._settle_once(arguments, claim_next and not head_capped)
        self.tasks.signal.notify()
        if claimed is not None or not claim_next:
            return claimed
        self._from_queue.index = 0 if head_capped else 1  # the first queue was just found empty
        try:
            return self._claim()
        finally:
            self._from_queue.index = 0

    def _fires_periodic(self, job: Job) -> bool:
        """Only the periodic tasks defined here: the job of a periodic task removed from (or
        renamed in) the code keeps its trigger, and each of its ticks would fail TASK_NOT_FOUND."""
        definition = self.tasks.definition(job.id)
        return definition is not None and definition.periodic

    def _retry_at(self, lease: Lease) -> int:
        definition = self.tasks.definition(lease.occurrence.job_id)
        policy = definition.retry if definition is not None and definition.retry is not None else self.retry
        return self._now() + policy.delay_ms(lease.occurrence.attempt)

    # ------------------------------------------------------------------ running a task

    def _run(self, lease: Lease, runtime: OccurrenceRuntime | None = None) -> Settlement | None:
        definition = self.tasks.definition(lease.occurrence.job_id)
        watch = None if definition is None else self._supervisor.watch(lease, definition)
        try:
            settlement = super()._run(lease, runtime)
        finally:
            taken = watch is not None and not watch.cancel()
        return None if taken else settlement

    def _dispatch(self, occurrence: Occurrence, ctx: HandlerContext) -> Any:
        """The handler of every queue: call the run's task function with its arguments."""
        definition = self.tasks.definition(occurrence.job_id)
        if definition is None:
            raise PermanentError(f"no task named {occurrence.job_id!r} in this worker", code=TASK_NOT_FOUND)
        try:
            args, kwargs = call_of(definition, occurrence)
        except SchedulerKernelError as error:
            raise PermanentError(error.message, code=TASK_ARGUMENTS) from error
        if definition.wants_ctx:
            kwargs["ctx"] = ctx
        parent = trace_of(occurrence)
        if inspect.iscoroutinefunction(definition.function):
            return self._supervised(definition, occurrence, parent, definition.function(*args, **kwargs))
        with task_span(definition.name, occurrence.id, definition.queue, parent):
            value = definition.function(*args, **kwargs)
        if inspect.isawaitable(value):
            return self._supervised(definition, occurrence, parent, value)
        return value

    async def _supervised(
        self,
        definition: TaskDefinition,
        occurrence: Occurrence,
        parent: dict[str, str] | None,
        call: Awaitable[Any],
    ) -> Any:
        """An async run, cancellable by the supervisor (timeout, lost lease)."""
        import asyncio

        task = asyncio.current_task()
        if task is not None:
            self._supervisor.running_async(occurrence.id, task)
        try:
            with task_span(definition.name, occurrence.id, definition.queue, parent):
                return await call
        finally:
            self._supervisor.finished_async(occurrence.id)

    def _settle_timeout(self, watch: Watch) -> None:
        """Settle a run whose ``timeout_ms`` passed: failed, ``TASK_TIMEOUT``, retryable."""
        lease, definition = watch.lease, watch.definition
        error = {
            "code": TASK_TIMEOUT,
            "message": f"task {definition.name} ran longer than {definition.timeout_ms} ms",
        }
        log.warning("run timed out after %d ms", definition.timeout_ms, extra=lease.extra())
        for _ in range(_TIMEOUT_SETTLE_TRIES):
            try:
                self.store.settle(
                    occurrence_id=lease.occurrence_id,
                    owner_id=lease.owner_id,
                    fence=lease.fence,
                    outcome="failed",
                    error=error,
                    retryable=True,
                    retry_at=self._retry_at(lease),
                )
            except SchedulerKernelError as failure:
                if failure.code == LEASE_LOST:  # it ended meanwhile (cancelled, reclaimed)
                    return
                if failure.code != STORAGE_UNAVAILABLE:
                    raise
                time.sleep(0.1)
                continue
            self.tasks.signal.notify()
            return
        log.error("could not settle the timed-out run; its lease will expire", extra=lease.extra())


__all__ = ["TaskWorker"]
