"""Dead letters newest first, without sorting every dead letter (seed: listDeadLetters and
listAdjudicationCases order by ``settled_at DESC, occurrence_id``).

No index orders occurrences by ``settled_at`` and the catalog is fixed, so the seed's query sorts
every dead letter (166 ms at 100k). But every dead-lettering appends an
``occurrence_dead_lettered`` event in the same transaction, with ``occurred_at`` equal to the
row's ``settled_at``, and events are numbered in commit order. :func:`newest_dead_letters`
therefore reads those events newest first, a range of event ids at a time (the events primary
key, or ``scheduler_events_job`` for one job), each range twice as long as the one before: the
statement keeps the occurrences still dead-lettered at that very time and returns only the first
``count`` of them by the seed's key, and the oldest dead-lettering time it read. The walk stops
once no unread event can tie with the last one kept; a burst of dead letters in one transaction
(one ``settled_at``) is ranked by the database, not read row by row.

This is the seed's order as long as the store's clock never goes backwards between two
dead-letterings (``settled_at`` then follows commit order). Every :data:`EVENT_SCAN_BUDGET`
events read (a bound :data:`GROWTH` times larger each time), the seed's own sorting query
answers instead if it would read fewer rows than :data:`SORT_BUDGET` (also multiplied each
time): the dead letters (the claim index's ``dead_letter`` entries), or for one job its
occurrences (``scheduler_occurrences_job``), counted up to that bound. So a listing costs a few
times the smaller of the events written since its oldest dead letter and the rows the sort would
read, never a sort of every dead letter behind a burst of other events. The sorting query also
answers when every event was read without an answer (rows dead-lettered without an event, fewer
dead letters than asked for).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Integer, and_, bindparam, exists, func, literal_column, null, select, union_all

from scheduler.contract.constants import DEAD_LETTER
from scheduler.schema import tables as t
from scheduler.store.plumbing.constructs import glob_match, json_text_field
from scheduler.store.plumbing.statement_plans import Prepared, StoredRow
from scheduler.store.plumbing.tx import Tx

EVENT_SCAN_BUDGET = 4096
"""Events read before the first check of the sorting query's cost."""
SORT_BUDGET = 1024
"""Rows the seed's sorting query may read to answer at the first check."""
GROWTH: Final = 4
"""How much each check raises both bounds."""
PAGE_MARGIN = 16
"""Event ids the first range holds beyond the number of dead letters asked for."""
OUTCOME_UNKNOWN_GLOB: Final = "*_OUTCOME_UNKNOWN"

_e, _o, _a = t.events, t.occurrences, t.adjudications
_NEWEST_EVENT: Final = Prepared(select(func.max(_e.c.event_id)))


def _unknown_outcome_without_adjudication() -> list[Any]:
    """The adjudication listing's pre-filter (seed: the GLOB and the missing adjudication)."""
    return [
        glob_match(json_text_field(_o.c.last_error_json, "code"), OUTCOME_UNKNOWN_GLOB),
        ~exists().where(_a.c.occurrence_id == _o.c.occurrence_id),
    ]


def _literal(name: str) -> Any:
    """A count rendered into the SQL when the statement runs (see ``claim_query._count``)."""
    return bindparam(name, type_=Integer(), literal_execute=True)


