"""Which occurrences a claim may take, and what each candidate row carries to decide it.

The claim statements (:mod:`scheduler.store.capabilities.claim_query`) find candidates by walking
indexes; whether a row may be claimed or swept is written here once, so they all test the same:

* :class:`ClaimFilter`: which jobs' occurrences a claim may take (kinds, workspace); its
  :data:`Shape` (one statement text per shape, :data:`SHAPES`); :func:`job_filter` tests it row
  by row, :func:`eligible_job_ids` lists the jobs it admits.
* The runtime control states and the row conditions: an attempt left or a control or requeue
  request that lets the row run again (:func:`attempts_allow`), a control that lets a waiting row
  be claimed (:func:`waiting_control_ok`), an expired lease the call can act on
  (:func:`expired_actionable`: claim it again, or sweep it, :data:`SWEEPABLE`), the requeue
  request a claim consumes (:data:`RETRY_REQUEST_ID`); :data:`PLAIN_CLAIM_GUARD` re-checks a
  probed row in a claim ``UPDATE``.
* The candidate row (:func:`candidate_columns`): the arm that read it (``ARM_*``), the occurrence,
  its control, requeue request, job check and pending adjudication, so
  :mod:`scheduler.store.capabilities.claim_plan` decides without reading the row again and a
  backend that must lock a candidate before claiming it can try the candidates one by one;
  :func:`claimable_rows` of some index entries; a walk's :func:`marker_row` (its last
  :data:`KEY_COLUMNS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Select, and_, bindparam, exists, func, literal_column, null, or_, select
from sqlalchemy.sql.elements import ColumnElement

from scheduler.contract.constants import QUEUED, RETRY_WAIT
from scheduler.schema import tables as t
from scheduler.store.plumbing.constructs import correlated_exists, json_text_field

PAUSE_REQUESTED: Final = "pause_requested"
PAUSED: Final = "paused"
RESUMED: Final = "resumed"
ATTEMPT_NEUTRAL_CONTROLS: Final = (PAUSE_REQUESTED, RESUMED)

o = t.occurrences.alias("o")
c = t.occurrence_controls.alias("c")
_j = t.jobs.alias("j")
_a = t.adjudications.alias("a")
_r = t.occurrence_retries.alias("r")
_r_first = t.occurrence_retries.alias("r_first")
_r_any = t.occurrence_retries.alias("r_any")

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
SHAPES: Final = [
    (mode, workspace) for mode in (KIND_ANY, KIND_ONE, KIND_SEVERAL) for workspace in (False, True)
]
"""Every :data:`Shape` of a :class:`ClaimFilter` (one statement text each)."""


def job_conditions(jobs: Any, shape: Shape) -> list[ColumnElement[bool]]:
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


def job_filter(shape: Shape, row: Any = o) -> ColumnElement[bool]:
    """EXISTS an eligible job (:func:`job_conditions`) for the row ``row`` (tested row by row)."""
    return correlated_exists().where(_j.c.job_id == row.c.job_id, *job_conditions(_j, shape))


def eligible_job_ids(shape: Shape) -> Select[Any]:
    """The eligible jobs' ids (:func:`job_conditions`), for a statement that reads through them."""
    jobs = t.jobs.alias("eligible")
    return select(jobs.c.job_id).where(*job_conditions(jobs, shape))


# ------------------------------------------------------------------------------------ row conditions


