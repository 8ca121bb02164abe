"""Sizes, shared fixtures and the figures report of the reliability suite.

``SCHEDULER_RELIABILITY_SCALE`` selects the sizes: ``ci`` (default, what ``.ci/run`` uses) or
``full`` (the figures in ``docs/design/reliability.md``). Single knobs can be overridden with
``SCHEDULER_RELIABILITY_<KNOB>`` (e.g. ``SCHEDULER_RELIABILITY_KILLS=50``).
``SCHEDULER_RELIABILITY_SEED`` fixes the random seed (default: a fresh one, printed in the
figures). ``SCHEDULER_RELIABILITY_REPORT=<path>`` writes the figures as JSON at the end.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest

T0 = 1767225600000


@dataclass(frozen=True)
class Scale:
    """Every size knob of the suite."""

    name: str
    kills: int  # SIGKILLs that land while the child is writing
    upgrade_kills: int  # SIGKILLs during a v1 -> v6 upgrade
    race_workers: int
    race_occurrences: int
    fuzz_examples: int
    fuzz_steps: int
    full_disk_calls: int  # recorded write calls to fault (0 = every one)
    full_disk_points: int  # page-allocation points per call (0 = every one)
    hostile_examples: int
    thread_rounds: int  # rounds of threads calling a shared store while one of them closes it
    outbox_kills: int = 20  # SIGKILLs per embedding layout while committing an order + occurrence


SCALES = {
    "ci": Scale(
        name="ci",
        kills=20,
        upgrade_kills=8,
        race_workers=4,
        race_occurrences=300,
        fuzz_examples=40,
        fuzz_steps=30,
        full_disk_calls=0,
        full_disk_points=2,
        hostile_examples=60,
        thread_rounds=8,
        outbox_kills=10,
    ),
    "full": Scale(
        name="full",
        kills=200,
        upgrade_kills=40,
        race_workers=4,
        race_occurrences=1000,
        fuzz_examples=300,
        fuzz_steps=50,
        full_disk_calls=0,
        full_disk_points=0,
        hostile_examples=500,
        thread_rounds=60,
        outbox_kills=150,
    ),
}


def current_scale() -> Scale:
    name = os.environ.get("SCHEDULER_RELIABILITY_SCALE", "ci").strip() or "ci"
    if name not in SCALES:
        raise pytest.UsageError(f"SCHEDULER_RELIABILITY_SCALE must be one of {sorted(SCALES)}, not {name!r}")
    chosen = SCALES[name]
    overrides: dict[str, Any] = {}
    for item in fields(Scale):
        raw = os.environ.get(f"SCHEDULER_RELIABILITY_{item.name.upper()}")
        if raw is not None and item.name != "name":
            overrides[item.name] = int(raw)
    return replace(chosen, **overrides)


_SEED = int(os.environ.get("SCHEDULER_RELIABILITY_SEED") or random.SystemRandom().randrange(2**32))
_FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="session")
def scale() -> Scale:
    return current_scale()


@pytest.fixture(scope="session")
def seed() -> int:
    """The suite's base random seed (set ``SCHEDULER_RELIABILITY_SEED`` to replay a run)."""
    return _SEED


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    """Named figures each test records for the report (kills survived, races, …)."""
    return _FIGURES


@pytest.fixture(scope="session", autouse=True)
def _report() -> Iterator[None]:
    started = time.monotonic()
    yield
    if not _FIGURES:
        return
    _FIGURES["_run"] = {
        "scale": asdict(current_scale()),
        "seed": _SEED,
        "seconds": round(time.monotonic() - started, 1),
    }
    target = os.environ.get("SCHEDULER_RELIABILITY_REPORT")
    if target:
        Path(target).write_text(json.dumps(_FIGURES, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    terminalreporter.write_line(f"scale={current_scale().name} seed={_SEED}")
    for name in sorted(_FIGURES):
        if not name.startswith("_"):
            terminalreporter.write_line(f"{name}: {json.dumps(_FIGURES[name], sort_keys=True)}")
