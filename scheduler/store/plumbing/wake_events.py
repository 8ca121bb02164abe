"""Which committed events wake someone: idle workers (work became claimable) or result waiters
(an occurrence ended). The backend decides whether and how they are told (``Backend.wake_channel``:
PostgreSQL's ``NOTIFY``, ``scheduler.backends.postgresql.wakeups``; SQLite's workers poll)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

WAKE_EVENTS: Final = frozenset(
    {
        "occurrence_enqueued",
        "occurrence_requeued",
        "occurrence_released",
        "occurrence_resume_requested",
        "occurrence_retry_scheduled",
        "occurrence_adjudication_recorded",
    }
)
"""Event types after which an occurrence is (or becomes) claimable without a lease expiring."""
SETTLE_EVENTS: Final = frozenset({"occurrence_succeeded", "occurrence_dead_lettered"})
"""Event types that end an occurrence (a result waiter may stop waiting)."""


def wakes_workers(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a transaction that wrote these ``events`` rows made work claimable."""
    return any(row["event_type"] in WAKE_EVENTS for row in rows)


def settles_runs(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a transaction that wrote these ``events`` rows ended an occurrence."""
    return any(row["event_type"] in SETTLE_EVENTS for row in rows)
