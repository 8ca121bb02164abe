"""JSON normalization and the canonical encoding every stored byte and digest depends on.

``canonical_json`` is byte-identical to the original's ``JSON.stringify`` of the key-sorted value
(CONTRACT.md, fixtures README §7): keys sorted by UTF-16 code units with canonical array-index
keys first in numeric order, JavaScript ``Number#toString`` numbers, only ``"``, ``\\`` and
controls below 0x20 escaped, lone surrogates as ``\\udxxx``, no whitespace.

Implementation: one validating walk builds a copy whose dicts are already in output order and
whose integral floats are ints; the copy is then written by the C ``json`` encoder, which agrees
with JavaScript on everything but a few float spellings (those rare values take a small Python
encoder) and lone surrogates (fixed up on the finished text).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import re
from typing import Final, TypeAlias

from scheduler.contract.constants import MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_SAFE_INTEGER
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import utf16_sorted

JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None
"""A normalized JSON value."""

_MAX_ARRAY_INDEX: Final = 4_294_967_294
_C_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
)
_encode_basestring = json.encoder.encode_basestring  # C version when available
_PLAIN_LEAVES: Final = frozenset({str, bool, type(None)})
_SAFE: Final = MAX_SAFE_INTEGER
# Non-integral floats in this range print identically with Python's repr and JavaScript.
_REPR_LIKE_JS_LOW: Final = 1e-4
_REPR_LIKE_JS_HIGH: Final = float(2**53)
_SURROGATES: Final = re.compile("[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


class _Invalid(Exception):
    """Internal: a rejected value; ``path`` collects the location while the stack unwinds."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


class _Walk:
    __slots__ = ("ancestors", "needs_js_floats")

    def __init__(self) -> None:
        self.ancestors: set[int] = set()
        self.needs_js_floats = False


def js_number(value: float) -> str:
    """JavaScript ``Number#toString`` of a finite float (shortest round-trip digits)."""
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return str(int(value))
    text = repr(value)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent) if exponent else 0)  # value = 0.<digits> * 10**point
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        body = digits + "0" * (point - k)
    elif 0 < point <= 21:
        body = f"{digits[:point]}.{digits[point:]}"
    elif -6 < point <= 0:
        body = "0." + "0" * -point + digits
    else:
        power = point - 1
        head = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        body = f"{head}e{'+' if power >= 0 else '-'}{abs(power)}"
    return sign + body


def _is_array_index(key: str) -> bool:
    return (
        key.isdigit()
        and key.isascii()
        and len(key) <= 10
        and (key[0] != "0" or len(key) == 1)
        and int(key) <= _MAX_ARRAY_INDEX
    )


def _walk(value: object, depth: int, state: _Walk) -> JSON:
    if depth > MAX_JSON_DEPTH:
        raise _Invalid("exceeds maximum JSON depth")
    if value is None or type(value) is str or type(value) is bool:
        return value
    if type(value) is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        raise _Invalid("contains an integer beyond the safe range")
    if type(value) is float:
        if not math.isfinite(value):
            raise _Invalid("contains a non-finite number")
        if value.is_integer() and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return int(value)  # -0.0 becomes 0; 100.0 is written 100 either way
        if not _REPR_LIKE_JS_LOW <= abs(value) < _REPR_LIKE_JS_HIGH:
            state.needs_js_floats = True  # Python's repr would use exponent form here
        return value
    if type(value) is list or type(value) is dict:
        marker = id(value)
        if marker in state.ancestors:
            raise _Invalid("contains a cycle")
        state.ancestors.add(marker)
        try:
            if type(value) is list:
                return _walk_list(value, depth, state)
            return _walk_dict(value, depth, state)  # type: ignore[arg-type]
        finally:
            state.ancestors.discard(marker)
    if isinstance(value, dict):
        raise _Invalid("must be a plain object")
    raise _Invalid("contains a non-JSON value")


def _walk_list(value: list[object], depth: int, state: _Walk) -> list[JSON]:
    leaves_allowed = depth < MAX_JSON_DEPTH
    index = 0
    try:
        out: list[JSON] = []
        for index in range(len(value)):
            item = value[index]
            kind = type(item)
            # Fast path without recursion for the common leaves; everything else is checked by _walk.
            if leaves_allowed and (kind in _PLAIN_LEAVES or (kind is int and -_SAFE <= item <= _SAFE)):  # type: ignore[operator]
                out.append(item)  # type: ignore[arg-type]
            else:
                out.append(_walk(item, depth + 1, state))
        return out
    except _Invalid as invalid:
        invalid.path.append(f"[{index}]")
        raise


