"""Adjudication of outcome-unknown dead letters (schema v3), on both backends (``place``).

API §5 Adjudication (v3).
"""

from __future__ import annotations

from typing import Any

import pytest
from governance_support import (
    ALICE,
    OUTCOME_UNKNOWN,
    Env,
    claim,
    create_job,
    digest,
    env_at,
    expect_error,
    expected_evidence,
    outcome_unknown_dead_letter,
    running,
    set_policy,
    settle_failed,
    settle_succeeded,
)
from governance_support import adjudicate as support_adjudicate
from recorded import T0
from store_places import StorePlace

from scheduler import scheduler_adjudication_operator_digest, scheduler_adjudication_reason_digest
from scheduler.store.capabilities.adjudication import is_outcome_unknown_error

INVALID = "SCHEDULER_INVALID_ARGUMENT"
REASON = scheduler_adjudication_reason_digest("Operator checked the calendar: the invite was not sent")
OPERATOR = scheduler_adjudication_operator_digest({"user": "ops-1", "host": "console"})


@pytest.fixture
def env(place: StorePlace) -> Any:
    with env_at(place) as environment:
        set_policy(environment)
        create_job(environment, "agenda-gov", max_attempts=3)
        yield environment


def request_id_for(occurrence_id: str, decision: str, evidence_digest: str, reason: str = REASON) -> str:
    material = {
        "schemaVersion": 1,
        "occurrenceId": occurrence_id,
        "decision": decision,
        "evidenceDigest": evidence_digest,
        "reasonDigest": reason,
    }
    return "scheduler-adjudication-" + digest(material).removeprefix("sha256:")


def adjudicate(env: Env, occurrence_id: str, decision: str, /, **overrides: Any) -> Any:
    return support_adjudicate(
        env, occurrence_id, decision, **{"reason_digest": REASON, "operator_digest": OPERATOR, **overrides}
    )


# --------------------------------------------------------------------------- cases


