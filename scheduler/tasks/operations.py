"""Acting on runs: cancel and retry one, or every run matching a queue / task filter (API §10, §12).

Each run is changed in a transaction of its own (``cancel_occurrence``, ``requeue_dead_letter``), so
a bulk call that stops half-way leaves every run either changed or as it was. A run that changed
meanwhile (it ended, or someone else cancelled or requeued it) is skipped, not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.store.capabilities.queues import find_occurrences
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Occurrence

CANCELLABLE: Final = ("queued", "retry_wait", "running")
PAGE: Final = 200
_RACED: Final = frozenset(
    {
        "SCHEDULER_CONFLICT",
        "SCHEDULER_NOT_FOUND",
        "SCHEDULER_REQUEUE_CONFLICT",
        "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT",
    }
)


def _not_found(run_id: str) -> SchedulerKernelError:
    return SchedulerKernelError("SCHEDULER_NOT_FOUND", f"Scheduler occurrence not found: {run_id}")


def cancel_run(store: SchedulerStore, run_id: str, reason: str | None) -> Occurrence:
    """``cancel_occurrence`` (API §12)."""
    return store.cancel_occurrence(occurrence_id=run_id, reason=reason)


def retry_evidence(occurrence: Occurrence) -> tuple[int, str, str]:
    """``requeue_dead_letter``'s evidence for retrying this dead letter as it is now: its fence, its
    error code and the request id derived from them (so retrying it twice is one requeue).
    ``SCHEDULER_CONFLICT`` when it is not a dead letter."""
    error = occurrence.last_error
    code = error.get("code") if isinstance(error, dict) else None
    if occurrence.status != "dead_letter" or not isinstance(code, str):
        raise SchedulerKernelError(
            "SCHEDULER_CONFLICT",
            f"Only a dead letter can be retried: {occurrence.id} is {occurrence.status}",
            {"status": occurrence.status},
        )
    return occurrence.fence, code[:128], f"retry:{occurrence.fence}:{occurrence.id}"[:128]


def retry_run(store: SchedulerStore, run_id: str) -> Occurrence:
    """Requeue a dead letter as it is now (its fence and error code), idempotently."""
    occurrence = store.get_occurrence(run_id)
    if occurrence is None:
        raise _not_found(run_id)
    fence, code, request = retry_evidence(occurrence)
    requeued = store.requeue_dead_letter(
        occurrence_id=run_id, expected_fence=fence, expected_error_code=code, request_id=request
    )
    return requeued.occurrence


def cancellable_statuses(status: Any) -> list[str]:
    """``status`` (one of :data:`CANCELLABLE` or a list of them) checked; the list."""
    statuses = [status] if isinstance(status, str) else status
    if not isinstance(statuses, (list, tuple)) or not statuses:
        raise invalid_argument(f"status must be one of {', '.join(CANCELLABLE)} or a list of them")
    unknown = [value for value in statuses if value not in CANCELLABLE]
    if unknown:
        raise invalid_argument(f"status must be one of {', '.join(CANCELLABLE)}", {"statuses": unknown})
    return list(dict.fromkeys(statuses))


def _each(
    store: SchedulerStore,
    act: Callable[[Occurrence], object],
    *,
    statuses: Sequence[str],
    jobs: Sequence[str] | None,
    kinds: Sequence[str] | None,
    code: str | None = None,
) -> int:
    """``act`` on every matching occurrence, page by page; how many it changed."""
    if jobs is not None and not jobs:
        return 0
    changed, after = 0, None
    while True:
        page = find_occurrences(
            store, statuses=statuses, job_ids=jobs, job_kinds=kinds, error_code=code, after=after, limit=PAGE
        )
        for occurrence in page:
            try:
                act(occurrence)
            except SchedulerKernelError as error:
                if error.code not in _RACED:
                    raise
                continue
            changed += 1
        if len(page) < PAGE:
            return changed
        after = page[-1].id


def cancel_matching(
    store: SchedulerStore,
    jobs: Sequence[str] | None,
    kinds: Sequence[str] | None,
    status: Any,
    reason: str | None = None,
) -> int:
    """Cancel every run of these jobs / kinds in ``status`` (with ``reason``); how many."""
    return _each(
        store,
        lambda occurrence: cancel_run(store, occurrence.id, reason),
        statuses=cancellable_statuses(status),
        jobs=jobs,
        kinds=kinds,
    )


def count_matching(
    store: SchedulerStore,
    jobs: Sequence[str] | None,
    kinds: Sequence[str] | None,
    statuses: Sequence[str],
    code: str | None = None,
) -> int:
    """How many runs :func:`cancel_matching` (``statuses``) or :func:`retry_matching`
    (``["dead_letter"]``, ``code``) would act on now (nothing is written)."""
    return _each(store, lambda _: None, statuses=statuses, jobs=jobs, kinds=kinds, code=code)


def retry_matching(
    store: SchedulerStore, jobs: Sequence[str] | None, kinds: Sequence[str] | None, code: Any
) -> int:
    """Requeue every dead letter of these jobs / kinds (with this error code); how many."""
    return _each(
        store,
        lambda occurrence: retry_run(store, occurrence.id),
        statuses=["dead_letter"],
        jobs=jobs,
        kinds=kinds,
        code=code,
    )


__all__ = [
    "CANCELLABLE",
    "cancel_matching",
    "cancel_run",
    "cancellable_statuses",
    "count_matching",
    "retry_evidence",
    "retry_matching",
    "retry_run",
]
