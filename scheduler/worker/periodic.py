"""Firing periodic triggers: each due tick enqueued once, by any number of workers (API §9).

Every worker evaluates the periodic jobs of the kinds it handles and enqueues each due tick with
``enqueue_occurrence_once_per_trigger``: the first call for a ``(job, trigger key)`` inserts the
occurrence, every later one (another thread, process or host) gets it back ``deduplicated`` — so a
tick fires exactly once however many workers evaluate it.

Where the state lives: the jobs and their trigger documents in ``jobs`` (re-read every
``refresh_ms``); a job's last fired tick per trigger type from its newest occurrences
(``latest_trigger_ticks``, read once per job), then kept in memory.

Which ticks are due (documented in docs/workers.md):

* recurring triggers (cron, interval) never fire a tick before the job's ``created_at``, nor one at
  or before the job's last fired tick of the same type;
* after downtime, ``missed="latest"`` (the default) enqueues only the latest missed tick;
  ``missed="all"`` enqueues every missed tick, oldest first, at most ``max_catch_up`` of the latest;
* a ``once`` trigger fires when its time has come, even if it was in the past when the job was made.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.records import Job, Occurrence
from scheduler.store.telemetry import describe
from scheduler.worker.triggers import Trigger, TriggerError, due_floor, parse_trigger

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

MissedTicks = Literal["latest", "all"]
MISSED_POLICIES: Final = ("latest", "all")
_GONE: Final = ("SCHEDULER_JOB_DISABLED", "SCHEDULER_NOT_FOUND")

log = logging.getLogger("scheduler.worker.periodic")


@dataclass
class _PeriodicJob:
    job: Job
    trigger: Trigger | None
    fired: dict[str, int] | None = None
    """Last fired ``scheduled_for`` per key prefix (``None`` until read from the store)."""
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
    ) -> None:
        self._store = store
        self._kinds = list(kinds)
        self._clock = clock
        self._limit = 1 if missed == "latest" else max_catch_up
        self._refresh_ms = refresh_ms
        self._jobs: dict[str, _PeriodicJob] = {}
        self._loaded_at: int | None = None

    def refresh(self, now: int) -> None:
        """Re-read the enabled periodic jobs (keeping what is known of unchanged ones)."""
        jobs = self._store.list_periodic_jobs(job_kinds=self._kinds)
        known = self._jobs
        self._jobs = {}
        for job in jobs:
            previous = known.get(job.id)
            if previous is not None and previous.job.revision == job.revision and not previous.gone:
                self._jobs[job.id] = previous
                continue
            self._jobs[job.id] = _PeriodicJob(job, self._parse(job), previous.fired if previous else None)
        self._loaded_at = now

    def _parse(self, job: Job) -> Trigger | None:
        try:
            return parse_trigger(job.trigger, created_at=job.created_at)
        except TriggerError as error:
            log.warning("job %s has an invalid periodic trigger: %s", job.id, error, extra={"job": job.id})
            return None

    def _last_fired(self, entry: _PeriodicJob) -> dict[str, int]:
        if entry.fired is None:
            ticks = self._store.latest_trigger_ticks(entry.job.id)
            entry.fired = {prefix: tick.scheduled_for for prefix, tick in ticks.items()}
        return entry.fired

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
            if entry.trigger is None or entry.gone:
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
        trigger = entry.trigger
        assert trigger is not None
        fired = self._last_fired(entry)
        floor = due_floor(trigger, created_at=entry.job.created_at, last_fired_at=fired.get(trigger.prefix))
        created: list[Occurrence] = []
        for tick in trigger.latest(now=now, floor=floor, limit=self._limit):
            occurrence = self._store.enqueue_occurrence_once_per_trigger(
                job_id=entry.job.id, scheduled_for=tick.at, trigger_key=tick.key
            )
            fired[trigger.prefix] = max(fired.get(trigger.prefix, tick.at), tick.at)
            if not occurrence.deduplicated:
                created.append(occurrence)
                extra = {"occurrence": occurrence.id, "job": entry.job.id, "kind": entry.job.kind}
                log.info("fired %s %s", tick.key, describe(extra), extra=extra)
        return created

    def next_due_in_ms(self, now: int) -> int:
        """Milliseconds until the next tick of a known job is due, at most until the next refresh."""
        wait = self._refresh_ms
        for entry in self._jobs.values():
            if entry.trigger is None or entry.gone:
                continue
            following = entry.trigger.next_after(now)
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
