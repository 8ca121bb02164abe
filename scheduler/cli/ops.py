"""``requeue``, ``cancel``, ``pause``, ``resume``, ``prune`` and ``stats``: the operator's hands on
running work.

Write commands default the compare-and-set evidence (fence, error code, control revision) to what
the occurrence shows now and derive their request id from it, so repeating a command is idempotent
(the store answers ``deduplicated``) and a command never acts on a state the operator did not see
when it ran.

Every option value is checked before the database is opened (a bad value exits 2), and the write
commands need an existing database: they never create one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final

import typer

from scheduler.cli import ids
from scheduler.cli.common import (
    CliFailure,
    DbOption,
    JsonOption,
    command,
    console,
    emit_json,
    fmt_ms,
    new_table,
    not_found,
    read_store,
    require_database,
    write_store,
)
from scheduler.cli.reads import key_option
from scheduler.contract.constants import (
    DEAD_LETTER,
    MAX_HISTORY_LIMIT,
    SAFE_POINT_ADAPTER_CHECKPOINT,
    SAFE_POINT_BEFORE_EXECUTE,
)
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.runtime_control import normalize_runtime_control_capability
from scheduler.store.capabilities.cancellation import is_cancelled, normalize_cancel_reason
from scheduler.store.capabilities.prune import (
    DEFAULT_PRUNE_BATCH,
    MAX_PRUNE_BATCH,
    PRUNABLE_STATUSES,
    PruneResult,
)
from scheduler.store.capabilities.stats import StoreStats
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Occurrence

EXIT_USAGE: Final = 2
_UNITS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION: Final = re.compile(r"(\d+)(ms|s|m|h|d|w)")


def parse_duration_ms(text: str) -> int:
    """``30d``, ``12h``, ``1h30m``, ``500ms`` … as milliseconds (usage error otherwise)."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(number + unit for number, unit in parts) != compact:
        raise CliFailure(
            f"not a duration: {text!r} (use e.g. 30d, 12h, 1h30m, 500ms)",
            exit_code=EXIT_USAGE,
            code="CLI_USAGE",
        )
    return sum(int(number) * _UNITS[unit] for number, unit in parts)


def _require_database(db: str | None) -> None:
    """A write command acts on an existing database: it never creates one (exit 1 otherwise)."""
    require_database(db)


def occurrence_or_not_found(store: SchedulerStore, occurrence_id: str) -> Occurrence:
    occurrence = store.get_occurrence(occurrence_id)
    if occurrence is None:
        raise not_found("occurrence", occurrence_id)
    return occurrence


def _print_occurrence(occurrence: Occurrence, short: str, note: str) -> None:
    table = new_table("occurrence", "job", "status", "attempt", "fence", "available", title=note)
    table.add_row(
        short,
        occurrence.job_id,
        occurrence.status,
        f"{occurrence.attempt}/{occurrence.max_attempts}",
        str(occurrence.fence),
        fmt_ms(occurrence.available_at),
    )
    console().print(table)


FenceOption = Annotated[
    int | None,
    typer.Option("--fence", min=1, help="Expected fence (default: the occurrence's current fence)."),
]
ReasonOption = Annotated[
    str | None,
    typer.Option("--reason", help="Why: the dead letter's error message (at most 2,000 characters)."),
]
RequestOption = Annotated[
    str | None, typer.Option("--request-id", help="Idempotency key (default: derived from the evidence).")
]


