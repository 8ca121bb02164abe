"""Scalar validators and the JavaScript string semantics they depend on.

The original runs on JavaScript strings (UTF-16 code units) and one number type. These helpers
reproduce what is observable of that: ``trim()``'s whitespace set, UTF-16 lengths and sort order,
and the integer rules of CONTRACT.md ("Decided divergences": integers are Python ``int`` only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, TypeGuard

from scheduler.contract.constants import (
    DEFAULT_HISTORY_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    MAX_HISTORY_LIMIT,
    MAX_JOB_ATTEMPTS,
    MAX_SAFE_INTEGER,
)
from scheduler.contract.errors import invalid_argument

# ECMAScript WhiteSpace + LineTerminator (what String.prototype.trim strips). Unlike str.strip()
# it has no U+001C..U+001F and no U+0085, and it does have U+FEFF.
JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHA256_DIGEST = re.compile("sha256:[a-f0-9]{64}")


class _Missing:
    """Type of :data:`MISSING`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""Marks an argument that was not given (JavaScript ``undefined``), as opposed to ``None`` (``null``)."""


def js_trim(value: str) -> str:
    """``String.prototype.trim``: strip the ECMAScript whitespace set from both ends."""
    return value.strip(JS_WHITESPACE)


def utf16_length(value: str) -> int:
    """Length in UTF-16 code units, JavaScript's ``String#length`` (an astral character counts 2)."""
    if value.isascii():
        return len(value)
    return len(value.encode("utf-16-le", "surrogatepass")) // 2


def utf16_sort_key(value: str) -> bytes:
    """Sort key ordering strings by UTF-16 code units, like JavaScript's default ``sort()``."""
    return value.encode("utf-16-be", "surrogatepass")


def utf16_sorted(values: Iterable[str]) -> list[str]:
    """``values`` sorted the way JavaScript's ``Array#sort()`` sorts strings."""
    items = list(values)
    joined = "".join(items)
    if joined.isascii() or max(joined) <= "\uffff":
        return sorted(items)  # without astral characters code point order is code unit order
    return sorted(items, key=utf16_sort_key)


def utf8_byte_length(value: str) -> int:
    """``Buffer.byteLength(value, "utf8")``: a lone surrogate counts as U+FFFD (3 bytes)."""
    if value.isascii():
        return len(value)
    if _SURROGATE.search(value):
        value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return len(value.encode("utf-8"))


def is_safe_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` (not ``bool``) within ±(2**53 - 1)."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    )


def normalize_identifier(value: object, field: str, max_length: int = 256) -> str:
    """Validate an identifier: a ``str``, JS-trimmed, 1..``max_length`` UTF-16 units, no controls.

    Code points <= 31 and 127 are rejected after trimming; the trimmed string is returned.
    """
    if not isinstance(value, str):
        raise invalid_argument(f"{field} must be a string")
    normalized = js_trim(value)
    if not normalized or utf16_length(normalized) > max_length or _CONTROL.search(normalized):
        raise invalid_argument(f"{field} is not a valid identifier")
    return normalized


def normalize_optional_identifier(value: object, field: str, max_length: int = 256) -> str | None:
    """``None`` stays ``None``; anything else must be an identifier."""
    if value is None or value is MISSING:
        return None
    return normalize_identifier(value, field, max_length)


def normalize_epoch_ms(value: object, field: str) -> int:
    """An epoch in milliseconds: ``int`` (not ``bool``) in 0 ..= 2**53 - 1."""
    if not is_safe_int(value) or value < 0:
        raise invalid_argument(f"{field} must be a non-negative safe-integer epoch ms")
    return int(value)


def assert_positive_safe_int(value: object, field: str) -> int:
    """An ``int`` (not ``bool``) in 1 ..= 2**53 - 1."""
    if not is_safe_int(value) or value < 1:
        raise invalid_argument(f"{field} must be a positive integer")
    return int(value)


def assert_non_negative_safe_int(value: object, field: str) -> int:
    """An ``int`` (not ``bool``) in 0 ..= 2**53 - 1."""
    if not is_safe_int(value) or value < 0:
        raise invalid_argument(f"{field} must be a non-negative integer")
    return int(value)


def normalize_max_attempts(value: object = MISSING) -> int:
    """Max attempts: not given → 3; else an ``int`` in 1..32.

    As in the original, an explicit ``None`` (JavaScript ``null``) is invalid; only omitting the
    argument (or passing :data:`MISSING`) selects the default.
    """
    if value is MISSING:
        return DEFAULT_MAX_ATTEMPTS
    if not is_safe_int(value) or not 1 <= value <= MAX_JOB_ATTEMPTS:
        raise invalid_argument(f"maxAttempts must be an integer between 1 and {MAX_JOB_ATTEMPTS}")
    return int(value)


def normalize_history_limit(value: object = MISSING) -> int:
    """History limit: not given → 50; else a positive ``int``, clamped to 200.

    An explicit ``None`` is invalid, as in the original.
    """
    if value is MISSING:
        return DEFAULT_HISTORY_LIMIT
    if not is_safe_int(value) or value < 1:
        raise invalid_argument("history limit must be a positive integer")
    return min(int(value), MAX_HISTORY_LIMIT)


def normalize_boolean(value: object, field: str) -> bool:
    """A ``bool`` exactly (``0``/``1`` are not booleans)."""
    if not isinstance(value, bool):
        raise invalid_argument(f"{field} must be a boolean")
    return value


def normalize_sha256_digest(value: object, field: str) -> str:
    """A payload digest ``sha256:<64 lowercase hex>``."""
    if not isinstance(value, str) or not _SHA256_DIGEST.fullmatch(value):
        raise invalid_argument(f"{field} must be a sha256 payload digest")
    return value
