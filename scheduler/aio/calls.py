"""How an async store runs the synchronous store's code: in a greenlet, one call at a time.

Each call is SQLAlchemy's ``greenlet_spawn`` (the mechanism behind ``AsyncConnection.run_sync``)
of the sync store's method: the store's own transaction code runs unchanged on the async
driver's connection, and every database wait inside it is an ``await`` on the event loop. No
thread pool is involved (aiosqlite itself runs each ``sqlite3`` connection in a thread of its own).

Cancellation: a call whose task is cancelled is cancelled inside the store, where the
transaction rolls back as after any failure; the caller's ``CancelledError`` is raised only once
that rollback finished, and further cancellations while it runs are absorbed, so the store never
keeps a half-finished transaction. A cancellation that arrives while ``COMMIT`` is in flight
leaves the outcome unknown, as any failure during ``COMMIT`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from functools import partial
from typing import Any, ParamSpec, TypeVar

from sqlalchemy.util import greenlet_spawn

P = ParamSpec("P")
R = TypeVar("R")


async def run_in_greenlet(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``function(*args, **kwargs)`` in a greenlet (its driver waits are awaits of this task);
    a cancellation reaches it once and is re-raised after it finished (see the module doc)."""
    call = partial(function, *args, **kwargs)
    operation: asyncio.Future[R] = asyncio.ensure_future(greenlet_spawn(call))
    try:
        return await asyncio.shield(operation)
    except asyncio.CancelledError:
        operation.cancel()
        await _finished(operation)
        raise


async def _finished(operation: asyncio.Future[Any]) -> None:
    """Wait until ``operation`` is done, whatever cancellations this task receives meanwhile."""
    while not operation.done():
        with suppress(asyncio.CancelledError):
            await asyncio.wait([operation])
    if not operation.cancelled():
        operation.exception()  # retrieved: the caller's CancelledError is what it sees


class CallGuard:
    """One call (or ``transaction()`` block) of a store at a time across the loop's tasks.

    Other tasks wait their turn, as other threads wait for a sync store. A task that already
    holds the guard (inside its own ``transaction()`` block) passes, so the sync store refuses
    that call with ``SCHEDULER_TRANSACTION_ACTIVE`` instead of the task waiting for itself.
    """

    __slots__ = ("_holder", "_lock")

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        task = asyncio.current_task()
        if task is not None and task is self._holder:
            yield
            return
        async with self._lock:
            self._holder = task
            try:
                yield
            finally:
                self._holder = None
