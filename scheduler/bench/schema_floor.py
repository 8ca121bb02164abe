"""The store's row changes in raw ``sqlite3``: the floor its Python layer is measured against.

A claim and a settle change the same rows here as in the store (the head of the claim index, the
fenced ``UPDATE``, the event row) with hand-written SQL and nothing else, so ``store CPU ÷ this
CPU`` is what the library adds. ``benchmarks/schema_floor.py`` prints both side by side, and the
peer comparison harness runs :func:`cycle` as its "our schema, raw sqlite3" system.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from scheduler.bench.context import BENCH_JOB_ID, LEASE_MS
from scheduler.bench.stores import wall_ms

OWNER: Final = "schema-floor"
_HEAD: Final = (
    "SELECT occurrence_id, attempt, fence FROM occurrences WHERE status = 'queued' AND available_at <= ? "
    "ORDER BY available_at, lease_expires_at, scheduled_for, occurrence_id LIMIT 1"
)
_CLAIM: Final = (
    "UPDATE occurrences SET status = 'running', attempt = ?, fence = ?, lease_owner = ?, "
    "lease_expires_at = ?, updated_at = ? WHERE occurrence_id = ? AND fence = ?"
)
_SETTLE: Final = (
    "UPDATE occurrences SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, "
    "updated_at = ?, settled_at = ? WHERE occurrence_id = ? AND status = 'running' AND lease_owner = ? "
    "AND fence = ?"
)
_EVENT: Final = (
    "INSERT INTO events (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection with the store's durability and foreign-key settings, in autocommit mode."""
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("PRAGMA foreign_keys = ON")
    return connection


def claim_rows(connection: sqlite3.Connection, now: int) -> tuple[str, int]:
    """The claim's row changes (head of the claim index, UPDATE, event); (id, new fence)."""
    occurrence_id, attempt, fence = connection.execute(_HEAD, (now,)).fetchone()
    connection.execute(_CLAIM, (attempt + 1, fence + 1, OWNER, now + LEASE_MS, now, occurrence_id, fence))
    claimed = f'{{"attempt":{attempt + 1},"previousOwner":null,"previousStatus":"queued"}}'
    connection.execute(
        _EVENT, (BENCH_JOB_ID, occurrence_id, "occurrence_claimed", now, OWNER, fence + 1, claimed)
    )
    return occurrence_id, fence + 1


def settle_rows(connection: sqlite3.Connection, now: int, occurrence_id: str, fence: int) -> None:
    """The settle's row changes (UPDATE, event) of an occurrence claimed at its first attempt."""
    connection.execute(_SETTLE, (now, now, occurrence_id, OWNER, fence))
    settled = '{"attempt":1,"maxAttempts":3}'
    connection.execute(
        _EVENT, (BENCH_JOB_ID, occurrence_id, "occurrence_succeeded", now, OWNER, fence, settled)
    )


def cycle(connection: sqlite3.Connection) -> None:
    """``claim_next`` then ``settle``: two transactions."""
    connection.execute("BEGIN IMMEDIATE")
    occurrence_id, fence = claim_rows(connection, wall_ms())
    connection.execute("COMMIT")
    connection.execute("BEGIN IMMEDIATE")
    settle_rows(connection, wall_ms(), occurrence_id, fence)
    connection.execute("COMMIT")


def one_commit_cycle(connection: sqlite3.Connection, held: tuple[str, int]) -> tuple[str, int]:
    """``settle_and_claim``: settle the held occurrence and claim the next in one transaction."""
    now = wall_ms()
    connection.execute("BEGIN IMMEDIATE")
    settle_rows(connection, now, *held)
    claimed = claim_rows(connection, now)
    connection.execute("COMMIT")
    return claimed


# The peer comparison harness (outside this repository) imports these two names.
_connect = connect
_cycle = cycle
