"""The async API (``scheduler.aio``) on aiosqlite, asyncpg and async psycopg.

Same results and errors as the synchronous store (one scripted sequence through both, compared
call by call), every method present with the same signature, ``transaction()`` blocks,
serialization of concurrent tasks, storage failures mapped identically, and cancellation leaving
no half-written transaction. (The recorded traces run through it in ``test_aio_traces.py``.)
API §9 (scheduler.aio).
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from aio_support import DRIVER_BACKENDS, AioPlace, Call, async_call, error_data, plain, sync_call
from backends import POSTGRESQL, PostgresServer
from lifecycle_support import AUTHORITY
from recorded import T0
from sqlalchemy import create_engine, event
from sqlalchemy.ext.asyncio import create_async_engine

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.aio import AsyncSchedulerStore, open_async_store
from scheduler.testing import dump_tables

DRIVERS = [
    pytest.param(driver, marks=[pytest.mark.postgresql] if backend == POSTGRESQL else [])
    for driver, backend in DRIVER_BACKENDS.items()
]
SYNC_ONLY = {"on_connection", "transaction", "close", "closed", "clock", "connection", "wake_channel"}
"""Members whose async form is written by hand (or, for ``clock``/``connection``, absent; the
``wake_channel`` property is a plain property)."""


@pytest.fixture(params=DRIVERS)
def aio_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AioPlace]:
    server: PostgresServer | None = None
    if DRIVER_BACKENDS[request.param] == POSTGRESQL:
        server = request.getfixturevalue("postgres_server")
    place = AioPlace(request.param, tmp_path, server)
    yield place
    place.cleanup()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        self.now += 1
        return self.now


def options() -> dict[str, Any]:
    issued = iter(range(1, 1000))
    return {"clock": Clock(), "uuid_factory": lambda: f"00000000-0000-4000-8000-{next(issued):012x}"}


async def exercise(call: Call) -> list[Any]:
    """Every method beyond the recorded traces, and typical errors, in one sequence."""
    outcomes: list[Any] = []
    with suppress(Stopped):
        await _script(call, outcomes)
    return outcomes


class Stopped(Exception):
    """The scripted sequence met an error that is not a ``SchedulerKernelError``."""


async def _script(call: Call, outcomes: list[Any]) -> None:

    async def step(method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            value = await call(method, *args, **kwargs)
        except SchedulerKernelError as error:
            outcomes.append((method, error_data(error)))
            return None
        except Exception as error:  # a library bug: recorded, and the sequence stops here
            outcomes.append((method, {"unexpected": type(error).__name__}))
            raise Stopped from error
        outcomes.append((method, plain(value)))
        return value

    trigger = {"type": "interval", "everyMs": 60_000, "anchor": T0}
    await step("create_job", id="j1", kind="email", authority=AUTHORITY, trigger=trigger, max_attempts=2)
    await step("create_job", id="j1", kind="email", authority=AUTHORITY)  # conflict
    await step("get_job", "j1")
    await step("update_job", "j1", 1, payload={"v": 2})
    await step("update_job", "j1", 1, payload={"v": 3})  # revision conflict
    keys = [{"job_id": "j1", "scheduled_for": T0, "trigger_key": f"k{n}"} for n in range(4)]
    await step("enqueue_many", keys)
    await step("enqueue_occurrence", job_id="j1", scheduled_for=T0, trigger_key="k0")  # deduplicated
    await step("enqueue_occurrence_once_per_trigger", job_id="j1", scheduled_for=T0, trigger_key="interval:0")
    await step("enqueue_occurrence", job_id="j1", scheduled_for=-1, trigger_key="bad")  # invalid
    await step("list_occurrences_by_trigger", job_id="j1", trigger_key="k0")
    batch = await step("claim_batch", owner_id="w", lease_ms=60_000, limit=2)
    first, second = batch
    await step("renew", occurrence_id=first.id, owner_id="w", fence=first.fence, lease_ms=60_000)
    await step("renew", occurrence_id=first.id, owner_id="w", fence=first.fence + 7, lease_ms=60_000)
    await step("settle_many", [{"occurrence_id": first.id, "owner_id": "w", "fence": first.fence,
                                "outcome": "succeeded", "result": {"ok": 1}}])  # fmt: skip
    failed = {"code": "E_BROKEN", "message": "broken"}
    pair = await step("settle_and_claim", occurrence_id=second.id, owner_id="w", fence=second.fence,
                      outcome="failed", error=failed, retryable=False, lease_ms=60_000)  # fmt: skip
    third = pair.claimed
    await step("claim_next", owner_id="w2", lease_ms=60_000, job_kind=["email", "sms"])
    await step("settle", occurrence_id=third.id, owner_id="w", fence=third.fence, outcome="succeeded")
    await step("get_occurrence", second.id)
    await step("claim_occurrence", occurrence_id=second.id, owner_id="w3", lease_ms=1_000)
    await step("list_dead_letters")
    await step("requeue_dead_letter", occurrence_id=second.id, expected_fence=second.fence,
               expected_error_code="E_BROKEN", request_id="rq-1")  # fmt: skip
    await step("cancel_occurrence", occurrence_id=second.id, reason="async cancel")
    await step("cancel_occurrence", occurrence_id=second.id)  # already cancelled: unchanged
    await step("cancel_occurrence", occurrence_id=first.id)  # succeeded: conflict
    await step("cancel_occurrence", occurrence_id="occ-missing")  # not found
    await step("cancel_occurrence", occurrence_id=second.id, reason=5)  # invalid
    await step("requeue_dead_letter", occurrence_id=second.id, expected_fence=second.fence + 1,
               expected_error_code="CANCELLED", request_id="rq-2")  # fmt: skip
    await step("history", job_id="j1", limit=100)
    await step("get_occurrence_runtime", first.id)
    await step("list_controllable_occurrences")
    await step("list_periodic_jobs")
    await step("latest_trigger_ticks", "j1")
    await step("periodic_state", "j1")
    tick = {"job_id": "j1", "scheduled_for": T0 + 60_000, "trigger_key": "interval:1"}
    await step("enqueue_periodic_tick", job_revision=2, **tick)
    await step("enqueue_periodic_tick", job_revision=1, **tick)  # the job changed: None
    await step("queue_depth")
    await step("stats")
    await step("prune", older_than_ms=0, dry_run=True)
    await step("prune", older_than_ms=0)
    await step("ensure_authority_policy", AUTHORITY)
    await step("get_authority_policy", AUTHORITY["principal"])
    await step("get_authority_reservation", first.id)
    await step("get_occurrence_control", first.id)
    await step("list_runtime_control_occurrences")
    await step("get_adjudication_case", first.id)
    await step("list_adjudication_cases")
    await step("get_occurrence_adjudication", first.id)
    await step("list_domain_migrations")
    await step("get_domain_migration", "missing")
    await step("schema_info")
    await step("enqueue_many", [{**key, "trigger_key": f"c{n}"} for n, key in enumerate(keys)])
    held = await step("claim_batch", owner_id="w5", lease_ms=60_000, limit=2)
    settle_held = [{"occurrence_id": item.id, "owner_id": "w5", "fence": item.fence, "outcome": "succeeded"}
                   for item in held]  # fmt: skip
    stale = [settle_held[0], {**settle_held[1], "fence": held[1].fence + 1}]
    await step("settle_many_and_claim", stale, owner_id="w5", lease_ms=60_000, limit=2)  # lost at index 1
    await step("settle_many_and_claim", settle_held, owner_id="w5", lease_ms=60_000, limit=1,
               job_kind=["email"])  # fmt: skip
    await step("settle_many_and_claim", [], owner_id="w5", lease_ms=60_000, limit=1001)  # invalid
    await step("get_job", 42)  # invalid argument


def test_every_store_method_is_a_coroutine_with_the_same_signature() -> None:
    public = {name for name in dir(SchedulerStore) if not name.startswith("_")}
    for name in sorted(public - SYNC_ONLY):
        method = getattr(AsyncSchedulerStore, name)
        assert inspect.iscoroutinefunction(method), name
        assert inspect.signature(method) == inspect.signature(getattr(SchedulerStore, name)), name
        assert method.__doc__ == getattr(SchedulerStore, name).__doc__
    assert inspect.iscoroutinefunction(AsyncSchedulerStore.close)
    assert inspect.iscoroutinefunction(AsyncSchedulerStore.on_connection)


def test_the_same_calls_give_the_same_results_and_errors(aio_place: AioPlace) -> None:
    with aio_place.open_sync("sync", **options()) as store:
        expected = asyncio.run(exercise(sync_call(store)))
        expected_tables = dump_tables(store)

    async def through_async() -> tuple[list[Any], Any]:
        async with await aio_place.open_async("async", **options()) as store:
            return await exercise(async_call(store)), await store.run_sync(dump_tables)

    outcomes, tables = asyncio.run(through_async())
    assert [method for method, _ in outcomes] == [method for method, _ in expected]
    for got, want in zip(outcomes, expected, strict=True):
        assert got == want
    assert tables == expected_tables
    if any("unexpected" in str(outcome) for _, outcome in expected):
        pytest.xfail(f"the synchronous store fails too: {expected[-1]}")


def test_cancel_occurrence_is_awaited_with_the_sync_stores_outcomes(aio_place: AioPlace) -> None:
    async def body() -> None:
        async with await aio_place.open_async("cancel", **options()) as store:
            await store.create_job(id="c1", kind="email", authority=AUTHORITY, max_attempts=2)
            await store.enqueue_occurrence(job_id="c1", scheduled_for=T0, trigger_key="k")
            running = await store.claim_next(owner_id="w", lease_ms=60_000)
            assert running is not None
            cancelled = await store.cancel_occurrence(occurrence_id=running.id, reason="stop")
            assert (cancelled.status, cancelled.fence) == ("dead_letter", running.fence + 1)
            assert cancelled.last_error == {"code": "CANCELLED", "message": "stop"}
            assert await store.cancel_occurrence(occurrence_id=running.id) == cancelled
            before = await store.run_sync(dump_tables)
            with pytest.raises(SchedulerKernelError) as lost:
                await store.settle(
                    occurrence_id=running.id, owner_id="w", fence=running.fence, outcome="succeeded"
                )
            assert lost.value.code == "SCHEDULER_LEASE_LOST"
            with pytest.raises(SchedulerKernelError) as invalid:
                await store.cancel_occurrence(occurrence_id=running.id, reason=["not", "text"])
            assert invalid.value.code == "SCHEDULER_INVALID_ARGUMENT"
            assert await store.run_sync(dump_tables) == before
            assert [dead.id for dead in await store.list_dead_letters()] == [running.id]
            requeued = await store.requeue_dead_letter(
                occurrence_id=running.id, expected_fence=cancelled.fence, expected_error_code="CANCELLED",
                request_id="rq",
            )  # fmt: skip
            assert requeued.occurrence.status == "retry_wait"

    asyncio.run(body())


def test_transaction_blocks_commit_or_roll_back_together(aio_place: AioPlace) -> None:
    async def body() -> None:
        async with await aio_place.open_async("tx", **options()) as store:
            async with store.transaction() as tx:
                await tx.create_job(id="kept", kind="email", authority=AUTHORITY)
                with pytest.raises(SchedulerKernelError) as inside:
                    await store.get_job("kept")  # the outer store, from inside its own block
                assert inside.value.code == "SCHEDULER_TRANSACTION_ACTIVE"
            with pytest.raises(RuntimeError):
                async with store.transaction() as tx:
                    await tx.create_job(id="dropped", kind="email", authority=AUTHORITY)
                    raise RuntimeError("roll back")
            assert (await store.get_job("kept")) is not None
            assert (await store.get_job("dropped")) is None
            with pytest.raises(SchedulerKernelError) as finished:
                await tx.get_job("kept")
            assert finished.value.code == "SCHEDULER_STORE_CLOSED"

    asyncio.run(body())


def test_other_tasks_wait_for_a_block_and_calls_after_close_are_refused(aio_place: AioPlace) -> None:
    async def body() -> None:
        store = await aio_place.open_async("turns", **options())
        order: list[str] = []
        entered = asyncio.Event()

        async def block() -> None:
            async with store.transaction() as tx:
                entered.set()
                await asyncio.sleep(0.05)
                await tx.create_job(id="first", kind="email", authority=AUTHORITY)
                order.append("block")

        async def other() -> None:
            await entered.wait()
            await store.create_job(id="second", kind="email", authority=AUTHORITY)
            order.append("other")

        await asyncio.gather(block(), other(), *(store.get_job("first") for _ in range(5)))
        assert order == ["block", "other"]
        await store.close()
        await store.close()  # idempotent
        assert store.closed
        with pytest.raises(SchedulerKernelError) as caught:
            await store.get_job("first")
        assert caught.value.code == "SCHEDULER_STORE_CLOSED"
        with pytest.raises(SchedulerKernelError) as caught:  # even a helper that never calls it
            await store.run_sync(lambda _store: None)
        assert caught.value.code == "SCHEDULER_STORE_CLOSED"
        with pytest.raises(SchedulerKernelError) as caught:
            await store.run_sync(42)  # type: ignore[arg-type]
        assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"

    asyncio.run(body())


def _hold_write_lock(place: AioPlace, name: str) -> Any:
    """Another connection holding what a write needs: SQLite's write lock, PostgreSQL's ``jobs``."""
    if place.server is None:
        blocker = sqlite3.connect(place.directory / f"{name}.sqlite", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        return blocker
    connection = place.server.engine.connect()
    schema = place.server.quote(place.schemas[name])
    connection.exec_driver_sql(f"LOCK TABLE {schema}.jobs IN ACCESS EXCLUSIVE MODE")
    return connection


def test_storage_contention_is_reported_as_by_the_sync_store(aio_place: AioPlace) -> None:
    fast = {**options(), "busy_timeout_ms": 50}

    async def body() -> tuple[SchedulerKernelError, SchedulerKernelError]:
        with aio_place.open_sync("busy", **fast) as sync_store:
            async with await aio_place.open_async("busy", **fast) as async_store:
                blocker = _hold_write_lock(aio_place, "busy")
                try:
                    with pytest.raises(SchedulerKernelError) as sync_error:
                        sync_store.create_job(id="j", kind="email", authority=AUTHORITY)
                    with pytest.raises(SchedulerKernelError) as async_error:
                        await async_store.create_job(id="j", kind="email", authority=AUTHORITY)
                finally:
                    blocker.rollback()
                    blocker.close()
                assert (await async_store.create_job(id="j", kind="email", authority=AUTHORITY)).id == "j"
        return sync_error.value, async_error.value

    sync_error, async_error = asyncio.run(body())
    assert error_data(async_error) == error_data(sync_error)
    assert async_error.code == "SCHEDULER_STORAGE_UNAVAILABLE"
    assert async_error.details["commitState"] == "not_committed" and async_error.details["retryable"] is True


def test_a_task_cancelled_mid_call_leaves_no_half_written_transaction(aio_place: AioPlace) -> None:
    async def body() -> None:
        async with await aio_place.open_async("cancel", **options()) as store:
            await store.create_job(id="j", kind="email", authority=AUTHORITY)
            caller: asyncio.Task[Any] | None = None
            statements: list[str] = []

            def cancel_after_first_insert(*args: Any) -> None:
                statements.append(args[2])
                if caller is not None and args[2].lstrip().upper().startswith("INSERT"):
                    caller.cancel()  # the call's next await raises CancelledError inside the store

            await store.run_sync(
                lambda sync: event.listen(sync.connection, "after_cursor_execute", cancel_after_first_insert)
            )
            requests = [{"job_id": "j", "scheduled_for": T0, "trigger_key": f"k{n}"} for n in range(3)]
            caller = asyncio.ensure_future(store.enqueue_many(requests))
            with pytest.raises(asyncio.CancelledError):
                await caller
            caller = None
            assert any(sql.lstrip().upper().startswith("INSERT") for sql in statements)  # mid-call
            # All or nothing: rolled back, or (a cancellation the driver saw only at COMMIT)
            # committed whole; the connection is clean either way and the call can be retried.
            tables = await store.run_sync(dump_tables)
            events = [row["event_type"] for row in tables["events"]]
            written = len(tables["occurrences"])
            whole = ["job_created"] + ["occurrence_enqueued"] * 3
            assert (written, events) in ((0, ["job_created"]), (3, whole))
            retried = await store.enqueue_many(requests)
            assert [occurrence.deduplicated for occurrence in retried] == [written == 3] * 3
            assert len((await store.run_sync(dump_tables))["occurrences"]) == 3

    asyncio.run(body())


@pytest.mark.parametrize(
    "url",
    [
        "sqlite+aiosqlite:///{dir}/kernel.sqlite",
        "postgresql+asyncpg://u@127.0.0.1:1/db",
        "postgresql+psycopg_async://u@127.0.0.1:1/db",
    ],
)
def test_open_store_refuses_async_urls_and_creates_nothing(url: str, tmp_path: Path) -> None:
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(url.format(dir=tmp_path / "db"))
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert "scheduler.aio.open_async_store" in caught.value.message
    assert not (tmp_path / "db").exists()


def test_open_store_refuses_an_async_engine_and_creates_nothing(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'db' / 'kernel.sqlite'}")
    for target in (engine, engine.sync_engine):
        with pytest.raises(SchedulerKernelError) as caught:
            open_store(target)
        assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
        assert "scheduler.aio.open_async_store" in caught.value.message
    assert not (tmp_path / "db").exists()
    asyncio.run(engine.dispose())


@pytest.mark.parametrize(
    "target",
    ["sqlite+pysqlite:///{dir}/kernel.sqlite", "postgresql+psycopg2://u@h/db", "mysql+aiomysql://u@h/db"],
)
def test_open_async_store_refuses_other_drivers_and_creates_nothing(target: str, tmp_path: Path) -> None:
    async def body() -> SchedulerKernelError:
        with pytest.raises(SchedulerKernelError) as caught:
            await open_async_store(target.format(dir=tmp_path / "db"))
        return caught.value

    error = asyncio.run(body())
    assert error.code == "SCHEDULER_INVALID_ARGUMENT"
    assert not (tmp_path / "db").exists()


def test_open_async_store_refuses_a_sync_engine_and_bad_options(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'kernel.sqlite'}")

    async def body() -> list[str]:
        codes = []
        for target, options in ((engine, {}), (tmp_path / "kernel.sqlite", {"busy_timeout_ms": -1})):
            with pytest.raises(SchedulerKernelError) as caught:
                await open_async_store(target, **options)
            codes.append(caught.value.code)
        return codes

    assert asyncio.run(body()) == ["SCHEDULER_INVALID_ARGUMENT"] * 2
    assert not (tmp_path / "kernel.sqlite").exists()
    engine.dispose()


def test_on_connection_enqueues_inside_the_callers_transaction(aio_place: AioPlace) -> None:
    async def body() -> list[str]:
        store = await aio_place.open_async("outbox", **options())
        await store.close()
        if aio_place.server is None:
            engine = create_async_engine(f"sqlite+aiosqlite:///{aio_place.directory / 'outbox.sqlite'}")
            schema = None
        else:
            engine = create_async_engine(aio_place.async_url())
            schema = aio_place.schemas["outbox"]
        try:
            for job_id, commit in (("rolled-back", False), ("committed", True)):
                connection = await engine.connect()
                transaction = await connection.begin()
                tx_store = await AsyncSchedulerStore.on_connection(connection, clock=Clock(), schema=schema)
                await tx_store.create_job(id=job_id, kind="email", authority=AUTHORITY)
                await (transaction.commit() if commit else transaction.rollback())
                await connection.close()
        finally:
            await engine.dispose()
        async with await aio_place.open_async("outbox", **options()) as reopened:
            return [job_id for job_id in ("rolled-back", "committed") if await reopened.get_job(job_id)]

    assert asyncio.run(body()) == ["committed"]
    with pytest.raises(SchedulerKernelError):
        asyncio.run(AsyncSchedulerStore.on_connection("not a connection"))  # type: ignore[arg-type]


def test_an_async_engine_of_each_driver_is_opened_and_never_disposed(aio_place: AioPlace) -> None:
    """``create_async_engine("postgresql+psycopg://…")``'s dialect calls its driver ``psycopg``:
    such an engine was refused as "not postgresql+psycopg"."""

    async def body() -> None:
        if aio_place.server is None:
            engine = create_async_engine(f"sqlite+aiosqlite:///{aio_place.directory / 'engine.sqlite'}")
            schema = None
        else:
            engine = create_async_engine(aio_place.async_url())
            schema = aio_place._schema("engine")
        try:
            for job_id in ("first", "second"):  # the engine outlives the first store
                async with await open_async_store(engine, schema=schema, clock=lambda: T0) as store:
                    await store.create_job(id=job_id, kind="email", authority=AUTHORITY)
                    assert len((await store.run_sync(dump_tables))["jobs"]) == (job_id == "second") + 1
        finally:
            await engine.dispose()

    asyncio.run(body())
