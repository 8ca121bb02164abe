"""The -wal file returns to a bounded size after a long reader ends, while connections stay open."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import SchedulerStore, open_store
from scheduler.backends.sqlite.checkpoints import WAL_SIZE_LIMIT_BYTES, wal_size

T0 = 1767225600000
CYCLES = 1000


@pytest.fixture
def busy_store(tmp_path: Path) -> Iterator[tuple[SchedulerStore, Path]]:
    path = tmp_path / "wal.sqlite"
    store = open_store(path, clock=lambda: T0 + 10_000)
    store.create_job(id="job", kind="k", authority={"principal": {"type": "user", "id": "u"}})
    store.enqueue_many(
        [{"job_id": "job", "scheduled_for": T0 + i, "trigger_key": f"t{i}"} for i in range(2 * CYCLES + 200)]
    )
    try:
        yield store, path
    finally:
        store.close()


def run_cycles(store: SchedulerStore, count: int) -> None:
    held = store.claim_next(owner_id="w", lease_ms=60_000)
    for _ in range(count):
        assert held is not None
        held = store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
        ).claimed
    assert held is not None
    store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")


def grow_behind_a_reader(store: SchedulerStore, path: Path) -> sqlite3.Connection:
    """A reader holds a read transaction while the worker runs CYCLES cycles; the WAL grows."""
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM occurrences").fetchone()
    run_cycles(store, CYCLES)
    assert wal_size(path) > WAL_SIZE_LIMIT_BYTES  # nothing could be checkpointed past the reader
    return reader


def test_a_long_reader_grows_the_wal_and_continued_work_brings_it_back(
    busy_store: tuple[SchedulerStore, Path],
) -> None:
    store, path = busy_store
    reader = grow_behind_a_reader(store, path)
    try:
        reader.execute("COMMIT")  # the reader ends; its connection stays open
        run_cycles(store, 200)  # the auto-checkpoint completes and the WAL restarts truncated
        assert wal_size(path) <= WAL_SIZE_LIMIT_BYTES
    finally:
        reader.close()


def test_an_idle_worker_truncates_the_wal_once_the_reader_is_gone(
    busy_store: tuple[SchedulerStore, Path],
) -> None:
    store, path = busy_store
    reader = grow_behind_a_reader(store, path)
    try:
        assert store.claim_batch(owner_id="w", lease_ms=1000, limit=1, job_kind="nothing") == []
        assert wal_size(path) > WAL_SIZE_LIMIT_BYTES  # the reader still needs the log: no waiting
        reader.execute("COMMIT")
        assert store.claim_next(owner_id="w", lease_ms=1000, job_kind="nothing") is None  # idle
        assert wal_size(path) == 0
        # Nothing was lost: every cycle is settled, the rest still queued.
        assert store.get_occurrence(store.list_occurrences_by_trigger(job_id="job", trigger_key="t0")[0].id)
        assert (
            reader.execute("SELECT count(*) FROM occurrences WHERE status = 'succeeded'").fetchone()[0]
            == CYCLES + 1
        )
    finally:
        reader.close()
