"""A small in-process worker that shows the store's main job end to end (``scheduler demo``).

:func:`run_demo` creates a job with a unique id, enqueues one occurrence per scenario, and runs
a worker loop over exactly those occurrences: targeted claim, authority reservation, lease
renewal, work, settlement. One scenario succeeds, one fails once and succeeds on its retry, one
fails every attempt and ends as a dead letter, one more succeeds. Retries are scheduled at
``retry_at = now`` so the run completes immediately on the wall clock.

The function returns what happened (:class:`DemoReport`) and never prints; the CLI renders it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from scheduler.contract.constants import TERMINAL_STATUSES
from scheduler.store.clock import wall_clock
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import AuthorityPolicy, Event, Job, Occurrence

log = logging.getLogger("scheduler.demo")

DEMO_JOB_KIND: Final = "scheduler-demo"
DEMO_OWNER: Final = "demo-worker"
DEMO_LEASE_MS: Final = 30_000
DEMO_MAX_ATTEMPTS: Final = 2
DEMO_AUTHORITY: Final[dict[str, Any]] = {
    "principal": {"type": "service", "id": "scheduler-demo"},
    "requestedCapabilities": ["demo.run"],
}
SUCCEED: Final = "succeed"
FAIL_ONCE: Final = "fail-once"
ALWAYS_FAIL: Final = "always-fail"
DEMO_SCENARIOS: Final[tuple[tuple[str, str], ...]] = (
    ("send-welcome-email", SUCCEED),
    ("sync-inventory", FAIL_ONCE),
    ("import-legacy-feed", ALWAYS_FAIL),
    ("build-daily-report", SUCCEED),
)
"""(trigger key, behaviour) of each occurrence the demo enqueues, in order."""


@dataclass(frozen=True)
class Outcome:
    """What the demo's pretend work returned for one attempt."""

    succeeded: bool
    result: Any = None
    error: Any = None


@dataclass(frozen=True)
class DemoReport:
    """The demo's job, its authority policy, the final occurrences and the history (oldest first)."""

    job: Job
    policy: AuthorityPolicy
    occurrences: list[Occurrence]
    events: list[Event]
    rounds: int

    @property
    def complete(self) -> bool:
        """Whether every occurrence reached a terminal status."""
        return all(occurrence.status in TERMINAL_STATUSES for occurrence in self.occurrences)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready dicts (records in their ``to_dict()`` shape)."""
        return {
            "job": self.job.to_dict(),
            "policy": self.policy.to_dict(),
            "occurrences": [occurrence.to_dict() for occurrence in self.occurrences],
            "events": [event.to_dict() for event in self.events],
            "rounds": self.rounds,
            "complete": self.complete,
        }


def perform(behaviour: str, attempt: int) -> Outcome:
    """The pretend work of one attempt of a scenario."""
    if behaviour == SUCCEED or (behaviour == FAIL_ONCE and attempt > 1):
        return Outcome(True, result={"ok": True, "attempt": attempt})
    code = "DEMO_TRANSIENT_FAILURE" if behaviour == FAIL_ONCE else "DEMO_UPSTREAM_UNAVAILABLE"
    return Outcome(False, error={"code": code, "message": f"{behaviour} failed on attempt {attempt}"})


def _enqueue(store: SchedulerStore, job_id: str, now: int) -> dict[str, str]:
    """Enqueue one occurrence per scenario; return behaviour by occurrence id."""
    behaviours: dict[str, str] = {}
    for offset, (trigger_key, behaviour) in enumerate(DEMO_SCENARIOS):
        occurrence = store.enqueue_occurrence(
            job_id=job_id,
            scheduled_for=now + offset,
            available_at=now,
            trigger_key=trigger_key,
            payload={"task": trigger_key, "behaviour": behaviour},
        )
        behaviours[occurrence.id] = behaviour
    return behaviours


def _work_once(
    store: SchedulerStore,
    occurrence_id: str,
    behaviour: str,
    policy: AuthorityPolicy,
    clock: Callable[[], int],
) -> Occurrence | None:
    """One attempt on one occurrence: claim, reserve, renew, work, settle. ``None`` if not claimable now."""
    claimed = store.claim_occurrence(occurrence_id=occurrence_id, owner_id=DEMO_OWNER, lease_ms=DEMO_LEASE_MS)
    if claimed is None:
        return None
    log.debug("claimed %s attempt %d fence %d", claimed.id, claimed.attempt, claimed.fence)
    store.reserve_authority(occurrence_id=claimed.id, policy_revision=policy.revision)
    store.renew(occurrence_id=claimed.id, owner_id=DEMO_OWNER, fence=claimed.fence, lease_ms=DEMO_LEASE_MS)
    outcome = perform(behaviour, claimed.attempt)
    if outcome.succeeded:
        return store.settle(
            occurrence_id=claimed.id,
            owner_id=DEMO_OWNER,
            fence=claimed.fence,
            outcome="succeeded",
            result=outcome.result,
        )
    return store.settle(
        occurrence_id=claimed.id,
        owner_id=DEMO_OWNER,
        fence=claimed.fence,
        outcome="failed",
        error=outcome.error,
        retryable=True,
        retry_at=clock(),
    )


def run_worker(
    store: SchedulerStore,
    behaviours: dict[str, str],
    policy: AuthorityPolicy,
    *,
    clock: Callable[[], int],
    max_rounds: int = 10,
) -> int:
    """Work the given occurrences until all are terminal (or ``max_rounds``); return the rounds run."""
    pending = dict(behaviours)
    rounds = 0
    while pending and rounds < max_rounds:
        rounds += 1
        for occurrence_id, behaviour in list(pending.items()):
            settled = _work_once(store, occurrence_id, behaviour, policy, clock)
            if settled is not None:
                log.debug("settled %s: %s", settled.id, settled.status)
            if settled is not None and settled.status in TERMINAL_STATUSES:
                del pending[occurrence_id]
    return rounds


def new_demo_job_id(now: int) -> str:
    """A job id unique per run: ``demo-<epoch ms>-<8 hex>``."""
    return f"demo-{now}-{uuid.uuid4().hex[:8]}"


def run_demo(
    store: SchedulerStore, *, job_id: str | None = None, clock: Callable[[], int] | None = None
) -> DemoReport:
    """Create a demo job, enqueue the scenarios, work them to the end, and report.

    ``clock`` (epoch ms) is used for the job id and the ``retry_at`` of retries; give the same
    clock the store was opened with (default: the wall clock, like ``open_store``).
    """
    now_ms = clock or wall_clock
    now = now_ms()
    job = store.create_job(
        id=job_id or new_demo_job_id(now),
        kind=DEMO_JOB_KIND,
        authority=DEMO_AUTHORITY,
        payload={"demo": True},
        max_attempts=DEMO_MAX_ATTEMPTS,
    )
    log.debug("created job %s", job.id)
    policy = store.ensure_authority_policy(job.authority)
    behaviours = _enqueue(store, job.id, now)
    rounds = run_worker(store, behaviours, policy, clock=now_ms)
    occurrences = [store.get_occurrence(occurrence_id) for occurrence_id in behaviours]
    events = list(reversed(store.history(job_id=job.id, limit=200)))
    return DemoReport(
        job=job,
        policy=policy,
        occurrences=[occurrence for occurrence in occurrences if occurrence is not None],
        events=events,
        rounds=rounds,
    )
