"""Claims, renewals, settlements and the expired-lease sweep (seed v6), including their bookkeeping
on runtime controls, requeue requests, authority reservations and adjudications. Every test runs
on both backends (``place``).

API §5 claims, renew, settle; §7.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from backends import SQLITE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_support import AUTHORITY, INVALID, T0, Env, env_at, expect_error
from store_places import StorePlace, examples, in_transaction

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.contract.constants import MAX_SAFE_INTEGER
from scheduler.store.records import Occurrence

LEASE = 60_000
LEASE_EXPIRED = {
    "code": "lease_expired",
    "message": "Execution lease expired after the final allowed attempt",
}


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as environment:
        environment.job("agenda-a", max_attempts=2)
        yield environment


def claim_next(env: Env, owner: str = "w1", lease_ms: int = LEASE, **filters: Any) -> Occurrence | None:
    env.tick()
    return env.store.claim_next(owner_id=owner, lease_ms=lease_ms, **filters)


def control_row(env: Env, occurrence_id: str) -> dict[str, Any]:
    [row] = [r for r in env.rows("scheduler_occurrence_controls") if r["occurrence_id"] == occurrence_id]
    return row


# ------------------------------------------------------------------------------ claim_next


def test_claim_next_takes_due_work_in_seed_order(env: Env) -> None:
    later = env.enqueue(trigger_key="later", scheduled_for=T0, available_at=T0 + 2)
    early_b = env.enqueue(trigger_key="b", scheduled_for=T0 + 5, available_at=T0 + 1)
    early_a = env.enqueue(trigger_key="a", scheduled_for=T0 + 4, available_at=T0 + 1)
    tie_1 = env.enqueue(trigger_key="t1", scheduled_for=T0 + 9, available_at=T0 + 3)
    tie_2 = env.enqueue(trigger_key="t2", scheduled_for=T0 + 9, available_at=T0 + 3)
    future = env.enqueue(trigger_key="f", scheduled_for=env.now + 10**6)
    order = [o.id for o in iter(lambda: claim_next(env), None)]
    ties = sorted([tie_1.id, tie_2.id])
    assert order == [early_a.id, early_b.id, later.id, *ties]
    assert future.id not in order


def test_claim_next_is_none_before_due_and_claims_at_exactly_available_at(env: Env) -> None:
    occurrence = env.enqueue(scheduled_for=env.now + 5000)
    env.set(occurrence.available_at - 1)
    assert env.store.claim_next(owner_id="w1", lease_ms=LEASE) is None
    env.set(occurrence.available_at)
    claimed = env.store.claim_next(owner_id="w1", lease_ms=LEASE)
    assert claimed is not None
    assert (claimed.status, claimed.attempt, claimed.fence) == ("running", 1, 1)
    assert (claimed.lease_owner, claimed.lease_expires_at) == ("w1", env.now + LEASE)
    assert claimed.updated_at == env.now and claimed.deduplicated is None
    [_, event] = env.events(claimed.id)
    assert event["type"] == "occurrence_claimed"
    assert (event["ownerId"], event["fence"]) == ("w1", 1)
    assert event["data"] == {"attempt": 1, "previousOwner": None, "previousStatus": "queued"}


def test_claim_filters_by_job_kind_and_workspace(env: Env) -> None:
    env.job("cowork-c", kind="cowork-cron", authority={"principal": {"type": "service", "id": "d"}})
    env.job(
        "routine-w",
        kind="routine",
        authority={"principal": {"type": "user", "id": "u"}, "workspaceId": "ws-2"},
    )
    agenda = env.enqueue("agenda-a", "x")
    cowork = env.enqueue("cowork-c", "x")
    routine = env.enqueue("routine-w", "x")
    assert claim_next(env, job_kind="loop-iteration") is None
    assert claim_next(env, job_kind="agenda", workspace_id="ws-2") is None
    assert claim_next(env, workspace_id="ws-2").id == routine.id  # type: ignore[union-attr]
    assert claim_next(env, job_kind="cowork-cron").id == cowork.id  # type: ignore[union-attr]
    assert claim_next(env, job_kind="agenda", workspace_id="ws-main").id == agenda.id  # type: ignore[union-attr]


def test_claim_skips_disabled_jobs_until_re_enabled(env: Env) -> None:
    occurrence = env.enqueue()
    env.tick()
    env.store.update_job("agenda-a", 1, enabled=False)
    assert claim_next(env) is None
    assert env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=LEASE) is None
    env.tick()
    env.store.update_job("agenda-a", 2, enabled=True)
    assert claim_next(env).id == occurrence.id  # type: ignore[union-attr]


def test_expired_lease_is_reclaimed_with_a_new_fence(env: Env) -> None:
    first = env.running(lease_ms=5000)
    env.set(first.lease_expires_at)  # type: ignore[arg-type]
    reclaimed = env.store.claim_next(owner_id="w2", lease_ms=LEASE)
    assert reclaimed is not None
    assert (reclaimed.attempt, reclaimed.fence, reclaimed.lease_owner) == (2, 2, "w2")
    event = env.events(first.id)[-1]
    assert event["type"] == "occurrence_reclaimed"
    assert event["data"] == {"attempt": 2, "previousOwner": "w1", "previousStatus": "running"}
    expect_error("SCHEDULER_LEASE_LOST", lambda: env.succeed(first))


def test_running_rows_order_by_lease_expiry_among_waiting_rows(env: Env) -> None:
    first = env.claim(env.enqueue(trigger_key="a", scheduled_for=T0 + 50).id, lease_ms=1000)
    second = env.claim(env.enqueue(trigger_key="b", scheduled_for=T0 + 50).id, lease_ms=1000)
    expiry_a, expiry_b = first.lease_expires_at, second.lease_expires_at
    assert expiry_a is not None and expiry_b is not None
    env.set(T0 + 60_000)
    after_a = env.enqueue(trigger_key="q1", scheduled_for=T0, available_at=expiry_a + 1)
    before_b = env.enqueue(trigger_key="q2", scheduled_for=T0, available_at=expiry_b - 1)
    order = [o.id for o in iter(lambda: claim_next(env), None)]
    assert order == [first.id, after_a.id, before_b.id, second.id]


def test_final_attempt_expiry_is_dead_lettered_by_the_sweep(env: Env) -> None:
    occurrence = env.running()
    env.fail(occurrence)
    final = env.claim(occurrence.id, lease_ms=1000)
    assert final.attempt == final.max_attempts == 2
    env.set(final.lease_expires_at)  # type: ignore[arg-type]
    assert env.store.claim_next(owner_id="w9", lease_ms=LEASE) is None
    swept = env.store.get_occurrence(occurrence.id)
    assert swept is not None
    assert (swept.status, swept.last_error, swept.settled_at, swept.lease_owner) == (
        "dead_letter",
        LEASE_EXPIRED,
        env.now,
        None,
    )
    event = env.events(occurrence.id)[-1]
    assert event["type"] == "occurrence_dead_lettered"
    assert (event["ownerId"], event["fence"]) == ("w1", 2)
    assert event["data"] == {"attempt": 2, "maxAttempts": 2, "reason": "lease_expired"}
    assert [o.id for o in env.store.list_dead_letters()] == [occurrence.id]


def test_sweep_takes_at_most_100_per_claim_in_expiry_order(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    env.tick()
    env.store.enqueue_many(
        [{"job_id": "one-shot", "scheduled_for": T0 + i, "trigger_key": f"k{i}"} for i in range(101)]
    )
    env.tick()
    claimed = env.store.claim_batch(owner_id="w", lease_ms=1000, limit=101)
    assert len(claimed) == 101
    env.tick(5000)
    assert env.store.claim_next(owner_id="w2", lease_ms=LEASE) is None
    dead = env.sql("SELECT occurrence_id FROM occurrences WHERE status = 'dead_letter'")
    assert len(dead) == 100
    [(remaining,)] = env.sql("SELECT occurrence_id FROM occurrences WHERE status = 'running'")
    assert remaining == max(o.id for o in claimed)  # equal expiry: the last occurrence_id waits
    env.tick()
    assert env.store.claim_next(owner_id="w2", lease_ms=LEASE) is None
    assert env.sql("SELECT count(*) FROM occurrences WHERE status = 'running'") == [(0,)]


def test_sweep_skips_pending_pause_and_resumed_controls(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    pausing = env.running("one-shot", "p", lease_ms=1000)
    env.control(pausing.id, "pause_requested", expected_fence=1)
    plain = env.running("one-shot", "x", lease_ms=1000)
    env.tick(5000)
    reclaimed = env.store.claim_next(owner_id="w2", lease_ms=LEASE)
    assert reclaimed is not None and reclaimed.id == pausing.id
    assert (reclaimed.attempt, reclaimed.fence) == (1, 2)  # no attempt counted
    assert env.store.get_occurrence(plain.id).status == "dead_letter"  # type: ignore[union-attr]
    event = env.events(pausing.id)[-1]
    assert event["data"] == {
        "attempt": 1,
        "previousOwner": "w1",
        "previousStatus": "running",
        "pauseRequestRebound": True,
    }
    control = control_row(env, pausing.id)
    assert (control["state"], control["expected_fence"], control["revision"], control["updated_at"]) == (
        "pause_requested",
        2,
        2,
        env.now,
    )


def test_sweep_applies_a_pending_adjudication_and_fails_the_reservation(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    occurrence = env.running("one-shot", "x", lease_ms=1000)
    env.reservation(occurrence)
    env.adjudication(occurrence, "adj-7")
    env.tick(5000)
    assert env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w2", lease_ms=LEASE) is None
    outcome = {"status": "dead_letter", "error": LEASE_EXPIRED}
    [adjudication] = env.rows("scheduler_occurrence_adjudications")
    assert (adjudication["status"], adjudication["applied_at"], adjudication["retry_settled_at"]) == (
        "applied",
        env.now,
        env.now,
    )
    assert json.loads(adjudication["retry_outcome_json"]) == outcome
    [reservation] = env.rows("scheduler_authority_reservations")
    assert (reservation["status"], reservation["settled_at"]) == ("failed", env.now)
    assert json.loads(reservation["outcome_json"]) == outcome
    assert env.events(occurrence.id)[-1]["data"] == {
        "attempt": 1,
        "maxAttempts": 1,
        "reason": "lease_expired",
        "adjudicationRequestId": "adj-7",
    }


def test_sweep_without_adjudication_leaves_the_reservation(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    occurrence = env.running("one-shot", "x", lease_ms=1000)
    env.reservation(occurrence)
    env.tick(5000)
    assert claim_next(env) is None
    [reservation] = env.rows("scheduler_authority_reservations")
    assert reservation["status"] == "reserved"


# ------------------------------------------------------------------------------ requeue + controls


def test_unclaimed_requeue_request_claims_without_an_attempt(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    occurrence = env.running("one-shot", "x")
    dead = env.fail(occurrence)
    assert dead.status == "dead_letter"
    env.sql(
        "UPDATE occurrences SET status = 'retry_wait', settled_at = NULL, available_at = ? "
        "WHERE occurrence_id = ?",
        (env.now, occurrence.id),
    )
    env.retry_request(occurrence.id, "rq-old", expected_fence=5)  # another fence: ignored
    env.retry_request(occurrence.id, "rq-1", expected_fence=1)
    claimed = claim_next(env, owner="w2")
    assert claimed is not None
    assert (claimed.attempt, claimed.fence, claimed.max_attempts) == (1, 2, 1)
    assert env.events(occurrence.id)[-1]["data"] == {
        "attempt": 1,
        "previousOwner": None,
        "previousStatus": "retry_wait",
        "retryRequestId": "rq-1",
    }
    retries = {row["request_id"]: row["claimed_at"] for row in env.rows("scheduler_occurrence_retries")}
    assert retries == {"rq-old": None, "rq-1": env.now}
    # consumed, and the fence moved on: the exhausted occurrence is no longer claimable
    env.fail(claimed)
    env.sql(
        "UPDATE occurrences SET status = 'retry_wait', settled_at = NULL WHERE occurrence_id = ?",
        (claimed.id,),
    )
    assert claim_next(env) is None


def test_targeted_claim_consumes_the_earliest_requeue_request(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    occurrence = env.running("one-shot", "x")
    env.fail(occurrence)
    env.sql(
        "UPDATE occurrences SET status = 'retry_wait', settled_at = NULL WHERE occurrence_id = ?",
        (occurrence.id,),
    )
    env.retry_request(occurrence.id, "rq-b", expected_fence=1, created_at=T0 + 1)
    env.retry_request(occurrence.id, "rq-c", expected_fence=1, created_at=T0 + 2)
    env.retry_request(occurrence.id, "rq-z", expected_fence=1, created_at=T0 + 1)
    env.tick()
    claimed = env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w2", lease_ms=LEASE)
    assert claimed is not None and claimed.attempt == 1
    assert env.events(occurrence.id)[-1]["data"] == {
        "attempt": 1,
        "previousOwner": None,
        "previousStatus": "retry_wait",
        "targeted": True,
        "retryRequestId": "rq-b",
    }


def test_paused_and_pending_pause_controls_block_waiting_claims(env: Env) -> None:
    paused = env.enqueue(trigger_key="paused")
    env.control(paused.id, "paused", expected_fence=1)
    pending = env.enqueue(trigger_key="pending")
    env.control(pending.id, "pause_requested", expected_fence=1)
    assert claim_next(env) is None
    for occurrence in (paused, pending):
        env.tick()
        assert env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=LEASE) is None
    terminal = env.enqueue(trigger_key="terminal")
    env.control(terminal.id, "terminal", expected_fence=1)
    assert claim_next(env).id == terminal.id  # type: ignore[union-attr]


def test_resumed_claim_keeps_the_attempt_and_rebinds_the_fence(env: Env) -> None:
    occurrence = env.running()
    env.sql(
        "UPDATE occurrences SET status = 'retry_wait', lease_owner = NULL, lease_expires_at = NULL "
        "WHERE occurrence_id = ?",
        (occurrence.id,),
    )
    env.control(occurrence.id, "resumed", expected_fence=1, revision=3)
    claimed = claim_next(env, owner="w2")
    assert claimed is not None and (claimed.attempt, claimed.fence) == (1, 2)
    assert env.events(occurrence.id)[-1]["data"]["resumedWithoutAttempt"] is True
    control = control_row(env, occurrence.id)
    assert (control["state"], control["expected_fence"], control["revision"]) == ("resumed", 2, 4)
    # a retry moves the resumed control to the next claim's fence, which then counts an attempt
    retried = env.fail(claimed)
    assert retried.status == "retry_wait"
    control = control_row(env, occurrence.id)
    assert (control["state"], control["expected_fence"], control["revision"]) == ("resumed", 3, 5)
    again = claim_next(env, owner="w3")
    assert again is not None and (again.attempt, again.fence) == (2, 3)
    assert control_row(env, occurrence.id)["expected_fence"] == 3
    # success terminalizes it
    env.succeed(again)
    control = control_row(env, occurrence.id)
    assert (control["state"], control["terminal_at"], control["revision"]) == ("terminal", env.now, 7)
    assert env.events(occurrence.id)[-1]["data"]["runtimeControlTerminalized"] is True


def test_settle_terminalizes_a_pending_pause_request(env: Env) -> None:
    occurrence = env.running()
    env.control(occurrence.id, "pause_requested", expected_fence=1)
    retried = env.fail(occurrence, retry_at=T0)
    assert retried.status == "retry_wait"
    assert control_row(env, occurrence.id)["state"] == "terminal"
    assert env.events(occurrence.id)[-1]["data"] == {
        "attempt": 1,
        "maxAttempts": 2,
        "retryAt": env.now,
        "runtimeControlTerminalized": True,
    }


# ------------------------------------------------------------------------------ claim_occurrence


def test_claim_occurrence_targets_one_occurrence(env: Env) -> None:
    first = env.enqueue(trigger_key="first")
    second = env.enqueue(trigger_key="second", scheduled_for=T0 + 1)
    env.tick()
    claimed = env.store.claim_occurrence(occurrence_id=second.id, owner_id="w", lease_ms=LEASE)
    assert claimed is not None and claimed.id == second.id
    assert env.events(second.id)[-1]["data"] == {
        "attempt": 1,
        "previousOwner": None,
        "previousStatus": "queued",
        "targeted": True,
    }
    assert env.store.get_occurrence(first.id).status == "queued"  # type: ignore[union-attr]
    env.tick()
    assert env.store.claim_occurrence(occurrence_id=second.id, owner_id="w", lease_ms=LEASE) is None
    expect_error(
        "SCHEDULER_NOT_FOUND",
        lambda: env.store.claim_occurrence(occurrence_id="occ_nope", owner_id="w", lease_ms=LEASE),
    )


def test_claim_occurrence_not_yet_due_and_expired_reclaim(env: Env) -> None:
    future = env.enqueue(trigger_key="future", scheduled_for=env.now + 10_000)
    env.tick()
    assert env.store.claim_occurrence(occurrence_id=future.id, owner_id="w", lease_ms=LEASE) is None
    running = env.running(trigger_key="r", lease_ms=1000)
    env.set(running.lease_expires_at)  # type: ignore[arg-type]
    reclaimed = env.store.claim_occurrence(occurrence_id=running.id, owner_id="w2", lease_ms=LEASE)
    assert reclaimed is not None and reclaimed.fence == 2
    assert env.events(running.id)[-1]["type"] == "occurrence_reclaimed"


def test_claim_occurrence_returns_none_for_an_expired_final_attempt_it_sweeps(env: Env) -> None:
    env.job("one-shot", max_attempts=1)
    occurrence = env.running("one-shot", "x", lease_ms=1000)
    env.tick(5000)
    assert env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w2", lease_ms=LEASE) is None
    assert env.store.get_occurrence(occurrence.id).status == "dead_letter"  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ claim_batch


def test_claim_batch_equals_successive_claim_next(place: StorePlace) -> None:
    def build(env: Env) -> None:
        env.job("agenda-a", max_attempts=2)
        env.job("one-shot", max_attempts=1)
        for i in range(6):
            env.enqueue(trigger_key=f"q{i}", scheduled_for=T0 + (i % 3), available_at=T0 + (i % 2))
        expiring = env.running("one-shot", "sweep-me", lease_ms=1000)
        assert expiring.attempt == 1
        env.running(trigger_key="reclaim-me", lease_ms=1000)
        env.tick(10_000)

    with env_at(place.sibling("batch")) as batch, env_at(place.sibling("single")) as single:
        build(batch)
        build(single)
        claimed = batch.store.claim_batch(owner_id="w", lease_ms=LEASE, limit=5)
        expected = [single.store.claim_next(owner_id="w", lease_ms=LEASE) for _ in range(5)]
        assert [o.to_dict() for o in claimed] == [o.to_dict() for o in expected if o is not None]
        assert batch.dump()["tables"] == single.dump()["tables"]
        rest = batch.store.claim_batch(owner_id="w", lease_ms=LEASE, limit=1000)
        assert len(rest) == 2


@pytest.mark.parametrize("limit", [0, 1001, True, 1.0, None])
def test_claim_batch_limit_is_1_to_1000(env: Env, limit: Any) -> None:
    expect_error(INVALID, lambda: env.store.claim_batch(owner_id="w", lease_ms=LEASE, limit=limit))


# ------------------------------------------------------------------------------ leases: validation


@pytest.mark.parametrize("lease_ms", [0, -1, 86_400_001, 1.5, "1000", True, None])
def test_lease_ms_is_1_to_86400000(env: Env, lease_ms: Any) -> None:
    occurrence = env.running()
    reads = env.clock_reads
    for call in (
        lambda: env.store.claim_next(owner_id="w", lease_ms=lease_ms),
        lambda: env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=lease_ms),
        lambda: env.store.claim_batch(owner_id="w", lease_ms=lease_ms, limit=1),
        lambda: env.store.renew(occurrence_id=occurrence.id, owner_id="w1", fence=1, lease_ms=lease_ms),
    ):
        expect_error(INVALID, call)
    assert env.clock_reads == reads  # validation precedes the clock


def test_lease_expiry_beyond_2_53_is_rejected_inside_the_transaction(env: Env) -> None:
    occurrence = env.running(lease_ms=86_400_000)
    env.set(MAX_SAFE_INTEGER - 10)
    before = env.dump()
    for call in (
        lambda: env.store.claim_next(owner_id="w", lease_ms=11),
        lambda: env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=11),
        lambda: env.store.renew(occurrence_id=occurrence.id, owner_id="w1", fence=1, lease_ms=11),
    ):
        error = expect_error(INVALID, call)
        assert error.message == "lease expiry exceeds the safe integer range"
    assert env.dump() == before
    assert env.store.claim_next(owner_id="w", lease_ms=10) is not None  # exactly 2**53 - 1 is fine


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"job_kind": ""}, "jobKind is not a valid identifier"),
        ({"job_kind": "k" * 129}, "jobKind is not a valid identifier"),
        ({"job_kind": 5}, "jobKind must be a string"),
        ({"workspace_id": "bad\u0001"}, "workspaceId is not a valid identifier"),
        ({"workspace_id": "w" * 257}, "workspaceId is not a valid identifier"),
    ],
)
def test_claim_filters_are_identifiers(env: Env, filters: dict[str, Any], message: str) -> None:
    error = expect_error(INVALID, lambda: env.store.claim_next(owner_id="w", lease_ms=LEASE, **filters))
    assert error.message == message
    assert (
        env.store.claim_next(owner_id="w", lease_ms=LEASE, job_kind="k" * 128, workspace_id="w" * 256) is None
    )


# ------------------------------------------------------------------------------ renew


def test_renew_only_extends_the_lease(env: Env) -> None:
    occurrence = env.running(lease_ms=60_000)
    expires = occurrence.lease_expires_at
    env.tick()
    shorter = env.store.renew(occurrence_id=occurrence.id, owner_id="w1", fence=1, lease_ms=1000)
    assert shorter.lease_expires_at == expires and shorter.updated_at == env.now
    env.tick()
    longer = env.store.renew(occurrence_id=occurrence.id, owner_id="w1", fence=1, lease_ms=120_000)
    assert longer.lease_expires_at == env.now + 120_000
    events = env.events(occurrence.id)[-2:]
    assert [e["type"] for e in events] == ["occurrence_renewed", "occurrence_renewed"]
    assert [e["data"] for e in events] == [{"leaseExpiresAt": expires}, {"leaseExpiresAt": env.now + 120_000}]
    assert (events[1]["ownerId"], events[1]["fence"]) == ("w1", 1)


def test_renew_and_settle_fail_for_a_stale_owner_fence_or_expired_lease(env: Env) -> None:
    occurrence = env.running(lease_ms=10_000)
    before = env.dump()
    for owner, fence in (("w2", 1), ("w1", 2)):
        expect_error(
            "SCHEDULER_LEASE_LOST",
            lambda o=owner, f=fence: env.store.renew(
                occurrence_id=occurrence.id, owner_id=o, fence=f, lease_ms=1
            ),
        )
        expect_error(
            "SCHEDULER_LEASE_LOST",
            lambda o=owner, f=fence: env.store.settle(
                occurrence_id=occurrence.id, owner_id=o, fence=f, outcome="succeeded"
            ),
        )
    env.set(occurrence.lease_expires_at)  # type: ignore[arg-type]
    error = expect_error(
        "SCHEDULER_LEASE_LOST",
        lambda: env.store.renew(occurrence_id=occurrence.id, owner_id="w1", fence=1, lease_ms=1),
    )
    assert error.message == f"Occurrence lease is absent, expired, or owned by another fence: {occurrence.id}"
    expect_error(
        "SCHEDULER_LEASE_LOST",
        lambda: env.store.settle(occurrence_id=occurrence.id, owner_id="w1", fence=1, outcome="succeeded"),
    )
    expect_error(
        "SCHEDULER_LEASE_LOST",
        lambda: env.store.renew(occurrence_id="occ_missing", owner_id="w1", fence=1, lease_ms=1),
    )
    assert env.dump() == before


# ------------------------------------------------------------------------------ settle


def test_settle_success_stores_the_result(env: Env) -> None:
    occurrence = env.running()
    settled = env.succeed(occurrence, result={"b": 1, "a": [True]}, error="ignored", retry_at="ignored")
    assert (settled.status, settled.result, settled.last_error, settled.settled_at) == (
        "succeeded",
        {"a": [True], "b": 1},
        None,
        env.now,
    )
    assert (settled.lease_owner, settled.lease_expires_at, settled.available_at) == (None, None, T0)
    event = env.events(occurrence.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"]) == ("occurrence_succeeded", "w1", 1)
    assert event["data"] == {"attempt": 1, "maxAttempts": 2}
    assert env.succeed(env.running(trigger_key="none")).result is None


def test_settle_failure_schedules_a_retry_floored_at_now(env: Env) -> None:
    occurrence = env.running()
    retried = env.fail(occurrence, result=object(), retry_at=0)
    assert (retried.status, retried.available_at, retried.settled_at, retried.result) == (
        "retry_wait",
        env.now,
        None,
        None,
    )
    assert retried.last_error == {"code": "execution_failed", "message": "Execution failed"}
    assert env.events(occurrence.id)[-1]["data"] == {"attempt": 1, "maxAttempts": 2, "retryAt": env.now}
    again = env.claim(occurrence.id)
    later = env.fail(again, retry_at=env.now + 5000, error={"code": "E"})
    assert later.status == "dead_letter"  # the last attempt dead-letters even when retryable
    assert later.available_at == retried.available_at and later.last_error == {"code": "E"}


def test_settle_retry_at_in_the_future_and_not_retryable(env: Env) -> None:
    occurrence = env.running(trigger_key="a")
    target = env.now + 5000
    retried = env.fail(occurrence, retry_at=target)
    assert retried.available_at == target
    dead = env.fail(env.running(trigger_key="b"), retryable=False)
    assert dead.status == "dead_letter" and dead.settled_at == env.now
    assert env.events(dead.id)[-1]["data"] == {"attempt": 1, "maxAttempts": 2}


@pytest.mark.parametrize(
    "arguments",
    [
        {"outcome": "done"},
        {"outcome": None},
        {"outcome": "failed", "retryable": 1},
        {"outcome": "failed", "retry_at": -1},
        {"outcome": "failed", "retry_at": 1.5},
        {"outcome": "failed", "error": float("nan")},
        {"outcome": "succeeded", "result": {"x": float("inf")}},
        {"outcome": "succeeded", "adjudication_request_id": "a" * 129},
        {"outcome": "succeeded", "fence": 0},
    ],
)
def test_settle_validates_before_reading_the_clock(env: Env, arguments: dict[str, Any]) -> None:
    occurrence = env.running()
    reads = env.clock_reads
    expect_error(INVALID, lambda: env.succeed(occurrence, **arguments))
    assert env.clock_reads == reads
    assert env.store.get_occurrence(occurrence.id).status == "running"  # type: ignore[union-attr]


def test_settle_settles_a_reserved_authority_reservation(env: Env) -> None:
    success = env.running(trigger_key="s")
    env.reservation(success, policy_revision=4, units=2)
    env.succeed(success, result={"ok": 1})
    assert env.events(success.id)[-1]["data"] == {
        "attempt": 1,
        "maxAttempts": 2,
        "authorityPolicyRevision": 4,
        "authorityUnits": 2,
    }
    retry = env.running(trigger_key="r")
    env.reservation(retry)
    env.fail(retry)
    assert env.events(retry.id)[-1]["data"]["authorityPolicyRevision"] == 2
    dead = env.running(trigger_key="d")
    env.reservation(dead)
    env.fail(dead, retryable=False, error={"code": "X"})
    reservations = {row["occurrence_id"]: row for row in env.rows("scheduler_authority_reservations")}
    assert reservations[retry.id]["status"] == "reserved"
    assert reservations[success.id]["status"] == "succeeded"
    assert json.loads(reservations[success.id]["outcome_json"]) == {
        "status": "succeeded",
        "result": {"ok": 1},
    }
    assert reservations[dead.id]["status"] == "failed"
    assert json.loads(reservations[dead.id]["outcome_json"]) == {
        "status": "dead_letter",
        "error": {"code": "X"},
    }
    assert reservations[dead.id]["settled_at"] == env.now


def test_settle_applies_a_pending_adjudication(env: Env) -> None:
    occurrence = env.running()
    env.adjudication(occurrence, "adj-1")
    before = env.dump()
    error = expect_error(
        "SCHEDULER_ADJUDICATION_SETTLEMENT_CONFLICT",
        lambda: env.succeed(occurrence, adjudication_request_id="adj-other"),
    )
    assert error.message == f"Scheduler adjudication request does not match settlement: {occurrence.id}"
    assert env.dump() == before
    retried = env.fail(occurrence, adjudication_request_id="adj-1")
    [row] = env.rows("scheduler_occurrence_adjudications")
    assert row["status"] == "pending"
    assert env.events(occurrence.id)[-1]["data"]["adjudicationRequestId"] == "adj-1"
    final = env.claim(retried.id)
    env.succeed(final, result=[1])
    [row] = env.rows("scheduler_occurrence_adjudications")
    assert (row["status"], row["applied_at"], row["retry_settled_at"]) == ("applied", env.now, env.now)
    assert json.loads(row["retry_outcome_json"]) == {"status": "succeeded", "result": [1]}
    assert env.events(occurrence.id)[-1]["data"] == {
        "attempt": 2,
        "maxAttempts": 2,
        "adjudicationRequestId": "adj-1",
    }


def test_settle_many_is_all_or_nothing_with_the_failing_index(env: Env) -> None:
    a = env.running(trigger_key="a")
    b = env.running(trigger_key="b")
    before = env.dump()
    env.tick()
    error = expect_error(
        "SCHEDULER_LEASE_LOST",
        lambda: env.store.settle_many(
            [
                {"occurrence_id": a.id, "owner_id": "w1", "fence": 1, "outcome": "succeeded"},
                {"occurrence_id": b.id, "owner_id": "w1", "fence": 9, "outcome": "succeeded"},
            ]
        ),
    )
    assert error.details == {"index": 1}
    assert env.dump() == before
    error = expect_error(INVALID, lambda: env.store.settle_many([{"occurrence_id": a.id, "outcome": "x"}]))
    assert error.details == {"index": 0}
    error = expect_error(INVALID, lambda: env.store.settle_many([{"occurrenceId": a.id}]))
    assert error.details == {"fields": ["occurrenceId"], "index": 0}
    settled = env.store.settle_many(
        [
            {"occurrence_id": a.id, "owner_id": "w1", "fence": 1, "outcome": "succeeded", "result": 1},
            {
                "occurrence_id": b.id,
                "owner_id": "w1",
                "fence": 1,
                "outcome": "failed",
                "retry_at": env.now + 5,
            },
        ]
    )
    assert [o.status for o in settled] == ["succeeded", "retry_wait"]
    assert env.store.settle_many([]) == []


# ------------------------------------------------------------------------------ time


def test_every_write_reads_the_clock_once_inside_its_transaction(place: StorePlace) -> None:
    seen: list[bool] = []
    opened: dict[str, SchedulerStore] = {}

    def clock() -> int:
        store = opened.get("store")
        if store is not None:
            seen.append(in_transaction(store.connection))
        return T0

    store = place.open(clock=clock)
    opened["store"] = store
    try:
        store.create_job(id="agenda-a", kind="agenda", authority=AUTHORITY)
        occurrence = store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="clock")
        claimed = store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=LEASE)
        assert claimed is not None
        store.renew(occurrence_id=claimed.id, owner_id="w", fence=1, lease_ms=LEASE)
        store.settle(occurrence_id=claimed.id, owner_id="w", fence=1, outcome="failed")
        store.claim_next(owner_id="w", lease_ms=LEASE)
        store.claim_batch(owner_id="w", lease_ms=LEASE, limit=3)
        store.history(occurrence_id=claimed.id)
        store.list_dead_letters()
        store.get_occurrence(claimed.id)
        assert len(seen) == 7  # seven writes, one sample each; reads never sample the clock
        if place.backend == SQLITE:
            assert seen == [True] * 7  # after BEGIN IMMEDIATE: the write lock is held
        # (PostgreSQL: an injected clock is sampled as the call starts; psycopg sends BEGIN with
        # the call's first statement, so no server transaction exists yet. clock=None is read
        # after the rows are locked: test_postgresql_claims / the server-clock tests.)
    finally:
        store.close()


SETTLEMENT = st.fixed_dictionaries(
    {
        "target": st.integers(0, 3),
        "outcome": st.sampled_from(["succeeded", "failed"]),
        "fence_offset": st.sampled_from([0, 0, 0, 1]),
    },
    optional={
        "retryable": st.booleans(),
        "retry_at": st.sampled_from([T0, T0 + 10**7]),
        "result": st.sampled_from([None, {"ok": 1}]),
        "error": st.sampled_from([None, {"code": "E"}]),
        "adjudication_request_id": st.sampled_from(["adj-0", "adj-x"]),
    },
)


def settle_outcome(call: Any) -> Any:
    try:
        return [o.to_dict() for o in call()]
    except SchedulerKernelError as error:
        return (error.code, error.details)


def test_settle_many_equals_successive_settles(place: StorePlace) -> None:
    @settings(
        max_examples=examples(place, 40),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(items=st.lists(SETTLEMENT, max_size=5))
    def batch_equals_successive(items: list[dict[str, Any]]) -> None:
        with env_at(place.sibling("batch")) as batch, env_at(place.sibling("single")) as single:
            running: list[Occurrence] = []
            for environment in (batch, single):
                environment.job("agenda-a", max_attempts=2)
                running = [environment.running(trigger_key=f"k{i}") for i in range(3)]
                environment.control(running[1].id, "pause_requested", expected_fence=1)
                environment.reservation(running[2])
                environment.adjudication(running[0], "adj-0")
                environment.tick()
            settlements = []
            for item in items:
                target = running[item["target"]] if item["target"] < 3 else None
                settlement = {
                    key: value for key, value in item.items() if key not in ("target", "fence_offset")
                }
                settlement["occurrence_id"] = target.id if target else "occ_missing"
                settlement["owner_id"] = "w1"
                settlement["fence"] = 1 + item["fence_offset"]
                settlements.append(settlement)
            got = settle_outcome(lambda: batch.store.settle_many(settlements))

            def sequential() -> list[Occurrence]:
                results = []
                with single.store.transaction() as tx:
                    for index, settlement in enumerate(settlements):
                        try:
                            results.append(tx.settle(**settlement))
                        except SchedulerKernelError as error:
                            error.details = {**(error.details or {}), "index": index}
                            raise
                return results

            assert got == settle_outcome(sequential)
            assert batch.dump()["tables"] == single.dump()["tables"]

    batch_equals_successive()
