"""Observability: one log record per state change, emitted by the store, and OpenTelemetry metrics.

The store's records and metrics, on both backends (``place``). On a SQLite file only (a caller's
``BEGIN IMMEDIATE``, a child process without OpenTelemetry):
``tests/backends/sqlite/test_sqlite_observability.py``.

API §9 Observability.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scheduler import SchedulerKernelError
from scheduler.store.plumbing import telemetry
from scheduler.testing import SchedulerClock
from scheduler.worker import Worker
from tests.otel_support import meter_reader as meter_reader
from tests.otel_support import metric_points, state_records, states
from tests.store_places import StorePlace
from tests.worker_support import add_job, enqueue

FIELDS = ("occurrence", "job", "kind", "owner", "fence", "attempt")


def test_a_full_cycle_logs_every_state_change_with_structured_fields(
    place: StorePlace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="scheduler")
    clock = SchedulerClock()
    store = place.open(clock=clock)
    add_job(store, "mail", kind="email", max_attempts=2)
    occurrence_id = enqueue(store, "mail", "one")
    first = store.claim_next(owner_id="w1", lease_ms=1_000)
    assert first is not None
    store.renew(occurrence_id=occurrence_id, owner_id="w1", fence=first.fence, lease_ms=1_000)
    store.settle(
        occurrence_id=occurrence_id, owner_id="w1", fence=first.fence, outcome="failed", retry_at=clock.now
    )
    second = store.claim_next(owner_id="w1", lease_ms=1_000)
    assert second is not None
    clock.advance(5_000)
    with pytest.raises(SchedulerKernelError) as lost:  # a stale settle: the lease expired
        store.settle(occurrence_id=occurrence_id, owner_id="w1", fence=second.fence, outcome="succeeded")
    assert lost.value.code == "SCHEDULER_LEASE_LOST"
    assert store.claim_next(owner_id="w2", lease_ms=1_000) is None  # the final attempt expired: swept
    other = enqueue(store, "mail", "two")
    claimed = store.claim_next(owner_id="w2", lease_ms=1_000)
    assert claimed is not None and claimed.id == other
    clock.advance(2_000)
    reclaimed = store.claim_next(owner_id="w3", lease_ms=1_000)  # expired, attempts left: reclaimed
    assert reclaimed is not None and reclaimed.id == other
    store.settle(occurrence_id=other, owner_id="w3", fence=reclaimed.fence, outcome="failed", retryable=False)

    assert states(caplog) == [
        "job created",
        "enqueued",
        "claimed",
        "renewed",
        "retried",
        "claimed",
        "lease lost",
        "swept",
        "enqueued",
        "claimed",
        "reclaimed",
        "dead-lettered",
    ]
    records = state_records(caplog)
    for record in records:
        assert all(hasattr(record, field) for field in FIELDS)
    claim = records[2]
    assert (claim.occurrence, claim.job, claim.kind, claim.owner, claim.fence, claim.attempt) == (  # type: ignore[attr-defined]
        occurrence_id,
        "mail",
        "email",
        "w1",
        1,
        1,
    )
    assert records[6].name == "scheduler.leases" and records[6].owner == "w1" and records[6].fence == 2  # type: ignore[attr-defined]
    assert records[7].levelno == logging.WARNING and records[7].occurrence == occurrence_id  # type: ignore[attr-defined]
    assert records[10].owner == "w3" and records[10].kind == "email"  # type: ignore[attr-defined]
    store.close()


def test_transaction_blocks_log_after_commit_and_never_for_a_rollback(
    place: StorePlace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.events")
    store = place.open()
    with store.transaction() as tx:
        add_job(tx, "a")
        enqueue(tx, "a", "one")
        assert states(caplog) == []  # nothing is committed yet
    assert states(caplog) == ["job created", "enqueued"]
    caplog.clear()
    with pytest.raises(RuntimeError), store.transaction() as tx:
        enqueue(tx, "a", "two")
        raise RuntimeError("roll back")
    assert states(caplog) == []
    store.close()


def test_metrics_count_claims_and_settlements_and_report_latency_and_depth(
    place: StorePlace, meter_reader: Any
) -> None:
    store = place.open()
    add_job(store, "mail", kind="email", max_attempts=1)
    for key in ("ok", "bad", "later"):
        enqueue(store, "mail", key, payload={"key": key})

    def handler(occurrence: Any, ctx: Any) -> str:
        if occurrence.payload["key"] == "bad":
            raise ValueError("no")
        return "ok"

    worker = Worker(store, {"email": handler}, periodic=False)
    assert telemetry.observe_queue_depth(store.queue_depth)
    assert worker.run_until_idle() == 3
    enqueue(store, "mail", "waiting")
    points = metric_points(meter_reader)
    claims = {tuple(sorted(point.attributes.items())): point.value for point in points["scheduler.claims"]}
    assert claims == {(("kind", "email"), ("reclaimed", False)): 3}
    settlements = {
        point.attributes["outcome"]: point.value
        for point in points["scheduler.settlements"]
        if point.attributes["kind"] == "email"
    }
    assert settlements == {"succeeded": 2, "dead_lettered": 1}
    [latency] = points["scheduler.claim.latency"]
    assert latency.count == 3 and latency.attributes == {"kind": "email"}
    depth = {(p.attributes["kind"], p.attributes["status"]): p.value for p in points["scheduler.queue.depth"]}
    assert depth == {("email", "queued"): 1, ("email", "dead_letter"): 1}
    store.close()
