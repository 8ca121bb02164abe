"""The Core ``metadata`` (tables.py) and the canonical DDL texts (ddl.py) describe one schema.

v6 is built twice — once by ``metadata.create_all`` and once by executing the six canonical
migration texts — and the two files are compared through SQLAlchemy's inspector and
``sqlite_master``: columns, primary keys, foreign keys, UNIQUE constraints, indexes (with
partial WHERE clauses) and CHECK expressions.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import CheckConstraint, Engine, create_engine, inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex

from scheduler.schema import MIGRATION_SQL, metadata, tables
from scheduler.schema.upgrade import ddl_statements

TABLE_NAMES = sorted(metadata.tables)


def _engine(path: Path) -> Engine:
    return create_engine(f"sqlite:///{path}", poolclass=NullPool)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Engine]]:
    folder = tmp_path_factory.mktemp("metadata")
    from_metadata = _engine(folder / "metadata.sqlite")
    metadata.create_all(from_metadata)
    con = sqlite3.connect(folder / "ddl.sqlite", isolation_level=None)
    for version in sorted(MIGRATION_SQL):
        for statement in ddl_statements(MIGRATION_SQL[version]):
            con.execute(statement)
    con.close()
    from_ddl = _engine(folder / "ddl.sqlite")
    yield from_metadata, from_ddl
    from_metadata.dispose()
    from_ddl.dispose()


def fold(sql: str) -> str:
    """Whitespace runs to one space; no spaces just inside parentheses."""
    text = " ".join(sql.split())
    return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))


def strip_outer_parens(expression: str) -> str:
    expression = fold(expression)
    while expression.startswith("(") and expression.endswith(")") and _balanced(expression[1:-1]):
        expression = expression[1:-1].strip()
    return expression


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _columns(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    return [
        (c["name"], str(c["type"]), c["nullable"], c["default"], c["primary_key"])
        for c in inspect(engine).get_columns(table)
    ]


def _foreign_keys(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    return sorted(
        (tuple(fk["constrained_columns"]), fk["referred_table"], tuple(fk["referred_columns"]))
        for fk in inspect(engine).get_foreign_keys(table)
    )


def _foreign_key_pragma(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    """(table, from, to, on_update, on_delete, match) — the inspector drops inline ON DELETE."""
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(f'PRAGMA foreign_key_list("{table}")').all()
    return sorted(tuple(row[2:]) for row in rows)


def _uniques(engine: Engine, table: str) -> list[tuple[str, ...]]:
    return sorted(tuple(u["column_names"]) for u in inspect(engine).get_unique_constraints(table))


def _indexes(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    return sorted(
        (
            ix["name"],
            tuple(ix["column_names"]),
            bool(ix["unique"]),
            tuple(sorted((ix.get("column_sorting") or {}).items())),
        )
        for ix in inspect(engine).get_indexes(table)
    )


def _index_keys(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Key columns of every index as (name, desc, collation) from ``PRAGMA index_xinfo``."""
    with engine.connect() as connection:
        names = connection.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'").scalars()
        return {
            name: [
                (row[2], row[3], row[4])
                for row in connection.exec_driver_sql(f'PRAGMA index_xinfo("{name}")')
                if row[5] == 1
            ]
            for name in list(names)
        }


def _checks(engine: Engine, table: str) -> list[str]:
    return sorted(strip_outer_parens(c["sqltext"]) for c in inspect(engine).get_check_constraints(table))


def _index_where(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        ).all()
    result: dict[str, str | None] = {}
    for name, sql in rows:
        match = re.search(r"\bWHERE\b(.*)$", fold(sql), flags=re.IGNORECASE)
        result[name] = strip_outer_parens(match.group(1)) if match else None
    return result


def test_same_tables(built: tuple[Engine, Engine]) -> None:
    from_metadata, from_ddl = built
    names = sorted(inspect(from_ddl).get_table_names())
    assert sorted(inspect(from_metadata).get_table_names()) == names
    assert names == TABLE_NAMES and len(names) == 12
    for engine in built:  # AUTOINCREMENT on events creates SQLite's own 13th table in both
        with engine.connect() as connection:
            sql = "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'"
            assert connection.exec_driver_sql(sql).scalar() == 1


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_same_columns_and_keys(built: tuple[Engine, Engine], table: str) -> None:
    from_metadata, from_ddl = built
    assert _columns(from_metadata, table) == _columns(from_ddl, table)
    assert (
        inspect(from_metadata).get_pk_constraint(table)["constrained_columns"]
        == inspect(from_ddl).get_pk_constraint(table)["constrained_columns"]
    )
    assert _foreign_keys(from_metadata, table) == _foreign_keys(from_ddl, table)
    assert _foreign_key_pragma(from_metadata, table) == _foreign_key_pragma(from_ddl, table)
    assert all(fk[4] == "RESTRICT" for fk in _foreign_key_pragma(from_ddl, table))
    assert _uniques(from_metadata, table) == _uniques(from_ddl, table)


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_same_indexes(built: tuple[Engine, Engine], table: str) -> None:
    from_metadata, from_ddl = built
    assert _indexes(from_metadata, table) == _indexes(from_ddl, table)


def test_same_index_key_order_and_direction(built: tuple[Engine, Engine]) -> None:
    from_metadata, from_ddl = built
    expected, actual = _index_keys(from_ddl), _index_keys(from_metadata)
    # UNIQUE/PRIMARY KEY autoindexes are numbered by declaration order: compare them as a multiset.
    auto = "sqlite_autoindex_"
    assert sorted(v for k, v in actual.items() if k.startswith(auto)) == sorted(
        v for k, v in expected.items() if k.startswith(auto)
    )
    assert {k: v for k, v in actual.items() if not k.startswith(auto)} == {
        k: v for k, v in expected.items() if not k.startswith(auto)
    }
    assert expected["scheduler_events_job"] == [("job_id", 0, "BINARY"), ("event_id", 1, "BINARY")]


def test_same_partial_index_predicates(built: tuple[Engine, Engine]) -> None:
    from_metadata, from_ddl = built
    expected = _index_where(from_ddl)
    assert _index_where(from_metadata) == expected
    assert {k: v for k, v in expected.items() if v} == {
        "scheduler_domain_migration_active_source": "state <> 'rolled_back'",
        "scheduler_domain_migration_active_target": "state <> 'rolled_back'",
    }


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_same_check_constraints(built: tuple[Engine, Engine], table: str) -> None:
    from_metadata, from_ddl = built
    assert _checks(from_metadata, table) == _checks(from_ddl, table)


def test_check_texts_equal_the_ddl_expressions(built: tuple[Engine, Engine]) -> None:
    """Each CheckConstraint's text is the DDL expression with whitespace folded (no rewriting)."""
    _, from_ddl = built
    for table in metadata.tables.values():
        owners = [table, *table.columns]
        declared = sorted(
            fold(str(c.sqltext))
            for owner in owners
            for c in owner.constraints
            if isinstance(c, CheckConstraint)
        )
        reflected = inspect(from_ddl).get_check_constraints(table.name)
        assert declared == sorted(fold(c["sqltext"]) for c in reflected)


def test_autoincrement_and_partial_indexes_for_both_dialects() -> None:
    assert tables.events.dialect_options["sqlite"]["autoincrement"] is True
    index = next(ix for ix in tables.domain_migration_entries.indexes if ix.name.endswith("active_target"))
    for dialect in (sqlite.dialect(), postgresql.dialect()):
        compiled = fold(str(CreateIndex(index).compile(dialect=dialect)))
        assert compiled.endswith("WHERE state <> 'rolled_back'")
