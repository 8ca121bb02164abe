"""Event history and dead-letter reads (seed: history, listDeadLetters), on both backends (``place``).

API §5 history, list_dead_letters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lifecycle_support import INVALID, T0, Env, env_at, expect_error
from store_places import StorePlace


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as environment:
        environment.job("agenda-a", max_attempts=1)
        environment.job("routine-b", kind="routine", max_attempts=1)
        yield environment


def event_ids(events: list[Any]) -> list[int]:
    return [event.event_id for event in events]


def test_history_is_newest_first_with_the_seed_shape(env: Env) -> None:
    occurrence = env.running()
    env.succeed(occurrence, result={"ok": True})
    events = env.store.history()
    assert event_ids(events) == [5, 4, 3, 2, 1]
    assert events[0].to_dict() == {
        "eventId": 5,
        "jobId": "agenda-a",
        "occurrenceId": occurrence.id,
        "type": "occurrence_succeeded",
        "occurredAt": env.now,
        "ownerId": "w1",
        "fence": 1,
        "data": {"attempt": 1, "maxAttempts": 1},
    }
    assert events[-1].to_dict() == {
        "eventId": 1,
        "jobId": "agenda-a",
        "occurrenceId": None,
        "type": "job_created",
        "occurredAt": T0 + 1000,
        "ownerId": None,
        "fence": None,
        "data": {"revision": 1},
    }


def test_history_filters_by_occurrence_and_job(env: Env) -> None:
    a = env.running("agenda-a", "x")
    b = env.enqueue("routine-b", "x")
    assert [e.type for e in env.store.history(occurrence_id=a.id)] == [
        "occurrence_claimed",
        "occurrence_enqueued",
    ]
    assert [e.type for e in env.store.history(job_id="routine-b")] == ["occurrence_enqueued", "job_created"]
    assert [e.occurrence_id for e in env.store.history(occurrence_id=b.id, job_id="routine-b")] == [b.id]
    assert env.store.history(occurrence_id=a.id, job_id="routine-b") == []
    assert env.store.history(occurrence_id="occ_none") == []
    assert env.store.history(occurrence_id=None, job_id=None) == env.store.history()


def test_history_limit_defaults_to_50_and_clamps_to_200(env: Env) -> None:
    env.tick()
    env.store.enqueue_many(
        [{"job_id": "agenda-a", "scheduled_for": T0 + i, "trigger_key": f"k{i}"} for i in range(230)]
    )
    assert len(env.store.history()) == 50
    assert len(env.store.history(limit=1)) == 1
    assert len(env.store.history(limit=201)) == 200
    assert len(env.store.history(limit=10**12)) == 200
    newest = env.store.history(limit=3)
    assert event_ids(newest) == [232, 231, 230]


@pytest.mark.parametrize("limit", [0, -1, True, 1.0, "5", None, 2**53])
def test_history_limit_must_be_a_positive_int(env: Env, limit: Any) -> None:
    expect_error(INVALID, lambda: env.store.history(limit=limit))
    expect_error(INVALID, lambda: env.store.list_dead_letters(limit=limit))


@pytest.mark.parametrize("value", ["", " ", "a\u0000", 5, "x" * 257])
def test_history_filters_are_identifiers(env: Env, value: Any) -> None:
    expect_error(INVALID, lambda: env.store.history(occurrence_id=value))
    expect_error(INVALID, lambda: env.store.history(job_id=value))
    expect_error(INVALID, lambda: env.store.list_dead_letters(job_id=value))


def test_list_dead_letters_newest_settlement_first(env: Env) -> None:
    first = env.fail(env.running("agenda-a", "1"))
    second = env.fail(env.running("routine-b", "1"), error={"code": "X"})
    with env.store.transaction() as tx:  # two dead letters settled at the same instant
        env.tick()
        same = [
            tx.claim_occurrence(
                occurrence_id=tx.enqueue_occurrence(
                    job_id="agenda-a", scheduled_for=T0 + i, trigger_key=f"s{i}"
                ).id,
                owner_id="w",
                lease_ms=1000,
            )
            for i in range(2)
        ]
        for claimed in same:
            assert claimed is not None
            tx.settle(occurrence_id=claimed.id, owner_id="w", fence=1, outcome="failed")
    letters = env.store.list_dead_letters()
    tied = sorted(o.id for o in same if o is not None)
    assert [o.id for o in letters] == [*tied, second.id, first.id]
    assert letters[-1] == first.replace(deduplicated=None)
    assert letters[-1].to_dict()["lastError"] == {"code": "execution_failed", "message": "Execution failed"}
    assert [o.id for o in env.store.list_dead_letters(job_id="routine-b")] == [second.id]
    assert [o.id for o in env.store.list_dead_letters(limit=1)] == [tied[0]]
    assert env.store.list_dead_letters(job_id="nobody") == []


def test_reads_on_a_closed_store_check_the_store_first(env: Env) -> None:
    """Seed: history/listDeadLetters/getOccurrence call _assertOpen() before reading arguments."""
    env.store.close()
    expect_error("SCHEDULER_STORE_CLOSED", lambda: env.store.history(limit=0))
    expect_error("SCHEDULER_STORE_CLOSED", lambda: env.store.history())
    expect_error("SCHEDULER_STORE_CLOSED", lambda: env.store.list_dead_letters())
    expect_error("SCHEDULER_STORE_CLOSED", lambda: env.store.get_occurrence("occ_x"))
    env.reopen()
