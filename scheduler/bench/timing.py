"""Small timing and memory helpers shared by the scenarios."""

from __future__ import annotations

import math
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol


class Record(Protocol):
    """Stores one measured value under a figure key (extra keywords go to its detail)."""

    def __call__(self, key: str, value: float, **detail: Any) -> None: ...


def stop_processes(processes: Sequence[Any], *, finished: bool, timeout_s: float = 60.0) -> None:
    """Join a run's worker processes (``multiprocessing.Process``). A run that did not finish (a
    worker's error, a timeout, Ctrl-C or ``SIGTERM``) kills them first: nothing is left running,
    or writing to a database the run is about to remove. One that outlives ``timeout_s`` is killed."""
    started = [process for process in processes if process.pid is not None]
    if not finished:
        for process in started:
            process.kill()
    deadline = time.monotonic() + timeout_s  # one deadline for all of them
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in started:
        if process.is_alive():
            process.kill()
            process.join(5.0)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def cpu_us(cpu_seconds: float, count: int) -> float:
    """Process CPU time (user + system, not waiting for fsync) per item, in microseconds."""
    return round(cpu_seconds / count * 1e6, 1) if count else 0.0


def median_ms(samples: Sequence[float]) -> float:
    """The median of durations in seconds, in milliseconds."""
    return statistics.median(samples) * 1000.0


def percentile_ms(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of durations in seconds, in milliseconds."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1] * 1000.0


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size (``ru_maxrss``) in MiB (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(who).ru_maxrss
    divisor = 1024 * 1024 if sys.platform == "darwin" else 1024
    return peak / divisor


def current_rss_mb() -> float | None:
    """The current resident set size in MiB (Linux ``/proc``), ``None`` elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize() / (1024 * 1024)


class Budget:
    """A time box for one measurement loop (``--quick``): spent once the deadline passed and at
    least ``minimum`` operations were done. ``seconds=None`` never runs out."""

    __slots__ = ("deadline", "minimum")

    def __init__(self, seconds: float | None, minimum: int = 20) -> None:
        self.deadline = None if seconds is None else time.perf_counter() + seconds
        self.minimum = minimum

    def spent(self, done: int) -> bool:
        return self.deadline is not None and done >= self.minimum and time.perf_counter() >= self.deadline
