"""How stored values are shown: escaped, with invisible characters made visible.

Every value read from the database reaches the page through these filters (Jinja's autoescape
covers the rest). A string may hold markup, quotes, bidirectional overrides or zero-width
characters; escaping makes markup inert, and :func:`visible` replaces each character that would be
invisible or would reorder the text around it by a marked ``<U+202E>`` token, so an operator reads
what is stored rather than what it pretends to be.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any, Final

from markupsafe import Markup, escape

INVISIBLE: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\ufff9-\ufffb"
    "\ud800-\udfff\U000e0000-\U000e007f]"
)
"""Controls, format characters (zero-width, bidirectional embeddings/overrides/isolates, joiners),
variation selectors, tag characters and lone surrogates (which UTF-8 cannot even carry)."""


def _token(character: str) -> Markup:
    code = f"U+{ord(character):04X}"
    name = unicodedata.name(character, "") if not 0xD800 <= ord(character) <= 0xDFFF else "SURROGATE"
    title = f"{code} {name}".strip()
    return Markup('<span class="ctl" title="{}">&lt;{}&gt;</span>').format(title, code)


def visible(value: Any) -> Markup:
    """``value`` as escaped text, every invisible or reordering character shown as ``<U+XXXX>``."""
    text = "" if value is None else str(value)
    parts: list[str] = []
    last = 0
    for match in INVISIBLE.finditer(text):
        parts.append(escape(text[last : match.start()]))
        parts.append(_token(match.group()))
        last = match.end()
    parts.append(escape(text[last:]))
    return Markup("".join(parts))


def pretty_json(value: Any) -> Markup:
    """A JSON value indented for reading (keys in stored order), through :func:`visible`."""
    return visible(json.dumps(value, indent=2, ensure_ascii=False))


def compact_json(value: Any, width: int = 80) -> Markup:
    """A JSON value on one line, shortened to ``width`` characters, through :func:`visible`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return visible(text if len(text) <= width else text[: width - 1] + "…")


def iso_ms(value: int | None) -> str:
    """Epoch milliseconds as ``2026-01-01 10:00:00.000`` (UTC); ``-`` for ``None``."""
    if value is None:
        return "-"
    moment = datetime.fromtimestamp(value / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{value % 1000:03d}"


def when(value: int | None) -> Markup:
    """Epoch milliseconds as ``2026-01-01 10:00:00`` (UTC) for a table, the milliseconds in its title."""
    return Markup('<time title="{}">{}</time>').format(iso_ms(value), iso_ms(value)[:19])


def duration(ms: int | None) -> str:
    """A span of milliseconds for people: ``850 ms``, ``12.5 s``, ``3.2 min``, ``5.0 h``, ``2.1 d``."""
    if ms is None:
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1_000:
        return f"{sign}{ms} ms"
    for size, unit in ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min")):
        if ms >= 2 * size:
            return f"{sign}{ms / size:.1f} {unit}"
    return f"{sign}{ms / 1000:.1f} s"


def short_id(value: str, keep: int = 16) -> Markup:
    """A long id shortened for a table cell (the full id stays in links and titles)."""
    return visible(value if len(value) <= keep + 1 else value[:keep] + "…")


def error_code(error: Any) -> str | None:
    """The ``code`` of a stored ``lastError`` document, if it has a string one."""
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def error_message(error: Any, width: int = 200) -> str:
    """The ``message`` of a stored ``lastError`` document (shortened), or ``""``."""
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        return ""
    return message if len(message) <= width else message[: width - 1] + "…"


FILTERS: Final = {
    "visible": visible,
    "pretty_json": pretty_json,
    "compact_json": compact_json,
    "iso_ms": iso_ms,
    "when": when,
    "duration": duration,
    "short_id": short_id,
    "error_code": error_code,
    "error_message": error_message,
}
