"""Reads the worker runtime needs beyond the original's methods (beyond the original).

* ``list_periodic_jobs`` — enabled jobs whose trigger is ``cron``, ``interval`` or ``once``;
* ``latest_trigger_ticks`` — a job's last fired periodic tick per trigger type, read from its newest
  occurrences only (bounded, served by ``scheduler_occurrences_job``), so it stays cheap however
  many occurrences a job has;
* ``get_occurrence_runtime`` — the job kind and runtime control of a claimed occurrence in one read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import bindparam, func, select

from scheduler.contract.constants import RUNTIME_CONTROL_OCCURRENCE_STATUSES
from scheduler.contract.errors import invalid_argument
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.base import StoreBase
from scheduler.store.dialect import json_text_field
from scheduler.store.records import Job, OccurrenceControl, Record, RuntimeControlOccurrence
from scheduler.store.rows import map_job
from scheduler.store.runtime_reads import (
    list_runtime_control_occurrences_in,
    map_occurrence_control,
    normalize_runtime_control_enumeration,
    normalize_runtime_control_limit,
)
from scheduler.store.statement_plans import Prepared
from scheduler.store.tx import Tx

PERIODIC_TRIGGER_TYPES: Final = ("cron", "interval", "once")
TICK_PREFIXES: Final = ("cron:", "interval:", "once:")
TICK_SCAN_LIMIT: Final = 1000
"""How many of a job's newest occurrences (by ``created_at``) are searched for its last fired tick."""

_o = t.occurrences
_j = t.jobs
_c = t.occurrence_controls


@dataclass(frozen=True, slots=True)
class FiredTick(Record):
    """The newest fired tick of one trigger type: its key and ``scheduled_for`` (epoch ms)."""

    occurrence_id: str
    trigger_key: str
    scheduled_for: int


@dataclass(frozen=True, slots=True)
class OccurrenceRuntime(Record):
    """What a worker needs after a claim: the job's current kind and the occurrence's control."""

    occurrence_id: str
    job_kind: str
    control: OccurrenceControl | None


def _newest_occurrences(job_id: Any) -> Any:
    return (
        select(_o.c.occurrence_id, _o.c.trigger_key, _o.c.scheduled_for)
        .where(_o.c.job_id == job_id)
        .order_by(_o.c.created_at.desc(), _o.c.occurrence_id.desc())
        .limit(TICK_SCAN_LIMIT)
        .subquery()
    )


def tick_prefix(trigger_key: str) -> str | None:
    """``"cron:"``, ``"interval:"`` or ``"once:"`` if the key is a periodic tick's, else ``None``."""
    return next((prefix for prefix in TICK_PREFIXES if trigger_key.startswith(prefix)), None)


def latest_ticks_in(tx: Tx, job_id: str) -> dict[str, FiredTick]:
    """The last fired tick of each periodic trigger type among the job's newest occurrences."""
    newest = _newest_occurrences(bindparam("job_id"))
    prefix = func.substr(newest.c.trigger_key, 1, 5)
    query = select(newest).where(
        (prefix == "cron:") | (prefix == "once:") | (func.substr(newest.c.trigger_key, 1, 9) == "interval:")
    )
    latest: dict[str, FiredTick] = {}
    for row in tx.execute(query, {"job_id": job_id}):
        kind = tick_prefix(row.trigger_key)
        current = latest.get(kind) if kind else None
        if kind and (current is None or row.scheduled_for > current.scheduled_for):
            latest[kind] = FiredTick(row.occurrence_id, row.trigger_key, row.scheduled_for)
    return latest


def list_periodic_jobs_in(tx: Tx, kinds: Sequence[str] | None) -> list[Job]:
    query = select(_j).where(
        _j.c.enabled == 1, json_text_field(_j.c.trigger_json, "type").in_(PERIODIC_TRIGGER_TYPES)
    )
    if kinds is not None:
        query = query.where(_j.c.kind.in_(list(kinds)))
    return [job for job in map(map_job, tx.execute(query.order_by(_j.c.job_id))) if job is not None]


