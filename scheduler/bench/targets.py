"""The issue's targets, checked against one run's figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from scheduler.bench.latency import depth_key, depth_label
from scheduler.bench.model import BenchResult, Target

MIN_CYCLES_PER_S: Final = 2_500.0
MIN_FLOOR_SHARE: Final = 0.5
MIN_ENQUEUE_PER_S: Final = 5_000.0
MIN_BATCH_ITEMS_PER_S: Final = 20_000.0
MAX_DEPTH_GROWTH: Final = 2.0
MAX_CLAIM_MS: Final = 1.0
MAX_RSS_MB: Final = 300.0
MAX_HISTORY_KIB: Final = 1024.0
ORIGINAL: Final = {"enqueue": 2_000.0, "cycles": 450.0, "latency_1m_ms": 1_480.0}


def _threshold(
    result: BenchResult,
    key: str,
    name: str,
    requirement: str,
    check: Callable[[float], bool],
    fmt: str = "{:,.0f}",
) -> Target:
    value = result.value(key)
    if value is None:
        figure = result.figure(key)
        return Target(name, requirement, figure.na if figure and figure.na else "n/a", None)
    return Target(name, requirement, fmt.format(value), check(value))


def _depth_target(result: BenchResult, metric: str, label: str) -> Target:
    depths = sorted(int(depth) for depth in result.config.get("depths", []))
    requirement = (
        f"{label} median at max depth <= {MAX_DEPTH_GROWTH:g} x at min depth and <= {MAX_CLAIM_MS:g} ms"
    )
    name = f"depth-independent {label}"
    if len(depths) < 2:
        return Target(name, requirement, "n/a: fewer than two depths", None)
    low, high = result.value(depth_key(depths[0], metric)), result.value(depth_key(depths[-1], metric))
    if low is None or high is None:
        return Target(name, requirement, "n/a: depth figures missing", None)
    growth = high / low
    observed = (
        f"{high:.3f} ms @ {depth_label(depths[-1])} vs {low:.3f} ms @ {depth_label(depths[0])} "
        f"({growth:.2f}x)"
    )
    return Target(name, requirement, observed, growth <= MAX_DEPTH_GROWTH and high <= MAX_CLAIM_MS)


def _floor_share(result: BenchResult) -> Target:
    requirement = f"claim_next + settle >= {MIN_FLOOR_SHARE:.0%} of the floor (two commits per cycle)"
    cycles, floor = result.value("claim_settle_cycles_per_s"), result.floor_per_s
    if cycles is None or not floor:
        return Target("claim + settle vs floor", requirement, "n/a", None)
    share = cycles / floor
    return Target(
        "claim + settle vs floor",
        requirement,
        f"{share:.1%} of {floor:,.0f} commits/s",
        share >= MIN_FLOOR_SHARE,
    )


def _versus_original(result: BenchResult) -> Target:
    parts: list[str] = []
    met = True
    for key, original, what in (
        ("enqueue_occurrence_per_s", ORIGINAL["enqueue"], "enqueue"),
        ("claim_settle_cycles_per_s", ORIGINAL["cycles"], "claim+settle"),
    ):
        value = result.value(key)
        if value is not None:
            parts.append(f"{what} {value / original:.1f}x")
            met = met and value > original
    latency = result.value(depth_key(1_000_000, "claim_settle_median"))
    if latency is not None:
        parts.append(f"1M claim+settle {ORIGINAL['latency_1m_ms'] / latency:,.0f}x faster")
        met = met and latency < ORIGINAL["latency_1m_ms"]
    observed = ", ".join(parts) or "n/a"
    return Target(
        "ahead of the original JS store",
        "2,000 enqueues/s, 450 cycles/s, 1,480 ms at 1M",
        observed,
        met if parts else None,
    )


def _versus_schema_floor(result: BenchResult) -> Target:
    """Informational: how close the store gets to the same row changes in raw sqlite3."""
    parts: list[str] = []
    for key, floor_key, what in (
        ("enqueue_occurrence_per_s", "schema_floor_enqueue_per_s", "enqueue_occurrence"),
        ("claim_settle_cycles_per_s", "schema_floor_cycles_per_s", "claim_next + settle"),
        ("enqueue_many_items_per_s", "schema_floor_batch_items_per_s", "enqueue_many"),
    ):
        value, floor = result.value(key), result.value(floor_key)
        if value is not None and floor:
            parts.append(f"{what} {value / floor:.0%}")
    observed = ", ".join(parts) if parts else "n/a"
    return Target(
        "library share (vs schema floor)", "informational: store rate / raw-SQL rate", observed, None
    )


def evaluate_targets(result: BenchResult) -> list[Target]:
    def at_least(minimum: float) -> Callable[[float], bool]:
        return lambda value: value >= minimum

    def at_most(maximum: float) -> Callable[[float], bool]:
        return lambda value: value <= maximum

    max_depth = max((int(depth) for depth in result.config.get("depths", [0])), default=0)
    workers = result.config.get("workers", 4)
    return [
        _threshold(
            result,
            "claim_settle_cycles_per_s",
            "single-worker claim + settle",
            f">= {MIN_CYCLES_PER_S:,.0f} cycles/s",
            at_least(MIN_CYCLES_PER_S),
        ),
        _floor_share(result),
        _threshold(
            result,
            "enqueue_occurrence_per_s",
            "enqueue_occurrence",
            f">= {MIN_ENQUEUE_PER_S:,.0f} /s",
            at_least(MIN_ENQUEUE_PER_S),
        ),
        _threshold(
            result,
            "enqueue_many_items_per_s",
            "enqueue_many",
            f">= {MIN_BATCH_ITEMS_PER_S:,.0f} items/s",
            at_least(MIN_BATCH_ITEMS_PER_S),
        ),
        _threshold(
            result,
            "claim_batch_items_per_s",
            "claim_batch(100)",
            f">= {MIN_BATCH_ITEMS_PER_S:,.0f} items/s",
            at_least(MIN_BATCH_ITEMS_PER_S),
        ),
        _threshold(
            result,
            "claim_batch_settle_items_per_s",
            "claim_batch(100) + settle_many (stricter)",
            f">= {MIN_BATCH_ITEMS_PER_S:,.0f} items/s",
            at_least(MIN_BATCH_ITEMS_PER_S),
        ),
        _depth_target(result, "claim_next_median", "claim_next"),
        _depth_target(result, "claim_occurrence_median", "claim_occurrence"),
        _threshold(
            result,
            "workers_settled_exactly_once",
            f"{workers} processes: exactly once",
            "every occurrence claimed once and settled exactly once",
            at_least(1.0),
        ),
        _threshold(
            result,
            "rss_at_max_depth_mb",
            f"memory at {depth_label(max_depth)} depth",
            f"peak RSS < {MAX_RSS_MB:g} MiB",
            at_most(MAX_RSS_MB),
            "{:,.1f} MiB",
        ),
        _threshold(
            result,
            "history_limit50_peak_kib",
            "history(limit=50) stays bounded",
            f"Python allocations < {MAX_HISTORY_KIB:g} KiB at max depth",
            at_most(MAX_HISTORY_KIB),
            "{:,.1f} KiB",
        ),
        _versus_original(result),
        _versus_schema_floor(result),
    ]
