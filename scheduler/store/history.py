"""Reads of the event history and the dead letters (seed: history, listDeadLetters)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select

from scheduler.contract.constants import DEAD_LETTER, DEFAULT_HISTORY_LIMIT
from scheduler.contract.scalars import normalize_history_limit, normalize_identifier
from scheduler.schema import tables as t
from scheduler.store.base import StoreBase
from scheduler.store.occurrence_rows import occurrence_record
from scheduler.store.records import Event, Occurrence
from scheduler.store.rows import map_event
from scheduler.store.session import Tx


def history_query(occurrence_id: str | None, job_id: str | None, limit: int) -> Select[Any]:
    """Events matching the given filters, newest first."""
    query = select(t.events)
    if occurrence_id is not None:
        query = query.where(t.events.c.occurrence_id == occurrence_id)
    if job_id is not None:
        query = query.where(t.events.c.job_id == job_id)
    return query.order_by(t.events.c.event_id.desc()).limit(limit)


def dead_letter_query(job_id: str | None, limit: int) -> Select[Any]:
    """Dead letters, most recently settled first."""
    o = t.occurrences
    query = select(o).where(o.c.status == DEAD_LETTER)
    if job_id is not None:
        query = query.where(o.c.job_id == job_id)
    return query.order_by(o.c.settled_at.desc(), o.c.occurrence_id).limit(limit)


def read_events(tx: Tx, query: Select[Any]) -> list[Event]:
    return [map_event(row) for row in tx.execute(query).all()]


def read_occurrences(tx: Tx, query: Select[Any]) -> list[Occurrence]:
    return [occurrence_record(row) for row in tx.execute(query).all()]


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
        bounded = normalize_history_limit(limit)
        occurrence = None if occurrence_id is None else normalize_identifier(occurrence_id, "occurrenceId")
        job = None if job_id is None else normalize_identifier(job_id, "jobId")
        query = history_query(occurrence, job, bounded)
        return self._read(lambda tx: read_events(tx, query))

    def list_dead_letters(
        self, *, job_id: str | None = None, limit: int = DEFAULT_HISTORY_LIMIT
    ) -> list[Occurrence]:
        """Dead-lettered occurrences, most recently settled first (optionally of one job)."""
        bounded = normalize_history_limit(limit)
        job = None if job_id is None else normalize_identifier(job_id, "jobId")
        query = dead_letter_query(job, bounded)
        return self._read(lambda tx: read_occurrences(tx, query))
