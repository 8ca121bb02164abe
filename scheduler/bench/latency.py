"""Claim latency against queue depth (1k … 1M queued occurrences) and bounded history reads.

One database grows from depth to depth by bulk insert (:mod:`scheduler.bench.depth`). At each
depth: targeted ``claim_occurrence`` + ``settle`` of random queued rows, then ``claim_next`` +
``settle`` cycles, each timed per call. The queue is topped up before the next depth.
"""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Final

from scheduler.bench.context import LEASE_MS, BenchConfig, Context
from scheduler.bench.depth import DepthBuilder, depth_job, queued_count
from scheduler.bench.explain import claim_plans
from scheduler.bench.model import GROUP_DEPTH, GROUP_MEMORY, Kind, Spec
from scheduler.bench.stores import open_bench_store, require, wall_ms
from scheduler.bench.timing import Record, median_ms, peak_rss_mb, percentile_ms

OWNER: Final = "bench-depth-worker"
WARMUP: Final = 10
HISTORY_CALLS: Final = 20
HISTORY_LIMIT: Final = 50

HISTORY_MS = Spec(
    "history_limit50_ms", "history(job_id, limit=50) median @ max depth", "ms", "latency", GROUP_MEMORY
)
HISTORY_KIB = Spec(
    "history_limit50_peak_kib",
    "history(job_id, limit=50) Python allocation peak",
    "KiB",
    "memory",
    GROUP_MEMORY,
)
RSS_AT_MAX = Spec(
    "rss_at_max_depth_mb",
    "peak RSS of the bench process after the max-depth runs",
    "MiB",
    "memory",
    GROUP_MEMORY,
)
_METRICS: Final[tuple[tuple[str, str, Kind, str], ...]] = (
    ("claim_settle_median", "claim_next + settle median", "latency", "ms"),
    ("claim_settle_p99", "claim_next + settle p99", "latency", "ms"),
    ("claim_next_median", "claim_next alone median", "latency", "ms"),
    ("claim_next_p99", "claim_next alone p99", "latency", "ms"),
    ("claim_occurrence_median", "claim_occurrence alone median", "latency", "ms"),
    ("rss", "peak RSS after this depth", "memory", "MiB"),
)


def depth_label(depth: int) -> str:
    if depth >= 1_000_000 and depth % 1_000_000 == 0:
        return f"{depth // 1_000_000}M"
    if depth >= 1_000 and depth % 1_000 == 0:
        return f"{depth // 1_000}k"
    return str(depth)


def depth_key(depth: int, metric: str) -> str:
    return f"depth_{depth}_{metric}_{'mb' if metric == 'rss' else 'ms'}"


def depth_specs(config: BenchConfig) -> list[Spec]:
    specs = [
        Spec(depth_key(depth, metric), f"{label} @ {depth_label(depth)} queued", unit, kind, GROUP_DEPTH)
        for depth in config.depths
        for metric, label, kind, unit in _METRICS
    ]
    return [*specs, HISTORY_MS, HISTORY_KIB, RSS_AT_MAX]


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = call()
    return value, time.perf_counter() - started


