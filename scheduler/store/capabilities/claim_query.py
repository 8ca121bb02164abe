"""Claim candidate statements served by the existing indexes (seed: claimNext's candidate SELECT).

The seed orders all eligible rows by ``CASE WHEN running THEN lease_expires_at ELSE
available_at END, scheduled_for, occurrence_id``, which no index can serve. Here the candidates
come from bounded probes of the index ``scheduler_occurrences_claim(status, available_at,
lease_expires_at, scheduled_for, occurrence_id)``, and :mod:`scheduler.store.capabilities.claim_plan` merges
them by the seed's key in Python, so the chosen occurrence is exactly the seed's:

* ``queued`` and ``retry_wait`` (the *due arms*): the claimable rows among the first
  :data:`WINDOW` + ``limit`` - 1 due entries of the status (the *window*: an ordered walk of the
  index that reads exactly that many entries, however many share one ``available_at``), and a
  marker row per status with the key (``available_at``, ``scheduled_for``, ``occurrence_id``)
  of the window's last entry when the window was full. ``claim_plan`` keeps the first ``limit``.
* If a due arm came back short while its window was full, the entries it passed over belonged to
  jobs the claim may not take (disabled, another kind or workspace) or were otherwise
  ineligible, and the rest of that status lies after the marker's key. ``claim_plan`` then reads
  on in rounds, each bounded: when the jobs the claim may take hold few occurrences (at most
  :data:`JOB_PROBE_BUDGET` in the first round, counted by :func:`eligible_job_rows_statement`),
  their due rows after the key are read through them (:func:`eligible_jobs_statement`, the
  ``scheduler_occurrences_job`` index); otherwise the next page of the status's entries
  (:data:`WALK_PAGE` in the first round, :func:`walk_statement`), continuing after the page's
  last key. Each round multiplies both bounds by :data:`GROWTH`, so the reads cost at most a few
  times the smaller of the two (the ineligible entries ahead, the eligible jobs' occurrences):
  100k due rows of a disabled job ahead of a small job's work cost one bounded read.
* ``running`` with ``lease_expires_at <= now`` (the *expired arm*): on SQLite no index orders
  running rows by lease expiry, so reading every expired lease would cost a scan of all of them.
  The arm reads at most :data:`EXPIRED_PROBE` (+ the batch limit) expired leases the call can act
  on (claim or sweep), in index order (``dialect.expiry_order``); up to that many, the result is
  exactly the seed's. Beyond it, on SQLite the oldest-available of them are reclaimed or swept
  first and the rest on later calls; on PostgreSQL, whose ``scheduler_pg_occurrences_expired``
  orders them by lease expiry, the earliest-expired (ties of one millisecond by ``occurrence_id``,
  where the seed puts ``scheduled_for`` first). The
  sweep still dead-letters at most 100 per claim, as the seed's.

Every statement is dialect-free Core; what a claim may take and what each row carries (candidate
and marker rows) are in :mod:`scheduler.store.capabilities.claim_eligibility`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import (
    CompoundSelect,
    Integer,
    Select,
    and_,
    bindparam,
    func,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    type_coerce,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.sqltypes import NullType

from scheduler.contract.constants import RUNNING
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_eligibility import (
    ARM_EXPIRED,
    ARM_TARGET,
    DUE_ARMS,
    KEY_COLUMNS,
    KIND_ANY,
    PENDING_ADJUDICATION,
    SHAPES,
    SWEEPABLE,
    WINDOW_MARKERS,
    WITH_CONTROL,
    ClaimFilter,
    Shape,
    attempts_allow,
    candidate_columns,
    claimable_rows,
    eligible_job_ids,
    expired_actionable,
    job_filter,
    marker_row,
    o,
    rows_with_control,
    waiting_control_ok,
)
from scheduler.store.plumbing.constructs import expiry_order
from scheduler.store.plumbing.statement_plans import Prepared, per_backend

if TYPE_CHECKING:
    from scheduler.backends.interface import Backend

SWEEP_LIMIT: Final = 100
# The bounds are read when a claim runs (tests shrink them to exercise every path on small states).
WINDOW = 32
"""Due index entries per status the first probe reads beyond the ``limit`` it wants, less one."""
HEAD_WINDOW: Final = 8
"""Due entries per waiting status a single claim reads once other workers held its first
candidates (``claim_plan.window_plan``): the rows they hold and the next free ones, read with the
heads' cost instead of the full candidate statement's."""
JOB_PROBE_BUDGET = 4096
"""Occurrences (any status) of the eligible jobs the first beyond-the-window round may read."""
WALK_PAGE = 256
"""Due index entries the first page of a walk beyond the window reads."""
GROWTH: Final = 4
"""How much each round beyond the window raises both bounds (``claim_plan.due_rows_beyond_window``)."""
EXPIRED_PROBE = SWEEP_LIMIT
"""Expired leases one claim reads, plus its batch limit: room for one full sweep and the claims."""

_w = t.occurrences.alias("w")
_m = t.occurrences.alias("m")

# ------------------------------------------------------------------------------------ arms


_ONE: Final[ColumnElement[int]] = literal_column("1")
"""``LIMIT 1`` written into the SQL (a plain ``.limit(1)`` is sent as a parameter)."""


def _count(name: str) -> Any:
    """A ``LIMIT``/``OFFSET`` value, rendered into the SQL when the statement runs (one statement
    text per value, prepared and cached like any other). PostgreSQL's generic plan of a statement
    whose limit is a parameter assumes it reads a tenth of the rows: on an analyzed queue its
    estimate was 200 × the custom plans' (132,001 against 639 at 200k queued), so the server
    planned the ~10 KB claim statement again on every claim, and JIT-compiled the generic plan
    whenever it did run it. With the limits known, the generic plan costs what a custom one does
    and is reused (``tests/backends/postgresql/test_postgresql_stale_stats.py``)."""
    return bindparam(name, type_=Integer(), literal_execute=True)


def _claim_order(alias: Any) -> list[Any]:
    return [alias.c.available_at, alias.c.lease_expires_at, alias.c.scheduled_for, alias.c.occurrence_id]


AFTER: Final = ("after_available_at", "after_scheduled_for", "after_occurrence_id")
"""The bind parameters of the key a walk continues after (``claim_plan.WalkKey``)."""
PAST_TIES: Final = 2**53
"""A ``scheduled_for`` above every stored one (epoch ms are safe integers): the key
``(available_at, PAST_TIES, "")`` lies after every entry at ``available_at``."""


def _after(alias: Any) -> ColumnElement[bool]:
    """The row's key lies after the bound key (a filter, for a bounded set of rows)."""
    available_at, scheduled_for, occurrence_id = (bindparam(name, type_=NullType()) for name in AFTER)
    return or_(
        alias.c.available_at > available_at,
        and_(
            alias.c.available_at == available_at,
            tuple_(alias.c.scheduled_for, alias.c.occurrence_id) > tuple_(scheduled_for, occurrence_id),
        ),
    )


