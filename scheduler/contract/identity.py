"""Occurrence identity: the stable id and idempotency key of one logical firing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from scheduler.contract.canonical import json_string
from scheduler.contract.constants import CONTRACT_VERSION
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import is_safe_int, normalize_epoch_ms, normalize_identifier

_DOMAIN: Final = b"chainlesschain.scheduler.occurrence.v1\0"


@dataclass(frozen=True, slots=True)
class OccurrenceIdentity:
    """``occurrence_id = "occ_" + digest``, ``idempotency_key = "scheduler:v1:" + digest``."""

    occurrence_id: str
    idempotency_key: str

    def to_dict(self) -> dict[str, str]:
        """``{"occurrenceId", "idempotencyKey"}`` as the original returns it."""
        return {"occurrenceId": self.occurrence_id, "idempotencyKey": self.idempotency_key}


def identity_digest_parts(job_id: str, scheduled_for: int, trigger_key: str) -> tuple[bytes, bytes]:
    """The bytes :func:`derive_occurrence_identity` takes the digest of, before and after the job
    revision's decimal digits, for values it validated (a statement that reads the revision
    hashes them itself: ``scheduler/backends/postgresql/queries.sql``, ``enqueue``).

    The keys are already in canonical order and every value is a safe int or a short string, so
    the canonical text is assembled directly (same bytes as canonical_json of the object)."""
    head = f'{{"contractVersion":{CONTRACT_VERSION},"jobId":{json_string(job_id)},"jobRevision":'
    tail = f',"scheduledFor":{scheduled_for},"triggerKey":{json_string(trigger_key)}}}'
    return _DOMAIN + head.encode("utf-8"), tail.encode("utf-8")


def derive_occurrence_identity(
    *, job_id: object, job_revision: object, scheduled_for: object, trigger_key: object
) -> OccurrenceIdentity:
    """Derive the identity from the job id, job revision, scheduled time and trigger key.

    The digest is sha256 of ``"chainlesschain.scheduler.occurrence.v1\\0"`` followed by the
    canonical JSON of ``{contractVersion: 1, jobId, jobRevision, scheduledFor, triggerKey}``.
    Fields are validated in that order (identifiers, revision >= 1, epoch ms).
    """
    normalized_job_id = normalize_identifier(job_id, "jobId")
    if not is_safe_int(job_revision) or job_revision < 1:
        raise invalid_argument("jobRevision must be a positive integer")
    normalized_scheduled_for = normalize_epoch_ms(scheduled_for, "scheduledFor")
    normalized_trigger_key = normalize_identifier(trigger_key, "triggerKey")
    head, tail = identity_digest_parts(normalized_job_id, normalized_scheduled_for, normalized_trigger_key)
    digest = hashlib.sha256(head + str(int(job_revision)).encode("ascii") + tail).hexdigest()
    return OccurrenceIdentity(occurrence_id=f"occ_{digest}", idempotency_key=f"scheduler:v1:{digest}")
