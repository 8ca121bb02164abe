"""Adjudication of outcome-unknown dead letters (schema v3).

Seed 000: ``_adjudicationCase``, ``getAdjudicationCase``, ``listAdjudicationCases``,
``getOccurrenceAdjudication``, ``adjudicateOccurrence``. The pending → applied transition on the
next settlement (``settlement.py``) or expired-final sweep (``claim_writes.py``) lives there.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.engine import Row

from scheduler.contract.canonical import sha256_payload_digest
from scheduler.contract.constants import (
    CONFIRMED_APPLIED,
    DEAD_LETTER,
    MAX_JOB_ATTEMPTS,
    SCHEDULER_ADJUDICATION_AUTHORITY,
    SCHEDULER_ADJUDICATION_DECISIONS,
)
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import (
    assert_positive_safe_int,
    normalize_history_limit,
    normalize_sha256_digest,
)
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import (
    load_authority_reservation,
    load_occurrence,
    lock_occurrence_row,
    map_authority_reservation,
    occurrence_not_found,
)
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.dead_letters import newest_dead_letters
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.plumbing.constructs import row_check
from scheduler.store.plumbing.rows import read_stored_authority, read_stored_json
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import (
    Adjudication,
    AdjudicationCase,
    AuthorityReservation,
    Occurrence,
    ReservationSummary,
)

OUTCOME_UNKNOWN_CODE: Final = re.compile(r"[A-Z0-9_]+_OUTCOME_UNKNOWN")
CANDIDATE_SCAN_LIMIT: Final = 1000
EVIDENCE_CONFLICT: Final = "SCHEDULER_ADJUDICATION_EVIDENCE_CONFLICT"


def is_outcome_unknown_error(error: Any) -> bool:
    """``error.code`` is a string matching ``^[A-Z0-9_]+_OUTCOME_UNKNOWN$`` (seed: isOutcomeUnknownError)."""
    code = error.get("code") if isinstance(error, dict) else None
    return isinstance(code, str) and OUTCOME_UNKNOWN_CODE.fullmatch(code) is not None


def _error_code(error: Any) -> str | None:
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def normalize_adjudication_decision(value: object) -> str:
    if not isinstance(value, str) or value not in SCHEDULER_ADJUDICATION_DECISIONS:
        raise invalid_argument("decision must be confirmed_applied or confirmed_not_applied")
    return value


def map_adjudication(row: Row[Any] | None) -> Adjudication | None:
    """Seed: mapAdjudication."""
    if row is None:
        return None
    return Adjudication(
        occurrence_id=row.occurrence_id,
        job_id=row.job_id,
        request_id=row.request_id,
        decision=row.decision,
        authority=row.authority,
        evidence_digest=row.evidence_digest,
        expected_attempt=row.expected_attempt,
        expected_fence=row.expected_fence,
        reason_digest=row.reason_digest,
        operator_digest=row.operator_digest,
        status=row.status,
        created_at=row.created_at,
        applied_at=row.applied_at,
        retry_settled_at=row.retry_settled_at,
        retry_outcome=None
        if row.retry_outcome_json is None
        else read_stored_json(row.retry_outcome_json, "adjudication retry outcome"),
    )


def load_adjudication(tx: Tx, occurrence_id: str) -> Adjudication | None:
    a = t.adjudications
    return map_adjudication(tx.first(select(a).where(a.c.occurrence_id == occurrence_id)))


@functools.lru_cache(maxsize=1024)
def _stored_authority_digest(text: str) -> str:
    """The digest of the authority an occurrence record holds for this stored text.

    Occurrences of one job share their authority (and often their payload) texts, so a listing of
    many cases hashes each distinct text once; the digest is that of the record's value, exactly
    as if it were computed from the record (``occurrence_rows.occurrence_record``).
    """
    authority = read_stored_authority(text, "occurrence authority")
    return sha256_payload_digest(authority, "adjudication.authority")


@functools.lru_cache(maxsize=1024)
def _stored_payload_digest(text: str) -> str:
    """The digest of the payload an occurrence record holds for this stored text."""
    return sha256_payload_digest(read_stored_json(text, "occurrence payload"), "adjudication.payload")


def adjudication_evidence(
    occurrence: Occurrence, reservation: AuthorityReservation | None, row: Any = None
) -> dict[str, Any]:
    """The document whose digest an operator confirms (seed: adjudicationEvidence).

    ``row``: the occurrence's stored row when at hand, whose JSON texts give the authority and
    payload digests without re-encoding the parsed values.
    """
    if row is None:
        authority_digest = sha256_payload_digest(occurrence.authority, "adjudication.authority")
        payload_digest = sha256_payload_digest(occurrence.payload, "adjudication.payload")
    else:
        authority_digest = _stored_authority_digest(row.authority_json)
        payload_digest = _stored_payload_digest(row.payload_json)
    return {
        "schemaVersion": 1,
        "occurrence": {
            "id": occurrence.id,
            "jobId": occurrence.job_id,
            "jobRevision": occurrence.job_revision,
            "idempotencyKey": occurrence.idempotency_key,
            "triggerKey": occurrence.trigger_key,
            "scheduledFor": occurrence.scheduled_for,
            "status": occurrence.status,
            "attempt": occurrence.attempt,
            "maxAttempts": occurrence.max_attempts,
            "fence": occurrence.fence,
            "authorityDigest": authority_digest,
            "payloadDigest": payload_digest,
            "lastError": occurrence.last_error,
            "settledAt": occurrence.settled_at,
        },
        "reservation": None if reservation is None else _reservation_evidence(reservation),
    }


def _reservation_evidence(reservation: AuthorityReservation) -> dict[str, Any]:
    return {
        "jobId": reservation.job_id,
        "principal": reservation.principal,
        "policyRevision": reservation.policy_revision,
        "windowStartedAt": reservation.window_started_at,
        "units": reservation.units,
        "status": reservation.status,
        "outcomeDigest": None
        if reservation.outcome is None
        else sha256_payload_digest(reservation.outcome, "adjudication.reservationOutcome"),
        "createdAt": reservation.created_at,
        "settledAt": reservation.settled_at,
    }


def deterministic_adjudication_request_id(
    *, occurrence_id: str, decision: str, evidence_digest: str, reason_digest: str
) -> str:
    """``scheduler-adjudication-<hex>``: the same decision on the same evidence is the same request."""
    digest = sha256_payload_digest(
        {
            "schemaVersion": 1,
            "occurrenceId": occurrence_id,
            "decision": decision,
            "evidenceDigest": evidence_digest,
            "reasonDigest": reason_digest,
        },
        "adjudication.request",
    )
    return f"scheduler-adjudication-{digest.removeprefix('sha256:')}"


def load_adjudication_case(tx: Tx, occurrence_id: str) -> AdjudicationCase | None:
    """The occurrence seen as an adjudication case (seed: _adjudicationCase)."""
    occurrence = load_occurrence(tx, occurrence_id)
    if occurrence is None:
        return None
    reservation = load_authority_reservation(tx, occurrence_id)
    return adjudication_case(occurrence, reservation, load_adjudication(tx, occurrence_id))


def adjudication_case(
    occurrence: Occurrence,
    reservation: AuthorityReservation | None,
    adjudication: Adjudication | None,
    row: Any = None,
) -> AdjudicationCase:
    """The case of an occurrence given its reservation and adjudication rows (``row``: its stored
    occurrence row, see :func:`adjudication_evidence`)."""
    eligible = (
        occurrence.status == DEAD_LETTER
        and is_outcome_unknown_error(occurrence.last_error)
        and adjudication is None
    )
    if eligible:
        evidence_digest: str | None = sha256_payload_digest(
            adjudication_evidence(occurrence, reservation, row), "adjudication.evidence"
        )
    else:
        evidence_digest = None if adjudication is None else adjudication.evidence_digest
    return AdjudicationCase(
        occurrence_id=occurrence.id,
        job_id=occurrence.job_id,
        status=occurrence.status,
        attempt=occurrence.attempt,
        max_attempts=occurrence.max_attempts,
        fence=occurrence.fence,
        settled_at=occurrence.settled_at,
        error_code=_error_code(occurrence.last_error),
        authority_principal=occurrence.authority["principal"],
        reservation=None
        if reservation is None
        else ReservationSummary(
            policy_revision=reservation.policy_revision, units=reservation.units, status=reservation.status
        ),
        eligible=eligible,
        evidence_digest=evidence_digest,
        adjudication=adjudication,
    )


_RESERVATIONS: Final = Prepared(
    select(t.authority_reservations).where(
        t.authority_reservations.c.occurrence_id.in_(bindparam("ids", expanding=True))
    )
)


def candidate_cases(tx: Tx, rows: Sequence[Any]) -> list[AdjudicationCase]:
    """Cases of candidate rows (outcome-unknown dead letters without an adjudication, read in
    this snapshot), their reservations read with one query."""
    ids = [row.occurrence_id for row in rows]
    reservations = {
        row.occurrence_id: map_authority_reservation(row) for row in tx.all(_RESERVATIONS, {"ids": ids})
    }
    return [
        adjudication_case(occurrence_record(row), reservations.get(row.occurrence_id), None, row)
        for row in rows
    ]


def list_adjudication_cases_in(tx: Tx, limit: int) -> list[AdjudicationCase]:
    """Eligible cases, newest settlement first (seed: the first 1000 candidates, filtered, sliced).

    Candidates are read a few at a time (``dead_letters.newest_dead_letters``) until ``limit``
    are eligible, which returns what the seed's eager version returns.
    """
    cases: list[AdjudicationCase] = []
    loaded = 0
    count = limit
    while True:
        candidates = newest_dead_letters(tx, unknown_only=True, count=count)
        for case in candidate_cases(tx, candidates[loaded:]) if len(candidates) > loaded else []:
            if case.eligible:
                cases.append(case)
                if len(cases) == limit:
                    return cases
        loaded = len(candidates)
        if loaded < count or count == CANDIDATE_SCAN_LIMIT:
            return cases
        count = min(CANDIDATE_SCAN_LIMIT, count * 4)


def _assert_adjudicable(case: AdjudicationCase, evidence_digest: str, attempt: int, fence: int) -> None:
    identifier = case.occurrence_id
    if case.adjudication is not None:
        raise SchedulerKernelError(
            "SCHEDULER_ADJUDICATION_ALREADY_RECORDED",
            f"Scheduler occurrence already has a monotonic adjudication: {identifier}",
            {"requestId": case.adjudication.request_id},
        )
    if not case.eligible:
        raise SchedulerKernelError(
            "SCHEDULER_ADJUDICATION_NOT_ELIGIBLE",
            f"Scheduler occurrence is not an outcome-unknown dead letter: {identifier}",
            {"status": case.status, "errorCode": case.error_code},
        )
    if case.evidence_digest != evidence_digest or case.attempt != attempt or case.fence != fence:
        raise SchedulerKernelError(
            EVIDENCE_CONFLICT,
            f"Scheduler adjudication evidence changed: {identifier}",
            {
                "actualEvidenceDigest": case.evidence_digest,
                "actualAttempt": case.attempt,
                "actualFence": case.fence,
            },
        )


def adjudicate_occurrence_in(tx: Tx, request: dict[str, Any]) -> AdjudicationCase:
    """Record an operator decision and send the occurrence back to ``retry_wait`` (one bounded claim)."""
    occurrence_id: str = request["occurrence_id"]
    attempt: int = request["attempt"]
    fence: int = request["fence"]
    lock_occurrence_row(tx, occurrence_id)
    case = load_adjudication_case(tx, occurrence_id)
    if case is None:
        raise occurrence_not_found(occurrence_id)
    _assert_adjudicable(case, request["evidence_digest"], attempt, fence)
    granted = attempt + 2 if request["decision"] == CONFIRMED_APPLIED else attempt + 1
    if granted > MAX_JOB_ATTEMPTS:
        raise SchedulerKernelError(
            "SCHEDULER_ADJUDICATION_ATTEMPT_LIMIT",
            f"Scheduler occurrence cannot receive a bounded adjudication claim: {occurrence_id}",
        )
    request_id = deterministic_adjudication_request_id(
        occurrence_id=occurrence_id,
        decision=request["decision"],
        evidence_digest=request["evidence_digest"],
        reason_digest=request["reason_digest"],
    )
    _record(tx, case, request, request_id)
    _reopen_occurrence(tx, occurrence_id, attempt, fence, granted)
    r = t.authority_reservations
    tx.execute(
        update(r)
        .where(r.c.occurrence_id == occurrence_id, r.c.status == "failed")
        .values(status="reserved", outcome_json=None, settled_at=None)
    )
    tx.append_event(
        job_id=case.job_id,
        occurrence_id=occurrence_id,
        type="occurrence_adjudication_recorded",
        fence=fence,
        data={
            "requestId": request_id,
            "decision": request["decision"],
            "authority": SCHEDULER_ADJUDICATION_AUTHORITY,
            "evidenceDigest": request["evidence_digest"],
            "expectedAttempt": attempt,
            "expectedFence": fence,
            "reasonDigest": request["reason_digest"],
            "operatorDigest": request["operator_digest"],
            "retryAttempt": attempt + 1,
            "maxAttempts": granted,
        },
    )
    updated = load_adjudication_case(tx, occurrence_id)
    assert updated is not None
    return updated


def _record(tx: Tx, case: AdjudicationCase, request: dict[str, Any], request_id: str) -> None:
    tx.execute(
        insert(t.adjudications).values(
            occurrence_id=case.occurrence_id,
            job_id=case.job_id,
            request_id=request_id,
            decision=request["decision"],
            authority=SCHEDULER_ADJUDICATION_AUTHORITY,
            evidence_digest=request["evidence_digest"],
            expected_attempt=request["attempt"],
            expected_fence=request["fence"],
            reason_digest=request["reason_digest"],
            operator_digest=request["operator_digest"],
            status="pending",
            created_at=tx.now,
            applied_at=None,
            retry_settled_at=None,
            retry_outcome_json=None,
        )
    )


def _reopen_occurrence(tx: Tx, occurrence_id: str, attempt: int, fence: int, max_attempts: int) -> None:
    o = t.occurrences
    changed = tx.changes(
        update(o)
        .where(
            o.c.occurrence_id == occurrence_id,
            row_check(o.c.status == DEAD_LETTER),
            o.c.attempt == attempt,
            o.c.fence == fence,
        )
        .values(
            status="retry_wait",
            available_at=tx.now,
            max_attempts=max_attempts,
            lease_owner=None,
            lease_expires_at=None,
            result_json=None,
            updated_at=tx.now,
            settled_at=None,
        )
    )
    if changed != 1:
        raise SchedulerKernelError(
            EVIDENCE_CONFLICT, f"Scheduler occurrence changed during adjudication: {occurrence_id}"
        )


class AdjudicationOperations(StoreBase):
    """Public adjudication methods of ``SchedulerStore``."""

    def get_adjudication_case(self, occurrence_id: Any) -> AdjudicationCase | None:
        """The occurrence as an adjudication case (eligibility, evidence digest), or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(occurrence_id, "occurrenceId")
        return self._read(lambda tx: load_adjudication_case(tx, identifier))

    def list_adjudication_cases(self, *, limit: Any = 50) -> list[AdjudicationCase]:
        """Outcome-unknown dead letters without an adjudication, newest settlement first."""
        self._assert_open()  # seed: a read checks the store before its arguments
        bounded = normalize_history_limit(limit)
        return self._read(lambda tx: list_adjudication_cases_in(tx, bounded))

    def get_occurrence_adjudication(self, occurrence_id: Any) -> Adjudication | None:
        """The occurrence's adjudication record, or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(occurrence_id, "occurrenceId")
        return self._read(lambda tx: load_adjudication(tx, identifier))

    def adjudicate_occurrence(
        self,
        *,
        occurrence_id: Any,
        decision: Any,
        expected_evidence_digest: Any,
        expected_attempt: Any,
        expected_fence: Any,
        reason_digest: Any,
        operator_digest: Any,
    ) -> AdjudicationCase:
        """Record a local operator's decision on an outcome-unknown dead letter (compare-and-set)."""
        request = {
            "occurrence_id": normalize_key(occurrence_id, "occurrenceId"),
            "decision": normalize_adjudication_decision(decision),
            "evidence_digest": normalize_sha256_digest(expected_evidence_digest, "expectedEvidenceDigest"),
            "reason_digest": normalize_sha256_digest(reason_digest, "reasonDigest"),
            "operator_digest": normalize_sha256_digest(operator_digest, "operatorDigest"),
            "attempt": assert_positive_safe_int(expected_attempt, "expectedAttempt"),
            "fence": assert_positive_safe_int(expected_fence, "expectedFence"),
        }
        return self._write(lambda tx: adjudicate_occurrence_in(tx, request))
