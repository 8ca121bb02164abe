"""What periodic triggers read and write in the store (beyond the original; API §9).

A worker firing a job's periodic trigger needs, from the database alone (so every worker on every
host decides the same):

* the job's last fired tick of each trigger type (``cron:``, ``interval:``, ``once:`` keys): the one
  with the largest ``scheduled_for`` among **all** the job's occurrences, however many other
  occurrences it has (``latest_ticks_in``; ``prune`` keeps exactly these rows);
* when its trigger was last changed (``trigger_changed_at``: job-level events, never pruned);
* an enqueue of a tick that happens only while the job is still at the revision the tick was
  computed from and has fired no tick of that type at or after it (``enqueue_tick_in``), so no
  worker that has not yet seen a change fires a tick of the old schedule after it, and none whose
  memory of the last fired tick is stale fires a tick again that a prune deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import and_, bindparam, case, func, or_, select

from scheduler.contract.scalars import assert_positive_safe_int
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.jobs import load_job, not_found, trigger_changed_at
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.capabilities.occurrences import (
    OMITTED,
    EnqueueRequest,
    enqueue_in,
    enqueue_once_in,
    normalize_enqueue,
)
from scheduler.store.plumbing.rows import data_corrupt
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Job, Occurrence, Record

TICK_PREFIXES: Final = ("cron:", "interval:", "once:")
"""The key prefix of each periodic trigger type (a changed interval's keys start with it too)."""

_o = t.occurrences


@dataclass(frozen=True, slots=True)
class FiredTick(Record):
    """The newest fired tick of one trigger type: its key and ``scheduled_for`` (epoch ms)."""

    occurrence_id: str
    trigger_key: str
    scheduled_for: int


@dataclass(frozen=True, slots=True)
class PeriodicState(Record):
    """What decides a job's next periodic ticks, read in one transaction.

    ``trigger_changed_at``: when ``update_job`` last set the trigger (``None``: never, it is the
    one the job was created with). ``ticks``: the last fired tick per key prefix.
    """

    job: Job
    trigger_changed_at: int | None
    ticks: dict[str, FiredTick]


def tick_prefix(trigger_key: str) -> str | None:
    """``"cron:"``, ``"interval:"`` or ``"once:"`` if the key is a periodic tick's, else ``None``."""
    return next((prefix for prefix in TICK_PREFIXES if trigger_key.startswith(prefix)), None)


def _family() -> Any:
    key = _o.c.trigger_key
    return case(
        *((func.substr(key, 1, len(prefix)) == prefix, prefix) for prefix in TICK_PREFIXES),
        else_=None,
    )


def _newest_ticks() -> Any:
    family = _family()
    ranked = (
        select(
            _o.c.occurrence_id,
            _o.c.trigger_key,
            _o.c.scheduled_for,
            family.label("family"),
            func.row_number()
            .over(partition_by=family, order_by=(_o.c.scheduled_for.desc(), _o.c.occurrence_id.desc()))
            .label("rank"),
        )
        .where(_o.c.job_id == bindparam("job_id"), family.is_not(None))
        .subquery()
    )
    return select(
        ranked.c.occurrence_id, ranked.c.trigger_key, ranked.c.scheduled_for, ranked.c.family
    ).where(ranked.c.rank == 1)


def _prior_or_later() -> Any:
    key: Any = bindparam("trigger_key")
    other_key = case((_o.c.trigger_key == key, 0), else_=1)
    return (
        select(_o, other_key.label("other_key"))
        .where(
            _o.c.job_id == bindparam("job_id"),
            or_(
                _o.c.trigger_key == key,
                and_(
                    _o.c.scheduled_for >= bindparam("at"),
                    func.substr(_o.c.trigger_key, 1, bindparam("width")) == bindparam("prefix"),
                ),
            ),
        )
        .order_by(other_key, _o.c.created_at, _o.c.occurrence_id)
        .limit(2)
    )


_PRIOR_OR_LATER: Final = Prepared(_prior_or_later())
"""In one pass over the job's occurrences: those with the tick's key (first), else a tick of its
type (key prefix) at or after it. Prune never deletes a job's newest tick of a type, so one exists
whenever any tick at or after that instant ever fired."""
_NEWEST_TICKS: Final = Prepared(_newest_ticks())
"""One pass over the job's occurrences (``scheduler_occurrences_job``), not bounded to its newest
rows: a tick buried under any number of later occurrences is still found."""


def latest_ticks_in(tx: Tx, job_id: str) -> dict[str, FiredTick]:
    """The job's tick with the largest ``scheduled_for`` of each trigger type."""
    return {
        row.family: FiredTick(row.occurrence_id, row.trigger_key, int(row.scheduled_for))
        for row in tx.all(_NEWEST_TICKS, {"job_id": job_id})
    }


def periodic_state_in(tx: Tx, job_id: str) -> PeriodicState | None:
    job = load_job(tx, job_id)
    if job is None:
        return None
    return PeriodicState(job, trigger_changed_at(tx, job), latest_ticks_in(tx, job_id))


def enqueue_tick_in(tx: Tx, request: EnqueueRequest, job_revision: int) -> Occurrence | None:
    """``enqueue_occurrence_once_per_trigger`` if the job is still at ``job_revision`` and fired no
    tick of the same type at or after this one since; else ``None`` (nothing written).

    The job's row is locked before its revision is compared, and ``update_job`` locks it too, so
    a tick is enqueued only under the trigger it was computed from. The later-tick check is what
    the caller's floor (its last fired tick, read earlier) already says, taken again inside the
    write: a caller whose memory is stale (suspended while other workers fired, and a prune then
    deleted those ticks but the newest) would otherwise enqueue the pruned ticks again."""
    job = load_job(tx, request.job_id, lock=True)
    if job is None:
        raise not_found("job", request.job_id)
    if job.revision != job_revision:
        return None
    prefix = tick_prefix(request.trigger_key)
    if prefix is None:  # not a tick's key: nothing to compare it with
        return enqueue_once_in(tx, request)
    params = {
        "job_id": request.job_id,
        "trigger_key": request.trigger_key,
        "at": request.scheduled_for,
        "prefix": prefix,
        "width": len(prefix),
    }
    rows = tx.all(_PRIOR_OR_LATER, params)
    prior = [row for row in rows if row.other_key == 0]
    if len(prior) > 1:
        raise data_corrupt("Multiple occurrences exist for a unique job trigger")
    if prior:
        return occurrence_record(prior[0], deduplicated=True)
    return None if rows else enqueue_in(tx, request)


class PeriodicTickOperations(StoreBase):
    """The store's side of periodic triggers (``scheduler.worker.periodic``)."""

    def latest_trigger_ticks(self, job_id: str) -> dict[str, FiredTick]:
        """The job's last fired periodic tick per key prefix (``"cron:"``, ``"interval:"``, ``"once:"``):
        the one with the largest ``scheduled_for`` among all its occurrences."""
        self._assert_open()  # a read checks the store before its arguments, like the seed's reads
        identifier = normalize_key(job_id, "jobId")
        return self._read(lambda tx: latest_ticks_in(tx, identifier))

    def periodic_state(self, job_id: str) -> PeriodicState | None:
        """The job, when its trigger was last changed and its last fired tick per key prefix, read
        together (``None`` if the job does not exist)."""
        self._assert_open()  # a read checks the store before its arguments, like the seed's reads
        identifier = normalize_key(job_id, "jobId")
        return self._read(lambda tx: periodic_state_in(tx, identifier))

    def enqueue_periodic_tick(
        self, *, job_id: str, job_revision: int, scheduled_for: int, trigger_key: str
    ) -> Occurrence | None:
        """``enqueue_occurrence_once_per_trigger(job_id, scheduled_for, trigger_key)`` (the job's
        payload), done only if the job is still at ``job_revision``: ``None`` (nothing written) when
        it changed since the tick was computed, or when the trigger key is new and the job already
        fired a tick of its type (``cron:``, ``interval:``, ``once:``) at or after ``scheduled_for``.
        ``SCHEDULER_NOT_FOUND`` / ``SCHEDULER_JOB_DISABLED`` as the enqueue; invalid arguments
        ``SCHEDULER_INVALID_ARGUMENT``."""
        normalize_key(job_id, "jobId")
        revision = assert_positive_safe_int(job_revision, "jobRevision")
        request = normalize_enqueue(job_id, scheduled_for, trigger_key, None, OMITTED)
        return self._write(lambda tx: enqueue_tick_in(tx, request, revision))


__all__ = [
    "TICK_PREFIXES",
    "FiredTick",
    "PeriodicState",
    "PeriodicTickOperations",
    "enqueue_tick_in",
    "latest_ticks_in",
    "periodic_state_in",
    "tick_prefix",
]
