"""An independent dump of a SQLite file in the fixtures' layout (``tests/fixtures/README.md`` §3).

It reads the file with the standard library's ``sqlite3`` on a read-only connection and uses none
of the project's code, so tests can check what the store wrote (and what
``scheduler.testing.dump_tables`` reports) against a second, separate reader.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

Dump = dict[str, Any]


def catalog_fingerprint(connection: sqlite3.Connection) -> str:
    """The original's catalog fingerprint (README §3), computed from ``sqlite_master``."""
    rows = connection.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master"
        " WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
    ).fetchall()
    catalog = [
        {"type": kind, "name": name, "tbl_name": table, "sql": re.sub(r"\s+", " ", sql or "").strip()}
        for kind, name, table, sql in rows
    ]
    encoded = json.dumps(catalog, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def _order_columns(connection: sqlite3.Connection, table: str) -> list[str]:
    """Primary-key columns in key order; the first column for a table without one (``sqlite_sequence``)."""
    info = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
    keyed = sorted((row[5], row[1]) for row in info if row[5] > 0)
    return [name for _, name in keyed] or [info[0][1]]


def table_rows(connection: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` as a column → value dict, in primary-key order."""
    order = ", ".join(f'"{name}"' for name in _order_columns(connection, table))
    cursor = connection.execute(f'SELECT * FROM "{table}" ORDER BY {order}')
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def dump(path: Path | str) -> Dump:
    """``{user_version, application_id, fingerprint, tables}`` of the file at ``path``."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            ).fetchall()
        ]
        return {
            "user_version": connection.execute("PRAGMA user_version").fetchone()[0],
            "application_id": connection.execute("PRAGMA application_id").fetchone()[0],
            "fingerprint": catalog_fingerprint(connection),
            "tables": {name: table_rows(connection, name) for name in tables},
        }
    finally:
        connection.close()


HEADER = ("user_version", "application_id", "fingerprint")


def diff(expected: Dump, actual: Dump) -> list[str]:
    """Human-readable differences between two dumps; empty when they are equal.

    Header fields are compared when ``expected`` has them. Tables are compared row by row in
    order (both sides are in primary-key order), so a reordering is a difference too.
    """
    problems = [
        f"{key}: expected {expected[key]!r}, got {actual.get(key)!r}"
        for key in HEADER
        if key in expected and expected[key] != actual.get(key)
    ]
    want, got = expected["tables"], actual["tables"]
    problems += [f"table {name} missing" for name in sorted(set(want) - set(got))]
    problems += [f"unexpected table {name}" for name in sorted(set(got) - set(want))]
    for name in sorted(set(want) & set(got)):
        problem = _table_difference(name, want[name], got[name])
        if problem:
            problems.append(problem)
    return problems


def _table_difference(name: str, want: list[dict[str, Any]], got: list[dict[str, Any]]) -> str | None:
    if want == got and all(_same_types(a, b) for a, b in zip(want, got, strict=True)):
        return None
    if len(want) != len(got):
        missing = [row for row in want if row not in got][:2]
        extra = [row for row in got if row not in want][:2]
        return f"table {name}: {len(want)} rows expected, {len(got)} found; missing {missing}, extra {extra}"
    for index, (a, b) in enumerate(zip(want, got, strict=True)):
        if a != b or not _same_types(a, b):
            return f"table {name} row {index}: expected {a}, got {b}"
    return None


def _same_types(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """An INTEGER stored where TEXT was expected (or the reverse) is a difference even if equal."""
    return all(type(a[key]) is type(b.get(key)) for key in a)
