"""Dead letters newest first, without sorting every dead letter (seed: listDeadLetters and
listAdjudicationCases order by ``settled_at DESC, occurrence_id``).

No index orders occurrences by ``settled_at`` and the catalog is fixed, so the seed's query sorts
every dead letter (166 ms at 100k). But every dead-lettering appends an
``occurrence_dead_lettered`` event in the same transaction, with ``occurred_at`` equal to the
row's ``settled_at``, and events are numbered in commit order. :func:`newest_dead_letters`
therefore walks those events newest first (the events primary key, or ``scheduler_events_job``
for one job), keeps the occurrences still dead-lettered at that very time, and orders them by the
seed's key in Python, reading on until no unread event can tie with the last one kept.

This is the seed's order as long as the store's clock never goes backwards between two
dead-letterings (``settled_at`` then follows commit order). The walk reads the events in rounds:
the first :data:`EVENT_SCAN_BUDGET` events, then each round :data:`GROWTH` times more. When a
round cannot answer (dead letters sparse among the recent events), the seed's own sorting query
answers instead if it would read fewer rows than the round's :data:`SORT_BUDGET` (also
multiplied each round): the dead letters (the claim index's ``dead_letter`` entries), or for one
job its occurrences (``scheduler_occurrences_job``), counted up to that bound. So a listing costs
a few times the smaller of the events written since its oldest dead letter and the rows the
sort would read, never a sort of every dead letter behind a burst of other events. The sorting
query also answers when every event was read without an answer (rows dead-lettered without an
event, fewer dead letters than asked for).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import and_, bindparam, exists, func, literal_column, select

from scheduler.contract.constants import DEAD_LETTER
from scheduler.schema import tables as t
from scheduler.store.plumbing.constructs import glob_match, json_text_field
from scheduler.store.plumbing.statement_plans import Prepared, StoredRow
from scheduler.store.plumbing.tx import Tx

EVENT_SCAN_BUDGET = 4096
"""Events the walk's first round reads."""
SORT_BUDGET = 1024
"""Rows the seed's sorting query may read to answer after the first round."""
GROWTH: Final = 4
"""How much each round raises both bounds."""
PAGE_MARGIN = 16
OUTCOME_UNKNOWN_GLOB: Final = "*_OUTCOME_UNKNOWN"

_e, _o, _a = t.events, t.occurrences, t.adjudications
_NEWEST_EVENT: Final = Prepared(select(func.max(_e.c.event_id)))


def _unknown_outcome_without_adjudication() -> list[Any]:
    """The adjudication listing's pre-filter (seed: the GLOB and the missing adjudication)."""
    return [
        glob_match(json_text_field(_o.c.last_error_json, "code"), OUTCOME_UNKNOWN_GLOB),
        ~exists().where(_a.c.occurrence_id == _o.c.occurrence_id),
    ]


@functools.cache
def _walk(by_job: bool, unknown_only: bool) -> Prepared:
    """The next ``:page`` dead-lettering events before ``:before`` (not below ``:floor``), each with
    its occurrence when that is still dead-lettered at the event's time (else NULL columns).

    The events are a subquery with its own LIMIT, read newest first by the events primary key
    (or ``scheduler_events_job``); the occurrences are probed by primary key for those events
    only (a LEFT JOIN keeps the events the outer loop).
    """
    page = select(_e.c.event_id, _e.c.occurred_at, _e.c.occurrence_id).where(
        _e.c.event_type == literal_column("'occurrence_dead_lettered'"),
        _e.c.event_id < bindparam("before"),
        _e.c.event_id >= bindparam("floor"),
    )
    if by_job:
        page = page.where(_e.c.job_id == bindparam("job_id"))
    events = page.order_by(_e.c.event_id.desc()).limit(bindparam("page")).subquery("dead_lettering")
    still_dead = [
        _o.c.occurrence_id == events.c.occurrence_id,
        _o.c.status == literal_column(f"'{DEAD_LETTER}'"),
        _o.c.settled_at == events.c.occurred_at,
    ]
    if unknown_only:
        still_dead += _unknown_outcome_without_adjudication()
    query = select(events.c.event_id, events.c.occurred_at, *_o.c).select_from(
        events.outerjoin(_o, and_(*still_dead))
    )
    return Prepared(query)


