"""Durable pause/resume with checkpoints (schema v6), end to end with leases, on both backends (``place``).

API §5 Runtime control (v6), §9 pause/resume.
"""

from __future__ import annotations

from typing import Any

import pytest
from governance_support import (
    CHECKPOINT_CAPABILITY,
    Env,
    ack,
    claim,
    create_job,
    enqueue,
    env_at,
    expect_error,
    paused,
    request_pause,
    resume,
    running,
    settle_failed,
    settle_succeeded,
)
from store_places import StorePlace

from scheduler import scheduler_runtime_control_capability_digest
from scheduler.contract.canonical import canonical_json, sha256_payload_digest
from scheduler.contract.constants import MAX_RUNTIME_CHECKPOINT_BYTES, RUNTIME_CONTROL_JOB_KINDS

INVALID = "SCHEDULER_INVALID_ARGUMENT"
CONFLICT = "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT"
NORMALIZED = {
    "schemaVersion": 1,
    "pauseResume": "checkpoint_v1",
    "safePoints": ["adapter_checkpoint", "before_execute"],
}
DIGEST = scheduler_runtime_control_capability_digest(CHECKPOINT_CAPABILITY)
BEFORE_ONLY = {"pauseResume": "checkpoint_v1", "safePoints": ["before_execute"]}


@pytest.fixture
def env(place: StorePlace) -> Any:
    with env_at(place) as environment:
        create_job(environment, "agenda-pause", max_attempts=2)
        yield environment


# --------------------------------------------------------------------------- pause request