_TIES: Final = and_(
    _w.c.available_at == bindparam(AFTER[0]),
    _w.c.lease_expires_at.is_(None),
    tuple_(_w.c.scheduled_for, _w.c.occurrence_id) > tuple_(bindparam(AFTER[1]), bindparam(AFTER[2])),
)
"""The entries tied with the bound key's ``available_at`` after it: a range of the claim index
(``status``, ``available_at`` and the NULL ``lease_expires_at`` fixed, then a row-value bound)."""
_LATER: Final = _w.c.available_at > bindparam(AFTER[0])
"""The entries after every one at the bound key's ``available_at``."""


def _due_from(status: str, start: ColumnElement[bool] | None) -> list[ColumnElement[bool]]:
    """The due index entries of ``status`` from ``start`` (``None``: the first), as an index range."""
    where = [_w.c.status == literal_column(f"'{status}'")]
    if start is None or start is _LATER:
        where.append(_w.c.available_at <= bindparam("now"))
    if start is not None:  # at the key's available_at (due, as the key's entry is) or after it
        where.append(start)
    return where


def _entries(status: str, start: ColumnElement[bool] | None, size: str, name: str) -> Any:
    """The first ``:<size>`` due index entries of ``status`` (eligible or not) from ``start``, in
    the index's order: an ordered walk of ``scheduler_occurrences_claim`` that reads no row. It
    has every column of the index's order, so a query ordered by them is ordered by the walk."""
    return (
        select(*_claim_order(_w))
        .where(*_due_from(status, start))
        .order_by(*_claim_order(_w))
        .limit(_count(size))
        .subquery(name)
    )


