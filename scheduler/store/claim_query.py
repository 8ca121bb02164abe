"""Claim candidate selection without sorting every eligible row (seed: claimNext's candidate SELECT).

The seed orders all eligible rows by ``CASE WHEN running THEN lease_expires_at ELSE
available_at END, scheduled_for, occurrence_id``, which no index can serve. Here one statement
combines three probes the index ``scheduler_occurrences_claim(status, available_at,
lease_expires_at, scheduled_for, occurrence_id)`` serves:

* ``queued`` and ``retry_wait``: an ordered walk of the index from the oldest ``available_at``
  that stops at the first row(s) passing the job/attempt/control filters (``LIMIT k``);
* ``running`` with ``lease_expires_at <= now``: every such row (their number is bounded by the
  workers), unsorted; these rows also feed the expired-final-attempt sweep.

:class:`ClaimPlan` merges the three by the seed's sort key in Python, so the chosen occurrence is
exactly the seed's, and replays successive ``claim_next`` calls for ``claim_batch``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Final

from sqlalchemy import (
    CompoundSelect,
    Select,
    and_,
    bindparam,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from scheduler.contract.constants import QUEUED, RETRY_WAIT, RUNNING
from scheduler.schema import tables as t
from scheduler.store.dialect import json_text_field
from scheduler.store.fastpath import Prepared, StoredRow

SWEEP_LIMIT: Final = 100
PAUSE_REQUESTED: Final = "pause_requested"
PAUSED: Final = "paused"
RESUMED: Final = "resumed"
ATTEMPT_NEUTRAL_CONTROLS: Final = (PAUSE_REQUESTED, RESUMED)

ARM_QUEUED: Final = "q"
ARM_RETRY_WAIT: Final = "r"
ARM_EXPIRED: Final = "e"
ARM_TARGET: Final = "t"

o = t.occurrences.alias("o")
_c = t.occurrence_controls.alias("c")
_j = t.jobs.alias("j")
_a = t.adjudications.alias("a")
_r = t.occurrence_retries.alias("r")
_r_first = t.occurrence_retries.alias("r_first")
_r_any = t.occurrence_retries.alias("r_any")


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


def job_filter(job_kind: bool, workspace_id: bool) -> ColumnElement[bool]:
    """EXISTS an enabled job for the row, optionally of ``:job_kind`` / in ``:workspace_id``."""
    conditions: list[ColumnElement[bool]] = [_j.c.job_id == o.c.job_id, _j.c.enabled == literal_column("1")]
    if job_kind:
        conditions.append(_j.c.kind == bindparam("job_kind"))
    if workspace_id:
        conditions.append(json_text_field(_j.c.authority_json, "workspaceId") == bindparam("workspace_id"))
    return exists().where(*conditions)


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


def _due_arm(arm: str, status: str, jobs: ColumnElement[bool]) -> Select[Any]:
    """The first ``:arm_limit`` claimable rows of one waiting status, in index order."""
    state = _c.c.state
    return (
        select(*_columns(arm, literal_column("1"), null()))
        .select_from(_WITH_CONTROL)
        .where(
            o.c.status == literal_column(f"'{status}'"),
            o.c.available_at <= bindparam("now"),
            jobs,
            or_(
                o.c.attempt < o.c.max_attempts, state == PAUSE_REQUESTED, state == RESUMED, HAS_PENDING_RETRY
            ),
            or_(state.is_(None), and_(state != PAUSED, state != PAUSE_REQUESTED)),
        )
        .order_by(o.c.available_at, o.c.lease_expires_at, o.c.scheduled_for, o.c.occurrence_id)
        .limit(bindparam("arm_limit"))
    )


def _expired_arm(jobs: ColumnElement[bool]) -> Select[Any]:
    """Every running row whose lease has expired (no job filter: the sweep needs them all)."""
    return (
        select(*_columns(ARM_EXPIRED, jobs, PENDING_ADJUDICATION))
        .select_from(_WITH_CONTROL)
        .where(o.c.status == literal_column(f"'{RUNNING}'"), o.c.lease_expires_at <= bindparam("now"))
    )


def _target_arm() -> Select[Any]:
    return (
        select(*_columns(ARM_TARGET, job_filter(False, False), null()))
        .select_from(_WITH_CONTROL)
        .where(o.c.occurrence_id == bindparam("occurrence_id"))
    )


def _build_claim_next(job_kind: bool, workspace_id: bool) -> CompoundSelect[Any]:
    jobs = job_filter(job_kind, workspace_id)
    queued = _due_arm(ARM_QUEUED, QUEUED, jobs).subquery("due_queued")
    retrying = _due_arm(ARM_RETRY_WAIT, RETRY_WAIT, jobs).subquery("due_retry_wait")
    return union_all(select(queued), select(retrying), _expired_arm(jobs))


_CLAIM_NEXT: Final = {
    (kind, workspace): _build_claim_next(kind, workspace)
    for kind in (False, True)
    for workspace in (False, True)
}
CLAIM_OCCURRENCE: Final = union_all(_expired_arm(job_filter(False, False)), _target_arm())


def claim_next_statement(job_kind: str | None, workspace_id: str | None) -> CompoundSelect[Any]:
    """The candidate statement for the given filters (params: now, arm_limit, job_kind, workspace_id)."""
    return _CLAIM_NEXT[(job_kind is not None, workspace_id is not None)]


_CLAIM_NEXT_PREPARED: Final = {key: Prepared(statement) for key, statement in _CLAIM_NEXT.items()}
CLAIM_OCCURRENCE_PREPARED: Final = Prepared(CLAIM_OCCURRENCE)


def claim_next_prepared(job_kind: str | None, workspace_id: str | None) -> Prepared:
    """``claim_next_statement`` for execution through ``Tx`` (the compile-once fast path)."""
    return _CLAIM_NEXT_PREPARED[(job_kind is not None, workspace_id is not None)]


def claim_next_params(now: int, limit: int, job_kind: str | None, workspace_id: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"now": now, "arm_limit": limit}
    if job_kind is not None:
        params["job_kind"] = job_kind
    if workspace_id is not None:
        params["workspace_id"] = workspace_id
    return params


# ----------------------------------------------------------------- row predicates (seed logic)


def sort_key(row: StoredRow) -> tuple[int, int, str]:
    """The seed's ORDER BY: lease expiry for running rows, availability otherwise."""
    first = row.lease_expires_at if row.status == RUNNING else row.available_at
    return (first, row.scheduled_for, row.occurrence_id)


