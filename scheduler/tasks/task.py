"""``Task``: what ``@tasks.task`` and ``@tasks.periodic`` return — the function, callable as before,
with ``defer`` and its relatives (API §10)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from scheduler.tasks.deferring import make_call, make_item
from scheduler.tasks.definition import TaskDefinition
from scheduler.tasks.run import TaskRun

if TYPE_CHECKING:
    from scheduler.tasks.tasks import Tasks

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A task function. Calling it runs the function here and now (nothing is queued);
    :meth:`defer` queues a run for a worker.

    ``name`` (the job id), ``queue`` (the job kind) and ``definition`` describe it.
    """

    def __init__(self, tasks: Tasks, definition: TaskDefinition) -> None:
        self.tasks = tasks
        self.definition = definition
        functools.update_wrapper(self, definition.function)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def queue(self) -> str:
        return self.definition.queue

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.definition.function(*args, **kwargs)
        return result

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def defer(
        self, *args: Any, key: Any = None, run_at: Any = None, connection: Any = None, **kwargs: Any
    ) -> TaskRun:
        """Queue a run of this task with these arguments (JSON values); return its :class:`TaskRun`.

        ``run_at``: when it is due (an aware ``datetime`` or epoch ms; default: now, by the store's
        clock). ``key``: names the run — a second ``defer`` with the same key and the same
        arguments returns the first run (``.deduplicated``), with other arguments it is
        ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH``. ``connection``: a SQLAlchemy ``Connection`` (or an
        ORM ``Session``) inside your transaction — the run is queued only if that transaction
        commits. Bad arguments are ``SCHEDULER_INVALID_ARGUMENT`` and nothing is written.
        """
        call = make_call(self.definition, args, kwargs, key, run_at)
        return self.tasks._defer([call], connection)[0]

    async def defer_async(
        self, *args: Any, key: Any = None, run_at: Any = None, connection: Any = None, **kwargs: Any
    ) -> TaskRun:
        """:meth:`defer` for asyncio code; ``connection`` is an ``AsyncConnection`` (or ``AsyncSession``)."""
        call = make_call(self.definition, args, kwargs, key, run_at)
        return (await self.tasks._defer_async([call], connection))[0]

    def defer_many(self, calls: Sequence[dict[str, Any]], *, connection: Any = None) -> list[TaskRun]:
        """Queue several runs in ONE transaction (all or none): each item is a dict of the call's
        keyword arguments, plus ``key`` / ``run_at`` if wanted. A failing item's error carries
        ``details["index"]``."""
        return self.tasks._defer(self._items(calls), connection)

    async def defer_many_async(
        self, calls: Sequence[dict[str, Any]], *, connection: Any = None
    ) -> list[TaskRun]:
        """:meth:`defer_many` for asyncio code."""
        return await self.tasks._defer_async(self._items(calls), connection)

    def _items(self, calls: Sequence[dict[str, Any]]) -> list[Any]:
        from scheduler.tasks.tasks import defer_items

        return defer_items(calls, lambda item: make_item(self.definition, item))


__all__ = ["Task"]
