"""What the dashboard's buttons do: each one calls the store method the API documents.

An action takes the submitted form (strings) and returns a sentence for the operator; a refusal is
the store's own ``SchedulerKernelError`` (its code and message are shown), and the store writes
nothing then. The compare-and-set evidence (fence, error code, revision, evidence digest) is what
the page showed when the operator pressed the button, so an action never applies to a state the
operator did not see. Request ids are derived from that evidence the way the CLI derives them, so
pressing twice (or acting from the CLI and the dashboard) is answered as a replay, not done twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final

from scheduler.contract.constants import (
    DEAD_LETTER,
    QUEUED,
    RETRY_WAIT,
    RUNNING,
    SAFE_POINT_ADAPTER_CHECKPOINT,
    SAFE_POINT_BEFORE_EXECUTE,
)
from scheduler.contract.digests import (
    scheduler_adjudication_operator_digest,
    scheduler_adjudication_reason_digest,
)
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.dashboard.format import error_code
from scheduler.dashboard.runs import RunFilter, RunRow, list_runs_in
from scheduler.store.facade import SchedulerStore

BULK_LIMIT: Final = 500
"""Runs one bulk action touches at most (press again for the next ones)."""
BULK_WINDOWS: Final = 20
"""Listing pages one bulk action reads at most (a sparse filter searches a window per page)."""
PAUSE_CAPABILITY: Final = {
    "pauseResume": "checkpoint_v1",
    "safePoints": [SAFE_POINT_ADAPTER_CHECKPOINT, SAFE_POINT_BEFORE_EXECUTE],
}
"""What a pause request declares: the handler may pause at either safe point (as ``scheduler pause``)."""
CANCELLABLE: Final = (QUEUED, RETRY_WAIT, RUNNING)

Form = Mapping[str, str]


def _text(form: Form, name: str) -> str:
    value = form.get(name, "")
    if not value.strip():
        raise invalid_argument(f"{name} is required")
    return value


def _int(form: Form, name: str) -> int:
    value = form.get(name, "").strip()
    if not value.isdigit() or len(value) > 16:
        raise invalid_argument(f"{name} must be a non-negative integer")
    return int(value)


def requeue(store: SchedulerStore, form: Form) -> str:
    occurrence_id, fence, code = _text(form, "occurrence_id"), _int(form, "fence"), _text(form, "code")
    result = store.requeue_dead_letter(
        occurrence_id=occurrence_id,
        expected_fence=fence,
        expected_error_code=code,
        request_id=f"requeue:{occurrence_id}:{fence}",
    )
    already = " (already requested)" if result.deduplicated else ""
    return f"Requeued{already}: {occurrence_id} is back in the queue ({result.occurrence.status})."


def cancel(store: SchedulerStore, form: Form) -> str:
    occurrence_id = _text(form, "occurrence_id")
    reason = form.get("reason", "").strip() or None
    occurrence = store.cancel_occurrence(occurrence_id=occurrence_id, reason=reason)
    return f"Cancelled: {occurrence.id} is a dead letter ({error_code(occurrence.last_error)})."


def pause(store: SchedulerStore, form: Form) -> str:
    occurrence_id, fence = _text(form, "occurrence_id"), _int(form, "fence")
    control = store.request_occurrence_pause(
        occurrence_id=occurrence_id,
        expected_fence=fence,
        request_id=f"pause:{occurrence_id}:{fence}",
        capability=dict(PAUSE_CAPABILITY),
    )
    return f"Pause requested: {occurrence_id} pauses at its next safe point (control {control.state})."


def resume(store: SchedulerStore, form: Form) -> str:
    occurrence_id, revision = _text(form, "occurrence_id"), _int(form, "revision")
    result = store.resume_occurrence(
        occurrence_id=occurrence_id,
        expected_revision=revision,
        request_id=f"resume:{occurrence_id}:{revision}",
    )
    return f"Resumed: {occurrence_id} is claimable again ({result.occurrence.status})."


def set_enabled(store: SchedulerStore, form: Form) -> str:
    job_id, revision = _text(form, "job_id"), _int(form, "revision")
    enabled = _text(form, "enabled")
    if enabled not in ("0", "1"):
        raise invalid_argument("enabled must be 0 or 1")
    job = store.update_job(job_id, revision, enabled=enabled == "1")
    return f"{'Enabled' if job.enabled else 'Disabled'}: job {job.id} (revision {job.revision})."


def adjudicate(store: SchedulerStore, form: Form) -> str:
    occurrence_id = _text(form, "occurrence_id")
    case = store.adjudicate_occurrence(
        occurrence_id=occurrence_id,
        decision=_text(form, "decision"),
        expected_evidence_digest=_text(form, "evidence_digest"),
        expected_attempt=_int(form, "attempt"),
        expected_fence=_int(form, "fence"),
        reason_digest=scheduler_adjudication_reason_digest(_text(form, "reason")),
        operator_digest=scheduler_adjudication_operator_digest(_text(form, "operator")),
    )
    decision = case.adjudication.decision if case.adjudication is not None else "recorded"
    return f"Adjudicated: {occurrence_id} ({decision}, now {case.status})."


# --------------------------------------------------------------------------- bulk


@dataclass(frozen=True, slots=True)
class BulkResult:
    done: int
    refused: dict[str, int]
    more: bool

    def sentence(self, verb: str) -> str:
        text = f"{verb} {self.done} run(s)."
        if self.refused:
            text += " Refused: " + ", ".join(
                f"{count} × {code}" for code, count in sorted(self.refused.items())
            )
        if self.more:
            text += " Stopped early (at most 500 runs or 20 pages per press): press again for the next ones."
        return text


def _bulk(store: SchedulerStore, runs: RunFilter, act: Callable[[RunRow], object]) -> BulkResult:
    done, refused, cursor = 0, dict[str, int](), None
    seen = 0
    for _ in range(BULK_WINDOWS):
        page = store._read(partial(list_runs_in, runs=runs, cursor=cursor, page=min(100, BULK_LIMIT - seen)))
        for row in page.rows:
            seen += 1
            try:
                act(row)
                done += 1
            except SchedulerKernelError as error:
                refused[error.code] = refused.get(error.code, 0) + 1
        cursor = page.next_cursor
        if cursor is None:
            return BulkResult(done, refused, more=False)
        if seen >= BULK_LIMIT:
            break
    return BulkResult(done, refused, more=True)


def bulk_requeue(store: SchedulerStore, form: Form) -> str:
    runs = RunFilter.from_params(form, status=DEAD_LETTER)

    def act(occurrence: RunRow) -> None:
        code = error_code(occurrence.last_error)
        if code is None:
            raise SchedulerKernelError("SCHEDULER_REQUEUE_CONFLICT", "dead letter without an error code")
        store.requeue_dead_letter(
            occurrence_id=occurrence.id,
            expected_fence=occurrence.fence,
            expected_error_code=code,
            request_id=f"requeue:{occurrence.id}:{occurrence.fence}",
        )

    return _bulk(store, runs, act).sentence("Requeued")


def bulk_cancel(store: SchedulerStore, form: Form) -> str:
    runs = RunFilter.from_params(form)
    if runs.status not in CANCELLABLE:
        raise invalid_argument(f"bulk cancel needs a status filter: one of {', '.join(CANCELLABLE)}")
    reason = form.get("reason", "").strip() or None
    return _bulk(store, runs, lambda o: store.cancel_occurrence(occurrence_id=o.id, reason=reason)).sentence(
        "Cancelled"
    )


ACTIONS: Final[dict[str, Callable[[SchedulerStore, Form], str]]] = {
    "requeue": requeue,
    "cancel": cancel,
    "pause": pause,
    "resume": resume,
    "job-enabled": set_enabled,
    "adjudicate": adjudicate,
    "bulk-requeue": bulk_requeue,
    "bulk-cancel": bulk_cancel,
}
"""Every POST route of the dashboard: ``/actions/<name>``."""
