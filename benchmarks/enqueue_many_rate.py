"""``enqueue_many`` throughput: one store, ``--rows`` due occurrences of one job in batches of
``--batch``, one call per batch (the first batch warms up and is not timed).

Prints rows/s and the client's CPU per row. SQLite runs on a file in a fresh private temporary
directory (WAL, ``synchronous=FULL``); ``--db`` runs on a PostgreSQL database, in a schema of its
own that is dropped at the end. Usage::

    python -m benchmarks.enqueue_many_rate [--rows 20000] [--batch 100] [--db postgresql+psycopg://…]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from scheduler import open_store
from scheduler.bench.stores import BENCH_AUTHORITY, enqueue_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--db", help="a PostgreSQL URL (default: a SQLite file)")
    args = parser.parse_args()
    schema = f"enqueue_many_rate_{os.getpid()}"
    with tempfile.TemporaryDirectory() as directory:
        target = args.db or os.path.join(directory, "rate.sqlite")
        store = open_store(target, **({"schema": schema} if args.db else {}))
        try:
            store.create_job(id="bench", kind="bench", authority=BENCH_AUTHORITY)
            base = int(time.time() * 1000) - 60_000
            size = args.batch
            batches = [
                [enqueue_request("rate", index, base) for index in range(start, min(args.rows, start + size))]
                for start in range(0, args.rows, size)
            ]
            store.enqueue_many(batches[0])
            timed = sum(len(batch) for batch in batches[1:])
            started, cpu = time.perf_counter(), time.process_time()
            for batch in batches[1:]:
                store.enqueue_many(batch)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        finally:
            store.close()
            if args.db:
                from sqlalchemy import create_engine

                engine = create_engine(args.db)
                with engine.begin() as connection:
                    connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                engine.dispose()
    backend = "postgresql" if args.db else "sqlite"
    rate, cpu_us = timed / elapsed, cpu / timed * 1e6
    print(f"{backend}: {rate:,.0f} rows/s, client CPU {cpu_us:.1f} µs/row (batches of {args.batch})")


if __name__ == "__main__":
    main()
