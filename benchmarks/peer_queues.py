"""One worker of procrastinate or pgqueuer, cycles per second against the commit floor measured
in the same run: what the store's single-worker ratio to the floor compares with.

These queues are not the project's dependencies: install them in a virtual environment of their
own and run this file with its interpreter (it does not import ``scheduler``)::

    python3 -m venv /tmp/peer
    /tmp/peer/bin/pip install "procrastinate==3.10.*" "pgqueuer==1.6.*" "psycopg[binary]"
    /tmp/peer/bin/python benchmarks/peer_queues.py --admin-url postgresql://root@127.0.0.1:5432/postgres \\
        --queue procrastinate --cycles 3000

Each run creates a database of its own (``peer_<queue>``, dropped first if it is there), enqueues
``--cycles`` + 200 jobs, runs 200 cycles to warm up, measures the commit floor (a one-row
``INSERT`` + ``COMMIT`` through psycopg, 1,000 times, in that database), runs ``--cycles`` cycles,
measures the floor again and prints cycles/s, the client's CPU per cycle and the ratio to the
mean floor. A cycle is what each queue's worker does per job, through its public API, with two
commits and no fencing:

* procrastinate: ``JobManager.fetch_job`` (a registered worker) and ``JobManager.finish_job``
  (succeeded, the job kept);
* pgqueuer: ``Queries.dequeue`` (batch of one, one entrypoint, no concurrency limit) and
  ``Queries.log_jobs`` (successful).

Compare with the store's ``settle_and_claim`` (one commit, fenced, two events):
``python -m benchmarks.pg_cycle_cpu --url postgresql+psycopg://… --warm-up 200 --cycles 3000
--analyze --floor 1000``, alternating.

``--queue procrastinate-defer`` measures an enqueue instead: procrastinate's synchronous
``defer`` of one job, one transaction each (``SyncPsycopgConnector``), after 200 not measured.
Compare with the store's ``enqueue_occurrence`` (one commit, deduplicated by identity, one event):
the ``enqueue_occurrence`` figure of ``scheduler bench --backend postgresql``, or ``pg-enqueue`` of
``python -m benchmarks.ab_checkouts``, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

WARM_UP = 200
FLOOR_COMMITS = 1000
Cycle = Callable[[], Awaitable[None]]


def floor(url: str) -> float:
    """One-row INSERT + COMMIT per second, through psycopg."""
    with psycopg.connect(url) as connection:
        connection.execute("DROP TABLE IF EXISTS peer_floor")
        connection.execute("CREATE TABLE peer_floor (id bigserial PRIMARY KEY, v bigint)")
        connection.commit()
        started = time.perf_counter()
        for value in range(FLOOR_COMMITS):
            connection.execute("INSERT INTO peer_floor (v) VALUES (%s)", (value,))
            connection.commit()
        return FLOOR_COMMITS / (time.perf_counter() - started)


async def measure(url: str, name: str, cycle: Cycle, cycles: int) -> None:
    for _ in range(WARM_UP):
        await cycle()
    before = floor(url)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(cycles):
        await cycle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    mean_floor = (before + floor(url)) / 2
    rate = cycles / wall
    print(
        f"{name}: {rate:.0f} cycles/s, client CPU {cpu / cycles * 1e6:.0f} µs per cycle; "
        f"floor {mean_floor:.0f} commits/s; {rate / mean_floor:.3f} x the floor",
        flush=True,
    )


async def procrastinate_run(url: str, cycles: int) -> None:
    import procrastinate
    from procrastinate.jobs import Status

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=1))

    @app.task(name="noop")
    def noop() -> None:
        pass

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, cycles + WARM_UP, 1000):
            await noop.batch_defer_async(*([{}] * min(1000, cycles + WARM_UP - start)))
        worker = await app.job_manager.register_worker()

        async def cycle() -> None:
            job = await app.job_manager.fetch_job(queues=None, worker_id=worker)
            assert job is not None
            await app.job_manager.finish_job(job, status=Status.SUCCEEDED, delete_job=False)

        await measure(url, "procrastinate", cycle, cycles)
        await app.job_manager.unregister_worker(worker)


async def procrastinate_defer_run(url: str, cycles: int) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))

    @app.task(name="noop")
    def noop() -> None:
        pass

    with app.open():
        app.schema_manager.apply_schema()

        async def cycle() -> None:
            noop.defer()

        await measure(url, "procrastinate defer", cycle, cycles)


async def pgqueuer_run(url: str, cycles: int) -> None:
    from pgqueuer.queries import EntrypointExecutionParameter, Queries

    connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        queries = Queries.from_psycopg_connection(connection)
        await queries.install()
        for start in range(0, cycles + WARM_UP, 1000):
            count = min(1000, cycles + WARM_UP - start)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        manager: Any = uuid.uuid4()
        entrypoints: Any = {"noop": EntrypointExecutionParameter(concurrency_limit=0)}

        async def cycle() -> None:
            jobs = await queries.dequeue(
                batch_size=1,
                entrypoints=entrypoints,
                queue_manager_id=manager,
                global_concurrency_limit=None,
                heartbeat_timeout=timedelta(seconds=30),
            )
            assert len(jobs) == 1
            await queries.log_jobs([(jobs[0], "successful", None)])

        await measure(url, "pgqueuer", cycle, cycles)
    finally:
        await connection.close()


RUNS = {
    "procrastinate": procrastinate_run,
    "procrastinate-defer": procrastinate_defer_run,
    "pgqueuer": pgqueuer_run,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", required=True, help="a database to create the queue's database from")
    parser.add_argument("--queue", choices=sorted(RUNS), required=True)
    parser.add_argument("--cycles", type=int, default=3000)
    args = parser.parse_args()
    database = f"peer_{args.queue.replace('-', '_')}"
    with psycopg.connect(args.admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database}")
        admin.execute(f"CREATE DATABASE {database}")
    url = make_conninfo(**{**conninfo_to_dict(args.admin_url), "dbname": database})
    asyncio.run(RUNS[args.queue](url, args.cycles))


if __name__ == "__main__":
    main()