class DepthRun:
    """The growing database, which depth rows are still queued, and the store on it."""

    def __init__(self, ctx: Context, record: Record) -> None:
        self.ctx = ctx
        self.record = record
        self.path: Path = ctx.path("depth.sqlite")
        self.store: Any = open_bench_store(self.path)
        require(self.store, "claim_next", "claim_occurrence", "settle", "history")
        self.builder = DepthBuilder(self.path, depth_job(self.store))
        self.consumed: set[int] = set()
        self.random = random.Random(7)

    def grow_to(self, depth: int) -> float:
        missing = depth - (self.builder.built - len(self.consumed))
        seconds = 0.0
        if missing > 0:
            task = self.ctx.progress.task(f"bulk insert to depth {depth_label(depth)}", missing)
            seconds = self.builder.add(missing, task.advance)
            task.finish()
        actual = queued_count(self.path)
        if actual != depth:
            raise RuntimeError(f"expected {depth} queued occurrences, found {actual}")
        return seconds

    def _settle(self, occurrence: Any) -> float:
        _, seconds = _timed(
            lambda: self.store.settle(
                occurrence_id=occurrence.id, owner_id=OWNER, fence=occurrence.fence, outcome="succeeded"
            )
        )
        return seconds

    def _index(self, occurrence: Any) -> int:
        return int(str(occurrence.trigger_key).rsplit("-", 1)[1])

    def _claim_one(self, identifier: str) -> Any:
        return self.store.claim_occurrence(occurrence_id=identifier, owner_id=OWNER, lease_ms=LEASE_MS)

    def targeted(self, count: int, label: str) -> list[float]:
        """``claim_occurrence`` of random queued rows (each settled afterwards, untimed)."""
        claims: list[float] = []
        task = self.ctx.progress.task(label, count)
        budget = self.ctx.budget(None if self.ctx.config.budget_s is None else self.ctx.config.budget_s / 2)
        while len(claims) < count and not budget.spent(len(claims)):
            index = self.random.randrange(self.builder.built)
            if index in self.consumed:
                continue
            identifier = self.builder.occurrence_id(index)
            occurrence, seconds = _timed(partial(self._claim_one, identifier))
            if occurrence is None:
                raise RuntimeError(f"claim_occurrence refused queued occurrence {identifier}")
            self.consumed.add(index)
            self._settle(occurrence)
            claims.append(seconds)
            task.advance()
        task.finish()
        return claims

    def cycles(self, count: int, label: str) -> tuple[list[float], list[float]]:
        """(claim_next durations, claim_next + settle durations) of ``count`` cycles."""
        claims: list[float] = []
        cycles: list[float] = []
        task = self.ctx.progress.task(label, count)
        budget = self.ctx.budget()
        while len(cycles) < count and not budget.spent(len(cycles)):
            occurrence, claim = _timed(lambda: self.store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS))
            if occurrence is None:
                raise RuntimeError("claim_next returned None with a non-empty queue")
            self.consumed.add(self._index(occurrence))
            claims.append(claim)
            cycles.append(claim + self._settle(occurrence))
            task.advance()
        task.finish()
        return claims, cycles

    def measure(self, depth: int) -> None:
        config = self.ctx.config
        build_seconds = self.grow_to(depth)
        samples = max(1, min(config.depth_samples, depth // 2))
        targeted_count = max(1, min(config.targeted_samples, depth // 4))
        at = depth_label(depth)
        self.cycles(min(WARMUP, depth // 10), f"warm-up cycles @ {at}")
        targeted = self.targeted(targeted_count, f"claim_occurrence + settle @ {at} queued")
        claims, cycles = self.cycles(samples, f"claim_next + settle @ {at} queued")
        extra: dict[str, Any] = {"depth": depth, "samples": len(cycles), "targeted_samples": len(targeted)}
        extra["build_seconds"] = round(build_seconds, 3)
        values = {
            "claim_settle_median": median_ms(cycles),
            "claim_settle_p99": percentile_ms(cycles, 0.99),
            "claim_next_median": median_ms(claims),
            "claim_next_p99": percentile_ms(claims, 0.99),
            "claim_occurrence_median": median_ms(targeted),
            "rss": peak_rss_mb(),
        }
        for metric, value in values.items():
            self.record(depth_key(depth, metric), value, metric=metric, **extra)

    def _history(self, job_id: str) -> list[Any]:
        return list(self.store.history(job_id=job_id, limit=HISTORY_LIMIT))

    def measure_history(self) -> None:
        """``history(job_id, limit=50)`` on the largest history: time and Python allocations."""
        read = partial(self._history, self.builder.job.job_id)
        durations = [_timed(read)[1] for _ in range(HISTORY_CALLS)]
        tracemalloc.start()
        try:
            events = read()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        if len(events) != HISTORY_LIMIT:
            raise RuntimeError(f"history returned {len(events)} events, expected {HISTORY_LIMIT}")
        self.record(HISTORY_MS.key, median_ms(durations), calls=HISTORY_CALLS)
        self.record(HISTORY_KIB.key, peak / 1024, events=len(events))


def measure_depths(ctx: Context, record: Record) -> None:
    run = DepthRun(ctx, record)
    try:
        for depth in ctx.config.depths:
            run.measure(depth)
        ctx.diagnostics["claim_query_plan"] = {
            "depth": max(ctx.config.depths),
            **claim_plans(run.path, wall_ms(), run.builder.occurrence_id(run.builder.built - 1)),
        }
        run.measure_history()
        record(RSS_AT_MAX.key, peak_rss_mb(), depth=max(ctx.config.depths))
    finally:
        run.store.close()
