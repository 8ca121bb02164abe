"""Storage failures become SCHEDULER_STORAGE_UNAVAILABLE with a truthful commitState (seed: _write)."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_support import AUTHORITY, T0, Env, env_at, expect_error
from sqlalchemy import event

from scheduler import SchedulerKernelError, open_store

UNAVAILABLE = "SCHEDULER_STORAGE_UNAVAILABLE"
BIG = "x" * 20_000


def cap_database(env: Env, spare_pages: int) -> None:
    """Let the store's connection grow the file by only ``spare_pages`` pages (real SQLITE_FULL)."""
    connection = env.store.connection
    pages = int(connection.exec_driver_sql("PRAGMA page_count").scalar_one())
    connection.exec_driver_sql(f"PRAGMA max_page_count = {pages + spare_pages}")
    connection.commit()


def assert_consistent(path: Path) -> dict[str, int]:
    """Reopen cleanly and check that no occurrence lacks its events (and no event its occurrence)."""
    store = open_store(path, clock=lambda: T0)
    store.close()
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        orphans = connection.execute(
            "SELECT o.occurrence_id FROM occurrences o WHERE NOT EXISTS (SELECT 1 FROM events e "
            "WHERE e.occurrence_id = o.occurrence_id AND e.event_type = 'occurrence_enqueued')"
        ).fetchall()
        assert orphans == []
        claimed_without_event = connection.execute(
            "SELECT o.occurrence_id FROM occurrences o WHERE o.fence > 0 AND NOT EXISTS "
            "(SELECT 1 FROM events e WHERE e.occurrence_id = o.occurrence_id AND e.fence = o.fence "
            "AND e.event_type IN ('occurrence_claimed', 'occurrence_reclaimed'))"
        ).fetchall()
        assert claimed_without_event == []
        counts = {
            table: int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            for table in ("occurrences", "events")
        }
        enqueued = connection.execute("SELECT count(*) FROM events WHERE event_type = 'occurrence_enqueued'")
        assert enqueued.fetchone()[0] == counts["occurrences"]
        return counts
    finally:
        connection.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with env_at(tmp_path) as environment:
        environment.job("agenda-a")
        yield environment


def test_sqlite_full_during_enqueue_is_not_committed(env: Env) -> None:
    cap_database(env, spare_pages=8)
    succeeded: list[str] = []
    with pytest.raises(SchedulerKernelError) as caught:
        for index in range(500):
            occurrence = env.enqueue(trigger_key=f"k{index}", payload={"big": BIG})
            succeeded.append(occurrence.id)
    error = caught.value
    assert error.code == UNAVAILABLE
    assert error.details == {
        "phase": "write",
        "storageCode": "SQLITE_FULL",
        "commitState": "not_committed",
        "retryable": False,
    }
    assert isinstance(error.__cause__, Exception)
    assert succeeded  # some writes fit before the cap
    env.store.close()
    counts = assert_consistent(env.path)
    assert counts["occurrences"] == len(succeeded)


def test_sqlite_full_rolls_back_a_whole_batch(env: Env) -> None:
    for index in range(3):
        env.enqueue(trigger_key=f"small{index}")
    claimed = env.store.claim_batch(owner_id="w", lease_ms=60_000, limit=3)
    cap_database(env, spare_pages=6)
    before = env.dump()
    error = expect_error(
        UNAVAILABLE,
        lambda: env.store.enqueue_many(
            [
                {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": f"b{i}", "payload": [BIG]}
                for i in range(40)
            ]
        ),
    )
    assert error.details["commitState"] == "not_committed"  # type: ignore[index]
    error = expect_error(
        UNAVAILABLE,
        lambda: env.store.settle_many(
            [
                {
                    "occurrence_id": o.id,
                    "owner_id": "w",
                    "fence": 1,
                    "outcome": "succeeded",
                    "result": [BIG] * 20,
                }
                for o in claimed
            ]
        ),
    )
    assert error.details["storageCode"] == "SQLITE_FULL"  # type: ignore[index]
    assert env.dump() == before
    env.store.close()
    assert assert_consistent(env.path)["occurrences"] == 3


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "ENOSPC"),
        (OSError(errno.EROFS, "Read-only file system"), "EROFS"),
        (OSError(errno.EIO, "I/O error"), "EIO"),
    ],
)
def test_os_errors_anywhere_in_the_cause_chain_are_classified(
    tmp_path: Path, failure: OSError, code: str
) -> None:
    """A failure raised inside the transaction body (here: by the clock) after BEGIN IMMEDIATE."""
    state = {"fail": False}

    def clock() -> int:
        if state["fail"]:
            try:
                raise failure
            except OSError as cause:
                raise RuntimeError("wrapped by an adapter") from cause
        return T0

    store = open_store(tmp_path / "io.sqlite", clock=clock)
    try:
        store.create_job(id="agenda-a", kind="agenda", authority=AUTHORITY)
        state["fail"] = True
        with pytest.raises(SchedulerKernelError) as caught:
            store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="k")
        assert caught.value.code == UNAVAILABLE
        assert caught.value.details == {
            "phase": "write",
            "storageCode": code,
            "commitState": "not_committed",
            "retryable": False,
        }
        state["fail"] = False
        assert (
            store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="k").deduplicated
            is False
        )
    finally:
        store.close()


@pytest.mark.parametrize("name", ["SQLITE_IOERR_WRITE", "SQLITE_READONLY", "SQLITE_FULL"])
def test_sqlite_error_names_are_classified(tmp_path: Path, name: str) -> None:
    store = open_store(tmp_path / "names.sqlite", clock=lambda: T0)

    def fail(*args: Any) -> None:
        error = sqlite3.OperationalError("simulated")
        error.sqlite_errorname = name  # type: ignore[attr-defined]
        raise error

    try:
        store.create_job(id="agenda-a", kind="agenda", authority=AUTHORITY)
        event.listen(store.connection, "before_cursor_execute", fail)
        error = expect_error(
            UNAVAILABLE,
            lambda: store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="k"),
        )
        assert error.details["storageCode"] == name.split("_WRITE")[0]  # type: ignore[index]
        event.remove(store.connection, "before_cursor_execute", fail)
    finally:
        store.close()


def test_a_failure_at_commit_has_an_unknown_commit_state(env: Env) -> None:
    def fail_commit(connection: Any) -> None:
        raise OSError(errno.EIO, "I/O error during commit")

    occurrence = env.enqueue(trigger_key="before")
    event.listen(env.store.connection, "commit", fail_commit)
    try:
        error = expect_error(
            UNAVAILABLE,
            lambda: env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=1000),
        )
    finally:
        event.remove(env.store.connection, "commit", fail_commit)
    assert error.details == {
        "phase": "write",
        "storageCode": "EIO",
        "commitState": "unknown",
        "retryable": False,
    }
    # the commit did not happen here, and the store recovers
    assert env.store.get_occurrence(occurrence.id).status == "queued"  # type: ignore[union-attr]
    assert env.store.claim_next(owner_id="w", lease_ms=1000) is not None


def test_other_exceptions_are_not_storage_failures(tmp_path: Path) -> None:
    state = {"fail": False}

    def clock() -> int:
        if state["fail"]:
            raise ValueError("not a storage problem")
        return T0

    store = open_store(tmp_path / "other.sqlite", clock=clock)
    try:
        store.create_job(id="agenda-a", kind="agenda", authority=AUTHORITY)
        state["fail"] = True
        with pytest.raises(ValueError):
            store.claim_next(owner_id="w", lease_ms=1000)
    finally:
        store.close()
