"""Runs of tasks as ``scheduler tasks`` reads them: a task is a job (its id), a queue a job kind, a run
an occurrence (API §10). Read straight from the store's tables, so no application code is needed.

The listing is newest first, by ``(created_at, occurrence_id)`` descending, in keyset pages: a page
continues after a run (``after``), never at an offset. When the filter names a task, or a queue of at
most :data:`MAX_WALKED_JOBS` tasks, each task's runs are read from ``scheduler_occurrences_job``
(job_id, created_at, occurrence_id) backwards, at most a page each, and merged; otherwise one
statement filters and sorts (the status and error-code filters are applied to the rows it reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, Select, select, tuple_

from scheduler.schema import tables as t
from scheduler.store.plumbing.constructs import json_text_field
from scheduler.store.plumbing.rows import map_occurrence
from scheduler.store.records import Occurrence

MAX_WALKED_JOBS: Final = 64
"""A queue with more tasks than this is listed by one filtered, sorted statement."""

_o, _j = t.occurrences, t.jobs


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What a listing or a bulk action is narrowed to (``None`` / empty: any)."""

    queue: str | None = None
    task: str | None = None
    statuses: tuple[str, ...] = ()
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "task": self.task, "statuses": list(self.statuses), "code": self.code}


@dataclass(frozen=True, slots=True)
class Run:
    """A run as the commands show it: the occurrence and its queue (its job's kind)."""

    occurrence: Occurrence
    queue: str

    def to_dict(self) -> dict[str, Any]:
        """The run in ``TaskRun``'s terms (camelCase keys, whole ids)."""
        occurrence = self.occurrence
        payload = occurrence.payload
        return {
            "id": occurrence.id,
            "task": occurrence.job_id,
            "queue": self.queue,
            "status": occurrence.status,
            "attempt": occurrence.attempt,
            "maxAttempts": occurrence.max_attempts,
            "triggerKey": occurrence.trigger_key,
            "args": payload.get("args") if isinstance(payload, dict) else None,
            "value": occurrence.result if occurrence.status == "succeeded" else None,
            "error": occurrence.last_error,
            "scheduledFor": occurrence.scheduled_for,
            "createdAt": occurrence.created_at,
            "updatedAt": occurrence.updated_at,
            "settledAt": occurrence.settled_at,
        }


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[Run]
    more: bool
    """Whether runs follow the last one (continue with ``after=runs[-1].occurrence.id``)."""


def listing_query(runs: RunFilter, cursor: tuple[int, str] | None) -> Select[Any]:
    """The listing's statement without the task / queue terms (:func:`list_runs` adds them)."""
    query = select(_o, _j.c.kind).join(_j, _j.c.job_id == _o.c.job_id)
    if runs.statuses:
        query = query.where(_o.c.status.in_(list(runs.statuses)))
    if runs.code is not None:
        query = query.where(json_text_field(_o.c.last_error_json, "code") == runs.code)
    if cursor is not None:
        query = query.where(tuple_(_o.c.created_at, _o.c.occurrence_id) < tuple_(*cursor))
    return query.order_by(_o.c.created_at.desc(), _o.c.occurrence_id.desc())


def job_walk(base: Select[Any], job: str, limit: int) -> Select[Any]:
    """One task's runs of a listing: an index walk of ``scheduler_occurrences_job``, newest first."""
    return base.where(_o.c.job_id == job).limit(limit)


def _jobs(connection: Connection, runs: RunFilter) -> list[str] | None:
    """The tasks whose runs are listed (``None``: every task)."""
    if runs.queue is None:
        return None if runs.task is None else [runs.task]
    query = select(_j.c.job_id).where(_j.c.kind == runs.queue).order_by(_j.c.job_id)
    if runs.task is not None:
        query = query.where(_j.c.job_id == runs.task)
    return [str(job) for job in connection.execute(query.limit(MAX_WALKED_JOBS + 1)).scalars()]


def _read(connection: Connection, query: Select[Any]) -> list[Run]:
    found: list[Run] = []
    for row in connection.execute(query):
        occurrence = map_occurrence(row)
        assert occurrence is not None
        found.append(Run(occurrence, str(row.kind)))
    return found


def run_cursor(connection: Connection, run_id: str) -> tuple[int, str] | None:
    """The listing key of run ``run_id`` (``None``: no such run)."""
    row = connection.execute(
        select(_o.c.created_at, _o.c.occurrence_id).where(_o.c.occurrence_id == run_id)
    ).first()
    return None if row is None else (int(row[0]), str(row[1]))


def list_runs(
    connection: Connection, runs: RunFilter, *, cursor: tuple[int, str] | None, limit: int
) -> RunPage:
    """At most ``limit`` runs matching ``runs``, newest first, after ``cursor`` (:func:`run_cursor`)."""
    jobs = _jobs(connection, runs)
    base = listing_query(runs, cursor)
    if jobs is None or len(jobs) > MAX_WALKED_JOBS:
        if runs.queue is not None:
            base = base.where(_j.c.kind == runs.queue)
        if runs.task is not None:
            base = base.where(_o.c.job_id == runs.task)
        found = _read(connection, base.limit(limit + 1))
    else:
        found = []
        for job in jobs:
            found += _read(connection, job_walk(base, job, limit + 1))
        found.sort(key=lambda run: (run.occurrence.created_at, run.occurrence.id), reverse=True)
    return RunPage(found[:limit], len(found) > limit)


def queue_of(connection: Connection, job_id: str) -> str | None:
    """The queue (job kind) of task ``job_id`` (``None``: no such job)."""
    kind = connection.execute(select(_j.c.kind).where(_j.c.job_id == job_id)).scalar()
    return None if kind is None else str(kind)


__all__ = [
    "MAX_WALKED_JOBS",
    "Run",
    "RunFilter",
    "RunPage",
    "job_walk",
    "list_runs",
    "listing_query",
    "queue_of",
    "run_cursor",
]
