"""Classification of low-level storage failures (seed: findStorageFailureCode)."""

from __future__ import annotations

import errno
from typing import Literal

from scheduler.contract.errors import SchedulerKernelError

STORAGE_UNAVAILABLE = "SCHEDULER_STORAGE_UNAVAILABLE"
STORAGE_FAILURE_CODES = ("ENOSPC", "EROFS", "EIO", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY")
# Lock contention is not a broken disk, but it is a storage condition the caller can retry.
CONTENTION_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED")

CommitState = Literal["not_committed", "unknown"]


def _normalized(value: object, codes: tuple[str, ...]) -> str | None:
    if not isinstance(value, str):
        return None
    candidate = value.strip().upper()
    if candidate in codes:
        return candidate
    return next((code for code in codes if candidate.startswith(f"{code}_")), None)


def _own_codes(error: BaseException) -> list[object]:
    codes: list[object] = [getattr(error, "sqlite_errorname", None), getattr(error, "code", None)]
    if isinstance(error, OSError) and error.errno is not None:
        codes.append(errno.errorcode.get(error.errno))
    return codes


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop(0)
        if current is None or any(current is item for item in seen):
            continue
        seen.append(current)
        orig = getattr(current, "orig", None)
        pending.extend(
            [orig if isinstance(orig, BaseException) else None, current.__cause__, current.__context__]
        )
    return seen


def find_storage_failure_code(
    error: BaseException, codes: tuple[str, ...] = STORAGE_FAILURE_CODES
) -> str | None:
    """The first storage failure code anywhere in the cause chain of ``error``."""
    for current in _chain(error):
        for value in _own_codes(current):
            code = _normalized(value, codes)
            if code:
                return code
    return None


def storage_unavailable(
    *, phase: str, storage_code: str, commit_state: CommitState, retryable: bool = False
) -> SchedulerKernelError:
    return SchedulerKernelError(
        STORAGE_UNAVAILABLE,
        "Scheduler storage is unavailable",
        {"phase": phase, "storageCode": storage_code, "commitState": commit_state, "retryable": retryable},
    )