def _last_entry(status: str, start: ColumnElement[bool] | None, size: str) -> Select[Any]:
    """The key of the ``:<size>``-th due entry of ``status`` from ``start`` (no row when fewer;
    its offset is the parameter ``:<size>_last``)."""
    return (
        select(*[_w.c[column] for column in KEY_COLUMNS])
        .where(*_due_from(status, start))
        .order_by(*_claim_order(_w))
        .limit(_ONE)
        .offset(_count(f"{size}_last"))
    )


def _expired(jobs: ColumnElement[bool], actionable: ColumnElement[bool]) -> Select[Any]:
    """Up to ``:expired_limit`` expired leases the call can act on, in index order
    (:class:`~scheduler.store.plumbing.constructs.expiry_order`: lease expiry on PostgreSQL, the claim
    index's order on SQLite)."""
    return (
        select(*candidate_columns(ARM_EXPIRED, jobs, PENDING_ADJUDICATION))
        .select_from(WITH_CONTROL)
        .where(
            o.c.status == literal_column(f"'{RUNNING}'"), o.c.lease_expires_at <= bindparam("now"), actionable
        )
        .order_by(expiry_order(o))
        .limit(_count("expired_limit"))
    )


def _build_claim_next(shape: Shape) -> CompoundSelect[Any]:
    """The window: per waiting status the claimable rows among its first ``:window_size`` due
    entries and a marker with the last entry's key when it has that many; the expired arm."""
    jobs = job_filter(shape)
    arms: list[Any] = []
    for arm, status in DUE_ARMS.items():
        window = _entries(status, None, "window_size", f"window_{status}")
        arms.append(select(claimable_rows(window, arm, jobs).subquery(f"due_{status}")))
    expired = _expired(jobs, expired_actionable(jobs))
    markers = [
        marker_row(marker, _last_entry(DUE_ARMS[arm], None, "window_size"))
        for marker, arm in WINDOW_MARKERS.items()
    ]
    return union_all(*arms, select(expired.subquery("expired")), *markers)


def _due_head(arm: str, jobs: ColumnElement[Any], heads: int) -> Select[Any]:
    """The first ``heads`` due index entries of a waiting status, eligible or not (their checks
    as columns).

    More than one is found in ``occurrences`` alone first, then joined to their rows, control,
    requeue and job rows: with the limit and the joins in one query, a planner that estimates no
    more due rows than the limit (a table not analyzed since it grew) joins every due row and
    sorts them, a read as deep as the queue on every claim.
    """
    due = (o.c.status == literal_column(f"'{DUE_ARMS[arm]}'"), o.c.available_at <= bindparam("now"))
    if heads == 1:
        return (
            select(*candidate_columns(arm, jobs, null()))
            .select_from(WITH_CONTROL)
            .where(*due)
            .order_by(*_claim_order(o))
            .limit(_ONE)
        )
    first = (
        select(o.c.occurrence_id)
        .where(*due)
        .order_by(*_claim_order(o))
        .limit(literal_column(str(heads)))
        .subquery(f"first_{DUE_ARMS[arm]}")
    )
    return select(*candidate_columns(arm, jobs, null())).select_from(rows_with_control(first))


def _build_head_probe(shape: Shape, heads: int = 1) -> CompoundSelect[Any]:
    jobs = job_filter(shape)
    untyped = type_coerce(jobs, NullType())  # job_ok as the driver returns it (as in _build_claim_next)
    arms: list[Any] = [
        select(_due_head(arm, untyped, heads).subquery(f"head_{status}")) for arm, status in DUE_ARMS.items()
    ]
    expired = _expired(jobs, expired_actionable(jobs))
    return union_all(*arms, select(expired.subquery("expired")))


def _target_arm() -> Select[Any]:
    return (
        select(*candidate_columns(ARM_TARGET, job_filter((KIND_ANY, False)), null()))
        .select_from(WITH_CONTROL)
        .where(o.c.occurrence_id == bindparam("occurrence_id"))
    )


