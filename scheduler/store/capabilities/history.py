"""Reads of the event history and the dead letters (seed: history, listDeadLetters)."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import bindparam, select

from scheduler.contract.constants import DEFAULT_HISTORY_LIMIT
from scheduler.contract.scalars import normalize_history_limit
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.dead_letters import newest_dead_letters
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.plumbing.rows import map_event
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Event, Occurrence


def _history(by_occurrence: bool, by_job: bool) -> Prepared:
    """Events matching the given filters, newest first (params: occurrence_id, job_id, limit)."""
    query = select(t.events)
    if by_occurrence:
        query = query.where(t.events.c.occurrence_id == bindparam("occurrence_id"))
    if by_job:
        query = query.where(t.events.c.job_id == bindparam("job_id"))
    return Prepared(query.order_by(t.events.c.event_id.desc()).limit(bindparam("limit")))


_HISTORY: Final = {
    (occurrence, job): _history(occurrence, job) for occurrence in (False, True) for job in (False, True)
}


def read_events(tx: Tx, occurrence_id: str | None, job_id: str | None, limit: int) -> list[Event]:
    query = _HISTORY[(occurrence_id is not None, job_id is not None)]
    rows = tx.all(query, _params(limit, occurrence_id=occurrence_id, job_id=job_id))
    return [map_event(row) for row in rows]


def read_dead_letters(tx: Tx, job_id: str | None, limit: int) -> list[Occurrence]:
    rows = newest_dead_letters(tx, job_id=job_id, count=limit)
    return [occurrence_record(row) for row in rows]


def _params(limit: int, **filters: str | None) -> dict[str, Any]:
    return {"limit": limit, **{key: value for key, value in filters.items() if value is not None}}


class HistoryOperations(StoreBase):
    """Public history methods of ``SchedulerStore``."""

    def history(
        self,
        *,
        occurrence_id: str | None = None,
        job_id: str | None = None,
        limit: int = DEFAULT_HISTORY_LIMIT,
    ) -> list[Event]:
        """Events, newest first, filtered by occurrence and/or job (``limit`` 1.., clamped to 200)."""
        self._assert_open()  # seed: a read checks the store before its arguments
        bounded = normalize_history_limit(limit)
        occurrence = None if occurrence_id is None else normalize_key(occurrence_id, "occurrenceId")
        job = None if job_id is None else normalize_key(job_id, "jobId")
        return self._read(lambda tx: read_events(tx, occurrence, job, bounded))

    def list_dead_letters(
        self, *, job_id: str | None = None, limit: int = DEFAULT_HISTORY_LIMIT
    ) -> list[Occurrence]:
        """Dead-lettered occurrences, most recently settled first (optionally of one job)."""
        self._assert_open()  # seed: a read checks the store before its arguments
        bounded = normalize_history_limit(limit)
        job = None if job_id is None else normalize_key(job_id, "jobId")
        return self._read(lambda tx: read_dead_letters(tx, job, bounded))
