"""pytest plugin (entry point ``pytest11: scheduler``): scheduler fixtures for integration tests.

Fixtures:

* ``scheduler_clock`` — a :class:`~scheduler.testing.SchedulerClock` starting at
  ``1767225600000`` (2026-01-01T00:00:00Z).
* ``scheduler_store`` — a fresh schema-v6 store on a temporary file, using ``scheduler_clock``,
  closed at teardown.
* ``scheduler_store_on`` — a function ``(engine_or_connection, *, clock=None) -> SchedulerStore``
  opening the store on the application's own engine or transaction (default clock:
  ``scheduler_clock``); every store it returned is closed at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scheduler.testing import SchedulerClock, store_on

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

StoreOpener = Callable[..., "SchedulerStore"]


@pytest.fixture
def scheduler_clock() -> SchedulerClock:
    """A controllable epoch-ms clock starting at 1767225600000 (``advance``, ``set``, ``now``)."""
    return SchedulerClock()


@pytest.fixture
def scheduler_store(tmp_path: Path, scheduler_clock: SchedulerClock) -> Iterator[SchedulerStore]:
    """A fresh schema-v6 store on a temporary file, driven by ``scheduler_clock``."""
    from scheduler.store import open_store

    store = open_store(tmp_path / "scheduler-store" / "kernel-v1.sqlite", clock=scheduler_clock)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def scheduler_store_on(scheduler_clock: SchedulerClock) -> Iterator[StoreOpener]:
    """``opener(engine_or_connection, *, clock=None)``: a store on the application's own database."""
    opened: list[SchedulerStore] = []

    def opener(target: Any, *, clock: Any = None) -> SchedulerStore:
        store = store_on(target, clock=scheduler_clock if clock is None else clock)
        opened.append(store)
        return store

    try:
        yield opener
    finally:
        for store in reversed(opened):
            store.close()