@command
def requeue_command(
    occurrence_id: str,
    fence: FenceOption = None,
    error_code: Annotated[
        str | None, typer.Option("--error-code", help="Expected last error code (default: the current one).")
    ] = None,
    request_id: RequestOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send a dead letter back to retry_wait; its next claim does not consume an attempt."""
    key_option(occurrence_id, "occurrenceId")
    key_option(error_code, "expectedErrorCode", 128)
    key_option(request_id, "requestId", 128)
    _require_database(db)
    resolved = ids.resolve_before_write(db, ids.OCCURRENCE, occurrence_id)
    occurrence_id = resolved.id
    with write_store(db) as store:
        current = occurrence_or_not_found(store, occurrence_id)
        pinned = fence is not None or request_id is not None
        made = None if pinned else requeue_made(store, current, error_code)
        if made is not None:
            expected_fence, code, request = made
        else:
            code = error_code or _last_error_code(current)
            expected_fence = current.fence if fence is None else fence
            request = request_id or f"requeue:{current.id}:{expected_fence}"
        result = store.requeue_dead_letter(
            occurrence_id=occurrence_id,
            expected_fence=expected_fence,
            expected_error_code=code,
            request_id=request,
        )
    if as_json:
        emit_json(
            {
                "occurrence": result.occurrence.to_dict(),
                "requestId": result.request_id,
                "deduplicated": result.deduplicated,
            }
        )
    else:
        note = "requeued" + (" (already)" if result.deduplicated else "")
        _print_occurrence(result.occurrence, resolved.short, note)


@dataclass(frozen=True)
class Cancelled:
    """What a cancel command did: the occurrence before and after, whether it was already
    cancelled (a replay: nothing changed), its short id and its queue (job kind)."""

    before: Occurrence
    after: Occurrence
    already: bool
    short: str
    queue: str | None


def cancel_one(db: str | None, occurrence_id: str, reason: str | None) -> Cancelled:
    """``cancel_occurrence`` of the occurrence an id or unique prefix names (arguments checked
    before the database is opened; an existing database only)."""
    key_option(occurrence_id, "occurrenceId")
    normalize_cancel_reason(reason)
    _require_database(db)
    resolved = ids.resolve_before_write(db, ids.OCCURRENCE, occurrence_id)
    with write_store(db) as store:
        current = occurrence_or_not_found(store, resolved.id)
        already = is_cancelled(current.status, current.last_error)
        cancelled = store.cancel_occurrence(occurrence_id=resolved.id, reason=reason)
        job = store.get_job(cancelled.job_id)
    return Cancelled(current, cancelled, already, resolved.short, None if job is None else job.kind)


def print_running_note(done: Cancelled) -> None:
    """The operator's warning when the cancelled occurrence was running."""
    if done.before.status == "running" and not done.already:
        console().print(
            f"it was running (owner {done.before.lease_owner}): the worker is told at its next lease "
            "renewal, and its effects may be partly applied",
            markup=False,
        )


@command
def cancel_command(
    occurrence_id: str,
    reason: ReasonOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a queued, waiting or running occurrence: it becomes a dead letter with code CANCELLED.

    A running handler is told at its next lease renewal (its effects may be partly applied).
    Cancelling it again changes nothing; ``scheduler requeue`` puts it back.
    """
    done = cancel_one(db, occurrence_id, reason)
    if as_json:
        emit_json(
            {
                "occurrence": done.after.to_dict(),
                "previousStatus": done.before.status,
                "deduplicated": done.already,
            }
        )
        return
    _print_occurrence(done.after, done.short, "cancelled" + (" (already)" if done.already else ""))
    print_running_note(done)


def _last_error_code(occurrence: Occurrence) -> str:
    code = occurrence.last_error.get("code") if isinstance(occurrence.last_error, dict) else None
    if not isinstance(code, str):
        raise CliFailure("the occurrence has no error code; pass --error-code", code="CLI_USAGE")
    return code


def requeue_made(
    store: SchedulerStore, current: Occurrence, error_code: str | None
) -> tuple[int, str, str] | None:
    """(fence, error code, request id) of the requeue that already sent the occurrence's last dead
    letter back, when it is no longer a dead letter; ``None`` otherwise.

    ``requeue`` run again, or losing to an identical command run at the same moment, may read
    the occurrence after that requeue and after a worker claimed it (a new fence, status
    ``running``): the evidence it would derive is no longer the dead letter's. Replaying the
    recorded request reports the requeue already made (``deduplicated``) instead of a conflict.
    """
    if current.status == DEAD_LETTER:
        return None
    for event in store.history(occurrence_id=current.id, limit=MAX_HISTORY_LIMIT):  # newest first
        if event.type != "occurrence_requeued" or event.fence is None or not isinstance(event.data, dict):
            continue
        code, request = event.data.get("expectedErrorCode"), event.data.get("requestId")
        if isinstance(code, str) and isinstance(request, str) and error_code in (None, code):
            return event.fence, code, request
        return None
    return None


@command
def pause_command(
    occurrence_id: str,
    fence: FenceOption = None,
    safe_point: Annotated[
        list[str] | None,
        typer.Option(
            "--safe-point", help="Safe points the handler may pause at, repeatable (default: both)."
        ),
    ] = None,
    request_id: RequestOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the worker running an occurrence to pause at its next safe point (ctx.checkpoint)."""
    points = list(safe_point) if safe_point else [SAFE_POINT_ADAPTER_CHECKPOINT, SAFE_POINT_BEFORE_EXECUTE]
    capability = {"pauseResume": "checkpoint_v1", "safePoints": points}
    key_option(occurrence_id, "occurrenceId")
    key_option(request_id, "requestId", 128)
    normalize_runtime_control_capability(capability)  # unknown safe points exit 2
    _require_database(db)
    occurrence_id = ids.resolve_before_write(db, ids.OCCURRENCE, occurrence_id).id
    with write_store(db) as store:
        current = occurrence_or_not_found(store, occurrence_id)
        if fence is None and current.fence == 0:  # never claimed: no fence to expect
            raise SchedulerKernelError(
                "SCHEDULER_OCCURRENCE_NOT_RUNNING",
                f"Scheduler occurrence is not running: {current.id}",
                {"status": current.status},
            )
        expected_fence = current.fence if fence is None else fence
        request = request_id or f"pause:{current.id}:{expected_fence}"
        control = store.request_occurrence_pause(
            occurrence_id=occurrence_id,
            expected_fence=expected_fence,
            request_id=request,
            capability=capability,
        )
    if as_json:
        emit_json({"control": control.to_dict()})
    else:
        console().print(
            f"pause requested: {control.occurrence_id} (state {control.state}, revision {control.revision})",
            markup=False,
        )


@command
def resume_command(
    occurrence_id: str,
    revision: Annotated[
        int | None,
        typer.Option("--revision", min=1, help="Expected control revision (default: the current one)."),
    ] = None,
    request_id: RequestOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a paused occurrence claimable again; the resumed run gets its checkpoint."""
    key_option(occurrence_id, "occurrenceId")
    key_option(request_id, "requestId", 128)
    _require_database(db)
    resolved = ids.resolve_before_write(db, ids.OCCURRENCE, occurrence_id)
    occurrence_id = resolved.id
    with write_store(db) as store:
        control = store.get_occurrence_control(occurrence_id)
        if control is None:
            raise not_found("runtime control of occurrence", occurrence_id)
        expected = control.revision if revision is None else revision
        request = request_id or f"resume:{control.occurrence_id}:{expected}"
        if request_id is None and revision is None and control.state == "resumed":
            # run again (its outcome unknown, say): the resume already made is reported, not refused
            request = control.resume_request_id or request
        result = store.resume_occurrence(
            occurrence_id=occurrence_id, expected_revision=expected, request_id=request
        )
    if as_json:
        emit_json({"control": result.control.to_dict(), "occurrence": result.occurrence.to_dict()})
    else:
        already = " (already)" if result.control.deduplicated else ""
        note = f"resumed{already} (control revision {result.control.revision})"
        _print_occurrence(result.occurrence, resolved.short, note)


@command
def prune_command(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Prune what was settled longer ago than this (30d, 12h, …).")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; write nothing.")
    ] = False,
    batch_size: Annotated[
        int,
        typer.Option("--batch-size", min=1, max=MAX_PRUNE_BATCH, help="Occurrences per transaction."),
    ] = DEFAULT_PRUNE_BATCH,
    status: Annotated[
        list[str] | None,
        typer.Option("--status", help="Terminal status to prune, repeatable (default: both)."),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete old terminal occurrences with their events and child rows, in bounded transactions.

    Kept: anything an adjudication, runtime control, requeue request, open budget window, or a
    rollback-able domain migration still needs, and each job's last fired periodic tick.
    """
    age = parse_duration_ms(older_than)
    statuses = tuple(status) if status else PRUNABLE_STATUSES
    unknown = [value for value in statuses if value not in PRUNABLE_STATUSES]
    if unknown:
        raise CliFailure(
            f"--status may only be {' or '.join(PRUNABLE_STATUSES)}, not {', '.join(map(repr, unknown))}",
            exit_code=EXIT_USAGE,
            code="CLI_USAGE",
        )
    _require_database(db)
    with write_store(db) as store:
        result = store.prune(older_than_ms=age, batch_size=batch_size, dry_run=dry_run, statuses=statuses)
    if as_json:
        emit_json({"prune": result.to_dict()})
    else:
        _print_prune(result)


def _print_prune(result: PruneResult) -> None:
    verb = "would delete" if result.dry_run else "deleted"
    table = new_table("rows", verb, title=f"prune: settled before {fmt_ms(result.cutoff)}")
    for name in ("occurrences", "events", "reservations", "adjudications", "controls", "requeue_requests"):
        table.add_row(name.replace("_", " "), str(getattr(result, name)))
    console().print(table)


@command
def stats_command(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Queue depth by kind and status, oldest due age, leases, dead letters, adjudications (read-only)."""
    with read_store(db) as store:
        stats = store.stats()
    if as_json:
        emit_json({"stats": stats.to_dict()})
    else:
        _print_stats(stats)


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    return (
        f"{seconds:.1f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def _print_stats(stats: StoreStats) -> None:
    out = console()
    summary = new_table("figure", "value", title=f"scheduler stats at {fmt_ms(stats.now)}")
    rows: list[tuple[str, Any]] = [
        *((f"occurrences {status}", count) for status, count in stats.statuses.items()),
        ("oldest due", f"{fmt_ms(stats.oldest_due_at)} ({_age(stats.oldest_due_age_ms)})"),
        ("running", stats.running),
        ("expired leases", stats.expired_leases),
        ("dead letters", stats.dead_letters),
        ("paused", stats.paused),
        ("adjudications awaiting a decision", stats.adjudications_awaiting_decision),
        ("adjudications pending retry", stats.adjudications_pending),
    ]
    for name, value in rows:
        summary.add_row(name, str(value))
    out.print(summary)
    depth = new_table("kind", "status", "count", title="queue depth by kind")
    for row in stats.depth:
        depth.add_row(row.kind, row.status, str(row.count))
    out.print(depth)