_CLAIM_NEXT: Final = {shape: _build_claim_next(shape) for shape in SHAPES}
# The claim reads see only rows claimable or sweepable at ``now`` (and the rows they lock), so
# they may run before the writes a call keeps for later (``Tx.write_later``).
_CLAIM_NEXT_PREPARED: Final = {
    shape: Prepared(statement, passes_kept_writes=True) for shape, statement in _CLAIM_NEXT.items()
}
_HEAD_PROBE_PREPARED: Final = {
    shape: Prepared(_build_head_probe(shape), passes_kept_writes=True) for shape in SHAPES
}
_HEAD_WINDOW_PREPARED: Final = {
    shape: Prepared(_build_head_probe(shape, HEAD_WINDOW), passes_kept_writes=True) for shape in SHAPES
}
CLAIM_OCCURRENCE: Final = union_all(
    select(_expired(job_filter((KIND_ANY, False)), SWEEPABLE).subquery("expired")), _target_arm()
)
CLAIM_OCCURRENCE_PREPARED: Final = Prepared(CLAIM_OCCURRENCE)
LOCKED_ROWS: Final = Prepared(
    select(*candidate_columns(ARM_EXPIRED, job_filter((KIND_ANY, False)), PENDING_ADJUDICATION))
    .select_from(WITH_CONTROL)
    .where(o.c.occurrence_id.in_(bindparam("p_ids", expanding=True))),
    passes_kept_writes=True,
)
"""Occurrences as they are now, with what a claim or the sweep needs (``:p_ids``): read again
after a concurrent-writer backend locked them (:mod:`scheduler.backends.postgresql.claim_locks`)."""


def claim_next_statement(claim_filter: ClaimFilter) -> CompoundSelect[Any]:
    """The candidate statement for the given filter (params: :func:`claim_next_params`)."""
    return _CLAIM_NEXT[claim_filter.shape]


def claim_next_prepared(claim_filter: ClaimFilter) -> Prepared:
    """``claim_next_statement`` for execution through ``Tx`` (the compile-once fast path)."""
    return _CLAIM_NEXT_PREPARED[claim_filter.shape]


def claim_next_params(now: int, limit: int, claim_filter: ClaimFilter) -> dict[str, Any]:
    params = claim_filter.params()
    params["now"] = now
    params["expired_limit"] = EXPIRED_PROBE + limit
    params.update(_size("window_size", WINDOW + limit - 1))
    return params


def _size(name: str, entries: int) -> dict[str, int]:
    """A walk of ``entries`` index entries: ``:<name>`` and the offset of its last, ``:<name>_last``."""
    return {name: entries, f"{name}_last": entries - 1}


def head_probe_prepared(claim_filter: ClaimFilter) -> Prepared:
    """The cheap first read of a single claim: the first due entry of each waiting status
    (eligible or not, with the checks as columns) and at most one expired lease the call could
    act on (params: :func:`head_probe_params`). When no such lease exists and the earlier of the
    two heads is claimable, that head is what the full statement would choose."""
    return _HEAD_PROBE_PREPARED[claim_filter.shape]


def head_window_prepared(claim_filter: ClaimFilter) -> Prepared:
    """:func:`head_probe_prepared` reading the first :data:`HEAD_WINDOW` due entries of each
    waiting status: the candidates of a claim among workers that hold the first ones
    (``claim_plan.window_plan``; params: :func:`head_probe_params`)."""
    return _HEAD_WINDOW_PREPARED[claim_filter.shape]


def head_probe_params(now: int, claim_filter: ClaimFilter) -> dict[str, Any]:
    params = claim_filter.params()
    params["now"] = now
    params["expired_limit"] = 1
    return params


def claim_occurrence_params(now: int, occurrence_id: str) -> dict[str, Any]:
    return {"now": now, "occurrence_id": occurrence_id, "expired_limit": EXPIRED_PROBE}


# ------------------------------------------------------------------------------------ beyond the window


def beyond_window_params(now: int, after: tuple[int, int, str], claim_filter: ClaimFilter) -> dict[str, Any]:
    """The parameters every beyond-the-window statement takes (each adds its sizes)."""
    params = claim_filter.params()
    params["now"] = now
    params.update(zip(AFTER, after, strict=True))
    return params


