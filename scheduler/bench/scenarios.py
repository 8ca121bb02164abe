"""Throughput scenarios: the raw commit floor, enqueues, and single-worker claim + settle.

Each scenario gets a fresh database file in the run's temporary directory, opened like any
store (WAL, ``synchronous=FULL``) and reports through ``record(key, value, **detail)``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from scheduler.bench.context import LEASE_MS, BenchConfig, Context
from scheduler.bench.model import GROUP_FLOOR, GROUP_THROUGHPUT, Spec
from scheduler.bench.stores import (
    PAST_MS,
    enqueue_request,
    fill_queue,
    open_bench_store,
    require,
    settle_kwargs,
    wall_ms,
)
from scheduler.bench.timing import Record, cpu_us, rate

OWNER: Final = "bench-worker"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named measurement: the figures it produces and the function that measures them."""

    name: str
    specs: Callable[[BenchConfig], list[Spec]]
    run: Callable[[Context, Record], None]


# ------------------------------------------------------------------------------------ floor

FLOOR = Spec(
    "floor_commits_per_s",
    "floor: BEGIN IMMEDIATE; INSERT; COMMIT (raw sqlite3)",
    "commits/s",
    "rate",
    GROUP_FLOOR,
)


def floor_rate(ctx: Context, label: str) -> tuple[float, dict[str, Any]]:
    """(commits/s, detail) of the fastest durable write loop: same pragmas, no library."""
    count = ctx.config.floor_commits
    connection = sqlite3.connect(ctx.path("floor.sqlite"), isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        task = ctx.progress.task(label, count)
        value = "x" * 200
        budget, done = ctx.budget(), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while done < count and not budget.spent(done):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO floor (value) VALUES (?)", (value,))
            connection.execute("COMMIT")
            done += 1
            task.advance()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        task.finish()
    finally:
        connection.close()
    return rate(done, elapsed), {
        "count": done,
        "seconds": round(elapsed, 4),
        "cpu_us_per_item": cpu_us(cpu, done),
    }


def measure_floor(ctx: Context, record: Record) -> None:
    """The floor at the start of the run (the runner measures it again at the end)."""
    commits_per_s, detail = floor_rate(ctx, "floor: raw commit loop (start)")
    record(FLOOR.key, commits_per_s, **detail)


# ---------------------------------------------------------------------------------- enqueue

ENQUEUE_ONE = Spec("enqueue_occurrence_per_s", "enqueue_occurrence", "ops/s", "rate", GROUP_THROUGHPUT)
ENQUEUE_MANY = Spec(
    "enqueue_many_items_per_s", "enqueue_many (100 per call)", "items/s", "rate", GROUP_THROUGHPUT
)


def measure_enqueue_one(ctx: Context, record: Record) -> None:
    count = ctx.config.enqueue_single
    store = open_bench_store(ctx.path("enqueue-one.sqlite"))
    try:
        require(store, "enqueue_occurrence")
        base = wall_ms() - PAST_MS
        requests = [enqueue_request("one", index, base) for index in range(count)]
        task = ctx.progress.task("enqueue_occurrence", count)
        budget, done = ctx.budget(), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        for request in requests:
            if budget.spent(done):
                break
            store.enqueue_occurrence(**request)
            done += 1
            task.advance()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        task.finish()
    finally:
        store.close()
    record(
        ENQUEUE_ONE.key,
        rate(done, elapsed),
        count=done,
        seconds=round(elapsed, 4),
        cpu_us_per_item=cpu_us(cpu, done),
    )


def measure_enqueue_many(ctx: Context, record: Record) -> None:
    count, batch = ctx.config.enqueue_many_items, ctx.config.enqueue_batch
    store = open_bench_store(ctx.path("enqueue-many.sqlite"))
    try:
        require(store, "enqueue_many")
        base = wall_ms() - PAST_MS
        batches = [
            [enqueue_request("many", index, base) for index in range(start, min(count, start + batch))]
            for start in range(0, count, batch)
        ]
        task = ctx.progress.task(f"enqueue_many ({batch} per call)", count)
        budget, done = ctx.budget(), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        for requests in batches:
            if budget.spent(done):
                break
            store.enqueue_many(requests)
            done += len(requests)
            task.advance(len(requests))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        task.finish()
    finally:
        store.close()
    record(
        ENQUEUE_MANY.key,
        rate(done, elapsed),
        count=done,
        batch=batch,
        seconds=round(elapsed, 4),
        cpu_us_per_item=cpu_us(cpu, done),
    )


# ------------------------------------------------------------------------------ claim+settle

CYCLES = Spec(
    "claim_settle_cycles_per_s", "claim_next + settle, 1 worker", "cycles/s", "rate", GROUP_THROUGHPUT
)
BATCH_CYCLE = Spec(
    "claim_batch_settle_items_per_s",
    "claim_batch(100) + settle_many, 1 worker",
    "items/s",
    "rate",
    GROUP_THROUGHPUT,
)
BATCH_CLAIM = Spec(
    "claim_batch_items_per_s",
    "claim_batch(100) alone (its share of the above)",
    "items/s",
    "rate",
    GROUP_THROUGHPUT,
)


def measure_cycles(ctx: Context, record: Record) -> None:
    """One worker: ``claim_next`` then ``settle(succeeded)``, two write transactions per cycle."""
    count = ctx.config.cycles
    store = open_bench_store(ctx.path("cycles.sqlite"))
    try:
        require(store, "claim_next", "settle")
        fill_queue(store, "cycle", count)
        task = ctx.progress.task("claim_next + settle", count)
        budget, done = ctx.budget(), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while done < count and not budget.spent(done):
            occurrence = store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS)
            if occurrence is None:
                raise RuntimeError(f"claim_next returned None after {done} of {count} due occurrences")
            store.settle(**settle_kwargs(occurrence, OWNER))
            done += 1
            task.advance()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        task.finish()
    finally:
        store.close()
    record(
        CYCLES.key,
        rate(done, elapsed),
        count=done,
        seconds=round(elapsed, 4),
        cpu_us_per_item=cpu_us(cpu, done),
    )


