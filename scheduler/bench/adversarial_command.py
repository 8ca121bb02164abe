"""``scheduler bench --adversarial [--rows N]``: the adversarial queues alone, on either backend.

SQLite: one file per state in ``--dir`` (default: a temporary directory), named by state and
size; PostgreSQL: one schema per state (``scheduler_adv_<state>_<rows>``) in the ``--db``
database. A state that is there already, complete and of that size, is reused (building a
million rows through the public API takes minutes); ``--keep`` keeps them for the next run,
otherwise the run removes what it built.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from scheduler.bench.adversarial import STATES, AdversarialRun, adversarial_markdown, run_adversarial


def schema_name(state: str, rows: int) -> str:
    return f"scheduler_adv_{state}_{rows}"


def file_name(state: str, rows: int) -> str:
    return f"adversarial-{state}-{rows}.sqlite"


@contextmanager
def sqlite_states(directory: Path | None, rows: int, keep: bool) -> Iterator[Callable[[str], Any]]:
    """A state's name -> a store on its file; the files (or the temporary directory) removed at
    the end unless ``keep``."""
    from scheduler.store.opening import open_store

    workdir = directory or Path(tempfile.mkdtemp(prefix="scheduler-adversarial-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        yield lambda state: open_store(workdir / file_name(state, rows))
    finally:
        if not keep:
            if directory is None:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for state in STATES:
                    for suffix in ("", "-wal", "-shm", "-journal"):
                        (workdir / (file_name(state, rows) + suffix)).unlink(missing_ok=True)


@contextmanager
def postgresql_states(url: str, rows: int, keep: bool) -> Iterator[Callable[[str], Any]]:
    """A state's name -> a store on its schema; the schemas dropped at the end unless ``keep``."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from scheduler.bench.pg_server import quoted
    from scheduler.store.opening import open_store

    engine = create_engine(url, poolclass=NullPool)
    try:
        yield lambda state: open_store(engine, schema=schema_name(state, rows))
        if not keep:
            _drop(engine, rows, quoted)
    except BaseException:
        if not keep:
            _drop(engine, rows, quoted)
        raise
    finally:
        engine.dispose()


def _drop(engine: Any, rows: int, quoted: Callable[[Any, str], str]) -> None:
    with engine.begin() as connection:
        for state in STATES:
            connection.exec_driver_sql(
                f"DROP SCHEMA IF EXISTS {quoted(engine, schema_name(state, rows))} CASCADE"
            )


def run_command(
    backend: str,
    *,
    rows: int,
    calls: int,
    directory: Path | None,
    keep: bool,
    url: str | None,
    command: str,
    json_file: Path | None,
    markdown_file: Path | None,
) -> AdversarialRun:
    """Run every case, print the tables and write the files asked for."""
    console = Console(stderr=True)
    opened = postgresql_states(url, rows, keep) if url is not None else sqlite_states(directory, rows, keep)
    with opened as opener:
        run = run_adversarial(backend, opener, rows, calls, command=command, progress=console.print)
    render(run, Console())
    if json_file is not None:
        json_file.write_text(json.dumps(run.to_dict(), indent=2) + "\n", encoding="utf-8")
    if markdown_file is not None:
        markdown_file.write_text(adversarial_markdown(run), encoding="utf-8")
    return run


def render(run: AdversarialRun, console: Console) -> None:
    states = Table(
        title=f"Adversarial states on {run.backend} ({run.rows:,} rows, built through the public API)"
    )
    for column in ("state", "build s", "reused"):
        states.add_column(column, justify="left" if column == "state" else "right")
    for state in run.states:
        states.add_row(state["state"], f"{state['build_s']}", "yes" if state["reused"] else "no")
    console.print(states)
    cases = Table(title=f"Adversarial queues on {run.backend}: {run.calls} timed calls per case")
    for column in ("case", "median ms", "p99 ms", "CPU µs/call", "bound ms", "verdict"):
        cases.add_column(column, justify="left" if column == "case" else "right")
    for case in run.cases:
        verdict = "[green]met[/]" if case["within_bound"] else "[red]NOT met[/]"
        cases.add_row(
            case["label"],
            f"{case['median_ms']:.3f}",
            f"{case['p99_ms']:.3f}",
            f"{case['cpu_us_per_call']:.0f}",
            f"{case['bound_ms']:g}",
            verdict,
        )
    console.print(cases)
