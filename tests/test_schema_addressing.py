"""Every statement of the store reaches the scheduler's tables through the configured schema.

The application's own tables named ``jobs``, ``events``, ``occurrences`` and ``migrations`` sit
next to the scheduler's (SQLite: in ``main`` while the scheduler lives in an attached database;
PostgreSQL: in ``public`` while the scheduler lives in its own schema). A workload touching every
kind of statement (jobs, enqueue, claims with the expiry sweep, authority, settle, history,
requeue, pause, dead letters, dump) runs through ``open_store(..., schema=…)`` and through
``SchedulerStore.on_connection(conn, schema=…)``; the application's rows must be byte-for-byte
what they were, and the scheduler's rows must be in the scheduler's schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import NullPool

from scheduler import SchedulerStore, open_store
from scheduler.schema import initialize_or_upgrade
from scheduler.testing import dump_tables

T0 = 1767225600000
KERNEL = "kernel"
AUTHORITY = {
    "principal": {"type": "user", "id": "user-alice"},
    "workspaceId": "ws-main",
    "requestedCapabilities": ["calendar.read"],
}
APP_TABLES = {
    "jobs": "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, title TEXT NOT NULL)",
    "events": "CREATE TABLE events (event_id INTEGER PRIMARY KEY, what TEXT NOT NULL)",
    "occurrences": "CREATE TABLE occurrences (occurrence_id TEXT PRIMARY KEY, status TEXT)",
    "migrations": "CREATE TABLE migrations (version INTEGER PRIMARY KEY, name TEXT)",
}
APP_ROWS = {
    "jobs": "INSERT INTO jobs VALUES ('job-1', 'the application''s job')",
    "events": "INSERT INTO events VALUES (1, 'signed up')",
    "occurrences": "INSERT INTO occurrences VALUES ('occ-1', 'queued')",
    "migrations": "INSERT INTO migrations VALUES (1, 'app_initial')",
}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def create_app_tables(connection: Connection) -> None:
    for name, ddl in APP_TABLES.items():
        connection.exec_driver_sql(ddl)
        connection.exec_driver_sql(APP_ROWS[name])


def app_rows(connection: Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [tuple(row) for row in connection.exec_driver_sql(f"SELECT * FROM {name} ORDER BY 1")]
        for name in APP_TABLES
    }


def exercise(store: SchedulerStore, clock: Clock) -> dict[str, Any]:
    """One call of (nearly) every kind of statement the store runs; what they returned."""
    store.create_job(id="job-1", kind="email", authority=AUTHORITY, payload={"n": 1}, max_attempts=1)
    policy = store.ensure_authority_policy(AUTHORITY)
    first = store.enqueue_occurrence(job_id="job-1", scheduled_for=T0, trigger_key="manual:1")
    store.enqueue_occurrence_once_per_trigger(job_id="job-1", scheduled_for=T0 + 1, trigger_key="manual:2")
    claimed = store.claim_next(owner_id="worker-a", lease_ms=1000, workspace_id="ws-main")
    assert claimed is not None and claimed.id == first.id
    store.reserve_authority(occurrence_id=claimed.id, policy_revision=policy.revision)
    store.renew(occurrence_id=claimed.id, owner_id="worker-a", fence=claimed.fence, lease_ms=1000)
    settled = store.settle(
        occurrence_id=claimed.id, owner_id="worker-a", fence=claimed.fence, outcome="succeeded"
    )
    clock.now += 1
    second = store.claim_next(owner_id="worker-b", lease_ms=1000, job_kind="email")
    assert second is not None
    clock.now += 5000  # the lease of a final attempt expires: the next claim's sweep dead-letters it
    assert store.claim_next(owner_id="worker-c", lease_ms=1000) is None
    dead = store.list_dead_letters(job_id="job-1")
    requeued = store.requeue_dead_letter(
        occurrence_id=second.id,
        expected_fence=second.fence,
        expected_error_code=dead[0].last_error["code"],
        request_id="req-1",
    )
    again = store.claim_occurrence(occurrence_id=second.id, owner_id="worker-d", lease_ms=1000)
    assert again is not None
    return {
        "settled": settled.to_dict(),
        "dead": [occurrence.to_dict() for occurrence in dead],
        "requeued": requeued.occurrence.to_dict(),
        "history": [event.to_dict() for event in store.history(job_id="job-1")],
        "job": store.get_job("job-1").to_dict(),  # type: ignore[union-attr]
        "schema_version": store.schema_info().schema_version,
        "dump": dump_tables(store),
    }


def check_scheduler_rows(result: dict[str, Any]) -> None:
    dump = result["dump"]
    assert [row["job_id"] for row in dump["jobs"]] == ["job-1"]
    assert len(dump["occurrences"]) == 2
    assert len(dump["events"]) == len(result["history"]) >= 8
    assert [row["version"] for row in dump["migrations"]] == [1, 2, 3, 4, 5, 6]
    assert result["schema_version"] == 6
    assert result["settled"]["status"] == "succeeded"
    assert result["requeued"]["status"] == "retry_wait"


# ----------------------------------------------------------------- SQLite: an attached database


@pytest.fixture
def attached_engine(tmp_path: Path) -> Iterator[Engine]:
    """An application database (``main``) with the kernel file attached as ``kernel``.

    The engine has no events (a ``creator`` attaches), so the store's fast path is usable.
    """
    app, kernel = tmp_path / "app.sqlite", tmp_path / "kernel.sqlite"

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(app, isolation_level=None, check_same_thread=False)
        connection.execute(f"ATTACH DATABASE '{kernel}' AS {KERNEL}")
        connection.execute("PRAGMA foreign_keys = ON")  # open_store refuses an app connection without
        return connection

    engine = create_engine("sqlite://", creator=connect, poolclass=NullPool)
    with engine.connect() as connection:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        create_app_tables(connection)
        initialize_or_upgrade(connection, now=T0, schema=KERNEL)
        connection.commit()
    yield engine
    engine.dispose()


def test_sqlite_open_store_in_an_attached_database(attached_engine: Engine) -> None:
    with attached_engine.connect() as connection:
        before = app_rows(connection)
    clock = Clock()
    with open_store(attached_engine, schema=KERNEL, clock=clock) as store:
        result = exercise(store, clock)
    check_scheduler_rows(result)
    with attached_engine.connect() as connection:
        assert app_rows(connection) == before


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sqlalchemy-execution"])
def test_sqlite_on_connection_in_an_attached_database(attached_engine: Engine, fast_path: bool) -> None:
    clock = Clock()
    with attached_engine.connect() as connection:
        before = app_rows(connection)
        connection.rollback()
        if not fast_path:  # an execution listener: every statement goes through SQLAlchemy
            event.listen(connection, "before_cursor_execute", lambda *_args: None)
        with connection.begin():
            store = SchedulerStore.on_connection(connection, schema=KERNEL, clock=clock)
            assert (store._runner._usable_fastpath() is not None) == fast_path  # type: ignore[attr-defined]
            result = exercise(store, clock)
        check_scheduler_rows(result)
        assert app_rows(connection) == before
        assert connection.get_execution_options() == {}  # the caller's connection is not altered
