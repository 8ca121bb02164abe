"""What a settlement asks for: ``settle``/``settle_many`` arguments validated in the seed's order
into a :class:`SettleRequest` (``result``/``error`` normalized and encoded once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from scheduler.contract.canonical import JSON, normalize_and_encode_json
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import assert_positive_safe_int, normalize_boolean, normalize_epoch_ms
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.occurrence_rows import reject_unknown_fields

DEFAULT_ERROR: Final = {"code": "execution_failed", "message": "Execution failed"}
SETTLE_FIELDS: Final = frozenset(
    {
        "occurrence_id",
        "owner_id",
        "fence",
        "outcome",
        "result",
        "error",
        "retryable",
        "retry_at",
        "adjudication_request_id",
    }
)


@dataclass(frozen=True, slots=True)
class SettleRequest:
    """A validated settlement; ``result``/``error`` are normalized and pre-encoded."""

    occurrence_id: str
    owner_id: str
    fence: int
    succeeded: bool
    retryable: bool
    result: JSON
    result_json: str | None
    error: JSON
    error_json: str | None
    retry_at: int | None
    adjudication_request_id: str | None


def normalize_settle(
    *,
    occurrence_id: Any,
    owner_id: Any,
    fence: Any,
    outcome: Any,
    result: Any = None,
    error: Any = None,
    retryable: Any = True,
    retry_at: Any = None,
    adjudication_request_id: Any = None,
) -> SettleRequest:
    """Validate in the seed's order; ``result`` is ignored on failure, ``error``/``retry_at`` on success."""
    identifier = normalize_key(occurrence_id, "occurrenceId")
    owner = normalize_key(owner_id, "ownerId")
    token = assert_positive_safe_int(fence, "fence")
    if not isinstance(outcome, str) or outcome not in ("succeeded", "failed"):
        raise invalid_argument("outcome must be succeeded or failed")
    normalize_boolean(retryable, "retryable")
    succeeded = outcome == "succeeded"
    normalized_result, result_json = (
        (None, None)
        if not succeeded
        else (None, "null")  # normalize_and_encode_json(None)
        if result is None
        else normalize_and_encode_json(result, "result")
    )
    normalized_error, error_json = (
        (None, None)
        if succeeded
        else normalize_and_encode_json(DEFAULT_ERROR if error is None else error, "error")
    )
    retry = None if succeeded or retry_at is None else normalize_epoch_ms(retry_at, "retryAt")
    adjudication = (
        None
        if adjudication_request_id is None
        else normalize_key(adjudication_request_id, "adjudicationRequestId", 128)
    )
    return SettleRequest(
        identifier,
        owner,
        token,
        succeeded,
        retryable,
        normalized_result,
        result_json,
        normalized_error,
        error_json,
        retry,
        adjudication,
    )


def normalize_settle_mapping(settlement: Any) -> SettleRequest:
    """One ``settle_many`` item: a dict of ``settle`` keyword arguments."""
    fields = reject_unknown_fields(settlement, SETTLE_FIELDS, "settlement")
    arguments = {"occurrence_id": None, "owner_id": None, "fence": None, "outcome": None, **fields}
    return normalize_settle(**arguments)
