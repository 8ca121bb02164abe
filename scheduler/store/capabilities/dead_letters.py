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
dead-letterings (``settled_at`` then follows commit order). The walk reads at most
:data:`EVENT_SCAN_BUDGET` events; when it cannot answer within that (dead letters sparse among
recent events, rows dead-lettered without an event, fewer dead letters than asked for), the
seed's own sorting query answers instead.
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

EVENT_SCAN_BUDGET = 10_000
"""Events the walk may read before the seed's query answers instead."""
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


def _seed_key(row: StoredRow) -> tuple[int, str]:
    return (-row.settled_at, row.occurrence_id)


def _walk_events(tx: Tx, job_id: str | None, unknown_only: bool, count: int) -> list[StoredRow] | None:
    """The first ``count`` in the seed's order from the events walk, or ``None`` if it cannot tell."""
    newest = tx.first(_NEWEST_EVENT)[0] or 0
    floor = max(0, newest + 1 - EVENT_SCAN_BUDGET)
    params: dict[str, Any] = {"before": newest + 1, "floor": floor, "page": count + PAGE_MARGIN}
    if job_id is not None:
        params["job_id"] = job_id
    statement = _walk(job_id is not None, unknown_only)
    found: dict[str, StoredRow] = {}
    while True:
        rows = tx.all(statement, params)
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
    walked = _walk_events(tx, job_id, unknown_only, count)
    if walked is not None:
        return walked
    params: dict[str, Any] = {"limit": count}
    if job_id is not None:
        params["job_id"] = job_id
    return tx.all(_sorted(job_id is not None, unknown_only), params)
