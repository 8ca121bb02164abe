"""The store boundary's text rule: what a string must be to be kept as a column value or a key.

SQLite keeps text as UTF-8, which cannot encode a surrogate code point (U+D800..U+DFFF: a lone
surrogate such as ``os.fsdecode(b"report-\xff.csv")``, or a pair given as two code points):
JavaScript's UTF-8 conversion writes U+FFFD instead, so the original reads back something else,
and Python's driver refuses the string. PostgreSQL ``text`` cannot hold U+0000 at all. So that
both backends keep every stored string identically, the store refuses both, with
``SCHEDULER_INVALID_ARGUMENT``, before anything is read or written. This is a decided difference
from the original (docs/design/architecture.md, "Hostile strings").

The rule applies at the store boundary only: to every identifier a store method takes (directly or
inside an authority envelope, a principal, a capability list or a migration plan's keys) and to
every key it looks rows up by. The pure functions (``normalize_identifier``,
``derive_occurrence_identity``, …) keep the recorded behaviour, and strings inside JSON values
(payloads, results, errors, checkpoints, migration sources) stay accepted: canonical JSON escapes
them (``\\u0000``, ``\\ud800``) into storable text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from scheduler.contract.authority import (
    normalize_authority_envelope,
    normalize_authority_principal,
    normalize_capability_list,
)
from scheduler.contract.errors import invalid_argument
from scheduler.contract.jobs import normalize_job_definition
from scheduler.contract.scalars import MISSING, normalize_identifier

_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


def storable_text(value: str, field: str) -> str:
    """``value`` unchanged, or ``SCHEDULER_INVALID_ARGUMENT`` if it holds U+0000 or a surrogate code point."""
    if _UNSTORABLE.search(value):
        raise invalid_argument(
            f"{field} contains a character no backend can store identically "
            "(U+0000 or a surrogate code point U+D800..U+DFFF)"
        )
    return value


def storable_strings(value: Any, field: str) -> Any:
    """``value`` unchanged after :func:`storable_text` on every string in it (keys included)."""
    if isinstance(value, str):
        storable_text(value, field)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            storable_strings(key, field)
            storable_strings(item, f"{field}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            storable_strings(item, f"{field}[{index}]")
    return value


def normalize_key(value: object, field: str, max_length: int = 256) -> str:
    """An identifier the store keeps or looks up: :func:`normalize_identifier` plus the text rule."""
    return storable_text(normalize_identifier(value, field, max_length), field)


def normalize_optional_key(value: object, field: str, max_length: int = 256) -> str | None:
    """``None`` (or not given) stays ``None``; anything else must be a key."""
    if value is None or value is MISSING:
        return None
    return normalize_key(value, field, max_length)


def normalize_stored_authority(value: object) -> dict[str, Any]:
    """An authority envelope the store keeps: every field of it is an identifier (principal = policy key)."""
    normalized: dict[str, Any] = storable_strings(normalize_authority_envelope(value), "authority")
    return normalized


def normalize_stored_principal(value: object) -> dict[str, str]:
    """A policy principal ``{type, id}``: the policy table's key."""
    principal: dict[str, str] = storable_strings(normalize_authority_principal(value), "authority.principal")
    return principal


def normalize_stored_capabilities(value: object, field: str = "capabilities") -> list[str]:
    """A policy's capability list (kept and matched as keys)."""
    capabilities: list[str] = storable_strings(normalize_capability_list(value, field), field)
    return capabilities


def normalize_stored_job(value: object) -> dict[str, Any]:
    """A wire-format job the store keeps: id, kind and authority obey the text rule; payload and
    trigger are JSON values and stay unrestricted."""
    job = normalize_job_definition(value)
    storable_text(job["id"], "job.id")
    storable_text(job["kind"], "job.kind")
    storable_strings(job["authority"], "authority")
    return job
