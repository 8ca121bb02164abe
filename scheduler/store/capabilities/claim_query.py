"""Claim candidate statements served by the existing indexes (seed: claimNext's candidate SELECT).

The seed orders all eligible rows by ``CASE WHEN running THEN lease_expires_at ELSE
available_at END, scheduled_for, occurrence_id``, which no index can serve. Here the candidates
come from bounded probes of the index ``scheduler_occurrences_claim(status, available_at,
lease_expires_at, scheduled_for, occurrence_id)``, and :mod:`scheduler.store.capabilities.claim_plan` merges
them by the seed's key in Python, so the chosen occurrence is exactly the seed's:

* ``queued`` and ``retry_wait`` (the *due arms*): an ordered walk of the index that stops at the
  first ``:arm_limit`` rows passing the job/attempt/control filters, but never walks past the
  first :data:`WINDOW` + ``arm_limit`` - 1 due entries of its status. A marker row per status reports the
  ``available_at`` of the window's last entry (``NULL`` when fewer are due).
* If a due arm came back short while its window was full, the rows it skipped belonged to jobs
  the claim may not take (disabled, another kind or workspace) or were otherwise ineligible.
  :func:`beyond_window_statement` then reads the rest of that status *through the jobs the
  claim may take* (the ``scheduler_occurrences_job`` index, at most :data:`JOB_PROBE_BUDGET`
  rows), so 100k due rows of a disabled job or of another kind cost one bounded probe instead
  of a walk over all of them. Only when the eligible jobs themselves hold more rows than that
  does the walk continue past the window (:func:`continued_walk_statement`).
* ``running`` with ``lease_expires_at <= now`` (the *expired arm*): on SQLite no index orders
  running rows by lease expiry, so reading every expired lease would cost a scan of all of them.
  The arm reads at most :data:`EXPIRED_PROBE` (+ the batch limit) expired leases the call can act
  on (claim or sweep), in index order (``dialect.expiry_order``); up to that many, the result is
  exactly the seed's. Beyond it, on SQLite the oldest-available of them are reclaimed or swept
  first and the rest on later calls; on PostgreSQL, whose ``scheduler_pg_occurrences_expired``
  orders them by lease expiry, the earliest-expired (ties of one millisecond by ``occurrence_id``,
  where the seed puts ``scheduled_for`` first). The
  sweep still dead-letters at most 100 per claim, as the seed's.

Every statement is dialect-free Core; each candidate row carries what the claim needs, so a
backend that must lock a candidate before claiming it can try the candidates one by one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    CompoundSelect,
    Integer,
    Select,
    and_,
    bindparam,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.sqltypes import NullType

from scheduler.contract.constants import QUEUED, RETRY_WAIT, RUNNING
from scheduler.schema import tables as t
from scheduler.store.plumbing.constructs import correlated_exists, expiry_order, json_text_field
from scheduler.store.plumbing.statement_plans import Prepared

SWEEP_LIMIT: Final = 100
# The three bounds are bound parameters read when a claim runs (tests shrink them to exercise
# every path on small states).
WINDOW = 32
"""Due index entries per status the first probe may walk beyond the ``limit`` it wants."""
HEAD_WINDOW: Final = 8
"""Due entries per waiting status a single claim reads once other workers held its first
candidates (``claim_plan.window_plan``): the rows they hold and the next free ones, read with the
heads' cost instead of the full candidate statement's."""
JOB_PROBE_BUDGET = 4096
"""Occurrences (any status) of the eligible jobs the beyond-the-window probe may read."""
EXPIRED_PROBE = SWEEP_LIMIT
"""Expired leases one claim reads, plus its batch limit: room for one full sweep and the claims."""

PAUSE_REQUESTED: Final = "pause_requested"
PAUSED: Final = "paused"
RESUMED: Final = "resumed"
ATTEMPT_NEUTRAL_CONTROLS: Final = (PAUSE_REQUESTED, RESUMED)

ARM_QUEUED: Final = "q"
ARM_RETRY_WAIT: Final = "r"
ARM_EXPIRED: Final = "e"
ARM_TARGET: Final = "t"
DUE_ARMS: Final = {ARM_QUEUED: QUEUED, ARM_RETRY_WAIT: RETRY_WAIT}
WINDOW_MARKERS: Final = {"qw": ARM_QUEUED, "rw": ARM_RETRY_WAIT}

o = t.occurrences.alias("o")
_c = t.occurrence_controls.alias("c")
_j = t.jobs.alias("j")
_a = t.adjudications.alias("a")
_r = t.occurrence_retries.alias("r")
_r_first = t.occurrence_retries.alias("r_first")
_r_any = t.occurrence_retries.alias("r_any")
_w = t.occurrences.alias("w")
_m = t.occurrences.alias("m")


def _pending_retry(alias: Any) -> ColumnElement[bool]:
    """An unclaimed requeue request at the occurrence's current fence."""
    return and_(
        alias.c.occurrence_id == o.c.occurrence_id,
        alias.c.claimed_at.is_(None),
        alias.c.expected_fence == o.c.fence,
    )