def attempts_allow(row: StoredRow) -> bool:
    """Attempts left, or a claim that does not count one (pause/resume control, requeue)."""
    return (
        row.attempt < row.max_attempts
        or row.control_state in ATTEMPT_NEUTRAL_CONTROLS
        or row.retry_request_id is not None
    )


def keeps_attempt(row: StoredRow) -> bool:
    """The claim's attempt increment is 0 (seed: the CASE in the claim UPDATE)."""
    state = row.control_state
    return (
        state == PAUSE_REQUESTED
        or (state == RESUMED and row.control_expected_fence == row.fence)
        or row.retry_request_id is not None
    )


def sweepable(row: StoredRow) -> bool:
    """An expired final attempt the sweep dead-letters (not while a pause/resume is pending)."""
    return row.attempt >= row.max_attempts and row.control_state not in ATTEMPT_NEUTRAL_CONTROLS


def claimable(row: StoredRow, now: int) -> bool:
    """The seed's claim eligibility of one row (claimOccurrence's check)."""
    state = row.control_state
    if not row.job_ok or not attempts_allow(row) or state == PAUSED:
        return False
    if state == PAUSE_REQUESTED and row.status != RUNNING:
        return False
    if row.status in (QUEUED, RETRY_WAIT):
        return bool(row.available_at <= now)
    return row.status == RUNNING and bool(row.lease_expires_at <= now)


class ClaimPlan:
    """Sweep batches and claim candidates in the order successive seed ``claimNext`` calls take them.

    Claiming or sweeping a row changes only that row, so the candidates of later calls in the
    same transaction are the remaining rows of the same ordered streams.
    """

    __slots__ = ("_done", "_queued", "_retrying", "_running", "_sweep", "target")

    def __init__(self, rows: Iterable[StoredRow], now: int) -> None:
        expired: list[StoredRow] = []
        self._queued: deque[StoredRow] = deque()
        self._retrying: deque[StoredRow] = deque()
        self.target: StoredRow | None = None
        for row in rows:
            if row.arm == ARM_EXPIRED:
                expired.append(row)
            elif row.arm == ARM_QUEUED:
                self._queued.append(row)
            elif row.arm == ARM_RETRY_WAIT:
                self._retrying.append(row)
            else:
                self.target = row
        ordered = sorted(expired, key=lambda row: (row.lease_expires_at, row.occurrence_id))
        self._sweep = deque(row for row in ordered if sweepable(row))
        self._running = deque(sorted((row for row in expired if claimable(row, now)), key=sort_key))
        self._done: set[str] = set()

    def next_sweep(self) -> list[StoredRow]:
        """The next (at most 100) expired final attempts to dead-letter."""
        batch: list[StoredRow] = []
        while self._sweep and len(batch) < SWEEP_LIMIT:
            row = self._sweep.popleft()
            if row.occurrence_id not in self._done:
                batch.append(row)
                self._done.add(row.occurrence_id)
        return batch

    def next_candidate(self) -> StoredRow | None:
        """The next occurrence to claim, or ``None``."""
        while self._running and self._running[0].occurrence_id in self._done:
            self._running.popleft()
        streams = [stream for stream in (self._queued, self._retrying, self._running) if stream]
        if not streams:
            return None
        best = min(streams, key=lambda stream: sort_key(stream[0]))
        row = best.popleft()
        self._done.add(row.occurrence_id)
        return row

    def was_swept(self, occurrence_id: str) -> bool:
        return occurrence_id in self._done
