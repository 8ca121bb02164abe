"""``Worker``: claims occurrences of the kinds it has handlers for, runs them, settles them (API §9).

Threads of one worker: ``concurrency`` lanes (each claims, runs a sync handler itself or waits for
an ``async def`` handler on the shared event loop, then settles), the lease keeper (renewals), the
periodic thread (due ticks), and the thread that called :meth:`Worker.run` (signals, shutdown).
All share the one store, whose calls are serialized; SQLite serializes writers anyway.

With one lane, a lane that stays busy uses the store's one-commit ``settle_and_claim`` cycle: the
settlement of the finished occurrence and the claim of the next one are one transaction. With
several, one cycle thread claims for every free lane at once and settles the finished runs in
groups together with those claims (:mod:`scheduler.worker.batching`): one commit for many runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, cast

from scheduler.contract.constants import MAX_LEASE_MS
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.worker_groups import GroupClaims, group_claims
from scheduler.store.capabilities.worker_reads import OccurrenceRuntime
from scheduler.store.plumbing.telemetry import describe, handler_timing, record_claim_latency
from scheduler.store.records import Job, Occurrence
from scheduler.worker.batching import CycleGroups, batching_store
from scheduler.worker.context import HandlerContext
from scheduler.worker.execution import (
    Abandoned,
    AsyncLoop,
    Handler,
    Settlement,
    call_handler,
    failed,
    handler_ran,
    succeeded,
    timed,
)
from scheduler.worker.lease_keeper import LEASE_LOST, STORAGE_UNAVAILABLE, STORE_CLOSED, Lease, LeaseKeeper
from scheduler.worker.periodic import MISSED_POLICIES, MissedTicks, PeriodicScheduler, PeriodicThread
from scheduler.worker.policy import Paused, PermanentError, RetryPolicy
from scheduler.worker.waker import IdleBackoff, ListenWaker, PollingWaker, Waker

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

log = logging.getLogger("scheduler.worker")

MAX_CONCURRENCY: Final = 1_000
CLAIM_CONFLICT: Final = "SCHEDULER_CLAIM_CONFLICT"
_CLAIM_CONFLICT_RETRIES: Final = 3
_SETTLE_RETRY_MAX_S: Final = 5.0
DEFAULT_SETTLE_BATCH_MS: Final = 20
MAX_SETTLE_BATCH_MS: Final = 1_000


def _positive_int(value: Any, name: str, maximum: int) -> int:
    if type(value) is not int or not 1 <= value <= maximum:
        raise invalid_argument(f"{name} must be an integer between 1 and {maximum}")
    return value


def default_owner_id() -> str:
    """``<host>:<pid>:<8 hex>``: unique per worker instance, readable in ``lease_owner``."""
    return f"{socket.gethostname()[:200]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _transient(error: SchedulerKernelError) -> bool:
    return error.code == STORAGE_UNAVAILABLE


def default_waker(store: Any) -> Waker:
    """``ListenWaker`` on PostgreSQL (woken by ``NOTIFY``), else ``PollingWaker`` (polling only)."""
    if isinstance(getattr(store, "wake_channel", None), str):
        return ListenWaker(store)
    return PollingWaker()


def _normalize_handlers(handlers: Any) -> dict[str, Handler]:
    if not isinstance(handlers, Mapping) or not handlers:
        raise invalid_argument("handlers must be a non-empty mapping of job kind to handler")
    normalized: dict[str, Handler] = {}
    for kind, handler in handlers.items():
        if not callable(handler):
            raise invalid_argument(f"handler for {kind!r} is not callable")
        normalized[normalize_key(kind, "jobKind", 128)] = handler
    return normalized


class Worker:
    """Runs handlers for the occurrences of the job kinds in ``handlers`` until stopped.

    Arguments (durations in milliseconds):

    * ``store`` — an open ``SchedulerStore`` (shared by the worker's threads).
    * ``handlers`` — ``{job kind: handler}``; a handler is ``(occurrence, ctx) -> result`` or an
      ``async def`` with the same arguments.
    * ``concurrency`` — how many occurrences run at once (lane threads; async handlers all run on
      one event loop). 1..1000.
    * ``lease_ms`` — lease per claim, renewed in the background every ``lease_ms / 3``.
    * ``retry`` — :class:`RetryPolicy` for retryable failures (default ``RetryPolicy()``).
    * ``owner_id`` — the lease owner recorded on claims (default ``<host>:<pid>:<random>``).
    * ``kinds`` — claim only these of the handled kinds (default: all of them).
    * ``shutdown_grace_ms`` — how long in-flight handlers may run after a stop request; the
      occurrences of those still running then are released (``store.release_lease``).
    * ``poll_min_ms`` / ``poll_max_ms`` — idle polling backoff (doubling, capped).
    * ``periodic`` — fire due periodic triggers of the handled kinds (default ``True``).
    * ``missed_ticks`` — ``"latest"`` (default) or ``"all"``; ``max_catch_up`` bounds ``"all"``.
    * ``pause_check_ms`` — ``ctx.checkpoint()`` asks the store for a pause request at most this often.
    * ``settle_batch_ms`` — with ``concurrency`` above 1, runs are claimed for every free lane in
      one transaction and finished runs are settled in groups, together with the next claims (one
      commit for many runs); a finished run waits at most this long for its group (default 20,
      0..1000; 0: settle what has finished at once). A run is settled only when its group commits.
    * ``waker`` — wakes idle lanes early (default: ``ListenWaker`` on PostgreSQL, woken by the
      store's ``NOTIFY``; in-process only on SQLite). ``run()`` starts and closes a waker that
      has ``start``/``close`` methods.

    Invalid arguments raise ``SCHEDULER_INVALID_ARGUMENT``.
    """

    def __init__(
        self,
        store: SchedulerStore,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 1,
        lease_ms: int = 30_000,
        retry: RetryPolicy | None = None,
        owner_id: str | None = None,
        kinds: Sequence[str] | None = None,
        shutdown_grace_ms: int = 30_000,
        poll_min_ms: int = 50,
        poll_max_ms: int = 2_000,
        periodic: bool = True,
        missed_ticks: MissedTicks = "latest",
        max_catch_up: int = 100,
        pause_check_ms: int = 1_000,
        settle_batch_ms: int = DEFAULT_SETTLE_BATCH_MS,
        waker: Waker | None = None,
    ) -> None:
        if not callable(getattr(store, "claim_next", None)):
            raise invalid_argument("store must be a SchedulerStore")
        self.store = store
        self.handlers = _normalize_handlers(handlers)
        self.concurrency = _positive_int(concurrency, "concurrency", MAX_CONCURRENCY)
        self.lease_ms = _positive_int(lease_ms, "lease_ms", MAX_LEASE_MS)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise invalid_argument("retry must be a RetryPolicy")
        self.retry = retry or RetryPolicy()
        self.owner_id = normalize_key(owner_id or default_owner_id(), "ownerId")
        self.kinds = self._select_kinds(kinds)
        self.shutdown_grace_ms = self._non_negative(shutdown_grace_ms, "shutdown_grace_ms")
        self._poll = (
            _positive_int(poll_min_ms, "poll_min_ms", 3_600_000),
            _positive_int(poll_max_ms, "poll_max_ms", 3_600_000),
        )
        if missed_ticks not in MISSED_POLICIES:
            raise invalid_argument("missed_ticks must be 'latest' or 'all'")
        self.periodic = bool(periodic)
        self._periodic = PeriodicScheduler(
            store,
            kinds=self.kinds,
            clock=self._now,
            missed=missed_ticks,
            max_catch_up=_positive_int(max_catch_up, "max_catch_up", 100_000),
            fires=self._fires_periodic,
        )
        self.pause_check_ms = self._non_negative(pause_check_ms, "pause_check_ms")
        self.settle_batch_ms = self._non_negative(settle_batch_ms, "settle_batch_ms")
        if self.settle_batch_ms > MAX_SETTLE_BATCH_MS:
            raise invalid_argument(f"settle_batch_ms must be an integer between 0 and {MAX_SETTLE_BATCH_MS}")
        self.waker: Waker = waker or default_waker(store)
        self._keeper = LeaseKeeper(store, self.lease_ms)
        self._loop = AsyncLoop()
        self._stopping = threading.Event()
        self._stop_deadline: float | None = None
        self._lock = threading.Lock()
        self._lanes: list[threading.Thread] = []
        self._groups: CycleGroups | None = None
        self._kind_rotation = 0
        self._kind_sequences = True
        """Whether the store's claims take a sequence of kinds (False: one claim per kind)."""

    @staticmethod
    def _non_negative(value: Any, name: str) -> int:
        if type(value) is not int or value < 0:
            raise invalid_argument(f"{name} must be an integer >= 0")
        return value

    def _select_kinds(self, kinds: Sequence[str] | None) -> list[str]:
        if kinds is None:
            return sorted(self.handlers)
        if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)) or not kinds:
            raise invalid_argument("kinds must be a non-empty list of handled job kinds")
        selected = list(dict.fromkeys(normalize_key(kind, "jobKind", 128) for kind in kinds))
        unknown = [kind for kind in selected if kind not in self.handlers]
        if unknown:
            raise invalid_argument("kinds without a handler", {"kinds": unknown})
        return selected

    def _now(self) -> int:
        return self.store.clock()

    # ------------------------------------------------------------------ lifecycle

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Work until :meth:`stop` (or SIGTERM/SIGINT when called in the main thread), then shut down:
        claim nothing more, let in-flight handlers finish within ``shutdown_grace_ms``, release
        what is still running (``store.release_lease``: its result is discarded), return."""
        previous = self._install_signals() if install_signal_handlers else {}
        ticker = PeriodicThread(self._periodic, self._now, self.waker.notify) if self.periodic else None
        log.info(
            "worker started: kinds %s, concurrency %d",
            ",".join(self.kinds),
            self.concurrency,
            extra={"owner": self.owner_id},
        )
        self._keeper.start()
        self._waker_call("start")
        if ticker is not None:
            ticker.start()
        batched = self.concurrency > 1 and batching_store(self.store)
        self._groups = CycleGroups(self, self.settle_batch_ms) if batched else None
        lane_target = self._lane if self._groups is None else self._groups.lane
        self._lanes = [
            threading.Thread(target=lane_target, name=f"scheduler-lane-{index}", daemon=True)
            for index in range(self.concurrency)
        ]
        for lane in self._lanes:
            lane.start()
        if self._groups is not None:
            self._lanes.insert(0, self._groups.start())  # joined first at shutdown
        try:
            while not self._stopping.wait(0.25):
                pass
        finally:
            if ticker is not None:
                ticker.stop()
            self._shutdown()
            self._waker_call("close")
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        log.info("worker stopped", extra={"owner": self.owner_id})

    def _waker_call(self, name: str) -> None:
        method = getattr(self.waker, name, None)
        if callable(method):
            method()

    def stop(self, *, grace_ms: int | None = None) -> None:
        """Ask :meth:`run` to stop (thread-safe; a second call may shorten the grace period)."""
        grace = self.shutdown_grace_ms if grace_ms is None else self._non_negative(grace_ms, "grace_ms")
        with self._lock:
            deadline = time.monotonic() + grace / 1000
            if self._stop_deadline is None or deadline < self._stop_deadline:
                self._stop_deadline = deadline
        if not self._stopping.is_set():
            log.info("worker stopping (grace %d ms)", grace, extra={"owner": self.owner_id})
        self._stopping.set()
        self.waker.notify()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            # The first signal starts a graceful shutdown; a second one ends the grace period.
            self.stop(grace_ms=0 if self._stopping.is_set() else None)

        return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _shutdown(self) -> None:
        deadline = self._stop_deadline or time.monotonic()
        for lane in self._lanes:
            while lane.is_alive():
                with self._lock:
                    deadline = self._stop_deadline or deadline
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                lane.join(timeout=min(remaining, 0.25))
        if self._groups is not None:  # settle the runs that finished, then release the others
            self._groups.finish(timeout_s=30)
        busy = self._keeper.held()
        if busy:
            log.warning("shutdown grace period over: releasing %d occurrence(s)", len(busy))
            for lease in busy:
                lease.abandoned = True
            self._loop.cancel_all()
            for lease in busy:
                self._keeper.give_back(lease, "shutdown grace period over")
        self._keeper.stop()
        self._loop.close()

    def run_until_idle(self) -> int:
        """Fire due periodic ticks, then claim and run occurrences on the calling thread until none
        is claimable now; return how many were run. For tests, scripts and batch jobs.

        A handler's ``SystemExit`` or ``KeyboardInterrupt`` fails its attempt like any exception,
        then is raised again here (nothing more is claimed), so Ctrl-C stops a script."""
        self._keeper.start()
        processed = 0
        try:
            if self.periodic:
                self._periodic.fire_due()
            occurrence = self._claim()
            while occurrence is not None:
                processed += 1
                occurrence = self._process(occurrence, claim_next=True, reraise=True)
        finally:
            self._keeper.stop()
        return processed

    def fire_due_triggers(self) -> list[Occurrence]:
        """One evaluation of the periodic triggers of the handled kinds (the occurrences created)."""
        return self._periodic.fire_due()

    # ------------------------------------------------------------------ lanes

    def _lane(self) -> None:
        backoff = IdleBackoff(*self._poll)
        occurrence: Occurrence | None = None
        while occurrence is not None or not self._stopping.is_set():
            if occurrence is None:
                occurrence = self._claim()
                if occurrence is None:
                    self.waker.wait(backoff.next_s())
                    continue
                backoff.reset()
            current = occurrence
            try:
                occurrence = self._process(current, claim_next=True)
            except Exception:  # never let a lane die: the lease expires and the occurrence is reclaimed
                log.exception("worker lane failed: %s", describe({"occurrence": current.id}))
                occurrence = None

    def _claim(self) -> Occurrence | None:
        """The next occurrence, or ``None`` (nothing claimable, or a failure already handled).

        ``SCHEDULER_CLAIM_CONFLICT`` (another worker changed the candidate meanwhile) means
        "try again": retried at once, a few times, then left to the next poll."""
        for _ in range(_CLAIM_CONFLICT_RETRIES):
            if self._stopping.is_set():
                return None
            try:
                return self._unless_stopping(self._claim_next())
            except SchedulerKernelError as error:
                if error.code == CLAIM_CONFLICT:
                    log.debug("claim conflict, trying again: %s", error.message)
                    continue
                if error.code == STORE_CLOSED:
                    self.stop(grace_ms=0)
                elif not _transient(error):
                    log.warning("claim failed: %s: %s", error.code, error.message)
                return None
        return None

    def _unless_stopping(self, claimed: Occurrence | None) -> Occurrence | None:
        """``claimed``, or ``None`` when a stop was requested while its claim was in flight: then
        it is released at once (never started, the attempt given back)."""
        if claimed is None or not self._stopping.is_set():
            return claimed
        self._keeper.give_back(Lease(claimed, self.owner_id, self.lease_ms), "claimed as the worker stopped")
        return None

    def _claim_next(self) -> Occurrence | None:
        """One claim over every handled kind (``job_kind`` as a sequence, API §5)."""
        kinds = self._claim_kinds()
        if isinstance(kinds, str) or self._kind_sequences:
            try:
                return self.store.claim_next(
                    owner_id=self.owner_id, lease_ms=self.lease_ms, job_kind=cast(Any, kinds)
                )
            except SchedulerKernelError as error:
                if isinstance(kinds, str) or error.code != "SCHEDULER_INVALID_ARGUMENT":
                    raise
                self._kind_sequences = False
        return self._claim_each_kind()

    def _claim_each_kind(self) -> Occurrence | None:
        """For a store whose ``claim_next`` takes one kind: try each kind, starting from a rotating one."""
        count = len(self.kinds)
        start, self._kind_rotation = self._kind_rotation, (self._kind_rotation + 1) % count
        for offset in range(count):
            kind = self.kinds[(start + offset) % count]
            claimed = self.store.claim_next(owner_id=self.owner_id, lease_ms=self.lease_ms, job_kind=kind)
            if claimed is not None:
                return claimed
        return None

    def _process(
        self, occurrence: Occurrence, *, claim_next: bool, reraise: bool = False
    ) -> Occurrence | None:
        """Run one claimed occurrence and settle it; return the next claimed one (busy cycle) or
        ``None``. ``reraise``: raise a handler's ``SystemExit``/``KeyboardInterrupt`` once settled."""
        lease, settlement = self._execute(occurrence)
        try:
            if settlement is None:
                return None
            interrupt = settlement.interrupt if reraise else None
            with handler_timing(lease.occurrence_id, settlement.duration_ms):  # on the settled records
                claimed = self._settle(lease, settlement, claim_next=claim_next and interrupt is None)
        finally:
            self._keeper.release(lease)
        if interrupt is not None:
            raise interrupt
        return claimed

    def _execute(
        self, occurrence: Occurrence, runtime: OccurrenceRuntime | None = None
    ) -> tuple[Lease, Settlement | None]:
        """Hold the lease of a claimed occurrence and run it: the lease (still held) and what to
        settle (``None``: nothing, e.g. paused, or released at shutdown). ``runtime``: its job
        kind and control as read in the claim's transaction (else read here)."""
        lease = self._keeper.hold(occurrence, self.owner_id, self.lease_ms)
        try:
            if self._past_deadline():  # claimed before the stop, held only after the grace period
                lease.abandoned = True
                self._keeper.give_back(lease, "shutdown grace period over")
                return lease, None
            return lease, self._run(lease, runtime)
        except BaseException:
            self._keeper.release(lease)
            raise

    def _run(self, lease: Lease, runtime: OccurrenceRuntime | None = None) -> Settlement | None:
        occurrence = lease.occurrence
        if runtime is None:
            runtime = self._with_retries(lambda: self.store.get_occurrence_runtime(occurrence.id), lease)
        if runtime is None:
            return None
        lease.kind = runtime.job_kind
        record_claim_latency(occurrence, runtime.job_kind)
        handler = self.handlers.get(runtime.job_kind)
        if handler is None:  # the job's kind changed after the claim
            error = PermanentError(f"no handler for job kind {runtime.job_kind!r}", code="HANDLER_NOT_FOUND")
            return failed(error)
        ctx = HandlerContext(
            store=self.store,
            lease=lease,
            keeper=self._keeper,
            kind=runtime.job_kind,
            control=runtime.control,
            pause_check_ms=self.pause_check_ms,
        )
        started = time.perf_counter()
        try:
            ctx.pause_before_execute()
            value = call_handler(handler, occurrence, ctx, self._loop)
        except Paused:
            lease.parked = True
            handler_ran(runtime.job_kind, started, "paused")
            return None
        except Abandoned as abandoned:
            if not lease.settleable:  # cancelled at shutdown: released there
                handler_ran(runtime.job_kind, started, "abandoned")
                return None
            return self._handler_failed(abandoned.__cause__ or abandoned, lease, started)
        except BaseException as error:  # SystemExit, KeyboardInterrupt, ... fail the attempt too
            return self._handler_failed(error, lease, started)
        if lease.parked:  # the handler swallowed ``Paused``
            handler_ran(runtime.job_kind, started, "paused")
            return None
        return timed(succeeded(value), runtime.job_kind, started)

    @staticmethod
    def _handler_failed(error: BaseException, lease: Lease, started: float) -> Settlement:
        settlement = timed(failed(error), lease.kind or "", started)
        name = type(error).__qualname__
        lease.log(
            log,
            logging.WARNING,
            "handler failed: %s",
            name,
            exc_info=error,
            duration_ms=settlement.duration_ms,
        )
        return settlement

    def _retry_at(self, lease: Lease) -> int:
        return self._now() + self.retry.delay_ms(lease.occurrence.attempt)

    def _settle_arguments(self, lease: Lease, settlement: Settlement) -> dict[str, Any]:
        """The keyword arguments of ``store.settle`` for ``settlement`` of ``lease``."""
        arguments: dict[str, Any] = {
            "occurrence_id": lease.occurrence_id,
            "owner_id": lease.owner_id,
            "fence": lease.fence,
            **settlement.arguments(),
        }
        if settlement.outcome == "failed" and settlement.retryable:
            arguments["retry_at"] = self._retry_at(lease)
        return arguments

    def _settle(self, lease: Lease, settlement: Settlement, *, claim_next: bool) -> Occurrence | None:
        arguments = self._settle_arguments(lease, settlement)
        delay, uncertain = 0.05, False
        while True:
            if not lease.settleable:
                self._log_abandoned(lease)
                return None
            try:
                return self._settle_once(arguments, claim_next)
            except SchedulerKernelError as error:
                if error.code == LEASE_LOST:
                    if not (uncertain and self._settled_by_us(lease)):
                        lease.lost = True
                        self._log_abandoned(lease)
                    return None
                if claim_next and not _transient(error):
                    claim_next = False  # the claim half failed the cycle: settle alone
                    continue
                if not _transient(error) or self._past_deadline():
                    lease.log(log, logging.ERROR, "settle failed: %s: %s", error.code, error.message)
                    return None
                uncertain = uncertain or (error.details or {}).get("commitState") == "unknown"
                time.sleep(delay)
                delay = min(_SETTLE_RETRY_MAX_S, delay * 2)

    def _settled_by_us(self, lease: Lease) -> bool:
        """After a settlement whose commit was unknown: did it commit (our fence, no longer running)?"""
        try:
            current = self.store.get_occurrence(lease.occurrence_id)
        except SchedulerKernelError:
            return False
        return current is not None and current.fence == lease.fence and current.status != "running"

    def _settle_once(self, arguments: dict[str, Any], claim_next: bool) -> Occurrence | None:
        """Settle; with ``claim_next`` and no stop requested by now, claim the next one in the same commit."""
        claim_next = claim_next and not self._stopping.is_set()
        settle_and_claim = getattr(self.store, "settle_and_claim", None)
        if claim_next and settle_and_claim is not None and self._kind_sequences:
            cycle = settle_and_claim(**arguments, lease_ms=self.lease_ms, job_kind=self._claim_kinds())
            return self._unless_stopping(cycle.claimed)
        self.store.settle(**arguments)
        return self._claim() if claim_next else None

    def _group_claims(self) -> GroupClaims:
        """What the batched cycles claim for the free lanes (``claim_batch`` of every handled kind)."""
        return group_claims(self.owner_id, self.lease_ms, [(self._claim_kinds(), None)])

    def _after_settle(self) -> None:
        """Called after a group of batched cycles settled (the Tasks worker wakes result waiters)."""

    def _fires_periodic(self, job: Job) -> bool:
        """Whether this worker fires the ticks of ``job``, a periodic job of a kind it handles
        (every such job: its kind's handler runs it)."""
        return True

    def _claim_kinds(self) -> str | tuple[str, ...]:
        return self.kinds[0] if len(self.kinds) == 1 else tuple(self.kinds)

    def _past_deadline(self) -> bool:
        deadline = self._stop_deadline
        return deadline is not None and time.monotonic() > deadline

    def _log_abandoned(self, lease: Lease) -> None:
        reason = "lease lost" if lease.lost else "paused" if lease.parked else "shutdown grace period over"
        lease.log(log, logging.WARNING, "result not settled (%s)", reason)

    def _with_retries(self, read: Callable[[], Any], lease: Lease) -> Any:
        delay = 0.05
        while True:
            try:
                return read()
            except SchedulerKernelError as error:
                if not _transient(error) or not lease.settleable or self._past_deadline():
                    lease.log(log, logging.ERROR, "could not read the claimed occurrence: %s", error.code)
                    return None
                time.sleep(delay)
                delay = min(_SETTLE_RETRY_MAX_S, delay * 2)
