"""The runs listing: filters, keyset pagination, index-served walks (read-only).

A listing is driven by one index, chosen from the filter:

* ``job`` — a task/job, or a queue with at most :data:`MAX_JOBS` jobs: ``scheduler_occurrences_job``
  (job_id, created_at, occurrence_id), newest first, the time filter (``created_at``) served by the
  index; several jobs are merged (each walk reads at most a page more than it shows);
* ``status`` — a status: ``scheduler_occurrences_claim`` (status, available_at, lease_expires_at,
  scheduled_for, occurrence_id), newest ``available_at`` first; chosen over ``job`` for a queue of
  several jobs, and for one job when the status has at most
  :data:`~scheduler.dashboard.queries.WINDOW` runs (the walk then sees them all);
* ``recent`` — neither: the runs that have an event among the newest ``WINDOW`` event ids (the
  ``events`` primary key), most recently active first, read newest first until the page is full.

Filters the driving index does not serve (error code, workspace, and the others where so) are
applied to at most ``WINDOW`` index entries per walk (the key of the window's last entry is read
from the index alone, then the rows up to it are filtered, stopping once the page is full); when a
walk used its whole window without filling the page, the page says so and its "next" link
continues the search after that window.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from sqlalchemy import ColumnElement, and_, false, func, or_, select

from scheduler.contract.constants import MAX_SAFE_INTEGER, OCCURRENCE_STATUSES, RUNNING
from scheduler.contract.errors import invalid_argument
from scheduler.contract.storable import normalize_key
from scheduler.dashboard.queries import WINDOW, status_count
from scheduler.schema import tables as t
from scheduler.store.plumbing.constructs import json_text_field
from scheduler.store.plumbing.rows import read_optional_json
from scheduler.store.plumbing.tx import Tx

PAGE: Final = 50
MAX_JOBS: Final = 64
"""A queue with more jobs than this is filtered within the status or recent walk instead."""

Order = Literal["job", "status", "recent"]
Key = tuple[Any, ...]

_o, _j, _e = t.occurrences, t.jobs, t.events
LISTED: Final = tuple(
    _o.c[name]
    for name in (
        "occurrence_id",
        "job_id",
        "status",
        "attempt",
        "max_attempts",
        "fence",
        "scheduled_for",
        "available_at",
        "lease_expires_at",
        "created_at",
        "updated_at",
        "last_error_json",
    )
)
"""The columns a listing reads (payload, result and authority only on a run's own page)."""


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the runs listing is narrowed to (``None``: any). ``since``/``until`` bound ``created_at``
    (epoch ms, ``until`` exclusive)."""

    status: str | None = None
    kind: str | None = None
    job_id: str | None = None
    workspace: str | None = None
    code: str | None = None
    since: int | None = None
    until: int | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, str], *, status: str | None = None) -> RunFilter:
        """A filter from the listing's query or a bulk form (``status``, ``queue``, ``job``,
        ``workspace``, ``code``, ``since``, ``until``); blank means "any"; ``status`` overrides the
        submitted one. A bad value is ``SCHEDULER_INVALID_ARGUMENT``."""
        cleaned: dict[str, Any] = {}
        submitted = {**params, **({"status": status} if status is not None else {})}
        for name, field in (
            ("status", "status"),
            ("queue", "kind"),
            ("job", "job_id"),
            ("workspace", "workspace"),
            ("code", "code"),
        ):
            value = submitted.get(name)
            if isinstance(value, str) and value.strip():
                cleaned[field] = normalize_key(value, name)
        if cleaned.get("status") not in (None, *OCCURRENCE_STATUSES):
            raise invalid_argument(f"status must be one of {', '.join(OCCURRENCE_STATUSES)}")
        for name in ("since", "until"):
            cleaned[name] = parse_time(submitted.get(name), name)
        return cls(**cleaned)


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of a listing: the occurrence's columns a listing shows or acts on (its payload,
    result and authority are read on the run's own page only)."""

    id: str
    job_id: str
    kind: str
    status: str
    attempt: int
    max_attempts: int
    fence: int
    scheduled_for: int
    available_at: int
    lease_expires_at: int | None
    created_at: int
    updated_at: int
    last_error: Any


@dataclass(frozen=True, slots=True)
class RunPage:
    rows: list[RunRow]
    order: Order
    next_cursor: str | None
    searched_window: bool
    """A walk read its whole window of ``WINDOW`` entries: matches may lie beyond it (the next
    page continues the search); always true for the ``recent`` order."""


