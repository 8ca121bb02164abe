"""Benchmarks of the scheduler store (``scheduler bench`` / ``python -m scheduler.bench``).

:func:`register` adds the ``bench`` command to a Typer application; :func:`run_benchmarks`
runs every scenario programmatically. See ``docs/performance.md``; the project's lab scripts
(experiments, probes, profiles, peer comparisons) live in ``benchmarks/`` of a checkout, outside
the package.
"""

from __future__ import annotations

import typer

from scheduler.bench.command import bench_command
from scheduler.bench.context import BenchConfig, make_config
from scheduler.bench.model import BenchResult, Figure, Target
from scheduler.bench.runner import run_benchmarks


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to ``app``."""
    app.command("bench")(bench_command)


__all__ = ["BenchConfig", "BenchResult", "Figure", "Target", "make_config", "register", "run_benchmarks"]
