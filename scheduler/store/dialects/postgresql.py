"""Everything PostgreSQL-specific in the store (psycopg 3): renderings of the neutral constructs.

(The schema layer keeps its own PostgreSQL specifics: ``pg_ddl``, ``pg_catalog``.)
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from scheduler.schema.checks import glob_to_regex
from scheduler.store.dialect import glob_match, greatest, json_text_field

NAME: Final = "postgresql"


def _literal(compiler: SQLCompiler, value: str) -> str:
    return compiler.render_literal_value(value, String())


@compiles(json_text_field, "postgresql")
def _json_text_field(element: json_text_field, compiler: SQLCompiler, **kw: Any) -> str:
    """``(column::json ->> 'key') COLLATE "C"``: the member as text, ordered by code point like
    every scheduler text column (``json``, not ``jsonb``, reads the stored text as SQLite does)."""
    column = compiler.process(element.column, **kw)
    return f'(CAST({column} AS JSON) ->> {_literal(compiler, element.member)}) COLLATE "C"'


@compiles(glob_match, "postgresql")
def _glob_match(element: glob_match, compiler: SQLCompiler, **kw: Any) -> str:
    """The anchored regular expression equivalent to the GLOB pattern."""
    expression = compiler.process(element.operand, **kw)
    return f"({expression}) ~ {_literal(compiler, glob_to_regex(element.pattern))}"


@compiles(greatest, "postgresql")
def _greatest(element: greatest, compiler: SQLCompiler, **kw: Any) -> str:
    return f"GREATEST({compiler.process(element.clauses, **kw)})"
