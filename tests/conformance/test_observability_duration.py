"""How long handlers ran: in the worker's log records and the ``scheduler.handler.duration``
histogram (OpenTelemetry SDK, in-memory reader), on both backends. (docs/observability.md's
Prometheus set-up, on a SQLite file: ``tests/backends/sqlite/test_sqlite_observability.py``.)
API §9 Observability.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pytest
from otel_support import meter_reader as meter_reader
from otel_support import metric_points
from store_places import StorePlace

from scheduler.worker import PermanentError, RetryPolicy, Worker
from tests.worker_support import add_job, enqueue

SLEEP_S = 0.03


def handler(occurrence: Any, ctx: Any) -> str:
    time.sleep(SLEEP_S)
    key = occurrence.payload["key"]
    if key == "flaky" and occurrence.attempt == 1:
        raise ValueError("first attempt fails")
    if key == "fatal":
        raise PermanentError("never", code="FATAL")
    return key


def test_handler_duration_in_log_records_and_the_histogram(
    place: StorePlace, meter_reader: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = place.open()
    add_job(store, "mail", kind="email", max_attempts=2)
    ids = {key: enqueue(store, "mail", key, payload={"key": key}) for key in ("ok", "flaky", "fatal")}
    with caplog.at_level(logging.INFO, logger="scheduler"):
        worker = Worker(store, {"email": handler}, periodic=False, retry=RetryPolicy(base_ms=0, jitter=0))
        assert worker.run_until_idle() == 4
    store.close()

    settled = [r for r in caplog.records if r.name == "scheduler.events" and r.state != "claimed"]
    by_state = {
        (r.occurrence, r.state): r for r in settled if r.state in ("settled", "retried", "dead-lettered")
    }
    assert set(by_state) == {
        (ids["ok"], "settled"),
        (ids["flaky"], "retried"),
        (ids["flaky"], "settled"),
        (ids["fatal"], "dead-lettered"),
    }
    for record in by_state.values():
        assert record.duration_ms >= SLEEP_S * 1000, record.getMessage()
        assert re.search(r"\(handler \d+\.\d ms\)$", record.getMessage()), record.getMessage()
    claimed = [r for r in caplog.records if getattr(r, "state", None) == "claimed"]
    assert len(claimed) == 4 and all(record.duration_ms is None for record in claimed)
    failures = [
        r
        for r in caplog.records
        if r.name == "scheduler.worker" and r.getMessage().startswith("handler failed")
    ]
    assert len(failures) == 2 and all(record.duration_ms >= SLEEP_S * 1000 for record in failures)

    points = metric_points(meter_reader)["scheduler.handler.duration"]
    by_outcome = {point.attributes["outcome"]: point for point in points}
    assert {point.attributes["kind"] for point in points} == {"email"}
    assert (by_outcome["succeeded"].count, by_outcome["failed"].count) == (2, 2)
    assert by_outcome["succeeded"].min >= SLEEP_S * 1000 and by_outcome["failed"].min >= SLEEP_S * 1000
    assert by_outcome["succeeded"].sum < 60_000


def test_a_settle_without_a_worker_carries_no_duration(
    place: StorePlace, caplog: pytest.LogCaptureFixture
) -> None:
    store = place.open()
    add_job(store, "mail", kind="email")
    occurrence_id = enqueue(store, "mail", "direct")
    claimed = store.claim_occurrence(occurrence_id=occurrence_id, owner_id="me", lease_ms=60_000)
    with caplog.at_level(logging.INFO, logger="scheduler.events"):
        store.settle(occurrence_id=occurrence_id, owner_id="me", fence=claimed.fence, outcome="succeeded")
    store.close()
    [record] = [r for r in caplog.records if getattr(r, "state", None) == "settled"]
    named = f"occurrence={occurrence_id} job=mail kind=email attempt=1 fence=1"
    assert record.duration_ms is None and record.getMessage() == f"settled {named}"
