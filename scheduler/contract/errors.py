"""The one exception type of the library and its constructors."""

from __future__ import annotations

from typing import Any

INVALID_ARGUMENT = "SCHEDULER_INVALID_ARGUMENT"


class SchedulerKernelError(Exception):
    """A scheduler failure with a stable ``code`` (the original's error codes).

    ``details`` carries the same camelCase keys as the original; a wrapped
    low-level error is chained as ``__cause__``.
    """

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"SchedulerKernelError({self.code!r}, {self.message!r}, {self.details!r})"


def invalid_argument(message: str, details: Any = None) -> SchedulerKernelError:
    """``SCHEDULER_INVALID_ARGUMENT`` with an optional ``details`` payload."""
    return SchedulerKernelError(INVALID_ARGUMENT, message, details)


def kernel_error(code: str, message: str, details: Any = None) -> SchedulerKernelError:
    return SchedulerKernelError(code, message, details)
