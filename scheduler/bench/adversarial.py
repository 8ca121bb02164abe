"""Adversarial queues: 100k-row states a new user can reach, where a claim or a listing must not
slow down with the number of rows it is not asked for.

Each case builds its own database: ``rows`` occurrences bulk-inserted exactly like the depth
rows (:mod:`scheduler.bench.depth`), then put into the case's state with plain SQL (disable
their job, mark them running with expired leases, dead-letter them). Every call is timed
(median, p99) and its process CPU measured; the target is <= 2 ms per call (<= 5 ms for the
expired-lease fleet). A last case starts 8 fresh worker processes on the fleet and counts the
cycles they complete and the ``SQLITE_BUSY`` failures they see.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from scheduler.bench.context import BENCH_AUTHORITY, LEASE_MS, BenchConfig, Context
from scheduler.bench.depth import DepthBuilder, depth_job
from scheduler.bench.model import GROUP_ADVERSARIAL, Spec
from scheduler.bench.stores import PAST_MS, open_bench_store, wall_ms
from scheduler.bench.timing import Record, median_ms, percentile_ms, stop_processes

OWNER: Final = "bench-adversarial"
WARMUP: Final = 5
FLEET_WORKERS: Final = 8
FLEET_SECONDS: Final = 10.0
OTHER_AUTHORITY: Final = {**BENCH_AUTHORITY, "workspaceId": "ws-bench"}


@dataclass(frozen=True, slots=True)
class Case:
    key: str
    label: str
    bound_ms: float
    build: Callable[[Any, Path, int, int], Callable[[], Timed]]
    """(store, path, rows, calls) -> the call to time (the state is built first)."""


def _bulk(store: Any, path: Path, job_id: str, rows: int, prefix: str) -> None:
    DepthBuilder(path, depth_job(store, job_id), prefix=prefix).add(rows)


def _sql(path: Path, *statements: str) -> None:
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN IMMEDIATE")
        for statement in statements:
            connection.execute(statement)
        connection.execute("COMMIT")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


def _later_work(store: Any, job_id: str, count: int) -> None:
    """``count`` due occurrences of ``job_id``, scheduled after every bulk row."""
    base = wall_ms() - PAST_MS // 2
    requests = [
        {"job_id": job_id, "scheduled_for": base + i, "trigger_key": f"later-{i}"} for i in range(count)
    ]
    for start in range(0, count, 500):
        store.enqueue_many(requests[start : start + 500])


Timed = tuple[float, float]
"""(wall seconds, CPU seconds) of the timed part of one call."""


def _timed(call: Callable[[], Any]) -> tuple[Any, Timed]:
    started, cpu_started = time.perf_counter(), time.process_time()
    result = call()
    return result, (time.perf_counter() - started, time.process_time() - cpu_started)


def _claim_then_settle(store: Any, **claim: Any) -> Callable[[], Timed]:
    """Time ``claim_next`` alone; the settle that keeps the state steady is not timed."""

    def call() -> Timed:
        occurrence, timing = _timed(lambda: store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS, **claim))
        if occurrence is None:
            raise RuntimeError("the eligible work ran out")
        store.settle(occurrence_id=occurrence.id, owner_id=OWNER, fence=occurrence.fence, outcome="succeeded")
        return timing

    return call


def _read(call: Callable[[], Any]) -> Callable[[], Timed]:
    return lambda: _timed(call)[1]


def _disabled_ahead(store: Any, path: Path, rows: int, calls: int) -> Callable[[], Any]:
    store.create_job(id="off", kind="bench", authority=BENCH_AUTHORITY)
    _bulk(store, path, "off", rows, "off")
    store.update_job("off", 1, enabled=False)
    _later_work(store, "bench", calls + WARMUP)
    return _claim_then_settle(store)


def _kind_behind(store: Any, path: Path, rows: int, calls: int) -> Callable[[], Any]:
    store.create_job(id="kind-a", kind="a", authority=BENCH_AUTHORITY)
    store.create_job(id="kind-b", kind="b", authority=BENCH_AUTHORITY)
    _bulk(store, path, "kind-a", rows, "a")
    _later_work(store, "kind-b", calls + WARMUP)
    return _claim_then_settle(store, job_kind="b")


def _no_workspace(store: Any, path: Path, rows: int, calls: int) -> Callable[[], Any]:
    store.create_job(id="ws", kind="bench", authority=OTHER_AUTHORITY)
    _bulk(store, path, "ws", rows, "ws")
    return _read(lambda: store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS, workspace_id="ws-nowhere"))


def _expire_all(path: Path, job_id: str) -> None:
    past = wall_ms() - PAST_MS // 2
    _sql(
        path,
        "UPDATE occurrences SET status = 'running', attempt = 1, fence = 1, lease_owner = 'dead-fleet', "
        f"lease_expires_at = {past} + (rowid % 1000) WHERE job_id = '{job_id}'",
    )


def _fleet(store: Any, path: Path, rows: int, calls: int) -> Callable[[], Any]:
    _bulk(store, path, "bench", rows, "fleet")
    _expire_all(path, "bench")
    return _claim_then_settle(store)


def dead_letter_all(path: Path, code: str) -> None:
    """Dead-letter every occurrence, each with its ``occurrence_dead_lettered`` event (as settle writes)."""
    error = '{"code":"' + code + '","message":"bench"}'
    _sql(
        path,
        "UPDATE occurrences SET status = 'dead_letter', attempt = 1, fence = 1, "
        f"last_error_json = '{error}', settled_at = created_at + (rowid % 100000)",
        "INSERT INTO events (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json) "
        "SELECT job_id, occurrence_id, 'occurrence_dead_lettered', settled_at, 'bench', 1, "
        """'{"attempt":1,"maxAttempts":3}' FROM occurrences ORDER BY settled_at, occurrence_id""",
    )


def _dead_letters(store: Any, path: Path, rows: int, calls: int) -> Callable[[], Any]:
    _bulk(store, path, "bench", rows, "dead")
    dead_letter_all(path, "execution_failed")
    return _read(lambda: store.list_dead_letters(limit=50))


def _adjudication(store: Any, path: Path, rows: int, calls: int) -> Callable[[], Any]:
    _bulk(store, path, "bench", rows, "unknown")
    dead_letter_all(path, "HANDLER_OUTCOME_UNKNOWN")
    return _read(lambda: store.list_adjudication_cases(limit=50))


CASES: Final = (
    Case("adv_disabled_ahead", "claim_next behind N due rows of a disabled job", 2.0, _disabled_ahead),
    Case("adv_kind_behind", 'claim_next(job_kind="b") behind N due rows of kind a', 2.0, _kind_behind),
    Case("adv_no_workspace", "claim_next(workspace_id=<no match>) over N due rows", 2.0, _no_workspace),
    Case("adv_expired_fleet", "claim_next over N expired leases (a dead fleet's)", 5.0, _fleet),
    Case("adv_dead_letters", "list_dead_letters(limit=50) over N dead letters", 2.0, _dead_letters),
    Case(
        "adv_adjudication",
        "list_adjudication_cases(limit=50) over N outcome-unknown dead letters",
        2.0,
        _adjudication,
    ),
)
FLEET_CYCLES = Spec(
    "adv_fleet_workers_cycles",
    f"{FLEET_WORKERS} fresh workers on the fleet: cycles in {FLEET_SECONDS:g} s",
    "cycles",
    "count",
    GROUP_ADVERSARIAL,
)
FLEET_BUSY = Spec(
    "adv_fleet_workers_busy",
    f"{FLEET_WORKERS} fresh workers on the fleet: SQLITE_BUSY failures",
    "calls",
    "count",
    GROUP_ADVERSARIAL,
)


def adversarial_specs(config: BenchConfig) -> list[Spec]:
    rows = f"{config.adversarial_rows:,}"
    specs = [
        Spec(f"{case.key}_ms", case.label.replace("N ", f"{rows} "), "ms", "latency", GROUP_ADVERSARIAL)
        for case in CASES
    ]
    return [*specs, FLEET_CYCLES, FLEET_BUSY]


def _time_calls(call: Callable[[], Timed], calls: int) -> tuple[list[float], float]:
    """(wall seconds of each call, total CPU seconds) after a few warm-up calls."""
    for _ in range(WARMUP):
        call()
    timings = [call() for _ in range(calls)]
    return [wall for wall, _ in timings], sum(cpu for _, cpu in timings)


def measure_case(ctx: Context, case: Case) -> dict[str, Any]:
    """Build the case's state, then time ``adversarial_calls`` calls."""
    rows, calls = ctx.config.adversarial_rows, ctx.config.adversarial_calls
    path = ctx.path(f"{case.key}.sqlite")
    store = open_bench_store(path)
    try:
        task = ctx.progress.task(f"adversarial: {case.key}", calls)
        call = case.build(store, path, rows, calls)
        samples, cpu = _time_calls(call, calls)
        task.advance(calls)
        task.finish()
    finally:
        store.close()
    median = median_ms(samples)
    return {
        "value": median,
        "p99_ms": round(percentile_ms(samples, 0.99), 3),
        "cpu_us_per_call": round(cpu / calls * 1e6, 1),
        "rows": rows,
        "calls": calls,
        "bound_ms": case.bound_ms,
        "within_bound": median <= case.bound_ms,
    }