def test_a_pause_request_binds_the_running_fence_and_capability(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    control = request_pause(env, occurrence)
    assert control.to_dict() == {
        "occurrenceId": occurrence.id,
        "capability": NORMALIZED,
        "capabilityDigest": DIGEST,
        "state": "pause_requested",
        "revision": 1,
        "pauseRequestId": "pause-1",
        "resumeRequestId": None,
        "expectedFence": 1,
        "checkpoint": None,
        "requestedAt": env.now,
        "pausedAt": None,
        "resumedAt": None,
        "terminalAt": None,
        "updatedAt": env.now,
        "deduplicated": False,
    }
    assert env.store.get_occurrence_control(occurrence.id) == control.replace(deduplicated=None)
    [row] = env.dump()["tables"]["scheduler_occurrence_controls"]
    assert row["capability_json"] == canonical_json(NORMALIZED)
    event = env.events(occurrence.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"]) == ("occurrence_pause_requested", None, 1)
    assert event["data"] == {"requestId": "pause-1", "controlRevision": 1, "capabilityDigest": DIGEST}
    still = env.store.get_occurrence(occurrence.id)
    assert still == occurrence  # the occurrence itself is untouched until the owner acknowledges


def test_a_repeated_pause_request_is_deduplicated(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    first = request_pause(env, occurrence)
    before = env.dump()
    reordered = {
        "safePoints": ["before_execute", "adapter_checkpoint", "before_execute"],
        "pauseResume": "checkpoint_v1",
    }
    again = request_pause(env, occurrence, capability=reordered, expected_revision=7)
    assert again == first.replace(deduplicated=True)
    assert env.dump() == before


@pytest.mark.parametrize("change", [{"capability": BEFORE_ONLY}, {"expected_fence": 2}])
def test_a_repeated_request_with_other_evidence_conflicts(env: Env, change: dict[str, Any]) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence)
    error = expect_error(CONFLICT, lambda: request_pause(env, occurrence, **change))
    assert error.details is None
    assert error.message == f"Scheduler pause request evidence changed: {occurrence.id}"


def test_one_active_control_per_occurrence_and_one_occurrence_per_request(env: Env) -> None:
    first = running(env, "agenda-pause", "p1")
    second = running(env, "agenda-pause", "p2", owner="w2")
    request_pause(env, first)
    error = expect_error(CONFLICT, lambda: request_pause(env, first, "pause-2"))
    assert error.details == {"state": "pause_requested", "revision": 1}
    error = expect_error(CONFLICT, lambda: request_pause(env, second, "pause-1"))
    assert error.message == "Scheduler pause request is already bound to another occurrence"


def test_the_control_revision_is_compared_when_given(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    error = expect_error(
        "SCHEDULER_REVISION_CONFLICT", lambda: request_pause(env, occurrence, expected_revision=1)
    )
    assert error.details == {"expectedRevision": 1, "actualRevision": 0}
    assert request_pause(env, occurrence, expected_revision=0).revision == 1


@pytest.mark.parametrize("capability", [None, {"pauseResume": "none"}, {}])
def test_adapters_without_checkpoints_cannot_pause(env: Env, capability: Any) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    expect_error("SCHEDULER_PAUSE_UNSUPPORTED", lambda: request_pause(env, occurrence, capability=capability))
    env.tick()
    expect_error(
        "SCHEDULER_PAUSE_UNSUPPORTED",
        lambda: env.store.request_occurrence_pause(
            occurrence_id=occurrence.id, expected_fence=1, request_id="x"
        ),
    )
    assert env.store.get_occurrence_control(occurrence.id) is None


def test_only_a_live_running_occurrence_at_its_fence_can_be_paused(env: Env) -> None:
    queued = enqueue(env, "agenda-pause", "q")
    error = expect_error(
        "SCHEDULER_OCCURRENCE_NOT_RUNNING", lambda: request_pause(env, queued.replace(fence=1))
    )
    assert error.details == {"status": "queued"}
    occurrence = running(env, "agenda-pause", "p1", lease_ms=60_000)
    error = expect_error("SCHEDULER_FENCE_CONFLICT", lambda: request_pause(env, occurrence, expected_fence=2))
    assert error.details == {"expectedFence": 2, "actualFence": 1}
    env.at(occurrence.lease_expires_at - 1000)
    expect_error("SCHEDULER_LEASE_LOST", lambda: request_pause(env, occurrence))  # tick reaches the expiry
    expect_error("SCHEDULER_NOT_FOUND", lambda: request_pause(env, occurrence.replace(id="occ_missing")))
    assert env.store.get_occurrence_control(occurrence.id) is None


@pytest.mark.parametrize(
    "change",
    [
        {"occurrence_id": ""},
        {"expected_fence": 0},
        {"expected_fence": 1.0},
        {"request_id": "r" * 129},
        {"request_id": None},
        {"expected_revision": -1},
        {"expected_revision": True},
        {"capability": {"pauseResume": "checkpoint_v1"}},
        {"capability": {"pauseResume": "none", "safePoints": ["before_execute"]}},
        {"capability": {"pauseResume": "checkpoint_v1", "safePoints": ["somewhere"]}},
        {"capability": {**CHECKPOINT_CAPABILITY, "extra": 1}},
        {"capability": "checkpoint_v1"},
    ],
)
def test_pause_request_rejects_invalid_arguments(env: Env, change: dict[str, Any]) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    before = env.dump()
    expect_error(INVALID, lambda: request_pause(env, occurrence, **change))
    assert env.dump() == before


# --------------------------------------------------------------------------- acknowledgement


def test_the_owner_parks_the_occurrence_at_a_safe_point(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence)
    result = ack(env, occurrence, checkpoint={"cursor": 7, "pending": ["b", "a"]})
    stored = {
        "schemaVersion": 1,
        "safePoint": "adapter_checkpoint",
        "data": {"cursor": 7, "pending": ["b", "a"]},
    }
    control = result.control
    assert (control.state, control.revision, control.checkpoint, control.paused_at, control.updated_at) == (
        "paused",
        2,
        stored,
        env.now,
        env.now,
    )
    parked = result.occurrence
    assert (parked.status, parked.attempt, parked.fence, parked.available_at, parked.updated_at) == (
        "retry_wait",
        1,
        1,
        env.now,
        env.now,
    )
    assert (parked.lease_owner, parked.lease_expires_at, parked.settled_at) == (None, None, None)
    assert result.to_dict() == {"control": control.to_dict(), "occurrence": parked.to_dict()}
    [row] = env.dump()["tables"]["scheduler_occurrence_controls"]
    assert row["checkpoint_json"] == canonical_json(stored)
    event = env.events(occurrence.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"]) == ("occurrence_paused", None, 1)
    assert event["data"] == {
        "requestId": "pause-1",
        "safePoint": "adapter_checkpoint",
        "checkpointDigest": sha256_payload_digest(stored),
    }


def test_no_checkpoint_is_stored_as_null_data(env: Env) -> None:
    occurrence = paused(env)
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None
    assert control.checkpoint == {"schemaVersion": 1, "safePoint": "adapter_checkpoint", "data": None}


def test_acknowledgement_checks_request_revision_and_lease(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    expect_error("SCHEDULER_NOT_FOUND", lambda: ack(env, occurrence))
    request_pause(env, occurrence)
    before = env.dump()
    error = expect_error(CONFLICT, lambda: ack(env, occurrence, "pause-other"))
    assert error.details == {"state": "pause_requested", "revision": 1}
    error = expect_error("SCHEDULER_REVISION_CONFLICT", lambda: ack(env, occurrence, expected_revision=2))
    assert error.details == {"expectedRevision": 2, "actualRevision": 1}
    expect_error("SCHEDULER_LEASE_LOST", lambda: ack(env, occurrence, owner_id="w-intruder"))
    expect_error("SCHEDULER_LEASE_LOST", lambda: ack(env, occurrence, fence=2))
    assert env.dump() == before


def test_acknowledging_after_the_lease_expired_is_lost(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1", lease_ms=60_000)
    request_pause(env, occurrence)
    env.at(occurrence.lease_expires_at - 1000)  # ack() ticks exactly onto the expiry
    expect_error("SCHEDULER_LEASE_LOST", lambda: ack(env, occurrence))


def test_the_safe_point_must_be_declared(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence, capability=BEFORE_ONLY)
    error = expect_error("SCHEDULER_PAUSE_UNSUPPORTED_SAFE_POINT", lambda: ack(env, occurrence))
    assert error.message == "Scheduler adapter did not declare pause safety at adapter_checkpoint"
    assert ack(env, occurrence, safe_point="before_execute").control.state == "paused"


def test_the_acknowledged_pause_is_not_pending_anymore(env: Env) -> None:
    occurrence = paused(env)
    claimed = occurrence.replace(lease_owner="w1")
    error = expect_error(CONFLICT, lambda: ack(env, claimed, "pause-p1", expected_revision=2))
    assert error.details == {"state": "paused", "revision": 2}


def test_the_checkpoint_is_limited_to_64_kib_canonical(env: Env) -> None:
    overhead = len(canonical_json({"schemaVersion": 1, "safePoint": "adapter_checkpoint", "data": ""}))
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence)
    too_big = "x" * (MAX_RUNTIME_CHECKPOINT_BYTES - overhead + 1)
    error = expect_error(INVALID, lambda: ack(env, occurrence, checkpoint=too_big))
    assert error.message == "runtimeControl.checkpoint exceeds 65536 encoded bytes"
    multibyte = "é" * ((MAX_RUNTIME_CHECKPOINT_BYTES - overhead) // 2 + 1)  # 2 UTF-8 bytes each
    expect_error(INVALID, lambda: ack(env, occurrence, checkpoint=multibyte))
    exact = "x" * (MAX_RUNTIME_CHECKPOINT_BYTES - overhead)
    assert ack(env, occurrence, checkpoint=exact).control.checkpoint["data"] == exact


@pytest.mark.parametrize(
    "change",
    [
        {"safe_point": "after_execute"},
        {"safe_point": None},
        {"owner_id": ""},
        {"fence": 0},
        {"expected_revision": 0},
        {"expected_revision": None},
        {"request_id": 5},
        {"checkpoint": {"value": float("nan")}},
        {"checkpoint": {1: "non-string key"}},
        {"checkpoint": {"set": {1, 2}}},
    ],
)
def test_acknowledgement_rejects_invalid_arguments(env: Env, change: dict[str, Any]) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence)
    before = env.dump()
    expect_error(INVALID, lambda: ack(env, occurrence, **change))
    assert env.dump() == before


# --------------------------------------------------------------------------- resume


def test_a_paused_occurrence_is_not_claimable_until_resumed(env: Env) -> None:
    occurrence = paused(env)
    env.tick()
    assert env.store.claim_next(owner_id="w2", lease_ms=60_000) is None
    assert env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w2", lease_ms=60_000) is None
    result = resume(env, occurrence.id)
    control = result.control
    assert (control.state, control.revision, control.resume_request_id, control.resumed_at) == (
        "resumed",
        3,
        "resume-1",
        env.now,
    )
    assert control.deduplicated is None
    assert (result.occurrence.status, result.occurrence.available_at, result.occurrence.updated_at) == (
        "retry_wait",
        env.now,
        env.now,
    )
    event = env.events(occurrence.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"]) == ("occurrence_resume_requested", None, 1)
    assert event["data"] == {"requestId": "resume-1", "controlRevision": 3}


def test_resume_is_idempotent_by_request_id(env: Env) -> None:
    occurrence = paused(env)
    first = resume(env, occurrence.id)
    before = env.dump()
    again = resume(env, occurrence.id, revision=99)
    assert again.control == first.control.replace(deduplicated=True)
    assert again.to_dict()["control"]["deduplicated"] is True
    assert again.occurrence == first.occurrence
    assert env.dump() == before


def test_resume_checks_state_revision_and_request_binding(env: Env) -> None:
    first = paused(env, "p1")
    second = paused(env, "p2")
    error = expect_error("SCHEDULER_REVISION_CONFLICT", lambda: resume(env, first.id, revision=1))
    assert error.details == {"expectedRevision": 1, "actualRevision": 2}
    resume(env, first.id, "resume-1")
    error = expect_error(CONFLICT, lambda: resume(env, second.id, "resume-1"))
    assert error.message == "Scheduler resume request is already bound to another occurrence"
    error = expect_error(CONFLICT, lambda: resume(env, first.id, "resume-again"))
    assert error.details == {"state": "resumed", "revision": 3}
    live = running(env, "agenda-pause", "p3")
    expect_error("SCHEDULER_NOT_FOUND", lambda: resume(env, live.id, "resume-3"))
    request_pause(env, live, "pause-p3")
    error = expect_error(CONFLICT, lambda: resume(env, live.id, "resume-3"))
    assert error.details == {"state": "pause_requested", "revision": 1}


def test_resume_refuses_an_inconsistent_paused_occurrence(env: Env) -> None:
    occurrence = paused(env)
    env.sql("UPDATE occurrences SET status = 'queued' WHERE occurrence_id = ?", (occurrence.id,))
    error = expect_error(CONFLICT, lambda: resume(env, occurrence.id))
    assert error.message == f"Paused occurrence state is inconsistent: {occurrence.id}"


@pytest.mark.parametrize(
    "arguments",
    [
        {"occurrence_id": None, "expected_revision": 1, "request_id": "r"},
        {"occurrence_id": "o", "expected_revision": 0, "request_id": "r"},
        {"occurrence_id": "o", "expected_revision": "2", "request_id": "r"},
        {"occurrence_id": "o", "expected_revision": 2, "request_id": "r" * 129},
        {"occurrence_id": "o", "expected_revision": 2, "request_id": "bad\x00"},
    ],
)
def test_resume_rejects_invalid_arguments(env: Env, arguments: dict[str, Any]) -> None:
    expect_error(INVALID, lambda: env.store.resume_occurrence(**arguments))


# --------------------------------------------------------------------------- with claims and settlements


def test_the_resumed_claim_does_not_consume_an_attempt_and_settle_terminalizes(env: Env) -> None:
    occurrence = paused(env)
    resume(env, occurrence.id)
    env.tick()
    reclaimed = env.store.claim_next(owner_id="w2", lease_ms=600_000)
    assert reclaimed is not None
    assert (reclaimed.id, reclaimed.attempt, reclaimed.fence, reclaimed.status) == (
        occurrence.id,
        1,
        2,
        "running",
    )
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None
    assert (control.state, control.expected_fence, control.revision) == ("resumed", 2, 4)
    claimed_event = env.events(occurrence.id)[-1]
    assert claimed_event["data"] == {
        "attempt": 1,
        "previousOwner": None,
        "previousStatus": "retry_wait",
        "resumedWithoutAttempt": True,
    }
    settle_succeeded(env, reclaimed, {"resumedFrom": 7})
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None
    assert (control.state, control.revision, control.terminal_at, control.paused_at) == (
        "terminal",
        5,
        env.now,
        control.paused_at,
    )
    assert control.checkpoint is not None  # the last checkpoint is kept for the record
    assert env.events(occurrence.id)[-1]["data"] == {
        "attempt": 1,
        "maxAttempts": 2,
        "runtimeControlTerminalized": True,
    }


def test_a_resumed_run_that_fails_retryably_keeps_its_control_for_the_next_claim(env: Env) -> None:
    occurrence = paused(env)
    resume(env, occurrence.id)
    reclaimed = claim(env, occurrence.id, owner="w2")
    waiting = settle_failed(env, reclaimed, {"code": "TRANSIENT"})
    assert waiting.status == "retry_wait"
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None
    assert (control.state, control.expected_fence, control.revision) == ("resumed", 3, 5)
    assert "runtimeControlTerminalized" not in env.events(occurrence.id)[-1]["data"]
    again = claim(env, occurrence.id, owner="w3")
    assert (again.attempt, again.fence) == (2, 3)  # this claim is an ordinary retry
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None and (control.expected_fence, control.revision) == (3, 6)
    settle_succeeded(env, again)
    assert env.store.get_occurrence_control(occurrence.id).state == "terminal"  # type: ignore[union-attr]


def test_a_pending_pause_is_rebound_when_another_worker_reclaims(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1", lease_ms=60_000)
    request_pause(env, occurrence)
    env.at(occurrence.lease_expires_at)
    reclaimed = env.store.claim_next(owner_id="w2", lease_ms=600_000)
    assert reclaimed is not None
    assert (reclaimed.id, reclaimed.attempt, reclaimed.fence) == (occurrence.id, 1, 2)
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None
    assert (control.state, control.expected_fence, control.revision, control.updated_at) == (
        "pause_requested",
        2,
        2,
        env.now,
    )
    event = env.events(occurrence.id)[-1]
    assert (event["type"], event["data"]) == (
        "occurrence_reclaimed",
        {"attempt": 1, "previousOwner": "w1", "previousStatus": "running", "pauseRequestRebound": True},
    )
    expect_error("SCHEDULER_LEASE_LOST", lambda: ack(env, occurrence))
    assert ack(env, reclaimed).control.state == "paused"


def test_controls_exempt_final_attempts_from_the_expired_lease_sweep(place: StorePlace) -> None:
    with env_at(place) as env:
        create_job(env, "agenda-once", max_attempts=1)
        pending = running(env, "agenda-once", "pending", lease_ms=60_000)
        request_pause(env, pending, "pause-pending")
        plain = running(env, "agenda-once", "plain", owner="w2", lease_ms=60_000)
        env.tick(120_000)
        reclaimed = env.store.claim_next(owner_id="w3", lease_ms=600_000)
        assert reclaimed is not None and reclaimed.id == pending.id
        assert (reclaimed.attempt, reclaimed.max_attempts, reclaimed.fence) == (1, 1, 2)
        assert env.store.get_occurrence(plain.id).status == "dead_letter"  # type: ignore[union-attr]
        ack(env, reclaimed, "pause-pending")
        resume(env, pending.id)
        resumed = claim(env, pending.id, owner="w4", lease_ms=60_000)
        assert (resumed.attempt, resumed.fence) == (1, 3)
        env.tick(120_000)
        again = env.store.claim_next(owner_id="w5", lease_ms=600_000)
        assert again is not None and again.id == pending.id and again.attempt == 1
        assert env.store.get_occurrence_control(pending.id).expected_fence == 4  # type: ignore[union-attr]


def test_settling_terminalizes_a_pending_pause_and_the_row_is_reused(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence, capability=BEFORE_ONLY)
    waiting = settle_failed(env, occurrence, {"code": "TRANSIENT"})
    assert waiting.status == "retry_wait"
    control = env.store.get_occurrence_control(occurrence.id)
    assert control is not None and (control.state, control.revision, control.terminal_at) == (
        "terminal",
        2,
        env.now,
    )
    assert env.events(occurrence.id)[-1]["data"]["runtimeControlTerminalized"] is True
    retry = claim(env, occurrence.id, owner="w2")
    assert (retry.attempt, retry.fence) == (2, 2)
    error = expect_error(
        "SCHEDULER_REVISION_CONFLICT", lambda: request_pause(env, retry, "pause-2", expected_revision=0)
    )
    assert error.details == {"expectedRevision": 0, "actualRevision": 2}
    renewed = request_pause(env, retry, "pause-2", expected_revision=2)
    assert renewed.to_dict() == {
        "occurrenceId": occurrence.id,
        "capability": NORMALIZED,
        "capabilityDigest": DIGEST,
        "state": "pause_requested",
        "revision": 3,
        "pauseRequestId": "pause-2",
        "resumeRequestId": None,
        "expectedFence": 2,
        "checkpoint": None,
        "requestedAt": env.now,
        "pausedAt": None,
        "resumedAt": None,
        "terminalAt": None,
        "updatedAt": env.now,
        "deduplicated": False,
    }
    assert len(env.dump()["tables"]["scheduler_occurrence_controls"]) == 1


def test_a_terminal_control_still_dedupes_its_own_request(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence)
    settle_succeeded(env, occurrence)
    replay = request_pause(env, occurrence)  # same request id: the terminal row is returned as it is
    assert (replay.state, replay.deduplicated) == ("terminal", True)


# --------------------------------------------------------------------------- listing


def test_the_listing_is_a_narrow_read_model(env: Env) -> None:
    plain = running(env, "agenda-pause", "run")
    pending = running(env, "agenda-pause", "pend", owner="w2")
    request_pause(env, pending, "pause-pend")
    parked = paused(env, "park", checkpoint={"secret": "do not list"})
    enqueue(env, "agenda-pause", "queued")
    listed = env.store.list_runtime_control_occurrences()
    assert [item.id for item in listed] == [parked.id, pending.id, plain.id]  # updated_at DESC
    assert [item.runtime_status for item in listed] == ["paused", "pause_requested", "running"]
    assert [item.occurrence_status for item in listed] == ["retry_wait", "running", "running"]
    current = env.store.get_occurrence(parked.id)
    control = env.store.get_occurrence_control(parked.id)
    assert current is not None and control is not None
    assert listed[0].to_dict() == {
        "id": parked.id,
        "jobId": "agenda-pause",
        "jobKind": "agenda",
        "runtimeStatus": "paused",
        "occurrenceStatus": "retry_wait",
        "scheduledFor": current.scheduled_for,
        "attempt": 1,
        "maxAttempts": 2,
        "fence": 1,
        "createdAt": current.created_at,
        "updatedAt": current.updated_at,
        "control": {
            "state": "paused",
            "revision": 2,
            "expectedFence": 1,
            "capabilityDigest": DIGEST,
            "requestedAt": control.requested_at,
            "pausedAt": control.paused_at,
            "updatedAt": control.updated_at,
        },
    }
    assert listed[2].control is None
    assert "secret" not in repr([item.to_dict() for item in listed])


def test_the_listing_filters_statuses_kinds_and_limit(env: Env) -> None:
    create_job(env, "routine-x", kind="routine")
    create_job(env, "custom-x", kind="custom-kind")
    agenda = running(env, "agenda-pause", "a")
    routine = running(env, "routine-x", "r", owner="w2")
    running(env, "custom-x", "c", owner="w3")  # not a runtime-control job kind
    request_pause(env, routine, "pause-r")
    store = env.store
    assert [item.id for item in store.list_runtime_control_occurrences()] == [routine.id, agenda.id]
    assert [item.id for item in store.list_runtime_control_occurrences(statuses=["running"])] == [agenda.id]
    pending_only = store.list_runtime_control_occurrences(statuses=("pause_requested", "pause_requested"))
    assert [item.id for item in pending_only] == [routine.id]
    assert [item.id for item in store.list_runtime_control_occurrences(job_kinds=["agenda"])] == [agenda.id]
    assert [item.id for item in store.list_runtime_control_occurrences(limit=1)] == [routine.id]
    assert len(store.list_runtime_control_occurrences(limit=10_000)) == 2
    assert (
        store.list_runtime_control_occurrences(job_kinds=list(RUNTIME_CONTROL_JOB_KINDS), statuses=["paused"])
        == []
    )


def test_terminal_and_resumed_controls_in_the_listing(env: Env) -> None:
    occurrence = paused(env)
    resume(env, occurrence.id)
    assert env.store.list_runtime_control_occurrences() == []  # resumed, waiting for a claim
    reclaimed = claim(env, occurrence.id, owner="w2")
    [item] = env.store.list_runtime_control_occurrences()
    assert (item.runtime_status, item.control.state) == ("running", "resumed")  # type: ignore[union-attr]
    settle_succeeded(env, reclaimed)
    assert env.store.list_runtime_control_occurrences() == []


@pytest.mark.parametrize(
    ("arguments", "details"),
    [
        ({"statuses": []}, None),
        ({"statuses": "running"}, None),
        ({"statuses": None}, None),
        ({"statuses": ["running", "zz", "done"]}, {"values": ["done", "zz"]}),
        ({"statuses": ["running", 5]}, None),
        ({"job_kinds": ["agenda", "custom"]}, {"values": ["custom"]}),
        ({"job_kinds": [""]}, None),
        ({"job_kinds": ["k" * 129]}, None),
        ({"limit": 0}, None),
        ({"limit": None}, None),
        ({"limit": 2.0}, None),
        ({"limit": True}, None),
    ],
)
def test_the_listing_rejects_invalid_arguments(env: Env, arguments: dict[str, Any], details: Any) -> None:
    error = expect_error(INVALID, lambda: env.store.list_runtime_control_occurrences(**arguments))
    assert error.details == details


def test_a_tampered_capability_digest_is_data_corruption(env: Env) -> None:
    occurrence = running(env, "agenda-pause", "p1")
    request_pause(env, occurrence)
    env.sql(
        "UPDATE scheduler_occurrence_controls SET capability_digest = ?",
        (scheduler_runtime_control_capability_digest(BEFORE_ONLY),),
    )
    expect_error("SCHEDULER_DATA_CORRUPT", lambda: env.store.get_occurrence_control(occurrence.id))
    env.sql('UPDATE scheduler_occurrence_controls SET capability_json = \'{"pauseResume":"bogus"}\'')
    expect_error("SCHEDULER_DATA_CORRUPT", lambda: env.store.get_occurrence_control(occurrence.id))


def test_reads_validate_the_occurrence_id(env: Env) -> None:
    assert env.store.get_occurrence_control("occ_missing") is None
    expect_error(INVALID, lambda: env.store.get_occurrence_control(""))
    expect_error(INVALID, lambda: env.store.get_occurrence_control(42))
