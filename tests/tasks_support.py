"""Helpers of the Tasks tests: a ``Tasks`` object on a test place (a SQLite file or a PostgreSQL
schema), a task worker run in a thread, reads of the run rows, and the test application
(``task_app.py``) on a place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from store_places import PostgresSchemaPlace, StorePlace
from task_app import make_app

from scheduler import Tasks
from scheduler.tasks import TaskWorker
from tests.worker_support import running

FAST_POLLS: Final = {"poll_min_ms": 5, "poll_max_ms": 50}
"""Worker options for tests: idle lanes poll often (SQLite has no NOTIFY)."""


def target_of(place: StorePlace) -> tuple[str, dict[str, Any]]:
    """The URL (or path) and ``open_store`` options naming ``place``."""
    if isinstance(place, PostgresSchemaPlace):
        return place.server.url.render_as_string(hide_password=False), {"schema": place.schema}
    return str(place.path), {}


def tasks_on(place: StorePlace, **options: Any) -> Tasks:
    """A ``Tasks`` object on ``place`` (its own stores, opened on first use)."""
    target, where = target_of(place)
    return Tasks(target, **where, **options)


@contextmanager
def working(tasks: Tasks, *queues: str, **options: Any) -> Iterator[TaskWorker]:
    """A task worker of ``tasks`` running in a thread for the block (stopped and joined after)."""
    worker = tasks.worker(list(queues) or None, **{**FAST_POLLS, **options})
    with running(worker):
        yield worker


def run_row(place: StorePlace, run_id: str) -> dict[str, Any]:
    """The run's ``occurrences`` row as the database holds it (a second connection)."""
    columns = (
        "status",
        "attempt",
        "fence",
        "scheduled_for",
        "trigger_key",
        "payload_json",
        "last_error_json",
        "lease_expires_at",
    )
    rows = place.sql(f"SELECT {', '.join(columns)} FROM occurrences WHERE occurrence_id = ?", (run_id,))
    assert rows, f"no run {run_id}"
    return dict(zip(columns, rows[0], strict=True))


def count(place: StorePlace, table: str) -> int:
    return int(place.sql(f"SELECT count(*) FROM {table}")[0][0])


def application(place: StorePlace, **options: Any) -> Tasks:
    """``APP``'s ``make(...)`` on ``place``, in this process (``cap``, ``attempts``)."""
    target, where = target_of(place)
    return make_app(target, where.get("schema"), **options)


def app_environment(place: StorePlace, **values: str) -> dict[str, str]:
    """The environment ``APP`` reads: the place's URL and schema, and ``TASKS_TEST_<NAME>`` values."""
    target, where = target_of(place)
    environment = {"TASKS_TEST_URL": target, "TASKS_TEST_SCHEMA": where.get("schema", "")}
    environment.update({f"TASKS_TEST_{name.upper()}": value for name, value in values.items()})
    return environment
