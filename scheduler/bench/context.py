"""Run configuration (sizes per mode) and what every scenario receives."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Protocol

from scheduler.bench.timing import Budget

SCALE_ENV: Final = "SCHEDULER_BENCH_SCALE"
FULL_DEPTHS: Final = (1_000, 10_000, 100_000, 1_000_000)
QUICK_DEPTHS: Final = (1_000, 10_000, 100_000)
LEASE_MS: Final = 60_000
BENCH_JOB_ID: Final = "bench"
BENCH_AUTHORITY: Final[dict[str, Any]] = {"principal": {"type": "service", "id": "scheduler-bench"}}
MIN_COUNT: Final = 20
MIN_DEPTH: Final = 100


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Sizes of one run. ``scale`` multiplies every count and depth (smoke tests use ~0.01)."""

    quick: bool = False
    scale: float = 1.0
    floor_commits: int = 5_000
    enqueue_single: int = 5_000
    enqueue_many_items: int = 20_000
    enqueue_batch: int = 100
    cycles: int = 3_000
    batch_items: int = 20_000
    claim_limit: int = 100
    depths: tuple[int, ...] = FULL_DEPTHS
    depth_samples: int = 1_000
    targeted_samples: int = 300
    workers: int = 4
    worker_items: int = 8_000
    budget_s: float | None = None
    """``--quick``: every measurement loop also stops after this many seconds."""
    adversarial_rows: int = 100_000
    adversarial_calls: int = 200

    def to_dict(self) -> dict[str, Any]:
        return {
            key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()
        }


QUICK: Final = BenchConfig(
    quick=True,
    floor_commits=2_000,
    enqueue_single=2_000,
    enqueue_many_items=10_000,
    cycles=1_500,
    batch_items=10_000,
    depths=QUICK_DEPTHS,
    depth_samples=400,
    targeted_samples=150,
    worker_items=3_000,
    adversarial_rows=20_000,
    adversarial_calls=100,
    budget_s=3.0,
)


def _count(value: int, scale: float) -> int:
    return max(MIN_COUNT, round(value * scale))


def scaled(config: BenchConfig, scale: float) -> BenchConfig:
    """Every count and depth multiplied by ``scale`` (floors keep each figure meaningful)."""
    if scale == 1.0:
        return config
    return replace(
        config,
        scale=scale,
        floor_commits=_count(config.floor_commits, scale),
        enqueue_single=_count(config.enqueue_single, scale),
        enqueue_many_items=_count(config.enqueue_many_items, scale),
        cycles=_count(config.cycles, scale),
        batch_items=_count(config.batch_items, scale),
        depths=tuple(sorted({max(MIN_DEPTH, round(depth * scale)) for depth in config.depths})),
        depth_samples=_count(config.depth_samples, scale),
        targeted_samples=_count(config.targeted_samples, scale),
        worker_items=max(config.workers * 10, round(config.worker_items * scale)),
        adversarial_rows=max(MIN_DEPTH, round(config.adversarial_rows * scale)),
        adversarial_calls=_count(config.adversarial_calls, scale),
    )


def make_config(
    *,
    quick: bool,
    scale: float | None = None,
    depths: tuple[int, ...] | None = None,
    workers: int | None = None,
) -> BenchConfig:
    """The config for a mode; ``scale`` falls back to ``$SCHEDULER_BENCH_SCALE`` (default 1)."""
    base = QUICK if quick else BenchConfig()
    if scale is None:
        scale = float(os.environ.get(SCALE_ENV) or 1.0)
    if scale <= 0:
        raise ValueError("scale must be positive")
    config = scaled(base, scale)
    if depths:
        config = replace(config, depths=tuple(sorted(set(depths))))
    if workers is not None:
        config = replace(config, workers=workers)
    return config


class Task(Protocol):
    def advance(self, amount: int = 1) -> None: ...

    def finish(self, note: str = "") -> None: ...


class ProgressSink(Protocol):
    """Where scenarios report progress (the rich display, or nothing)."""

    def task(self, label: str, total: int) -> Task: ...


class _NullTask:
    def advance(self, amount: int = 1) -> None:
        pass

    def finish(self, note: str = "") -> None:
        pass


class NullProgress:
    def task(self, label: str, total: int) -> Task:
        return _NullTask()


@dataclass(frozen=True, slots=True)
class Context:
    """A scenario's inputs: the config, a directory for its files, progress, a diagnostics sink."""

    config: BenchConfig
    directory: Path
    progress: ProgressSink
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        return self.directory / name

    def budget(self, seconds: float | None = None) -> Budget:
        """A time box for one loop: ``seconds`` or the config's ``budget_s`` (``None``: unlimited)."""
        return Budget(self.config.budget_s if seconds is None else seconds)
