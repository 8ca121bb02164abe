"""When a store may be used: open, closed, a finished ``transaction()`` view, or inherited by fork.

Errors (documented in ``docs/api.md`` / ``docs/operations.md``):

* ``SCHEDULER_STORE_CLOSED`` — the store was closed (``details`` is ``None``, as in the
  original); a ``transaction()`` view used after its block ended (``details.reason ==
  "transaction_finished"``); a store used in a process forked after it was opened
  (``details.reason == "forked"``, with ``openedInPid`` and ``pid``). Open a new store.
* ``SCHEDULER_TRANSACTION_ACTIVE`` — a store called (or closed) from inside one of its own
  calls or ``transaction()`` blocks on the same thread: inside a block, call the block's view;
  from a callback the store runs (``restore_source``, the clock, the uuid factory), do not call
  the store at all. Other threads never see it: they wait for the block or call to end.

Fork: SQLite forbids using a connection in a child process (the child would share the parent's
file locks and WAL index state). A store opened before ``os.fork()`` refuses every call in the
child, and its connection is never touched there again — not by ``close()``, not by garbage
collection, not at interpreter exit (the child keeps a reference to it forever). Open stores
after forking.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Protocol

from scheduler.contract.errors import SchedulerKernelError

log = logging.getLogger("scheduler.store")

STORE_CLOSED = "SCHEDULER_STORE_CLOSED"
TRANSACTION_ACTIVE = "SCHEDULER_TRANSACTION_ACTIVE"
TRANSACTION_FINISHED = "transaction_finished"
FORKED = "forked"


def store_closed(reason: str | None = None) -> SchedulerKernelError:
    """``SCHEDULER_STORE_CLOSED``; ``reason`` names a finished transaction view."""
    if reason == TRANSACTION_FINISHED:
        return SchedulerKernelError(
            STORE_CLOSED,
            "Scheduler transaction view is closed: its transaction() block has ended",
            {"reason": TRANSACTION_FINISHED},
        )
    return SchedulerKernelError(STORE_CLOSED, "Scheduler store is closed")


def opened_in_another_process(opened_pid: int) -> SchedulerKernelError:
    return SchedulerKernelError(
        STORE_CLOSED,
        "Scheduler store was opened in another process (before fork); open a new store in this process",
        {"reason": FORKED, "openedInPid": opened_pid, "pid": os.getpid()},
    )


def transaction_active() -> SchedulerKernelError:
    return SchedulerKernelError(
        TRANSACTION_ACTIVE,
        "Scheduler store is busy in this thread: it was called from inside one of its own calls or "
        "transaction() blocks (inside a block, use the block's view)",
    )


class Forkable(Protocol):
    def mark_forked(self) -> None: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def track(runner: Forkable) -> None:
    """Remember ``runner`` so that a forked child quarantines it right after ``fork()``."""
    _LIVE.add(runner)


def keep_forever(value: object) -> None:
    """Make ``value`` immortal in this process: never freed, so its connection is never closed.

    Freeing an inherited SQLite connection in a child process runs ``sqlite3_close`` (and
    SQLAlchemy's pool reset, a ROLLBACK) on the parent's database handle.
    """
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))
    except Exception:  # pragma: no cover - not CPython: keep a module reference instead
        _IMMORTAL.append(value)


_IMMORTAL: list[object] = []


class ResetAfterFork(Protocol):
    def _after_fork(self) -> None: ...


_RESETS: weakref.WeakSet[Any] = weakref.WeakSet()


def reset_after_fork(value: ResetAfterFork) -> None:
    """Call ``value._after_fork()`` in a child process right after ``os.fork()`` (after the
    inherited runners are quarantined), for as long as ``value`` lives: new locks, forgotten
    stores."""
    _RESETS.add(value)


def _after_fork_in_child() -> None:
    for runner in list(_LIVE):
        runner.mark_forked()
    _LIVE.clear()
    for value in list(_RESETS):
        value._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
