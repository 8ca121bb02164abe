"""``scheduler tasks list|show|cancel|retry``: runs of tasks, for operators (API §10).

They read the store directly (``--db``/``--schema``, like every command), so no application code is
needed: a task is a job (``--task`` is its id, its name in ``@tasks.task``), a queue a job kind, a
run an occurrence. ``cancel`` and ``retry`` act on one run (an id or a unique prefix) or, with
``--all``, on every run matching the filters, as ``Tasks.cancel_all`` / ``retry_all`` do: each run in
a transaction of its own, a run that changed meanwhile skipped. ``--all`` needs ``--queue`` or
``--task`` (``retry``: or ``--code``); acting on the runs of every task needs ``--yes``.

Exit codes as ``scheduler cancel`` / ``requeue``: 0 done (a replay prints ``(already)``), 1 not
found or a conflict, 2 a usage error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.table import Table

from scheduler.cli import ids
from scheduler.cli.common import (
    EXIT_USAGE,
    CliFailure,
    DbOption,
    JsonOption,
    LimitOption,
    command,
    compact,
    console,
    emit_json,
    fmt_ms,
    new_table,
    not_found,
    read_store,
    require_database,
    write_store,
)
from scheduler.cli.ops import (
    ReasonOption,
    cancel_one,
    occurrence_or_not_found,
    print_running_note,
    requeue_made,
)
from scheduler.cli.reads import events_table, key_option, short_ids
from scheduler.cli.runs import Run, RunFilter, list_runs, queue_of, run_cursor
from scheduler.contract.constants import DEAD_LETTER, MAX_HISTORY_LIMIT, OCCURRENCE_STATUSES
from scheduler.store.capabilities.cancellation import normalize_cancel_reason
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import RequeueResult
from scheduler.tasks.operations import (
    CANCELLABLE,
    cancel_matching,
    cancellable_statuses,
    count_matching,
    retry_evidence,
    retry_matching,
)

tasks_app = typer.Typer(
    help="Runs of tasks: list, show, cancel and retry them (one, or --all matching a filter).",
    no_args_is_help=True,
)

QueueOption = Annotated[str | None, typer.Option("--queue", help="Only runs of this queue (job kind).")]
TaskOption = Annotated[
    str | None, typer.Option("--task", help="Only runs of this task (its name: the job id; a unique prefix).")
]
CodeOption = Annotated[str | None, typer.Option("--code", help="Only runs whose last error has this code.")]
AllOption = Annotated[bool, typer.Option("--all", help="Act on every run matching the filters.")]
YesOption = Annotated[
    bool, typer.Option("--yes", help="With --all and no --queue/--task: act on the runs of every task.")
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="With --all: count the runs; change nothing.")]
RunIdArgument = Annotated[
    str | None, typer.Argument(help="The run's id or a unique prefix (omit with --all).", show_default=False)
]


def _usage(message: str) -> CliFailure:
    return CliFailure(message, exit_code=EXIT_USAGE, code="CLI_USAGE")


def runs_table(runs: Sequence[Run], short: ids.Short, title: str = "runs") -> Table:
    table = new_table("id", "task", "queue", "status", "attempt", "due", "error", title=title)
    for run in runs:
        occurrence = run.occurrence
        table.add_row(
            short(occurrence.id),
            occurrence.job_id,
            run.queue,
            occurrence.status,
            f"{occurrence.attempt}/{occurrence.max_attempts}",
            fmt_ms(occurrence.scheduled_for),
            _error_code(occurrence.last_error),
        )
    return table


def _error_code(error: object) -> str:
    """A table's error cell: the last error's code (the message is in ``show``)."""
    if error is None:
        return "-"
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else compact(error, 40)


def _filter(queue: str | None, task: str | None, statuses: Sequence[str], code: str | None) -> RunFilter:
    """The filter options checked like the store checks them (exit 2 before the database opens)."""
    unknown = [status for status in statuses if status not in OCCURRENCE_STATUSES]
    if unknown:
        raise _usage(
            f"--status must be one of {', '.join(OCCURRENCE_STATUSES)}, not {', '.join(map(repr, unknown))}"
        )
    return RunFilter(
        queue=key_option(queue, "queue", 128),
        task=key_option(task, "task"),
        statuses=tuple(dict.fromkeys(statuses)),
        code=key_option(code, "code", 128),
    )


@tasks_app.command("list")
@command
def tasks_list(
    queue: QueueOption = None,
    task: TaskOption = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status", help=f"Only runs in this status, repeatable ({', '.join(OCCURRENCE_STATUSES)})."
        ),
    ] = None,
    code: CodeOption = None,
    after: Annotated[
        str | None,
        typer.Option("--after", help="Continue after this run (the last id of the previous page)."),
    ] = None,
    limit: LimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Runs of tasks, newest first (by creation), in pages of --limit continued with --after."""
    runs = _filter(queue, task, status or (), code)
    key_option(after, "after")
    with read_store(db) as store:
        connection = store.connection
        if runs.task is not None:
            runs = RunFilter(
                runs.queue, ids.resolve(connection, ids.JOB, runs.task), runs.statuses, runs.code
            )
        cursor = None
        if after is not None:
            after = ids.resolve(connection, ids.OCCURRENCE, after)
            cursor = run_cursor(connection, after)
            if cursor is None:
                raise not_found("run", after)
        page = list_runs(connection, runs, cursor=cursor, limit=limit)
        short = short_ids(store, ids.OCCURRENCE, as_json, (run.occurrence.id for run in page.runs))
    following = page.runs[-1].occurrence.id if page.more else None
    if as_json:
        emit_json(
            {
                "runs": [run.to_dict() for run in page.runs],
                "count": len(page.runs),
                "limit": limit,
                "next": following,
                "filter": runs.to_dict(),
            }
        )
        return
    out = console()
    out.print(runs_table(page.runs, short))
    if following is not None:
        out.print(f"more: add --after {short(following)}", markup=False)


