"""The store's own workers, as its users start them: ``Worker(store, {"noop": handler},
concurrency=C).run()`` over jobs queued with ``enqueue_many``, or the ``Tasks`` front door
(``@tasks.task`` + ``defer_many``, ``tasks.worker(concurrency=C).run()``). A sync no-op handler
(the default kind of handler: it runs on a lane thread); defaults everywhere else (lease,
``settle_batch_ms``, periodic ticker, ``LISTEN`` waker on PostgreSQL).

Neither worker has a drain mode (``run_until_idle`` is one lane), so the handler counts and the
``N``-th call asks ``worker.stop()``: ``run()`` then settles what finished (the batched cycles'
last group) and returns. With ``processes`` above 1 the queue is filled here and drained by that
many spawned processes sharing one counter; the drain ends when the last of them returned.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.e2e_peers.protocol import Countdown, Finished, Prepared, serve, stop_when
from scheduler import Tasks, open_store
from scheduler.worker import Worker

AUTHORITY = {"principal": {"type": "service", "id": "bench"}}
CHUNK = 500
TASK = "bench.noop"


def _target(config: dict[str, Any]) -> str:
    target: str = config["target"]
    return target.replace("postgresql://", "postgresql+psycopg://", 1)


def _tasks(target: str, hit: Callable[[], None]) -> Tasks:
    tasks = Tasks(target, principal=AUTHORITY["principal"])

    @tasks.task(name=TASK, queue="bench")
    def noop(i: int) -> None:
        hit()

    return tasks


def _enqueue(config: dict[str, Any]) -> float:
    """Fill the queue through the API's batch call; the seconds it took (store opening excluded)."""
    jobs: int = config["jobs"]
    if config["api"] == "tasks":
        with _tasks(_target(config), lambda: None) as tasks:
            tasks.register()
            started = time.perf_counter()
            for start in range(0, jobs, CHUNK):
                tasks[TASK].defer_many([{"i": i} for i in range(start, min(jobs, start + CHUNK))])
            return time.perf_counter() - started
    with open_store(_target(config)) as store:
        store.create_job(id="noop", kind="noop", authority=AUTHORITY)
        started = time.perf_counter()
        now = store.clock()
        for start in range(0, jobs, CHUNK):
            store.enqueue_many(
                [
                    {"job_id": "noop", "scheduled_for": now, "trigger_key": f"k{i}"}
                    for i in range(start, min(jobs, start + CHUNK))
                ]
            )
        return time.perf_counter() - started


def _worker(config: dict[str, Any], hit: Callable[[], None]) -> tuple[Worker, Callable[[], None]]:
    """The worker (its store open, not started) and what closes it afterwards."""
    concurrency: int = config["concurrency"]
    if config["api"] == "tasks":
        tasks = _tasks(_target(config), hit)
        return tasks.worker(concurrency=concurrency), tasks.close
    store = open_store(_target(config))

    def noop(occurrence: Any, ctx: Any) -> None:
        hit()

    return Worker(store, {"noop": noop}, concurrency=concurrency), store.close


def _remaining(config: dict[str, Any]) -> int:
    with open_store(_target(config)) as store:
        return int(config["jobs"]) - store.stats().statuses.get("succeeded", 0)


def _drain(worker: Worker, done: Any) -> float:
    """``worker.run()`` until ``done`` is set; the instant it returned."""
    stop_when(done, worker.stop)
    worker.run(install_signal_handlers=False)
    return time.monotonic()


def _prepare_one(config: dict[str, Any]) -> Prepared:
    enqueue_s = _enqueue(config)
    countdown = Countdown(config["jobs"])
    worker, close = _worker(config, countdown.hit)

    def run() -> Finished:
        started = time.monotonic()
        ended = _drain(worker, countdown.done)
        return Finished(started, ended, countdown.count, countdown.done_at)

    return Prepared(enqueue_s, [os.getpid()], run, lambda: _remaining(config), close)


def _child(config: dict[str, Any], shared: dict[str, Any]) -> None:
    """One of several worker processes: ready, wait for go, drain, report, wait to be let go."""
    count, done = shared["count"], shared["done"]

    def hit() -> None:
        with count.get_lock():
            count.value += 1
            if count.value == config["jobs"]:
                shared["done_at"].value = time.monotonic()
                done.set()

    worker, close = _worker(config, hit)
    shared["reports"].put(("ready", os.getpid()))
    shared["go"].wait()
    shared["reports"].put(("ended", _drain(worker, done)))
    shared["exit"].wait()
    close()


def _prepare_processes(config: dict[str, Any]) -> Prepared:
    enqueue_s = _enqueue(config)
    context = multiprocessing.get_context("spawn")
    shared: dict[str, Any] = {
        "count": context.Value("q", 0),
        "done_at": context.Value("d", 0.0),
        "done": context.Event(),
        "go": context.Event(),
        "exit": context.Event(),
        "reports": context.Queue(),
    }
    processes = [context.Process(target=_child, args=(config, shared)) for _ in range(config["processes"])]
    for process in processes:
        process.start()
    pids = [shared["reports"].get(timeout=120)[1] for _ in processes]

    def run() -> Finished:
        started = time.monotonic()
        shared["go"].set()
        ended = max(shared["reports"].get()[1] for _ in processes)
        return Finished(started, ended, shared["count"].value, shared["done_at"].value)

    def close() -> None:
        shared["exit"].set()
        for process in processes:
            process.join(timeout=60)

    return Prepared(enqueue_s, pids, run, lambda: _remaining(config), close)


def prepare(config: dict[str, Any]) -> Prepared:
    if config.get("processes", 1) > 1:
        return _prepare_processes(config)
    return _prepare_one(config)


if __name__ == "__main__":
    threading.current_thread().name = "e2e-adapter"
    serve(prepare)
