"""Cancel racing settle (API §12): 8 connections, one running occurrence, exactly one wins.

On both backends (``place``). Each round claims one occurrence, then 8 threads, each with a store
of its own (its own connection), start together: 4 cancel it and 4 settle it with the owner's
right fence. Whichever commits first wins; every loser gets its documented answer: a settle after
a cancel ``SCHEDULER_LEASE_LOST``, a cancel after a settle ``SCHEDULER_CONFLICT``, a cancel after
a cancel the cancelled occurrence unchanged, a settle after a settle ``SCHEDULER_LEASE_LOST``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from store_places import StorePlace

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.store.records import Occurrence

ROUNDS = 20
CANCELLERS = 4
SETTLERS = 4
HEAD_START_S = 0.005
AUTHORITY = {"principal": {"type": "service", "id": "race"}, "requestedCapabilities": ["race.run"]}


def _race(
    calls: list[Callable[[], Occurrence]], delays: list[float]
) -> list[Occurrence | SchedulerKernelError]:
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        if delays[index]:
            time.sleep(delays[index])
        try:
            results[index] = calls[index]()
        except SchedulerKernelError as error:
            results[index] = error
        except BaseException as error:  # surfaced by the assertions below
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def _code(result: Any) -> str:
    if isinstance(result, SchedulerKernelError):
        return result.code
    if isinstance(result, Occurrence):
        return f"ok:{result.status}"
    return f"unexpected:{result!r}"


def _settle(store: SchedulerStore, occurrence_id: str) -> Occurrence:
    return store.settle(
        occurrence_id=occurrence_id, owner_id="w1", fence=1, outcome="succeeded", result={"r": 1}
    )


def _settle_and_claim(store: SchedulerStore, occurrence_id: str) -> Occurrence:
    """The worker's cycle (one statement on PostgreSQL when the queue is quiet)."""
    cycle = store.settle_and_claim(
        occurrence_id=occurrence_id,
        owner_id="w1",
        fence=1,
        outcome="succeeded",
        result={"r": 1},
        lease_ms=60_000,
    )
    assert cycle.claimed is None
    return cycle.settled


@pytest.mark.parametrize("settle", [_settle, _settle_and_claim], ids=["settle", "settle_and_claim"])
def test_cancel_racing_settle_has_exactly_one_winner(
    place: StorePlace, settle: Callable[[SchedulerStore, str], Occurrence]
) -> None:
    main = place.open()
    stores: list[SchedulerStore] = [place.open() for _ in range(CANCELLERS + SETTLERS)]
    wins: Counter[str] = Counter()
    started = time.perf_counter()
    try:
        main.create_job(id="race", kind="race", authority=AUTHORITY, max_attempts=3)
        for round_number in range(ROUNDS):
            queued = main.enqueue_occurrence(
                job_id="race", scheduled_for=0, trigger_key=f"round-{round_number}"
            )
            running = main.claim_occurrence(occurrence_id=queued.id, owner_id="w1", lease_ms=600_000)
            assert running is not None and running.fence == 1
            calls: list[Callable[[], Occurrence]] = [
                lambda store=store, target=queued.id: store.cancel_occurrence(
                    occurrence_id=target, reason="race"
                )
                for store in stores[:CANCELLERS]
            ] + [lambda store=store, target=queued.id: settle(store, target) for store in stores[CANCELLERS:]]
            # A third of the rounds race evenly; the others give one side a head start of a few
            # ms, so that both outcomes are exercised on every run (the other side still races).
            late = ("none", "settle", "cancel")[round_number % 3]
            delays = [HEAD_START_S if late == "cancel" else 0.0] * CANCELLERS + [
                HEAD_START_S if late == "settle" else 0.0
            ] * SETTLERS
            results = _race(calls, delays)
            cancels = Counter(_code(result) for result in results[:CANCELLERS])
            settles = Counter(_code(result) for result in results[CANCELLERS:])
            final = main.get_occurrence(queued.id)
            assert final is not None
            types = Counter(event.type for event in main.history(occurrence_id=queued.id))
            if final.status == "succeeded":
                wins["settle"] += 1
                assert settles == {"ok:succeeded": 1, "SCHEDULER_LEASE_LOST": SETTLERS - 1}, settles
                assert cancels == {"SCHEDULER_CONFLICT": CANCELLERS}, cancels
                assert (types["occurrence_succeeded"], types["occurrence_cancelled"]) == (1, 0)
                assert final.fence == 1
            else:
                wins["cancel"] += 1
                assert settles == {"SCHEDULER_LEASE_LOST": SETTLERS}, settles
                assert cancels == {"ok:dead_letter": CANCELLERS}, cancels
                assert all(result == final for result in results[:CANCELLERS])
                assert (types["occurrence_succeeded"], types["occurrence_cancelled"]) == (0, 1)
                assert types["occurrence_dead_lettered"] == 1
                assert (final.status, final.fence, final.last_error) == (
                    "dead_letter",
                    2,
                    {"code": "CANCELLED", "message": "race"},
                )
    finally:
        for store in stores:
            store.close()
        main.close()
    elapsed = time.perf_counter() - started
    assert sum(wins.values()) == ROUNDS
    assert wins["settle"] >= 1 and wins["cancel"] >= 1, wins
    figures = f"{ROUNDS} rounds x 8 connections: {dict(wins)} in {elapsed:.2f} s"
    print(f"\n{place.backend} {settle.__name__}: {figures}")
