"""Threads calling one shared store at random while one of them closes it (issue 15, item 1).

Each round opens the store, starts worker threads that call writes, reads, batches and
transaction() blocks at random, and closes the store from one of them at a random moment. Checks:
the process survives (no freed connection under a running statement), every failure is
SCHEDULER_STORE_CLOSED (no bare driver error, no other code), close() never raises, every
acknowledged write is in the file, nothing is half-committed (every invariant of
``invariants.py``, e.g. each occurrence has its enqueue event), and after close only the main
file remains.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from scheduler import SchedulerKernelError, SchedulerStore, open_store

from .conftest import T0, Scale
from .invariants import CLAIM_EVENTS, SETTLE_EVENTS, assert_invariants, dump_database, quick_check

pytestmark = pytest.mark.reliability

WORKERS = 6
CALLS_PER_WORKER = 40
AUTHORITY = {"principal": {"type": "user", "id": "user-stress"}, "requestedCapabilities": ["x.run"]}


class Worker:
    """One thread's calls, what they acknowledged, and any unexpected failure."""

    def __init__(self, store: SchedulerStore, rng: random.Random, name: str, close_at: int | None) -> None:
        self.store = store
        self.rng = rng
        self.name = name
        self.close_at = close_at
        self.held: list[Any] = []
        self.acks: list[tuple[str, str, int]] = []  # (event kind, occurrence id, fence)
        self.unexpected: list[BaseException] = []
        self.calls: Counter[str] = Counter()
        self.closed_seen = False

    def run(self) -> None:
        for index in range(CALLS_PER_WORKER):
            if index == self.close_at:
                try:
                    self.store.close()
                except BaseException as error:
                    self.unexpected.append(error)
                self.calls["close"] += 1
            operation = self.rng.choice(OPERATIONS)
            try:
                operation(self)
                self.calls[operation.__name__] += 1
            except SchedulerKernelError as error:
                if error.code != "SCHEDULER_STORE_CLOSED":
                    self.unexpected.append(error)
                self.closed_seen = True
                return
            except BaseException as error:
                self.unexpected.append(error)
                return

    def enqueued(self, occurrences: list[Any]) -> None:
        self.acks.extend(("enqueue", o.id, 0) for o in occurrences if not o.deduplicated)

    def claimed(self, occurrences: list[Any]) -> None:
        self.held.extend(occurrences)
        self.acks.extend(("claim", o.id, o.fence) for o in occurrences)

    def settled(self, occurrences: list[Any]) -> None:
        self.acks.extend(("settle", o.id, o.fence) for o in occurrences)


def _key(worker: Worker) -> str:
    return f"{worker.name}-{worker.rng.randrange(10**9)}"


def enqueue(worker: Worker) -> None:
    occurrence = worker.store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key=_key(worker))
    worker.enqueued([occurrence])


def enqueue_many(worker: Worker) -> None:
    requests = [
        {"job_id": "job-a", "scheduled_for": T0, "trigger_key": _key(worker)}
        for _ in range(worker.rng.randint(2, 20))
    ]
    worker.enqueued(worker.store.enqueue_many(requests))


def claim_next(worker: Worker) -> None:
    claimed = worker.store.claim_next(owner_id=worker.name, lease_ms=600_000)
    worker.claimed([] if claimed is None else [claimed])


def claim_batch(worker: Worker) -> None:
    worker.claimed(
        worker.store.claim_batch(owner_id=worker.name, lease_ms=600_000, limit=worker.rng.randint(2, 6))
    )


def settle(worker: Worker) -> None:
    if worker.held:
        held = worker.held.pop()
        outcome = worker.rng.choice(["succeeded", "failed"])
        worker.settled(
            [
                worker.store.settle(
                    occurrence_id=held.id, owner_id=worker.name, fence=held.fence, outcome=outcome
                )
            ]
        )


def settle_many(worker: Worker) -> None:
    batch, worker.held[:] = worker.held[:4], worker.held[4:]
    if batch:
        settlements = [
            {"occurrence_id": o.id, "owner_id": worker.name, "fence": o.fence, "outcome": "succeeded"}
            for o in batch
        ]
        worker.settled(worker.store.settle_many(settlements))


def renew(worker: Worker) -> None:
    if worker.held:
        held = worker.held[-1]
        worker.store.renew(occurrence_id=held.id, owner_id=worker.name, fence=held.fence, lease_ms=600_000)


def block(worker: Worker) -> None:
    with worker.store.transaction() as tx:
        occurrence = tx.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key=_key(worker))
        claimed = tx.claim_occurrence(occurrence_id=occurrence.id, owner_id=worker.name, lease_ms=600_000)
    worker.enqueued([occurrence])
    worker.claimed([] if claimed is None else [claimed])


def read(worker: Worker) -> None:
    worker.store.history(limit=5)
    worker.store.list_dead_letters(limit=5)
    if worker.held:
        worker.store.get_occurrence(worker.held[0].id)


OPERATIONS = [enqueue, enqueue_many, claim_next, claim_batch, settle, settle_many, renew, block, read, read]


def _missing_acks(path: Path, acks: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    events = dump_database(path)["events"]
    present = set()
    for event in events:
        kind = (
            "enqueue"
            if event["event_type"] == "occurrence_enqueued"
            else "claim"
            if event["event_type"] in CLAIM_EVENTS
            else "settle"
            if event["event_type"] in SETTLE_EVENTS
            else None
        )
        if kind is not None:
            present.add((kind, event["occurrence_id"], 0 if kind == "enqueue" else event["fence"]))
    return [ack for ack in acks if ack not in present]


def test_threads_calling_and_closing_a_shared_store(
    tmp_path: Path, scale: Scale, seed: int, figures: dict[str, Any]
) -> None:
    rng = random.Random(seed)
    path = tmp_path / "threads.sqlite"
    with open_store(path, clock=lambda: T0) as store:
        store.create_job(id="job-a", kind="stress", authority=AUTHORITY)
    totals: Counter[str] = Counter()
    acknowledged = 0
    started = time.monotonic()
    for round_number in range(scale.thread_rounds):
        ticks = itertools.count(T0 + (round_number + 1) * 10_000_000)
        store = open_store(path, clock=lambda ticks=ticks: next(ticks))
        closer = rng.randrange(WORKERS)
        workers = [
            Worker(
                store,
                random.Random(rng.randrange(2**32)),
                f"r{round_number}w{index}",
                rng.randrange(CALLS_PER_WORKER) if index == closer else None,
            )
            for index in range(WORKERS)
        ]
        threads = [threading.Thread(target=worker.run) for worker in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive(), "a worker is stuck"
        store.close()  # idempotent, and never a driver error
        leftovers = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "-"))
        assert leftovers == [], f"round {round_number}: {leftovers}"
        for worker in workers:
            assert not worker.unexpected, f"round {round_number} {worker.name}: {worker.unexpected!r}"
            totals.update(worker.calls)
            totals["refused_after_close"] += worker.closed_seen
        acks = [ack for worker in workers for ack in worker.acks]
        acknowledged += len(acks)
        assert _missing_acks(path, acks) == [], f"round {round_number}: acknowledged writes lost"
        assert quick_check(path) == ["ok"]
        assert_invariants(dump_database(path), f"round {round_number}")
    figures["threads_and_close"] = {
        "rounds": scale.thread_rounds,
        "workers": WORKERS,
        "acknowledged_writes_checked": acknowledged,
        "calls": dict(sorted(totals.items())),
        "seconds": round(time.monotonic() - started, 1),
    }
