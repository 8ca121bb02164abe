"""``SchedulerStore.notify_workers`` / ``wake_channel``: the backend's wake-ups
(``Backend.wake_channel``; PostgreSQL: :mod:`scheduler.backends.postgresql.wakeups`)."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.plumbing.failures import classify_storage_failure
from scheduler.store.plumbing.lifecycle import TRANSACTION_ACTIVE
from scheduler.store.plumbing.nested_runner import NestedRunner


def _not_after_commit() -> SchedulerKernelError:
    return SchedulerKernelError(
        TRANSACTION_ACTIVE,
        "notify_workers() on a store from on_connection runs after your COMMIT: the connection is "
        "still inside a transaction (a NOTIFY there would lock the notification queue at its commit)",
    )


def _run_guarded(runner: NestedRunner, body: Callable[[], None]) -> None:
    """``body`` under the runner's lock; a storage failure as ``SCHEDULER_STORAGE_UNAVAILABLE``."""

    def classified_body() -> None:
        try:
            body()
        except SchedulerKernelError:
            raise
        except Exception as error:
            classified = classify_storage_failure(
                error, runner.backend, phase="write", commit_state="unknown", owns_transaction=False
            )
            if classified is None:
                raise
            raise classified from error

    runner._guarded(classified_body)


class NotifyOperations(StoreBase):
    """``notify_workers`` and ``wake_channel`` of ``SchedulerStore``."""

    @property
    def wake_channel(self) -> str | None:
        """The channel idle workers ``LISTEN`` on (PostgreSQL), ``None`` on SQLite."""
        runner = self._runner
        return runner.backend.wake_channel(runner.target.schema)

    def notify_workers(self) -> bool:
        """Wake the idle workers of this store's schema now, in a transaction of its own.

        The store's own writes notify by themselves; call this after committing an
        application transaction that enqueued through :meth:`on_connection` (on such a store the
        connection must be outside any transaction, else ``SCHEDULER_TRANSACTION_ACTIVE``).
        Returns ``False`` and does nothing on SQLite (workers poll there). A failure is
        ``SCHEDULER_STORAGE_UNAVAILABLE``; nothing but the notification is ever written.
        """
        channel = self.wake_channel
        runner = self._runner
        if channel is None:
            runner.assert_usable()
            return False
        send_wakeup = runner.backend.send_wakeup
        if not isinstance(runner, NestedRunner):
            runner.write(lambda tx: send_wakeup(tx.conn, channel))
            return True
        if runner.owned_block:  # a store.transaction() view: the block notifies when it commits
            _run_guarded(runner, runner.mark_wakes)
            return True
        conn = runner.conn

        def notify_outside_a_transaction() -> None:
            if conn.in_transaction():
                raise _not_after_commit()
            with conn.begin():
                send_wakeup(conn, channel)

        _run_guarded(runner, notify_outside_a_transaction)
        return True


__all__ = ["NotifyOperations"]