ONE_COMMIT = Spec(
    "settle_and_claim_cycles_per_s",
    "settle_and_claim, 1 worker (one commit per cycle)",
    "cycles/s",
    "rate",
    GROUP_THROUGHPUT,
)


def measure_one_commit_cycles(ctx: Context, record: Record) -> None:
    """One worker: ``settle_and_claim`` of the held occurrence, one write transaction per cycle."""
    count = ctx.config.cycles
    store = open_bench_store(ctx.path("one-commit.sqlite"))
    try:
        require(store, "settle_and_claim")
        fill_queue(store, "one-commit", count + 1)
        held = store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS)

        def cycle() -> None:
            nonlocal held
            if held is None:
                raise RuntimeError("settle_and_claim ran dry before the queue was empty")
            held = store.settle_and_claim(**settle_kwargs(held, OWNER), lease_ms=LEASE_MS).claimed

        task = ctx.progress.task("settle_and_claim", count)
        budget, done = ctx.budget(), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while done < count and not budget.spent(done):
            cycle()
            done += 1
            task.advance()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        task.finish()
    finally:
        store.close()
    record(
        ONE_COMMIT.key,
        rate(done, elapsed),
        count=done,
        seconds=round(elapsed, 4),
        cpu_us_per_item=cpu_us(cpu, done),
    )


def measure_batches(ctx: Context, record: Record) -> None:
    """``claim_batch(limit)`` then ``settle_many`` of all of them: two transactions per batch."""
    count, limit = ctx.config.batch_items, ctx.config.claim_limit
    store = open_bench_store(ctx.path("batches.sqlite"))
    try:
        require(store, "claim_batch", "settle_many")
        fill_queue(store, "batch", count)
        task = ctx.progress.task(f"claim_batch({limit}) + settle_many", count)
        budget, done, claim_seconds = ctx.budget(), 0, 0.0
        started, cpu_started = time.perf_counter(), time.process_time()
        while done < count and not budget.spent(done):
            before = time.perf_counter()
            claimed = store.claim_batch(owner_id=OWNER, lease_ms=LEASE_MS, limit=limit)
            claim_seconds += time.perf_counter() - before
            if not claimed:
                raise RuntimeError(f"claim_batch ran dry after {done} of {count} due occurrences")
            store.settle_many([settle_kwargs(item, OWNER) for item in claimed])
            done += len(claimed)
            task.advance(len(claimed))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        task.finish()
    finally:
        store.close()
    detail = {"count": done, "limit": limit}
    record(
        BATCH_CYCLE.key,
        rate(done, elapsed),
        **detail,
        seconds=round(elapsed, 4),
        cpu_us_per_item=cpu_us(cpu, done),
    )
    record(BATCH_CLAIM.key, rate(done, claim_seconds), **detail, seconds=round(claim_seconds, 4))


def _fixed(*specs: Spec) -> Callable[[BenchConfig], list[Spec]]:
    return lambda _config: list(specs)


THROUGHPUT_SCENARIOS = (
    Scenario("floor", _fixed(FLOOR), measure_floor),
    Scenario("enqueue_occurrence", _fixed(ENQUEUE_ONE), measure_enqueue_one),
    Scenario("enqueue_many", _fixed(ENQUEUE_MANY), measure_enqueue_many),
    Scenario("claim_settle", _fixed(CYCLES), measure_cycles),
    Scenario("settle_and_claim", _fixed(ONE_COMMIT), measure_one_commit_cycles),
    Scenario("claim_batch", _fixed(BATCH_CYCLE, BATCH_CLAIM), measure_batches),
)
