"""A control for the bench's 4 ÷ 1 worker figure: how a minimal queue scales on this machine.

    python -m benchmarks.pg_minimal_queue --url postgresql://root@127.0.0.1:5432/test --rounds 3

Not the store: one table ``scheduler_minimal_queue`` (in the ``public`` schema of ``--url``,
dropped at the end) with an id, a status and a fence, and a cycle that, in one statement and
one more round trip for the ``COMMIT``, marks the previous row done and claims the next queued
row ``FOR UPDATE SKIP LOCKED`` — the usual pattern of PostgreSQL job queues, with no event, no
fence check and no JSON. ``--jobs`` rows are drained by 1 and then by ``--workers`` processes
(psycopg, one connection each) in each round, which prints cycles/s, the client and server CPU
per cycle (the backends' ``/proc/<pid>/stat``; the server must be local) and the ratio.

What it answers: whether the machine lets four worker processes run 1.5 × one. On 2026-12-04
it reached 2.2 ×, with no growth of CPU per cycle; the store's cycle, whose CPU per cycle is
several times larger and grows when its processes share the two cores, did not (see
docs/design/postgresql-concurrency.md). Deadlocks between two cycles (a row a
``SKIP LOCKED`` scan locked and then skipped stays locked) are retried and counted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Any

import psycopg

from scheduler.bench.pg_server import backend_cpu_s

TABLE = "scheduler_minimal_queue"
CYCLE = f"""
WITH done AS (UPDATE {TABLE} SET status = 'done' WHERE id = %(previous)s),
     next AS (SELECT id FROM {TABLE} WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE {TABLE} SET status = 'running', fence = fence + 1 FROM next WHERE {TABLE}.id = next.id
RETURNING {TABLE}.id"""


def fill(url: str, jobs: int) -> None:
    """A fresh table of ``jobs`` queued rows (200 bytes of payload each), vacuumed."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {TABLE}")
        connection.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, status text NOT NULL,"
            " fence integer NOT NULL DEFAULT 0, payload text)"
        )
        connection.execute(f"CREATE INDEX {TABLE}_queued ON {TABLE} (id) WHERE status = 'queued'")
        connection.execute(
            f"INSERT INTO {TABLE} SELECT g, 'queued', 0, repeat('x', 200)"
            " FROM generate_series(1, %(jobs)s) g",
            {"jobs": jobs},
        )
        connection.execute(f"VACUUM ANALYZE {TABLE}")


def server_cpu_s(pid: int) -> float:
    """The backend's CPU seconds so far (``backend_cpu_s``); the server must be local."""
    seconds = backend_cpu_s([pid])
    if seconds is None:
        raise SystemExit(f"no /proc/{pid}/stat here: run this tool on the server's machine")
    return seconds


def drain(url: str, go: Any, results: Any) -> None:
    """Cycles until no row is queued; puts (cycles, client CPU s, server CPU s, deadlocks)."""
    with psycopg.connect(url) as connection:
        pid = connection.info.backend_pid
        go.wait()
        client, server = time.process_time(), server_cpu_s(pid)
        previous, cycles, deadlocks = -1, 0, 0
        while True:
            try:
                row = connection.execute(CYCLE, {"previous": previous}).fetchone()
                connection.commit()
            except psycopg.errors.DeadlockDetected:
                connection.rollback()
                deadlocks += 1
                continue
            if row is None:
                break
            previous, cycles = row[0], cycles + 1
        results.put((cycles, time.process_time() - client, server_cpu_s(pid) - server, deadlocks))


def run(url: str, workers: int, jobs: int) -> dict[str, float]:
    """Drain ``jobs`` rows with ``workers`` processes: cycles/s, CPU µs per cycle, deadlocks."""
    fill(url, jobs)
    context = multiprocessing.get_context("spawn")
    go, results = context.Event(), context.Queue()
    processes = [context.Process(target=drain, args=(url, go, results), daemon=True) for _ in range(workers)]
    for process in processes:
        process.start()
    time.sleep(1.0)  # connected and waiting
    started = time.perf_counter()
    go.set()
    reports = [results.get(timeout=600) for _ in processes]
    seconds = time.perf_counter() - started
    for process in processes:
        process.join(30)
    cycles = sum(report[0] for report in reports)
    assert cycles == jobs, (cycles, jobs)  # every row claimed exactly once
    return {
        "rate": cycles / seconds,
        "client_us": sum(report[1] for report in reports) / cycles * 1e6,
        "server_us": sum(report[2] for report in reports) / cycles * 1e6,
        "deadlocks": sum(report[3] for report in reports),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a libpq URL (postgresql://…)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=16_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    url = options.url.replace("postgresql+psycopg://", "postgresql://")
    try:
        for _ in range(options.rounds):
            one, many = run(url, 1, options.jobs), run(url, options.workers, options.jobs)
            print(
                f"1 worker: {one['rate']:,.0f} cycles/s, client / server CPU {one['client_us']:.0f} / "
                f"{one['server_us']:.0f} µs; {options.workers} workers: {many['rate']:,.0f} cycles/s, "
                f"{many['client_us']:.0f} / {many['server_us']:.0f} µs, {many['deadlocks']:.0f} deadlocks "
                f"retried; {options.workers} ÷ 1 = {many['rate'] / one['rate']:.2f}"
            )
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP TABLE IF EXISTS {TABLE}")


if __name__ == "__main__":
    main()