# The request a claim consumes: the first by (created_at, request_id), like the seed's
# claimOccurrence, computed with two aggregates so no ORDER BY needs a temporary b-tree.
_FIRST_RETRY_AT = (
    select(func.min(_r_first.c.created_at))
    .where(_pending_retry(_r_first))
    .correlate_except(_r_first)
    .scalar_subquery()
)
RETRY_REQUEST_ID: Final = (
    select(func.min(_r.c.request_id))
    .where(_pending_retry(_r), _r.c.created_at == _FIRST_RETRY_AT)
    .correlate_except(_r)
    .scalar_subquery()
)
HAS_PENDING_RETRY: Final = exists().where(_pending_retry(_r_any))
PENDING_ADJUDICATION: Final = (
    select(_a.c.request_id)
    .where(_a.c.occurrence_id == o.c.occurrence_id, _a.c.status == literal_column("'pending'"))
    .scalar_subquery()
)
_WITH_CONTROL = o.outerjoin(_c, _c.c.occurrence_id == o.c.occurrence_id)
_STATE = _c.c.state
_ATTEMPTS_ALLOW = or_(
    o.c.attempt < o.c.max_attempts, _STATE == PAUSE_REQUESTED, _STATE == RESUMED, HAS_PENDING_RETRY
)
_NOT_PAUSED = or_(_STATE.is_(None), _STATE != PAUSED)
_WAITING_CONTROL_OK = or_(_STATE.is_(None), and_(_STATE != PAUSED, _STATE != PAUSE_REQUESTED))
_SWEEPABLE = and_(
    o.c.attempt >= o.c.max_attempts,
    or_(_STATE.is_(None), and_(_STATE != PAUSE_REQUESTED, _STATE != RESUMED)),
)

# ------------------------------------------------------------------------------------ filters

KIND_ANY: Final = 0
KIND_ONE: Final = 1
KIND_SEVERAL: Final = 2
Shape = tuple[int, bool]


@dataclass(frozen=True, slots=True)
class ClaimFilter:
    """Which jobs' occurrences a claim may take: any of ``kinds`` (``None``: all) in ``workspace_id``."""

    kinds: tuple[str, ...] | None = None
    workspace_id: str | None = None

    @property
    def shape(self) -> Shape:
        """What the statement must test: (KIND_ANY / KIND_ONE / KIND_SEVERAL, a workspace given)."""
        kinds = self.kinds
        mode = KIND_ANY if kinds is None else KIND_ONE if len(kinds) == 1 else KIND_SEVERAL
        return mode, self.workspace_id is not None

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.kinds is not None:
            if len(self.kinds) == 1:
                params["job_kind"] = self.kinds[0]
            else:
                params["job_kinds"] = list(self.kinds)
        if self.workspace_id is not None:
            params["workspace_id"] = self.workspace_id
        return params


NO_FILTER: Final = ClaimFilter()


def _job_conditions(jobs: Any, shape: Shape) -> list[ColumnElement[bool]]:
    """An enabled job, optionally of ``:job_kind``/``:job_kinds``, in ``:workspace_id``."""
    kind_mode, workspace_id = shape
    conditions: list[ColumnElement[bool]] = [jobs.c.enabled == literal_column("1")]
    if kind_mode == KIND_ONE:
        conditions.append(jobs.c.kind == bindparam("job_kind"))
    elif kind_mode == KIND_SEVERAL:
        conditions.append(jobs.c.kind.in_(bindparam("job_kinds", expanding=True)))
    if workspace_id:
        conditions.append(json_text_field(jobs.c.authority_json, "workspaceId") == bindparam("workspace_id"))
    return conditions


def job_filter(shape: Shape) -> ColumnElement[bool]:
    """EXISTS an eligible job (:func:`_job_conditions`) for the row ``o`` (tested row by row)."""
    return correlated_exists().where(_j.c.job_id == o.c.job_id, *_job_conditions(_j, shape))


# ------------------------------------------------------------------------------------ arms


_ONE: Final[ColumnElement[int]] = literal_column("1")
"""``LIMIT 1`` written into the SQL (a plain ``.limit(1)`` is sent as a parameter)."""


def _columns(arm: str, job_ok: ColumnElement[Any], adjudication: ColumnElement[Any]) -> list[Any]:
    return [
        literal_column(f"'{arm}'").label("arm"),
        *o.c,
        _c.c.state.label("control_state"),
        _c.c.expected_fence.label("control_expected_fence"),
        RETRY_REQUEST_ID.label("retry_request_id"),
        job_ok.label("job_ok"),
        adjudication.label("adjudication_request_id"),
    ]


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


