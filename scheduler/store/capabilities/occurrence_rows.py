"""Shared pieces of the occurrence lifecycle: record mapping, buffered events, batch plumbing.

``occurrence_record`` is :func:`scheduler.store.plumbing.rows.map_occurrence` for a row, or for a row with
the columns an UPDATE just wrote applied to it, so a write never has to read its row back. The
authority envelope of a stored text is validated once and memoized (the same few envelopes recur
on every row); each record still gets its own copy.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from scheduler.contract.canonical import canonical_json, json_string
from scheduler.contract.constants import MAX_JSON_BYTES, MAX_SAFE_INTEGER
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.store.plumbing.rows import read_stored_authority, read_stored_json
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

T = TypeVar("T")

_AUTHORITY_MEMO_SIZE: Final = 1024
# stored authority text -> its normalized envelope, serialized (``marshal`` keeps key order and
# rebuilds a fresh, independent copy for every record far faster than a recursive copy).
_authorities: dict[str, bytes] = {}


def stored_authority(encoded: str) -> dict[str, Any]:
    """``read_stored_authority`` of an occurrence's ``authority_json`` (validated once per text)."""
    frozen = _authorities.get(encoded)
    if frozen is None:
        frozen = marshal.dumps(read_stored_authority(encoded, "occurrence authority"))
        if len(_authorities) >= _AUTHORITY_MEMO_SIZE:
            _authorities.clear()
        _authorities[encoded] = frozen
    copied: dict[str, Any] = marshal.loads(frozen)
    return copied


def _stored_json(encoded: str, field: str) -> Any:
    """``read_stored_json``; the frequent ``null`` needs no parser."""
    return None if encoded == "null" else read_stored_json(encoded, field)


def _optional_json(encoded: str | None, field: str) -> Any:
    return None if encoded is None or encoded == "null" else read_stored_json(encoded, field)


def _columns(row: Any, changes: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if isinstance(row, Mapping):
        return {**row, **changes} if changes else row
    values = row._mapping
    if changes:
        if type(values) is dict:  # a fast-path row's ``_mapping`` is a fresh dict
            values.update(changes)
        else:
            values = {**values, **changes}
    return values  # type: ignore[no-any-return]


def occurrence_record(
    row: Any, changes: Mapping[str, Any] | None = None, deduplicated: bool | None = None
) -> Occurrence:
    """The record of an ``occurrences`` row (a Row, or a mapping of its columns) plus ``changes``."""
    values = _columns(row, changes)
    return Occurrence(
        id=values["occurrence_id"],
        job_id=values["job_id"],
        job_revision=values["job_revision"],
        idempotency_key=values["idempotency_key"],
        trigger_key=values["trigger_key"],
        scheduled_for=values["scheduled_for"],
        available_at=values["available_at"],
        status=values["status"],
        attempt=values["attempt"],
        max_attempts=values["max_attempts"],
        fence=values["fence"],
        lease_owner=values["lease_owner"],
        lease_expires_at=values["lease_expires_at"],
        authority=stored_authority(values["authority_json"]),
        payload=_stored_json(values["payload_json"], "occurrence payload"),
        last_error=_optional_json(values["last_error_json"], "occurrence error"),
        result=_optional_json(values["result_json"], "occurrence result"),
        created_at=values["created_at"],
        updated_at=values["updated_at"],
        settled_at=values["settled_at"],
        deduplicated=deduplicated,
    )


def event_data_json(data: dict[str, Any]) -> str:
    """``canonical_json(data, "event.data")`` of the flat event data the lifecycle writes.

    With ASCII identifier keys (sorted the same by code point and by UTF-16 unit, none an array
    index) and string, safe-integer, boolean or null values, the canonical text is the sorted
    ``"key":value`` pairs; anything else goes through ``canonical_json``.
    """
    parts: list[str] = []
    for key in sorted(data):
        value = data[key]
        kind = type(value)
        if kind is str:
            text = json_string(value)
        elif kind is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            text = str(value)
        elif value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        else:
            return canonical_json(data, "event.data")
        if type(key) is not str or not (key.isascii() and key.isidentifier()):
            return canonical_json(data, "event.data")
        parts.append(f'"{key}":{text}')
    encoded = "{" + ",".join(parts) + "}"
    if len(encoded) * 4 > MAX_JSON_BYTES:  # possibly over the limit: let canonical_json decide
        return canonical_json(data, "event.data")
    return encoded


class EventLog:
    """Events of one operation, appended in order and written with one ``executemany``."""

    __slots__ = ("_rows", "_tx")

    def __init__(self, tx: Tx) -> None:
        self._rows: list[dict[str, Any]] = []
        self._tx = tx  # ``now`` is read at the first event, after the operation locked its rows

    def add(
        self,
        *,
        job_id: str,
        type: str,
        occurrence_id: str,
        data: dict[str, Any],
        owner_id: str | None = None,
        fence: int | None = None,
    ) -> None:
        self._rows.append(
            {
                "job_id": job_id,
                "occurrence_id": occurrence_id,
                "event_type": type,
                "occurred_at": self._tx.now,
                "owner_id": owner_id,
                "fence": fence,
                "data_json": event_data_json(data),
            }
        )

    def flush(self, tx: Tx) -> None:
        if self._rows:
            tx.insert_events(self._rows)
            self._rows = []


def with_index(error: SchedulerKernelError, index: int) -> SchedulerKernelError:
    """Tag a batch item's error with its position (merged into a dict ``details``)."""
    if error.details is None:
        error.details = {"index": index}
    elif isinstance(error.details, dict):
        error.details = {**error.details, "index": index}
    return error


def validate_batch(items: Any, normalize: Callable[[Any], T], field: str) -> list[T]:
    """Validate every item of a batch (a list) before any transaction opens."""
    if not isinstance(items, (list, tuple)):
        raise invalid_argument(f"{field} must be a list")
    normalized: list[T] = []
    for index, item in enumerate(items):
        try:
            normalized.append(normalize(item))
        except SchedulerKernelError as error:
            with_index(error, index)
            raise
    return normalized


def reject_unknown_fields(item: Any, allowed: frozenset[str], what: str) -> Mapping[str, Any]:
    """A batch item must be a dict of the single call's keyword arguments."""
    if not isinstance(item, Mapping):
        raise invalid_argument(f"{what} must be a dict")
    unknown = sorted(str(key) for key in item if key not in allowed)
    if unknown:
        raise invalid_argument(f"{what} contains unknown fields", {"fields": unknown})
    return item


def chunks(values: Sequence[T], size: int = 500) -> list[Sequence[T]]:
    """``values`` in slices small enough for one ``IN (…)`` list."""
    return [values[start : start + size] for start in range(0, len(values), size)]
