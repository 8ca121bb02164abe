"""Handlers that end in every way a handler can (``BaseException`` subclasses included), and the
occurrence's state they leave: shared by the worker tests of handler endings
(``tests/conformance/test_handler_endings.py``, ``tests/backends/sqlite/test_worker_base_exceptions.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from scheduler.worker import RetryPolicy

SLOW_RETRY = RetryPolicy(base_ms=60_000, max_ms=60_000, jitter=0.0)
ENDINGS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
}


def raising(style: str, ending: type[BaseException]) -> Callable[..., Any]:
    if style == "sync":

        def sync_handler(occurrence: Any, ctx: Any) -> Any:
            raise ending("the handler ended so")

        return sync_handler

    async def async_handler(occurrence: Any, ctx: Any) -> Any:
        await asyncio.sleep(0.01)
        raise ending("the handler ended so")

    return async_handler


async def still_works(occurrence: Any, ctx: Any) -> str:
    await asyncio.sleep(0.01)  # on the worker's one event loop, after the bad handler ran there
    return "still working"


def status(store: Any, occurrence_id: str) -> tuple[str, int, Any]:
    current = store.get_occurrence(occurrence_id)
    return current.status, current.attempt, current.last_error
