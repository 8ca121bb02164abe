"""Firing periodic triggers: each due tick enqueued once, by any number of workers (API §9).

Every worker evaluates the periodic jobs of the kinds it handles and enqueues each due tick with
``enqueue_periodic_tick`` (``enqueue_occurrence_once_per_trigger`` done only while the job is still at
the revision the tick was computed from, and has fired no tick of that type at or after it): the
first call for a ``(job, trigger key)`` inserts the occurrence, every later one (another thread,
process or host) gets it back ``deduplicated`` — so a tick fires exactly once however many workers
evaluate it — and a worker that has not yet seen a change of the job, or whose memory of its last
fired tick is stale (other workers fired later ticks and a prune deleted them), re-reads it instead
of firing a tick of the old trigger or a pruned tick again.

Where the state lives: the jobs and their trigger documents in ``jobs`` (re-read every
``refresh_ms``); per job, read once (and again after it changed) with ``periodic_state``: when its
trigger was last changed (its ``job_updated`` events) and its last fired tick per trigger type
(its occurrences), then kept in memory. Nothing else: a worker's decisions follow from the
database alone, so all workers decide alike.

Which ticks are due (documented in docs/workers.md):

* recurring triggers (cron, interval) never fire a tick before the job's ``created_at``, nor before
  the last change of its trigger, nor one at or before the job's last fired tick of the same type;
* after downtime, ``missed="latest"`` (the default) enqueues only the latest missed tick;
  ``missed="all"`` enqueues every missed tick, oldest first, at most ``max_catch_up`` of the latest;
* a ``once`` trigger fires when its time has come, even if it was in the past when the job was made
  or changed, unless the job already fired a once tick at or after that time;
* a changed interval trigger's keys name the new schedule (``interval:<everyMs>@<anchor>:<k>``), a
  trigger never changed keeps ``interval:<k>``; cron and once keys name their instant.

The functions :func:`periodic_trigger`, :func:`ticks_due` and :func:`fire_ticks` are the whole
decision for one job; :class:`PeriodicScheduler` applies them to the jobs of some kinds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.capabilities.periodic_ticks import PeriodicState
from scheduler.store.plumbing.telemetry import describe
from scheduler.store.records import Job, Occurrence
from scheduler.worker.triggers import Tick, Trigger, TriggerError, due_ticks, parse_trigger

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

MissedTicks = Literal["latest", "all"]
MISSED_POLICIES: Final = ("latest", "all")
_GONE: Final = ("SCHEDULER_JOB_DISABLED", "SCHEDULER_NOT_FOUND")
_RELOADS: Final = 3
"""How many times one pass re-reads a job that keeps changing under it before leaving it for later."""

log = logging.getLogger("scheduler.worker.periodic")


def periodic_trigger(state: PeriodicState) -> Trigger | None:
    """The job's periodic trigger as its state says (``None``: not periodic). Raises
    :class:`TriggerError` for a malformed one."""
    job = state.job
    return parse_trigger(job.trigger, created_at=job.created_at, changed_at=state.trigger_changed_at)


def ticks_due(
    state: PeriodicState, trigger: Trigger, *, now: int, limit: int, last_fired_at: int | None = None
) -> list[Tick]:
    """The latest ``limit`` ticks of ``trigger`` due at ``now`` and not yet fired, oldest first.

    ``last_fired_at`` overrides the state's last fired tick of the trigger's type (a caller that
    fired ticks since it read the state)."""
    if last_fired_at is None:
        newest = state.ticks.get(trigger.prefix)
        last_fired_at = None if newest is None else newest.scheduled_for
    return due_ticks(
        trigger,
        now=now,
        limit=limit,
        created_at=state.job.created_at,
        last_fired_at=last_fired_at,
        changed_at=state.trigger_changed_at,
    )


@dataclass(frozen=True, slots=True)
class FiredTicks:
    """What :func:`fire_ticks` did: the occurrence of each tick it enqueued (in order; an earlier
    one comes back ``deduplicated``), and whether it stopped because the job moved on (it changed,
    or fired a later tick of that type than the caller knew of)."""

    occurrences: list[Occurrence]
    job_changed: bool


def fire_ticks(store: SchedulerStore, job: Job, ticks: Sequence[Tick]) -> FiredTicks:
    """Enqueue each tick once, in order, while the job is still at ``job.revision``; stop at the
    first tick refused because it changed or already fired a later tick of that type (re-read its
    state: that tick and the next were not written).
    ``SCHEDULER_JOB_DISABLED`` / ``SCHEDULER_NOT_FOUND`` as the store raises them."""
    enqueued: list[Occurrence] = []
    for tick in ticks:
        occurrence = store.enqueue_periodic_tick(
            job_id=job.id, job_revision=job.revision, scheduled_for=tick.at, trigger_key=tick.key
        )
        if occurrence is None:
            return FiredTicks(enqueued, job_changed=True)
        enqueued.append(occurrence)
    return FiredTicks(enqueued, job_changed=False)


@dataclass
class _PeriodicJob:
    job: Job
    schedule: Trigger | None
    """The trigger as listed (its instants; its keys once ``state`` is read)."""
    state: PeriodicState | None = None
    fired: int | None = None
    """The last fired ``scheduled_for`` of the trigger's type (known once ``state`` is read)."""
    gone: bool = False
    errors: set[str] = field(default_factory=set)


