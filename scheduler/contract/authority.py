"""Authority envelope v1, principals and capability lists (CONTRACT.md; seeds 002)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from scheduler.contract.constants import AUTHORITY_ENVELOPE_VERSION
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import (
    MISSING,
    normalize_identifier,
    normalize_optional_identifier,
    utf16_sorted,
)

_AUTHORITY_FIELDS: Final = frozenset(
    {"schemaVersion", "principal", "tenantId", "workspaceId", "requestedCapabilities", "authorizationRefs"}
)
_PRINCIPAL_FIELDS: Final = frozenset({"type", "id"})
_REF_FIELDS: Final = frozenset(
    {"decisionId", "policyRevision", "schedulerPolicyRevision", "grantIds", "approvalIds", "delegationIds"}
)
MAX_IDENTIFIER_LIST: Final = 256


def assert_plain_object(value: object, field: str) -> dict[str, Any]:
    """``value`` must be a ``dict`` (exactly; subclasses are not plain objects)."""
    if not isinstance(value, dict):
        raise invalid_argument(f"{field} must be an object")
    if type(value) is not dict:
        raise invalid_argument(f"{field} must be a plain object")
    return value


def assert_known_fields(value: Mapping[str, object], allowed: Iterable[str], field: str) -> None:
    """Reject keys outside ``allowed`` with ``details = {"fields": sorted unknown keys}``."""
    allowed_set = allowed if isinstance(allowed, frozenset) else frozenset(allowed)
    unknown = [key for key in value if key not in allowed_set]
    if unknown:
        names = [key if isinstance(key, str) else str(key) for key in unknown]
        raise invalid_argument(f"{field} contains unknown fields", {"fields": utf16_sorted(names)})


def _identifier_list(value: object, field: str) -> list[str]:
    if value is MISSING:
        return []
    if not isinstance(value, list):
        raise invalid_argument(f"{field} must be an array")
    if len(value) > MAX_IDENTIFIER_LIST:
        raise invalid_argument(f"{field} exceeds {MAX_IDENTIFIER_LIST} entries")
    normalized = [normalize_identifier(entry, f"{field}[{index}]") for index, entry in enumerate(value)]
    return utf16_sorted(dict.fromkeys(normalized))


def normalize_authority_envelope(value: object) -> dict[str, Any]:
    """Normalize an authority envelope v1 to its fixed output shape.

    Output keys: ``schemaVersion`` (1), ``principal`` ``{type, id}``, ``tenantId``,
    ``workspaceId``, ``requestedCapabilities`` (deduplicated, UTF-16 sorted) and
    ``authorizationRefs`` (``schedulerPolicyRevision`` only when given). Unknown keys anywhere
    raise ``SCHEDULER_INVALID_ARGUMENT`` with ``details = {"fields": [...]}``.
    """
    authority = assert_plain_object(value, "authority")
    assert_known_fields(authority, _AUTHORITY_FIELDS, "authority")
    version = authority.get("schemaVersion", MISSING)
    if version is not MISSING and not (type(version) is int and version == AUTHORITY_ENVELOPE_VERSION):
        raise invalid_argument(f"authority.schemaVersion must be {AUTHORITY_ENVELOPE_VERSION}")
    principal = assert_plain_object(authority.get("principal"), "authority.principal")
    assert_known_fields(principal, _PRINCIPAL_FIELDS, "authority.principal")
    refs_value = authority.get("authorizationRefs")
    refs = assert_plain_object({} if refs_value is None else refs_value, "authority.authorizationRefs")
    assert_known_fields(refs, _REF_FIELDS, "authority.authorizationRefs")

    prefix = "authority.authorizationRefs"
    normalized_principal = {
        "type": normalize_identifier(principal.get("type"), "authority.principal.type", 64),
        "id": normalize_identifier(principal.get("id"), "authority.principal.id"),
    }
    tenant_id = normalize_optional_identifier(authority.get("tenantId"), "authority.tenantId")
    workspace_id = normalize_optional_identifier(authority.get("workspaceId"), "authority.workspaceId")
    capabilities = _identifier_list(
        authority.get("requestedCapabilities", MISSING), "authority.requestedCapabilities"
    )
    normalized_refs: dict[str, Any] = {
        name: normalize_optional_identifier(refs.get(name), f"{prefix}.{name}")
        for name in ("decisionId", "policyRevision")
    }
    if "schedulerPolicyRevision" in refs:
        normalized_refs["schedulerPolicyRevision"] = normalize_optional_identifier(
            refs["schedulerPolicyRevision"], f"{prefix}.schedulerPolicyRevision"
        )
    for name in ("grantIds", "approvalIds", "delegationIds"):
        normalized_refs[name] = _identifier_list(refs.get(name, MISSING), f"{prefix}.{name}")
    return {
        "schemaVersion": AUTHORITY_ENVELOPE_VERSION,
        "principal": normalized_principal,
        "tenantId": tenant_id,
        "workspaceId": workspace_id,
        "requestedCapabilities": capabilities,
        "authorizationRefs": normalized_refs,
    }


def normalize_authority_principal(value: object) -> dict[str, str]:
    """A policy principal ``{type (max 64), id}``; other keys are ignored, as in the original."""
    if not isinstance(value, dict):
        raise invalid_argument("authority principal must be an object")
    return {
        "type": normalize_identifier(value.get("type"), "authority.principal.type", 64),
        "id": normalize_identifier(value.get("id"), "authority.principal.id"),
    }


def normalize_capability_list(value: object, field: str = "capabilities") -> list[str]:
    """A policy's capabilities: 1..256 identifiers, deduplicated, UTF-16 sorted, no ``"*"``."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_IDENTIFIER_LIST:
        raise invalid_argument(f"{field} must contain between 1 and {MAX_IDENTIFIER_LIST} entries")
    normalized = [normalize_identifier(entry, f"{field}[{index}]") for index, entry in enumerate(value)]
    capabilities = utf16_sorted(dict.fromkeys(normalized))
    if "*" in capabilities:
        raise invalid_argument(f"{field} must contain exact capabilities")
    return capabilities
