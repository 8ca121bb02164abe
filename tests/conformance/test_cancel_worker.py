"""What a worker's handler sees when its run is cancelled (API §12), on both backends (``place``):
a queued run never starts; a running one is told through ``ctx.should_stop`` at its next lease
renewal (or ``ctx.renew()`` raises ``SCHEDULER_LEASE_LOST``), and its late result is discarded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from store_places import StorePlace

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.worker import Worker

AUTHORITY = {"principal": {"type": "service", "id": "cancel-tests"}}
CANCELLED = {"code": "CANCELLED", "message": "operator"}


@pytest.fixture
def stores(place: StorePlace) -> Iterator[tuple[SchedulerStore, SchedulerStore]]:
    """The worker's store and an operator's (another connection)."""
    worker_store, operator = place.open(), place.open()
    worker_store.create_job(id="long", kind="long", authority=AUTHORITY, max_attempts=3)
    yield worker_store, operator
    worker_store.close()
    operator.close()


def _enqueue(store: SchedulerStore, key: str) -> str:
    return store.enqueue_occurrence(job_id="long", scheduled_for=0, trigger_key=key).id


def _types(store: SchedulerStore, occurrence_id: str) -> list[str]:
    return [event.type for event in reversed(store.history(occurrence_id=occurrence_id))]


def test_a_queued_run_that_is_cancelled_never_starts(stores: tuple[SchedulerStore, SchedulerStore]) -> None:
    store, operator = stores
    started: list[str] = []
    occurrence_id = _enqueue(store, "q")
    operator.cancel_occurrence(occurrence_id=occurrence_id)
    worker = Worker(store, {"long": lambda occurrence, ctx: started.append(occurrence.id)}, periodic=False)
    assert worker.run_until_idle() == 0
    assert started == []
    assert _types(store, occurrence_id) == [
        "occurrence_enqueued",
        "occurrence_cancelled",
        "occurrence_dead_lettered",
    ]


def test_a_running_handler_is_told_at_its_next_renewal_and_its_result_is_discarded(
    stores: tuple[SchedulerStore, SchedulerStore],
) -> None:
    store, operator = stores
    occurrence_id = _enqueue(store, "r")
    seen: dict[str, Any] = {}

    def handler(occurrence: Any, ctx: Any) -> dict[str, bool]:
        operator.cancel_occurrence(occurrence_id=occurrence.id, reason="operator")
        seen["at once"] = ctx.should_stop  # not yet: the worker learns it from a renewal
        deadline = time.monotonic() + 10
        while not ctx.should_stop and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["later"] = ctx.should_stop
        return {"late": True}

    worker = Worker(store, {"long": handler}, lease_ms=300, periodic=False)  # renewed every 100 ms
    assert worker.run_until_idle() == 1
    assert seen == {"at once": False, "later": True}
    final = store.get_occurrence(occurrence_id)
    assert final is not None
    assert (final.status, final.fence, final.last_error, final.result) == ("dead_letter", 2, CANCELLED, None)
    assert "occurrence_succeeded" not in _types(store, occurrence_id)


def test_ctx_renew_raises_lease_lost_after_a_cancel(stores: tuple[SchedulerStore, SchedulerStore]) -> None:
    store, operator = stores
    occurrence_id = _enqueue(store, "n")
    seen: dict[str, Any] = {}

    def handler(occurrence: Any, ctx: Any) -> str:
        operator.cancel_occurrence(occurrence_id=occurrence.id, reason="operator")
        try:
            ctx.renew()
        except SchedulerKernelError as error:
            seen["code"] = error.code
        seen["should_stop"] = ctx.should_stop
        return "ignored"

    worker = Worker(store, {"long": handler}, lease_ms=60_000, periodic=False)
    assert worker.run_until_idle() == 1
    assert seen == {"code": "SCHEDULER_LEASE_LOST", "should_stop": True}
    final = store.get_occurrence(occurrence_id)
    assert final is not None and (final.status, final.result) == ("dead_letter", None)