class PeriodicScheduler:
    """Evaluates the periodic jobs of some kinds and enqueues their due ticks."""

    def __init__(
        self,
        store: SchedulerStore,
        *,
        kinds: Sequence[str],
        clock: Callable[[], int],
        missed: MissedTicks = "latest",
        max_catch_up: int = 100,
        refresh_ms: int = 5_000,
        fires: Callable[[Job], bool] | None = None,
    ) -> None:
        self._store = store
        self._kinds = list(kinds)
        self._fires = fires
        """Which of the kinds' periodic jobs this scheduler fires (``None``: all of them)."""
        self._clock = clock
        self._limit = 1 if missed == "latest" else max_catch_up
        self._refresh_ms = refresh_ms
        self._jobs: dict[str, _PeriodicJob] = {}
        self._loaded_at: int | None = None

    def refresh(self, now: int) -> None:
        """Re-read the enabled periodic jobs (keeping what is known of unchanged ones)."""
        jobs = self._store.list_periodic_jobs(job_kinds=self._kinds)
        if self._fires is not None:
            jobs = [job for job in jobs if self._fires(job)]
        known = self._jobs
        self._jobs = {}
        for job in jobs:
            previous = known.get(job.id)
            if previous is not None and previous.job.revision == job.revision and not previous.gone:
                self._jobs[job.id] = previous
                continue
            self._jobs[job.id] = _PeriodicJob(job, self._parse(job, None))
        self._loaded_at = now

    @staticmethod
    def _parse(job: Job, state: PeriodicState | None) -> Trigger | None:
        try:
            if state is None:  # the listed job: its instants are known, its keys not yet
                return parse_trigger(job.trigger, created_at=job.created_at)
            return periodic_trigger(state)
        except TriggerError as error:
            log.warning("job %s has an invalid periodic trigger: %s", job.id, error, extra={"job": job.id})
            return None

    def _load(self, entry: _PeriodicJob) -> None:
        """Read the job's periodic state; the trigger with its keys and the last fired tick."""
        state = self._store.periodic_state(entry.job.id)
        if state is None or not state.job.enabled:
            entry.gone = True
            return
        entry.job, entry.state = state.job, state
        entry.schedule = self._parse(state.job, state)
        newest = None if entry.schedule is None else state.ticks.get(entry.schedule.prefix)
        entry.fired = None if newest is None else newest.scheduled_for

    def fire_due(self, now: int | None = None) -> list[Occurrence]:
        """Enqueue every due tick (one evaluation pass); return the occurrences this call created."""
        moment = self._clock() if now is None else now
        if (
            self._loaded_at is None
            or moment - self._loaded_at >= self._refresh_ms
            or moment < self._loaded_at
        ):
            self.refresh(moment)
        created: list[Occurrence] = []
        for entry in list(self._jobs.values()):
            if entry.schedule is None or entry.gone:
                continue
            try:
                created.extend(self._fire_job(entry, moment))
            except SchedulerKernelError as error:
                if error.code in _GONE:
                    entry.gone = True
                elif error.code not in entry.errors:
                    entry.errors.add(error.code)
                    log.warning("periodic job %s: %s", entry.job.id, error, extra={"job": entry.job.id})
        return created

    def _fire_job(self, entry: _PeriodicJob, now: int) -> list[Occurrence]:
        created: list[Occurrence] = []
        for _ in range(_RELOADS):
            if entry.state is None:
                self._load(entry)
            if entry.state is None or entry.schedule is None or entry.gone:
                break
            trigger = entry.schedule
            ticks = ticks_due(entry.state, trigger, now=now, limit=self._limit, last_fired_at=entry.fired)
            fired = fire_ticks(self._store, entry.job, ticks)
            for tick, occurrence in zip(ticks, fired.occurrences, strict=False):
                entry.fired = tick.at if entry.fired is None else max(entry.fired, tick.at)
                if not occurrence.deduplicated:
                    created.append(occurrence)
                    extra = {"occurrence": occurrence.id, "job": entry.job.id, "kind": entry.job.kind}
                    log.info("fired %s %s", tick.key, describe(extra), extra=extra)
            if not fired.job_changed:
                break
            entry.state = None  # changed since it was read: read it again
        return created

    def next_due_in_ms(self, now: int) -> int:
        """Milliseconds until the next tick of a known job is due, at most until the next refresh."""
        wait = self._refresh_ms
        for entry in self._jobs.values():
            if entry.schedule is None or entry.gone:
                continue
            following = entry.schedule.next_after(now)
            if following is not None:
                wait = min(wait, following - now)
        return max(0, wait)


class PeriodicThread:
    """Runs a :class:`PeriodicScheduler` until stopped, waking lanes when it enqueued work."""

    def __init__(
        self, scheduler: PeriodicScheduler, clock: Callable[[], int], on_enqueued: Callable[[], None]
    ) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._on_enqueued = on_enqueued
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler-periodic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self._scheduler.fire_due():
                    self._on_enqueued()
                failures = 0
                wait_ms = self._scheduler.next_due_in_ms(self._clock())
            except SchedulerKernelError as error:
                if error.code == "SCHEDULER_STORE_CLOSED":
                    return
                failures += 1
                wait_ms = min(5_000, 100 * 2 ** min(failures, 6))
                log.log(
                    logging.DEBUG if error.code == "SCHEDULER_STORAGE_UNAVAILABLE" else logging.WARNING,
                    "periodic evaluation failed (%s); retrying in %d ms",
                    error.code,
                    wait_ms,
                )
            except Exception:
                log.exception("periodic evaluation failed")
                wait_ms = 5_000
            # A tick is due at a whole millisecond; waking 1 ms later makes it due on the next pass.
            self._stop.wait((wait_ms + 1) / 1000)


__all__ = [
    "MISSED_POLICIES",
    "FiredTicks",
    "MissedTicks",
    "PeriodicScheduler",
    "PeriodicThread",
    "fire_ticks",
    "periodic_trigger",
    "ticks_due",
]
