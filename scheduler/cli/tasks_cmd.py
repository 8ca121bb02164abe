"""``scheduler tasks list|show|cancel|retry``: the runs of tasks (API §10), for operators.

A task is a job (its name is the job id) and its queue the job kind; a run is an occurrence whose
payload holds the call's arguments (``{"args": {…}}``). These commands need no ``Tasks`` object:
they read and act on the database, so they work on any occurrence. ``cancel`` and ``retry`` take
one run id (or a unique prefix), or ``--all`` with filters: each matching run then changes in a
transaction of its own, and runs that changed meanwhile are skipped (``Tasks.cancel_all`` /
``retry_all``). Option values are checked before the database is opened (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table

from scheduler.cli import ids, queries
from scheduler.cli.common import (
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
from scheduler.cli.reads import StatusFilter, events_table, key_option, short_ids
from scheduler.store.cancellation import is_cancelled, normalize_cancel_reason
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Occurrence
from scheduler.tasks.operations import (
    CANCELLABLE,
    cancel_matching,
    cancel_run,
    cancellable_statuses,
    retry_matching,
    retry_run,
)

tasks_app = typer.Typer(
    help="Task runs: list, show, cancel and retry them (one id, or --all with filters).",
    no_args_is_help=True,
)

HISTORY_SHOWN = 50

QueueFilter = Annotated[str | None, typer.Option("--queue", help="Only runs of this queue (job kind).")]
TaskFilter = Annotated[
    str | None, typer.Option("--task", help="Only runs of this task (its name, or a unique prefix).")
]
CodeFilter = Annotated[str | None, typer.Option("--code", help="Only runs whose last error has this code.")]
AllOption = Annotated[bool, typer.Option("--all", help="Every run matching the filters (not one id).")]
RunArgument = Annotated[
    str | None, typer.Argument(help="The run id (or a unique prefix).", show_default=False)
]


def run_dict(occurrence: Occurrence, queue: str | None) -> dict[str, Any]:
    """A run as ``--json`` prints it: ``TaskRun``'s fields, its arguments and times."""
    payload = occurrence.payload
    return {
        "id": occurrence.id,
        "task": occurrence.job_id,
        "queue": queue,
        "status": occurrence.status,
        "attempt": occurrence.attempt,
        "maxAttempts": occurrence.max_attempts,
        "args": payload.get("args") if isinstance(payload, dict) else None,
        "value": occurrence.result if occurrence.status == "succeeded" else None,
        "error": occurrence.last_error,
        "scheduledFor": occurrence.scheduled_for,
        "availableAt": occurrence.available_at,
        "updatedAt": occurrence.updated_at,
        "triggerKey": occurrence.trigger_key,
    }


def runs_table(runs: Sequence[tuple[Occurrence, str | None]], short: ids.Short, title: str = "runs") -> Table:
    table = new_table("run", "task", "queue", "status", "attempt", "due", "error", title=title)
    for occurrence, queue in runs:
        error = occurrence.last_error
        code = error.get("code") if isinstance(error, dict) else None
        table.add_row(
            short(occurrence.id),
            occurrence.job_id,
            queue or "-",
            occurrence.status,
            f"{occurrence.attempt}/{occurrence.max_attempts}",
            fmt_ms(occurrence.available_at),
            "-" if code is None else str(code),
        )
    return table


def _filters(
    queue: str | None, task: str | None, code: str | None
) -> tuple[str | None, str | None, str | None]:
    """The filter options checked like the store checks them (exit 2 before anything is opened)."""
    return key_option(queue, "queue", 128), key_option(task, "task"), key_option(code, "code", 128)


def _one_or_all(run_id: str | None, every: bool, filters: dict[str, Any]) -> None:
    """Exactly one of a run id or ``--all``; filters only with ``--all``."""
    if (run_id is None) == (not every):
        raise CliFailure("give a run id or --all (not both)", exit_code=2, code="CLI_USAGE")
    given = [name for name, value in filters.items() if value]
    if run_id is not None and given:
        raise CliFailure(f"{', '.join(given)} filter(s) need --all", exit_code=2, code="CLI_USAGE")


def _queue_of(store: SchedulerStore, job_id: str) -> str | None:
    job = store.get_job(job_id)
    return None if job is None else str(job.kind)


