"""Tasks inside the caller's transaction (``connection=``: the outbox) and from asyncio code, on a
real SQLite file and on the real PostgreSQL server: a committed transaction queues the run with
the application's row, a rolled-back one queues nothing; ``defer_async`` on an ``AsyncConnection``
the same; ``get_async`` and ``await run.wait()``."""

from __future__ import annotations

import asyncio
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
