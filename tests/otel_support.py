"""Observability in tests: the store's state-change log records, and the OpenTelemetry SDK with an
in-memory metric reader as the global meter provider."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.store.plumbing import telemetry


def state_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The captured records of state changes (``scheduler.events``: those with a ``state``)."""
    return [record for record in caplog.records if hasattr(record, "state")]


def states(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.state for record in state_records(caplog)]  # type: ignore[attr-defined]


@pytest.fixture
def meter_reader() -> Iterator[Any]:
    """An ``InMemoryMetricReader`` whose provider is the global one for the test (restored after)."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    previous = metrics._internal._METER_PROVIDER  # the SDK allows one global provider per process
    metrics._internal._METER_PROVIDER = provider
    telemetry.METRICS.reset()
    try:
        yield reader
    finally:
        metrics._internal._METER_PROVIDER = previous
        telemetry.METRICS.reset()
        provider.shutdown()


def metric_points(reader: Any) -> dict[str, list[Any]]:
    """Every data point the reader collects now, by instrument name."""
    points: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points
