"""Batched worker cycles: a worker with several lanes claims and settles in groups.

One thread (the cycle thread) makes every claim and settlement of the worker's lanes. A lane takes
a claimed occurrence from the work queue, runs it and hands its settlement back; the cycle thread
gathers the settlements of the runs that finished and settles them together with the claims for the
free lanes, in ONE store call and transaction (``commit_group``: the settlements, then the worker's
claims, then the claimed runs' job kinds and controls; one commit for many runs, no savepoint per
operation). A finished run waits for its group at most ``settle_batch_ms`` (at once when no other
run is still going: nothing more would join the group).

What does not change: a settlement is acknowledged only by the commit of its group (the lease stays
held and renewed until then); a member whose settlement meets ``SCHEDULER_LEASE_LOST`` (cancelled,
reclaimed) is dropped and the group retried without it (the call is all-or-nothing), so the
others' settlements are never lost; claims follow the store's order, never exceed the free lanes,
and stop with a stop request (a claim that raced the request is released at once).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.capabilities.worker_groups import CommittedGroup, commit_group, runs_groups
from scheduler.store.capabilities.worker_reads import OccurrenceRuntime
from scheduler.store.plumbing.telemetry import describe, handler_timings
from scheduler.store.records import Occurrence
from scheduler.worker.execution import Settlement
from scheduler.worker.lease_keeper import LEASE_LOST, STORAGE_UNAVAILABLE, STORE_CLOSED, Lease
from scheduler.worker.waker import IdleBackoff

if TYPE_CHECKING:
    from scheduler.worker.runtime import Worker

log = logging.getLogger("scheduler.worker")

CLAIM_CONFLICT: Final = "SCHEDULER_CLAIM_CONFLICT"
_CLAIM_CONFLICT_RETRIES: Final = 3
_RETRY_MAX_S: Final = 5.0


Claimed = tuple[Occurrence, OccurrenceRuntime | None]
"""A claimed run and its job kind and control, read in the claim's transaction."""


@dataclass(frozen=True, slots=True)
class Finished:
    """A run whose handler ended, with what to settle for it."""

    lease: Lease
    settlement: Settlement
    arguments: dict[str, Any]


def batching_store(store: Any) -> bool:
    """Whether ``store`` has what batched cycles need (a ``SchedulerStore`` has)."""
    return runs_groups(store)


