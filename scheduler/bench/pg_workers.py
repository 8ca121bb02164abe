"""PostgreSQL bench: N worker processes, each on its own connection, draining one queue.

The parent starts ``N`` spawned processes (each opens its own store and connection, tagged
``application_name = bench_worker_<run>``) and enqueues :data:`WARM_UP_PER_WORKER` occurrences
per worker, which the workers drain together before they report ready: a worker's first calls
compile and prepare the store's statements (milliseconds each), a cost a long-running worker
pays once, which would otherwise weigh N times as much per measured cycle in a run of N workers.
Then the parent enqueues the run's occurrences, reads the server backends' CPU time, releases
the workers together and waits until each found the queue empty. Each worker runs
``settle_and_claim`` cycles (one commit per cycle). Then the parent reads the backends' CPU time
again (the workers stay connected until it has) and proves from the tables that every
occurrence of the run was claimed once and settled exactly once.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from scheduler.bench.context import BENCH_JOB_ID, LEASE_MS
from scheduler.bench.pg_server import backend_cpu_s, backend_pids, quoted

START_TIMEOUT_S: Final = 120.0
RUN_TIMEOUT_S: Final = 1800.0
MAX_RETRIES: Final = 1000
WARM_UP_PER_WORKER: Final = 50


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """One run of ``workers`` processes over ``occurrences`` queued rows."""

    workers: int
    occurrences: int
    seconds: float
    cycles: int
    retries: int
    client_cpu_s: float
    server_cpu_s: float | None
    settled_exactly_once: int
    claimed_once: int

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.seconds if self.seconds > 0 else 0.0


def worker_engine(url: str, application_name: str) -> Engine:
    """An engine whose single connection the server reports under ``application_name``."""
    return create_engine(url, poolclass=NullPool, connect_args={"application_name": application_name})


def _retrying(call: Any, counter: list[int]) -> Any:
    """``call()``, again while it fails with a retryable storage error (nothing committed)."""
    from scheduler.contract.errors import SchedulerKernelError

    while True:
        try:
            return call()
        except SchedulerKernelError as error:
            if not error.details.get("retryable") or counter[0] >= MAX_RETRIES:
                raise
            counter[0] += 1


def _drain(store: Any, owner: str, retries: list[int]) -> int:
    """``settle_and_claim`` cycles until the queue is empty; how many ran."""
    cycles = 0
    held = _retrying(lambda: store.claim_next(owner_id=owner, lease_ms=LEASE_MS), retries)
    while held is not None:
        current = held

        def cycle(current: Any = current) -> Any:
            return store.settle_and_claim(
                occurrence_id=current.id,
                owner_id=owner,
                fence=current.fence,
                outcome="succeeded",
                lease_ms=LEASE_MS,
            )

        held = _retrying(cycle, retries).claimed
        cycles += 1
    return cycles


def _worker(
    url: str, schema: str, tag: str, index: int, warm: Any, ready: Any, go: Any, done: Any, report: Any
) -> None:
    """One worker process: drain the warm-up rows, report ready, drain the run's, report, wait."""
    from scheduler import open_store

    engine = worker_engine(url, tag)
    store = open_store(engine, schema=schema)
    owner = f"{tag}-{index}"
    retries = [0]
    started = time.process_time()
    cycles = 0
    try:
        warm.wait()
        _drain(store, owner, [0])
        ready.put(index)
        go.wait()
        started = time.process_time()
        cycles = _drain(store, owner, retries)
        report.put((index, cycles, retries[0], time.process_time() - started, None))
    except Exception as error:  # reported to the parent, which fails the run
        ready.put(index)
        report.put((index, cycles, retries[0], time.process_time() - started, repr(error)))
    done.wait()
    store.close()
    engine.dispose()


def _enqueue(store: Any, prefix: str, count: int, base: int) -> None:
    for start in range(0, count, 500):
        requests = [
            {"job_id": BENCH_JOB_ID, "scheduled_for": base + i, "trigger_key": f"{prefix}-{i}"}
            for i in range(start, min(count, start + 500))
        ]
        store.enqueue_many(requests)


def run_workers(
    url: str, schema: str, engine: Engine, store: Any, workers: int, occurrences: int, run: str
) -> WorkerRun:
    """Enqueue ``occurrences`` rows, drain them with ``workers`` processes, prove exactly once."""
    prefix = f"w{run}"
    base = int(time.time() * 1000) - 1_000_000_000
    context = multiprocessing.get_context("spawn")
    ready, report = context.Queue(), context.Queue()
    warm, go, done = context.Event(), context.Event(), context.Event()
    tag = f"bench_worker_{run}"
    processes = [
        context.Process(
            target=_worker, args=(url, schema, tag, index, warm, ready, go, done, report), daemon=True
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        _enqueue(store, f"warm{run}", WARM_UP_PER_WORKER * workers, base - 10 * occurrences)
        warm.set()
        for _ in range(workers):
            ready.get(timeout=START_TIMEOUT_S)
        _enqueue(store, prefix, occurrences, base)
        pids = backend_pids(engine, tag)
        server_before = backend_cpu_s(pids)
        started = time.perf_counter()
        go.set()
        results = [report.get(timeout=RUN_TIMEOUT_S) for _ in range(workers)]
        seconds = time.perf_counter() - started
        server_after = backend_cpu_s(pids)
    except queue.Empty as error:
        raise RuntimeError(f"{workers} bench workers did not finish in time") from error
    finally:
        done.set()
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
    failures = [error for *_rest, error in results if error is not None]
    if failures:
        raise RuntimeError(f"a bench worker failed: {failures[0]}")
    settled, claimed = exactly_once(engine, schema, prefix, occurrences)
    server = None if server_before is None or server_after is None else server_after - server_before
    return WorkerRun(
        workers=workers,
        occurrences=occurrences,
        seconds=seconds,
        cycles=sum(result[1] for result in results),
        retries=sum(result[2] for result in results),
        client_cpu_s=sum(result[3] for result in results),
        server_cpu_s=server,
        settled_exactly_once=settled,
        claimed_once=claimed,
    )


def exactly_once(engine: Engine, schema: str, prefix: str, expected: int) -> tuple[int, int]:
    """(occurrences of the run succeeded with exactly one settlement event, those claimed exactly
    once), counted in the tables; both equal ``expected`` when every one was settled once."""
    name = quoted(engine, schema)
    sql = (
        "SELECT count(*) FILTER (WHERE o.status = 'succeeded' AND e.settled = 1), "
        "count(*) FILTER (WHERE e.claimed = 1) "
        f"FROM {name}.occurrences o JOIN ("
        "  SELECT occurrence_id,"
        "         count(*) FILTER (WHERE event_type = 'occurrence_succeeded') AS settled,"
        "         count(*) FILTER (WHERE event_type IN ('occurrence_claimed', 'occurrence_reclaimed'))"
        "           AS claimed"
        f"  FROM {name}.events GROUP BY occurrence_id"
        ") e ON e.occurrence_id = o.occurrence_id "
        "WHERE o.trigger_key LIKE %(pattern)s"
    )
    with engine.connect() as connection:
        row = connection.exec_driver_sql(sql, {"pattern": f"{prefix}-%"}).one()
        total = connection.exec_driver_sql(
            f"SELECT count(*) FROM {name}.occurrences WHERE trigger_key LIKE %(pattern)s",
            {"pattern": f"{prefix}-%"},
        ).scalar_one()
    if total != expected:
        return 0, 0
    return int(row[0]), int(row[1])
