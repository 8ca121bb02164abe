"""PostgreSQL bench: N worker processes, each on its own connection, draining one queue.

The parent starts ``N`` spawned processes (each opens its own store and connection, tagged
``application_name = bench_worker_<run>``) and warms them up: it enqueues
:data:`WARM_UP_CYCLES` occurrences per worker and has every worker drain the queue, round after
round, until each ran that many cycles and at least :data:`WARM_UP_MIN_ROUNDS` rounds ran (not
counted). A worker's first calls compile and prepare the store's statements (milliseconds each),
a cost a long-running worker pays once, which would otherwise weigh N times as much per measured
cycle in a run of N workers. Which statements a claim uses depends on what the worker's earlier
claims met (``claim_locks.ClaimContention``): a round's first claim, among workers, is the one the
previous round's contention chose, so the measured run's first claim is warmed only by a round
that began as it will. Then the parent
enqueues the run's occurrences, runs ``VACUUM (ANALYZE)`` on ``occurrences`` as autovacuum would
(without it, a server without autovacuum has each run read the dead index entries of every run
before it, at the same keys), reads the server backends' CPU time, releases the workers
together and waits until each found the queue empty. Each worker runs ``settle_and_claim``
cycles (one commit per cycle). Then the parent reads the backends' CPU time again (the workers
stay connected until it has) and proves from the tables that every occurrence of the run was
claimed once and settled exactly once. A worker's failure fails the run at once (the others are
killed) with that worker's error.
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
from scheduler.bench.timing import stop_processes

START_TIMEOUT_S: Final = 120.0
RUN_TIMEOUT_S: Final = 1800.0
MAX_RETRIES: Final = 1000
WARM_UP_CYCLES: Final = 20
"""Cycles each worker runs before it is measured (its statements compiled, prepared and planned)."""
WARM_UP_ROUNDS: Final = 10
WARM_UP_MIN_ROUNDS: Final = 3
"""Warm-up rounds run at least, so that each worker's first claim of a round has run in the state
a round leaves (quiet, or among workers) before the measured run's first claim does. With one
round (2026-12-05), each run of four workers compiled the claim it makes among workers (~25 ms of
client CPU, and its planning on the server) in its measured part: ~100 µs per measured cycle of a
1,000-occurrence run, which runs of one worker (always quiet) did not pay."""


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
    warmed_least: int = 0
    """The fewest warm-up cycles a worker ran before the measured run."""
    warm_up_rounds: int = 0
    """The warm-up rounds that ran (at least :data:`WARM_UP_MIN_ROUNDS`)."""

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
    url: str, schema: str, tag: str, index: int, inbox: Any, ready: Any, go: Any, done: Any, report: Any
) -> None:
    """One worker process: open the store and say so; drain the queue at each warm-up round the
    parent asks for (telling it how many cycles ran); then, released with the others, drain the
    run's queue and report; stay connected until the parent is done."""
    store: Any = None
    engine: Any = None
    started, cycles, retries = time.process_time(), 0, [0]
    try:
        from scheduler import open_store

        engine = worker_engine(url, tag)
        store = open_store(engine, schema=schema)
        owner = f"{tag}-{index}"
        ready.put((index, 0, None))
        while inbox.get(timeout=RUN_TIMEOUT_S):
            ready.put((index, _drain(store, owner, [0]), None))
        go.wait()
        started = time.process_time()
        cycles = _drain(store, owner, retries)
        report.put((index, cycles, retries[0], time.process_time() - started, None))
    except Exception as error:  # reported to the parent, which fails the run
        ready.put((index, 0, repr(error)))
        report.put((index, cycles, retries[0], time.process_time() - started, repr(error)))
    done.wait(RUN_TIMEOUT_S)
    if store is not None:
        store.close()
    if engine is not None:
        engine.dispose()


def _answers(ready: Any, workers: int) -> list[int]:
    """One answer from each worker (its warm-up cycles), in worker order; a worker's failure raises."""
    counts = [0] * workers
    for _ in range(workers):
        index, count, error = ready.get(timeout=START_TIMEOUT_S)
        if error is not None:
            raise RuntimeError(f"a bench worker failed: {error}")
        counts[index] = count
    return counts


def _warm_up(store: Any, ready: Any, inboxes: list[Any], run: str, base: int) -> tuple[int, int]:
    """Warm-up rounds until every worker ran :data:`WARM_UP_CYCLES` cycles (a worker that started
    late may find a round's rows taken by the others) and :data:`WARM_UP_MIN_ROUNDS` rounds ran, at
    most :data:`WARM_UP_ROUNDS`; the fewest cycles a worker ran, and the rounds."""
    done = [0] * len(inboxes)
    rounds = 0
    for round_index in range(WARM_UP_ROUNDS):
        rounds = round_index + 1
        enqueue_batches(store, f"warm{run}_{round_index}", WARM_UP_CYCLES * len(inboxes), base)
        for inbox in inboxes:
            inbox.put(True)
        done = [total + count for total, count in zip(done, _answers(ready, len(inboxes)), strict=True)]
        if min(done) >= WARM_UP_CYCLES and rounds >= WARM_UP_MIN_ROUNDS:
            break
    for inbox in inboxes:
        inbox.put(False)
    return min(done), rounds


def enqueue_batches(store: Any, prefix: str, count: int, base: int, job_id: str = BENCH_JOB_ID) -> None:
    """``count`` occurrences of ``job_id`` scheduled at ``base``, ``base + 1``, … (epoch ms), trigger
    keys ``<prefix>-<i>``, 500 per ``enqueue_many`` (the bench's queues and the tools' alike)."""
    for start in range(0, count, 500):
        requests = [
            {"job_id": job_id, "scheduled_for": base + i, "trigger_key": f"{prefix}-{i}"}
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
    go, done = context.Event(), context.Event()
    inboxes = [context.Queue() for _ in range(workers)]
    tag = f"bench_worker_{run}"
    processes = [
        context.Process(
            target=_worker,
            args=(url, schema, tag, index, inboxes[index], ready, go, done, report),
            daemon=True,
        )
        for index in range(workers)
    ]
    finished = False
    try:
        for process in processes:
            process.start()
        _answers(ready, workers)  # every store open
        warmed_least, warm_up_rounds = _warm_up(store, ready, inboxes, run, base)
        enqueue_batches(store, prefix, occurrences, base)
        vacuumed(engine, schema)
        pids = backend_pids(engine, tag)
        server_before = backend_cpu_s(pids)
        started = time.perf_counter()
        go.set()
        results = [report.get(timeout=RUN_TIMEOUT_S) for _ in range(workers)]
        seconds = time.perf_counter() - started
        server_after = backend_cpu_s(pids)
        finished = True
    except queue.Empty as error:
        raise RuntimeError(f"{workers} bench workers did not finish in time") from error
    finally:
        done.set()
        stop_processes(processes, finished=finished)
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
        warmed_least=warmed_least,
        warm_up_rounds=warm_up_rounds,
    )


def vacuumed(engine: Engine, schema: str) -> None:
    """``VACUUM (ANALYZE)`` of the bench schema's ``occurrences``, as autovacuum would."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"VACUUM (ANALYZE) {quoted(engine, schema)}.occurrences")


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
