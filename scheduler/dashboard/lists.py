"""The other views' reads: one run, jobs, paused runs, workers, adjudication cases (read-only).

Each is bounded and served by an index: the occurrences and jobs primary keys,
``scheduler_events_occurrence`` (a run's timeline), ``scheduler_occurrence_controls_state``
(paused runs), ``scheduler_occurrences_claim`` (running leases, the newest dead letters) and
``scheduler_adjudications_status`` (recorded decisions).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final

from sqlalchemy import select

from scheduler.contract.constants import DEAD_LETTER, RUNNING
from scheduler.dashboard.queries import WINDOW, awaiting_decision_filter, newest_dead_letters_window
from scheduler.schema import tables as t
from scheduler.store.capabilities.adjudication import (
    candidate_cases,
    load_adjudication_case,
    map_adjudication,
)
from scheduler.store.capabilities.authority import load_authority_reservation, load_occurrence
from scheduler.store.capabilities.history import read_events
from scheduler.store.capabilities.runtime_reads import load_occurrence_control, map_occurrence_control
from scheduler.store.plumbing.rows import map_job
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import (
    Adjudication,
    AdjudicationCase,
    AuthorityReservation,
    Event,
    Job,
    Occurrence,
    OccurrenceControl,
)

TIMELINE: Final = 200
"""Events shown on a run's page (the store's history bound)."""
JOBS_PAGE: Final = 100
LIST_LIMIT: Final = 100
LEASES_PER_OWNER: Final = 25
CASES_LIMIT: Final = 50

_o, _j, _c, _a = t.occurrences, t.jobs, t.occurrence_controls, t.adjudications


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class RunDetail:
    occurrence: Occurrence
    job: Job | None
    events: list[Event]
    control: OccurrenceControl | None
    case: AdjudicationCase | None
    reservation: AuthorityReservation | None


def run_detail_in(tx: Tx, occurrence_id: str) -> RunDetail | None:
    occurrence = load_occurrence(tx, occurrence_id)
    if occurrence is None:
        return None
    job = map_job(tx.execute(select(_j).where(_j.c.job_id == occurrence.job_id)).first())
    case = load_adjudication_case(tx, occurrence_id) if occurrence.status == DEAD_LETTER else None
    return RunDetail(
        occurrence=occurrence,
        job=job,
        events=read_events(tx, occurrence_id, None, TIMELINE),
        control=load_occurrence_control(tx, occurrence_id),
        case=case if case is not None and (case.eligible or case.adjudication is not None) else None,
        reservation=load_authority_reservation(tx, occurrence_id),
    )


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[Job]
    next_after: str | None


def list_jobs_in(tx: Tx, *, after: str | None, kind: str | None, page: int = JOBS_PAGE) -> JobPage:
    """Jobs by id (the jobs primary key), after ``after``; ``kind`` filters them."""
    query = select(_j).order_by(_j.c.job_id).limit(page + 1)
    if after is not None:
        query = query.where(_j.c.job_id > after)
    if kind is not None:
        query = query.where(_j.c.kind == kind)
    jobs = [job for job in map(map_job, tx.execute(query)) if job is not None]
    return JobPage(jobs[:page], jobs[page - 1].id if len(jobs) > page else None)


def get_job_in(tx: Tx, job_id: str) -> Job | None:
    return map_job(tx.execute(select(_j).where(_j.c.job_id == job_id)).first())


# --------------------------------------------------------------------------- paused runs


@dataclass(frozen=True, slots=True)
class ControlledRun:
    """A run with an open runtime control (any job kind)."""

    control: OccurrenceControl
    job_id: str
    kind: str
    status: str
    fence: int
    attempt: int
    max_attempts: int


def controlled_runs_in(tx: Tx, state: str, limit: int = LIST_LIMIT) -> list[ControlledRun]:
    """Runs whose control is in ``state`` (``paused`` or ``pause_requested``), latest change first."""
    query = (
        select(_c, _o.c.job_id, _o.c.status, _o.c.fence, _o.c.attempt, _o.c.max_attempts, _j.c.kind)
        .select_from(
            _c.join(_o, _o.c.occurrence_id == _c.c.occurrence_id).join(_j, _j.c.job_id == _o.c.job_id)
        )
        .where(_c.c.state == state)
        .order_by(_c.c.updated_at.desc(), _c.c.occurrence_id.desc())
        .limit(limit)
    )
    runs = []
    for row in tx.execute(query):
        control = map_occurrence_control(row)
        assert control is not None
        runs.append(
            ControlledRun(control, row.job_id, row.kind, row.status, row.fence, row.attempt, row.max_attempts)
        )
    return runs


# --------------------------------------------------------------------------- workers


@dataclass(frozen=True, slots=True)
class Lease:
    occurrence_id: str
    job_id: str
    attempt: int
    fence: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class WorkerLeases:
    """One lease owner (a worker) and the running occurrences it holds."""

    owner: str
    running: int
    expired: int
    leases: list[Lease]


@dataclass(frozen=True, slots=True)
class Workers:
    owners: list[WorkerLeases]
    window_full: bool
    """More than ``WINDOW`` running occurrences: the figures cover the first ``WINDOW``."""


def workers_in(tx: Tx, now: int) -> Workers:
    """Distinct lease owners of running occurrences (``scheduler_occurrences_claim``, ``running``)."""
    c = _o.c
    query = (
        select(c.occurrence_id, c.job_id, c.attempt, c.fence, c.lease_owner, c.lease_expires_at)
        .where(c.status == RUNNING)
        .limit(WINDOW + 1)
    )
    rows = list(tx.execute(query))
    by_owner: dict[str, list[Lease]] = defaultdict(list)
    for row in rows[:WINDOW]:
        by_owner[row.lease_owner].append(
            Lease(row.occurrence_id, row.job_id, row.attempt, row.fence, row.lease_expires_at)
        )
    owners = []
    for owner, leases in sorted(by_owner.items()):
        leases.sort(key=lambda lease: (lease.expires_at, lease.occurrence_id))
        expired = sum(1 for lease in leases if lease.expires_at <= now)
        owners.append(WorkerLeases(owner, len(leases), expired, leases[:LEASES_PER_OWNER]))
    return Workers(owners, len(rows) > WINDOW)


# --------------------------------------------------------------------------- adjudication


@dataclass(frozen=True, slots=True)
class Cases:
    awaiting: list[AdjudicationCase]
    """Outcome-unknown dead letters without a decision, among the newest ``WINDOW`` dead letters."""
    pending: list[Adjudication]
    applied: list[Adjudication]


def _adjudications(tx: Tx, status: str, limit: int) -> list[Adjudication]:
    query = (
        select(_a)
        .where(_a.c.status == status)
        .order_by(_a.c.created_at.desc(), _a.c.occurrence_id.desc())
        .limit(limit)
    )
    return [record for record in map(map_adjudication, tx.execute(query)) if record is not None]


def cases_in(tx: Tx, limit: int = CASES_LIMIT) -> Cases:
    window = newest_dead_letters_window().subquery()
    candidates = list(tx.execute(select(window).where(*awaiting_decision_filter(window)).limit(limit)))
    awaiting = [case for case in candidate_cases(tx, candidates) if case.eligible]
    return Cases(awaiting, _adjudications(tx, "pending", limit), _adjudications(tx, "applied", limit))


__all__ = [
    "Cases",
    "ControlledRun",
    "JobPage",
    "RunDetail",
    "WorkerLeases",
    "Workers",
    "cases_in",
    "controlled_runs_in",
    "get_job_in",
    "list_jobs_in",
    "run_detail_in",
    "workers_in",
]