@tasks_app.command("list")
@command
def tasks_list(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    status: StatusFilter = None,
    code: CodeFilter = None,
    limit: LimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs, most recently updated first."""
    queue, task, code = _filters(queue, task, code)
    with read_store(db) as store:
        task = ids.resolve_optional(store.connection, ids.JOB, task)
        runs = queries.list_runs(
            store.connection, queue=queue, task=task, status=status, code=code, limit=limit
        )
        short = short_ids(store, ids.OCCURRENCE, as_json, (occurrence.id for occurrence, _ in runs))
    if as_json:
        emit_json({"runs": [run_dict(*run) for run in runs], "count": len(runs), "limit": limit})
    else:
        console().print(runs_table(runs, short))


@tasks_app.command("show")
@command
def tasks_show(run_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Show one run: its arguments, result or error, and its history."""
    key_option(run_id, "runId")
    with read_store(db) as store:
        run_id = ids.resolve(store.connection, ids.OCCURRENCE, run_id)
        occurrence = store.get_occurrence(run_id)
        if occurrence is None:
            raise not_found("run", run_id)
        queue = _queue_of(store, occurrence.job_id)
        events = store.history(occurrence_id=occurrence.id, limit=HISTORY_SHOWN)
        short = short_ids(store, ids.OCCURRENCE, as_json, [occurrence.id])
    run = run_dict(occurrence, queue)
    if as_json:
        emit_json({"run": run, "history": [event.to_dict() for event in events]})
        return
    out = console()
    out.print(runs_table([(occurrence, queue)], short, title="run"))
    for key in ("args", "value", "error"):
        out.print(f"{key}: {compact(run[key], 200)}", markup=False)
    out.print(events_table(events, short))


@tasks_app.command("cancel")
@command
def tasks_cancel(
    run_id: RunArgument = None,
    every: AllOption = False,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help=f"With --all: runs in this status, repeatable ({', '.join(CANCELLABLE)}; default queued).",
        ),
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (one run): the dead letter's error message.")
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run (it becomes a dead letter with code CANCELLED), or --all matching runs.

    A run waiting in its queue never starts; a running one is told at its next lease renewal (its
    effects may be partly applied). ``scheduler tasks retry`` puts a cancelled run back.
    """
    queue, task, _ = _filters(queue, task, None)
    statuses = cancellable_statuses(status or ["queued"])
    _one_or_all(run_id, every, {"--queue": queue, "--task": task, "--status": status})
    normalize_cancel_reason(reason)
    if run_id is None:
        count = _on_all(db, task, lambda store, jobs: cancel_matching(store, jobs, _kinds(queue), statuses))
        _report_count("cancelled", count, as_json)
        return
    done = _on_one(db, run_id, lambda store, current: cancel_run(store, current.id, reason))
    already = is_cancelled(done.before.status, done.before.last_error)
    if as_json:
        emit_json({**done.json(), "previousStatus": done.before.status, "deduplicated": already})
    else:
        done.print("cancelled" + (" (already)" if already else ""))


@tasks_app.command("retry")
@command
def tasks_retry(
    run_id: RunArgument = None,
    every: AllOption = False,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    code: CodeFilter = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Put a dead letter (failed or cancelled) back in its queue, or --all matching dead letters."""
    queue, task, code = _filters(queue, task, code)
    _one_or_all(run_id, every, {"--queue": queue, "--task": task, "--code": code})
    if run_id is None:
        count = _on_all(db, task, lambda store, jobs: retry_matching(store, jobs, _kinds(queue), code))
        _report_count("retried", count, as_json)
        return
    done = _on_one(db, run_id, lambda store, current: retry_run(store, current.id))
    if as_json:
        emit_json(done.json())
    else:
        done.print("retried")


def _kinds(queue: str | None) -> list[str] | None:
    return None if queue is None else [queue]


def _on_all(db: str | None, task: str | None, act: Callable[[SchedulerStore, list[str] | None], int]) -> int:
    """``act(store, jobs)`` on the database (``jobs``: the ``--task`` filter resolved); its count."""
    require_database(db)
    jobs = None if task is None else [ids.resolve_before_write(db, ids.JOB, task).id]
    with write_store(db) as store:
        return act(store, jobs)


@dataclass(frozen=True)
class _Changed:
    """One run before and after a command changed it, with its queue and short id."""

    before: Occurrence
    after: Occurrence
    queue: str | None
    short: str

    def json(self) -> dict[str, Any]:
        return {"run": run_dict(self.after, self.queue)}

    def print(self, note: str) -> None:
        console().print(runs_table([(self.after, self.queue)], lambda _: self.short, title=note))


def _on_one(db: str | None, run_id: str, act: Callable[[SchedulerStore, Occurrence], Occurrence]) -> _Changed:
    """``act(store, run)`` on the run ``run_id`` names (a whole id or a unique prefix)."""
    key_option(run_id, "runId")
    require_database(db)
    resolved = ids.resolve_before_write(db, ids.OCCURRENCE, run_id)
    with write_store(db) as store:
        before = store.get_occurrence(resolved.id)
        if before is None:
            raise not_found("run", resolved.id)
        after = act(store, before)
        return _Changed(before, after, _queue_of(store, after.job_id), resolved.short)


def _report_count(verb: str, count: int, as_json: bool) -> None:
    if as_json:
        emit_json({verb: count})
    else:
        console().print(f"{count} run{'' if count == 1 else 's'} {verb}", markup=False)


__all__ = ["run_dict", "runs_table", "tasks_app"]