class CycleGroups:
    """The cycle thread of a worker with batched cycles, and the lanes' side of it."""

    def __init__(self, worker: Worker, settle_batch_ms: int) -> None:
        self._worker = worker
        self._claims = worker._group_claims()
        self._wait_s = settle_batch_ms / 1000
        self._work: queue.SimpleQueue[Claimed | None] = queue.SimpleQueue()
        self._condition = threading.Condition()
        self._pending: list[Finished] = []
        self._first_pending_at = 0.0
        self._running = 0
        self._finished = 0
        """Runs finished so far (tells a lane's wake-up from a wake-up for new work)."""
        self._claim_soon = False
        self._finish_now = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lanes

    def lane(self) -> None:
        """A lane: run what the cycle thread hands over until it says stop (``None``)."""
        worker = self._worker
        while True:
            item = self._work.get()
            if item is None:
                return
            occurrence, runtime = item
            lease: Lease | None = None
            settlement: Settlement | None = None
            try:
                lease, settlement = worker._execute(occurrence, runtime)
            except Exception:  # never let a lane die: the lease expires and the occurrence is reclaimed
                log.exception("worker lane failed: %s", describe({"occurrence": occurrence.id}))
            self._done(lease, settlement)

    def _done(self, lease: Lease | None, settlement: Settlement | None) -> None:
        worker = self._worker
        finished = None
        if lease is not None and settlement is not None:
            finished = Finished(lease, settlement, worker._settle_arguments(lease, settlement))
        elif lease is not None:
            worker._keeper.release(lease)
        with self._condition:
            self._running -= 1
            self._finished += 1
            if finished is None:
                self._claim_soon = True  # its lane is free and nothing joins a group for it
            else:
                if not self._pending:
                    self._first_pending_at = time.monotonic()
                self._pending.append(finished)
        worker.waker.notify()

    # ------------------------------------------------------------------ the cycle thread

    def start(self) -> threading.Thread:
        self._finish_now.clear()
        self._thread = threading.Thread(target=self._serve, name="scheduler-cycles", daemon=True)
        self._thread.start()
        return self._thread

    def finish(self, timeout_s: float) -> None:
        """Settle what has finished now, claim nothing more, end the cycle thread (at shutdown)."""
        self._finish_now.set()
        self._worker.waker.notify()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout_s)

    def _serve(self) -> None:
        try:
            self._loop()
        except Exception:  # the leases of what it held expire; the worker's shutdown releases them
            log.exception("worker cycle thread failed")
            self._worker.stop(grace_ms=0)
        finally:
            for _ in range(self._worker.concurrency):
                self._work.put(None)

    def _loop(self) -> None:
        worker = self._worker
        backoff = IdleBackoff(*worker._poll)
        poll_at = 0.0
        while True:
            generation = getattr(worker.waker, "generation", None)
            with self._condition:
                pending, running, finished = bool(self._pending), self._running, self._finished
                first_at, claim_soon = self._first_pending_at, self._claim_soon
                self._claim_soon = False
            if claim_soon:
                poll_at = 0.0
            stopping = worker._stopping.is_set()
            if stopping and (running == 0 or self._finish_now.is_set() or worker._past_deadline()):
                if pending:
                    self._cycle(0)
                    continue  # settle what finished meanwhile too before leaving
                return
            now = time.monotonic()
            free = worker.concurrency - running
            flush_at = (now if running == 0 else first_at + self._wait_s) if pending else None
            # With runs waiting for their group, the claims go with it (at flush_at): one commit.
            claim_at = None if stopping or free == 0 or pending else poll_at
            due = min((at for at in (flush_at, claim_at) if at is not None), default=None)
            if due is not None and due <= now:
                claims = 0 if stopping else free
                claimed = self._cycle(claims)
                if claims:
                    if len(claimed) < claims:
                        poll_at = time.monotonic() + backoff.next_s()
                    else:
                        backoff.reset()
                        poll_at = 0.0
                continue
            timeout = 1.0 if due is None else due - now
            if stopping:
                timeout = min(timeout, 0.25)  # the deadline is looked at again
            if generation is None and running:
                timeout = min(timeout, self._wait_s or 0.005)  # a waker that may miss a lane's wake-up
            woken = self._wait(timeout, generation)
            with self._condition:
                external = woken and self._finished == finished
            if external:  # new work (NOTIFY, a periodic tick) or a stop
                poll_at = 0.0

    def _wait(self, timeout_s: float, generation: int | None) -> bool:
        waker: Any = self._worker.waker
        if generation is None:
            return bool(waker.wait(timeout_s))
        return bool(waker.wait(timeout_s, since=generation))

    def _take_pending(self) -> list[Finished]:
        with self._condition:
            taken, self._pending = self._pending, []
        return taken

    def _cycle(self, claims: int) -> list[Occurrence]:
        """One group: the settlements that finished, then up to ``claims`` claims; one commit.
        The claimed runs are handed to the lanes; returns them."""
        worker = self._worker
        members = self._take_pending()
        claimed, runtimes = self._commit(members, claims)
        if members:
            worker._after_settle()
        if claimed and worker._stopping.is_set():  # claimed as the stop request came: give back
            for occurrence in claimed:
                worker._keeper.give_back(
                    Lease(occurrence, worker.owner_id, worker.lease_ms), "claimed as the worker stopped"
                )
            return []
        with self._condition:
            self._running += len(claimed)
        for occurrence in claimed:
            self._work.put((occurrence, runtimes.get(occurrence.id)))
        return claimed

    def _commit(
        self, members: list[Finished], claims: int
    ) -> tuple[list[Occurrence], dict[str, OccurrenceRuntime]]:
        """Settle ``members`` and claim in one store call (``commit_group``: one transaction, the
        claimed runs' job kinds and controls read there too), retrying without what cannot be
        settled; every member's lease is let go of once it is settled or given up."""
        worker = self._worker
        retry = _Retry(worker._past_deadline)
        conflicts = 0
        try:
            while True:
                members = [member for member in members if self._settleable(member)]
                if not members and not claims:
                    return [], {}
                with handler_timings(_durations(members)):
                    done = commit_group(
                        worker.store, [member.arguments for member in members], self._claims, claims
                    )
                if isinstance(done, CommittedGroup):
                    return done.claimed, done.runtimes
                error, settling = done.error, done.in_settlements
                index = (error.details or {}).get("index") if settling else None
                member = members[index] if isinstance(index, int) and 0 <= index < len(members) else None
                if error.code == LEASE_LOST and member is not None:
                    self._lost(member, retry.uncertain)
                    members.remove(member)
                elif error.code == STORE_CLOSED:
                    worker.stop(grace_ms=0)
                    self._give_up(members, error)
                    return [], {}
                elif error.code == CLAIM_CONFLICT and conflicts < _CLAIM_CONFLICT_RETRIES:
                    conflicts += 1
                    log.debug("claim conflict, trying again: %s", error.message)
                elif error.code != STORAGE_UNAVAILABLE and claims and not settling:
                    log.warning("claim failed: %s: %s", error.code, error.message)
                    claims = 0  # the claim half failed the group: settle alone
                elif error.code != STORAGE_UNAVAILABLE and member is not None:
                    self._give_up([member], error)
                    members.remove(member)
                elif error.code != STORAGE_UNAVAILABLE or not retry.again(error):
                    self._give_up(members, error)
                    return [], {}
        finally:
            for member in members:
                worker._keeper.release(member.lease)

    def _settleable(self, member: Finished) -> bool:
        if member.lease.settleable:
            return True
        self._worker._log_abandoned(member.lease)
        self._worker._keeper.release(member.lease)
        return False

    def _lost(self, member: Finished, uncertain: bool) -> None:
        lease = member.lease
        if not (uncertain and self._worker._settled_by_us(lease)):
            lease.lost = True
            self._worker._log_abandoned(lease)
        self._worker._keeper.release(lease)

    def _give_up(self, members: list[Finished], error: SchedulerKernelError) -> None:
        for member in members:
            member.lease.log(log, logging.ERROR, "settle failed: %s: %s", error.code, error.message)
            self._worker._keeper.release(member.lease)
        members.clear()


def _durations(members: list[Finished]) -> dict[str, float]:
    return {
        member.lease.occurrence_id: member.settlement.duration_ms
        for member in members
        if member.settlement.duration_ms is not None
    }


class _Retry:
    """Backoff between the tries of a group after a transient storage failure."""

    def __init__(self, past_deadline: Callable[[], bool]) -> None:
        self._past_deadline = past_deadline
        self._delay = 0.05
        self.uncertain = False
        """A try's commit may have happened (``commitState: unknown``)."""

    def again(self, error: SchedulerKernelError) -> bool:
        if self._past_deadline():
            return False
        self.uncertain = self.uncertain or (error.details or {}).get("commitState") == "unknown"
        time.sleep(self._delay)
        self._delay = min(_RETRY_MAX_S, self._delay * 2)
        return True
