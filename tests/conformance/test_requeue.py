"""Dead-letter requeue (schema v6), end to end with claims, on both backends (``place``).

API §5 Runtime control (v6): requeue_dead_letter.
"""

from __future__ import annotations

from typing import Any

import pytest
from governance_support import (
    Env,
    claim,
    create_job,
    env_at,
    expect_error,
    running,
    settle_failed,
    settle_succeeded,
)
from store_places import StorePlace

from scheduler.store.records import Occurrence

INVALID = "SCHEDULER_INVALID_ARGUMENT"
EVIDENCE = "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT"
SYNC_FAILED = {"code": "COWORK_SYNC_FAILED", "httpStatus": 409}


@pytest.fixture
def env(place: StorePlace) -> Any:
    with env_at(place) as environment:
        create_job(environment, "cowork-sync", kind="cowork-cron", max_attempts=1)
        yield environment


def dead_letter(env: Env, trigger: str = "t1", error: Any = None) -> Occurrence:
    occurrence = running(env, "cowork-sync", trigger)
    dead = settle_failed(env, occurrence, SYNC_FAILED if error is None else error)
    assert dead.status == "dead_letter"
    return dead


def requeue(env: Env, occurrence: Occurrence, request_id: str = "requeue-1", **change: Any) -> Any:
    env.tick()
    arguments: dict[str, Any] = {
        "occurrence_id": occurrence.id,
        "expected_fence": occurrence.fence,
        "expected_error_code": "COWORK_SYNC_FAILED",
        "request_id": request_id,
    }
    arguments.update(change)
    return env.store.requeue_dead_letter(**arguments)


def test_a_dead_letter_goes_back_to_retry_wait(env: Env) -> None:
    dead = dead_letter(env)
    result = requeue(env, dead)
    occurrence = result.occurrence
    assert (result.request_id, result.deduplicated) == ("requeue-1", False)
    assert (occurrence.status, occurrence.available_at, occurrence.updated_at, occurrence.settled_at) == (
        "retry_wait",
        env.now,
        env.now,
        None,
    )
    assert (occurrence.attempt, occurrence.max_attempts, occurrence.fence) == (1, 1, 1)
    assert occurrence.last_error == SYNC_FAILED  # the evidence stays visible until the retry settles
    assert result.to_dict() == {
        "occurrence": occurrence.to_dict(),
        "requestId": "requeue-1",
        "deduplicated": False,
    }
    assert env.dump()["tables"]["scheduler_occurrence_retries"] == [
        {
            "occurrence_id": dead.id,
            "request_id": "requeue-1",
            "expected_fence": 1,
            "expected_error_code": "COWORK_SYNC_FAILED",
            "created_at": env.now,
            "claimed_at": None,
        }
    ]
    event = env.events(dead.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"], event["occurredAt"]) == (
        "occurrence_requeued",
        None,
        1,
        env.now,
    )
    assert event["data"] == {"requestId": "requeue-1", "expectedErrorCode": "COWORK_SYNC_FAILED"}
    assert env.store.list_dead_letters() == []


def test_the_requeued_claim_does_not_consume_an_attempt(env: Env) -> None:
    dead = dead_letter(env)
    requeue(env, dead)
    env.tick()
    claimed = env.store.claim_next(owner_id="w2", lease_ms=600_000)
    assert claimed is not None
    assert (claimed.id, claimed.attempt, claimed.max_attempts, claimed.fence) == (dead.id, 1, 1, 2)
    event = env.events(dead.id)[-1]
    assert (event["type"], event["data"]) == (
        "occurrence_claimed",
        {"attempt": 1, "previousOwner": None, "previousStatus": "retry_wait", "retryRequestId": "requeue-1"},
    )
    [row] = env.dump()["tables"]["scheduler_occurrence_retries"]
    assert row["claimed_at"] == env.now
    settle_succeeded(env, claimed, {"synced": True})
    assert env.store.get_occurrence(dead.id).status == "succeeded"  # type: ignore[union-attr]


def test_a_targeted_claim_consumes_the_request_once(env: Env) -> None:
    dead = dead_letter(env)
    requeue(env, dead)
    claimed = claim(env, dead.id, owner="w2")
    assert (claimed.attempt, claimed.fence) == (1, 2)
    assert env.events(dead.id)[-1]["data"] == {
        "attempt": 1,
        "previousOwner": None,
        "previousStatus": "retry_wait",
        "targeted": True,
        "retryRequestId": "requeue-1",
    }
    failed = settle_failed(env, claimed, SYNC_FAILED)
    assert failed.status == "dead_letter"  # the retry was the one granted run
    env.tick()
    assert env.store.claim_occurrence(occurrence_id=dead.id, owner_id="w3", lease_ms=60_000) is None
    second = requeue(env, failed, "requeue-2")
    assert second.deduplicated is False
    assert claim(env, dead.id, owner="w3").fence == 3