@tasks_app.command("show")
@command
def tasks_show(run_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """One run: its fields, arguments, result or error, and its events (oldest first)."""
    key_option(run_id, "runId")
    with read_store(db) as store:
        run_id = ids.resolve(store.connection, ids.OCCURRENCE, run_id)
        occurrence = store.get_occurrence(run_id)
        if occurrence is None:
            raise not_found("run", run_id)
        run = Run(occurrence, queue_of(store.connection, occurrence.job_id) or "")
        events = list(reversed(store.history(occurrence_id=run_id, limit=MAX_HISTORY_LIMIT)))
        control = store.get_occurrence_control(run_id)
        short = short_ids(store, ids.OCCURRENCE, as_json, [run_id])
    if as_json:
        emit_json(
            {
                "run": run.to_dict(),
                "occurrence": occurrence.to_dict(),
                "control": None if control is None else control.to_dict(),
                "events": [event.to_dict() for event in events],
            }
        )
        return
    out = console()
    out.print(runs_table([run], short, title="run"))
    details = run.to_dict()
    out.print(f"id: {occurrence.id}", markup=False)
    out.print(f"trigger key: {occurrence.trigger_key}", markup=False)
    for label, key in (("args", "args"), ("result", "value"), ("error", "error")):
        out.print(f"{label}: {compact(details[key], 200)}", markup=False)
    if occurrence.lease_owner is not None:
        out.print(
            f"lease: {occurrence.lease_owner} until {fmt_ms(occurrence.lease_expires_at)}", markup=False
        )
    if control is not None:
        out.print(f"control: {control.state} (revision {control.revision})", markup=False)
    out.print(events_table(events, short, title=f"events (oldest first, at most {MAX_HISTORY_LIMIT})"))


def _one_or_all(run_id: str | None, every: bool, options: bool) -> None:
    """An id, or ``--all`` with filters: never both, never neither; ``options`` (the filters,
    ``--yes``, ``--dry-run``) only with ``--all``."""
    if every and run_id is not None:
        raise _usage("give a run id or --all, not both")
    if not every and run_id is None:
        raise _usage("give a run id, or --all with --queue / --task")
    if not every and options:
        raise _usage("--queue, --task, --status, --code, --yes and --dry-run go with --all")


def _guard(scoped: bool, yes: bool) -> None:
    """``--all`` without a scoping filter acts on the runs of every task: only with ``--yes``."""
    if not scoped and not yes:
        raise _usage(
            "--all needs --queue or --task (retry: or --code); to act on the runs of every task, add --yes"
        )


def _emit_bulk(action: str, count: int, runs: RunFilter, dry_run: bool, as_json: bool) -> None:
    if as_json:
        emit_json({"action": action, "count": count, "dryRun": dry_run, "filter": runs.to_dict()})
        return
    noun = "run" if count == 1 else "runs"
    done = {"cancel": "cancelled", "retry": "retried"}[action]
    console().print(f"would {action} {count} {noun}" if dry_run else f"{done} {count} {noun}", markup=False)


@tasks_app.command("cancel")
@command
def tasks_cancel(
    run_id: RunIdArgument = None,
    reason: ReasonOption = None,
    every: AllOption = False,
    queue: QueueOption = None,
    task: TaskOption = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help=f"With --all: runs in this status, repeatable ({', '.join(CANCELLABLE)}; default queued).",
        ),
    ] = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run (a dead letter with code CANCELLED), or --all runs matching the filters.

    A waiting run never starts; a running one is told at its next lease renewal (its effects may be
    partly applied). Cancelling a cancelled run again changes nothing.
    """
    runs = _filter(queue, task, cancellable_statuses(list(status or ["queued"])), None)
    _one_or_all(run_id, every, queue is not None or task is not None or bool(status) or yes or dry_run)
    normalize_cancel_reason(reason)
    if run_id is not None:
        done = cancel_one(db, run_id, reason)
        run = Run(done.after, done.queue or "")
        if as_json:
            emit_json(
                {"run": run.to_dict(), "previousStatus": done.before.status, "deduplicated": done.already}
            )
            return
        console().print(
            runs_table([run], lambda _: done.short, "cancelled" + (" (already)" if done.already else ""))
        )
        print_running_note(done)
        return
    _guard(runs.queue is not None or runs.task is not None, yes)
    count = _bulk(db, runs, dry_run, reason, "cancel")
    _emit_bulk("cancel", count, runs, dry_run, as_json)


@tasks_app.command("retry")
@command
def tasks_retry(
    run_id: RunIdArgument = None,
    every: AllOption = False,
    queue: QueueOption = None,
    task: TaskOption = None,
    code: Annotated[
        str | None, typer.Option("--code", help="With --all: only dead letters whose error has this code.")
    ] = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Put a dead letter (failed or cancelled) back in its queue, or --all dead letters matching the
    filters. Its next claim does not count an attempt. Retrying it again changes nothing."""
    runs = _filter(queue, task, [DEAD_LETTER], code)
    _one_or_all(run_id, every, queue is not None or task is not None or code is not None or yes or dry_run)
    if run_id is None:
        _guard(runs.queue is not None or runs.task is not None or runs.code is not None, yes)
        count = _bulk(db, runs, dry_run, None, "retry")
        _emit_bulk("retry", count, runs, dry_run, as_json)
        return
    key_option(run_id, "runId")
    require_database(db)
    resolved = ids.resolve_before_write(db, ids.OCCURRENCE, run_id)
    with write_store(db) as store:
        result = _retry(store, resolved.id)
        job = store.get_job(result.occurrence.job_id)
    run = Run(result.occurrence, "" if job is None else job.kind)
    if as_json:
        emit_json({"run": run.to_dict(), "requestId": result.request_id, "deduplicated": result.deduplicated})
        return
    note = "retried" + (" (already)" if result.deduplicated else "")
    console().print(runs_table([run], lambda _: resolved.short, note))


