"""Payload digests of migration sources/scopes and adjudication evidence (seed 000)."""

from __future__ import annotations

from typing import Final

from scheduler.contract.canonical import sha256_payload_digest
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import js_trim, utf8_byte_length

MAX_ADJUDICATION_REASON_BYTES: Final = 4_000


def scheduler_migration_source_digest(source: object) -> str:
    """``sha256:<hex>`` of a legacy source record (any JSON value)."""
    return sha256_payload_digest(source, "schedulerMigration.source")


def scheduler_migration_scope_digest(scope: object) -> str:
    """``sha256:<hex>`` of a legacy source scope (any JSON value)."""
    return sha256_payload_digest(scope, "schedulerMigration.sourceScope")


def scheduler_adjudication_reason_digest(reason: object) -> str:
    """``sha256:<hex>`` of an operator's reason: the untrimmed string, which must not be blank
    (JavaScript ``trim()``) and must not exceed 4000 UTF-8 bytes."""
    if not isinstance(reason, str) or not js_trim(reason):
        raise invalid_argument("adjudication reason must be a non-empty string")
    if utf8_byte_length(reason) > MAX_ADJUDICATION_REASON_BYTES:
        raise invalid_argument(f"adjudication reason must not exceed {MAX_ADJUDICATION_REASON_BYTES} bytes")
    return sha256_payload_digest(reason, "adjudication.reason")


def scheduler_adjudication_operator_digest(identity: object) -> str:
    """``sha256:<hex>`` of the operator identity (any JSON value)."""
    return sha256_payload_digest(identity, "adjudication.operatorIdentity")
