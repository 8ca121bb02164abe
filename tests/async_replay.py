"""The recorded traces through ``scheduler.aio`` (async drivers), with ``replay.py``'s own checks.

``replay.replay`` drives a store synchronously; :class:`BlockingAsyncStore` gives it one whose
every call is a coroutine of an ``AsyncSchedulerStore``, run to completion on the replay's own
event loop. So each recorded call goes through ``open_async_store`` and an async method, and its
result or error is compared exactly as in ``test_traces.py``; the final ``dump_tables`` is read
through the async store too (``AsyncSchedulerStore.run_sync``).

An :class:`AsyncReplayBackend` keeps the database of a synchronous ``ReplayBackend`` (its
``prepare``, header, expected tables, event renumbering and cleanup) and opens it with an async
driver instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from backends import POSTGRESQL, SQLITE
from replay import PostgresSchemaBackend, SqliteFileBackend
from sqlalchemy.engine import URL

from scheduler import SchedulerStore
from scheduler.aio import AsyncSchedulerStore, open_async_store


class BlockingAsyncStore:
    """An ``AsyncSchedulerStore`` called like a ``SchedulerStore``: each call awaited on ``loop``."""

    def __init__(self, store: AsyncSchedulerStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop

    def _wait(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return self._loop.run_until_complete(coroutine)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)
        return lambda *args, **kwargs: self._wait(method(*args, **kwargs))

    def _read(self, operation: Callable[[Any], Any]) -> Any:
        """What ``scheduler.testing.dump_tables`` calls: through ``run_sync`` of the async store."""
        return self._wait(self._store.run_sync(lambda store: store._read(operation)))

    def close(self) -> None:
        self._wait(self._store.close())

    def __enter__(self) -> BlockingAsyncStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AsyncReplayBackend:
    """``inner``'s database, opened with ``open_async_store(target(inner), …)`` on one event loop."""

    def __init__(self, inner: Any, target: Callable[[Any], Any], **open_options: Any) -> None:
        self.inner = inner
        self.target = target
        self.open_options = open_options
        self.loop = asyncio.new_event_loop()

    def prepare(self, trace: dict[str, Any]) -> None:
        self.inner.prepare(trace)

    def open(self, **options: Any) -> SchedulerStore:
        opening = open_async_store(self.target(self.inner), **self.open_options, **options)
        store = self.loop.run_until_complete(opening)
        return BlockingAsyncStore(store, self.loop)  # type: ignore[return-value]

    def header(self) -> dict[str, Any]:
        return dict(self.inner.header())

    def expected_tables(self, tables: dict[str, Any]) -> dict[str, Any]:
        return dict(self.inner.expected_tables(tables))

    def event_ranks(self, tables: dict[str, Any]) -> dict[int, int]:
        return dict(self.inner.event_ranks(tables))

    def cleanup(self) -> None:
        try:
            self.inner.cleanup()
        finally:
            self.loop.close()


def _async_url(url: URL, driver: str) -> str:
    return url.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def sqlite_backend(directory: Path) -> AsyncReplayBackend:
    """aiosqlite on the trace's SQLite file (``replay.SqliteFileBackend``)."""
    return AsyncReplayBackend(SqliteFileBackend(directory), lambda inner: inner.path)


def sync_postgresql_backend(directory: Path) -> PostgresSchemaBackend:
    """The synchronous store on a fresh schema (what the async drivers are compared with)."""
    return PostgresSchemaBackend(directory)


def postgresql_backend(driver: str) -> Callable[[Path], AsyncReplayBackend]:
    """``driver`` (``asyncpg`` or ``psycopg``, async) on a fresh schema of the test server."""

    def make(directory: Path) -> AsyncReplayBackend:
        inner = sync_postgresql_backend(directory)
        return AsyncReplayBackend(
            inner, lambda _inner: _async_url(inner.server.url, driver), schema=inner.schema
        )

    return make


ASYNC_REPLAY_BACKENDS: dict[str, tuple[str, Callable[[Path], AsyncReplayBackend]]] = {
    "aiosqlite": (SQLITE, sqlite_backend),
    "asyncpg": (POSTGRESQL, postgresql_backend("asyncpg")),
    "psycopg_async": (POSTGRESQL, postgresql_backend("psycopg")),
}
"""Driver name → (backend name, factory taking a private temporary directory)."""
