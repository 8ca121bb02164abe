"""No driver's failure surfaces bare (API §2, §8): every sync and async driver, real server.

* A store whose connection the server killed, with the server unreachable on reconnect: every
  call is SCHEDULER_STORAGE_UNAVAILABLE (the failed call's rollback used to reconnect and let the
  reconnect's own error escape; asyncpg's is a bare ``ConnectionRefusedError``).
* Opening an unreachable server or a database that does not exist is STORAGE_UNAVAILABLE on
  every driver (asyncpg reported both as SCHEMA_CORRUPT).
* A caller's transaction aborted by the caller's own failed statement: 25P02, not retryable.
* ``on_connection`` on a database without the scheduler's tables: SCHEDULER_SCHEMA_UNKNOWN.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import POSTGRESQL, Backend, PostgresServer, unique_name
from lifecycle_support import AUTHORITY
from pg_proxy import PgProxy
from recorded import T0
from sqlalchemy import Connection, make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.aio import AsyncSchedulerStore, open_async_store

ASYNC_PG_DRIVERS = {"asyncpg": "postgresql+asyncpg", "psycopg_async": "postgresql+psycopg"}
LOST = {"phase": "write", "storageCode": "CONNECTION_LOST", "commitState": "not_committed", "retryable": True}


@pytest.fixture(params=sorted(ASYNC_PG_DRIVERS))
def async_url(request: pytest.FixtureRequest, postgres_server: PostgresServer) -> str:
    """The test server's URL for one async PostgreSQL driver."""
    url = postgres_server.url.set(drivername=ASYNC_PG_DRIVERS[request.param])
    return url.render_as_string(hide_password=False)


@pytest.fixture
def proxy(postgres_server: PostgresServer) -> Iterator[PgProxy]:
    running = PgProxy(postgres_server.engine)
    yield running
    running.close()


def through(proxy: PgProxy, url: str) -> str:
    """``url`` with the proxy's address instead of the server's."""
    return make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def kernel_error(outcome: Any) -> SchedulerKernelError:
    assert isinstance(outcome, SchedulerKernelError), f"expected a SchedulerKernelError: {outcome!r}"
    return outcome


async def failure(call: Awaitable[Any]) -> SchedulerKernelError:
    try:
        result = await call
    except Exception as error:
        return kernel_error(error)
    raise AssertionError(f"no error: {result!r}")


def terminate(server: PostgresServer, pid: int) -> None:
    with server.engine.connect() as connection:
        connection.exec_driver_sql("SELECT pg_terminate_backend(%s, 10000)", (pid,))


