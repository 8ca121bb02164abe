"""Showing a run: the rich progress display, the final tables, ``--json`` and ``--markdown``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from scheduler.bench.context import Task
from scheduler.bench.latency import depth_label
from scheduler.bench.model import GROUP_ADVERSARIAL, GROUP_DEPTH, BenchResult, Figure

DEPTH_COLUMNS = (
    ("claim_settle_median", "claim+settle median ms"),
    ("claim_settle_p99", "claim+settle p99 ms"),
    ("claim_next_median", "claim_next median ms"),
    ("claim_next_p99", "claim_next p99 ms"),
    ("claim_occurrence_median", "claim_occurrence median ms"),
    ("rss", "peak RSS MiB"),
)


class _RichTask:
    def __init__(self, progress: Progress, task: TaskID, total: int) -> None:
        self._progress, self._task, self._total = progress, task, total

    def advance(self, amount: int = 1) -> None:
        self._progress.advance(self._task, amount)

    def finish(self, note: str = "") -> None:
        self._progress.update(self._task, completed=self._total)


class RichProgress:
    """A progress bar per measurement step."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def task(self, label: str, total: int) -> Task:
        return _RichTask(self._progress, self._progress.add_task(label, total=total), total)


@contextmanager
def rich_progress(console: Console) -> Iterator[RichProgress]:
    columns = (TextColumn("{task.description:<46}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        yield RichProgress(progress)


def number(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def ratio_text(figure: Figure, floor: float | None) -> str:
    ratio = figure.ratio_to_floor(floor)
    if ratio is None:
        return ""
    return f"{ratio:.2f}x" if figure.spec.kind == "rate" else f"{ratio:.1f} commits"


def value_text(figure: Figure) -> str:
    return number(figure.value) if figure.value is not None else (figure.na or "n/a")


FIGURE_HEADER = ("figure", "value", "unit", "vs floor", "CPU µs/item")


def figure_rows(result: BenchResult) -> Iterator[tuple[str, ...]]:
    """One row per figure outside the depth table (see ``FIGURE_HEADER``)."""
    for figure in result.figures:
        if figure.spec.group not in (GROUP_DEPTH, GROUP_ADVERSARIAL):
            cpu = figure.detail.get("cpu_us_per_item")
            yield (
                figure.spec.label,
                value_text(figure),
                figure.spec.unit,
                ratio_text(figure, result.floor_per_s),
                "" if cpu is None else f"{cpu:,.0f}",
            )


def depth_rows(result: BenchResult) -> Iterator[list[str]]:
    """One row per depth: the depth, then each metric with its ratio to one floor commit."""
    depths = sorted(int(depth) for depth in result.config.get("depths", []))
    for depth in depths:
        cells = [depth_label(depth)]
        for metric, _ in DEPTH_COLUMNS:
            key = f"depth_{depth}_{metric}_{'mb' if metric == 'rss' else 'ms'}"
            figure = result.figure(key)
            if figure is None:
                cells.append("—")
                continue
            ratio = ratio_text(figure, result.floor_per_s)
            cells.append(value_text(figure) + (f" ({ratio})" if ratio else ""))
        yield cells


ADVERSARIAL_HEADER = ("adversarial queue", "median ms", "p99 ms", "CPU µs/call", "bound ms", "verdict")


def adversarial_rows(result: BenchResult) -> Iterator[list[str]]:
    """One row per adversarial case (a latency with its bound) or count (the fleet's workers)."""
    for figure in result.figures:
        if figure.spec.group != GROUP_ADVERSARIAL:
            continue
        detail = figure.detail
        if figure.spec.kind != "latency" or figure.value is None:
            yield [figure.spec.label, value_text(figure), "", "", "", ""]
            continue
        verdict = "met" if detail.get("within_bound") else "NOT met"
        yield [
            figure.spec.label,
            number(figure.value),
            number(detail.get("p99_ms")),
            number(detail.get("cpu_us_per_call")),
            number(detail.get("bound_ms")),
            verdict,
        ]


def target_rows(result: BenchResult) -> Iterator[tuple[str, str, str, str]]:
    for target in result.targets:
        informational = target.met is None and not target.observed.startswith("n/a")
        verdict = (
            ("info" if informational else "n/a")
            if target.met is None
            else ("met" if target.met else "NOT met")
        )
        yield target.name, target.requirement, target.observed, verdict


def render(result: BenchResult, console: Console) -> None:
    """The final tables: figures (with the ratio to the floor), depth latency, targets."""
    machine = result.machine
    console.print(
        f"[bold]scheduler bench[/] ({result.mode}) — nproc {machine['nproc']}, Python {machine['python']}, "
        f"SQLite {machine['sqlite']}, SQLAlchemy {machine['sqlalchemy']}; {result.elapsed_s:.0f} s"
    )
    figures = Table(title="Figures (vs floor: rates ÷ floor commits/s; latencies ÷ one floor commit)")
    for column in FIGURE_HEADER:
        figures.add_column(column, justify="left" if column == "figure" else "right")
    for row in figure_rows(result):
        figures.add_row(*row)
    console.print(figures)
    depth = Table(title="Claim latency by queued depth (vs floor = equivalent floor commits)")
    depth.add_column("queued", justify="right")
    for _, title in DEPTH_COLUMNS:
        depth.add_column(title, justify="right")
    for cells in depth_rows(result):
        depth.add_row(*cells)
    console.print(depth)
    adversarial = Table(title="Adversarial queues (each call timed; CPU = process time of the timed call)")
    for column in ADVERSARIAL_HEADER:
        adversarial.add_column(column, justify="left" if column == ADVERSARIAL_HEADER[0] else "right")
    for cells in adversarial_rows(result):
        adversarial.add_row(*cells)
    console.print(adversarial)
    targets = Table(title="Targets")
    for column in ("target", "requirement", "observed", "verdict"):
        targets.add_column(column)
    for row in target_rows(result):
        style = {"met": "green", "NOT met": "red", "info": "cyan"}.get(row[3], "yellow")
        targets.add_row(*row[:3], f"[{style}]{row[3]}[/]")
    console.print(targets)


def write_json(result: BenchResult, path: Path) -> None:
    path.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines.extend("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)
    return lines


def markdown(result: BenchResult) -> str:
    """The run's tables as Markdown (what ``docs/performance.md`` quotes)."""
    machine = result.machine
    lines = [
        f"Command: `{result.command}` ({result.mode}, {result.elapsed_s:.0f} s)",
        "",
        f"Machine: nproc {machine['nproc']}, {machine['cpu']}, {machine['platform']}; Python "
        f"{machine['python']}, SQLite {machine['sqlite']}, SQLAlchemy {machine['sqlalchemy']}",
        "",
    ]
    lines += markdown_table(list(FIGURE_HEADER), [list(row) for row in figure_rows(result)])
    lines += [
        "",
        *markdown_table(["queued", *(title for _, title in DEPTH_COLUMNS)], list(depth_rows(result))),
    ]
    lines += ["", *markdown_table(list(ADVERSARIAL_HEADER), list(adversarial_rows(result)))]
    lines += [
        "",
        *markdown_table(
            ["target", "requirement", "observed", "verdict"], [list(row) for row in target_rows(result)]
        ),
    ]
    return "\n".join(lines) + "\n"
