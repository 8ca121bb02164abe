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

from backends import POSTGRESQL, SQLITE, configured_url, unique_name
from replay import NotApplicable, SqliteFileBackend
from sqlalchemy import create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from scheduler import SchedulerStore, open_store
from scheduler.aio import AsyncSchedulerStore, open_async_store
from scheduler.schema.target import quote_identifier


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


class PostgresSchemaBackend:
    """A fresh schema on the test server (``SCHEDULER_TEST_POSTGRES_URL``), dropped on cleanup.

    Traces that start from a recorded SQLite file do not apply (API §8); event ids are compared
    renumbered densely in order (PostgreSQL's may have gaps); ``sqlite_sequence`` is SQLite's.
    """

    def __init__(self, url: URL) -> None:
        self.url = url
        self.schema = unique_name("t_aio_replay")

    def prepare(self, trace: dict[str, Any]) -> None:
        if trace.get("initial_db"):
            raise NotApplicable("the trace starts from a recorded SQLite file")

    def open(self, **options: Any) -> SchedulerStore:
        """The synchronous store (psycopg) on this schema: the reference for the async drivers."""
        return open_store(self.url.render_as_string(hide_password=False), schema=self.schema, **options)

    def header(self) -> dict[str, Any]:
        return {}

    def expected_tables(self, tables: dict[str, Any]) -> dict[str, Any]:
        return {name: rows for name, rows in tables.items() if name != "sqlite_sequence"}

    def event_ranks(self, tables: dict[str, Any]) -> dict[int, int]:
        ids = sorted(row["event_id"] for row in tables.get("events", []))
        return {event_id: rank for rank, event_id in enumerate(ids, start=1)}

    def cleanup(self) -> None:
        engine = create_engine(self.url, poolclass=NullPool)
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quote_identifier(self.schema)} CASCADE")
        finally:
            engine.dispose()


def _async_url(url: URL, driver: str) -> str:
    return url.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def sqlite_backend(directory: Path) -> AsyncReplayBackend:
    """aiosqlite on the trace's SQLite file (``replay.SqliteFileBackend``)."""
    return AsyncReplayBackend(SqliteFileBackend(directory), lambda inner: inner.path)


def sync_postgresql_backend(_directory: Path) -> PostgresSchemaBackend:
    """The synchronous store on a fresh schema (what the async drivers are compared with)."""
    url = configured_url()
    if url is None:
        raise RuntimeError("SCHEDULER_TEST_POSTGRES_URL is not set")
    return PostgresSchemaBackend(url)


def postgresql_backend(driver: str) -> Callable[[Path], AsyncReplayBackend]:
    """``driver`` (``asyncpg`` or ``psycopg``, async) on a fresh schema of the test server."""

    def make(directory: Path) -> AsyncReplayBackend:
        inner = sync_postgresql_backend(directory)
        return AsyncReplayBackend(inner, lambda _inner: _async_url(inner.url, driver), schema=inner.schema)

    return make


ASYNC_REPLAY_BACKENDS: dict[str, tuple[str, Callable[[Path], AsyncReplayBackend]]] = {
    "aiosqlite": (SQLITE, sqlite_backend),
    "asyncpg": (POSTGRESQL, postgresql_backend("asyncpg")),
    "psycopg_async": (POSTGRESQL, postgresql_backend("psycopg")),
}
"""Driver name → (backend name, factory taking a private temporary directory)."""