def _window_end(status: str) -> Any:
    """``available_at`` of the last of the first :data:`WINDOW` due entries of ``status`` (or NULL)."""
    return (
        select(_w.c.available_at)
        .where(_w.c.status == literal_column(f"'{status}'"), _w.c.available_at <= bindparam("now"))
        .order_by(*_claim_order(_w))
        .limit(_ONE)
        .offset(_count("window_last"))
        .scalar_subquery()
    )


def _due(arm: str, *where: Any, source: Any = _WITH_CONTROL, status_term: bool = True) -> Select[Any]:
    """The first ``:arm_limit`` claimable rows of one waiting status matching ``where``."""
    status = [o.c.status == literal_column(f"'{DUE_ARMS[arm]}'")] if status_term else []
    return (
        select(*_columns(arm, literal_column("TRUE"), null()))
        .select_from(source)
        .where(*status, *where, _ATTEMPTS_ALLOW, _WAITING_CONTROL_OK)
        .order_by(*_claim_order(o))
        .limit(_count("arm_limit"))
    )


def _window_marker(marker: str) -> Select[Any]:
    """One row: ``arm`` = the marker, ``available_at`` = the window's end, every other column NULL."""
    end = _window_end(DUE_ARMS[WINDOW_MARKERS[marker]])
    occurrence = [end.label(column.name) if column.name == "available_at" else null() for column in o.c]
    return select(literal_column(f"'{marker}'").label("arm"), *occurrence, *[null()] * 5)


def _expired(jobs: ColumnElement[bool], actionable: ColumnElement[bool]) -> Select[Any]:
    """Up to ``:expired_limit`` expired leases the call can act on, in index order
    (:class:`~scheduler.store.plumbing.constructs.expiry_order`: lease expiry on PostgreSQL, the claim
    index's order on SQLite)."""
    return (
        select(*_columns(ARM_EXPIRED, jobs, PENDING_ADJUDICATION))
        .select_from(_WITH_CONTROL)
        .where(
            o.c.status == literal_column(f"'{RUNNING}'"), o.c.lease_expires_at <= bindparam("now"), actionable
        )
        .order_by(expiry_order(o))
        .limit(_count("expired_limit"))
    )


def _build_claim_next(shape: Shape) -> CompoundSelect[Any]:
    jobs = job_filter(shape)
    arms: list[Any] = []
    for arm, status in DUE_ARMS.items():
        window = o.c.available_at <= func.coalesce(_window_end(status), bindparam("now"))
        arms.append(select(_due(arm, window, jobs).subquery(f"due_{status}")))
    expired = _expired(jobs, or_(_SWEEPABLE, and_(jobs, _ATTEMPTS_ALLOW, _NOT_PAUSED)))
    return union_all(*arms, select(expired.subquery("expired")), *map(_window_marker, WINDOW_MARKERS))


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
            select(*_columns(arm, jobs, null()))
            .select_from(_WITH_CONTROL)
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
    return select(*_columns(arm, jobs, null())).select_from(
        first.join(o, o.c.occurrence_id == first.c.occurrence_id).outerjoin(
            _c, _c.c.occurrence_id == o.c.occurrence_id
        )
    )


def _build_head_probe(shape: Shape, heads: int = 1) -> CompoundSelect[Any]:
    jobs = job_filter(shape)
    untyped = type_coerce(jobs, NullType())  # job_ok as the driver returns it (as in _build_claim_next)
    arms: list[Any] = [
        select(_due_head(arm, untyped, heads).subquery(f"head_{status}")) for arm, status in DUE_ARMS.items()
    ]
    expired = _expired(jobs, or_(_SWEEPABLE, and_(jobs, _ATTEMPTS_ALLOW, _NOT_PAUSED)))
    return union_all(*arms, select(expired.subquery("expired")))


def _plain_claim_guard() -> ColumnElement[bool]:
    occurrences, controls, retries = t.occurrences, t.occurrence_controls, t.occurrence_retries
    return and_(
        ~exists().where(controls.c.occurrence_id == occurrences.c.occurrence_id),
        ~exists().where(
            retries.c.occurrence_id == occurrences.c.occurrence_id,
            retries.c.claimed_at.is_(None),
            retries.c.expected_fence == occurrences.c.fence,
        ),
        exists().where(t.jobs.c.job_id == occurrences.c.job_id, *_job_conditions(t.jobs, (KIND_ANY, False))),
    )


PLAIN_CLAIM_GUARD: Final = _plain_claim_guard()
"""For an ``UPDATE`` of ``occurrences``: the row still has no runtime control and no requeue
request at its fence, and its job is enabled, as when it was probed (``head_plain`` of
``queries.sql``'s ``claim_head``); a claim
decided on a probed row without reading it again after the lock writes only if this holds."""


