"""The run's checks: what must hold on any machine, whatever its disk and CPU.

Rates depend on the machine (above all on how fast its disk commits), so none of them is a check;
the tables show each figure beside the raw commit floor instead. The checks are that work is done
exactly once, that a claim does not slow down with the depth of the queue (its time at the deepest
queue against the shallowest, not in milliseconds: a claim commits, and a commit takes what the
disk takes), and that memory stays bounded at the deepest queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from scheduler.bench.latency import depth_key, depth_label
from scheduler.bench.model import BenchResult, Target

MAX_DEPTH_GROWTH: Final = 2.0
MAX_RSS_MB: Final = 300.0
MAX_HISTORY_KIB: Final = 1024.0


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
    requirement = f"{label} median at max depth <= {MAX_DEPTH_GROWTH:g} x at min depth"
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
    return Target(name, requirement, observed, growth <= MAX_DEPTH_GROWTH)


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
            "workers_settled_exactly_once",
            f"{workers} processes: exactly once",
            "every occurrence claimed once and settled exactly once",
            at_least(1.0),
        ),
        _depth_target(result, "claim_next_median", "claim_next"),
        _depth_target(result, "claim_occurrence_median", "claim_occurrence"),
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
    ]
