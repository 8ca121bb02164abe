"""Runtime-control capability declarations (CONTRACT.md; seed 000, schema v6)."""

from __future__ import annotations

from typing import Any, Final

from scheduler.contract.authority import assert_known_fields, assert_plain_object
from scheduler.contract.canonical import sha256_payload_digest
from scheduler.contract.constants import (
    PAUSE_RESUME_CHECKPOINT_V1,
    PAUSE_RESUME_NONE,
    RUNTIME_CONTROL_SAFE_POINTS,
    RUNTIME_CONTROL_SCHEMA_VERSION,
    RUNTIME_PAUSE_RESUME_MODES,
)
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import MISSING, normalize_identifier, utf16_sorted

_FIELDS: Final = frozenset({"schemaVersion", "pauseResume", "safePoints"})


def normalize_runtime_control_capability(value: object) -> dict[str, Any]:
    """Normalize an adapter's runtime-control declaration.

    ``None`` (no declaration) is ``{"schemaVersion": 1, "pauseResume": "none", "safePoints": []}``.
    ``safePoints`` are deduplicated and sorted; ``none`` requires none, ``checkpoint_v1`` at least one.
    """
    if value is None or value is MISSING:
        return {
            "schemaVersion": RUNTIME_CONTROL_SCHEMA_VERSION,
            "pauseResume": PAUSE_RESUME_NONE,
            "safePoints": [],
        }
    capability = assert_plain_object(value, "runtimeControl")
    assert_known_fields(capability, _FIELDS, "runtimeControl")
    version = capability.get("schemaVersion", MISSING)
    if version is not MISSING and not (type(version) is int and version == RUNTIME_CONTROL_SCHEMA_VERSION):
        raise invalid_argument(f"runtimeControl.schemaVersion must be {RUNTIME_CONTROL_SCHEMA_VERSION}")
    pause_resume = capability.get("pauseResume")
    if pause_resume is None:
        pause_resume = PAUSE_RESUME_NONE
    if not isinstance(pause_resume, str) or pause_resume not in RUNTIME_PAUSE_RESUME_MODES:
        raise invalid_argument("runtimeControl.pauseResume must be none or checkpoint_v1")
    declared = capability.get("safePoints")
    if declared is None:
        declared = []
    if not isinstance(declared, list):
        raise invalid_argument("runtimeControl.safePoints must be an array")
    safe_points = utf16_sorted(
        dict.fromkeys(
            normalize_identifier(point, f"runtimeControl.safePoints[{index}]", 64)
            for index, point in enumerate(declared)
        )
    )
    unknown = [point for point in safe_points if point not in RUNTIME_CONTROL_SAFE_POINTS]
    if unknown:
        raise invalid_argument("runtimeControl.safePoints contains unknown values", {"safePoints": unknown})
    if pause_resume == PAUSE_RESUME_NONE and safe_points:
        raise invalid_argument("runtimeControl.safePoints must be empty when pauseResume is none")
    if pause_resume == PAUSE_RESUME_CHECKPOINT_V1 and not safe_points:
        raise invalid_argument("runtimeControl.safePoints must declare at least one checkpoint")
    return {
        "schemaVersion": RUNTIME_CONTROL_SCHEMA_VERSION,
        "pauseResume": pause_resume,
        "safePoints": safe_points,
    }


def scheduler_runtime_control_capability_digest(capability: object) -> str:
    """``sha256:<hex>`` of the normalized capability (what a pause request is bound to)."""
    return sha256_payload_digest(
        normalize_runtime_control_capability(capability), "runtimeControl.capability"
    )
