"""LISTEN/NOTIFY wake-ups on PostgreSQL (API §9): which transactions notify, and how fast an idle
worker with a long poll interval picks up new work.

* A store-owned write that makes work claimable sends exactly one notification per transaction
  (a ``transaction()`` block of several enqueues: one); a rolled-back block and writes that make
  nothing claimable send none.
* An enqueue inside the application's own transaction (``on_connection``) never notifies;
  ``notify_workers()`` after its COMMIT does, and is refused inside the transaction.
* An idle worker polling every 30 s runs a newly enqueued occurrence well within a second.

The channel is observed by a ``LISTEN`` on a connection of the test's own.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from backends import PostgresServer
from sqlalchemy import Engine

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.aio import open_async_store
from scheduler.backends.postgresql.wakeups import wake_channel
from scheduler.worker import ListenWaker, PollingWaker, Worker
from tests.worker_support import add_job, enqueue, new_store, running, wait_for

LONG_POLL_MS = 30_000


class Listener:
    """``LISTEN`` on a channel on a psycopg connection of its own."""

    def __init__(self, server: PostgresServer, channel: str) -> None:
        url = server.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.connection = psycopg.connect(url, autocommit=True)
        self.connection.execute(f'LISTEN "{channel}"')

    def received(self, timeout_s: float = 0.3) -> int:
        """How many notifications arrived (waiting ``timeout_s`` after the last one)."""
        return sum(1 for _ in self.connection.notifies(timeout=timeout_s))

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def store(postgres_server: PostgresServer, pg_schema: str) -> Iterator[SchedulerStore]:
    opened = open_store(postgres_server.engine, schema=pg_schema)
    yield opened
    opened.close()


@pytest.fixture
def listener(postgres_server: PostgresServer, store: SchedulerStore) -> Iterator[Listener]:
    assert store.wake_channel is not None
    observed = Listener(postgres_server, store.wake_channel)
    yield observed
    observed.close()


def test_store_owned_writes_notify_once_per_transaction(store: SchedulerStore, listener: Listener) -> None:
    add_job(store, "job")
    assert listener.received() == 0  # a job makes nothing claimable
    first = enqueue(store, "job", "one")
    assert listener.received() == 1
    with store.transaction() as block:
        enqueue(block, "job", "two")
        enqueue(block, "job", "three")
    assert listener.received() == 1  # one per transaction, at its COMMIT
    with pytest.raises(RuntimeError), store.transaction() as block:
        enqueue(block, "job", "rolled-back")
        raise RuntimeError("abort the block")
    assert listener.received() == 0
    claimed = store.claim_occurrence(occurrence_id=first, owner_id="w", lease_ms=60_000)
    assert listener.received() == 0  # a claim makes nothing claimable
    store.settle(occurrence_id=first, owner_id="w", fence=claimed.fence, outcome="failed", retry_at=0)
    assert listener.received() == 1  # a retry is claimable again
    with store.transaction() as block:
        assert block.notify_workers() is True  # a block's explicit wake-up is sent at its COMMIT
        assert listener.received(0.2) == 0
    assert listener.received() == 1


def test_an_outbox_enqueue_never_notifies(
    store: SchedulerStore, listener: Listener, postgres_server: PostgresServer, pg_schema: str
) -> None:
    add_job(store, "job")
    engine: Engine = postgres_server.engine
    with engine.connect() as connection:
        with connection.begin():
            outbox = SchedulerStore.on_connection(connection, schema=pg_schema)
            outbox.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key="outbox")
            with pytest.raises(SchedulerKernelError) as refused:
                outbox.notify_workers()  # inside the application's transaction: refused
            assert refused.value.code == "SCHEDULER_TRANSACTION_ACTIVE"
        assert listener.received() == 0
        assert outbox.notify_workers() is True  # after the COMMIT, in a transaction of its own
        assert not connection.in_transaction()
    assert listener.received() == 1


def test_the_wake_channel_is_named_from_the_schema() -> None:
    assert wake_channel("scheduler") == "scheduler_work.scheduler"
    long = wake_channel("s" * 63)
    assert len(long.encode()) <= 63 and long != wake_channel("s" * 62 + "t")


def test_sqlite_workers_poll(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    assert store.wake_channel is None and store.notify_workers() is False
    assert isinstance(Worker(store, {"job": lambda o, c: None}).waker, PollingWaker)
    store.close()


def test_an_idle_worker_wakes_on_notify_long_before_its_next_poll(
    store: SchedulerStore, postgres_server: PostgresServer, pg_schema: str
) -> None:
    add_job(store, "job")
    started: dict[str, float] = {}

    def handler(occurrence: Any, ctx: Any) -> None:
        started[occurrence.trigger_key] = time.monotonic()

    worker = Worker(
        store, {"job": handler}, poll_min_ms=LONG_POLL_MS, poll_max_ms=LONG_POLL_MS, periodic=False
    )
    assert isinstance(worker.waker, ListenWaker)
    producer = open_store(postgres_server.engine, schema=pg_schema)
    latencies = []
    with running(worker):
        assert worker.waker.wait_listening(10)
        time.sleep(0.3)  # the lane's first polls found nothing: it now sleeps for 30 s
        for index in range(5):
            key = f"wake-{index}"
            enqueued_at = time.monotonic()
            enqueue(producer, "job", key)
            wait_for(lambda key=key: key in started, timeout=10, message="the woken worker")  # type: ignore[misc]
            latencies.append((started[key] - enqueued_at) * 1000)
            time.sleep(0.2)  # idle again
    producer.close()
    print(f"wake latency ms: median {statistics.median(latencies):.1f}, max {max(latencies):.1f}")
    assert max(latencies) < 3_000  # vs. a 30 s poll: woken, not polled (noisy machine: generous)
    assert worker.waker.notifications >= 5


def test_a_listen_waker_wakes_waiters_and_closes(store: SchedulerStore) -> None:
    waker = ListenWaker(store)
    waker.start()
    try:
        assert waker.wait_listening(10)
        woken = threading.Event()

        def wait() -> None:
            if waker.wait(20):
                woken.set()

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.1)
        assert store.notify_workers() is True
        thread.join(10)
        assert woken.is_set()
    finally:
        waker.close()
    with pytest.raises(SchedulerKernelError):
        ListenWaker(_SqliteLike())  # type: ignore[arg-type]


class _SqliteLike:
    wake_channel = None


@pytest.mark.parametrize("driver", ["postgresql+asyncpg", "postgresql+psycopg_async"])
def test_the_async_store_notifies_too(
    store: SchedulerStore, listener: Listener, postgres_server: PostgresServer, pg_schema: str, driver: str
) -> None:
    add_job(store, "job")
    url = postgres_server.url.set(drivername=driver).render_as_string(hide_password=False)

    async def enqueue_and_notify() -> str | None:
        async with await open_async_store(url, schema=pg_schema) as async_store:
            await async_store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key=driver)
            assert await async_store.notify_workers() is True
            return async_store.wake_channel

    assert asyncio.run(enqueue_and_notify()) == store.wake_channel
    assert listener.received() == 2
