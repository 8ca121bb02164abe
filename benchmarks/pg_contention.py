"""Statements per ``settle_and_claim`` cycle when N worker processes drain one PostgreSQL queue.

    python -m benchmarks.pg_contention --url postgresql+psycopg://root@127.0.0.1:5432/test --workers 4

Enqueues ``--occurrences`` due rows in a schema of its own (dropped at the end), starts
``--workers`` spawned processes (one store and connection each) that drain the queue with
``settle_and_claim``, and prints cycles/s, client and server CPU per cycle (the server must be
local) and, per cycle, the fast path's statements: all of them, the claim lock statements, the
``SAVEPOINT`` / ``ROLLBACK TO SAVEPOINT`` statements, the calls run again (``restart``: a
store-owned claim that met a row changed under its lock, ``CallMode.may_run_again``) and the attempts of
write calls (``attempts``: 1.00 when no call ran again, whatever the reason, a one-statement
cycle's miss included). (It wraps the fast path's calls, adding ~2 µs to each.)

``--independent`` gives each worker a queue of its own (a schema each, the occurrences split
evenly): the same cycles with no contention at all, so the difference from a shared queue is
what sharing one costs. ``--among-workers`` keeps every worker on the claim path it takes once
other workers held its first candidates (``ClaimContention``), whatever its own claims meet.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections import Counter
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from scheduler import open_store
from scheduler.bench.pg_server import backend_cpu_s, backend_pids, quoted
from scheduler.bench.pg_workers import enqueue_batches, worker_engine

AUTHORITY = {"principal": {"type": "service", "id": "pg-contention"}}
LEASE_MS = 60_000


def counted_fast_path(counts: Counter[str]) -> None:
    """Count every fast-path statement of this process by kind, and the calls run again."""
    from scheduler.backends.postgresql import claim_locks
    from scheduler.store.plumbing import fastpath, session

    run, driver_sql = fastpath.FastPath.run, fastpath.FastPath.run_driver_sql
    run_led = fastpath.FastPath.run_led
    attempt = session.OwnedRunner._attempt
    locks = (claim_locks.LOCK_CANDIDATES, claim_locks.LOCK_CANDIDATE_ROWS)

    def counting_run(self: Any, conn: Any, prepared: Any, parameters: Any, **options: Any) -> Any:
        counts["statements"] += 1
        if prepared in locks:
            counts["lock"] += 1
        return run(self, conn, prepared, parameters, **options)

    def counting_run_led(
        self: Any, conn: Any, lead: Any, prepared: Any, parameters: Any, **options: Any
    ) -> Any:
        # the lead statement and the one it leads go to the server in one query; None sent
        # nothing. A missed cycle raises after both ran (a raise before sending or in the lead
        # is counted as two too, rare enough not to tell apart).
        try:
            done = run_led(self, conn, lead, prepared, parameters, **options)
        except BaseException:
            counts["statements"] += 2
            raise
        if done is not None:
            counts["statements"] += 2
        return done

    def counting_attempt(self: Any, operation: Any, write: bool, sample: bool, **kwargs: Any) -> Any:
        if write:
            counts["attempts"] += 1  # every attempt of a write call: 1.00 per cycle when none ran again
            if not kwargs["call"].may_run_again:
                counts["restart"] += 1  # a second attempt (a PostgreSQL write's first may run again)
        return attempt(self, operation, write, sample, **kwargs)

    def counting_driver_sql(self: Any, conn: Any, sql: str) -> None:
        counts["statements"] += 1
        counts["rollback" if sql.startswith("ROLLBACK") else "savepoint"] += 1
        driver_sql(self, conn, sql)

    fastpath.FastPath.run = counting_run  # type: ignore[method-assign]
    fastpath.FastPath.run_driver_sql = counting_driver_sql  # type: ignore[method-assign]
    fastpath.FastPath.run_led = counting_run_led  # type: ignore[method-assign]
    session.OwnedRunner._attempt = counting_attempt  # type: ignore[method-assign,assignment]


def worker(url: str, schema: str, index: int, among_workers: bool, go: Any, results: Any, done: Any) -> None:
    counts: Counter[str] = Counter()
    counted_fast_path(counts)
    engine = worker_engine(url, f"pg_contention_{index}")
    store = open_store(engine, schema=schema)
    if among_workers:
        store._claims.stay_among_workers()
    owner = f"w{index}"
    go.wait()
    started, cycles = time.process_time(), 0
    held = store.claim_next(owner_id=owner, lease_ms=LEASE_MS)
    while held is not None:
        cycle = store.settle_and_claim(
            occurrence_id=held.id, owner_id=owner, fence=held.fence, outcome="succeeded", lease_ms=LEASE_MS
        )
        held, cycles = cycle.claimed, cycles + 1
    results.put((cycles, time.process_time() - started, dict(counts)))
    done.wait()  # connected until the parent has read the server's CPU time
    store.close()
    engine.dispose()


def fill(admin: Any, schema: str, occurrences: int) -> None:
    """A store in ``schema`` with ``occurrences`` due rows of one job."""
    with open_store(admin, schema=schema) as store:
        store.create_job(id="job", kind="bench", authority=AUTHORITY)
        enqueue_batches(store, "t", occurrences, int(time.time() * 1000) - 1_000_000_000, job_id="job")


def drop_schemas(admin: Any, schemas: list[str]) -> None:
    with admin.begin() as connection:
        for schema in schemas:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quoted(admin, schema)} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--occurrences", type=int, default=4000)
    parser.add_argument("--independent", action="store_true", help="a queue (schema) per worker")
    parser.add_argument("--among-workers", action="store_true", help="always the claim path among workers")
    options = parser.parse_args()
    count = options.workers if options.independent else 1
    schemas = [f"scheduler_contention_{index}" for index in range(count)]
    admin = create_engine(options.url, poolclass=NullPool)
    drop_schemas(admin, schemas)
    try:
        for schema in schemas:
            fill(admin, schema, options.occurrences // count)
        context = multiprocessing.get_context("spawn")
        go, done, results = context.Event(), context.Event(), context.Queue()
        processes = [
            context.Process(
                target=worker,
                args=(options.url, schemas[index % count], index, options.among_workers, go, results, done),
            )
            for index in range(options.workers)
        ]
        for process in processes:
            process.start()
        pids: list[int] = []
        while len(pids) < options.workers:
            time.sleep(0.2)
            pids = [
                pid
                for index in range(options.workers)
                for pid in backend_pids(admin, f"pg_contention_{index}")
            ]
        server_before, started = backend_cpu_s(pids), time.perf_counter()
        go.set()
        reports = [results.get() for _ in processes]
        seconds, server_after = time.perf_counter() - started, backend_cpu_s(pids)
        done.set()
        for process in processes:
            process.join(60)
        cycles = sum(report[0] for report in reports)
        counts: Counter[str] = Counter()
        for report in reports:
            counts.update(report[2])
        server = (
            "n/a"
            if server_before is None or server_after is None
            else f"{(server_after - server_before) / cycles * 1e6:.0f}"
        )
        print(
            f"{options.workers} workers: {cycles / seconds:.0f} cycles/s; per cycle: client CPU "
            f"{sum(report[1] for report in reports) / cycles * 1e6:.0f} µs, server CPU {server} µs, "
            + ", ".join(
                f"{name} {counts[name] / cycles:.2f}"
                for name in ("statements", "lock", "savepoint", "rollback", "restart", "attempts")
            )
        )
    finally:
        drop_schemas(admin, schemas)
        admin.dispose()


if __name__ == "__main__":
    main()
