"""Result waiters on PostgreSQL (API §10): which transactions of a ``Tasks`` store NOTIFY the
settle channel, and which the work channel. (What a waiter sees on both backends:
``tests/conformance/test_tasks_results.py``.)
"""

from __future__ import annotations

from typing import Any

from backends import PostgresServer
from test_worker_listen import Listener

from scheduler import SchedulerStore, open_store
from scheduler.store.capabilities.queues import notify_settlements
from tests.worker_support import add_job, enqueue


def test_a_tasks_store_notifies_the_settle_channel_once_per_transaction(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    """Only PostgreSQL has NOTIFY. A store of the Tasks layer notifies when a run ends; the
    kernel's own stores do not; a transaction that also made work claimable notifies the work
    channel only (result waiters listen on both)."""
    kernel = open_store(postgres_server.engine, schema=pg_schema)
    store = open_store(postgres_server.engine, schema=pg_schema)
    channel = notify_settlements(store)
    assert channel == f"scheduler_done.{pg_schema}" and kernel.wake_channel is not None
    work, done = Listener(postgres_server, kernel.wake_channel), Listener(postgres_server, channel)
    try:
        add_job(kernel, "job", max_attempts=1)
        for key in ("a", "b", "c", "d", "e"):
            enqueue(kernel, "job", key)
        assert (work.received(), done.received()) == (5, 0)

        def settle(on: SchedulerStore, occurrence: Any, **options: Any) -> Any:
            return on.settle(occurrence_id=occurrence.id, owner_id="w", fence=occurrence.fence, **options)

        settle(kernel, kernel.claim_next(owner_id="w", lease_ms=30_000), outcome="succeeded")
        assert (work.received(), done.received()) == (0, 0)  # the kernel's stores: as before
        claimed = store.claim_next(owner_id="w", lease_ms=30_000)
        cycle = store.settle_and_claim(
            occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded", lease_ms=30_000
        )
        assert (work.received(), done.received()) == (0, 1)  # the one-commit cycle too
        settle(store, cycle.claimed, outcome="failed", error={"code": "X", "message": "x"})  # dead letter
        assert (work.received(), done.received()) == (0, 1)
        with store.transaction() as block:
            enqueue(block, "job", "f")
            settle(block, block.claim_next(owner_id="w", lease_ms=30_000), outcome="succeeded")
        assert (work.received(), done.received()) == (1, 0)  # one NOTIFY: the work channel's
        waiting = enqueue(kernel, "job", "g")
        assert (work.received(), done.received()) == (1, 0)
        store.cancel_occurrence(occurrence_id=waiting)
        assert (work.received(), done.received()) == (0, 1)
    finally:
        work.close()
        done.close()
        store.close()
        kernel.close()
