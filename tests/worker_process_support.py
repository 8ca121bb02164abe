"""Helpers for tests that run ``scheduler`` commands and ``scheduler worker`` processes on a
``place`` (a SQLite file or a PostgreSQL schema): the ``--db`` options naming it, reads of an
occurrence's row and events on a connection of their own, and a worker process started on it.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from process_support import start_scheduler, stop_gracefully
from store_places import PostgresSchemaPlace, StorePlace
from typer.testing import CliRunner

from scheduler.cli import app
from scheduler.schema.target import quote_identifier

runner = CliRunner()


def db_options(place: StorePlace) -> list[str]:
    """The global ``--db`` (and ``--schema``) naming ``place``: ``scheduler [these] COMMAND …``."""
    if isinstance(place, PostgresSchemaPlace):
        url = place.server.url.render_as_string(hide_password=False)
        return ["--db", url, "--schema", place.schema]
    return ["--db", str(place.path)]


def status_of(place: StorePlace, occurrence_id: str) -> tuple[Any, ...]:
    rows = place.sql(
        "SELECT status, attempt, available_at, updated_at, last_error_json, result_json FROM occurrences"
        " WHERE occurrence_id = ?",
        (occurrence_id,),
    )
    return tuple(rows[0])


def events_of(place: StorePlace, occurrence_id: str) -> list[tuple[Any, ...]]:
    """``(event_type, fence, occurred_at, data)`` in event order."""
    rows = place.sql(
        "SELECT event_type, fence, occurred_at, data_json FROM events"
        " WHERE occurrence_id = ? ORDER BY event_id",
        (occurrence_id,),
    )
    return [(row[0], row[1], row[2], json.loads(row[3])) for row in rows]


def cli(place: StorePlace, *args: str) -> Any:
    """``scheduler … --json`` on ``place``; the parsed output (exit code 0 asserted)."""
    result = runner.invoke(app, [*db_options(place), *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@contextmanager
def writes_blocked(place: StorePlace, occurrence_id: str) -> Iterator[None]:
    """Another connection keeps the occurrence from being written (renewals wait or fail):
    SQLite's write lock, or PostgreSQL's row lock on the occurrence."""
    if isinstance(place, PostgresSchemaPlace):
        with place.server.engine.begin() as connection:
            table = f"{quote_identifier(place.schema)}.occurrences"
            connection.exec_driver_sql(
                f"SELECT 1 FROM {table} WHERE occurrence_id = %(id)s FOR UPDATE", {"id": occurrence_id}
            )
            yield
        return
    blocker = sqlite3.connect(place.path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        yield
        blocker.execute("COMMIT")
    finally:
        blocker.close()


def start_worker(home: Path, place: StorePlace, *extra: str) -> subprocess.Popen[str]:
    return start_scheduler(home, *db_options(place), "worker", "handlers_module:HANDLERS", *extra)


stop = stop_gracefully
