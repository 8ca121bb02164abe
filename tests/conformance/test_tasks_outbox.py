"""Tasks inside the caller's transaction (``connection=``: the outbox) and from asyncio code, on a
real SQLite file and on the real PostgreSQL server: a committed transaction queues the run with
the application's row, a rolled-back one queues nothing; ``defer_async`` on an ``AsyncConnection``
the same; ``get_async`` and ``await run.wait()``.

API §10.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from backends import sqlite_engine
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from store_places import PostgresSchemaPlace, StorePlace
from tasks_support import count, tasks_on, working

from scheduler import SchedulerKernelError, Tasks
from scheduler.aio import open_async_store


def app_engine(place: StorePlace) -> Engine:
    """The application's engine on the place's database (``begin()`` is a write transaction)."""
    if isinstance(place, PostgresSchemaPlace):
        return create_engine(place.server.url, poolclass=NullPool)
    return sqlite_engine(place.path)


def async_app_engine(place: StorePlace) -> AsyncEngine:
    if isinstance(place, PostgresSchemaPlace):
        url = place.server.url.set(drivername="postgresql+asyncpg")
        return create_async_engine(url.render_as_string(hide_password=False), poolclass=NullPool)
    return create_async_engine(f"sqlite+aiosqlite:///{place.path}", poolclass=NullPool)


def receipts(tasks: Tasks) -> Any:
    @tasks.task(name="send_receipt", queue="mail")
    def send_receipt(order_id: int) -> str:
        return f"receipt {order_id}"

    return send_receipt


def test_a_run_deferred_in_the_callers_transaction_commits_or_rolls_back_with_it(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        send_receipt = receipts(tasks)
        tasks.register()
        engine = app_engine(place)
        try:
            with engine.connect() as connection:
                connection.execute(text("CREATE TEMP TABLE orders (id INTEGER PRIMARY KEY)"))
                connection.commit()
                with connection.begin() as transaction:
                    connection.execute(text("INSERT INTO orders (id) VALUES (1)"))
                    lost = send_receipt.defer(order_id=1, connection=connection)
                    transaction.rollback()  # the business step failed
                with connection.begin():
                    connection.execute(text("INSERT INTO orders (id) VALUES (2)"))
                    kept = send_receipt.defer(order_id=2, connection=connection)
                    assert count(place, "occurrences") == 0  # not committed yet
                orders = [row[0] for row in connection.execute(text("SELECT id FROM orders"))]
            with Session(engine) as session, session.begin():
                from_session = send_receipt.defer(order_id=3, connection=session)
        finally:
            engine.dispose()
        assert orders == [2]
        assert tasks.get(lost.id) is None
        assert count(place, "occurrences") == 2
        with working(tasks):
            assert kept.result(timeout_s=10) == "receipt 2"
            assert from_session.result(timeout_s=10) == "receipt 3"


def test_an_unregistered_task_is_registered_outside_the_callers_transaction(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        send_receipt = receipts(tasks)
        place.open().close()
        engine = app_engine(place)
        try:
            with engine.connect() as connection, connection.begin() as transaction:
                if place.backend == "sqlite":  # one writer: the caller's transaction holds it
                    with pytest.raises(SchedulerKernelError) as refused:
                        send_receipt.defer(order_id=1, connection=connection)
                    assert refused.value.code == "SCHEDULER_TRANSACTION_ACTIVE"
                    assert refused.value.details == {"tasks": ["send_receipt"]}
                else:
                    send_receipt.defer(order_id=1, connection=connection)
                transaction.rollback()
        finally:
            engine.dispose()
        registered = 1 if place.backend == "postgresql" else 0  # in a transaction of its own
        assert (count(place, "jobs"), count(place, "occurrences")) == (registered, 0)


def test_defer_async_on_an_async_connection_and_wait(place: StorePlace) -> None:
    async def body() -> None:
        tasks = tasks_on(place)
        send_receipt = receipts(tasks)

        @tasks.task(name="total")
        async def total(prices: list[int]) -> int:
            await asyncio.sleep(0)
            return sum(prices)

        engine = async_app_engine(place)
        schema = place.schema if isinstance(place, PostgresSchemaPlace) else None
        try:
            await asyncio.to_thread(tasks.register)
            async with engine.connect() as connection:
                transaction = await connection.begin()
                lost = await send_receipt.defer_async(order_id=1, connection=connection)
                await transaction.rollback()
                async with connection.begin():
                    kept = await send_receipt.defer_async(order_id=2, connection=connection)
            many = await total.defer_many_async([{"prices": [1, 2]}, {"prices": [3], "key": "three"}])
            direct = await total.defer_async([4, 5])
            assert (await tasks.get_async(lost.id)) is None
            read = await tasks.get_async(kept.id)
            assert read is not None and (read.status, read.queue) == ("queued", "mail")
            assert schema is None or read.task == "send_receipt"
            with working(tasks):
                assert await kept.wait(timeout_s=10) == "receipt 2"
                assert [await run.wait(timeout_s=10) for run in many] == [3, 3]
                assert await direct.wait(timeout_s=10) == 9
        finally:
            await engine.dispose()
            await tasks.aclose()

    asyncio.run(body())
    assert count(place, "occurrences") == 4


def test_an_async_connection_is_refused_by_the_sync_defer(place: StorePlace) -> None:
    async def body() -> None:
        with tasks_on(place) as tasks:
            send_receipt = receipts(tasks)
            engine = async_app_engine(place)
            try:
                async with engine.connect() as connection:
                    with pytest.raises(SchedulerKernelError) as refused:
                        send_receipt.defer(order_id=1, connection=connection)
                    assert refused.value.code == "SCHEDULER_INVALID_ARGUMENT"
                    with pytest.raises(SchedulerKernelError):
                        await send_receipt.defer_async(order_id=1, connection="nope")
            finally:
                await engine.dispose()

    asyncio.run(body())


def test_tasks_take_an_engine_an_async_engine_or_an_open_store(place: StorePlace) -> None:
    """Whatever the target, sync and async calls and a worker reach the same database."""

    def exercise(tasks: Tasks) -> list[Any]:
        double = tasks.task(name="double")(lambda value: value * 2)
        run = double.defer(1)

        async def from_asyncio() -> Any:
            other = await double.defer_async(2)
            read = await tasks.get_async(run.id)
            await tasks.aclose()
            return other, read

        other, read = asyncio.run(from_asyncio())
        worker = tasks.worker()
        try:
            assert worker.run_until_idle() >= 2
        finally:
            worker.close()
        values = [run.result(timeout_s=0), other.result(timeout_s=0), read.status]
        tasks.close()
        return values

    schema = {"schema": place.schema} if isinstance(place, PostgresSchemaPlace) else {}
    engine = app_engine(place)
    async_engine = async_app_engine(place)
    try:
        assert exercise(Tasks(engine, **schema)) == [2, 4, "queued"]
        with place.open() as store:
            assert exercise(Tasks(store)) == [2, 4, "queued"]
        assert exercise(Tasks(async_engine, **schema)) == [2, 4, "queued"]
    finally:
        engine.dispose()
        asyncio.run(async_engine.dispose())


def test_tasks_on_an_open_async_store_keep_to_its_schema_and_clock(place: StorePlace) -> None:
    """The sync side (sync calls, workers) of ``Tasks(async_store)`` opens the async store's own
    database, schema and clock — not the default schema."""
    pinned = 1_767_225_600_000
    schema = {"schema": place.schema} if isinstance(place, PostgresSchemaPlace) else {}

    async def scenario() -> list[Any]:
        engine = async_app_engine(place)
        store = await open_async_store(engine, clock=lambda: pinned, **schema)
        tasks = Tasks(store)
        double = tasks.task(name="double")(lambda value: value * 2)
        try:
            first = await double.defer_async(1)
            second = await asyncio.to_thread(double.defer, 2)  # the sync side
            worker = tasks.worker()
            try:
                ran = await asyncio.to_thread(worker.run_until_idle)
            finally:
                worker.close()
            values = [await first.wait(timeout_s=0), await second.wait(timeout_s=0)]
            return [ran, values, first.scheduled_for, second.scheduled_for]
        finally:
            await tasks.aclose()
            await store.close()
            await engine.dispose()

    assert asyncio.run(scenario()) == [2, [2, 4], pinned, pinned]
    assert count(place, "jobs") == 1 and count(place, "occurrences") == 2


def test_tasks_on_an_async_url_run_sync_calls_and_workers_with_the_sync_driver(place: StorePlace) -> None:
    """``Tasks("postgresql+asyncpg://…")`` / ``Tasks("sqlite+aiosqlite:///…")``, as an async
    application writes it: async calls use that driver, sync calls and workers the matching sync
    one on the same database (as with an ``AsyncEngine``)."""
    engine = async_app_engine(place)
    url = engine.url.render_as_string(hide_password=False)
    asyncio.run(engine.dispose())
    schema = {"schema": place.schema} if isinstance(place, PostgresSchemaPlace) else {}
    with Tasks(url, **schema) as tasks:
        double = tasks.task(name="double")(lambda value: value * 2)

        async def from_asyncio() -> Any:
            run = await double.defer_async(1)
            await tasks.aclose()
            return run

        first = asyncio.run(from_asyncio())
        second = double.defer(2)
        worker = tasks.worker()
        try:
            assert worker.run_until_idle() == 2
        finally:
            worker.close()
        assert [first.result(timeout_s=0), second.result(timeout_s=0)] == [2, 4]
    assert count(place, "occurrences") == 2


def _connections(place: StorePlace, tag: str) -> int:
    """Open connections to the place's database: PostgreSQL sessions named ``tag``, or this
    process's file descriptors on the SQLite file."""
    if isinstance(place, PostgresSchemaPlace):
        rows = place.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = ?", (tag,))
        return int(rows[0][0])
    descriptors = Path("/proc/self/fd")
    return sum(1 for fd in descriptors.iterdir() if os.path.realpath(fd) == str(place.path.resolve()))


def test_concurrent_first_async_calls_open_one_async_store(place: StorePlace) -> None:
    """Ten ``defer_async`` at once as a loop's first calls (a burst of first requests) share one
    async store, and ``aclose()`` leaves no connection open."""
    tag = f"tasks_test_{os.getpid()}"
    if isinstance(place, PostgresSchemaPlace):
        url = place.server.url.set(drivername="postgresql+psycopg_async", query={"application_name": tag})
        tasks = Tasks(url.render_as_string(hide_password=False), schema=place.schema)
    else:
        tasks = Tasks(f"sqlite+aiosqlite:///{place.path}")
    double = tasks.task(name="double")(lambda value: value * 2)

    async def burst() -> list[int]:
        runs = await asyncio.gather(*(double.defer_async(index) for index in range(10)))
        opened = _connections(place, tag)
        await tasks.aclose()
        return [len({run.id for run in runs}), opened, _connections(place, tag)]

    assert asyncio.run(burst()) == [10, 1, 0]  # ten runs, through one connection, closed
