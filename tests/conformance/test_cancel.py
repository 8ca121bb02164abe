"""Cancellation (API §12): every state it applies to, its errors, and what the former owner sees.

On both backends (``place``). Each error case checks that nothing was written (the whole dump).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from backends import sqlite_engine
from governance_support import (
    OUTCOME_UNKNOWN,
    Env,
    ack,
    adjudicate,
    claim,
    create_job,
    enqueue,
    env_at,
    expect_error,
    outcome_unknown_dead_letter,
    paused,
    request_pause,
    running,
    set_policy,
    settle_failed,
    settle_succeeded,
)
from recorded import T0
from store_places import SqliteFilePlace, StorePlace

from scheduler import SchedulerStore
from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import MAX_CANCEL_REASON_CHARS
from scheduler.store.records import Occurrence

INVALID = "SCHEDULER_INVALID_ARGUMENT"
LEASE_LOST = "SCHEDULER_LEASE_LOST"
CONFLICT = "SCHEDULER_CONFLICT"
CANCELLED = {"code": "CANCELLED", "message": "cancelled"}
JOB = "agenda-cancel"


@pytest.fixture
def env(place: StorePlace) -> Any:
    with env_at(place) as environment:
        set_policy(environment)
        create_job(environment, JOB, max_attempts=2)
        yield environment


def cancel(env: Env, occurrence: Occurrence | str, reason: str | None = None) -> Occurrence:
    env.tick()
    identifier = occurrence if isinstance(occurrence, str) else occurrence.id
    return env.store.cancel_occurrence(occurrence_id=identifier, reason=reason)


def tail(env: Env, occurrence_id: str, count: int = 2) -> list[dict[str, Any]]:
    return env.events(occurrence_id)[-count:]


def assert_cancelled(env: Env, cancelled: Occurrence, *, fence: int, message: str = "cancelled") -> None:
    assert (cancelled.status, cancelled.fence, cancelled.lease_owner, cancelled.lease_expires_at) == (
        "dead_letter",
        fence,
        None,
        None,
    )
    assert cancelled.last_error == {"code": "CANCELLED", "message": message}
    assert (cancelled.updated_at, cancelled.settled_at) == (env.now, env.now)
    assert env.store.get_occurrence(cancelled.id) == cancelled
    assert cancelled.id in [dead.id for dead in env.store.list_dead_letters()]
    assert cancelled.id in [dead.id for dead in env.store.list_dead_letters(job_id=cancelled.job_id)]
    assert env.store.list_adjudication_cases() == []  # not an adjudication case
    case = env.store.get_adjudication_case(cancelled.id)
    assert case is not None and not case.eligible


# --------------------------------------------------------------------------- each state


def test_a_queued_run_becomes_a_cancelled_dead_letter(env: Env) -> None:
    queued = enqueue(env, JOB, "q1")
    cancelled = cancel(env, queued)
    assert_cancelled(env, cancelled, fence=1)
    assert (cancelled.attempt, cancelled.available_at, cancelled.result) == (0, queued.available_at, None)
    assert tail(env, queued.id) == [
        {
            "eventId": tail(env, queued.id)[0]["eventId"],
            "jobId": JOB,
            "occurrenceId": queued.id,
            "type": "occurrence_cancelled",
            "occurredAt": env.now,
            "ownerId": None,
            "fence": 1,
            "data": {"reason": None, "previousStatus": "queued", "previousFence": 0, "previousOwner": None},
        },
        {
            "eventId": tail(env, queued.id)[1]["eventId"],
            "jobId": JOB,
            "occurrenceId": queued.id,
            "type": "occurrence_dead_lettered",
            "occurredAt": env.now,
            "ownerId": None,
            "fence": 1,
            "data": {"attempt": 0, "maxAttempts": 2, "reason": "cancelled"},
        },
    ]
    assert env.store.stats().dead_letters == 1


def test_dead_letter_listings_order_a_cancelled_run_by_its_settlement(env: Env) -> None:
    """``limit=1`` is answered by the walk over dead-lettering events (``dead_letters.py``), a
    larger limit than there are dead letters by the seed's sorting query: both see it."""
    failed = settle_failed(env, running(env, JOB, "f1"), {"code": "BOOM"}, retryable=False)
    cancelled = cancel(env, enqueue(env, JOB, "c1"))
    older = settle_failed(env, running(env, JOB, "f2"), {"code": "BOOM"}, retryable=False)
    newest = cancel(env, enqueue(env, JOB, "c2"))
    expected = [newest.id, older.id, cancelled.id, failed.id]
    for limit in (1, 2, 3, 4, 50):
        assert [dead.id for dead in env.store.list_dead_letters(limit=limit)] == expected[:limit]
        assert [dead.id for dead in env.store.list_dead_letters(job_id=JOB, limit=limit)] == expected[:limit]


