"""Opening benchmark stores and checking that the store methods a figure needs exist."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

from scheduler.bench.context import BENCH_AUTHORITY, BENCH_JOB_ID
from scheduler.bench.model import Unavailable

PAST_MS: Final = 1_000_000_000
"""Benchmark occurrences are scheduled this far in the past, so they are due at once."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def open_bench_store(path: Path) -> Any:
    """A store on ``path`` (created at schema v6, WAL, synchronous=FULL) with the bench job."""
    try:
        from scheduler.store.opening import open_store
    except ImportError as error:  # the store layer is not importable yet
        raise Unavailable(f"scheduler.store cannot be imported ({error})") from error
    store = open_store(path)
    require(store, "create_job", "get_job")
    if store.get_job(BENCH_JOB_ID) is None:
        store.create_job(id=BENCH_JOB_ID, kind="bench", authority=BENCH_AUTHORITY)
    return store


def require(store: Any, *methods: str) -> None:
    """Raise :class:`Unavailable` naming the first method the store does not have."""
    for name in methods:
        if not callable(getattr(store, name, None)):
            raise Unavailable(f"SchedulerStore.{name} is not implemented yet")


def enqueue_request(prefix: str, index: int, base: int) -> dict[str, Any]:
    """``enqueue_occurrence`` keyword arguments of a due occurrence of the bench job."""
    return {"job_id": BENCH_JOB_ID, "scheduled_for": base + index, "trigger_key": f"{prefix}-{index}"}


def fill_queue(store: Any, prefix: str, count: int, batch: int = 500) -> None:
    """Enqueue ``count`` due occurrences (with ``enqueue_many`` when available)."""
    base = wall_ms() - PAST_MS
    if callable(getattr(store, "enqueue_many", None)):
        for start in range(0, count, batch):
            stop = min(count, start + batch)
            store.enqueue_many([enqueue_request(prefix, index, base) for index in range(start, stop)])
        return
    require(store, "enqueue_occurrence")
    for index in range(count):
        store.enqueue_occurrence(**enqueue_request(prefix, index, base))


def settle_kwargs(occurrence: Any, owner: str) -> dict[str, Any]:
    return {
        "occurrence_id": occurrence.id,
        "owner_id": owner,
        "fence": occurrence.fence,
        "outcome": "succeeded",
    }
