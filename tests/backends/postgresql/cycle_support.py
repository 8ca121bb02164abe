"""Helpers of the PostgreSQL tests that compare the one-statement calls (``cycle_statement``,
``claim_statement``, ``settle_statement``) with the usual way: turning the statements off, and
comparing tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

from scheduler.backends.postgresql import claim_statement, cycle_statement, queries, settle_statement
from scheduler.store.plumbing.statement_plans import Prepared


@contextmanager
def one_statement_off() -> Iterator[None]:
    """A ``settle_and_claim`` that succeeds is not tried as one statement (``cycle_statement``):
    it runs the usual way, its first statement reading the heads or the window."""
    with patch.object(cycle_statement, "cycle_in_one_statement", lambda *_args: None):
        yield


def densely_numbered(tables: dict[str, Any]) -> dict[str, Any]:
    """``tables`` with event ids renumbered 1, 2, … in id order (a call run again leaves a gap
    where its first attempt's event rows were rolled back, API §8)."""
    events = sorted(tables["events"], key=lambda row: row["event_id"])
    return {**tables, "events": [{**row, "event_id": rank} for rank, row in enumerate(events, start=1)]}


def slowed_statement(name: str) -> Prepared:
    """The statement ``name`` of ``queries.sql`` sleeping 2 s after its snapshot was taken and
    before its first lock (the clock instant it starts from is read after the sleep)."""
    start = "SELECT clock_timestamp() AS at"
    sql = queries.SQL[name]
    assert sql.count(start) == 1
    return queries.prepared(name, sql.replace(start, start + " FROM pg_sleep(2)"))


@contextmanager
def claim_and_settle_statements_off() -> Iterator[None]:
    """A quiet ``claim_next`` and a successful ``settle`` are not tried as one statement
    (``claim_statement``, ``settle_statement``): they run the usual way."""
    with (
        patch.object(claim_statement, "claim_in_one_statement", lambda *_args: None),
        patch.object(settle_statement, "settle_in_one_statement", lambda *_args: None),
    ):
        yield