def test_the_stored_bytes_are_canonical_json(env: Env) -> None:
    queued = enqueue(env, JOB, "q1")
    cancel(env, queued, reason="no longer wanted: «ünïcode» \U0001f600")
    tables = env.dump()["tables"]
    [row] = [row for row in tables["occurrences"] if row["occurrence_id"] == queued.id]
    assert row["last_error_json"] == '{"code":"CANCELLED","message":"no longer wanted: «ünïcode» \U0001f600"}'
    events = [event for event in tables["events"] if event["occurrence_id"] == queued.id][-2:]
    assert [event["data_json"] for event in events] == [
        canonical_json(
            {
                "reason": "no longer wanted: «ünïcode» \U0001f600",
                "previousStatus": "queued",
                "previousFence": 0,
                "previousOwner": None,
            }
        ),
        '{"attempt":0,"maxAttempts":2,"reason":"cancelled"}',
    ]


def test_a_waiting_retry_with_an_open_reservation_fails_the_reservation(env: Env) -> None:
    occurrence = running(env, JOB, "r1")
    env.tick()
    env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
    waiting = settle_failed(env, occurrence, {"code": "TRANSIENT"})
    assert waiting.status == "retry_wait"
    assert env.store.get_authority_reservation(occurrence.id).status == "reserved"  # type: ignore[union-attr]
    cancelled = cancel(env, waiting, reason="operator said so")
    assert_cancelled(env, cancelled, fence=2, message="operator said so")
    reservation = env.store.get_authority_reservation(occurrence.id)
    assert reservation is not None
    assert (reservation.status, reservation.settled_at) == ("failed", env.now)
    assert reservation.outcome == {
        "status": "dead_letter",
        "error": {"code": "CANCELLED", "message": "operator said so"},
    }
    cancelled_event, dead_event = tail(env, occurrence.id)
    assert cancelled_event["data"] == {
        "reason": "operator said so",
        "previousStatus": "retry_wait",
        "previousFence": 1,
        "previousOwner": None,
    }
    assert dead_event["data"] == {
        "attempt": 1,
        "maxAttempts": 2,
        "authorityPolicyRevision": 1,
        "authorityUnits": 1,
        "reason": "cancelled",
    }


def test_a_running_run_is_fenced_out_and_marked_outcome_unknown(env: Env) -> None:
    occurrence = running(env, JOB, "run1", owner="w1")
    cancelled = cancel(env, occurrence)
    assert_cancelled(env, cancelled, fence=2)
    assert cancelled.attempt == 1
    cancelled_event, _dead = tail(env, occurrence.id)
    assert cancelled_event["data"] == {
        "reason": None,
        "previousStatus": "running",
        "previousFence": 1,
        "previousOwner": "w1",
        "outcomeUnknown": True,
    }
    before = env.dump()
    env.tick()
    calls = {
        "renew": lambda: env.store.renew(
            occurrence_id=occurrence.id, owner_id="w1", fence=1, lease_ms=60_000
        ),
        "settle": lambda: settle_succeeded(env, occurrence, {"done": True}),
        "settle failed": lambda: settle_failed(env, occurrence, {"code": "X"}),
        "settle_and_claim": lambda: env.store.settle_and_claim(
            occurrence_id=occurrence.id, owner_id="w1", fence=1, outcome="succeeded", lease_ms=60_000
        ),
    }
    for name, call in calls.items():
        error = expect_error(LEASE_LOST, call)
        assert error.code == LEASE_LOST, name
    assert env.dump() == before


def test_an_expired_lease_is_cancelled_without_sweeping_first(env: Env) -> None:
    create_job(env, "final-attempt", max_attempts=1)
    target = running(env, "final-attempt", "e1", lease_ms=10_000)
    other = running(env, "final-attempt", "e2", lease_ms=10_000)
    env.tick(20_000)  # both leases expired on their final attempt: a claim would sweep both
    cancelled = cancel(env, target)
    assert_cancelled(env, cancelled, fence=2)
    assert tail(env, target.id)[0]["data"]["outcomeUnknown"] is True
    untouched = env.store.get_occurrence(other.id)
    assert untouched is not None and untouched.status == "running"  # not swept by the cancel
    assert env.events(other.id)[-1]["type"] == "occurrence_claimed"


