"""When a store may be used: open, closed, or a finished ``transaction()`` view.

Errors (documented in ``docs/api.md`` / ``docs/operations.md``):

* ``SCHEDULER_STORE_CLOSED`` — the store was closed (``details`` is ``None``, as in the
  original); a ``transaction()`` view used after its block ended (``details.reason ==
  "transaction_finished"``). Open a new store.
* ``SCHEDULER_TRANSACTION_ACTIVE`` — a store called (or closed) from inside one of its own
  calls or ``transaction()`` blocks on the same thread: inside a block, call the block's view;
  from a callback the store runs (``restore_source``, the clock, the uuid factory), do not call
  the store at all. Other threads never see it: they wait for the block or call to end.
"""

from __future__ import annotations

from scheduler.contract.errors import SchedulerKernelError

STORE_CLOSED = "SCHEDULER_STORE_CLOSED"
TRANSACTION_ACTIVE = "SCHEDULER_TRANSACTION_ACTIVE"
TRANSACTION_FINISHED = "transaction_finished"


def store_closed(reason: str | None = None) -> SchedulerKernelError:
    """``SCHEDULER_STORE_CLOSED``; ``reason`` names a finished transaction view."""
    if reason == TRANSACTION_FINISHED:
        return SchedulerKernelError(
            STORE_CLOSED,
            "Scheduler transaction view is closed: its transaction() block has ended",
            {"reason": TRANSACTION_FINISHED},
        )
    return SchedulerKernelError(STORE_CLOSED, "Scheduler store is closed")


def transaction_active() -> SchedulerKernelError:
    return SchedulerKernelError(
        TRANSACTION_ACTIVE,
        "Scheduler store is busy in this thread: it was called from inside one of its own calls or "
        "transaction() blocks (inside a block, use the block's view)",
    )
