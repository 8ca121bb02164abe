"""``enqueue_many`` throughput: one store, ``--rows`` due occurrences of one job in batches of
``--batch``, one call per batch (the first batch warms up and is not timed); with ``--tasks``,
the Tasks front door's ``defer_many`` of one task's runs instead.

Prints rows/s and the client's CPU per row. SQLite runs on a file in a fresh private temporary
directory (WAL, ``synchronous=FULL``); ``--db`` runs on a PostgreSQL database, in a schema of its
own that is dropped at the end. Usage::

    python -m benchmarks.enqueue_many_rate [--rows 20000] [--batch 100] [--tasks] [--db postgresql+psycopg://…]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from scheduler import Tasks, open_store
from scheduler.bench.stores import BENCH_AUTHORITY, enqueue_request


def _timed(call: Callable[[list[Any]], object], batches: list[list[Any]]) -> tuple[int, float, float]:
    """(rows, seconds, CPU seconds) of ``call`` on every batch but the first (a warm-up)."""
    call(batches[0])
    started, cpu = time.perf_counter(), time.process_time()
    for batch in batches[1:]:
        call(batch)
    return sum(map(len, batches[1:])), time.perf_counter() - started, time.process_time() - cpu


def _batches(rows: int, size: int, item: Callable[[int], Any]) -> list[list[Any]]:
    return [
        [item(index) for index in range(start, min(rows, start + size))] for start in range(0, rows, size)
    ]


def _enqueue_many(target: str, schema: dict[str, str], rows: int, size: int) -> tuple[int, float, float]:
    with open_store(target, **schema) as store:
        store.create_job(id="bench", kind="bench", authority=BENCH_AUTHORITY)
        base = int(time.time() * 1000) - 60_000
        return _timed(
            store.enqueue_many, _batches(rows, size, lambda index: enqueue_request("rate", index, base))
        )


def _defer_many(target: str, schema: dict[str, str], rows: int, size: int) -> tuple[int, float, float]:
    with Tasks(target, principal=BENCH_AUTHORITY["principal"], **schema) as tasks:

        @tasks.task(name="bench.rate")
        def rate(index: int) -> None:
            del index

        tasks.register()
        return _timed(rate.defer_many, _batches(rows, size, lambda index: {"index": index}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--tasks", action="store_true", help="Tasks.defer_many instead of enqueue_many")
    parser.add_argument("--db", help="a PostgreSQL URL (default: a SQLite file)")
    args = parser.parse_args()
    schema_name = f"enqueue_many_rate_{os.getpid()}"
    schema = {"schema": schema_name} if args.db else {}
    measure = _defer_many if args.tasks else _enqueue_many
    with tempfile.TemporaryDirectory() as directory:
        target = args.db or os.path.join(directory, "rate.sqlite")
        try:
            timed, elapsed, cpu = measure(target, schema, args.rows, args.batch)
        finally:
            if args.db:
                from sqlalchemy import create_engine

                engine = create_engine(args.db)
                with engine.begin() as connection:
                    connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema_name}" CASCADE')
                engine.dispose()
    backend = "postgresql" if args.db else "sqlite"
    call = "defer_many" if args.tasks else "enqueue_many"
    rate, cpu_us = timed / elapsed, cpu / timed * 1e6
    print(f"{backend} {call}: {rate:,.0f} rows/s, client CPU {cpu_us:.1f} µs/row (batches of {args.batch})")


if __name__ == "__main__":
    main()
