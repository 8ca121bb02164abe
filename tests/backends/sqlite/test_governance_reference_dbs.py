"""Governance rows of the reference databases, read and operated after ``open_store`` upgraded a copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from governance_support import (
    REFERENCE_DBS,
    UPGRADE_NOW,
    Env,
    claim,
    copy_reference,
    digest,
    expected_evidence,
    resume,
)

from scheduler.contract.canonical import canonical_json

# --------------------------------------------------------------------------- v3: adjudication


V3_PENDING = "occ_0315a75d08dd525effab350ac454d7cabe128582f15a4c06fbdc6c71d56b2d36"
V3_APPLIED = "occ_eb3a01edc17fabbecaf58d3857bc40d3a2b05ad622a052c7bdcff9e237395af2"
V3_ELIGIBLE = "occ_c343b05fb0ca9cb81e60e902f4934d84509a2022268615d83d45fbcf76389f1a"


def _reference_rows(table: str) -> dict[str, dict[str, Any]]:
    dump = json.loads((REFERENCE_DBS / "v3.upgraded.json").read_text())
    return {row["occurrence_id"]: row for row in dump["tables"][table]}


def test_upgraded_v3_cases_match_the_stored_rows(tmp_path: Path) -> None:
    env = Env(copy_reference(tmp_path, 3), UPGRADE_NOW)
    try:
        adjudications = _reference_rows("scheduler_occurrence_adjudications")
        occurrences = _reference_rows("occurrences")
        listed = env.store.list_adjudication_cases()
        assert [case.occurrence_id for case in listed] == [V3_ELIGIBLE]
        eligible = listed[0]
        assert (eligible.status, eligible.error_code, eligible.reservation.status) == (  # type: ignore[union-attr]
            "dead_letter",
            "AGENDA_OUTCOME_UNKNOWN",
            "failed",
        )
        assert eligible.evidence_digest == digest(expected_evidence(env, V3_ELIGIBLE))
        for occurrence_id in (V3_PENDING, V3_APPLIED):
            row = adjudications[occurrence_id]
            case = env.store.get_adjudication_case(occurrence_id)
            assert case is not None and case.adjudication is not None
            assert not case.eligible
            assert case.evidence_digest == row["evidence_digest"]
            assert case.status == occurrences[occurrence_id]["status"]
            assert case.adjudication.to_dict() == {
                "occurrenceId": occurrence_id,
                "jobId": row["job_id"],
                "requestId": row["request_id"],
                "decision": row["decision"],
                "authority": row["authority"],
                "evidenceDigest": row["evidence_digest"],
                "expectedAttempt": row["expected_attempt"],
                "expectedFence": row["expected_fence"],
                "reasonDigest": row["reason_digest"],
                "operatorDigest": row["operator_digest"],
                "status": row["status"],
                "createdAt": row["created_at"],
                "appliedAt": row["applied_at"],
                "retrySettledAt": row["retry_settled_at"],
                "retryOutcome": None
                if row["retry_outcome_json"] is None
                else json.loads(row["retry_outcome_json"]),
            }
    finally:
        env.store.close()


def test_the_recorded_evidence_digest_and_request_id_are_reproduced(tmp_path: Path) -> None:
    """Rewind the v3 pending adjudication to its dead-letter state and adjudicate it again."""
    recorded = _reference_rows("scheduler_occurrence_adjudications")[V3_PENDING]
    env = Env(copy_reference(tmp_path, 3), UPGRADE_NOW)
    try:
        env.store.close()
        error = _reference_rows("occurrences")[V3_PENDING]["last_error_json"]
        env.sql("DELETE FROM scheduler_occurrence_adjudications WHERE occurrence_id = ?", (V3_PENDING,))
        env.sql(
            "UPDATE occurrences SET status = 'dead_letter', max_attempts = 5, settled_at = 1767225704000 "
            "WHERE occurrence_id = ?",
            (V3_PENDING,),
        )
        env.sql(
            "UPDATE scheduler_authority_reservations SET status = 'failed', outcome_json = ?, "
            "settled_at = 1767225704000 WHERE occurrence_id = ?",
            (f'{{"error":{error},"status":"dead_letter"}}', V3_PENDING),
        )
        env.reopen()
        case = env.store.get_adjudication_case(V3_PENDING)
        assert case is not None and case.eligible
        assert case.evidence_digest == recorded["evidence_digest"]
        env.tick()
        result = env.store.adjudicate_occurrence(
            occurrence_id=V3_PENDING,
            decision=recorded["decision"],
            expected_evidence_digest=case.evidence_digest,
            expected_attempt=1,
            expected_fence=1,
            reason_digest=recorded["reason_digest"],
            operator_digest=recorded["operator_digest"],
        )
        assert result.adjudication is not None
        assert result.adjudication.request_id == recorded["request_id"]
        assert result.max_attempts == 2
    finally:
        env.store.close()


# --------------------------------------------------------------------------- v6: runtime control and requeue

V6_PENDING = "occ_0f94a72c005eacfa1da07f32aa5f290939188902465e3423d6e3a87a3523e212"
V6_PAUSED = "occ_6fdc42d648429a5dbc349453bb40c893961312734225615467ef392b7be77d16"
V6_RESUMED = "occ_7fa9ea50db1ce2f4ec3516302ae4f0eb73c019a55730f5884e60228dda3c4e54"


def test_the_v6_reference_controls_read_and_operate(tmp_path: Path) -> None:
    rows = {
        row["occurrence_id"]: row
        for row in json.loads((REFERENCE_DBS / "v6.json").read_text())["tables"][
            "scheduler_occurrence_controls"
        ]
    }
    env = Env(copy_reference(tmp_path, 6), UPGRADE_NOW)
    try:
        for occurrence_id, row in rows.items():
            control = env.store.get_occurrence_control(occurrence_id)
            assert control is not None
            assert canonical_json(control.capability) == row["capability_json"]
            assert (control.capability_digest, control.state, control.revision, control.expected_fence) == (
                row["capability_digest"],
                row["state"],
                row["revision"],
                row["expected_fence"],
            )
            assert control.checkpoint == (
                None if row["checkpoint_json"] is None else json.loads(row["checkpoint_json"])
            )
        listed = env.store.list_runtime_control_occurrences()
        statuses = {item.id: item.runtime_status for item in listed}
        assert (statuses.pop(V6_PENDING), statuses.pop(V6_PAUSED)) == ("pause_requested", "paused")
        assert V6_RESUMED not in statuses  # resumed and waiting: not running, not paused
        assert set(statuses.values()) == {"running"}  # plain running work without a control
        assert [item.updated_at for item in listed] == sorted(
            (item.updated_at for item in listed), reverse=True
        )
        resumed = claim(env, V6_RESUMED, owner="after-upgrade")
        assert (resumed.attempt, resumed.fence) == (1, 2)
        assert env.events(V6_RESUMED)[-1]["data"]["resumedWithoutAttempt"] is True
        rebound = claim(env, V6_PENDING, owner="after-upgrade")  # its lease expired before UPGRADE_NOW
        assert (rebound.attempt, rebound.fence) == (1, 2)
        control = env.store.get_occurrence_control(V6_PENDING)
        assert control is not None and (control.expected_fence, control.revision) == (2, 2)
        resume(env, V6_PAUSED, "resume-after-upgrade")
        assert claim(env, V6_PAUSED, owner="after-upgrade").attempt == 1
    finally:
        env.store.close()


def test_the_v6_reference_requeue_is_claimed_without_an_attempt(tmp_path: Path) -> None:
    occurrence_id = "occ_e8d366f42e37ab7a4eb24fcd5127d424b5654557389d6a5263fbc8a85a9a3a53"
    env = Env(copy_reference(tmp_path, 6), UPGRADE_NOW)
    try:
        waiting = env.store.get_occurrence(occurrence_id)
        assert waiting is not None and (waiting.status, waiting.attempt, waiting.max_attempts) == (
            "retry_wait",
            1,
            1,
        )
        replay = env.store.requeue_dead_letter(
            occurrence_id=occurrence_id,
            expected_fence=1,
            expected_error_code="COWORK_SYNC_FAILED",
            request_id="requeue-req-001",
        )
        assert (replay.deduplicated, replay.occurrence) == (True, waiting)
        claimed = claim(env, occurrence_id, owner="after-upgrade")
        assert (claimed.attempt, claimed.fence) == (1, 2)
        assert env.events(occurrence_id)[-1]["data"]["retryRequestId"] == "requeue-req-001"
    finally:
        env.store.close()
