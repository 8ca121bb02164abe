"""Observability of the store's state changes: log records and OpenTelemetry metrics.

Every state change already appends an ``events`` row (``Tx.insert_events``). The runner that owns
the operation turns the rows of a committed transaction into one log record each, on the
``scheduler.events`` logger, with structured ``extra`` fields: ``event`` (the event type), ``state``
(``claimed``, ``renewed``, ``settled``, ``retried``, ``dead-lettered``, ``reclaimed``, ``swept``,
``cancelled``, …), ``occurrence``, ``job``, ``kind``, ``owner``, ``fence``, ``attempt`` and
``duration_ms`` (how long the handler ran, on the settlement records of a worker's settle:
:func:`handler_timing`; ``None`` elsewhere). Records are emitted after
COMMIT when the store owns the transaction (``store.transaction()``: after the block commits; nothing
for a rolled-back one), and at the end of each operation inside a caller's transaction
(``SchedulerStore.on_connection``), which the caller may still roll back.
``SCHEDULER_LEASE_LOST`` is logged where it is raised (:func:`log_lease_lost`).

Metrics go through the OpenTelemetry API when ``opentelemetry-api`` is installed and an SDK meter
provider is configured (``pip install 'scheduler-kernel[otel]'``); otherwise they cost nothing:
``scheduler.claims`` and ``scheduler.settlements`` (counters), ``scheduler.claim.latency`` (histogram,
ms from ``available_at`` to the claim), ``scheduler.handler.duration`` (histogram, ms a worker's
handler ran, by kind and outcome: :func:`record_handler_duration`) and ``scheduler.queue.depth``
(gauge by kind and status, see :func:`observe_queue_depth`).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import bindparam, select

from scheduler.schema import tables as t
from scheduler.store.plumbing.statement_plans import Prepared

if TYPE_CHECKING:
    from scheduler.store.plumbing.tx import Tx
    from scheduler.store.records import Occurrence

EVENTS_LOGGER: Final = "scheduler.events"
events_log = logging.getLogger(EVENTS_LOGGER)
leases_log = logging.getLogger("scheduler.leases")

_INFO, _DEBUG, _WARNING = logging.INFO, logging.DEBUG, logging.WARNING
# event type -> (state name, log level)
STATES: Final[Mapping[str, tuple[str, int]]] = {
    "job_created": ("job created", _INFO),
    "job_updated": ("job updated", _INFO),
    "occurrence_enqueued": ("enqueued", _INFO),
    "occurrence_claimed": ("claimed", _INFO),
    "occurrence_reclaimed": ("reclaimed", _WARNING),
    "occurrence_renewed": ("renewed", _DEBUG),
    "occurrence_succeeded": ("settled", _INFO),
    "occurrence_retry_scheduled": ("retried", _INFO),
    "occurrence_dead_lettered": ("dead-lettered", _WARNING),
    "occurrence_pause_requested": ("pause requested", _INFO),
    "occurrence_paused": ("paused", _INFO),
    "occurrence_resume_requested": ("resumed", _INFO),
    "occurrence_requeued": ("requeued", _INFO),
    "occurrence_released": ("released", _INFO),
    "occurrence_cancelled": ("cancelled", _WARNING),
    "occurrence_adjudication_recorded": ("adjudicated", _INFO),
}
SWEPT: Final = ("swept", _WARNING)
"""``occurrence_dead_lettered`` by the expired-lease sweep (``reason: lease_expired``)."""
_SETTLEMENT_OUTCOMES: Final = {
    "occurrence_succeeded": "succeeded",
    "occurrence_retry_scheduled": "retried",
    "occurrence_dead_lettered": "dead_lettered",
}
_CLAIMS: Final = ("occurrence_claimed", "occurrence_reclaimed")


NAMED_FIELDS: Final = ("occurrence", "job", "kind", "attempt", "fence")
"""The ``extra`` fields a text log message names (``owner`` stays in ``extra`` only)."""


def describe(fields: Mapping[str, object]) -> str:
    """``occurrence=… job=… kind=… attempt=… fence=…``: the fields of ``fields`` that are set, for
    the message of a record, so a plain text log names what it is about (JSON logs have the
    same fields as attributes)."""
    return " ".join(f"{name}={fields[name]}" for name in NAMED_FIELDS if fields.get(name) is not None)


def _state(row: Mapping[str, Any], data: Mapping[str, Any]) -> tuple[str, int]:
    event = row["event_type"]
    if event == "occurrence_dead_lettered" and data.get("reason") == "lease_expired":
        return SWEPT
    return STATES.get(event, (event, _INFO))


# --------------------------------------------------------------------------- metrics


class _Metrics:
    """OpenTelemetry instruments, created on first use; ``None`` without the API or an SDK."""

    def __init__(self) -> None:
        self._instruments: dict[str, Any] | None = None
        self._api: Any = None
        self._loaded = False

    def _load(self) -> Any:
        if not self._loaded:
            self._loaded = True
            api: Any
            try:  # imported by name: mypy --strict passes with or without the optional package
                api = importlib.import_module("opentelemetry.metrics")
            except ImportError:
                api = None
            self._api = api
        return self._api

    def instruments(self) -> dict[str, Any] | None:
        """The instruments when a real meter provider is configured (else ``None``: metrics off)."""
        api = self._load()
        if api is None:
            return None
        provider = api.get_meter_provider()
        if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
            return None
        if self._instruments is None:
            meter = api.get_meter("scheduler")
            self._instruments = {
                "claims": meter.create_counter(
                    "scheduler.claims", unit="{claim}", description="Occurrences claimed"
                ),
                "settlements": meter.create_counter(
                    "scheduler.settlements", unit="{settlement}", description="Attempts settled, by outcome"
                ),
                "latency": meter.create_histogram(
                    "scheduler.claim.latency", unit="ms", description="Time from available_at to the claim"
                ),
                "handler": meter.create_histogram(
                    "scheduler.handler.duration", unit="ms", description="How long a worker's handler ran"
                ),
            }
        return self._instruments

    def reset(self) -> None:
        """Forget created instruments (after the application replaced its meter provider)."""
        self._instruments = None


METRICS: Final = _Metrics()


def record_claim_latency(occurrence: Occurrence, kind: str | None = None) -> None:
    """Record how long a claimed occurrence waited after it became available (ms)."""
    instruments = METRICS.instruments()
    if instruments is not None:
        waited = max(0, occurrence.updated_at - occurrence.available_at)
        instruments["latency"].record(waited, {"kind": kind or ""})


def record_handler_duration(kind: str, outcome: str, duration_ms: float) -> None:
    """Record how long a handler ran (ms): ``outcome`` is ``succeeded`` or ``failed`` (what the
    worker settles), or ``paused`` / ``abandoned`` (nothing settled)."""
    instruments = METRICS.instruments()
    if instruments is not None:
        instruments["handler"].record(duration_ms, {"kind": kind, "outcome": outcome})


_TIMING: ContextVar[Mapping[str, float] | None] = ContextVar("scheduler_handler_timing", default=None)


@contextmanager
def handler_timing(occurrence_id: str, duration_ms: float | None) -> Iterator[None]:
    """While a worker settles ``occurrence_id``, the settlement records of that occurrence carry
    ``duration_ms`` (and say it in their message)."""
    with handler_timings({} if duration_ms is None else {occurrence_id: duration_ms}):
        yield


@contextmanager
def handler_timings(durations: Mapping[str, float]) -> Iterator[None]:
    """:func:`handler_timing` for several occurrences settled together (``{occurrence id: ms}``)."""
    token = _TIMING.set(dict(durations) or None)
    try:
        yield
    finally:
        _TIMING.reset(token)


def _handler_duration(row: Mapping[str, Any]) -> float | None:
    timing = _TIMING.get()
    if timing is None or row["event_type"] not in _SETTLEMENT_OUTCOMES:
        return None
    return timing.get(row["occurrence_id"])


def observe_queue_depth(read_depth: Callable[[], Iterable[tuple[str, str, int]]]) -> bool:
    """Register the ``scheduler.queue.depth`` gauge: ``read_depth()`` yields ``(kind, status, count)``
    (e.g. ``store.queue_depth``). Returns whether OpenTelemetry is available."""
    api = METRICS._load()
    if api is None:
        return False

    def callback(_options: Any) -> Iterable[Any]:
        try:
            rows = list(read_depth())
        except Exception:
            logging.getLogger("scheduler.metrics").debug("queue depth read failed", exc_info=True)
            return []
        return [api.Observation(count, {"kind": kind, "status": status}) for kind, status, count in rows]

    api.get_meter("scheduler").create_observable_gauge(
        "scheduler.queue.depth",
        callbacks=[callback],
        unit="{occurrence}",
        description="Occurrences by kind, status",
    )
    return True


# --------------------------------------------------------------------------- state changes


_JOB_KIND: Final = Prepared(
    select(t.jobs.c.kind).where(t.jobs.c.job_id == bindparam("job_id")), ignores_kept_writes=True
)


class StateChanges:
    """The events of one committed operation, ready to log (and count)."""

    __slots__ = ("kinds", "metrics", "rows")

    def __init__(
        self, rows: Sequence[Mapping[str, Any]], kinds: Mapping[str, str], metrics: dict[str, Any] | None
    ) -> None:
        self.rows = rows
        self.kinds = kinds
        self.metrics = metrics

    def emit(self) -> None:
        """One log record per event (and the metric updates); never raises."""
        try:
            for row in self.rows:
                self._emit(row)
        except Exception:  # observability must never fail a committed write
            logging.getLogger("scheduler.metrics").debug("state change emission failed", exc_info=True)

    def _emit(self, row: Mapping[str, Any]) -> None:
        data = _data(row)
        state, level = _state(row, data)
        kind = self.kinds.get(row["job_id"])
        if events_log.isEnabledFor(level):
            duration = _handler_duration(row)
            extra = {
                "event": row["event_type"],
                "state": state,
                "occurrence": row["occurrence_id"],
                "job": row["job_id"],
                "kind": kind,
                "owner": row["owner_id"],
                "fence": row["fence"],
                "attempt": data.get("attempt"),
                "duration_ms": duration,
            }
            if duration is None:
                events_log.log(level, "%s %s", state, describe(extra), extra=extra)
            else:
                events_log.log(
                    level, "%s %s (handler %.1f ms)", state, describe(extra), duration, extra=extra
                )
        if self.metrics is not None:
            self._count(row["event_type"], data, kind or "")

    def _count(self, event: str, data: Mapping[str, Any], kind: str) -> None:
        assert self.metrics is not None
        if event in _CLAIMS:
            self.metrics["claims"].add(1, {"kind": kind, "reclaimed": event == "occurrence_reclaimed"})
        outcome = _SETTLEMENT_OUTCOMES.get(event)
        if outcome is not None:
            reason = data.get("reason") if data.get("reason") in ("lease_expired", "cancelled") else "settled"
            self.metrics["settlements"].add(1, {"kind": kind, "outcome": outcome, "reason": reason})


_NOTHING: Final = StateChanges((), {}, None)


def _data(row: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        value = json.loads(row["data_json"])
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _logged(event_type: str) -> bool:
    return events_log.isEnabledFor(STATES.get(event_type, ("", _INFO))[1])


def _wanted(rows: Sequence[Mapping[str, Any]], metrics: dict[str, Any] | None) -> bool:
    return metrics is not None or any(_logged(row["event_type"]) for row in rows)


def records_event(event_type: str) -> bool:
    """Whether an event row of ``event_type`` would be logged or counted (metrics are on)."""
    return METRICS.instruments() is not None or _logged(event_type)


def collect(tx: Tx) -> StateChanges:
    """The state changes of ``tx`` (read the job kinds while the transaction is still open).

    Costs nothing when no record would be logged and metrics are off.
    """
    rows = tx.events
    if not rows:
        return _NOTHING
    metrics = METRICS.instruments()
    if not _wanted(rows, metrics):
        return _NOTHING
    kinds: dict[str, str] = {}
    for job_id in dict.fromkeys(row["job_id"] for row in rows):  # usually one job per transaction
        # A failed read fails the call: the statement aborted the transaction, which must not
        # then be committed as if it had succeeded.
        found = tx.first(_JOB_KIND, {"job_id": job_id})
        if found is not None:
            kinds[job_id] = found.kind
    return StateChanges(list(rows), kinds, metrics)


def emit_all(changes: Iterable[StateChanges]) -> None:
    for change in changes:
        change.emit()


def log_lease_lost(
    occurrence_id: str, *, owner_id: str | None = None, fence: int | None = None, job_id: str | None = None
) -> None:
    """The ``lease lost`` record, logged where ``SCHEDULER_LEASE_LOST`` is raised."""
    extra = {
        "event": "lease_lost",
        "state": "lease lost",
        "occurrence": occurrence_id,
        "job": job_id,
        "kind": None,
        "owner": owner_id,
        "fence": fence,
        "attempt": None,
        "duration_ms": None,
    }
    leases_log.warning("lease lost %s", describe(extra), extra=extra)
