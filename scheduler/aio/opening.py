"""``open_async_store``: the async driver's engine, then ``open_store``'s own opening in a greenlet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from scheduler.aio.calls import run_in_greenlet
from scheduler.aio.store import AsyncSchedulerStore
from scheduler.backends import backend_named
from scheduler.backends.postgresql import backend as postgresql
from scheduler.backends.postgresql.opening import BACKEND_NAMES
from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS
from scheduler.contract.errors import invalid_argument
from scheduler.store.opening import (
    MEMORY,
    OpenOptions,
    Resolved,
    default_database_path,
    driver_begins_nothing,
    engine_file,
    file_path,
    open_resolved,
    own_engine_options,
    parse_url,
)

SQLITE_DRIVERS: Final = {"": "sqlite+aiosqlite", "aiosqlite": "sqlite+aiosqlite"}
POSTGRESQL_DRIVERS: Final = {
    "": "postgresql+psycopg",
    "psycopg": "postgresql+psycopg",
    "psycopg_async": "postgresql+psycopg_async",
    "asyncpg": "postgresql+asyncpg",
}
"""URL driver names accepted, and the async driver each means (``create_async_engine`` takes
``postgresql+psycopg`` as psycopg's async connection)."""
_URL_DRIVERS: Final = {"sqlite": SQLITE_DRIVERS, **dict.fromkeys(BACKEND_NAMES, POSTGRESQL_DRIVERS)}
"""The accepted drivers of each database a URL may name (its part before ``+``)."""
ENGINE_DRIVERS: Final = frozenset(
    {("sqlite", "aiosqlite"), ("postgresql", "asyncpg"), ("postgresql", "psycopg")}
)
"""(``dialect.name``, ``dialect.driver``) of an ``AsyncEngine`` the store runs on. Async psycopg's
dialect calls its driver ``psycopg`` (an ``AsyncEngine``'s dialect is always the async one)."""
_DRIVES: Final = "open_async_store drives aiosqlite, asyncpg or async psycopg"
INSTALL_HINT: Final = 'install the async drivers with pip install "scheduler-kernel[async]"'


def _driver_url(url: URL) -> URL:
    """The URL with its async driver; ``SCHEDULER_INVALID_ARGUMENT`` for another driver or database."""
    backend, _, driver = url.drivername.partition("+")
    drivers = _URL_DRIVERS.get(backend)
    if drivers is None:
        raise invalid_argument("the scheduler store supports SQLite and PostgreSQL databases")
    if driver not in drivers:
        raise invalid_argument(
            f"{_DRIVES}, not {driver} (scheduler.open_store drives the synchronous drivers)"
        )
    return url.set(drivername=drivers[driver])


def _target_url(target: Any) -> URL:
    if target is None:
        target = default_database_path()
    if isinstance(target, str) and target == MEMORY:
        return make_url("sqlite+aiosqlite://")
    if isinstance(target, str) and "://" in target:
        url = _driver_url(parse_url(target))
        database = backend_named(url.get_backend_name()).database_file(url)
        if database is not None:
            file_path(database)  # refuses a NUL character, as open_store does
        return url
    if isinstance(target, (str, os.PathLike)):
        raw = os.fspath(target)
        path = file_path(raw if isinstance(raw, str) else os.fsdecode(raw))
        return make_url(f"sqlite+aiosqlite:///{path}")
    raise invalid_argument(
        "target must be an AsyncEngine, an SQLAlchemy URL, a path, ':memory:' or None"
        + ("; a synchronous Engine is opened with scheduler.open_store" if isinstance(target, Engine) else "")
    )


def _own_engine(url: URL, timeout_ms: int) -> AsyncEngine:
    """The store's own engine: as ``open_store``'s for the backend, on the async driver."""
    try:
        backend = backend_named(url.get_backend_name())
        if not backend.own_schema:  # a database file, or memory
            database = backend.database_file(url)
            path = None if database is None else Path(database)
            engine = create_async_engine(url, **own_engine_options(path, timeout_ms))
            driver_begins_nothing(engine.sync_engine)
            return engine
        return create_async_engine(url, poolclass=NullPool, isolation_level=postgresql.ISOLATION_LEVEL)
    except ImportError as cause:
        raise invalid_argument(f"the {url.drivername} driver is not installed: {INSTALL_HINT}") from cause


def _resolve(target: Any, timeout_ms: int) -> Resolved:
    if isinstance(target, AsyncEngine):
        dialect = target.sync_engine.dialect
        if (dialect.name, dialect.driver) not in ENGINE_DRIVERS:
            raise invalid_argument(f"{_DRIVES}, not {dialect.name}+{dialect.driver}")
        return Resolved(None, engine_file(target.sync_engine), target.sync_engine)
    engine = _own_engine(_target_url(target), timeout_ms)
    return Resolved(None, engine_file(engine.sync_engine), engine.sync_engine, owned=True)


async def open_async_store(
    target: Any = None,
    *,
    clock: Any = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    uuid_factory: Any = None,
    schema: str | None = None,
    exclusive: bool = True,
) -> AsyncSchedulerStore:
    """Open (creating or upgrading to schema v6) a scheduler store for asyncio code.

    ``target``: an ``AsyncEngine`` (aiosqlite, asyncpg or async psycopg; the application's, never
    disposed by the store), an SQLAlchemy URL (``sqlite+aiosqlite:///…``,
    ``postgresql+asyncpg://…``, ``postgresql+psycopg://…`` = async psycopg; ``sqlite://`` and
    ``postgresql://`` without a driver mean aiosqlite and async psycopg), a file path or
    ``":memory:"`` (aiosqlite), or ``None`` for the default path. The options are
    :func:`scheduler.open_store`'s, with the same meaning and checks; opening does exactly what
    ``open_store`` does (same files, modes, schema creation or upgrade, verification, refusals
    and errors). A synchronous ``Engine`` or another driver is ``SCHEDULER_INVALID_ARGUMENT``;
    a driver that is not installed too (install the extra ``scheduler-kernel[async]``).
    """
    options = OpenOptions.validate(clock, busy_timeout_ms, uuid_factory, exclusive)
    place = _resolve(target, options.timeout_ms)
    store = await run_in_greenlet(open_resolved, place, options, schema)
    return AsyncSchedulerStore(store)


__all__ = ["open_async_store"]
