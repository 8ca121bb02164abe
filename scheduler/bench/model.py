"""Values the benchmark produces: figures, target verdicts and the whole result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

Kind = Literal["rate", "latency", "memory", "count"]

GROUP_FLOOR: Final = "floor"
GROUP_THROUGHPUT: Final = "throughput"
GROUP_DEPTH: Final = "depth"
GROUP_WORKERS: Final = "workers"
GROUP_MEMORY: Final = "memory"
GROUP_ADVERSARIAL: Final = "adversarial"


class Unavailable(Exception):
    """A figure cannot be measured (store method missing, stand-in in use, …)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """What one figure is: its key, label, unit and kind (rates, latencies, memory, counts)."""

    key: str
    label: str
    unit: str
    kind: Kind
    group: str


@dataclass(slots=True)
class Figure:
    """One measured figure; ``na`` explains why ``value`` is missing."""

    spec: Spec
    value: float | None
    na: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.spec.key

    def ratio_to_floor(self, floor_per_s: float | None) -> float | None:
        """Rates: value / floor rate. Latencies: value / one floor commit's duration (ms)."""
        if self.value is None or not floor_per_s:
            return None
        if self.spec.kind == "rate":
            return self.value / floor_per_s
        if self.spec.kind == "latency":
            return self.value / (1000.0 / floor_per_s)
        return None

    def to_dict(self, floor_per_s: float | None) -> dict[str, Any]:
        ratio = self.ratio_to_floor(floor_per_s)
        return {
            "key": self.spec.key,
            "label": self.spec.label,
            "group": self.spec.group,
            "unit": self.spec.unit,
            "kind": self.spec.kind,
            "value": self.value,
            "ratio_to_floor": None if ratio is None else round(ratio, 4),
            "na": self.na,
            "detail": self.detail,
        }


def not_available(spec: Spec, reason: str) -> Figure:
    return Figure(spec, None, na=f"n/a: {reason}")


@dataclass(frozen=True, slots=True)
class Target:
    """One check of the run and whether it held (``None``: could not tell)."""

    name: str
    requirement: str
    observed: str
    met: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requirement": self.requirement,
            "observed": self.observed,
            "met": self.met,
        }


@dataclass(slots=True)
class BenchResult:
    """Everything one run measured."""

    command: str
    mode: str
    machine: dict[str, Any]
    config: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def figure(self, key: str) -> Figure | None:
        return next((figure for figure in self.figures if figure.key == key), None)

    def value(self, key: str) -> float | None:
        figure = self.figure(key)
        return None if figure is None else figure.value

    @property
    def floor_per_s(self) -> float | None:
        return self.value("floor_commits_per_s")

    def to_dict(self) -> dict[str, Any]:
        floor = self.floor_per_s
        return {
            "schema": "scheduler-bench/1",
            "command": self.command,
            "mode": self.mode,
            "machine": self.machine,
            "config": self.config,
            "elapsed_s": round(self.elapsed_s, 3),
            "floor_commits_per_s": floor,
            "figures": [figure.to_dict(floor) for figure in self.figures],
            "targets": [target.to_dict() for target in self.targets],
            "diagnostics": self.diagnostics,
        }
