"""The overview's figures and chart, read through indexes only (read-only).

Nothing here sorts or counts an unbounded set. A count walks an index range and stops after
:data:`WINDOW` + 1 entries (shown as "≥ 10,000" beyond that); a figure that no index serves is
computed over a bounded window and says so. The indexes used (``scheduler/schema/ddl.py``):

* ``scheduler_occurrences_claim`` (status, available_at, lease_expires_at, scheduled_for,
  occurrence_id): counts per status, the oldest due occurrence, running and expired leases;
* the ``events`` primary key: the newest events, for the throughput chart;
* ``scheduler_occurrence_controls_state`` and ``scheduler_adjudications_status``: paused runs and
  recorded adjudications.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import ScalarSelect, Select, and_, case, exists, func, literal, select, union_all

from scheduler.contract.constants import DEAD_LETTER, OCCURRENCE_STATUSES, RUNNING
from scheduler.schema import tables as t
from scheduler.store.capabilities.dead_letters import OUTCOME_UNKNOWN_GLOB
from scheduler.store.capabilities.stats import DEPTH_STATUSES, oldest_due_in
from scheduler.store.plumbing.constructs import glob_match, json_text_field
from scheduler.store.plumbing.tx import Tx

WINDOW: Final = 10_000
"""Rows a count, or a filter no index serves, reads at most."""
SAMPLE: Final = 1_000
"""Runs of a status holding more than ``WINDOW`` that the overview's per-queue split reads (its
newest): a lower bound per queue, labelled as such."""

_o, _j, _e = t.occurrences, t.jobs, t.events
_c, _a = t.occurrence_controls, t.adjudications


@dataclass(frozen=True, slots=True)
class Count:
    """A count that stopped at :data:`WINDOW` + 1 rows: ``at_least`` means "this many or more"."""

    value: int
    at_least: bool = False

    def __str__(self) -> str:
        return f"≥ {self.value:,}" if self.at_least else f"{self.value:,}"


def _capped(rows: Select[Any]) -> ScalarSelect[Any]:
    """How many rows ``rows`` selects, reading at most ``WINDOW + 1`` of them (a scalar subquery)."""
    return select(func.count()).select_from(rows.limit(WINDOW + 1).subquery()).scalar_subquery()


def _count(found: Any) -> Count:
    value = int(found or 0)
    return Count(WINDOW, True) if value > WINDOW else Count(value)


def capped_count(tx: Tx, rows: Select[Any]) -> Count:
    """How many rows ``rows`` selects, reading at most ``WINDOW + 1`` of them."""
    return _count(tx.scalar(select(_capped(rows))))


def status_count(tx: Tx, status: str) -> Count:
    return capped_count(tx, select(_o.c.occurrence_id).where(_o.c.status == status))


@dataclass(frozen=True, slots=True)
class DepthRow:
    """One queue (job kind): its occurrences per status (lower bounds where the status's window
    was full, see :attr:`Overview.depth_sampled`)."""

    kind: str
    counts: dict[str, Count]


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview page shows, read in one snapshot at ``now``."""

    now: int
    statuses: dict[str, Count]
    depth: list[DepthRow]
    depth_sampled: tuple[str, ...]
    """Statuses with more than ``WINDOW`` runs: their per-queue figures count their newest
    ``SAMPLE`` runs only, and are shown as lower bounds."""
    oldest_due_at: int | None
    expired_leases: Count
    paused: Count
    pause_requested: Count
    adjudications_pending: Count
    awaiting_decision: Count
    """Outcome-unknown dead letters without a decision (among the newest ``SAMPLE`` dead letters
    when there are more than ``WINDOW``: ``awaiting_sampled``)."""
    awaiting_sampled: bool

    @property
    def oldest_due_age_ms(self) -> int | None:
        return None if self.oldest_due_at is None else max(0, self.now - self.oldest_due_at)


def newest_of_status(status: str, limit: int, *columns: Any) -> Select[Any]:
    """The newest ``limit`` runs of ``status`` by ``available_at`` (``scheduler_occurrences_claim``,
    walked backwards); ``columns`` (default: every column)."""
    return (
        select(*(columns or (_o,)))
        .where(_o.c.status == status)
        .order_by(
            _o.c.available_at.desc(),
            _o.c.lease_expires_at.desc(),
            _o.c.scheduled_for.desc(),
            _o.c.occurrence_id.desc(),
        )
        .limit(limit)
    )


def newest_dead_letters_window(limit: int = WINDOW) -> Select[Any]:
    """The newest ``limit`` dead letters (every column)."""
    return newest_of_status(DEAD_LETTER, limit)


def awaiting_decision_filter(rows: Any) -> list[Any]:
    """Outcome-unknown dead letters with no adjudication row (``rows``: a selectable of occurrences)."""
    return [
        glob_match(json_text_field(rows.c.last_error_json, "code"), OUTCOME_UNKNOWN_GLOB),
        ~exists().where(_a.c.occurrence_id == rows.c.occurrence_id),
    ]


