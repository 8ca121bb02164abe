"""Two store handles in two processes (spawn) on one file: claims, compare-and-set, busy timeout."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_support import AUTHORITY, T0

from scheduler import SchedulerKernelError, open_store

SPAWN = multiprocessing.get_context("spawn")
OCCURRENCES = 120
LEASE = 600_000


def _open(path: str) -> Any:
    return open_store(path, clock=lambda: T0 + 60_000, busy_timeout_ms=20_000)


def claim_all_worker(path: str, mode: str, start: Any, results: Any) -> None:
    """Claim until nothing is left (``claim_next`` or ``claim_batch``), report the claimed ids."""
    store = _open(path)
    claimed: list[str] = []
    try:
        start.wait(30)
        while True:
            if mode == "batch":
                batch = store.claim_batch(
                    owner_id=f"w-{SPAWN.current_process().pid}", lease_ms=LEASE, limit=7
                )
                if not batch:
                    break
                claimed.extend(o.id for o in batch)
            else:
                occurrence = store.claim_next(owner_id=f"w-{SPAWN.current_process().pid}", lease_ms=LEASE)
                if occurrence is None:
                    break
                claimed.append(occurrence.id)
    finally:
        store.close()
        results.put(claimed)


def claim_each_worker(path: str, ids: list[str], start: Any, results: Any) -> None:
    """Targeted claims of the same ids in the same order: report the ones this process won."""
    store = _open(path)
    won: list[str] = []
    try:
        start.wait(30)
        for occurrence_id in ids:
            if store.claim_occurrence(occurrence_id=occurrence_id, owner_id="w", lease_ms=LEASE) is not None:
                won.append(occurrence_id)
    finally:
        store.close()
        results.put(won)


def update_worker(path: str, payload: int, start: Any, results: Any) -> None:
    store = _open(path)
    try:
        start.wait(30)
        try:
            job = store.update_job("agenda-a", 1, payload={"writer": payload})
            results.put(("ok", job.revision))
        except SchedulerKernelError as error:
            results.put((error.code, error.details))
    finally:
        store.close()


def lock_holder(path: str, locked: Any, release: Any) -> None:
    """Hold the write lock with a raw sqlite3 connection until told to release it."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        connection.execute("ROLLBACK")
    finally:
        connection.close()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "shared.sqlite"
    store = open_store(path, clock=lambda: T0)
    try:
        store.create_job(id="agenda-a", kind="agenda", authority=AUTHORITY)
        store.enqueue_many(
            [
                {"job_id": "agenda-a", "scheduled_for": T0 + i, "trigger_key": f"k{i}"}
                for i in range(OCCURRENCES)
            ]
        )
    finally:
        store.close()
    yield path


def run_workers(target: Any, arguments: list[tuple[Any, ...]]) -> list[Any]:
    start = SPAWN.Event()
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=target, args=(*args, start, results)) for args in arguments]
    for process in processes:
        process.start()
    start.set()
    collected = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    return collected


def all_ids(path: Path) -> set[str]:
    connection = sqlite3.connect(path)
    try:
        return {row[0] for row in connection.execute("SELECT occurrence_id FROM occurrences")}
    finally:
        connection.close()


def claim_facts(path: Path) -> tuple[list[tuple[Any, ...]], int]:
    connection = sqlite3.connect(path)
    try:
        states = connection.execute("SELECT DISTINCT status, attempt, fence FROM occurrences").fetchall()
        events = connection.execute(
            "SELECT count(*) FROM events WHERE event_type = 'occurrence_claimed'"
        ).fetchone()
        return states, int(events[0])
    finally:
        connection.close()


@pytest.mark.parametrize("mode", ["next", "batch"])
def test_claim_race_has_exactly_one_winner_per_occurrence(database: Path, mode: str) -> None:
    first, second = run_workers(claim_all_worker, [(str(database), mode), (str(database), mode)])
    assert len(first) + len(second) == OCCURRENCES
    assert not set(first) & set(second)
    assert set(first) | set(second) == all_ids(database)
    states, claimed_events = claim_facts(database)
    assert states == [("running", 1, 1)]
    assert claimed_events == OCCURRENCES


def test_targeted_claim_race_has_exactly_one_winner(database: Path) -> None:
    ids = sorted(all_ids(database))
    first, second = run_workers(claim_each_worker, [(str(database), ids), (str(database), ids)])
    assert sorted(first + second) == ids
    assert claim_facts(database) == ([("running", 1, 1)], OCCURRENCES)


def test_expected_revision_compare_and_set_holds_across_processes(database: Path) -> None:
    outcomes = run_workers(update_worker, [(str(database), 1), (str(database), 2)])
    assert sorted(outcome[0] for outcome in outcomes) == ["SCHEDULER_REVISION_CONFLICT", "ok"]
    [conflict] = [outcome for outcome in outcomes if outcome[0] != "ok"]
    assert conflict[1] == {"expectedRevision": 1, "actualRevision": 2}
    store = open_store(database, clock=lambda: T0)
    try:
        assert store.get_job("agenda-a").revision == 2  # type: ignore[union-attr]
    finally:
        store.close()


def test_busy_timeout_is_honoured(database: Path) -> None:
    store = open_store(database, clock=lambda: T0 + 60_000, busy_timeout_ms=200)
    locked, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(target=lock_holder, args=(str(database), locked, release))
    holder.start()
    try:
        assert locked.wait(30)
        started = time.monotonic()
        with pytest.raises(SchedulerKernelError) as caught:
            store.claim_next(owner_id="w", lease_ms=LEASE)
        elapsed = time.monotonic() - started
        assert caught.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert caught.value.details == {
            "phase": "write",
            "storageCode": "SQLITE_BUSY",
            "commitState": "not_committed",
            "retryable": True,  # the runner's classification: contention is retryable
        }
        assert 0.15 <= elapsed < 3.0, elapsed
    finally:
        release.set()
        holder.join(30)
    assert holder.exitcode == 0
    assert store.claim_next(owner_id="w", lease_ms=LEASE) is not None  # the store recovers
    store.close()