_RUNTIME: Final = Prepared(
    select(_j.c.kind.label("job_kind"), _c)
    .select_from(
        _o.join(_j, _j.c.job_id == _o.c.job_id).outerjoin(_c, _c.c.occurrence_id == _o.c.occurrence_id)
    )
    .where(_o.c.occurrence_id == bindparam("occurrence_id"))
)


def occurrence_runtime_in(tx: Tx, occurrence_id: str) -> OccurrenceRuntime | None:
    row = tx.first(_RUNTIME, {"occurrence_id": occurrence_id})
    if row is None:
        return None
    control = None if row.state is None else map_occurrence_control(row)
    return OccurrenceRuntime(occurrence_id=occurrence_id, job_kind=row.job_kind, control=control)


class WorkerReadOperations(StoreBase):
    """Reads for ``scheduler.worker`` (and operators): periodic jobs, fired ticks, claim context."""

    def list_periodic_jobs(self, *, job_kinds: Sequence[str] | None = None) -> list[Job]:
        """Enabled jobs whose trigger ``type`` is ``cron``, ``interval`` or ``once``, by id.

        ``job_kinds``: only jobs of these kinds (identifiers); ``None`` = every kind.
        """
        self._assert_open()  # a read checks the store before its arguments, like the seed's reads
        kinds = None
        if job_kinds is not None:
            if isinstance(job_kinds, str) or not isinstance(job_kinds, (list, tuple)):
                raise invalid_argument("jobKinds must be a list of job kinds")
            kinds = [normalize_key(kind, "jobKind", 128) for kind in job_kinds]
        return self._read(lambda tx: list_periodic_jobs_in(tx, kinds))

    def latest_trigger_ticks(self, job_id: str) -> dict[str, FiredTick]:
        """The job's last fired periodic tick per key prefix (``"cron:"``, ``"interval:"``, ``"once:"``):
        the one with the largest ``scheduled_for`` among its newest 1,000 occurrences."""
        self._assert_open()  # a read checks the store before its arguments, like the seed's reads
        identifier = normalize_key(job_id, "jobId")
        return self._read(lambda tx: latest_ticks_in(tx, identifier))

    def list_controllable_occurrences(
        self,
        *,
        statuses: Sequence[str] = RUNTIME_CONTROL_OCCURRENCE_STATUSES,
        job_kinds: Sequence[str] | None = None,
        limit: int = 50,
    ) -> list[RuntimeControlOccurrence]:
        """``list_runtime_control_occurrences`` for any job kind: the original accepts only its six
        product kinds; a worker may run pausable handlers of any kind. ``job_kinds=None`` = every
        kind; otherwise identifiers. Same read model, order and ``limit`` bound (1..200)."""
        self._assert_open()  # a read checks the store before its arguments, like the seed's reads
        selected = normalize_runtime_control_enumeration(
            statuses, RUNTIME_CONTROL_OCCURRENCE_STATUSES, "statuses"
        )
        kinds = None
        if job_kinds is not None:
            if isinstance(job_kinds, str) or not isinstance(job_kinds, (list, tuple)) or not job_kinds:
                raise invalid_argument("jobKinds must be a non-empty array")
            kinds = sorted({normalize_key(kind, "jobKinds[]", 128) for kind in job_kinds})
        bounded = normalize_runtime_control_limit(limit)
        return self._read(lambda tx: list_runtime_control_occurrences_in(tx, selected, kinds, bounded))

    def get_occurrence_runtime(self, occurrence_id: str) -> OccurrenceRuntime | None:
        """The occurrence's current job kind and runtime control (one read), or ``None`` if absent."""
        self._assert_open()  # a read checks the store before its arguments, like the seed's reads
        identifier = normalize_key(occurrence_id, "occurrenceId")
        return self._read(lambda tx: occurrence_runtime_in(tx, identifier))
