"""What ``TaskRun.result()`` and ``await run.wait()`` raise when a run will never succeed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.tasks.run import TaskRun


class TaskFailed(Exception):
    """The run ended as a dead letter (its attempts used up, or a permanent failure).

    ``run`` is the :class:`~scheduler.tasks.TaskRun` as it ended; ``error`` its ``{"code", "message"}``.
    """

    def __init__(self, run: TaskRun) -> None:
        self.run = run
        self.error: Any = run.error
        code = run.error.get("code") if isinstance(run.error, dict) else None
        message = run.error.get("message") if isinstance(run.error, dict) else None
        super().__init__(f"task {run.task} failed (run {run.id}): {code}: {message}")


class TaskCancelled(Exception):
    """The run was cancelled (a dead letter with code ``CANCELLED``); ``run`` is the run as it ended."""

    def __init__(self, run: TaskRun) -> None:
        self.run = run
        message = run.error.get("message") if isinstance(run.error, dict) else None
        super().__init__(f"task {run.task} was cancelled (run {run.id}): {message}")


__all__ = ["TaskCancelled", "TaskFailed"]
