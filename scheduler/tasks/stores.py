"""Where a ``Tasks`` object's stores come from: opened lazily from its target, so that building
``tasks = Tasks(url)`` at import time touches no database.

* A URL, path or ``None`` (the default path): a sync store (``open_store``) for sync calls, and an
  async store (``open_async_store``, one per event loop) for the ``*_async`` forms.
* An ``Engine`` or an open ``SchedulerStore``: sync calls use it; the async forms run the sync call
  in a thread (``asyncio.to_thread``).
* An ``AsyncEngine`` or an ``AsyncSchedulerStore``: async calls use it; sync calls (and workers)
  use a sync store opened on the same database with the matching sync driver (aiosqlite → pysqlite,
  asyncpg or async psycopg → psycopg).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduler.aio import AsyncSchedulerStore, open_async_store
from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS
from scheduler.contract.errors import invalid_argument
from scheduler.store.facade import SchedulerStore
from scheduler.store.opening import MEMORY, OpenOptions, open_store
from scheduler.store.queues import notify_settlements

_SYNC_DRIVERS: Final = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}


@dataclass(frozen=True)
class StoreOptions:
    """``open_store``'s options as given to ``Tasks`` (validated when ``Tasks`` is built)."""

    clock: Any = None
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    uuid_factory: Any = None
    schema: str | None = None
    exclusive: bool = True

    def __post_init__(self) -> None:
        OpenOptions.validate(self.clock, self.busy_timeout_ms, self.uuid_factory, self.exclusive)
        if self.schema is not None and not isinstance(self.schema, str):
            raise invalid_argument("schema must be a string")

    def keywords(self) -> dict[str, Any]:
        return {
            "clock": self.clock,
            "busy_timeout_ms": self.busy_timeout_ms,
            "uuid_factory": self.uuid_factory,
            "schema": self.schema,
            "exclusive": self.exclusive,
        }


def _sync_url(url: URL) -> str:
    backend = url.get_backend_name()
    if backend not in _SYNC_DRIVERS:
        raise invalid_argument("the scheduler store supports SQLite and PostgreSQL databases")
    if backend == "sqlite" and url.database in (None, "", MEMORY):
        raise invalid_argument(
            "an in-memory async SQLite database has no synchronous side: "
            "use a file for sync calls and workers"
        )
    return url.set(drivername=_SYNC_DRIVERS[backend]).render_as_string(hide_password=False)


def _is_location(target: Any) -> bool:
    return target is None or isinstance(target, (str, os.PathLike))


class StoreSource:
    """The stores of one ``Tasks`` object (thread-safe; :meth:`close` closes the ones it opened)."""

    def __init__(self, target: Any, options: StoreOptions) -> None:
        if isinstance(target, URL):
            target = target.render_as_string(hide_password=False)
        if not (
            _is_location(target)
            or isinstance(target, (Engine, AsyncEngine, SchedulerStore, AsyncSchedulerStore))
        ):
            raise invalid_argument("Tasks needs a URL, a path, an Engine, an AsyncEngine or an open store")
        self.target = target
        self.options = options
        self._lock = threading.Lock()
        self._sync: SchedulerStore | None = target if isinstance(target, SchedulerStore) else None
        self._opened: list[SchedulerStore] = []
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSchedulerStore] = (
            weakref.WeakKeyDictionary()
        )
        self._opened_async: list[AsyncSchedulerStore] = []

    # ------------------------------------------------------------------ sync

    def _sync_target(self) -> Any:
        target = self.target
        if isinstance(target, AsyncEngine):
            return _sync_url(target.url)
        if isinstance(target, AsyncSchedulerStore):
            return _sync_url(target._store.connection.engine.url)
        return target

    def open_sync(self) -> SchedulerStore:
        """A new sync store on the target (the caller closes it)."""
        store = open_store(self._sync_target(), **self.options.keywords())
        notify_settlements(store)
        return store

    def sync(self) -> SchedulerStore:
        """The shared sync store (opened on first use)."""
        with self._lock:
            if self._sync is None:
                self._sync = self.open_sync()
                self._opened.append(self._sync)
            return self._sync

    @property
    def shares_one_store(self) -> bool:
        """Whether a worker must share the sync store (a given store, or a private in-memory one)."""
        return isinstance(self.target, SchedulerStore) or self.target == MEMORY

    # ------------------------------------------------------------------ async

    @property
    def has_async(self) -> bool:
        """Whether async calls get an async store (else they run sync calls in a thread)."""
        return not isinstance(self.target, (Engine, SchedulerStore))

    async def async_store(self) -> AsyncSchedulerStore:
        """The async store of the running event loop (opened on first use in that loop)."""
        target = self.target
        if isinstance(target, AsyncSchedulerStore):
            return target
        loop = asyncio.get_running_loop()
        store = self._async.get(loop)
        if store is None:
            options = self.options.keywords()
            store = await open_async_store(target, **options)
            await store.run_sync(notify_settlements)
            self._async[loop] = store
            self._opened_async.append(store)
        return store

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Close the sync stores this source opened (async stores: :meth:`aclose`)."""
        with self._lock:
            opened, self._opened = self._opened, []
            if self._sync in opened:
                self._sync = None
        for store in opened:
            store.close()

    async def aclose(self) -> None:
        """Close the async store of the running loop, if this source opened one, and the sync ones."""
        loop = asyncio.get_running_loop()
        store = self._async.pop(loop, None)
        if store is not None and store in self._opened_async:
            self._opened_async.remove(store)
            await store.close()
        await asyncio.to_thread(self.close)


__all__ = ["StoreOptions", "StoreSource"]
