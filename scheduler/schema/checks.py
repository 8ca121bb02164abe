"""CHECK expressions written once, in the canonical SQLite text, rendered for each dialect.

The canonical DDL (``ddl.py``) is SQLite's, byte for byte. Two of its CHECK constructs do not
exist on PostgreSQL, so a CHECK using them is a :class:`DialectCheck`: it compiles to the SQLite
text unchanged on SQLite (and for ``str()``), and to a translation on PostgreSQL:

* ``json_valid(x)`` becomes ``(x)::json IS NOT NULL``: the text must parse as ``json`` (not
  ``jsonb``, which rejects ``\\u0000``). Invalid text makes the cast raise (SQLSTATE 22P02)
  instead of the CHECK returning false; either way the row is refused. Every such CHECK in the
  catalog is on a NOT NULL column or guarded by ``x IS NULL OR``, so NULL behaves the same.
* ``x GLOB 'pattern'`` becomes ``x ~ 'regex'`` with :func:`glob_to_regex`, the anchored POSIX
  regular expression matching exactly the strings the GLOB matches (case-sensitive, by code point).
"""

from __future__ import annotations

import re
from typing import Any, Final

from sqlalchemy import Boolean
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

_JSON_VALID: Final = re.compile(r"\bjson_valid\((\w+)\)")
_GLOB: Final = re.compile(r"\b(\w+) GLOB '((?:[^']|'')*)'")
# Characters an ARE gives a meaning to outside brackets; escaped with a backslash (in an ARE,
# ``\`` followed by a non-alphanumeric character is that character).
_ARE_SPECIAL: Final = frozenset("\\^$.|?*+()[]{}")


def _literal(char: str) -> str:
    if char in _ARE_SPECIAL:
        return "\\" + char
    if char.isascii() and char.isprintable():
        return char
    return _code_point(char)


def _code_point(char: str) -> str:
    """``\\uXXXX`` / ``\\UXXXXXXXX``: unambiguous anywhere in an ARE, inside brackets too."""
    value = ord(char)
    return f"\\u{value:04x}" if value <= 0xFFFF else f"\\U{value:08x}"


def _set_member(char: str) -> str:
    return char if char.isascii() and char.isalnum() else _code_point(char)


def _glob_set(pattern: str, start: int) -> tuple[str, int]:
    """Translate the set opening at ``pattern[start] == "["``; return (bracket, index after it).

    SQLite's rules (``patternCompare``): a leading ``^`` inverts, a ``]`` right after ``[`` or
    ``[^`` is a member, ``a-z`` is a code-point range unless the ``-`` is first, last or follows
    a range, and there are no escapes.
    """
    index = start + 1
    invert = index < len(pattern) and pattern[index] == "^"
    index += invert
    members: list[str] = []
    if index < len(pattern) and pattern[index] == "]":
        members.append(_set_member("]"))
        index += 1
    prior: str | None = None
    while index < len(pattern) and pattern[index] != "]":
        char = pattern[index]
        following = pattern[index + 1] if index + 1 < len(pattern) else "]"
        if char == "-" and prior is not None and following != "]":
            if prior <= following:  # else an empty range: the prior member stays a literal
                members[-1] = f"{_set_member(prior)}-{_set_member(following)}"
            prior = None
            index += 2
            continue
        members.append(_set_member(char))
        prior = char
        index += 1
    if index >= len(pattern):
        raise ValueError(f"unterminated [set] in GLOB pattern {pattern!r}")
    return f"[{'^' if invert else ''}{''.join(members)}]", index + 1


def glob_to_regex(pattern: str) -> str:
    """The anchored PostgreSQL regular expression (ARE) equivalent to SQLite's ``GLOB pattern``.

    ``*`` is any sequence, ``?`` one character, ``[...]`` a set; everything else is literal.
    The ARE is matched with newline-insensitive ``.`` (PostgreSQL's default) and must be used
    on ``COLLATE "C"`` text. Raises ``ValueError`` for an unterminated set (never matches).
    """
    parts = ["^"]
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        elif char == "[":
            bracket, index = _glob_set(pattern, index)
            parts.append(bracket)
            continue
        else:
            parts.append(_literal(char))
        index += 1
    parts.append("$")
    return "".join(parts)


def _glob_as_regex(match: re.Match[str]) -> str:
    regex = glob_to_regex(match.group(2).replace("''", "'")).replace("'", "''")
    return f"{match.group(1)} ~ '{regex}'"


def postgresql_check_text(sqlite_text: str) -> str:
    """The PostgreSQL text of a canonical SQLite CHECK expression (see the module docstring)."""
    return _GLOB.sub(_glob_as_regex, _JSON_VALID.sub(r"(\1)::json IS NOT NULL", sqlite_text))


def needs_translation(sqlite_text: str) -> bool:
    """Whether the SQLite CHECK text uses a construct PostgreSQL does not have."""
    return bool(_JSON_VALID.search(sqlite_text) or _GLOB.search(sqlite_text))


class DialectCheck(ColumnElement[bool]):
    """A CHECK expression kept as its canonical SQLite text and translated for PostgreSQL."""

    __visit_name__ = "dialect_check"
    inherit_cache = True
    _traverse_internals = [("sqlite_text", InternalTraversal.dp_string)]  # noqa: RUF012
    type = Boolean()

    def __init__(self, sqlite_text: str) -> None:
        self.sqlite_text = sqlite_text


@compiles(DialectCheck)
def _compile_canonical(element: DialectCheck, compiler: Any, **kw: Any) -> str:
    return element.sqlite_text


@compiles(DialectCheck, "postgresql")
def _compile_postgresql(element: DialectCheck, compiler: Any, **kw: Any) -> str:
    return postgresql_check_text(element.sqlite_text)
