"""Trace context across a ``defer`` (API §10): with OpenTelemetry installed, ``defer`` records the
caller's trace context with the run (W3C ``traceparent``/``tracestate``, through the globally
configured propagator) and the worker runs the task in a span whose parent is that context.
Without ``opentelemetry-api`` both are no-ops.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

_api: Any = None
_loaded = False


def _otel() -> Any:
    """``(context, propagate, trace)`` modules of the OpenTelemetry API, or ``None``."""
    global _api, _loaded
    if not _loaded:
        try:
            _api = (
                importlib.import_module("opentelemetry.context"),
                importlib.import_module("opentelemetry.propagate"),
                importlib.import_module("opentelemetry.trace"),
            )
        except ImportError:
            _api = None
        _loaded = True
    return _api


def current_trace() -> dict[str, str] | None:
    """The active span's context as text headers, or ``None`` (no API, or no valid span)."""
    api = _otel()
    if api is None:
        return None
    _context, propagate, trace = api
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


@contextlib.contextmanager
def task_span(task: str, run_id: str, queue: str, parent: dict[str, str] | None) -> Iterator[None]:
    """A span ``task <name>`` around the task's execution, child of the recorded context."""
    api = _otel()
    if api is None:
        yield
        return
    _context, propagate, trace = api
    parent_context = propagate.extract(parent) if parent else None
    tracer = trace.get_tracer("scheduler.tasks")
    attributes = {"scheduler.task": task, "scheduler.run": run_id, "scheduler.queue": queue}
    with tracer.start_as_current_span(
        f"task {task}", context=parent_context, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield


__all__ = ["current_trace", "task_span"]
