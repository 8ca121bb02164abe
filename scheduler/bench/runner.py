"""One benchmark run: every scenario in order on fresh files in a temporary directory."""

from __future__ import annotations

import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from scheduler.bench.adversarial import adversarial_specs, measure_adversarial
from scheduler.bench.context import BenchConfig, Context, ProgressSink
from scheduler.bench.latency import depth_specs, measure_depths
from scheduler.bench.model import GROUP_MEMORY, BenchResult, Figure, Spec, Unavailable, not_available
from scheduler.bench.scenarios import FLOOR, THROUGHPUT_SCENARIOS, Scenario, floor_rate
from scheduler.bench.targets import evaluate_targets
from scheduler.bench.timing import peak_rss_mb
from scheduler.bench.workers import measure_workers, worker_specs

SCENARIOS: tuple[Scenario, ...] = (
    *THROUGHPUT_SCENARIOS,
    Scenario("workers", worker_specs, measure_workers),
    Scenario("depth", depth_specs, measure_depths),
    Scenario("adversarial queues", adversarial_specs, measure_adversarial),
)
BENCH_RSS = Spec(
    "rss_bench_peak_mb", "peak RSS of the bench process (whole run)", "MiB", "memory", GROUP_MEMORY
)
MAX_REASON = 300


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def machine_info(directory: Path) -> dict[str, Any]:
    """What the figures were measured on (``nproc``, versions, the temporary directory)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "nproc": len(affinity(0)) if affinity else os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": _version("SQLAlchemy"),
        "directory": str(directory),
    }


def _reason(error: BaseException) -> str:
    text = str(error) if isinstance(error, Unavailable) else f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def run_scenario(scenario: Scenario, ctx: Context) -> list[Figure]:
    """The scenario's figures; those it could not measure carry an ``n/a: reason``."""
    specs = scenario.specs(ctx.config)
    figures = {spec.key: Figure(spec, None) for spec in specs}

    def record(key: str, value: float, **detail: Any) -> None:
        figure = figures[key]
        figure.value, figure.na, figure.detail = float(value), None, detail

    try:
        scenario.run(ctx, record)
    except Exception as error:
        reason = _reason(error)
        for key, figure in figures.items():
            if figure.value is None:
                figures[key] = not_available(figure.spec, reason)
    return list(figures.values())


def recheck_floor(ctx: Context, result: BenchResult) -> None:
    """Measure the floor again at the end; the figure is the mean of both (the disk is shared)."""
    figure = result.figure(FLOOR.key)
    if figure is None or figure.value is None:
        return
    again, _ = floor_rate(ctx, "floor: raw commit loop (end)")
    samples = [figure.value, again]
    figure.value = statistics.fmean(samples)
    figure.detail["samples_commits_per_s"] = [round(sample, 1) for sample in samples]


def run_benchmarks(
    config: BenchConfig,
    progress: ProgressSink,
    *,
    command: str,
    directory: Path | None = None,
    keep: bool = False,
) -> BenchResult:
    """Run every scenario and evaluate the targets."""
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="scheduler-bench-", dir=directory))
    mode = ("quick" if config.quick else "full") + (
        "" if config.scale == 1.0 else f", scale {config.scale:g}"
    )
    result = BenchResult(command=command, mode=mode, machine=machine_info(workdir), config=config.to_dict())
    ctx = Context(config, workdir, progress)
    try:
        for scenario in SCENARIOS:
            result.figures.extend(run_scenario(scenario, ctx))
        recheck_floor(ctx, result)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result.figures.append(Figure(BENCH_RSS, peak_rss_mb()))
    result.diagnostics.update(ctx.diagnostics)
    result.targets = evaluate_targets(result)
    result.elapsed_s = time.perf_counter() - started
    return result
