"""Where the async API tests open stores: the same database kind through a sync and an async driver.

``AioPlace`` (fixture ``aio_place`` in ``test_aio.py``) is one of ``aiosqlite``, ``asyncpg`` or
``psycopg_async``; ``open_sync(name)`` / ``open_async(name)`` open the store of database ``name``
(a SQLite file in the test's directory, or a schema on the test server, dropped afterwards), so
one test body can run the same calls through both and compare. ``outcome`` turns a result or an
error into plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from backends import POSTGRESQL, SQLITE, PostgresServer, unique_name

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.aio import AsyncSchedulerStore, open_async_store

DRIVER_BACKENDS = {"aiosqlite": SQLITE, "asyncpg": POSTGRESQL, "psycopg_async": POSTGRESQL}
URL_DRIVERS = {"asyncpg": "postgresql+asyncpg", "psycopg_async": "postgresql+psycopg"}


class AioPlace:
    """Named databases of one kind, opened through the sync store or the async driver ``driver``."""

    def __init__(self, driver: str, directory: Path, server: PostgresServer | None) -> None:
        self.driver = driver
        self.backend = DRIVER_BACKENDS[driver]
        self.directory = directory
        self.server = server
        self.schemas: dict[str, str] = {}

    def _schema(self, name: str) -> str:
        return self.schemas.setdefault(name, unique_name(f"t_aio_{name}"))

    def async_url(self) -> str:
        assert self.server is not None
        url = self.server.url.set(drivername=URL_DRIVERS[self.driver])
        return url.render_as_string(hide_password=False)

    def open_sync(self, name: str, **options: Any) -> SchedulerStore:
        if self.server is None:
            return open_store(self.directory / f"{name}.sqlite", **options)
        return open_store(self.server.engine, schema=self._schema(name), **options)

    async def open_async(self, name: str, **options: Any) -> AsyncSchedulerStore:
        if self.server is None:
            return await open_async_store(self.directory / f"{name}.sqlite", **options)
        return await open_async_store(self.async_url(), schema=self._schema(name), **options)

    def cleanup(self) -> None:
        if self.server is not None:
            for schema in self.schemas.values():
                self.server.drop_schema(schema)


def plain(value: Any) -> Any:
    """A result as plain data: records through ``to_dict()``, dataclasses field by field."""
    if hasattr(value, "to_dict"):
        return plain(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def error_data(error: SchedulerKernelError) -> dict[str, Any]:
    return {"error": error.code, "message": error.message, "details": plain(error.details)}


Call = Callable[..., Awaitable[Any]]
"""``await call("method", *args, **kwargs)``: one store method, through whichever store."""


def sync_call(store: SchedulerStore) -> Call:
    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(store, method)(*args, **kwargs)

    return call


def async_call(store: AsyncSchedulerStore) -> Call:
    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(store, method)(*args, **kwargs)

    return call
