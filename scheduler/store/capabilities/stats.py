"""``stats`` and ``queue_depth``: operator figures from index-served queries (beyond the original).

Each figure is read through an index of the v6 catalog, so the cost follows the number of
non-terminal (and dead-letter) occurrences, not the table size: per-status totals walk the
``scheduler_occurrences_claim`` index (status first) without touching table rows; per-kind depth
joins only the queued, running, retry-wait and dead-letter rows with their job; the oldest due
occurrence is the first row of an ordered index walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import and_, bindparam, exists, func, literal_column, select

from scheduler.contract.constants import DEAD_LETTER, OCCURRENCE_STATUSES, QUEUED, RETRY_WAIT, RUNNING
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.plumbing.constructs import glob_match, json_text_field
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Record

DEPTH_STATUSES: Final = (QUEUED, RUNNING, RETRY_WAIT, DEAD_LETTER)
"""Statuses broken down by job kind (``succeeded`` is only counted in total)."""

_o = t.occurrences
_j = t.jobs
_c = t.occurrence_controls
_a = t.adjudications


@dataclass(frozen=True, slots=True)
class QueueDepth(Record):
    """Occurrences of one job kind in one status."""

    kind: str
    status: str
    count: int


@dataclass(frozen=True, slots=True)
class StoreStats(Record):
    """A snapshot of the store for operators (``scheduler stats``); times in epoch ms."""

    now: int
    statuses: dict[str, int]
    """Occurrences per status (every status listed)."""
    depth: list[QueueDepth]
    """Per job kind and status, for queued, running, retry_wait and dead_letter."""
    oldest_due_at: int | None
    """``available_at`` of the longest-waiting claimable occurrence (queued or retry_wait, due,
    job enabled, not paused); ``None`` when nothing is due."""
    oldest_due_age_ms: int | None
    running: int
    expired_leases: int
    """Running occurrences whose lease has expired (their worker is gone or stalled)."""
    dead_letters: int
    paused: int
    adjudications_awaiting_decision: int
    """Outcome-unknown dead letters without a decision (``scheduler adjudication list``)."""
    adjudications_pending: int
    """Recorded decisions whose retry has not settled yet."""


def _status_counts(tx: Tx) -> dict[str, int]:
    counts = dict.fromkeys(OCCURRENCE_STATUSES, 0)
    for status in OCCURRENCE_STATUSES:  # one index range count per status
        counts[status] = int(tx.scalar(select(func.count()).select_from(_o).where(_o.c.status == status)))
    return counts


def queue_depth_in(tx: Tx) -> list[QueueDepth]:
    query = (
        select(_j.c.kind, _o.c.status, func.count().label("total"))
        .select_from(_o.join(_j, _j.c.job_id == _o.c.job_id))
        .where(_o.c.status.in_(DEPTH_STATUSES))
        .group_by(_j.c.kind, _o.c.status)
        .order_by(_j.c.kind, _o.c.status)
    )
    return [QueueDepth(kind=row.kind, status=row.status, count=int(row.total)) for row in tx.execute(query)]


def oldest_due_in(tx: Tx, now: int) -> int | None:
    """``available_at`` of the longest-waiting claimable occurrence at ``now`` (``None``: none due)."""
    found: list[int] = []
    for status in (QUEUED, RETRY_WAIT):
        query = (
            select(_o.c.available_at)
            .where(
                _o.c.status == status,
                _o.c.available_at <= bindparam("now"),
                exists().where(_j.c.job_id == _o.c.job_id, _j.c.enabled == 1),
                ~exists().where(_c.c.occurrence_id == _o.c.occurrence_id, _c.c.state == "paused"),
            )
            .order_by(_o.c.available_at)
            .limit(1)
        )
        value = tx.scalar(query, {"now": now})
        if value is not None:
            found.append(int(value))
    return min(found) if found else None


def _count(tx: Tx, query: Any, parameters: Any = None) -> int:
    return int(tx.scalar(query, parameters) or 0)


def stats_in(tx: Tx, now: int) -> StoreStats:
    statuses = _status_counts(tx)
    oldest = oldest_due_in(tx, now)
    expired = _count(
        tx,
        select(func.count()).where(_o.c.status == RUNNING, _o.c.lease_expires_at <= bindparam("now")),
        {"now": now},
    )
    awaiting = _count(
        tx,
        select(func.count())
        .select_from(_o)
        .where(
            _o.c.status == DEAD_LETTER,
            glob_match(json_text_field(_o.c.last_error_json, "code"), "*_OUTCOME_UNKNOWN"),
            ~exists().where(_a.c.occurrence_id == _o.c.occurrence_id),
        ),
    )
    return StoreStats(
        now=now,
        statuses=statuses,
        depth=queue_depth_in(tx),
        oldest_due_at=oldest,
        oldest_due_age_ms=None if oldest is None else max(0, now - oldest),
        running=statuses[RUNNING],
        expired_leases=expired,
        dead_letters=statuses[DEAD_LETTER],
        paused=_count(
            tx, select(func.count()).select_from(_c).where(_c.c.state == literal_column("'paused'"))
        ),
        adjudications_awaiting_decision=awaiting,
        adjudications_pending=_count(
            tx, select(func.count()).select_from(_a).where(and_(_a.c.status == "pending"))
        ),
    )


class StatsOperations(StoreBase):
    """``stats`` and ``queue_depth`` of ``SchedulerStore``."""

    def stats(self) -> StoreStats:
        """Queue depth by kind and status, the oldest due occurrence, leases, dead letters and
        adjudications, read in one snapshot at the store clock's ``now``."""
        self._assert_open()
        now = normalize_epoch_ms(self.clock(), "clock result")
        return self._read(lambda tx: stats_in(tx, now))

    def queue_depth(self) -> list[tuple[str, str, int]]:
        """``(kind, status, count)`` for queued, running, retry_wait and dead_letter occurrences
        (what the ``scheduler.queue.depth`` metric reports)."""
        return [(row.kind, row.status, row.count) for row in self._read(queue_depth_in)]
