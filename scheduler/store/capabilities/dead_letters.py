"""Dead letters newest first, without sorting every dead letter (seed: listDeadLetters and
listAdjudicationCases order by ``settled_at DESC, occurrence_id``).

No index orders occurrences by ``settled_at`` and the catalog is fixed, so the seed's query sorts
every dead letter (166 ms at 100k). But every dead-lettering appends an
``occurrence_dead_lettered`` event in the same transaction, with ``occurred_at`` equal to the
row's ``settled_at``, and events are numbered in commit order. :func:`newest_dead_letters`
therefore reads those events newest first, a range of event ids at a time (the events primary
key, or ``scheduler_events_job`` for one job), each range twice as long as the one before: the
database ranks a range's events by the seed's key, and only the first of them are checked for
an occurrence still dead-lettered at that very time. The walk stops once no unread event can
tie with the last one kept; a burst of dead letters in one transaction (one ``settled_at``)
costs a sort of its events, not a read of every occurrence in it.

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

from sqlalchemy import Integer, bindparam, exists, func, literal_column, null, select, union_all

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
def _range(by_job: bool) -> Prepared:
    """The dead-lettering events with ids in ``[:low, :high)``: the first ``:candidates`` of them
    by ``occurred_at DESC, occurrence_id`` (the seed's order of the dead letters they made, for
    those still dead-lettered at that time: :func:`_still_dead`), and one row more with
    ``occurrence_id`` NULL and, as ``occurred_at``, the time of the first event from ``:low`` on
    (any type): no older event happened later.

    The events are read by the events primary key (or ``scheduler_events_job``) in a subquery
    with a LIMIT of its own (``:span``, the range's length, so it never cuts one) and ranked on
    their own columns: no occurrence is read for a dead letter the listing does not return, so
    a burst of them in one transaction (one ``settled_at``) costs a sort of short rows.
    """
    events = select(_e.c.occurrence_id, _e.c.occurred_at).where(
        _e.c.event_type == literal_column("'occurrence_dead_lettered'"),
        _e.c.event_id >= bindparam("low"),
        _e.c.event_id < bindparam("high"),
    )
    if by_job:
        events = events.where(_e.c.job_id == bindparam("job_id"))
    in_range = events.limit(_literal("span")).subquery("dead_lettering")
    first = (
        select(in_range.c.occurrence_id, in_range.c.occurred_at)
        .order_by(in_range.c.occurred_at.desc(), in_range.c.occurrence_id)
        .limit(_literal("candidates"))
        .subquery("first")
    )
    at_low = (
        select(_e.c.occurred_at).where(_e.c.event_id >= bindparam("low")).order_by(_e.c.event_id).limit(1)
    )
    oldest = select(null().label("occurrence_id"), at_low.scalar_subquery().label("occurred_at"))
    return Prepared(union_all(select(first), oldest))


@functools.cache
def _still_dead(unknown_only: bool) -> Prepared:
    """The occurrences ``:ids`` (``unknown_only``: the outcome-unknown ones without an
    adjudication) with their status and ``settled_at``: found by primary key, the status is
    compared by the caller (as a condition here, it could lead SQLite to walk every dead letter
    in the claim index instead)."""
    query = select(_o.c.occurrence_id, _o.c.status, _o.c.settled_at).where(
        _o.c.occurrence_id.in_(bindparam("ids", expanding=True))
    )
    if unknown_only:
        query = query.where(*_unknown_outcome_without_adjudication())
    return Prepared(query)


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


Key = tuple[int, str]
"""A dead letter's place in the seed's order: (``-settled_at``, ``occurrence_id``)."""


def _dead_in_range(
    tx: Tx, params: dict[str, Any], unknown_only: bool, count: int
) -> tuple[list[Key], int | None]:
    """The first ``count`` dead letters the events of one range made, still dead-lettered at
    the event's time, and the range's lower time bound (:func:`_range`). The first events by the
    seed's key are checked, twice as many each time until ``count`` of them still are (the
    others were requeued since, or are not outcome-unknown ones) or the range has no more."""
    candidates = count + PAGE_MARGIN
    while True:
        rows = tx.all(_range("job_id" in params), {**params, "candidates": candidates})
        oldest = next(row.occurred_at for row in rows if row.occurrence_id is None)
        events = [row for row in rows if row.occurrence_id is not None]
        ids = list({row.occurrence_id for row in events})
        found = tx.all(_still_dead(unknown_only), {"ids": ids}) if ids else []
        settled = {row.occurrence_id: row.settled_at for row in found if row.status == DEAD_LETTER}
        # An occurrence requeued and dead-lettered again within one millisecond has two events
        # of its settled_at: it counts once, or the range would stop short of another's.
        dead = list(
            dict.fromkeys(
                (-row.occurred_at, row.occurrence_id)
                for row in events
                if settled.get(row.occurrence_id) == row.occurred_at
            )
        )
        if len(dead) >= count or len(events) < candidates:
            return dead, oldest
        candidates *= 2


def _walk(tx: Tx, job_id: str | None, unknown_only: bool, count: int) -> list[Key] | None:
    """The first ``count`` in the seed's order from the events walk, or ``None`` when the seed's
    sorting query should answer (see the module docstring)."""
    by_job = {} if job_id is None else {"job_id": job_id}
    high = (tx.first(_NEWEST_EVENT)[0] or 0) + 1
    span, read, check, bound = count + PAGE_MARGIN, 0, EVENT_SCAN_BUDGET, SORT_BUDGET
    kept: set[Key] = set()
    while True:
        low = max(0, high - span)
        dead, oldest = _dead_in_range(
            tx, {**by_job, "low": low, "high": high, "span": high - low}, unknown_only, count
        )
        first = heapq.nsmallest(count, kept.union(dead))
        kept = set(first)
        if len(first) == count and (low == 0 or (oldest is not None and oldest < -first[-1][0])):
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
        ids = [occurrence_id for _, occurrence_id in keys]
        rows = {row.occurrence_id: row for row in tx.all(_BY_ID, {"ids": ids})}
        return [rows[occurrence_id] for occurrence_id in ids]
    params: dict[str, Any] = {"limit": count}
    if job_id is not None:
        params["job_id"] = job_id
    return tx.all(_sorted(job_id is not None, unknown_only), params)