def parse_time(value: str | None, field: str) -> int | None:
    """``2026-01-01T10:00`` (UTC, as a ``datetime-local`` input sends it) or epoch ms; blank = none."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit() and len(text) <= 16:
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise invalid_argument(f"{field} must be a date and time like 2026-01-01T10:00 (UTC)") from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    milliseconds = int(moment.timestamp() * 1000)
    if not 0 <= milliseconds <= MAX_SAFE_INTEGER:
        raise invalid_argument(f"{field} is out of range")
    return milliseconds


# --------------------------------------------------------------------------- cursors


def encode_cursor(order: Order, key: Key, top: int | None = None) -> str:
    document = json.dumps({"o": order, "k": list(key), "t": top}, separators=(",", ":"))
    return base64.urlsafe_b64encode(document.encode()).decode().rstrip("=")


def decode_cursor(text: str | None, order: Order, width: int) -> tuple[Key, int | None] | None:
    """The key (and event ceiling) a cursor carries, or ``None`` for a missing, malformed or
    foreign one (the listing then starts from its first page)."""
    if not text:
        return None
    try:
        document = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(document, dict) or document.get("o") != order:
        return None
    key, top = document.get("k"), document.get("t")
    if not isinstance(key, list) or len(key) != width:
        return None
    if not all(type(part) in (int, str) for part in key) or not (top is None or type(top) is int):
        return None
    return tuple(key), top


def _before(columns: Sequence[ColumnElement[Any]], key: Key) -> ColumnElement[bool]:
    """Rows after ``key`` in descending ``columns`` order: ``(c1, …) < key``, with ``c1 <= k1``
    first so that the index range starts at the key."""

    def tail(index: int) -> ColumnElement[bool]:
        column, value = columns[index], key[index]
        if index == len(columns) - 1:
            last: ColumnElement[bool] = column < value
            return last
        return or_(column < value, and_(column == value, tail(index + 1)))

    bounded: ColumnElement[bool] = and_(columns[0] <= key[0], tail(0))
    return bounded


# --------------------------------------------------------------------------- filters


def _residual(columns: Any, runs: RunFilter, served: set[str], kind_jobs: list[str] | None) -> list[Any]:
    """The filter terms the driving index does not serve, over ``columns`` (occurrence columns)."""
    terms: list[Any] = []
    if runs.status is not None and "status" not in served:
        terms.append(columns.status == runs.status)
    if runs.job_id is not None and "job" not in served:
        terms.append(columns.job_id == runs.job_id)
    if runs.kind is not None and "job" not in served:
        if kind_jobs is not None:
            terms.append(columns.job_id.in_(kind_jobs) if kind_jobs else false())
        else:
            terms.append(columns.job_id.in_(select(_j.c.job_id).where(_j.c.kind == runs.kind)))
    if runs.workspace is not None:
        terms.append(json_text_field(columns.authority_json, "workspaceId") == runs.workspace)
    if runs.code is not None:
        terms.append(json_text_field(columns.last_error_json, "code") == runs.code)
    if "time" not in served:
        if runs.since is not None:
            terms.append(columns.created_at >= runs.since)
        if runs.until is not None:
            terms.append(columns.created_at < runs.until)
    return terms


@dataclass(frozen=True, slots=True)
class _Walk:
    """One index walk: its fixed terms, the columns it is ordered by, and those its cursor keys."""

    where: list[Any]
    order: Sequence[ColumnElement[Any]]
    key: Sequence[ColumnElement[Any]]


def _not_after(columns: Sequence[ColumnElement[Any]], key: Key) -> ColumnElement[bool]:
    """Rows up to ``key`` (inclusive) in descending ``columns`` order: ``(c1, …) >= key``."""

    def tail(index: int) -> ColumnElement[bool]:
        column, value = columns[index], key[index]
        if index == len(columns) - 1:
            last: ColumnElement[bool] = column >= value
            return last
        return or_(column > value, and_(column == value, tail(index + 1)))

    bounded: ColumnElement[bool] = and_(columns[0] >= key[0], tail(0))
    return bounded


def _run_walk(
    tx: Tx, walk: _Walk, cursor: Key | None, residual: Any, page: int
) -> tuple[list[Any], Key | None]:
    """Up to ``page + 1`` matching rows in walk order, and the key of the walk's last examined
    entry when it used its whole window without finding ``page + 1`` (else ``None``).

    With residual terms the walk is first bounded: the key of its ``WINDOW``-th index entry is
    read from the index alone, then the rows up to it are filtered in walk order, stopping at
    ``page + 1`` matches.
    """
    where = [*walk.where] + ([_before(walk.key, cursor)] if cursor is not None else [])
    order = [column.desc() for column in walk.order]
    if residual is None:
        return list(tx.execute(select(*LISTED).where(*where).order_by(*order).limit(page + 1))), None
    last = tx.execute(select(*walk.key).where(*where).order_by(*order).offset(WINDOW - 1).limit(1)).first()
    end = None if last is None else tuple(last)
    bounded = [*where, *residual(_o.c)] + ([_not_after(walk.key, end)] if end is not None else [])
    rows = list(tx.execute(select(*LISTED).where(*bounded).order_by(*order).limit(page + 1)))
    return rows, (None if len(rows) > page else end)


def _row_key(row: Any, columns: Sequence[ColumnElement[Any]]) -> Key:
    return tuple(getattr(row, column.name) for column in columns)


def _merge(tx: Tx, walks: list[_Walk], cursor: Key | None, residual: Any, order: Order, page: int) -> RunPage:
    """The next page over several walks of the same key order (a k-way merge)."""
    found: list[Any] = []
    cut: Key | None = None
    key_columns = walks[0].key
    for walk in walks:
        rows, end = _run_walk(tx, walk, cursor, residual, page)
        found.extend(rows)
        if end is not None and (cut is None or end > cut):
            cut = end
    found.sort(key=lambda row: _row_key(row, key_columns), reverse=True)
    if cut is not None:
        found = [row for row in found if _row_key(row, key_columns) >= cut]
    shown = found[:page]
    if len(found) > page:
        next_key: Key | None = _row_key(shown[-1], key_columns)
    else:
        next_key = cut
    return RunPage(
        rows=_with_kinds(tx, shown),
        order=order,
        next_cursor=None if next_key is None else encode_cursor(order, next_key),
        searched_window=cut is not None,
    )


def _with_kinds(tx: Tx, rows: Sequence[Any]) -> list[RunRow]:
    job_ids = sorted({row.job_id for row in rows})
    kinds = (
        {
            row.job_id: row.kind
            for row in tx.execute(select(_j.c.job_id, _j.c.kind).where(_j.c.job_id.in_(job_ids)))
        }
        if job_ids
        else {}
    )
    return [
        RunRow(
            id=row.occurrence_id,
            job_id=row.job_id,
            kind=kinds.get(row.job_id, "?"),
            status=row.status,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            fence=row.fence,
            scheduled_for=row.scheduled_for,
            available_at=row.available_at,
            lease_expires_at=row.lease_expires_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            last_error=read_optional_json(row.last_error_json, "occurrence error"),
        )
        for row in rows
    ]


# --------------------------------------------------------------------------- the three orders


def _job_walks(runs: RunFilter, job_ids: list[str]) -> list[_Walk]:
    order = [_o.c.created_at, _o.c.occurrence_id]
    walks = []
    for job_id in job_ids:
        where: list[Any] = [_o.c.job_id == job_id]
        if runs.since is not None:
            where.append(_o.c.created_at >= runs.since)
        if runs.until is not None:
            where.append(_o.c.created_at < runs.until)
        walks.append(_Walk(where, order, order))
    return walks


def _status_walk(status: str) -> _Walk:
    c = _o.c
    order = [c.available_at, c.lease_expires_at, c.scheduled_for, c.occurrence_id]
    # Outside ``running`` the lease column is NULL in every row: ordered by (it keeps the
    # index order) but not part of the key.
    key = order if status == RUNNING else [c.available_at, c.scheduled_for, c.occurrence_id]
    return _Walk([c.status == status], order, key)


RECENT_CHUNK: Final = 200
"""Events the ``recent`` order reads first (each further read doubles, up to the window)."""


def _recent(tx: Tx, runs: RunFilter, cursor: str | None, kind_jobs: list[str] | None, page: int) -> RunPage:
    """Runs by their newest event among the event ids ``(top - WINDOW, top]``, newest first.

    Events are read newest first in growing chunks; each run is taken at its first (newest)
    event, filtered, and the read stops once the page is full. On a later page (events below the
    cursor) a run that also has an event between the cursor and ``top`` was listed or filtered
    out already, and is skipped.
    """
    decoded = decode_cursor(cursor, "recent", 1)
    top = decoded[1] if decoded is not None else None
    if top is None:
        top = int(tx.scalar(select(func.max(_e.c.event_id))) or 0)
    floor = top - WINDOW
    below = int(decoded[0][0]) if decoded is not None else top + 1
    terms = _residual(_o.c, runs, set(), kind_jobs)
    found: list[tuple[int, Any]] = []
    seen: set[str] = set()
    chunk = RECENT_CHUNK
    while len(found) <= page and below > floor + 1:
        events = tx.execute(
            select(_e.c.event_id, _e.c.occurrence_id)
            .where(_e.c.event_id < below, _e.c.event_id > floor, _e.c.occurrence_id.is_not(None))
            .order_by(_e.c.event_id.desc())
            .limit(chunk)
        ).all()
        if not events:
            break
        below, chunk = int(events[-1].event_id), min(chunk * 2, WINDOW)
        firsts: dict[str, int] = {}
        for event in events:
            if event.occurrence_id not in seen:
                seen.add(event.occurrence_id)
                firsts[event.occurrence_id] = int(event.event_id)
        if decoded is not None and firsts:  # listed (or filtered out) on an earlier page
            newer = select(_e.c.occurrence_id).where(
                _e.c.occurrence_id.in_(list(firsts)),
                _e.c.event_id >= int(decoded[0][0]),
                _e.c.event_id <= top,
            )
            for row in tx.execute(newer):
                firsts.pop(row.occurrence_id, None)
        if not firsts:
            continue
        rows = {
            row.occurrence_id: row
            for row in tx.execute(select(*LISTED).where(_o.c.occurrence_id.in_(list(firsts)), *terms))
        }
        found.extend((event_id, rows[key]) for key, event_id in firsts.items() if key in rows)
    shown = found[:page]
    next_cursor = encode_cursor("recent", (shown[-1][0],), top) if len(found) > page else None
    return RunPage(_with_kinds(tx, [row for _, row in shown]), "recent", next_cursor, searched_window=True)


def _kind_jobs(tx: Tx, kind: str) -> list[str] | None:
    """The jobs of a queue, or ``None`` when it has more than :data:`MAX_JOBS`."""
    found = [
        row.job_id for row in tx.execute(select(_j.c.job_id).where(_j.c.kind == kind).limit(MAX_JOBS + 1))
    ]
    return None if len(found) > MAX_JOBS else sorted(found)


def list_runs_in(tx: Tx, runs: RunFilter, cursor: str | None = None, page: int = PAGE) -> RunPage:
    """One page of runs matching ``runs`` after ``cursor`` (an opaque string from a previous page)."""
    kind_jobs = _kind_jobs(tx, runs.kind) if runs.kind is not None else None
    job_ids: list[str] | None = None
    if runs.job_id is not None:
        job_ids = [runs.job_id] if kind_jobs is None or runs.job_id in kind_jobs else []
    elif kind_jobs is not None:
        job_ids = kind_jobs
    # A status with one job: the job's walk, unless the status is small. A status with a queue of
    # several jobs: one status walk (the job walks would each search a window).
    use_status = runs.status is not None and (
        job_ids is None or len(job_ids) > 1 or not status_count(tx, runs.status).at_least
    )
    if use_status:
        assert runs.status is not None
        walk = _status_walk(runs.status)
        decoded = decode_cursor(cursor, "status", len(walk.key))
        served = {"status"}
        residual = _residual_or_none(runs, served, kind_jobs)
        return _merge(tx, [walk], decoded[0] if decoded else None, residual, "status", page)
    if job_ids is not None:
        if not job_ids:
            return RunPage([], "job", None, searched_window=False)
        walks = _job_walks(runs, job_ids)
        decoded = decode_cursor(cursor, "job", 2)
        residual = _residual_or_none(runs, {"job", "time"}, kind_jobs)
        return _merge(tx, walks, decoded[0] if decoded else None, residual, "job", page)
    return _recent(tx, runs, cursor, kind_jobs, page)


def _residual_or_none(runs: RunFilter, served: set[str], kind_jobs: list[str] | None) -> Any:
    """A function of the walk's columns giving its residual terms, or ``None`` if there are none."""
    if not _residual(_o.c, runs, served, kind_jobs):
        return None
    return lambda columns: _residual(columns, runs, served, kind_jobs)


__all__ = ["PAGE", "RunFilter", "RunPage", "RunRow", "list_runs_in"]
