"""Typed source locators of migration entries (schema v5), pure validation.

Seed: ``SENSITIVE_SOURCE_LOCATOR_FIELD``, ``assertNonSensitiveSourceLocator`` and
``normalizeSchedulerMigrationSourceLocator``. A locator says where a legacy source lives; it must
resolve to the entry's ``sourceScope`` digest. Paths are checked with the host platform's rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from scheduler.contract.canonical import canonical_json, normalize_json, sha256_payload_digest
from scheduler.contract.digests import scheduler_migration_scope_digest
from scheduler.contract.errors import invalid_argument
from scheduler.contract.paths import is_canonical_scheduler_source_path
from scheduler.contract.scalars import MISSING, normalize_identifier, utf16_sorted

LOCATOR_FIELD: Final = "schedulerMigration.sourceLocator"
SENSITIVE_SOURCE_LOCATOR_FIELD: Final = re.compile(
    r"(?:pass(?:word)?|secret|token|credential|api[_-]?key|private[_-]?key)", re.IGNORECASE
)
PATH_KEYS: Final = frozenset({"directory", "workspace", "database"})
MEMORY_DATABASE_PREFIX: Final = "memory:"
LEGACY_AUTOMATION_CURRENT_SCOPE: Final = {"store": "automation-engine", "database": "current"}
_PATH_MESSAGE: Final = (
    "must be an absolute path in canonical form; Windows paths require a fully-qualified drive or UNC share"
)


@dataclass(frozen=True, slots=True)
class LocatorType:
    """The locator shape a migration domain accepts and the scope it must resolve to."""

    type: str
    key: str
    store: str
    additional_key: str | None = None

    def allowed_keys(self) -> frozenset[str]:
        extra = () if self.additional_key is None else (self.additional_key,)
        return frozenset(("schemaVersion", "type", self.key, *extra))


LOCATOR_TYPES: Final = {
    "agenda": LocatorType("agenda-store", "directory", "agent-schedule"),
    "cowork-cron": LocatorType("cowork-workspace", "workspace", "cowork-schedules"),
    "routine": LocatorType("routine-store", "directory", "routines"),
    "automation": LocatorType("automation-database", "database", "automation-engine"),
    "loop-iteration": LocatorType("jsonl-session", "sessionId", "jsonl-session", "directory"),
}


def assert_non_sensitive_source_locator(value: Any, field: str) -> None:
    """Refuse any object key anywhere in ``value`` that names a secret (``details.field``)."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            assert_non_sensitive_source_locator(item, f"{field}[{index}]")
        return
    if not isinstance(value, dict):
        return
    for key, nested in value.items():
        if SENSITIVE_SOURCE_LOCATOR_FIELD.search(key):
            raise invalid_argument(f"{field} must not contain sensitive fields", {"field": key})
        assert_non_sensitive_source_locator(nested, f"{field}.{key}")


def _assert_known_keys(locator: dict[str, Any], allowed: frozenset[str], field: str) -> None:
    unknown = [key for key in locator if key not in allowed]
    if unknown:
        raise invalid_argument(f"{field} contains unknown fields", {"fields": utf16_sorted(unknown)})


def _assert_path(domain: str, key: str | None, candidate: str | None, field: str) -> None:
    if key is None or key not in PATH_KEYS or candidate is None:
        return
    if domain == "automation" and candidate.startswith(MEMORY_DATABASE_PREFIX):
        return
    if not is_canonical_scheduler_source_path(candidate):
        raise invalid_argument(f"{field}.{key} {_PATH_MESSAGE}")


def _resolves_to_scope(
    locator_type: LocatorType, location: str, domain: str, scope_digest: str, allow_legacy: bool
) -> bool:
    derived = {"store": locator_type.store, locator_type.key: location}
    if scheduler_migration_scope_digest(derived) == scope_digest:
        return True
    return (
        allow_legacy
        and domain == "automation"
        and scheduler_migration_scope_digest(LEGACY_AUTOMATION_CURRENT_SCOPE) == scope_digest
    )


def normalize_source_locator(
    value: Any,
    domain: str,
    source_scope_digest: str,
    field: str,
    *,
    allow_legacy_automation_current: bool = False,
) -> dict[str, Any] | None:
    """The normalized locator for an entry of ``domain``, or ``None`` when none is given.

    ``None`` (or :data:`MISSING`) means no locator. Otherwise: a v1 object whose ``type`` is the
    domain's locator type, only the domain's keys, canonical absolute paths (``memory:`` databases
    excepted for automation), resolving to ``source_scope_digest``; no sensitive key names.
    """
    if value is None or value is MISSING:
        return None
    locator = normalize_json(value, field)
    if not isinstance(locator, dict):
        raise invalid_argument(f"{field} must be an object")
    version = locator.get("schemaVersion")
    if type(version) is not int or version != 1:
        raise invalid_argument(f"{field}.schemaVersion must be 1")
    locator_kind = normalize_identifier(locator.get("type"), f"{field}.type", 128)
    locator_type = LOCATOR_TYPES.get(domain)
    if locator_type is None or locator_type.type != locator_kind:
        raise invalid_argument(f"{field}.type does not match migration domain")
    _assert_known_keys(locator, locator_type.allowed_keys(), field)
    key, extra_key = locator_type.key, locator_type.additional_key
    location = normalize_identifier(locator.get(key), f"{field}.{key}", 4096)
    extra = (
        None
        if extra_key is None
        else normalize_identifier(locator.get(extra_key), f"{field}.{extra_key}", 4096)
    )
    _assert_path(domain, key, location, field)
    _assert_path(domain, extra_key, extra, field)
    if not _resolves_to_scope(
        locator_type, location, domain, source_scope_digest, allow_legacy_automation_current
    ):
        raise invalid_argument(f"{field} must resolve to sourceScope")
    normalized: dict[str, Any] = {"schemaVersion": 1, "type": locator_kind, key: location}
    if extra_key is not None:
        normalized[extra_key] = extra
    assert_non_sensitive_source_locator(normalized, field)
    return normalized


def encode_source_locator(locator: dict[str, Any]) -> str:
    """The canonical JSON text stored in ``source_locator_json``."""
    return canonical_json(locator, LOCATOR_FIELD)


def encode_optional_source_locator(locator: dict[str, Any] | None) -> str | None:
    return None if locator is None else encode_source_locator(locator)


def source_locator_digest(locator: dict[str, Any]) -> str:
    """``sourceLocatorDigest`` of a normalized locator."""
    return sha256_payload_digest(locator, LOCATOR_FIELD)
