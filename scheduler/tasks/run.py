"""``TaskRun``: one deferred call of a task (an occurrence), as last read (API §10)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from scheduler.store.records import Occurrence
from scheduler.tasks.errors import TaskCancelled, TaskFailed

if TYPE_CHECKING:
    from scheduler.tasks.tasks import Tasks

CANCELLED: Final = "CANCELLED"


@dataclass(frozen=True, slots=True)
class TaskRun:
    """A run of a task as last read from the store (a frozen snapshot: ``tasks.get(run.id)`` reads
    it again; :meth:`result` and :meth:`wait` wait for it to end).

    ``id`` is the occurrence id, ``task`` the task's name (job id), ``queue`` its queue (job kind),
    ``status`` the occurrence's (``queued``, ``running``, ``retry_wait``, ``succeeded``,
    ``dead_letter``), ``attempt`` how many times it was claimed, ``value`` its result (``None``
    until it succeeded), ``error`` its last error ``{"code", "message"}`` or ``None``,
    ``scheduled_for`` when it is due (epoch ms), ``deduplicated`` whether a ``defer`` with a ``key``
    found it already there (``None`` when it was not deferred by this call).
    """

    id: str
    task: str
    queue: str | None
    status: str
    attempt: int
    value: Any
    error: Any
    scheduled_for: int
    deduplicated: bool | None = None
    occurrence: Occurrence | None = field(repr=False, compare=False, default=None)
    """The store's record of the run (every field of the occurrence)."""
    _tasks: Tasks | None = field(repr=False, compare=False, default=None)

    @classmethod
    def of(
        cls, occurrence: Occurrence, queue: str | None, tasks: Tasks | None, deduplicated: bool | None = None
    ) -> TaskRun:
        return cls(
            id=occurrence.id,
            task=occurrence.job_id,
            queue=queue,
            status=occurrence.status,
            attempt=occurrence.attempt,
            value=occurrence.result if occurrence.status == "succeeded" else None,
            error=occurrence.last_error,
            scheduled_for=occurrence.scheduled_for,
            deduplicated=deduplicated,
            occurrence=occurrence,
            _tasks=tasks,
        )

    @property
    def done(self) -> bool:
        """Whether the run ended (``succeeded`` or ``dead_letter``) when it was read."""
        return self.status in ("succeeded", "dead_letter")

    @property
    def cancelled(self) -> bool:
        """Whether it ended cancelled (a dead letter with code ``CANCELLED``)."""
        return (
            self.status == "dead_letter"
            and isinstance(self.error, dict)
            and self.error.get("code") == CANCELLED
        )

    def outcome(self) -> Any:
        """``value`` if the run succeeded; ``TaskCancelled`` / ``TaskFailed`` for a dead letter."""
        if self.status == "succeeded":
            return self.value
        if self.cancelled:
            raise TaskCancelled(self)
        raise TaskFailed(self)

    def _owner(self) -> Tasks:
        if self._tasks is None:
            raise RuntimeError("this TaskRun is not attached to a Tasks object")
        return self._tasks

    def result(self, timeout_s: float | None = None) -> Any:
        """Wait until the run ended (through its retries) and return its result.

        Raises :class:`TaskCancelled` if it was cancelled, :class:`TaskFailed` (``.error``) for any
        other dead letter, and ``TimeoutError`` when ``timeout_s`` seconds pass first (``None``:
        wait as long as it takes); the run itself is left as it is. PostgreSQL wakes the wait by
        ``LISTEN``; SQLite polls.
        """
        return self._owner()._wait(self, timeout_s).outcome()

    async def wait(self, timeout_s: float | None = None) -> Any:
        """``result()`` for asyncio code (the event loop is never blocked)."""
        ended = await self._owner()._wait_async(self, timeout_s)
        return ended.outcome()


__all__ = ["TaskRun"]