@functools.cache
def _range(by_job: bool, unknown_only: bool) -> Prepared:
    """The dead-lettering events with ids in ``[:low, :high)``: the first ``:count`` of their
    occurrences still dead-lettered at the event's time, by the seed's key (``occurrence_id``,
    ``settled_at``), and one row more with ``occurrence_id`` NULL and, as ``settled_at``, the
    time of the first event from ``:low`` on (any type): no older event happened later.

    The events are a subquery with a LIMIT of its own (``:span``, the range's length, so it never
    cuts one), read by the events primary key (or ``scheduler_events_job``), and their
    occurrences are probed by primary key (a LEFT JOIN keeps the events the outer loop), in a
    subquery with such a LIMIT too: planned apart from the ranking's sort, which PostgreSQL's
    store connection costs as if sorts were disabled (``opening.PLANNER_SQL``), and so would leave
    the join to chance in the same query.
    """
    events = select(_e.c.occurrence_id, _e.c.occurred_at).where(
        _e.c.event_type == literal_column("'occurrence_dead_lettered'"),
        _e.c.event_id >= bindparam("low"),
        _e.c.event_id < bindparam("high"),
    )
    if by_job:
        events = events.where(_e.c.job_id == bindparam("job_id"))
    in_range = events.limit(_literal("span")).subquery("dead_lettering")
    still_dead = [
        _o.c.occurrence_id == in_range.c.occurrence_id,
        _o.c.status == literal_column(f"'{DEAD_LETTER}'"),
        _o.c.settled_at == in_range.c.occurred_at,
    ]
    if unknown_only:
        still_dead += _unknown_outcome_without_adjudication()
    joined = (
        select(_o.c.occurrence_id, _o.c.settled_at)
        .select_from(in_range.outerjoin(_o, and_(*still_dead)))
        .limit(_literal("span"))
        .subquery("still_dead")
    )
    first = (
        select(joined.c.occurrence_id, joined.c.settled_at)
        .where(joined.c.occurrence_id.is_not(None))
        .order_by(joined.c.settled_at.desc(), joined.c.occurrence_id)
        .limit(_literal("count"))
        .subquery("first")
    )
    at_low = (
        select(_e.c.occurred_at).where(_e.c.event_id >= bindparam("low")).order_by(_e.c.event_id).limit(1)
    )
    oldest = select(null().label("occurrence_id"), at_low.scalar_subquery().label("settled_at"))
    return Prepared(union_all(select(first), oldest))


_BY_ID: Final = Prepared(select(_o).where(_o.c.occurrence_id.in_(bindparam("ids", expanding=True))))


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


def _walk(tx: Tx, job_id: str | None, unknown_only: bool, count: int) -> list[StoredRow] | None:
    """The first ``count`` in the seed's order from the events walk (the keys), or ``None`` when
    the seed's sorting query should answer (see the module docstring)."""
    statement = _range(job_id is not None, unknown_only)
    by_job = {} if job_id is None else {"job_id": job_id}
    high = (tx.first(_NEWEST_EVENT)[0] or 0) + 1
    span, read, check, bound = count + PAGE_MARGIN, 0, EVENT_SCAN_BUDGET, SORT_BUDGET
    kept: dict[str, StoredRow] = {}
    oldest: int | None = None
    while True:
        low = max(0, high - span)
        rows = tx.all(statement, {**by_job, "low": low, "high": high, "span": high - low, "count": count})
        for row in rows:
            if row.occurrence_id is None:
                oldest = row.settled_at
            else:
                kept.setdefault(row.occurrence_id, row)
        first = heapq.nsmallest(count, kept.values(), key=_seed_key)
        kept = {row.occurrence_id: row for row in first}
        if len(first) == count and (low == 0 or (oldest is not None and oldest < first[-1].settled_at)):
            return first
        if low == 0:
            return None
        high, span, read = low, span * 2, read + high - low
        if read >= check:
            if tx.first(_sort_rows(job_id is not None), {**by_job, "bound": bound + 1})[0] <= bound:
                return None
            check, bound = max(check, 1) * GROWTH, max(bound, 1) * GROWTH


def newest_dead_letters(
    tx: Tx, *, job_id: str | None = None, unknown_only: bool = False, count: int
) -> Sequence[StoredRow]:
    """The first ``count`` dead letters by ``settled_at DESC, occurrence_id`` (rows of ``occurrences``).

    ``unknown_only``: only outcome-unknown dead letters without an adjudication (the
    adjudication listing's candidates).
    """
    keys = _walk(tx, job_id, unknown_only, count)
    if keys is not None:
        rows = {
            row.occurrence_id: row for row in tx.all(_BY_ID, {"ids": [key.occurrence_id for key in keys]})
        }
        return [rows[key.occurrence_id] for key in keys]
    params: dict[str, Any] = {"limit": count}
    if job_id is not None:
        params["job_id"] = job_id
    return tx.all(_sorted(job_id is not None, unknown_only), params)