def _pending_retry(alias: Any, row: Any = o) -> ColumnElement[bool]:
    """An unclaimed requeue request (``alias``) at the occurrence's (``row``'s) current fence."""
    return and_(
        alias.c.occurrence_id == row.c.occurrence_id,
        alias.c.claimed_at.is_(None),
        alias.c.expected_fence == row.c.fence,
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
PENDING_ADJUDICATION: Final = (
    select(_a.c.request_id)
    .where(_a.c.occurrence_id == o.c.occurrence_id, _a.c.status == literal_column("'pending'"))
    .scalar_subquery()
)
WITH_CONTROL = o.outerjoin(c, c.c.occurrence_id == o.c.occurrence_id)
_STATE = c.c.state


def attempts_allow(row: Any, control: Any) -> ColumnElement[bool]:
    """The row (``row``, its control ``control``) has an attempt left, or a control or requeue
    request that lets it run again."""
    state = control.c.state
    pending = exists().where(_pending_retry(_r_any, row))
    return or_(row.c.attempt < row.c.max_attempts, state == PAUSE_REQUESTED, state == RESUMED, pending)


def waiting_control_ok(control: Any) -> ColumnElement[bool]:
    """No control, or one that lets a waiting row be claimed (not paused, no pause requested)."""
    state = control.c.state
    return or_(state.is_(None), and_(state != PAUSED, state != PAUSE_REQUESTED))


ATTEMPTS_ALLOW = attempts_allow(o, c)
WAITING_CONTROL_OK = waiting_control_ok(c)
_NOT_PAUSED = or_(_STATE.is_(None), _STATE != PAUSED)
SWEEPABLE = and_(
    o.c.attempt >= o.c.max_attempts,
    or_(_STATE.is_(None), and_(_STATE != PAUSE_REQUESTED, _STATE != RESUMED)),
)
"""An expired final attempt the sweep dead-letters (not while a pause/resume is pending: see
``claim_plan.sweepable``)."""


def expired_actionable(jobs: ColumnElement[bool]) -> ColumnElement[bool]:
    """An expired lease (``o``) the call can act on: one to sweep, or one it may claim again (its
    job passes ``jobs``, it may run again, it is not paused)."""
    return or_(SWEEPABLE, and_(jobs, ATTEMPTS_ALLOW, _NOT_PAUSED))


def _plain_claim_guard() -> ColumnElement[bool]:
    occurrences, controls, retries = t.occurrences, t.occurrence_controls, t.occurrence_retries
    return and_(
        ~exists().where(controls.c.occurrence_id == occurrences.c.occurrence_id),
        ~exists().where(
            retries.c.occurrence_id == occurrences.c.occurrence_id,
            retries.c.claimed_at.is_(None),
            retries.c.expected_fence == occurrences.c.fence,
        ),
        exists().where(t.jobs.c.job_id == occurrences.c.job_id, *job_conditions(t.jobs, (KIND_ANY, False))),
    )


PLAIN_CLAIM_GUARD: Final = _plain_claim_guard()
"""For an ``UPDATE`` of ``occurrences``: the row still has no runtime control and no requeue
request at its fence, and its job is enabled, as when it was probed (``head_plain`` of
``queries.sql``'s ``claim_head``); a claim
decided on a probed row without reading it again after the lock writes only if this holds."""


# ------------------------------------------------------------------------------------ candidate rows

# The arm of a candidate row: which read found it (a due status, the expired leases, the one
# occurrence asked for), or a walk's marker row (WINDOW_MARKERS: the key the walk ended at).
ARM_QUEUED: Final = "q"
ARM_RETRY_WAIT: Final = "r"
ARM_EXPIRED: Final = "e"
ARM_TARGET: Final = "t"
DUE_ARMS: Final = {ARM_QUEUED: QUEUED, ARM_RETRY_WAIT: RETRY_WAIT}
WINDOW_MARKERS: Final = {"qw": ARM_QUEUED, "rw": ARM_RETRY_WAIT}


def candidate_columns(arm: str, job_ok: ColumnElement[Any], adjudication: ColumnElement[Any]) -> list[Any]:
    """A candidate row: the arm that read it, the occurrence's columns, then five more (its control
    state and fence, the requeue request a claim would consume, ``job_ok``, the pending
    adjudication), all that ``claim_plan`` needs to claim or sweep it without reading it again."""
    return [
        literal_column(f"'{arm}'").label("arm"),
        *o.c,
        c.c.state.label("control_state"),
        c.c.expected_fence.label("control_expected_fence"),
        RETRY_REQUEST_ID.label("retry_request_id"),
        job_ok.label("job_ok"),
        adjudication.label("adjudication_request_id"),
    ]


def rows_with_control(ids: Any, row: Any = o, control: Any = c) -> Any:
    """The occurrences (``row``) of ``ids`` (a subquery with an ``occurrence_id`` column), each with
    its control (``control``, outer-joined): what :func:`candidate_columns` reads."""
    return ids.join(row, row.c.occurrence_id == ids.c.occurrence_id).outerjoin(
        control, control.c.occurrence_id == row.c.occurrence_id
    )


def claimable_rows(entries: Any, arm: str, jobs: ColumnElement[bool]) -> Select[Any]:
    """The rows of ``entries`` (due index entries) the claim may take (their job passes ``jobs``),
    as candidate rows of ``arm``, in no particular order (``claim_plan`` orders them)."""
    return (
        select(*candidate_columns(arm, literal_column("TRUE"), null()))
        .select_from(rows_with_control(entries))
        .where(jobs, ATTEMPTS_ALLOW, WAITING_CONTROL_OK)
    )


KEY_COLUMNS: Final = ("available_at", "scheduled_for", "occurrence_id")
"""A waiting row's place in the seed's order (its ``lease_expires_at`` is always NULL): the key a
walk of one waiting status continues after (``claim_plan.WalkKey``)."""


def marker_row(marker: str, last: Select[Any]) -> Select[Any]:
    """A walk's marker row, one when the walk was full (``last``: the key of its last entry, or no
    row): ``arm`` = the marker, the :data:`KEY_COLUMNS` of that entry, every other column of a
    candidate row NULL."""
    end = last.subquery(f"end_{marker}")
    occurrence = [end.c[column.name] if column.name in KEY_COLUMNS else null() for column in o.c]
    return select(literal_column(f"'{marker}'").label("arm"), *occurrence, *[null()] * 5).select_from(end)