def test_a_pause_requested_run_closes_its_control_and_the_owner_ack_is_lease_lost(env: Env) -> None:
    occurrence = running(env, JOB, "p1", owner="w1")
    request_pause(env, occurrence, "pause-1")
    cancelled = cancel(env, occurrence)
    assert_cancelled(env, cancelled, fence=2)
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None
    assert (control.state, control.revision, control.terminal_at) == ("terminal", 2, env.now)
    assert tail(env, occurrence.id)[1]["data"] == {
        "attempt": 1,
        "maxAttempts": 2,
        "runtimeControlTerminalized": True,
        "reason": "cancelled",
    }
    before = env.dump()
    expect_error(LEASE_LOST, lambda: ack(env, occurrence, "pause-1", expected_revision=1))
    expect_error(LEASE_LOST, lambda: ack(env, occurrence, "pause-1", expected_revision=2))
    assert env.dump() == before


def test_the_former_owners_ack_without_a_control_is_lease_lost(env: Env) -> None:
    occurrence = running(env, JOB, "p1", owner="w1")
    cancel(env, occurrence)
    before = env.dump()
    expect_error(LEASE_LOST, lambda: ack(env, occurrence, "pause-1", expected_revision=1))
    assert env.dump() == before


def test_a_paused_run_is_cancelled_and_can_be_requeued_and_claimed(env: Env) -> None:
    create_job(env, "agenda-pause", max_attempts=2)
    occurrence = paused(env, "p2")
    parked = env.store.get_occurrence(occurrence.id)
    assert parked is not None and parked.status == "retry_wait"
    cancelled = cancel(env, occurrence)
    assert_cancelled(env, cancelled, fence=2)
    assert tail(env, occurrence.id)[0]["data"]["previousStatus"] == "retry_wait"
    assert "outcomeUnknown" not in tail(env, occurrence.id)[0]["data"]
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None and control.state == "terminal"
    env.tick()
    env.store.requeue_dead_letter(
        occurrence_id=occurrence.id, expected_fence=2, expected_error_code="CANCELLED", request_id="rq-1"
    )
    again = claim(env, occurrence.id, owner="w2")
    assert (again.status, again.fence, again.attempt) == ("running", 3, 1)


def test_a_pending_adjudication_is_applied_as_by_a_dead_letter(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, JOB, "u1")
    adjudicate(env, dead.id)
    waiting = env.store.get_occurrence(dead.id)
    assert waiting is not None and waiting.status == "retry_wait"
    cancel(env, dead.id)
    adjudication = env.store.get_occurrence_adjudication(dead.id)
    assert adjudication is not None
    assert (adjudication.status, adjudication.retry_settled_at) == ("applied", env.now)
    assert adjudication.retry_outcome == {"status": "dead_letter", "error": CANCELLED}
    assert tail(env, dead.id)[1]["data"]["adjudicationRequestId"] == adjudication.request_id
    assert env.store.list_adjudication_cases() == []


def test_text_no_column_could_hold_is_kept_escaped_inside_json(env: Env) -> None:
    reason = "nul \x00, lone \ud800, <script>"
    cancelled = cancel(env, enqueue(env, JOB, "q1"), reason=reason)
    assert cancelled.last_error == {"code": "CANCELLED", "message": reason}
    [row] = [row for row in env.dump()["tables"]["occurrences"] if row["occurrence_id"] == cancelled.id]
    assert row["last_error_json"] == '{"code":"CANCELLED","message":"nul \\u0000, lone \\ud800, <script>"}'
    assert tail(env, cancelled.id)[0]["data"]["reason"] == reason


