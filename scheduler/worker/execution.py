"""Running one handler call and deciding its settlement (API §9's rules).

Sync handlers run on the lane thread that claimed the occurrence; ``async def`` handlers (and any
handler returning an awaitable) run on ONE event loop shared by the whole worker, in its own thread.

Whatever a handler raises ends up in the lane that waits for it, as a sync handler's exception
would: asyncio lets ``SystemExit`` and ``KeyboardInterrupt`` escape from a task through the event
loop (stopping it, with every handler on it), so they are carried out of the task as an ordinary
exception, and a ``CancelledError`` the handler raised itself (not a cancellation by the worker) is
carried out likewise. Anything that still escapes the loop (a callback a handler left behind) is
logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.contract.canonical import normalize_json
from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.plumbing.telemetry import record_handler_duration
from scheduler.store.records import Occurrence
from scheduler.worker.context import HandlerContext
from scheduler.worker.policy import PermanentError, error_document, result_not_json

Handler = Callable[[Occurrence, HandlerContext], Any]
INTERRUPTS: Final = (SystemExit, KeyboardInterrupt)
log = logging.getLogger("scheduler.worker")


@dataclass(frozen=True, slots=True)
class Settlement:
    """What to settle: ``outcome`` with ``result``, or ``error`` with ``retryable``; ``duration_ms``
    is how long the handler ran (``None``: it did not run)."""

    outcome: str
    result: Any = None
    error: dict[str, str] | None = None
    retryable: bool = True
    duration_ms: float | None = None
    interrupt: BaseException | None = field(default=None, compare=False, repr=False)
    """The handler's ``SystemExit``/``KeyboardInterrupt``, for a caller that raises it again."""

    def arguments(self) -> dict[str, Any]:
        if self.outcome == "succeeded":
            return {"outcome": "succeeded", "result": self.result}
        return {"outcome": "failed", "error": self.error, "retryable": self.retryable}


class Abandoned(Exception):
    """The handler's run ended without a result to settle (cancelled at shutdown)."""


class _Carried(Exception):
    """A handler's exception that asyncio would not deliver through its task as it is."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(type(error).__qualname__)
        self.error = error


async def _carrying(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # cancelled by the worker (shutdown)
        raise _Carried(error) from None
    except INTERRUPTS as error:
        raise _Carried(error) from None


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``loop`` until :meth:`AsyncLoop.close` stops it, whatever escapes a callback."""
    while True:
        try:
            loop.run_forever()
        except BaseException as error:  # SystemExit/KeyboardInterrupt from a callback or task
            log.error(
                "%s escaped a callback on the handlers' event loop; the event loop goes on",
                type(error).__qualname__,
                exc_info=error,
            )
            continue
        return


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
                    target=_serve, args=(loop,), name="scheduler-async-handlers", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the loop and wait for it (from a lane thread); what it raises is
        raised here (``Abandoned`` when :meth:`cancel_all` cancelled it)."""
        future = asyncio.run_coroutine_threadsafe(_carrying(awaitable), self._ensure())
        with self._lock:
            self._running.add(future)
        try:
            return future.result()
        except (CancelledError, asyncio.CancelledError) as cancelled:
            raise Abandoned("async handler cancelled") from cancelled
        except _Carried as carried:
            error = carried.error
        finally:
            with self._lock:
                self._running.discard(future)
        raise error  # outside the except clause: not chained to the carrier

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
    return Settlement(
        "failed",
        error=error_document(error),
        retryable=not isinstance(error, PermanentError),
        interrupt=error if isinstance(error, INTERRUPTS) else None,
    )


def handler_ran(kind: str, started: float, outcome: str) -> float:
    """The ms since ``started`` (``time.perf_counter()`` before the handler), recorded in the
    ``scheduler.handler.duration`` histogram with ``kind`` and ``outcome``."""
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    record_handler_duration(kind, outcome, duration_ms)
    return duration_ms


def timed(settlement: Settlement, kind: str, started: float) -> Settlement:
    """``settlement`` with the handler's duration (:func:`handler_ran`, outcome = what is settled)."""
    return dataclasses.replace(settlement, duration_ms=handler_ran(kind, started, settlement.outcome))