def _retry(store: SchedulerStore, run_id: str) -> RequeueResult:
    """Requeue the dead letter with the evidence it shows now; when it is no longer one, replay the
    requeue that sent it back (``deduplicated``), else ``SCHEDULER_CONFLICT``."""
    current = occurrence_or_not_found(store, run_id)
    made = None if current.status == DEAD_LETTER else requeue_made(store, current, None)
    fence, code, request = made if made is not None else retry_evidence(current)
    return store.requeue_dead_letter(
        occurrence_id=run_id, expected_fence=fence, expected_error_code=code, request_id=request
    )


def _bulk(db: str | None, runs: RunFilter, dry_run: bool, reason: str | None, action: str) -> int:
    """``--all``: count (``--dry-run``, read-only) or act on the matching runs; how many."""
    require_database(db)
    jobs = None if runs.task is None else [ids.resolve_before_write(db, ids.JOB, runs.task).id]
    kinds = None if runs.queue is None else [runs.queue]
    statuses = list(runs.statuses)
    if dry_run:
        with read_store(db) as store:
            return count_matching(store, jobs, kinds, statuses, runs.code)
    with write_store(db) as store:
        if action == "cancel":
            return cancel_matching(store, jobs, kinds, statuses, reason)
        return retry_matching(store, jobs, kinds, runs.code)