def page_params(entries: int, wanted: int) -> dict[str, int]:
    """A walk page of ``entries`` index entries returning at most ``wanted`` rows."""
    return {**_size("page", entries), "wanted": wanted}


def eligible_job_rows_statement(backend: Backend, shape: Shape) -> Prepared:
    """How many occurrences (any status) the eligible jobs hold, counted up to ``:budget``."""

    def build() -> Prepared:
        jobs = eligible_job_ids(shape)
        rows = backend.rows_of_jobs(_m, jobs, ("occurrence_id",), _count("budget")).subquery("budget")
        return Prepared(select(func.count()).select_from(rows))

    return per_backend(("count", backend.name, *map(str, shape)), build)


def eligible_jobs_statement(backend: Backend, arm: str, shape: Shape) -> Prepared:
    """The ids of the first ``:wanted`` due rows of a waiting status after the bound key among the
    eligible jobs' occurrences (at most ``:budget``, all of them: ``eligible_job_rows_statement``
    counted fewer), in the seed's order; :func:`rows_statement` reads their columns.

    The eligible jobs' rows come from ``scheduler_occurrences_job`` and are ranked by their own
    key columns: a sort of at most ``:budget`` short rows, in a statement of its own (a plan
    that must sort is costed as if sorts were disabled on PostgreSQL's store connection, which
    would leave every other choice in the same statement to chance).
    """

    def build() -> Prepared:
        columns = ("occurrence_id", "status", "available_at", "scheduled_for")
        job_rows = backend.rows_of_jobs(_m, eligible_job_ids(shape), columns, _count("budget"))
        members = job_rows.subquery("members")
        return Prepared(
            select(members.c.occurrence_id)
            .where(
                members.c.status == literal_column(f"'{DUE_ARMS[arm]}'"),
                members.c.available_at <= bindparam("now"),
                _after(members),
            )
            .order_by(members.c.available_at, members.c.scheduled_for, members.c.occurrence_id)
            .limit(_count("wanted"))
        )

    return per_backend(("members", backend.name, arm, *map(str, shape)), build)


@functools.cache
def rows_statement(arm: str) -> Prepared:
    """The occurrences ``:p_ids`` as a due arm's rows (every column; ``job_ok`` true: the caller
    read them through the eligible jobs), in no particular order."""
    return Prepared(
        select(*candidate_columns(arm, literal_column("TRUE"), null()))
        .select_from(WITH_CONTROL)
        .where(o.c.occurrence_id.in_(bindparam("p_ids", expanding=True)))
    )


@functools.cache
def walk_statement(arm: str, shape: Shape, ties: bool) -> Prepared:
    """One page of a waiting status's walk after the bound key: the first ``:wanted`` claimable
    rows among the next ``:page`` due entries (``ties``: those at the key's ``available_at``;
    else the later ones), and a marker row with the key of the page's last entry when it was full.

    The page's claimable entries are ranked by the page's own columns, in the walk's order (no
    plan can produce that order by walking the claim index from its start, and none needs a
    sort), and only the first ``:wanted`` of them are joined to their columns. Within the ties
    the order leaves out ``available_at``: PostgreSQL knows it is constant there and orders the
    walk by the other columns only, and a ranking it did not recognise as that order would need
    a sort, costed as if sorts were disabled (``PLANNER_SQL``) and so leaving every other choice
    in the statement to chance.
    """
    status = DUE_ARMS[arm]
    start = _TIES if ties else _LATER
    page = _entries(status, start, "page", "page")
    hit_o, hit_c = t.occurrences.alias("hit_o"), t.occurrence_controls.alias("hit_c")
    filters = [job_filter(shape, hit_o), attempts_allow(hit_o, hit_c), waiting_control_ok(hit_c)]
    hits = (
        select(page.c.occurrence_id)
        .select_from(rows_with_control(page, hit_o, hit_c))
        .where(*filters)
        .order_by(*_claim_order(page)[1 if ties else 0 :])
        .limit(_count("wanted"))
        .subquery("hits")
    )
    rows = select(*candidate_columns(arm, literal_column("TRUE"), null())).select_from(
        rows_with_control(hits)
    )
    marker = next(name for name, marked in WINDOW_MARKERS.items() if marked == arm)
    return Prepared(union_all(rows, marker_row(marker, _last_entry(status, start, "page"))))