def _fleet_worker(path: str, owner: str, seconds: float, start: Any, results: Any) -> None:
    from scheduler.store.opening import open_store

    store = open_store(path)
    cycles = busy = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            try:
                occurrence = store.claim_next(owner_id=owner, lease_ms=LEASE_MS)
                if occurrence is None:
                    break
                store.settle(
                    occurrence_id=occurrence.id, owner_id=owner, fence=occurrence.fence, outcome="succeeded"
                )
                cycles += 1
            except Exception as error:
                if (getattr(error, "details", None) or {}).get("storageCode") not in (
                    "SQLITE_BUSY",
                    "SQLITE_LOCKED",
                ):
                    raise
                busy += 1
    finally:
        store.close()
        results.put((cycles, busy))


def measure_fleet_workers(ctx: Context) -> tuple[int, int]:
    """8 fresh processes on ``rows`` expired leases for a fixed time: (cycles, busy failures)."""
    path = ctx.path("adv_fleet_workers.sqlite")
    store = open_bench_store(path)
    try:
        _bulk(store, path, "bench", ctx.config.adversarial_rows, "fleetw")
    finally:
        store.close()
    _expire_all(path, "bench")
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Event(), spawn.Queue()
    seconds = FLEET_SECONDS if ctx.config.budget_s is None else min(FLEET_SECONDS, ctx.config.budget_s)
    processes = [
        spawn.Process(
            target=_fleet_worker, args=(str(path), f"fresh-{i}", seconds, start, results), daemon=True
        )
        for i in range(FLEET_WORKERS)
    ]
    finished = False
    try:
        for process in processes:
            process.start()
        time.sleep(2.0)  # let every process import and open its store
        start.set()
        totals = [results.get(timeout=seconds + 120) for _ in processes]
        finished = True
    finally:
        stop_processes(processes, finished=finished)
    return sum(cycles for cycles, _ in totals), sum(busy for _, busy in totals)


def measure_adversarial(ctx: Context, record: Record) -> None:
    for case in CASES:
        detail = measure_case(ctx, case)
        record(f"{case.key}_ms", detail.pop("value"), **detail)
    cycles, busy = measure_fleet_workers(ctx)
    record(FLEET_CYCLES.key, cycles, workers=FLEET_WORKERS, seconds=FLEET_SECONDS)
    record(FLEET_BUSY.key, busy, workers=FLEET_WORKERS)
