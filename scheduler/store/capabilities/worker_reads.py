"""Reads the worker runtime needs beyond the original's methods (beyond the original).

* ``list_periodic_jobs`` — enabled jobs whose trigger is ``cron``, ``interval`` or ``once`` (what
  a worker reads and writes per periodic job is in ``periodic_ticks``);
* ``get_occurrence_runtime`` — the job kind and runtime control of a claimed occurrence in one read;
  :func:`occurrence_runtimes_in` — the same for several (a worker's batched claims, in their
  transaction: ``worker_groups``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import bindparam, select

from scheduler.contract.constants import RUNTIME_CONTROL_OCCURRENCE_STATUSES
from scheduler.contract.errors import invalid_argument
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.runtime_reads import (
    list_runtime_control_occurrences_in,
    map_occurrence_control,
    normalize_runtime_control_enumeration,
    normalize_runtime_control_limit,
)
from scheduler.store.plumbing.constructs import json_text_field
from scheduler.store.plumbing.rows import map_job
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Job, OccurrenceControl, Record, RuntimeControlOccurrence

PERIODIC_TRIGGER_TYPES: Final = ("cron", "interval", "once")

_o = t.occurrences
_j = t.jobs
_c = t.occurrence_controls


@dataclass(frozen=True, slots=True)
class OccurrenceRuntime(Record):
    """What a worker needs after a claim: the job's current kind and the occurrence's control."""

    occurrence_id: str
    job_kind: str
    control: OccurrenceControl | None


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


_RUNTIMES: Final = Prepared(
    select(_o.c.occurrence_id.label("claimed_id"), _j.c.kind.label("job_kind"), _c)
    .select_from(
        _o.join(_j, _j.c.job_id == _o.c.job_id).outerjoin(_c, _c.c.occurrence_id == _o.c.occurrence_id)
    )
    .where(_o.c.occurrence_id.in_(bindparam("occurrence_ids", expanding=True))),
    ignores_kept_writes=True,  # run before the claims' kept writes: they go with the COMMIT
)


def occurrence_runtimes_in(tx: Tx, occurrence_ids: Sequence[str]) -> dict[str, OccurrenceRuntime]:
    runtimes: dict[str, OccurrenceRuntime] = {}
    for row in tx.all(_RUNTIMES, {"occurrence_ids": list(occurrence_ids)}):
        control = None if row.state is None else map_occurrence_control(row)
        runtimes[row.claimed_id] = OccurrenceRuntime(
            occurrence_id=row.claimed_id, job_kind=row.job_kind, control=control
        )
    return runtimes


class WorkerReadOperations(StoreBase):
    """Reads for ``scheduler.worker`` (and operators): periodic jobs, claim context."""

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
        return self._read(lambda tx: occurrence_runtime_in(tx, identifier), one_statement=True)
