"""``EXPLAIN QUERY PLAN`` of the store's claim statements on a benchmark database (diagnostics)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite as sqlite_dialect


def query_plan(path: Path, statement: Any, params: dict[str, Any]) -> list[str]:
    """The plan SQLite chooses for a Core statement, one line per step (indented by depth)."""
    compiled = statement.compile(dialect=sqlite_dialect.dialect(paramstyle="named"))
    bound = {**compiled.params, **params}
    connection = sqlite3.connect(path, timeout=30)
    try:
        rows = connection.execute(f"EXPLAIN QUERY PLAN {compiled}", bound).fetchall()
    finally:
        connection.close()
    depth: dict[int, int] = {0: -1}
    lines: list[str] = []
    for node, parent, _, detail in rows:
        depth[node] = depth.get(parent, -1) + 1
        lines.append("  " * depth[node] + str(detail))
    return lines


def claim_plans(path: Path, now: int, occurrence_id: str) -> dict[str, Any]:
    """Plans of the ``claim_next`` and ``claim_occurrence`` candidate queries (or why not)."""
    try:
        from scheduler.store.capabilities import claim_query
        from scheduler.store.capabilities.claim_eligibility import NO_FILTER
    except ImportError as error:
        return {"n/a": f"the claim statements cannot be imported ({error})"}
    plans: dict[str, Any] = {}
    try:
        statement = claim_query.claim_next_statement(NO_FILTER)
        params = claim_query.claim_next_params(now, 1, NO_FILTER)
        plans["claim_next"] = query_plan(path, statement, params)
        occurrence = claim_query.CLAIM_OCCURRENCE
        plans["claim_occurrence"] = query_plan(path, occurrence, {"now": now, "occurrence_id": occurrence_id})
    except Exception as error:  # diagnostics only: never fail the run
        plans["n/a"] = f"{type(error).__name__}: {error}"
    return plans
