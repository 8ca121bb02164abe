"""procrastinate's own worker: ``await app.run_worker_async(concurrency=C, wait=False)``, which
returns once it has caught up with the queue and its running jobs finished. An ``async def`` no-op
task (procrastinate's concurrency is for async tasks), jobs queued with ``batch_defer_async``;
the connector's defaults (a ``psycopg_pool`` pool), ``listen_notify`` on, jobs kept (succeeded).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector

from benchmarks.e2e_peers.protocol import Countdown, Finished, Prepared, serve

CHUNK = 1000


def prepare(config: dict[str, Any]) -> Prepared:
    loop = asyncio.new_event_loop()
    countdown = Countdown(config["jobs"])
    app = App(connector=PsycopgConnector(conninfo=config["target"]))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        countdown.hit()

    async def setup() -> float:
        await app.open_async()
        await app.schema_manager.apply_schema_async()
        started = time.perf_counter()
        for start in range(0, config["jobs"], CHUNK):
            await noop.batch_defer_async(
                *({"i": i} for i in range(start, min(config["jobs"], start + CHUNK)))
            )
        return time.perf_counter() - started

    async def drain() -> Finished:
        started = time.monotonic()
        await app.run_worker_async(
            concurrency=config["concurrency"], wait=False, install_signal_handlers=False
        )
        return Finished(started, time.monotonic(), countdown.count, countdown.done_at)

    def remaining() -> int:
        with psycopg.connect(config["target"]) as connection:
            row = connection.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
            ).fetchone()
        return int(row[0]) if row else -1

    def close() -> None:
        loop.run_until_complete(app.close_async())
        loop.close()

    enqueue_s = loop.run_until_complete(setup())
    return Prepared(enqueue_s, [os.getpid()], lambda: loop.run_until_complete(drain()), remaining, close)


if __name__ == "__main__":
    serve(prepare)
