"""The ``bench`` command (``scheduler bench`` once registered, or ``python -m scheduler.bench``)."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from scheduler.backends import backend_named, is_supported
from scheduler.bench.context import SCALE_ENV, make_config
from scheduler.bench.report import markdown, render, rich_progress, write_json
from scheduler.bench.runner import run_benchmarks


def command_line(argv: list[str] | None = None) -> str:
    """How this run was invoked, normalized to ``python -m scheduler.bench …`` or ``scheduler …``."""
    args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).name == "__main__.py":
        return shlex.join(["python", "-m", "scheduler.bench", *args[1:]])
    return shlex.join(["scheduler", *args[1:]])


@contextmanager
def terminated_cleanly() -> Iterator[None]:
    """While the run lasts, ``SIGTERM`` (``kill``, a CI timeout) exits with status 143 through
    the run's ``finally`` blocks, as Ctrl-C does: its worker processes are stopped and its
    temporary databases or PostgreSQL schemas dropped (``--keep`` aside). Only ``SIGKILL``
    leaves them behind (``scheduler_bench_<pid>`` schemas; see docs/performance.md)."""

    def terminate(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a signal handler
        return
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def parse_depths(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        depths = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise typer.BadParameter("depths must be comma-separated integers") from error
    if not depths or min(depths) < 10:
        raise typer.BadParameter("each depth must be at least 10")
    return depths


def bench_command(
    quick: Annotated[
        bool, typer.Option("--quick", help="Smaller sizes, depths up to 100k: under a minute.")
    ] = False,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write every figure as JSON to FILE.")
    ] = None,
    markdown_file: Annotated[
        Path | None, typer.Option("--markdown", help="Write the result tables as Markdown to FILE.")
    ] = None,
    scale: Annotated[
        float | None,
        typer.Option(
            "--scale", envvar=SCALE_ENV, min=0.0001, help="Multiply every count and depth (tests: 0.01)."
        ),
    ] = None,
    depths: Annotated[
        str | None, typer.Option("--depths", help="Comma-separated queue depths to measure.")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="Worker processes.")] = 4,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Where the temporary databases go (default: system temp).")
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the temporary databases.")] = False,
    backend: Annotated[
        str, typer.Option("--backend", help="sqlite (default) or postgresql (needs --db).")
    ] = "sqlite",
    db: Annotated[
        str | None,
        typer.Option("--db", help="PostgreSQL URL (postgresql+psycopg://…) for --backend postgresql."),
    ] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, max=20, help="PostgreSQL: rounds per figure.")
    ] = 3,
    adversarial: Annotated[
        bool,
        typer.Option("--adversarial", help="Only the adversarial queues, on either backend (see --rows)."),
    ] = False,
    rows: Annotated[
        int,
        typer.Option(
            "--rows", min=100, help="--adversarial: rows each state holds that the calls must not walk."
        ),
    ] = 100_000,
    calls: Annotated[
        int, typer.Option("--calls", min=10, max=100_000, help="--adversarial: timed calls per case.")
    ] = 200,
) -> None:
    """Measure the store on a temporary WAL database (synchronous=FULL) against the raw commit floor,
    or (``--backend postgresql --db URL``) on a PostgreSQL server in a schema of its own;
    ``--adversarial``: only the adversarial queues at ``--rows``, states built through the API."""
    if not is_supported(backend):
        raise typer.BadParameter("--backend must be sqlite or postgresql")
    if adversarial:
        _adversarial(
            backend,
            db,
            rows=rows,
            calls=calls,
            directory=directory,
            keep=keep,
            files=(json_file, markdown_file),
        )
        return
    if backend_named(backend).own_schema:
        _postgresql(
            db,
            quick=quick,
            scale=scale,
            depths=parse_depths(depths),
            rounds=rounds,
            json_file=json_file,
            markdown_file=markdown_file,
        )
        return
    config = make_config(quick=quick, scale=scale, depths=parse_depths(depths), workers=workers)
    console = Console(stderr=True)
    with terminated_cleanly(), rich_progress(console) as progress:
        result = run_benchmarks(config, progress, command=command_line(), directory=directory, keep=keep)
    render(result, Console())
    if json_file is not None:
        write_json(result, json_file)
    if markdown_file is not None:
        markdown_file.write_text(markdown(result), encoding="utf-8")
    proof = next((target for target in result.targets if "exactly once" in target.name), None)
    if proof is not None and proof.met is False:
        raise typer.Exit(1)


def _adversarial(
    backend: str,
    db: str | None,
    *,
    rows: int,
    calls: int,
    directory: Path | None,
    keep: bool,
    files: tuple[Path | None, Path | None],
) -> None:
    """``--adversarial``: :mod:`scheduler.bench.adversarial_command`; exit status 1 when a case
    exceeds its bound."""
    from scheduler.bench.adversarial_command import run_command

    url = _postgresql_url(db) if backend_named(backend).own_schema else None
    with terminated_cleanly():
        run = run_command(
            backend_named(backend).name,
            rows=rows,
            calls=calls,
            directory=directory,
            keep=keep,
            url=url,
            command=command_line(),
            json_file=files[0],
            markdown_file=files[1],
        )
    if not all(case["within_bound"] for case in run.cases):
        raise typer.Exit(1)


def _postgresql_url(db: str | None) -> str:
    if not db:
        raise typer.BadParameter("--backend postgresql needs --db postgresql+psycopg://…")
    return "postgresql+psycopg://" + db.split("://", 1)[1] if db.startswith("postgresql://") else db


def _postgresql(
    db: str | None,
    *,
    quick: bool,
    scale: float | None,
    depths: tuple[int, ...] | None,
    rounds: int,
    json_file: Path | None,
    markdown_file: Path | None,
) -> None:
    """``--backend postgresql``: run :mod:`scheduler.bench.pg_bench` and print its tables."""
    import json

    from scheduler.bench.pg_bench import PgBenchConfig, markdown, run_pg_bench

    url = _postgresql_url(db)
    config = PgBenchConfig(url=url, rounds=rounds, scale=scale or 1.0)
    if quick:
        config = PgBenchConfig(url=url, rounds=rounds, scale=scale or 0.25, depths=(1_000, 100_000))
    if depths is not None:
        config = PgBenchConfig(url=url, rounds=rounds, scale=config.scale, depths=depths)
    console = Console(stderr=True)
    with terminated_cleanly():
        result = run_pg_bench(config, progress=console.print, command=command_line())
    text = markdown(result)
    Console().print(text, markup=False, highlight=False)
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    if markdown_file is not None:
        markdown_file.write_text(text, encoding="utf-8")
    if not result["targets"]["every_occurrence_settled_exactly_once"]["met"]:
        raise typer.Exit(1)