def test_a_cancel_logs_its_state_changes(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    occurrence = running(env, JOB, "log1", owner="w1")
    caplog.set_level(logging.INFO, logger="scheduler")
    caplog.clear()
    cancel(env, occurrence)
    records = [record for record in caplog.records if hasattr(record, "state")]
    assert [(r.state, r.levelno, r.occurrence, r.fence) for r in records] == [  # type: ignore[attr-defined]
        ("cancelled", logging.WARNING, occurrence.id, 2),
        ("dead-lettered", logging.WARNING, occurrence.id, 2),
    ]


# --------------------------------------------------------------------------- repeats and errors


def test_cancelling_twice_returns_it_unchanged(env: Env) -> None:
    occurrence = running(env, JOB, "twice")
    first = cancel(env, occurrence, reason="first")
    before = env.dump()
    second = cancel(env, occurrence, reason="second")
    assert second == first == env.store.get_occurrence(occurrence.id)
    assert second.last_error == {"code": "CANCELLED", "message": "first"}
    assert env.dump() == before


def test_a_succeeded_run_or_another_dead_letter_is_a_conflict(env: Env) -> None:
    done = settle_succeeded(env, running(env, JOB, "ok"), {"fine": True})
    failed = settle_failed(env, running(env, JOB, "bad"), {"code": "BOOM"}, retryable=False)
    assert failed.status == "dead_letter"
    before = env.dump()
    error = expect_error(CONFLICT, lambda: cancel(env, done))
    assert error.details == {"status": "succeeded", "errorCode": None}
    error = expect_error(CONFLICT, lambda: cancel(env, failed))
    assert error.details == {"status": "dead_letter", "errorCode": "BOOM"}
    assert env.dump() == before


def test_an_unknown_occurrence_is_not_found(env: Env) -> None:
    before = env.dump()
    expect_error("SCHEDULER_NOT_FOUND", lambda: cancel(env, "occ_missing"))
    assert env.dump() == before


@pytest.mark.parametrize(
    "arguments",
    [
        {"occurrence_id": ""},
        {"occurrence_id": None},
        {"occurrence_id": 42},
        {"occurrence_id": "x" * 257},
        {"occurrence_id": "a\x00b"},
        {"reason": 5},
        {"reason": b"bytes"},
        {"reason": ["a list"]},
        {"reason": "r" * (MAX_CANCEL_REASON_CHARS + 1)},
    ],
)
def test_bad_arguments_write_nothing(env: Env, arguments: dict[str, Any]) -> None:
    queued = enqueue(env, JOB, "q1")
    before = env.dump()
    expect_error(INVALID, lambda: env.store.cancel_occurrence(**{"occurrence_id": queued.id, **arguments}))
    assert env.dump() == before


def test_the_longest_reason_is_accepted(env: Env) -> None:
    reason = "r" * MAX_CANCEL_REASON_CHARS
    assert cancel(env, enqueue(env, JOB, "q1"), reason=reason).last_error["message"] == reason  # type: ignore[index]


def test_an_empty_reason_gives_the_default_message(env: Env) -> None:
    cancelled = cancel(env, enqueue(env, JOB, "q1"), reason="")
    assert cancelled.last_error == CANCELLED
    assert tail(env, cancelled.id)[0]["data"]["reason"] == ""


# --------------------------------------------------------------------------- requeue


def test_a_never_claimed_cancelled_run_is_requeued_and_runs(env: Env) -> None:
    queued = enqueue(env, JOB, "q1")
    assert queued.fence == 0
    cancelled = cancel(env, queued)
    env.tick()
    result = env.store.requeue_dead_letter(
        occurrence_id=queued.id,
        expected_fence=cancelled.fence,
        expected_error_code="CANCELLED",
        request_id="requeue-cancelled",
    )
    assert (result.occurrence.status, result.occurrence.fence) == ("retry_wait", 1)
    assert env.store.list_dead_letters() == []
    env.tick()
    claimed = env.store.claim_next(owner_id="w9", lease_ms=60_000)
    assert claimed is not None and (claimed.id, claimed.fence) == (queued.id, 2)
    assert settle_succeeded(env, claimed, {"ok": 1}).status == "succeeded"


def test_a_never_claimed_cancelled_run_requeued_runs_its_attempts_from_one(env: Env) -> None:
    """A run cancelled before any claim used no attempt: requeued, its first claim is attempt 1 (not
    a "free" attempt 0), it retries to ``max_attempts`` like any run, and an outcome-unknown end of it
    is an adjudication case an operator can decide (``expected_attempt`` must be positive)."""
    queued = enqueue(env, JOB, "q1")
    cancelled = cancel(env, queued)
    env.tick()
    env.store.requeue_dead_letter(
        occurrence_id=queued.id,
        expected_fence=cancelled.fence,
        expected_error_code="CANCELLED",
        request_id="rq",
    )
    first = claim(env, queued.id, owner="w1")
    assert (first.fence, first.attempt) == (2, 1)
    claimed_event = tail(env, queued.id, 1)[0]
    assert claimed_event["data"]["attempt"] == 1 and claimed_event["data"]["retryRequestId"] == "rq"
    waiting = settle_failed(env, first, {"code": "BOOM"})
    assert (waiting.status, waiting.attempt) == ("retry_wait", 1)
    env.tick(3_600_000)
    second = claim(env, queued.id, owner="w2")
    assert (second.fence, second.attempt) == (3, 2)  # the last of max_attempts=2
    dead = settle_failed(env, second, OUTCOME_UNKNOWN, retryable=False)
    assert (dead.status, dead.attempt) == ("dead_letter", 2)
    case = env.store.get_adjudication_case(queued.id)
    assert case is not None and case.eligible and case.attempt == 2
    assert adjudicate(env, queued.id).adjudication is not None


def test_a_cancelled_requeue_request_does_not_keep_the_run_from_being_pruned(env: Env) -> None:
    """Requeued, cancelled again before any claim, requeued and run: the first request, left unclaimed
    at a fence the run has moved past, can never be claimed and must not pin the run forever."""
    queued = enqueue(env, JOB, "q1")
    fence = cancel(env, queued).fence
    for request in ("rq-1", "rq-2"):
        env.tick()
        env.store.requeue_dead_letter(
            occurrence_id=queued.id, expected_fence=fence, expected_error_code="CANCELLED", request_id=request
        )
        if request == "rq-1":
            fence = cancel(env, queued).fence  # the request at fence 1 is never claimed
    assert settle_succeeded(env, claim(env, queued.id)).status == "succeeded"
    env.tick(3_600_000)
    result = env.store.prune(older_than_ms=1_000)
    assert (result.occurrences, result.requeue_requests) == (1, 2)
    assert env.store.get_occurrence(queued.id) is None


def test_a_cancelled_running_run_is_requeued_with_its_new_fence(env: Env) -> None:
    occurrence = running(env, JOB, "run1")
    cancelled = cancel(env, occurrence)
    env.tick()
    expect_error(
        "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT",
        lambda: env.store.requeue_dead_letter(
            occurrence_id=occurrence.id,
            expected_fence=1,
            expected_error_code="CANCELLED",
            request_id="rq-old",
        ),
    )
    requeued = env.store.requeue_dead_letter(
        occurrence_id=occurrence.id, expected_fence=2, expected_error_code="CANCELLED", request_id="rq-new"
    ).occurrence
    assert (requeued.status, requeued.fence, requeued.last_error) == (
        "retry_wait",
        cancelled.fence,
        CANCELLED,
    )
    again = claim(env, occurrence.id, owner="w2")
    assert (again.fence, again.attempt) == (3, 1)  # the requeued claim keeps the attempt count


# --------------------------------------------------------------------------- embedding


def test_cancel_inside_a_transaction_block_commits_or_rolls_back_with_it(env: Env) -> None:
    queued = enqueue(env, JOB, "q1")
    before = env.dump()
    with pytest.raises(RuntimeError), env.store.transaction() as tx:
        assert tx.cancel_occurrence(occurrence_id=queued.id).status == "dead_letter"
        raise RuntimeError("roll the block back")
    assert env.dump() == before
    with env.store.transaction() as tx:
        tx.cancel_occurrence(occurrence_id=queued.id, reason="in a block")
    cancelled = env.store.get_occurrence(queued.id)
    assert cancelled is not None and cancelled.last_error == {"code": "CANCELLED", "message": "in a block"}


def test_cancel_on_a_callers_connection_rolls_back_with_the_caller(env: Env, place: StorePlace) -> None:
    queued = enqueue(env, JOB, "q1")
    if isinstance(place, SqliteFilePlace):
        engine, schema, owned = sqlite_engine(place.path), None, True
    else:
        engine, schema, owned = place.server.engine, place.schema, False
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            store = SchedulerStore.on_connection(connection, clock=lambda: T0 + 99_000, schema=schema)
            assert store.cancel_occurrence(occurrence_id=queued.id).settled_at == T0 + 99_000
            seen = store.get_occurrence(queued.id)
            assert seen is not None and seen.status == "dead_letter"
            transaction.rollback()  # the caller owns the transaction
    finally:
        if owned:
            engine.dispose()
    unchanged = env.store.get_occurrence(queued.id)
    assert unchanged is not None and unchanged.status == "queued"
