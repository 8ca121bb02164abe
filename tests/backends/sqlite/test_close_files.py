"""close() releases every connection the store owns and checkpoints the WAL (issue 15, item 3).

When the store held the last connection, only the main file remains after close() and a byte
copy of it holds every committed write. The property test runs random sequences of calls
(batches of every size included) and checks the same after each close.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hardening_support import (
    AUTHORITY,
    T0,
    database_descriptors,
    enqueue_requests,
    new_store,
    raw_rows,
    sidecars,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from scheduler import SchedulerStore, open_store
from scheduler.cli import app


def copy_counts(path: Path, tmp_path: Path) -> tuple[int, int]:
    """(occurrences, events) in a byte copy of the main file alone."""
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(path, copy)
    try:
        connection = sqlite3.connect(copy)
        try:
            return (
                connection.execute("SELECT count(*) FROM occurrences").fetchone()[0],
                connection.execute("SELECT count(*) FROM events").fetchone()[0],
            )
        finally:
            connection.close()
    finally:
        for leftover in [copy, *(copy.parent / f"{copy.name}{suffix}" for suffix in ("-wal", "-shm"))]:
            leftover.unlink(missing_ok=True)


def run_batches(store: SchedulerStore, size: int) -> None:
    store.enqueue_many(enqueue_requests(f"n{size}", size))
    claimed = store.claim_batch(owner_id="w", lease_ms=60_000, limit=size)
    store.settle_many(
        [{"occurrence_id": o.id, "owner_id": "w", "fence": o.fence, "outcome": "succeeded"} for o in claimed]
    )


@pytest.mark.parametrize("size", [1, 2, 20])
def test_close_after_batches_leaves_only_the_main_file(tmp_path: Path, size: int) -> None:
    path = tmp_path / "k.sqlite"
    store = new_store(path)
    run_batches(store, size)
    assert database_descriptors(path)  # open while the store is
    store.close()
    assert database_descriptors(path) == []
    assert sidecars(path) == []
    # 1 job_created + per occurrence: enqueued, claimed, succeeded
    assert copy_counts(path, tmp_path) == (size, 1 + 3 * size)


def test_close_with_another_reader_open_checkpoints_what_it_can_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    reader = sqlite3.connect(path)
    reader.execute("SELECT count(*) FROM jobs").fetchall()  # the reader has the WAL open, idle
    readers_own = database_descriptors(path)
    store = open_store(path, clock=lambda: T0, busy_timeout_ms=5000)
    run_batches(store, 5)
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 2  # a blocked TRUNCATE would wait for busy_timeout (5 s)
    assert database_descriptors(path) == readers_own
    assert copy_counts(path, tmp_path) == (5, 16)  # the passive checkpoint copied every frame
    reader.close()
    assert sidecars(path) == []


def test_close_never_closes_the_callers_engine(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    engine = create_engine(f"sqlite:///{path}")
    try:
        store = open_store(engine, clock=lambda: T0)
        run_batches(store, 3)
        store.close()
        with engine.connect() as connection:  # the caller's engine still works
            assert connection.execute(text("SELECT count(*) FROM occurrences")).scalar_one() == 3
        assert copy_counts(path, tmp_path) == (3, 10)  # checkpointed although the pool keeps it open
    finally:
        engine.dispose()
    assert sidecars(path) == []


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "enqueue_many", "claim_batch", "settle_many", "history"]),
        st.integers(1, 6),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_any_sequence_of_calls_then_close_leaves_a_complete_main_file(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, int]]
) -> None:
    directory = tmp_path_factory.mktemp("seq")
    path = directory / "k.sqlite"
    store = new_store(path)
    held: list[Any] = []
    for step, (operation, size) in enumerate(operations):
        if operation == "enqueue":
            store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key=f"s{step}")
        elif operation == "enqueue_many":
            store.enqueue_many(enqueue_requests(f"m{step}", size))
        elif operation == "claim_batch":
            held.extend(store.claim_batch(owner_id="w", lease_ms=60_000, limit=size))
        elif operation == "settle_many" and held:
            batch, held[:] = held[:size], held[size:]
            store.settle_many(
                [
                    {"occurrence_id": o.id, "owner_id": "w", "fence": o.fence, "outcome": "failed"}
                    for o in batch
                ]
            )
        else:
            store.history(limit=size)
    expected = (
        raw_rows(path, "SELECT count(*) FROM occurrences")[0][0],
        raw_rows(path, "SELECT count(*) FROM events")[0][0],
    )
    store.close()
    assert database_descriptors(path) == []
    assert sidecars(path) == []
    assert copy_counts(path, directory) == expected


runner = CliRunner()


def test_cli_write_commands_leave_only_the_main_file(tmp_path: Path) -> None:
    path = tmp_path / "cli.sqlite"
    for arguments in (["init"], ["upgrade"], ["demo"]):
        result = runner.invoke(app, [*arguments, "--db", str(path), "--json"])
        assert result.exit_code == 0, result.output
        assert sidecars(path) == [], arguments
    # adjudication decide opens read-write too: refused decision, still nothing left behind
    result = runner.invoke(
        app,
        [
            "adjudication", "decide", "o" * 64, "--decision", "confirmed_applied",
            "--evidence-digest", "sha256:" + "ab" * 32, "--attempt", "1", "--fence", "1",
            "--reason", "checked", "--operator", "ops", "--db", str(path), "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert sidecars(path) == []
    assert raw_rows(path, "SELECT count(*) FROM jobs")[0][0] >= 1
    # a second store on the same file: the CLI writes while it is open, and nothing is lost
    store = open_store(path, clock=lambda: T0)
    store.create_job(id="job-z", kind="agenda", authority=AUTHORITY)
    assert runner.invoke(app, ["demo", "--db", str(path)]).exit_code == 0
    store.close()
    assert sidecars(path) == []
    assert ("job-z",) in raw_rows(path, "SELECT job_id FROM jobs")
