"""Where a ``Tasks`` object's stores come from: opened lazily from its target, so that building
``tasks = Tasks(url)`` at import time touches no database.

* A URL, path or ``None`` (the default path): a sync store (``open_store``) for sync calls, and an
  async store (``open_async_store``, one per event loop) for the ``*_async`` forms.
* An ``Engine`` or an open ``SchedulerStore``: sync calls use it; the async forms run the sync call
  in a thread (``asyncio.to_thread``).
* An ``AsyncEngine``, an ``AsyncSchedulerStore`` or an async driver's URL (``postgresql+asyncpg://…``,
  ``sqlite+aiosqlite:///…``): async calls use it; sync calls (and workers)
  use a sync store opened on the same database with the matching sync driver (aiosqlite → pysqlite,
  asyncpg or async psycopg → psycopg) — for an async store, with its schema, clock and id factory.

After ``os.fork()`` (a pre-forking server that imported the application, ``gunicorn --preload``)
the child forgets the stores opened in the parent, which refuse every call there, and opens its
own on first use. A store given as the target is the application's to reopen.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url

from scheduler.backends import backend_named
from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS
from scheduler.contract.errors import invalid_argument
from scheduler.store.capabilities.queues import notify_settlements
from scheduler.store.facade import SchedulerStore
from scheduler.store.opening import MEMORY, OpenOptions, open_store
from scheduler.store.plumbing.lifecycle import reset_after_fork
from scheduler.store.plumbing.runner_base import SERVER_CLOCK
from scheduler.tasks.asyncio_layer import async_api, is_async_engine, is_async_store

if TYPE_CHECKING:
    from scheduler.aio import AsyncSchedulerStore

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
    if backend_named(backend).in_memory(url):
        raise invalid_argument(
            "an in-memory async SQLite database has no synchronous side: "
            "use a file for sync calls and workers"
        )
    return url.set(drivername=_SYNC_DRIVERS[backend]).render_as_string(hide_password=False)


def _async_url(target: Any) -> URL | None:
    """``target`` as a URL when it is one of an async driver (``postgresql+asyncpg://…``,
    ``sqlite+aiosqlite:///…``), else ``None``."""
    if not isinstance(target, str) or "://" not in target:
        return None
    try:
        url = make_url(target)
        return url if url.get_dialect().is_async else None
    except Exception:  # unknown or malformed: open_store refuses it with its own error
        return None


def _options_of(store: SchedulerStore) -> dict[str, Any]:
    """The ``open_store`` options that make a second store the same as ``store``: its schema (or,
    on SQLite, whether it is exclusive), its clock and its id factory."""
    place = store._runner.target
    options: dict[str, Any] = {"uuid_factory": store._uuid_factory}
    if store._runner.backend.own_schema:
        options["schema"] = place.schema
    else:
        options["exclusive"] = place.exclusive
    if store._clock is not SERVER_CLOCK:
        options["clock"] = store._clock
    return options


def _is_location(target: Any) -> bool:
    return target is None or isinstance(target, (str, os.PathLike))


class StoreSource:
    """The stores of one ``Tasks`` object (thread-safe; :meth:`close` closes the ones it opened)."""

    def __init__(self, target: Any, options: StoreOptions) -> None:
        if isinstance(target, URL):
            target = target.render_as_string(hide_password=False)
        if not (
            _is_location(target)
            or isinstance(target, (Engine, SchedulerStore))
            or is_async_engine(target)
            or is_async_store(target)
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
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the stores opened in the parent refuse every call here (their
        connections are the parent's, left untouched); forget them, so the next call opens new ones."""
        self._lock = threading.Lock()
        self._opened = []
        if not isinstance(self.target, SchedulerStore):
            self._sync = None
        self._async = weakref.WeakKeyDictionary()
        self._opened_async = []
        self._opening = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ sync

    def _sync_target(self) -> tuple[Any, dict[str, Any]]:
        """What ``open_store`` opens for the sync side, and its options."""
        target, keywords = self.target, self.options.keywords()
        if is_async_engine(target):
            return _sync_url(target.url), keywords
        if is_async_store(target):
            return _sync_url(target._store.connection.engine.url), {**keywords, **_options_of(target._store)}
        url = _async_url(target)
        return (target if url is None else _sync_url(url)), keywords

    def open_sync(self) -> SchedulerStore:
        """A new sync store on the target (the caller closes it)."""
        target, keywords = self._sync_target()
        store = open_store(target, **keywords)
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
    def schema(self) -> str | None:
        """The PostgreSQL schema of the target: an open store's own, else ``Tasks(schema=…)``."""
        target = self.target
        store = target._store if is_async_store(target) else target
        if isinstance(store, SchedulerStore):
            runner = store._runner
            return runner.target.schema if runner.backend.own_schema else None
        return self.options.schema

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
        if is_async_store(target):
            return target
        loop = asyncio.get_running_loop()
        store = self._async.get(loop)
        if store is not None:
            return store
        async with self._opening_lock(loop):  # concurrent first calls: one store, not one each
            store = self._async.get(loop)
            if store is None:
                store = await async_api().open_async_store(target, **self.options.keywords())
                await store.run_sync(notify_settlements)
                self._async[loop] = store
                self._opened_async.append(store)
        return store

    def _opening_lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._lock:
            lock = self._opening.get(loop)
            if lock is None:
                lock = self._opening[loop] = asyncio.Lock()
            return lock

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