def backend_pid(store: SchedulerStore) -> int:
    pid = int(store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
    store.connection.rollback()
    return pid


# ----------------------------------------------------------------- lost, then unreachable


def test_an_unreachable_server_after_a_lost_connection_is_classified_on_every_async_call(
    async_url: str, proxy: PgProxy, postgres_server: PostgresServer, pg_schema: str
) -> None:
    url = through(proxy, async_url)

    async def body() -> list[dict[str, Any]]:
        store = await open_async_store(url, schema=pg_schema, clock=lambda: T0)
        try:
            await store.create_job(id="job-1", kind="email", authority=AUTHORITY)
            pid = await store.run_sync(backend_pid)
            proxy.close()  # new connections are refused from now on
            terminate(postgres_server, pid)
            calls = (store.get_job("job-1"), store.get_job("job-1"), store.update_job("job-1", 1, payload={}))
            errors = [await failure(call) for call in calls]
        finally:
            await store.close()
        assert {error.code for error in errors} == {"SCHEDULER_STORAGE_UNAVAILABLE"}
        return [error.details for error in errors]

    first, *later = asyncio.run(body())
    assert first["storageCode"] in ("57P01", "08003", "CONNECTION_LOST")  # 08003: asyncpg
    assert first["commitState"] == "not_committed" and first["retryable"] is True
    assert later == [LOST, LOST]


# ----------------------------------------------------------------- opening


def test_opening_an_unreachable_server_or_a_missing_database_is_storage_unavailable(
    async_url: str, proxy: PgProxy
) -> None:
    proxy.close()
    refused = through(proxy, async_url)
    missing = (
        make_url(async_url).set(database=unique_name("t_db_missing")).render_as_string(hide_password=False)
    )

    async def body(url: str) -> SchedulerKernelError:
        return await failure(open_async_store(url))

    for url in (refused, missing):
        error = asyncio.run(body(url))
        assert error.code == "SCHEDULER_STORAGE_UNAVAILABLE", error
        assert error.details["phase"] == "open" and error.details["commitState"] == "not_committed"
    assert asyncio.run(body(refused)).details["storageCode"] == "CONNECTION_LOST"
    details = asyncio.run(body(missing)).details
    if async_url.startswith("postgresql+asyncpg"):  # asyncpg reports the server's SQLSTATE
        assert details["storageCode"] == "3D000" and details["retryable"] is False
    else:  # psycopg gives none for a refused connection
        assert details["storageCode"] == "CONNECTION_LOST"


def test_a_connection_parameter_the_driver_refuses_is_an_invalid_argument(async_url: str) -> None:
    """psycopg refuses ``connect_timeout=abc`` itself (``ProgrammingError``); asyncpg's ``connect``
    has no such keyword (a bare ``TypeError``): both were reported as ``SCHEDULER_SCHEMA_CORRUPT``."""

    async def body() -> SchedulerKernelError:
        return await failure(open_async_store(f"{async_url}?connect_timeout=abc"))

    error = asyncio.run(body())
    assert error.code == "SCHEDULER_INVALID_ARGUMENT", error


# ----------------------------------------------------------------- the caller's aborted transaction


def test_a_callers_aborted_async_transaction_is_25P02(async_url: str, pg_schema: str) -> None:
    async def body() -> list[SchedulerKernelError]:
        store = await open_async_store(async_url, schema=pg_schema, clock=lambda: T0)
        await store.close()
        engine = create_async_engine(async_url)
        try:
            async with engine.connect() as caller:
                await caller.begin()
                with pytest.raises(DBAPIError):  # the caller's own failed statement
                    await caller.execute(text("SELECT 1 / 0"))
                tx_store = await AsyncSchedulerStore.on_connection(caller, schema=pg_schema, clock=lambda: T0)
                errors = [
                    await failure(tx_store.create_job(id="job-1", kind="email", authority=AUTHORITY)),
                    await failure(tx_store.get_job("job-1")),
                ]
                await caller.rollback()
                assert await tx_store.get_job("job-1") is None  # usable once rolled back
        finally:
            await engine.dispose()
        return errors

    written, read = asyncio.run(body())
    for error, phase in ((written, "write"), (read, "read")):
        assert error.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert error.details == {
            "phase": phase,
            "storageCode": "25P02",
            "commitState": "not_committed",
            "retryable": False,
        }
        assert "caller's transaction is aborted" in error.message


# ----------------------------------------------------------------- no scheduler tables


def expect_schema_unknown(error: SchedulerKernelError, schema: str) -> None:
    assert error.code == "SCHEDULER_SCHEMA_UNKNOWN", error
    assert error.details == {"schema": schema}


def calls_without_tables(store: SchedulerStore, connection: Connection, schema: str) -> None:
    for call in (
        lambda: store.get_job("job-1"),
        lambda: store.create_job(id="job-1", kind="email", authority=AUTHORITY),
    ):
        with pytest.raises(SchedulerKernelError) as caught:
            call()
        expect_schema_unknown(caught.value, schema)
        assert connection.execute(text("SELECT 1")).scalar() == 1  # the caller's transaction lives on


def test_on_connection_without_the_scheduler_tables_is_schema_unknown(backend: Backend) -> None:
    """PostgreSQL: a schema that does not exist, then one that is empty (42P01); SQLite: an
    empty file ("no such table"; outside a transaction through aiosqlite below)."""
    schemas = [backend.schema]
    if backend.name == POSTGRESQL:
        with backend.engine.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{backend.schema}"')
        schemas.append(backend.schema)
    for schema in schemas:
        with backend.engine.connect() as connection:
            store = SchedulerStore.on_connection(connection, schema=schema, clock=lambda: T0)
            if backend.name == POSTGRESQL:  # (the SQLite engine here begins with BEGIN IMMEDIATE)
                calls_without_tables(store, connection, schema)  # outside a transaction
                connection.rollback()  # (the check's SELECT 1 began one)
            with connection.begin():
                calls_without_tables(store, connection, schema)
                with pytest.raises(SchedulerKernelError) as caught, store.transaction() as block:
                    block.get_job("job-1")
                expect_schema_unknown(caught.value, schema)


def test_async_on_connection_without_the_scheduler_tables_is_schema_unknown(
    async_url: str, pg_schema: str
) -> None:
    async def body() -> list[SchedulerKernelError]:
        engine = create_async_engine(async_url)
        try:
            async with engine.connect() as caller:
                tx_store = await AsyncSchedulerStore.on_connection(caller, schema=pg_schema, clock=lambda: T0)
                errors = [await failure(tx_store.get_job("job-1"))]
                await caller.begin()
                errors.append(
                    await failure(tx_store.create_job(id="job-1", kind="email", authority=AUTHORITY))
                )
                assert (await caller.execute(text("SELECT 1"))).scalar() == 1
                await caller.rollback()
        finally:
            await engine.dispose()
        return errors

    for error in asyncio.run(body()):
        expect_schema_unknown(error, pg_schema)


def test_aiosqlite_on_connection_without_the_scheduler_tables_is_schema_unknown(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    sqlite3.connect(path).close()

    async def body() -> list[SchedulerKernelError]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        try:
            async with engine.connect() as caller:
                tx_store = await AsyncSchedulerStore.on_connection(caller, clock=lambda: T0)
                return [
                    await failure(tx_store.get_job("job-1")),
                    await failure(tx_store.create_job(id="job-1", kind="email", authority=AUTHORITY)),
                ]
        finally:
            await engine.dispose()

    for error in asyncio.run(body()):
        expect_schema_unknown(error, "main")


def test_open_store_still_creates_the_tables_where_on_connection_found_none(tmp_path: Path) -> None:
    """The classification is on_connection's: open_store on the same empty file creates v6."""
    path = tmp_path / "empty.sqlite"
    sqlite3.connect(path).close()
    with open_store(path, clock=lambda: T0) as store:
        assert store.schema_info().schema_version == 6