def _walk_dict(value: dict[object, object], depth: int, state: _Walk) -> dict[str, JSON]:
    keys = list(value)
    for key in keys:
        if type(key) is not str:
            raise _Invalid("contains a non-string key")
    ordered: list[str] = utf16_sorted(keys)  # type: ignore[arg-type]
    leaves_allowed = depth < MAX_JSON_DEPTH
    out: dict[str, JSON] = {}
    key = ""
    try:
        for key in ordered:  # the original normalizes in sorted order
            item = value[key]
            kind = type(item)
            if leaves_allowed and (kind in _PLAIN_LEAVES or (kind is int and -_SAFE <= item <= _SAFE)):  # type: ignore[operator]
                out[key] = item  # type: ignore[assignment]
            else:
                out[key] = _walk(item, depth + 1, state)
    except _Invalid as invalid:
        invalid.path.append(f".{key}")
        raise
    # Keys starting with an ASCII digit are contiguous in either sort order.
    low = bisect.bisect_left(ordered, "0")
    high = bisect.bisect_left(ordered, ":", low)
    indexes = [key for key in ordered[low:high] if _is_array_index(key)]
    if not indexes:
        return out
    # JavaScript property order: integer-like keys first, ascending, then the rest in order.
    indexes.sort(key=int)
    reordered = {key: out[key] for key in indexes}
    reordered.update(out)
    return reordered


def _py_encode(value: JSON) -> str:
    """Encoder for copies holding floats whose Python repr differs from JavaScript's spelling."""
    if isinstance(value, str):
        return _encode_basestring(value)
    if isinstance(value, bool) or value is None:
        return "true" if value else ("false" if value is False else "null")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return js_number(value)
    if isinstance(value, list):
        return "[" + ",".join(_py_encode(item) for item in value) + "]"
    return "{" + ",".join(f"{_encode_basestring(k)}:{_py_encode(v)}" for k, v in value.items()) + "}"


def _escape_surrogate(match: re.Match[str]) -> str:
    text = match.group()
    if len(text) == 2:  # a pair split over two code points is one character in UTF-16
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    return f"\\u{ord(text):04x}"


def _escape_lone_surrogates(text: str) -> str:
    if text.isascii():
        return text
    try:
        text.encode("utf-8")  # much faster than a regex scan; fails only on surrogates
    except UnicodeEncodeError:
        return _SURROGATES.sub(_escape_surrogate, text)
    return text


def normalize_and_encode_json(value: object, field: str = "value") -> tuple[JSON, str]:
    """Normalize ``value`` and return ``(normalized copy, canonical JSON text)`` in one walk.

    The copy's dicts are in canonical key order, ``-0.0`` and other integral floats within the
    safe range are ints. Raises ``SCHEDULER_INVALID_ARGUMENT`` with the path in the message
    (``value.a[1] contains a non-finite number``).
    """
    state = _Walk()
    try:
        normalized = _walk(value, 0, state)
    except _Invalid as invalid:
        raise invalid_argument(f"{field}{''.join(reversed(invalid.path))} {invalid.reason}") from None
    text = _py_encode(normalized) if state.needs_js_floats else _C_ENCODER.encode(normalized)
    text = _escape_lone_surrogates(text)
    size = len(text)
    if size > MAX_JSON_BYTES or (size * 4 > MAX_JSON_BYTES and len(text.encode("utf-8")) > MAX_JSON_BYTES):
        raise invalid_argument(f"{field} exceeds {MAX_JSON_BYTES} encoded bytes")
    return normalized, text


def normalize_json(value: object, field: str = "value") -> JSON:
    """Validate a JSON value and return a normalized copy (see :func:`normalize_and_encode_json`).

    Accepted: ``None``, ``str``, ``bool``, ``int`` within ±(2**53-1), finite ``float``, ``list``
    and ``dict`` with ``str`` keys (exact types). Rejected: other types, depth above 64, cycles,
    encodings above 1 MiB (UTF-8).
    """
    return normalize_and_encode_json(value, field)[0]


def canonical_json(value: object, field: str = "value") -> str:
    """The canonical JSON text of ``value``, byte-identical to the original's."""
    return normalize_and_encode_json(value, field)[1]


def json_string(value: str) -> str:
    """The canonical JSON encoding of one string (no validation beyond escaping)."""
    return _escape_lone_surrogates(_encode_basestring(value))


def sha256_payload_digest(value: object, field: str = "value") -> str:
    """``"sha256:" + hex(sha256(canonical_json(value)))``, the original's payload digest."""
    encoded = canonical_json(value, field).encode("utf-8")
    return f"sha256:{hashlib.sha256(encoded).hexdigest()}"
