"""The schema floor: the same row changes as enqueue and claim + settle, in raw ``sqlite3``.

A commit of the store writes every page its rows and indexes touch (``occurrences`` with three
indexes, ``events`` with two and ``sqlite_sequence``), about ten WAL frames instead of the floor
loop's one. These loops make exactly those changes with hand-written SQL and no Python layer,
so ``store figure ÷ schema floor`` is the share the library itself costs.

    python -m benchmarks.schema_floor [--quick] [--scale 0.1]

prints each store figure of ``scheduler bench`` beside its schema floor, measured in the same run.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final

from benchmarks.lab import scratch_context, size_parser
from scheduler.bench.context import Context
from scheduler.bench.depth import INSERT_EVENT, INSERT_OCCURRENCE, DepthBuilder, depth_job
from scheduler.bench.model import GROUP_FLOOR, Spec
from scheduler.bench.runner import run_scenario
from scheduler.bench.scenarios import THROUGHPUT_SCENARIOS, Scenario
from scheduler.bench.schema_floor import claim_rows, connect, cycle, one_commit_cycle
from scheduler.bench.stores import open_bench_store, wall_ms
from scheduler.bench.timing import Record, cpu_us, rate

SCHEMA_ENQUEUE = Spec(
    "schema_floor_enqueue_per_s",
    "schema floor: enqueue's INSERTs (occurrence + event), raw sqlite3",
    "ops/s",
    "rate",
    GROUP_FLOOR,
)
SCHEMA_BATCH = Spec(
    "schema_floor_batch_items_per_s",
    "schema floor: 100 enqueues' INSERTs per transaction (executemany)",
    "items/s",
    "rate",
    GROUP_FLOOR,
)
SCHEMA_CYCLES = Spec(
    "schema_floor_cycles_per_s",
    "schema floor: claim + settle row changes, raw sqlite3",
    "cycles/s",
    "rate",
    GROUP_FLOOR,
)
SCHEMA_ONE_COMMIT = Spec(
    "schema_floor_one_commit_cycles_per_s",
    "schema floor: settle + claim row changes in ONE commit per cycle, raw sqlite3",
    "cycles/s",
    "rate",
    GROUP_FLOOR,
)


def _enqueues(ctx: Context, connection: sqlite3.Connection, builder: DepthBuilder, record: Record) -> int:
    """One enqueue's rows per transaction; returns how many were queued."""
    count = ctx.config.enqueue_single
    task = ctx.progress.task("schema floor: enqueue INSERTs", count)
    budget, done = ctx.budget(), 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while done < count and not budget.spent(done):
        occurrences, events = builder.rows(done, done + 1, wall_ms())
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(INSERT_OCCURRENCE, occurrences[0])
        connection.execute(INSERT_EVENT, events[0])
        connection.execute("COMMIT")
        done += 1
        task.advance()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    record(SCHEMA_ENQUEUE.key, rate(done, elapsed), count=done, cpu_us_per_item=cpu_us(cpu, done))
    task.finish()
    return done


def _batches(
    ctx: Context, connection: sqlite3.Connection, builder: DepthBuilder, record: Record, first: int
) -> None:
    """``enqueue_batch`` enqueues' rows per transaction (``executemany``), built in Python."""
    count, batch = ctx.config.enqueue_many_items, ctx.config.enqueue_batch
    task = ctx.progress.task(f"schema floor: {batch} enqueues per transaction", count)
    budget, done = ctx.budget(), 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while done < count and not budget.spent(done):
        size = min(batch, count - done)
        occurrences, events = builder.rows(first + done, first + done + size, wall_ms())
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(INSERT_OCCURRENCE, occurrences)
        connection.executemany(INSERT_EVENT, events)
        connection.execute("COMMIT")
        done += size
        task.advance(size)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    record(SCHEMA_BATCH.key, rate(done, elapsed), count=done, batch=batch, cpu_us_per_item=cpu_us(cpu, done))
    task.finish()


def _cycles(ctx: Context, connection: sqlite3.Connection, record: Record, queued: int) -> None:
    cycles = min(queued, ctx.config.cycles)
    task = ctx.progress.task("schema floor: claim + settle row changes", cycles)
    budget, done = ctx.budget(), 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while done < cycles and not budget.spent(done):
        cycle(connection)
        done += 1
        task.advance()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    record(SCHEMA_CYCLES.key, rate(done, elapsed), count=done, cpu_us_per_item=cpu_us(cpu, done))
    task.finish()


def _one_commit_cycles(ctx: Context, connection: sqlite3.Connection, record: Record, queued: int) -> None:
    cycles = min(queued - 1, ctx.config.cycles)
    task = ctx.progress.task("schema floor: settle + claim in one commit", cycles)
    connection.execute("BEGIN IMMEDIATE")
    held = claim_rows(connection, wall_ms())
    connection.execute("COMMIT")
    budget, done = ctx.budget(), 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while done < cycles and not budget.spent(done):
        held = one_commit_cycle(connection, held)
        done += 1
        task.advance()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    record(SCHEMA_ONE_COMMIT.key, rate(done, elapsed), count=done, cpu_us_per_item=cpu_us(cpu, done))
    task.finish()


def measure_schema_floor(ctx: Context, record: Record) -> None:
    """Raw-SQL enqueues (one and many per transaction), then claim + settle cycles."""
    path = ctx.path("schema-floor.sqlite")
    store = open_bench_store(path)
    try:
        builder = DepthBuilder(path, depth_job(store), prefix="schema")
    finally:
        store.close()
    connection = connect(path)
    try:
        queued = _enqueues(ctx, connection, builder, record)
        half = queued // 2
        _cycles(ctx, connection, record, half)
        _one_commit_cycles(ctx, connection, record, queued - half)
        _batches(ctx, connection, builder, record, first=queued)
    finally:
        connection.close()


SCHEMA_SPECS: Final = (SCHEMA_ENQUEUE, SCHEMA_BATCH, SCHEMA_CYCLES, SCHEMA_ONE_COMMIT)


PAIRS: Final = (
    ("enqueue_occurrence_per_s", SCHEMA_ENQUEUE.key),
    ("enqueue_many_items_per_s", SCHEMA_BATCH.key),
    ("claim_settle_cycles_per_s", SCHEMA_CYCLES.key),
    ("settle_and_claim_cycles_per_s", SCHEMA_ONE_COMMIT.key),
)


def main() -> None:
    options = size_parser(__doc__).parse_args()
    floor = Scenario("schema_floor", lambda _config: list(SCHEMA_SPECS), measure_schema_floor)
    wanted = {"floor", "enqueue_occurrence", "enqueue_many", "claim_settle", "settle_and_claim"}
    scenarios = [scenario for scenario in THROUGHPUT_SCENARIOS if scenario.name in wanted]
    with scratch_context(options) as ctx:
        figures = {
            figure.key: figure for scenario in (*scenarios, floor) for figure in run_scenario(scenario, ctx)
        }
    commit = figures["floor_commits_per_s"]
    print(f"raw commit floor: {commit.value or 0:,.0f} commits/s")
    print(f"{'figure':<34}{'store':>12}{'schema floor':>14}{'library share':>15}")
    for store_key, floor_key in PAIRS:
        store, raw = figures[store_key].value, figures[floor_key].value
        share = f"{store / raw:.0%}" if store and raw else (figures[store_key].na or figures[floor_key].na)
        print(f"{store_key:<34}{store or 0:>12,.0f}{raw or 0:>14,.0f}{share:>15}")


if __name__ == "__main__":
    main()
