"""pgqueuer's own worker: ``await QueueManager(queries).run(batch_size=B, max_concurrent_tasks=M,
mode=QueueExecutionMode.drain)`` on one asyncpg connection (pgqueuer's usual driver), which
returns once the queue is empty and its tasks finished. An ``async def`` no-op entrypoint, jobs
queued with the list form of ``Queries.enqueue`` (one statement per chunk).

Concurrency C runs ``batch_size=C`` (C jobs picked per dequeue, as the store's worker claims for
C free lanes in one transaction) and ``max_concurrent_tasks=2 * C``, the smallest cap pgqueuer
accepts for that batch size (it caps the jobs this worker holds picked). Completions go through
pgqueuer's own status buffer (flushed at ``batch_size`` entries or on its timer). pgqueuer's
defaults (``batch_size=10``, no cap) drain faster still.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

from benchmarks.e2e_peers.protocol import Countdown, Finished, Prepared, serve

CHUNK = 1000


def settings(concurrency: int) -> tuple[int, int]:
    """``(batch_size, max_concurrent_tasks)`` for a concurrency."""
    return concurrency, 2 * concurrency


def prepare(config: dict[str, Any]) -> Prepared:
    loop = asyncio.new_event_loop()
    countdown = Countdown(config["jobs"])
    jobs: int = config["jobs"]
    state: dict[str, Any] = {}

    async def setup() -> float:
        connection = await asyncpg.connect(config["target"])
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        manager = QueueManager(queries)

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            countdown.hit()

        state.update(connection=connection, manager=manager)
        started = time.perf_counter()
        for start in range(0, jobs, CHUNK):
            count = min(jobs, start + CHUNK) - start
            await queries.enqueue(
                ["noop"] * count, [b"%d" % i for i in range(start, start + count)], [0] * count
            )
        return time.perf_counter() - started

    async def drain() -> Finished:
        batch_size, cap = settings(config["concurrency"])
        started = time.monotonic()
        await state["manager"].run(
            batch_size=batch_size, max_concurrent_tasks=cap, mode=QueueExecutionMode.drain
        )
        return Finished(started, time.monotonic(), countdown.count, countdown.done_at)

    async def count_left() -> int:
        connection = await asyncpg.connect(config["target"])
        try:
            return int(await connection.fetchval("SELECT count(*) FROM pgqueuer"))
        finally:
            await connection.close()

    def close() -> None:
        if not state["connection"].is_closed():
            loop.run_until_complete(state["connection"].close())
        loop.close()

    enqueue_s = loop.run_until_complete(setup())
    return Prepared(
        enqueue_s,
        [os.getpid()],
        lambda: loop.run_until_complete(drain()),
        lambda: loop.run_until_complete(count_left()),
        close,
    )


if __name__ == "__main__":
    serve(prepare)