def test_an_outcome_unknown_dead_letter_is_an_eligible_case(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    case = env.store.get_adjudication_case(dead.id)
    assert case is not None
    assert case.to_dict() == {
        "occurrenceId": dead.id,
        "jobId": "agenda-gov",
        "status": "dead_letter",
        "attempt": 1,
        "maxAttempts": 3,
        "fence": 1,
        "settledAt": dead.settled_at,
        "errorCode": "AGENDA_OUTCOME_UNKNOWN",
        "authorityPrincipal": ALICE,
        "reservation": {"policyRevision": 1, "units": 1, "status": "failed"},
        "eligible": True,
        "evidenceDigest": digest(expected_evidence(env, dead.id)),
        "adjudication": None,
    }


def test_the_evidence_covers_settlement_time_error_and_reservation(env: Env) -> None:
    with_reservation = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    without_reservation = outcome_unknown_dead_letter(env, "agenda-gov", "u2", reserve=False)
    first = env.store.get_adjudication_case(with_reservation.id)
    second = env.store.get_adjudication_case(without_reservation.id)
    assert first is not None and second is not None
    assert second.reservation is None
    assert second.evidence_digest == digest(expected_evidence(env, without_reservation.id))
    assert expected_evidence(env, without_reservation.id)["reservation"] is None
    assert first.evidence_digest != second.evidence_digest


@pytest.mark.parametrize(
    ("error", "eligible", "code"),
    [
        ({"code": "AGENDA_OUTCOME_UNKNOWN"}, True, "AGENDA_OUTCOME_UNKNOWN"),
        ({"code": "A1_B2_OUTCOME_UNKNOWN"}, True, "A1_B2_OUTCOME_UNKNOWN"),
        ({"code": "_OUTCOME_UNKNOWN"}, False, "_OUTCOME_UNKNOWN"),
        ({"code": "OUTCOME_UNKNOWN"}, False, "OUTCOME_UNKNOWN"),
        ({"code": "agenda_OUTCOME_UNKNOWN"}, False, "agenda_OUTCOME_UNKNOWN"),
        ({"code": "AGENDA_OUTCOME_UNKNOWN_2"}, False, "AGENDA_OUTCOME_UNKNOWN_2"),
        ({"code": "AGENDA-OUTCOME_UNKNOWN"}, False, "AGENDA-OUTCOME_UNKNOWN"),
        ({"code": 7}, False, None),
        ("AGENDA_OUTCOME_UNKNOWN", False, None),
        (["AGENDA_OUTCOME_UNKNOWN"], False, None),
    ],
)
def test_only_matching_error_codes_are_eligible(
    env: Env, error: Any, eligible: bool, code: str | None
) -> None:
    occurrence = running(env, "agenda-gov", "u1")
    settle_failed(env, occurrence, error, retryable=False)
    case = env.store.get_adjudication_case(occurrence.id)
    assert case is not None
    assert (case.eligible, case.error_code) == (eligible, code)
    assert (case.evidence_digest is not None) is eligible
    assert is_outcome_unknown_error(error) is eligible


def test_the_code_pattern_is_the_seed_regex_not_the_glob() -> None:
    # ``^[A-Z0-9_]+_OUTCOME_UNKNOWN$``: "_" is in the class, so "__OUTCOME_UNKNOWN" matches but
    # "_OUTCOME_UNKNOWN" needs one more character before the suffix.
    assert is_outcome_unknown_error({"code": "__OUTCOME_UNKNOWN"})
    assert not is_outcome_unknown_error({"code": "OUTCOME_UNKNOWN"})
    assert not is_outcome_unknown_error({"code": "X_OUTCOME_UNKNOWN\n"})
    assert not is_outcome_unknown_error(None)


def test_a_running_or_missing_occurrence(env: Env) -> None:
    occurrence = running(env, "agenda-gov", "r1")
    case = env.store.get_adjudication_case(occurrence.id)
    assert case is not None
    assert (case.eligible, case.evidence_digest, case.error_code, case.reservation) == (
        False,
        None,
        None,
        None,
    )
    assert env.store.get_adjudication_case("occ_missing") is None
    assert env.store.get_occurrence_adjudication("occ_missing") is None
    expect_error(INVALID, lambda: env.store.get_adjudication_case(""))
    expect_error(INVALID, lambda: env.store.get_occurrence_adjudication(None))


# --------------------------------------------------------------------------- listing


def test_list_returns_eligible_cases_newest_settlement_first(env: Env) -> None:
    first = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    plain = running(env, "agenda-gov", "plain")
    settle_failed(env, plain, {"code": "CALENDAR_GONE"}, retryable=False)
    lowercase = running(env, "agenda-gov", "lower")
    settle_failed(env, lowercase, {"code": "agenda_OUTCOME_UNKNOWN"}, retryable=False)  # GLOB yes, regex no
    bare = running(env, "agenda-gov", "bare")
    settle_failed(env, bare, {"code": "_OUTCOME_UNKNOWN"}, retryable=False)  # GLOB yes, regex no
    second = outcome_unknown_dead_letter(env, "agenda-gov", "u2", reserve=False)
    third = outcome_unknown_dead_letter(env, "agenda-gov", "u3", reserve=False)
    listed = env.store.list_adjudication_cases()
    assert [case.occurrence_id for case in listed] == [third.id, second.id, first.id]
    assert listed[2] == env.store.get_adjudication_case(first.id)
    assert [case.occurrence_id for case in env.store.list_adjudication_cases(limit=2)] == [
        third.id,
        second.id,
    ]
    adjudicate(env, second.id, "confirmed_not_applied")
    assert [case.occurrence_id for case in env.store.list_adjudication_cases()] == [third.id, first.id]


def test_list_breaks_settlement_ties_by_occurrence_id(env: Env) -> None:
    ids = []
    for key in ("t1", "t2", "t3"):
        occurrence = running(env, "agenda-gov", key)
        env.store.settle(
            occurrence_id=occurrence.id,
            owner_id="w1",
            fence=occurrence.fence,
            outcome="failed",
            error=OUTCOME_UNKNOWN,
            retryable=False,
        )
        ids.append(occurrence.id)
    env.sql("UPDATE occurrences SET settled_at = 5 WHERE status = 'dead_letter'")
    assert [case.occurrence_id for case in env.store.list_adjudication_cases()] == sorted(ids)


@pytest.mark.parametrize("limit", [0, -1, None, 1.0, True, "5"])
def test_list_limit_must_be_a_positive_integer(env: Env, limit: Any) -> None:
    expect_error(INVALID, lambda: env.store.list_adjudication_cases(limit=limit))


def test_list_limit_is_clamped_to_200(env: Env) -> None:
    outcome_unknown_dead_letter(env, "agenda-gov", "u1", reserve=False)
    assert len(env.store.list_adjudication_cases(limit=10_000)) == 1


# --------------------------------------------------------------------------- adjudicate


def test_confirmed_not_applied_grants_one_more_attempt(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    evidence = env.store.get_adjudication_case(dead.id).evidence_digest  # type: ignore[union-attr]
    case = adjudicate(env, dead.id, "confirmed_not_applied")
    request_id = request_id_for(dead.id, "confirmed_not_applied", evidence)
    assert (case.status, case.attempt, case.max_attempts, case.fence, case.settled_at) == (
        "retry_wait",
        1,
        2,
        1,
        None,
    )
    assert (case.eligible, case.evidence_digest, case.error_code) == (
        False,
        evidence,
        "AGENDA_OUTCOME_UNKNOWN",
    )
    assert case.reservation.to_dict() == {"policyRevision": 1, "units": 1, "status": "reserved"}
    assert case.adjudication.to_dict() == {
        "occurrenceId": dead.id,
        "jobId": "agenda-gov",
        "requestId": request_id,
        "decision": "confirmed_not_applied",
        "authority": "local-operator",
        "evidenceDigest": evidence,
        "expectedAttempt": 1,
        "expectedFence": 1,
        "reasonDigest": REASON,
        "operatorDigest": OPERATOR,
        "status": "pending",
        "createdAt": env.now,
        "appliedAt": None,
        "retrySettledAt": None,
        "retryOutcome": None,
    }
    assert env.store.get_occurrence_adjudication(dead.id) == case.adjudication
    occurrence = env.store.get_occurrence(dead.id)
    assert occurrence is not None
    assert (occurrence.available_at, occurrence.lease_owner, occurrence.last_error) == (
        env.now,
        None,
        OUTCOME_UNKNOWN,
    )
    reservation = env.store.get_authority_reservation(dead.id)
    assert reservation is not None
    assert (reservation.status, reservation.outcome, reservation.settled_at) == ("reserved", None, None)
    event = env.events(dead.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"], event["occurredAt"]) == (
        "occurrence_adjudication_recorded",
        None,
        1,
        env.now,
    )
    assert event["data"] == {
        "requestId": request_id,
        "decision": "confirmed_not_applied",
        "authority": "local-operator",
        "evidenceDigest": evidence,
        "expectedAttempt": 1,
        "expectedFence": 1,
        "reasonDigest": REASON,
        "operatorDigest": OPERATOR,
        "retryAttempt": 2,
        "maxAttempts": 2,
    }


def test_confirmed_applied_grants_two_more_attempts(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1", reserve=False)
    case = adjudicate(env, dead.id, "confirmed_applied")
    assert (case.max_attempts, case.adjudication.decision, case.reservation) == (3, "confirmed_applied", None)


def test_adjudication_is_recorded_once(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    evidence = env.store.get_adjudication_case(dead.id).evidence_digest  # type: ignore[union-attr]
    first = adjudicate(env, dead.id, "confirmed_not_applied")
    before = env.dump()
    error = expect_error(
        "SCHEDULER_ADJUDICATION_ALREADY_RECORDED",
        lambda: adjudicate(env, dead.id, "confirmed_applied", expected_evidence_digest=evidence),
    )
    assert error.details == {"requestId": first.adjudication.request_id}
    assert env.dump() == before


def test_only_eligible_occurrences_can_be_adjudicated(env: Env) -> None:
    occurrence = running(env, "agenda-gov", "plain")
    settle_failed(env, occurrence, {"code": "CALENDAR_GONE"}, retryable=False)
    arguments = {
        "occurrence_id": occurrence.id,
        "decision": "confirmed_applied",
        "expected_evidence_digest": "sha256:" + "0" * 64,
        "expected_attempt": 1,
        "expected_fence": 1,
        "reason_digest": REASON,
        "operator_digest": OPERATOR,
    }
    error = expect_error(
        "SCHEDULER_ADJUDICATION_NOT_ELIGIBLE", lambda: env.store.adjudicate_occurrence(**arguments)
    )
    assert error.details == {"status": "dead_letter", "errorCode": "CALENDAR_GONE"}
    live = running(env, "agenda-gov", "live")
    error = expect_error(
        "SCHEDULER_ADJUDICATION_NOT_ELIGIBLE",
        lambda: env.store.adjudicate_occurrence(**{**arguments, "occurrence_id": live.id}),
    )
    assert error.details == {"status": "running", "errorCode": None}
    expect_error(
        "SCHEDULER_NOT_FOUND",
        lambda: env.store.adjudicate_occurrence(**{**arguments, "occurrence_id": "occ_x"}),
    )


@pytest.mark.parametrize(
    "override",
    [
        {"expected_evidence_digest": "sha256:" + "a" * 64},
        {"expected_attempt": 2},
        {"expected_fence": 2},
    ],
)
def test_the_evidence_is_compared_and_set(env: Env, override: dict[str, Any]) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    case = env.store.get_adjudication_case(dead.id)
    assert case is not None
    before = env.dump()
    error = expect_error(
        "SCHEDULER_ADJUDICATION_EVIDENCE_CONFLICT",
        lambda: adjudicate(env, dead.id, "confirmed_applied", **override),
    )
    assert error.details == {
        "actualEvidenceDigest": case.evidence_digest,
        "actualAttempt": 1,
        "actualFence": 1,
    }
    assert env.dump() == before


def test_granted_attempts_are_bounded_by_32(env: Env) -> None:
    create_job(env, "agenda-long", max_attempts=32)
    occurrence = running(env, "agenda-long", "long")
    for _ in range(30):
        settle_failed(env, occurrence, {"code": "TRANSIENT"})
        env.tick()
        occurrence = env.store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w1", lease_ms=600_000)
    assert occurrence.attempt == 31
    settle_failed(env, occurrence, OUTCOME_UNKNOWN, retryable=False)
    before = env.dump()
    expect_error(
        "SCHEDULER_ADJUDICATION_ATTEMPT_LIMIT", lambda: adjudicate(env, occurrence.id, "confirmed_applied")
    )
    assert env.dump() == before
    assert adjudicate(env, occurrence.id, "confirmed_not_applied").max_attempts == 32


@pytest.mark.parametrize(
    "override",
    [
        {"occurrence_id": None},
        {"decision": "applied"},
        {"decision": None},
        {"expected_evidence_digest": "sha256:" + "A" * 64},
        {"expected_evidence_digest": "sha256:abc"},
        {"reason_digest": "plain reason"},
        {"operator_digest": None},
        {"expected_attempt": 0},
        {"expected_attempt": 1.0},
        {"expected_fence": True},
        {"expected_fence": None},
    ],
)
def test_adjudicate_rejects_invalid_arguments(env: Env, override: dict[str, Any]) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    before = env.dump()
    expect_error(INVALID, lambda: adjudicate(env, dead.id, "confirmed_applied", **override))
    assert env.dump() == before


# --------------------------------------------------------------------------- the retry (leases.py)


def _retry(env: Env, occurrence_id: str, owner: str = "w2", lease_ms: int = 600_000) -> Any:
    env.tick()
    claimed = env.store.claim_occurrence(occurrence_id=occurrence_id, owner_id=owner, lease_ms=lease_ms)
    assert claimed is not None
    return claimed


def test_the_next_success_applies_the_adjudication(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    request_id = adjudicate(env, dead.id, "confirmed_applied").adjudication.request_id
    retry = _retry(env, dead.id)
    assert (retry.attempt, retry.fence, retry.max_attempts) == (2, 2, 3)
    settle_succeeded(env, retry, {"verified": True}, adjudication_request_id=request_id)
    adjudication = env.store.get_occurrence_adjudication(dead.id)
    assert adjudication is not None
    assert (adjudication.status, adjudication.applied_at, adjudication.retry_settled_at) == (
        "applied",
        env.now,
        env.now,
    )
    assert adjudication.retry_outcome == {"status": "succeeded", "result": {"verified": True}}
    row = env.dump()["tables"]["scheduler_occurrence_adjudications"][0]
    assert row["retry_outcome_json"] == '{"result":{"verified":true},"status":"succeeded"}'
    reservation = env.store.get_authority_reservation(dead.id)
    assert reservation is not None and reservation.status == "succeeded"
    event = env.events(dead.id)[-1]
    assert event["type"] == "occurrence_succeeded"
    assert event["data"] == {
        "attempt": 2,
        "maxAttempts": 3,
        "authorityPolicyRevision": 1,
        "authorityUnits": 1,
        "adjudicationRequestId": request_id,
    }
    case = env.store.get_adjudication_case(dead.id)
    assert case is not None and case.evidence_digest == adjudication.evidence_digest and not case.eligible


def test_a_retryable_failure_keeps_it_pending_and_a_dead_letter_applies_it(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    request_id = adjudicate(env, dead.id, "confirmed_applied").adjudication.request_id
    retry = _retry(env, dead.id)
    waiting = settle_failed(env, retry, {"code": "TRANSIENT"})
    assert waiting.status == "retry_wait"
    assert env.store.get_occurrence_adjudication(dead.id).status == "pending"  # type: ignore[union-attr]
    assert env.events(dead.id)[-1]["data"]["adjudicationRequestId"] == request_id
    final = _retry(env, dead.id, owner="w3")
    assert final.attempt == 3
    settle_failed(env, final, {"code": "GIVE_UP"})
    adjudication = env.store.get_occurrence_adjudication(dead.id)
    assert adjudication is not None
    assert adjudication.status == "applied"
    assert adjudication.retry_outcome == {"status": "dead_letter", "error": {"code": "GIVE_UP"}}
    assert env.store.get_authority_reservation(dead.id).status == "failed"  # type: ignore[union-attr]
    assert env.store.get_adjudication_case(dead.id).eligible is False  # type: ignore[union-attr]


def test_settling_with_another_adjudication_request_id_conflicts(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    adjudicate(env, dead.id, "confirmed_not_applied")
    retry = _retry(env, dead.id)
    before = env.dump()
    expect_error(
        "SCHEDULER_ADJUDICATION_SETTLEMENT_CONFLICT",
        lambda: settle_succeeded(env, retry, None, adjudication_request_id="scheduler-adjudication-other"),
    )
    assert env.dump() == before


def test_the_expired_final_retry_is_swept_and_applies_the_adjudication(env: Env) -> None:
    dead = outcome_unknown_dead_letter(env, "agenda-gov", "u1")
    request_id = adjudicate(env, dead.id, "confirmed_not_applied").adjudication.request_id
    retry = _retry(env, dead.id, lease_ms=60_000)
    assert retry.attempt == retry.max_attempts == 2
    env.tick(60_000)
    assert env.store.claim_next(owner_id="sweeper", lease_ms=60_000) is None
    swept = env.store.get_occurrence(dead.id)
    assert swept is not None and swept.status == "dead_letter"
    lease_error = {
        "code": "lease_expired",
        "message": "Execution lease expired after the final allowed attempt",
    }
    assert swept.last_error == lease_error
    adjudication = env.store.get_occurrence_adjudication(dead.id)
    assert adjudication is not None
    assert (adjudication.status, adjudication.applied_at, adjudication.retry_settled_at) == (
        "applied",
        env.now,
        env.now,
    )
    assert adjudication.retry_outcome == {"status": "dead_letter", "error": lease_error}
    reservation = env.store.get_authority_reservation(dead.id)
    assert reservation is not None
    assert (reservation.status, reservation.outcome, reservation.settled_at) == (
        "failed",
        {"status": "dead_letter", "error": lease_error},
        env.now,
    )
    event = env.events(dead.id)[-1]
    assert event["type"] == "occurrence_dead_lettered"
    assert event["data"] == {
        "attempt": 2,
        "maxAttempts": 2,
        "reason": "lease_expired",
        "adjudicationRequestId": request_id,
    }


def test_listed_cases_quote_the_same_evidence_as_single_cases(env: Env) -> None:
    """The listing hashes stored authority/payload texts once per text; its digests must equal
    the ones computed from each record (payloads differ, the authority is shared)."""
    for index, payload in enumerate([{"n": 1}, {"n": 2.5, "é": [None]}, None, {"n": 1}]):
        env.tick()
        queued = env.store.enqueue_occurrence(
            job_id="agenda-gov", scheduled_for=T0, trigger_key=f"p{index}", payload=payload
        )
        settle_failed(env, claim(env, queued.id), OUTCOME_UNKNOWN, retryable=False)
    listed = env.store.list_adjudication_cases(limit=10)
    assert len(listed) == 4
    for case in listed:
        single = env.store.get_adjudication_case(case.occurrence_id)
        assert single is not None and case.evidence_digest == single.evidence_digest
    assert len({case.evidence_digest for case in listed}) == 4
