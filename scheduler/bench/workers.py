"""Several worker processes claiming and settling on one database file.

The parent fills the queue, starts ``workers`` spawned processes, releases them together and
counts cycles until the queue is empty. Then it proves from the database itself that every
occurrence was claimed once and settled exactly once.
"""

from __future__ import annotations

import multiprocessing
import queue
import sqlite3
import time
from pathlib import Path
from typing import Any, Final

from scheduler.bench.context import LEASE_MS, BenchConfig, Context
from scheduler.bench.model import GROUP_MEMORY, GROUP_WORKERS, Spec
from scheduler.bench.stores import fill_queue, open_bench_store, require
from scheduler.bench.timing import Budget, Record, peak_rss_mb, stop_processes

STARTUP_TIMEOUT_S: Final = 120.0
RUN_TIMEOUT_S: Final = 1800.0
PROGRESS_EVERY: Final = 50
MAX_RETRIES: Final = 1000

CYCLES = Spec(
    "workers_cycles_per_s", "claim_next + settle, N processes, total", "cycles/s", "rate", GROUP_WORKERS
)
EXACTLY_ONCE = Spec(
    "workers_settled_exactly_once",
    "occurrences proven settled exactly once",
    "occurrences",
    "count",
    GROUP_WORKERS,
)
WORKER_RSS = Spec(
    "rss_worker_peak_mb", "peak RSS of the largest worker process", "MiB", "memory", GROUP_MEMORY
)


def worker_specs(config: BenchConfig) -> list[Spec]:
    label = f"claim_next + settle, {config.workers} processes, total"
    return [Spec(CYCLES.key, label, CYCLES.unit, CYCLES.kind, CYCLES.group), EXACTLY_ONCE, WORKER_RSS]


def _retryable(error: BaseException) -> bool:
    details = getattr(error, "details", None)
    return (
        getattr(error, "code", None) == "SCHEDULER_STORAGE_UNAVAILABLE"
        and isinstance(details, dict)
        and details.get("retryable") is True
    )


class _Retrying:
    """Calls a store method again while it fails with a retryable (not committed) storage error."""

    def __init__(self) -> None:
        self.retries = 0

    def __call__(self, method: Any, **kwargs: Any) -> Any:
        while True:
            try:
                return method(**kwargs)
            except Exception as error:
                if not _retryable(error) or self.retries >= MAX_RETRIES:
                    raise
                self.retries += 1


def _work(store: Any, owner: str, messages: Any, budget_s: float | None) -> tuple[int, int]:
    call = _Retrying()
    settled = 0
    budget = Budget(budget_s, minimum=PROGRESS_EVERY)
    while not budget.spent(settled):
        occurrence = call(store.claim_next, owner_id=owner, lease_ms=LEASE_MS)
        if occurrence is None:
            break
        call(
            store.settle,
            occurrence_id=occurrence.id,
            owner_id=owner,
            fence=occurrence.fence,
            outcome="succeeded",
        )
        settled += 1
        if settled % PROGRESS_EVERY == 0:
            messages.put(("progress", PROGRESS_EVERY))
    messages.put(("progress", settled % PROGRESS_EVERY))
    return settled, call.retries


def worker_main(path: str, index: int, go: Any, messages: Any, budget_s: float | None = None) -> None:
    """One worker process: open the store, wait for the start signal, drain the queue."""
    report: dict[str, Any] = {"index": index}
    announced = False
    try:
        from scheduler.store.opening import open_store

        store = open_store(path)
        messages.put(("ready", index))
        announced = True
        go.wait()
        report["started"] = time.monotonic()
        try:
            report["settled"], report["retries"] = _work(store, f"bench-process-{index}", messages, budget_s)
        finally:
            report["finished"] = time.monotonic()
            store.close()
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"
        if not announced:
            messages.put(("ready", index))
    report["peak_rss_mb"] = peak_rss_mb()
    messages.put(("done", report))


