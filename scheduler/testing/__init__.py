"""Test helpers for applications that embed the scheduler (also served as pytest fixtures).

The pytest plugin (``scheduler.testing.plugin``, registered through the ``pytest11`` entry
point) exposes these as the fixtures ``scheduler_clock``, ``scheduler_store`` and
``scheduler_store_on``; ``dump_tables(store)`` returns every scheduler table's rows; see
``docs/testing.md``. Nothing here is imported by the library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from scheduler.contract.constants import MAX_SAFE_INTEGER
from scheduler.testing.tables import dump_tables

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

T0: Final = 1_767_225_600_000
"""2026-01-01T00:00:00Z in epoch milliseconds: where ``SchedulerClock`` starts by default."""


def _epoch_ms(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (epoch milliseconds)")
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise ValueError(f"{name} must be between 0 and 2**53 - 1")
    return value


class SchedulerClock:
    """A controllable epoch-milliseconds clock: pass it as ``open_store(..., clock=clock)``.

    ``clock()`` and ``clock.now`` read the current value; ``advance(ms)`` moves it forward,
    ``set(ms)`` puts it anywhere (also backwards, to test clock skew). Time never moves on its own.
    """

    __slots__ = ("_now",)

    def __init__(self, start: int = T0) -> None:
        self._now = _epoch_ms(start, "start")

    @property
    def now(self) -> int:
        """The current value in epoch milliseconds."""
        return self._now

    def __call__(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        """Move the clock forward by ``ms`` (>= 0) milliseconds; return the new value."""
        step = _epoch_ms(ms, "ms")
        self._now = _epoch_ms(self._now + step, "clock value")
        return self._now

    def set(self, ms: int) -> int:
        """Set the clock to ``ms`` epoch milliseconds; return it."""
        self._now = _epoch_ms(ms, "ms")
        return self._now

    def __repr__(self) -> str:
        return f"SchedulerClock(now={self._now})"


def store_on(target: Any, *, clock: Any = None) -> SchedulerStore:
    """A store on the application's own database handle.

    ``target`` is an ``sqlalchemy.Engine`` (the store opens, creates or upgrades the schema
    and owns one connection of it: close the store when done) or an ``sqlalchemy.Connection``
    already inside the application's transaction (``SchedulerStore.on_connection``: the store
    never commits or rolls back; the database must already be at schema v6).
    """
    from sqlalchemy import Connection, Engine

    from scheduler.store import SchedulerStore, open_store

    if isinstance(target, Engine):
        return open_store(target, clock=clock)
    if isinstance(target, Connection):
        return SchedulerStore.on_connection(target, clock=clock)
    raise TypeError("store_on() needs an sqlalchemy Engine or Connection")


__all__ = ["T0", "SchedulerClock", "dump_tables", "store_on"]
