"""APScheduler 4's own scheduler: ``Scheduler(SQLAlchemyDataStore(engine),
max_concurrent_jobs=C)``, jobs added with ``add_job`` (one transaction each: APScheduler has no
batch add), then ``start_in_background()``. A plain no-op function on the default thread-pool
executor. The engine is ``sqlite+aiosqlite`` with ``journal_mode=WAL`` and ``synchronous=FULL``
set on every connection (APScheduler sets no pragma; WAL is what a user would choose for a queue,
FULL matches the store's durability).

A job is complete when APScheduler published ``JobReleased`` for it (after ``release_job``
committed): the drain ends at the ``N``-th of those, and the scheduler's stop is not timed.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from apscheduler import JobReleased, Scheduler
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks.e2e_peers.protocol import Countdown, Finished, Prepared, serve

COUNTS: dict[str, Countdown] = {}


def noop(i: int) -> None:
    COUNTS["handled"].hit()


def prepare(config: dict[str, Any]) -> Prepared:
    COUNTS["handled"] = Countdown(config["jobs"])
    released = COUNTS["released"] = Countdown(config["jobs"])
    engine = create_async_engine(f"sqlite+aiosqlite:///{config['target']}")

    @event.listens_for(engine.sync_engine, "connect")
    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    scheduler = Scheduler(SQLAlchemyDataStore(engine), max_concurrent_jobs=config["concurrency"])
    scheduler.__enter__()
    scheduler.subscribe(lambda _event: released.hit(), {JobReleased})
    started = time.perf_counter()
    for i in range(config["jobs"]):
        scheduler.add_job(noop, args=(i,))
    enqueue_s = time.perf_counter() - started

    def run() -> Finished:
        started = time.monotonic()
        scheduler.start_in_background()
        released.done.wait()
        assert released.done_at is not None
        return Finished(started, released.done_at, released.count, COUNTS["handled"].done_at)

    def remaining() -> int:
        with sqlite3.connect(config["target"]) as connection:
            return int(connection.execute("SELECT count(*) FROM jobs").fetchone()[0])

    def close() -> None:
        scheduler.stop()
        scheduler.wait_until_stopped()
        scheduler.__exit__(None, None, None)

    return Prepared(enqueue_s, [os.getpid()], run, remaining, close)


if __name__ == "__main__":
    serve(prepare)
