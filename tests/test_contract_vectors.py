"""Every recorded vector of the original's pure functions (tests/fixtures/vectors/).

``domain_migration_plans.json`` is exercised by the domain-migration tests, not here.

Cases that exist only because of JavaScript's single number type (a ``note`` saying so, or
``"json_int_beyond_2_53": true``) do not apply to this API (CONTRACT.md "Decided divergences"):
for those the decided behaviour, ``SCHEDULER_INVALID_ARGUMENT``, is asserted instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from recorded import UNDEFINED, VECTORS, decode, document

from scheduler.contract import (
    SchedulerKernelError,
    canonical_json,
    canonical_scheduler_source_path,
    derive_occurrence_identity,
    is_canonical_scheduler_source_path,
    is_fully_qualified_windows_scheduler_path,
    normalize_authority_envelope,
    normalize_epoch_ms,
    normalize_history_limit,
    normalize_identifier,
    normalize_max_attempts,
    normalize_runtime_control_capability,
    scheduler_adjudication_operator_digest,
    scheduler_adjudication_reason_digest,
    scheduler_job_definition_digest,
    scheduler_migration_scope_digest,
    scheduler_migration_source_digest,
    scheduler_runtime_control_capability_digest,
    scheduler_source_path_dirname,
)

NOT_HERE = {"domain_migration_plans.json"}  # owned by the domain-migration tests
INVALID_ARGUMENT = "SCHEDULER_INVALID_ARGUMENT"
JS_NUMBER_NOTES = ("single number type", "Number.isSafeInteger")


def argument(value: Any) -> Any:
    """A required argument: JavaScript ``undefined`` is validated like ``null``."""
    return None if value is UNDEFINED else value


def _identity(value: dict[str, Any]) -> dict[str, str]:
    return derive_occurrence_identity(
        job_id=argument(value.get("jobId")),
        job_revision=argument(value.get("jobRevision")),
        scheduled_for=argument(value.get("scheduledFor")),
        trigger_key=argument(value.get("triggerKey")),
    ).to_dict()


def _identifier(value: dict[str, Any]) -> str:
    return normalize_identifier(argument(value["value"]), value["field"], value.get("maxLength", 256))


def _scalar(value: dict[str, Any]) -> int:
    function, given = value["fn"], value["value"]
    if function == "normalizeEpochMs":
        return normalize_epoch_ms(argument(given), value["field"])
    defaulted: Callable[..., int] = {
        "normalizeMaxAttempts": normalize_max_attempts,
        "normalizeHistoryLimit": normalize_history_limit,
    }[function]
    return defaulted() if given is UNDEFINED else defaulted(given)


def _job_digest(value: Any) -> str:
    job = document(value)
    if isinstance(job, dict) and isinstance(value.get("authority"), dict):
        job["authority"] = document(value["authority"])
    return scheduler_job_definition_digest(job)


def _source_path(value: dict[str, Any]) -> str:
    return canonical_scheduler_source_path(
        value["value"],
        platform=value["platform"],
        base_path=value.get("basePath"),
        allow_relative=value.get("allowRelative", True),  # the original's default
    )


CALLS: dict[str, Callable[[Any], Any]] = {
    "canonical_json": canonical_json,
    "derive_occurrence_identity": _identity,
    "normalize_authority_envelope": lambda value: normalize_authority_envelope(document(value)),
    "normalize_runtime_control_capability": lambda value: normalize_runtime_control_capability(
        document(value)
    ),
    "normalize_identifier": _identifier,
    "normalize_scalars": _scalar,
    "scheduler_job_definition_digest": _job_digest,
    "scheduler_migration_source_digest": scheduler_migration_source_digest,
    "scheduler_migration_scope_digest": scheduler_migration_scope_digest,
    "scheduler_adjudication_reason_digest": scheduler_adjudication_reason_digest,
    "scheduler_adjudication_operator_digest": scheduler_adjudication_operator_digest,
    "scheduler_runtime_control_capability_digest": lambda value: scheduler_runtime_control_capability_digest(
        document(value)
    ),
    "is_canonical_scheduler_source_path": lambda value: is_canonical_scheduler_source_path(
        value["value"], platform=value["platform"]
    ),
    "canonical_scheduler_source_path": _source_path,
    "is_fully_qualified_windows_scheduler_path": is_fully_qualified_windows_scheduler_path,
    "scheduler_source_path_dirname": lambda value: scheduler_source_path_dirname(
        value["value"], platform=value["platform"]
    ),
}


def _cases() -> list[Any]:
    params = []
    for path in sorted(VECTORS.glob("*.json")):
        if path.name in NOT_HERE:
            continue
        for index, case in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            params.append(pytest.param(path.stem, case, id=f"{path.stem}[{index}]"))
    return params


def _not_applicable(case: dict[str, Any]) -> bool:
    note = case.get("note", "")
    return bool(case.get("json_int_beyond_2_53")) or any(marker in note for marker in JS_NUMBER_NOTES)


def _same(actual: Any, expected: Any) -> bool:
    """Equality that also tells ``True`` from ``1`` and ``1`` from ``1.0``."""
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(_same(actual[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return len(actual) == len(expected) and all(map(_same, actual, expected))
    return bool(actual == expected)


@pytest.mark.parametrize(("function", "case"), _cases())
def test_vector(function: str, case: dict[str, Any]) -> None:
    call = CALLS[function]
    given = decode(case["input"])
    if _not_applicable(case) or "error_code" in case:
        expected_code = INVALID_ARGUMENT if _not_applicable(case) else case["error_code"]
        with pytest.raises(SchedulerKernelError) as raised:
            call(given)
        assert raised.value.code == expected_code, raised.value.message
        if "error_details" in case and not _not_applicable(case):
            assert raised.value.details == case["error_details"]
        return
    result = call(given)
    if "output_sha256" in case:
        encoded = result.encode("utf-8")
        assert len(encoded) == case["output_utf8_bytes"]
        assert result[:64] == case["output_prefix"]
        assert hashlib.sha256(encoded).hexdigest() == case["output_sha256"]
        return
    expected = decode(case["output"])
    assert _same(result, expected), f"{result!r} != {expected!r}"