@functools.cache
def _sorted(by_job: bool, unknown_only: bool) -> Prepared:
    """The seed's query: every matching dead letter sorted by ``settled_at DESC, occurrence_id``."""
    query = select(_o).where(_o.c.status == DEAD_LETTER)
    if by_job:
        query = query.where(_o.c.job_id == bindparam("job_id"))
    if unknown_only:
        query = query.where(*_unknown_outcome_without_adjudication())
    return Prepared(query.order_by(_o.c.settled_at.desc(), _o.c.occurrence_id).limit(bindparam("limit")))


@functools.cache
def _sort_rows(by_job: bool) -> Prepared:
    """How many rows the seed's sorting query would read, counted up to ``:bound``: the dead
    letters, or the job's occurrences (read through ``scheduler_occurrences_job``)."""
    counted = select(_o.c.occurrence_id)
    if by_job:
        counted = counted.where(_o.c.job_id == bindparam("job_id"))
    else:
        counted = counted.where(_o.c.status == literal_column(f"'{DEAD_LETTER}'"))
    rows = counted.limit(bindparam("bound")).subquery("counted")
    return Prepared(select(func.count()).select_from(rows))


def _seed_key(row: StoredRow) -> tuple[int, str]:
    return (-row.settled_at, row.occurrence_id)


class _Walk:
    """The dead-lettering events read so far, newest first, and what they tell."""

    __slots__ = ("count", "found", "params", "statement", "tx")

    def __init__(self, tx: Tx, job_id: str | None, unknown_only: bool, count: int) -> None:
        self.tx = tx
        self.count = count
        self.statement = _walk(job_id is not None, unknown_only)
        self.params: dict[str, Any] = {"page": count + PAGE_MARGIN}
        if job_id is not None:
            self.params["job_id"] = job_id
        self.found: dict[str, StoredRow] = {}

    def down_to(self, before: int, floor: int) -> list[StoredRow] | None:
        """Read the events from ``before`` down to ``floor``: the answer, or ``None`` when those
        events cannot give it."""
        params = {**self.params, "before": before, "floor": floor}
        count, found = self.count, self.found
        while True:
            rows = self.tx.all(self.statement, params)
            for row in rows:
                if row.occurrence_id is not None:
                    found.setdefault(row.occurrence_id, row)
            exhausted = len(rows) < params["page"]
            oldest = min(rows, key=lambda row: row.event_id) if rows else None
            if len(found) >= count:
                ordered = sorted(found.values(), key=_seed_key)
                boundary = ordered[count - 1].settled_at
                if (exhausted and floor == 0) or (oldest is not None and oldest.occurred_at < boundary):
                    return ordered[:count]
            if exhausted or oldest is None:
                return None
            params["before"] = oldest.event_id


def newest_dead_letters(
    tx: Tx, *, job_id: str | None = None, unknown_only: bool = False, count: int
) -> Sequence[StoredRow]:
    """The first ``count`` dead letters by ``settled_at DESC, occurrence_id`` (rows of ``occurrences``).

    ``unknown_only``: only outcome-unknown dead letters without an adjudication (the
    adjudication listing's candidates).
    """
    walk = _Walk(tx, job_id, unknown_only, count)
    before = (tx.first(_NEWEST_EVENT)[0] or 0) + 1
    events, bound = EVENT_SCAN_BUDGET, SORT_BUDGET
    by_job = {} if job_id is None else {"job_id": job_id}
    while before > 0:
        floor = max(0, before - events)
        walked = walk.down_to(before, floor)
        if walked is not None:
            return walked
        if floor > 0 and tx.first(_sort_rows(job_id is not None), {**by_job, "bound": bound + 1})[0] <= bound:
            break
        before, events, bound = floor, max(events, 1) * GROWTH, max(bound, 1) * GROWTH
    return tx.all(_sorted(job_id is not None, unknown_only), {**by_job, "limit": count})