def test_a_requeue_with_attempts_left_keeps_the_attempt_count(place: StorePlace) -> None:
    with env_at(place) as env:
        create_job(env, "cowork-sync", kind="cowork-cron", max_attempts=3)
        occurrence = running(env, "cowork-sync", "t1")
        dead = settle_failed(env, occurrence, SYNC_FAILED, retryable=False)
        assert (dead.status, dead.attempt) == ("dead_letter", 1)
        requeue(env, dead)
        assert claim(env, dead.id, owner="w2").attempt == 1


def test_requeue_is_idempotent_by_request_id(env: Env) -> None:
    dead = dead_letter(env)
    first = requeue(env, dead)
    before = env.dump()
    again = requeue(env, dead)
    assert again.deduplicated is True and again.request_id == "requeue-1"
    assert again.occurrence == first.occurrence
    assert env.dump() == before
    claimed = claim(env, dead.id, owner="w2")
    replay = requeue(env, dead)  # the request stays answered with the current occurrence
    assert (replay.deduplicated, replay.occurrence) == (True, claimed)


@pytest.mark.parametrize(
    "change",
    [
        {"expected_fence": 2},
        {"expected_error_code": "OTHER_CODE"},
    ],
)
def test_a_replayed_request_with_other_evidence_conflicts(env: Env, change: dict[str, Any]) -> None:
    dead = dead_letter(env)
    requeue(env, dead)
    before = env.dump()
    error = expect_error("SCHEDULER_REQUEUE_CONFLICT", lambda: requeue(env, dead, **change))
    assert (error.message, error.details) == ("Scheduler retry request evidence changed", None)
    assert env.dump() == before


def test_a_request_id_belongs_to_one_occurrence(env: Env) -> None:
    first = dead_letter(env, "t1")
    second = dead_letter(env, "t2")
    requeue(env, first)
    expect_error("SCHEDULER_REQUEUE_CONFLICT", lambda: requeue(env, second))
    assert requeue(env, second, "requeue-other").deduplicated is False


def test_the_dead_letter_evidence_is_compared(env: Env) -> None:
    dead = dead_letter(env)
    before = env.dump()
    error = expect_error(EVIDENCE, lambda: requeue(env, dead, expected_fence=2))
    assert error.details == {
        "status": "dead_letter",
        "expectedFence": 2,
        "actualFence": 1,
        "expectedErrorCode": "COWORK_SYNC_FAILED",
        "actualErrorCode": "COWORK_SYNC_FAILED",
    }
    error = expect_error(EVIDENCE, lambda: requeue(env, dead, expected_error_code="TIMEOUT"))
    assert error.details["actualErrorCode"] == "COWORK_SYNC_FAILED"
    assert error.message == f"Scheduler dead-letter evidence changed: {dead.id}"
    assert env.dump() == before


def test_only_dead_letters_can_be_requeued(env: Env) -> None:
    live = running(env, "cowork-sync", "live")
    error = expect_error(EVIDENCE, lambda: requeue(env, live))
    assert error.details == {
        "status": "running",
        "expectedFence": 1,
        "actualFence": 1,
        "expectedErrorCode": "COWORK_SYNC_FAILED",
        "actualErrorCode": None,
    }
    expect_error("SCHEDULER_NOT_FOUND", lambda: requeue(env, live.replace(id="occ_missing")))


@pytest.mark.parametrize(
    ("error", "actual"), [("plain text", None), ({"message": "no code"}, None), ({"code": 7}, 7)]
)
def test_errors_without_a_string_code_never_match(env: Env, error: Any, actual: Any) -> None:
    dead = dead_letter(env, error=error)
    failure = expect_error(EVIDENCE, lambda: requeue(env, dead, expected_error_code="7"))
    assert failure.details["actualErrorCode"] == actual


@pytest.mark.parametrize(
    "change",
    [
        {"occurrence_id": None},
        {"expected_fence": 0},
        {"expected_fence": 1.0},
        {"expected_fence": True},
        {"expected_error_code": ""},
        {"expected_error_code": "E" * 129},
        {"expected_error_code": 7},
        {"request_id": "r" * 129},
        {"request_id": " \t"},
    ],
)
def test_requeue_rejects_invalid_arguments(env: Env, change: dict[str, Any]) -> None:
    dead = dead_letter(env)
    before = env.dump()
    expect_error(INVALID, lambda: requeue(env, dead, **change))
    assert env.dump() == before


def test_identifiers_are_trimmed(env: Env) -> None:
    dead = dead_letter(env)
    result = requeue(env, dead, " requeue-1 ", expected_error_code="\u3000COWORK_SYNC_FAILED ")
    assert result.request_id == "requeue-1"
    assert requeue(env, dead).deduplicated is True
