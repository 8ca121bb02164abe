"""An idle ``scheduler worker`` process on PostgreSQL is woken by ``LISTEN/NOTIFY`` (API §9): an
enqueue runs at once although the worker polls every 10 s. (SQLite has no NOTIFY: workers poll
there, ``tests/test_worker_runtime.py``; the rest of the worker process's behaviour on both
backends: ``tests/conformance/test_worker_processes.py``.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from backends import PostgresServer
from store_places import PostgresSchemaPlace
from worker_process_support import start_worker, status_of, stop

from tests.worker_support import HANDLER_KINDS, HANDLERS, add_job, enqueue, wait_for


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "handlers_module.py").write_text(HANDLERS)
    return tmp_path


@pytest.fixture
def database(postgres_server: PostgresServer, pg_schema: str) -> PostgresSchemaPlace:
    place = PostgresSchemaPlace(postgres_server, pg_schema)
    with place.open() as store:
        for kind in HANDLER_KINDS:
            add_job(store, kind, max_attempts=3)
    return place


def test_an_idle_worker_process_is_woken_by_an_enqueue(home: Path, database: PostgresSchemaPlace) -> None:
    """The worker process LISTENs on PostgreSQL: an enqueue runs at once although it polls every 10 s."""
    process = start_worker(home, database, "--poll-min-ms", "10000", "--poll-max-ms", "10000")
    try:
        time.sleep(2)  # started, polled once, found nothing: now waiting 10 s
        with database.open() as store:
            started = time.monotonic()
            woken = enqueue(store, "ok", "wake-up")
        wait_for(lambda: status_of(database, woken)[0] == "succeeded", 30, "the enqueued occurrence")
        latency = time.monotonic() - started
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    print(f"enqueue -> succeeded in {latency * 1000:.0f} ms (worker polling every 10 s)")
    assert latency < 5, latency  # woken by NOTIFY, not by the next poll (noisy machine: generous)