def _collect(
    ctx: Context, messages: Any, workers: int, go: Any, total: int
) -> tuple[float, list[dict[str, Any]]]:
    ready = 0
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while ready < workers:
        kind, _ = messages.get(timeout=max(0.1, deadline - time.monotonic()))
        ready += kind == "ready"
    task = ctx.progress.task(f"{workers} worker processes: claim_next + settle", total)
    started = time.monotonic()
    go.set()
    reports: list[dict[str, Any]] = []
    deadline = started + RUN_TIMEOUT_S
    while len(reports) < workers:
        try:
            kind, payload = messages.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError("worker processes did not finish in time") from None
            continue
        if kind == "progress":
            task.advance(payload)
        elif kind == "done":
            reports.append(payload)
    task.finish()
    return started, reports


def verify_exactly_once(path: Path, total: int, settled: int) -> dict[str, int]:
    """Counts from the database proving one claim and one ``occurrence_succeeded`` per settled
    occurrence, and that every other occurrence is still untouched in the queue."""
    connection = sqlite3.connect(path, timeout=30)
    try:

        def scalar(sql: str) -> int:
            return int(connection.execute(sql).fetchone()[0])

        counts = {
            "occurrences": scalar("SELECT count(*) FROM occurrences"),
            "succeeded": scalar("SELECT count(*) FROM occurrences WHERE status = 'succeeded'"),
            "untouched": scalar("SELECT count(*) FROM occurrences WHERE status = 'queued' AND fence = 0"),
            "settled_occurrences": scalar(
                "SELECT count(DISTINCT occurrence_id) FROM events WHERE event_type = 'occurrence_succeeded'"
            ),
            "settled_not_once": scalar(
                "SELECT count(*) FROM (SELECT occurrence_id FROM events WHERE event_type = "
                "'occurrence_succeeded' GROUP BY occurrence_id HAVING count(*) <> 1)"
            ),
            "claim_events": scalar(
                "SELECT count(*) FROM events "
                "WHERE event_type IN ('occurrence_claimed', 'occurrence_reclaimed')"
            ),
        }
    finally:
        connection.close()
    expected = {
        "occurrences": total,
        "succeeded": settled,
        "untouched": total - settled,
        "settled_occurrences": settled,
        "settled_not_once": 0,
        "claim_events": settled,
    }
    if counts != expected:
        raise RuntimeError(f"exactly-once proof FAILED: found {counts}, expected {expected}")
    return counts


def measure_workers(ctx: Context, record: Record) -> None:
    config = ctx.config
    path = ctx.path("workers.sqlite")
    store = open_bench_store(path)
    try:
        require(store, "claim_next", "settle")
        fill_queue(store, "worker", config.worker_items)
    finally:
        store.close()
    spawn = multiprocessing.get_context("spawn")
    go, messages = spawn.Event(), spawn.Queue()
    processes = [
        spawn.Process(target=worker_main, args=(str(path), index, go, messages, config.budget_s), daemon=True)
        for index in range(config.workers)
    ]
    finished = False
    try:
        for process in processes:
            process.start()
        started, reports = _collect(ctx, messages, config.workers, go, config.worker_items)
        finished = True
    finally:
        go.set()
        stop_processes(processes, finished=finished)
    errors = [report["error"] for report in reports if "error" in report]
    if errors:
        raise RuntimeError(f"worker failed: {errors[0]}")
    settled = sum(int(report["settled"]) for report in reports)
    counts = verify_exactly_once(path, config.worker_items, settled)
    if config.budget_s is None and settled != config.worker_items:
        raise RuntimeError(f"workers settled {settled} of {config.worker_items} occurrences")
    elapsed = max(float(report["finished"]) for report in reports) - started
    per_worker = [int(report["settled"]) for report in sorted(reports, key=lambda item: int(item["index"]))]
    retries = sum(int(report["retries"]) for report in reports)
    record(
        CYCLES.key,
        settled / elapsed,
        workers=config.workers,
        count=settled,
        seconds=round(elapsed, 4),
        per_worker=per_worker,
        retries=retries,
    )
    record(EXACTLY_ONCE.key, float(counts["settled_occurrences"]), **counts)
    record(
        WORKER_RSS.key,
        max(float(report["peak_rss_mb"]) for report in reports),
        per_worker_mb=[round(float(report["peak_rss_mb"]), 1) for report in reports],
    )
