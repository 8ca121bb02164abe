"""Running one handler call and deciding its settlement (API §9's rules).

Sync handlers run on the lane thread that claimed the occurrence; ``async def`` handlers (and any
handler returning an awaitable) run on ONE event loop shared by the whole worker, in its own thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

from scheduler.contract.canonical import normalize_json
from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.records import Occurrence
from scheduler.store.telemetry import record_handler_duration
from scheduler.worker.context import HandlerContext
from scheduler.worker.policy import PermanentError, error_document, result_not_json

Handler = Callable[[Occurrence, HandlerContext], Any]


@dataclass(frozen=True, slots=True)
class Settlement:
    """What to settle: ``outcome`` with ``result``, or ``error`` with ``retryable``; ``duration_ms``
    is how long the handler ran (``None``: it did not run)."""

    outcome: str
    result: Any = None
    error: dict[str, str] | None = None
    retryable: bool = True
    duration_ms: float | None = None

    def arguments(self) -> dict[str, Any]:
        if self.outcome == "succeeded":
            return {"outcome": "succeeded", "result": self.result}
        return {"outcome": "failed", "error": self.error, "retryable": self.retryable}


class Abandoned(Exception):
    """The handler's run ended without a result to settle (cancelled at shutdown)."""


class AsyncLoop:
    """One asyncio event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running: set[Future[Any]] = set()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="scheduler-async-handlers", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the loop and wait for it (from a lane thread)."""

        async def wrapped() -> Any:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(wrapped(), self._ensure())
        with self._lock:
            self._running.add(future)
        try:
            return future.result()
        except (CancelledError, asyncio.CancelledError) as cancelled:
            raise Abandoned("async handler cancelled") from cancelled
        finally:
            with self._lock:
                self._running.discard(future)

    def cancel_all(self) -> None:
        with self._lock:
            running = list(self._running)
        for future in running:
            future.cancel()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=5)
            if not loop.is_running():
                loop.close()


def call_handler(handler: Handler, occurrence: Occurrence, ctx: HandlerContext, loop: AsyncLoop) -> Any:
    """The handler's return value (an awaitable is awaited on the worker's event loop)."""
    if inspect.iscoroutinefunction(handler):
        return loop.run(handler(occurrence, ctx))
    value = handler(occurrence, ctx)
    if inspect.isawaitable(value):
        return loop.run(value)
    return value


def succeeded(value: Any) -> Settlement:
    """``succeeded`` with the value, or ``failed``/``RESULT_NOT_JSON`` (not retryable) if it is not JSON."""
    try:
        normalized = normalize_json(value, "result")
    except SchedulerKernelError as error:
        return Settlement("failed", error=result_not_json(error.message), retryable=False)
    return Settlement("succeeded", result=normalized)


def failed(error: BaseException) -> Settlement:
    """``failed`` with ``{"code", "message"}``; retryable unless it is a ``PermanentError``."""
    return Settlement("failed", error=error_document(error), retryable=not isinstance(error, PermanentError))


def handler_ran(kind: str, started: float, outcome: str) -> float:
    """The ms since ``started`` (``time.perf_counter()`` before the handler), recorded in the
    ``scheduler.handler.duration`` histogram with ``kind`` and ``outcome``."""
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    record_handler_duration(kind, outcome, duration_ms)
    return duration_ms


def timed(settlement: Settlement, kind: str, started: float) -> Settlement:
    """``settlement`` with the handler's duration (:func:`handler_ran`, outcome = what is settled)."""
    return dataclasses.replace(settlement, duration_ms=handler_ran(kind, started, settlement.outcome))
