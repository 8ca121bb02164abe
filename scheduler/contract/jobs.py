"""Job definitions in wire format (camelCase keys) and their digest (seeds 001, 000)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from scheduler.contract.authority import assert_known_fields, normalize_authority_envelope
from scheduler.contract.canonical import normalize_json, sha256_payload_digest
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import (
    MISSING,
    normalize_boolean,
    normalize_identifier,
    normalize_max_attempts,
)

JOB_DEFINITION_FIELDS: Final = ("id", "kind", "trigger", "payload", "authority", "enabled", "maxAttempts")
_FIELD_SET: Final = frozenset(JOB_DEFINITION_FIELDS)


def normalize_job_definition(value: object) -> dict[str, Any]:
    """The original's ``normalizeJobInput`` on a wire-format job.

    Keys (all optional except as validated): ``id``, ``kind`` (max 128), ``trigger`` (absent or
    ``None`` → ``{}``), ``payload`` (absent → ``None``), ``authority`` (envelope v1),
    ``enabled`` (absent → ``True``; ``None`` is invalid) and ``maxAttempts`` (absent → 3;
    ``None`` is invalid). Returns a dict with exactly those seven keys.
    """
    if not isinstance(value, Mapping):
        raise invalid_argument("job must be an object")
    assert_known_fields(value, _FIELD_SET, "job")
    trigger = value.get("trigger")
    enabled = value.get("enabled", MISSING)
    return {
        "id": normalize_identifier(value.get("id"), "job.id"),
        "kind": normalize_identifier(value.get("kind"), "job.kind", 128),
        "trigger": normalize_json({} if trigger is None else trigger, "job.trigger"),
        "payload": normalize_json(value.get("payload"), "job.payload"),
        "authority": normalize_authority_envelope(value.get("authority")),
        "enabled": True if enabled is MISSING else normalize_boolean(enabled, "job.enabled"),
        "maxAttempts": normalize_max_attempts(value.get("maxAttempts", MISSING)),
    }


def job_definition(job: Mapping[str, Any]) -> dict[str, Any]:
    """The definition part of a job-like wire dict: the seven definition keys that are present."""
    return {key: job[key] for key in JOB_DEFINITION_FIELDS if key in job}


def scheduler_job_definition_digest(job: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the normalized definition of ``job`` (other keys are ignored).

    This is the digest a domain migration binds its ``targetJob`` to.
    """
    if not isinstance(job, Mapping):
        raise invalid_argument("job must be an object")
    return sha256_payload_digest(
        normalize_job_definition(job_definition(job)), "schedulerMigration.targetJob"
    )