def _target_arm() -> Select[Any]:
    return (
        select(*_columns(ARM_TARGET, job_filter((KIND_ANY, False)), null()))
        .select_from(_WITH_CONTROL)
        .where(o.c.occurrence_id == bindparam("occurrence_id"))
    )


_SHAPES: Final = [
    (mode, workspace) for mode in (KIND_ANY, KIND_ONE, KIND_SEVERAL) for workspace in (False, True)
]
_CLAIM_NEXT: Final = {shape: _build_claim_next(shape) for shape in _SHAPES}
# The claim reads see only rows claimable or sweepable at ``now`` (and the rows they lock), so
# they may run before the writes a call keeps for later (``Tx.write_later``).
_CLAIM_NEXT_PREPARED: Final = {
    shape: Prepared(statement, passes_kept_writes=True) for shape, statement in _CLAIM_NEXT.items()
}
_HEAD_PROBE_PREPARED: Final = {
    shape: Prepared(_build_head_probe(shape), passes_kept_writes=True) for shape in _SHAPES
}
_HEAD_WINDOW_PREPARED: Final = {
    shape: Prepared(_build_head_probe(shape, HEAD_WINDOW), passes_kept_writes=True) for shape in _SHAPES
}
CLAIM_OCCURRENCE: Final = union_all(
    select(_expired(job_filter((KIND_ANY, False)), _SWEEPABLE).subquery("expired")), _target_arm()
)
CLAIM_OCCURRENCE_PREPARED: Final = Prepared(CLAIM_OCCURRENCE)
LOCKED_ROWS: Final = Prepared(
    select(*_columns(ARM_EXPIRED, job_filter((KIND_ANY, False)), PENDING_ADJUDICATION))
    .select_from(_WITH_CONTROL)
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
    params["arm_limit"] = limit
    params["expired_limit"] = EXPIRED_PROBE + limit
    params["window_last"] = WINDOW + limit - 2  # a window of WINDOW + limit - 1 due entries
    return params


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


def _eligible_job_ids(shape: Shape) -> Select[Any]:
    jobs = t.jobs.alias("eligible")
    return select(jobs.c.job_id).where(*_job_conditions(jobs, shape))


def beyond_window_params(now: int, after: int, limit: int, claim_filter: ClaimFilter) -> dict[str, Any]:
    """Parameters of the three beyond-the-window statements."""
    params = claim_filter.params()
    params.update(now=now, after=after, arm_limit=limit, budget=JOB_PROBE_BUDGET + 1)
    return params


def within_budget(eligible_rows: int) -> bool:
    """Whether the eligible jobs' occurrences are few enough to read them all."""
    return eligible_rows <= JOB_PROBE_BUDGET


@functools.cache
def eligible_job_rows_statement(shape: Shape) -> Prepared:
    """How many occurrences (any status) the eligible jobs hold, counted up to the budget + 1."""
    rows = (
        select(_m.c.occurrence_id)
        .where(_m.c.job_id.in_(_eligible_job_ids(shape)))
        .limit(_count("budget"))
        .subquery("budget")
    )
    return Prepared(select(func.count()).select_from(rows))


@functools.cache
def beyond_window_statement(arm: str, shape: Shape) -> Prepared:
    """The next ``:arm_limit`` claimable rows of a due arm after ``:after``, read through the eligible jobs.

    The eligible jobs' occurrences (found by ``scheduler_occurrences_job``: the only indexed
    term of the inner query) are filtered by status and ``available_at`` there, then joined
    to their rows by primary key and the few due ones sorted: a bounded read (used only when
    :func:`eligible_job_rows_statement` is within the budget) instead of a walk over every
    row of the other jobs.
    """
    members = (
        select(_m.c.occurrence_id, _m.c.status, _m.c.available_at)
        .where(_m.c.job_id.in_(_eligible_job_ids(shape)))
        .limit(_count("budget"))
        .subquery("members")
    )
    source = members.join(o, o.c.occurrence_id == members.c.occurrence_id).outerjoin(
        _c, _c.c.occurrence_id == o.c.occurrence_id
    )
    due = and_(
        members.c.status == literal_column(f"'{DUE_ARMS[arm]}'"),
        members.c.available_at > bindparam("after"),
        members.c.available_at <= bindparam("now"),
    )
    return Prepared(_due(arm, due, source=source, status_term=False))


@functools.cache
def continued_walk_statement(arm: str, shape: Shape) -> Prepared:
    """The due arm's walk continued after ``:after`` without a window (the eligible jobs are large)."""
    after = and_(o.c.available_at > bindparam("after"), o.c.available_at <= bindparam("now"))
    return Prepared(_due(arm, after, job_filter(shape)))