def _depth(tx: Tx, statuses: dict[str, Count]) -> tuple[list[DepthRow], tuple[str, ...], Count]:
    """Per-queue counts of each live status (all its runs, or its newest ``SAMPLE`` when it has
    more than ``WINDOW``), and the adjudication cases among the same dead letters: one statement."""
    sampled = tuple(status for status in DEPTH_STATUSES if statuses[status].at_least)
    parts = []
    for status in DEPTH_STATUSES:
        if statuses[status].value == 0:
            continue
        columns = [_o.c.job_id, _o.c.occurrence_id, _o.c.last_error_json]
        rows = newest_of_status(status, SAMPLE if status in sampled else WINDOW, *columns).subquery()
        cases = (
            func.sum(case((and_(*awaiting_decision_filter(rows)), 1), else_=0))
            if status == DEAD_LETTER
            else literal(0)
        )
        parts.append(
            select(
                _j.c.kind, literal(status).label("status"), func.count().label("total"), cases.label("cases")
            )
            .select_from(rows.join(_j, _j.c.job_id == rows.c.job_id))
            .group_by(_j.c.kind)
        )
    by_kind: dict[str, dict[str, Count]] = {}
    awaiting = 0
    for row in tx.execute(union_all(*parts)) if parts else ():
        by_kind.setdefault(row.kind, {})[row.status] = Count(int(row.total), row.status in sampled)
        awaiting += int(row.cases or 0)
    depth = [DepthRow(kind, counts) for kind, counts in sorted(by_kind.items())]
    return depth, sampled, Count(awaiting, DEAD_LETTER in sampled)


def overview_in(tx: Tx, now: int) -> Overview:
    figures = {
        **{
            status: _capped(select(_o.c.occurrence_id).where(_o.c.status == status))
            for status in OCCURRENCE_STATUSES
        },
        "expired": _capped(
            select(_o.c.occurrence_id).where(_o.c.status == RUNNING, _o.c.lease_expires_at <= now)
        ),
        "paused": _capped(select(_c.c.occurrence_id).where(_c.c.state == "paused")),
        "pause_requested": _capped(select(_c.c.occurrence_id).where(_c.c.state == "pause_requested")),
        "pending": _capped(select(_a.c.occurrence_id).where(_a.c.status == "pending")),
    }
    counted = tx.execute(select(*(value.label(name) for name, value in figures.items()))).one()._mapping
    statuses = {status: _count(counted[status]) for status in OCCURRENCE_STATUSES}
    depth, sampled, awaiting = _depth(tx, statuses)
    return Overview(
        now=now,
        statuses=statuses,
        depth=depth,
        depth_sampled=sampled,
        oldest_due_at=oldest_due_in(tx, now),
        expired_leases=_count(counted["expired"]),
        paused=_count(counted["paused"]),
        pause_requested=_count(counted["pause_requested"]),
        adjudications_pending=_count(counted["pending"]),
        awaiting_decision=awaiting,
        awaiting_sampled=DEAD_LETTER in sampled,
    )


# --------------------------------------------------------------------------- the chart

SERIES: Final = {
    "occurrence_enqueued": "enqueued",
    "occurrence_succeeded": "succeeded",
    "occurrence_retry_scheduled": "failed, retrying",
    "occurrence_dead_lettered": "dead-lettered",
}
_BUCKETS: Final = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 10800, 21600, 43200, 86400, 604800)
"""Bucket widths in seconds; the narrowest that keeps the chart within :data:`MAX_BUCKETS`."""
MAX_BUCKETS: Final = 60


@dataclass(frozen=True, slots=True)
class Throughput:
    """Event counts per time bucket and series, over the newest ``WINDOW`` events."""

    start: int
    bucket_ms: int
    labels: list[int]
    series: dict[str, list[int]]
    events: int
    window_full: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "bucketMs": self.bucket_ms,
            "labels": self.labels,
            "series": self.series,
            "events": self.events,
            "windowFull": self.window_full,
        }


def throughput_in(tx: Tx, now: int) -> Throughput:
    """The newest ``WINDOW`` events (primary key, backwards), counted per bucket from the oldest of
    them to ``now`` (two aggregates over the same window, computed by the database)."""
    window = select(_e.c.occurred_at, _e.c.event_type).order_by(_e.c.event_id.desc()).limit(WINDOW).subquery()
    occurred = window.c.occurred_at
    span: tuple[Any, ...] = tuple(
        tx.execute(select(func.min(occurred), func.max(occurred), func.count()).select_from(window)).one()
    )
    first, last, count = span
    events = int(count)
    oldest = now if first is None else int(first)
    end = max(now, now if last is None else int(last))
    span_s = max(1, (end - oldest) // 1000 + 1)
    width_s = next((width for width in _BUCKETS if span_s / width <= MAX_BUCKETS), _BUCKETS[-1])
    bucket_ms = width_s * 1000
    start = (max(oldest, end - bucket_ms * MAX_BUCKETS) // bucket_ms) * bucket_ms
    buckets = max(1, (end - start) // bucket_ms + 1)
    bucket = ((window.c.occurred_at - start) // bucket_ms).label("bucket")  # integer division
    grouped = (
        select(window.c.event_type, bucket, func.count().label("total"))
        .where(window.c.event_type.in_(list(SERIES)), window.c.occurred_at >= start)
        .group_by(window.c.event_type, bucket)
    )
    series = {name: [0] * buckets for name in SERIES.values()}
    for row in tx.execute(grouped):
        index = int(row.bucket)
        if 0 <= index < buckets:
            series[SERIES[row.event_type]][index] += int(row.total)
    return Throughput(
        start=start,
        bucket_ms=bucket_ms,
        labels=[start + index * bucket_ms for index in range(buckets)],
        series=series,
        events=events,
        window_full=events >= WINDOW,
    )
