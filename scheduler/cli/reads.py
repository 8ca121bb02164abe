"""``jobs``, ``occurrences``, ``history`` and ``dead-letters``: read-only views of the work."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from scheduler.cli import ids, queries
from scheduler.cli.common import (
    DbOption,
    JsonOption,
    LimitOption,
    StoreLimitOption,
    command,
    compact,
    console,
    emit_json,
    emit_listing,
    fmt_ms,
    new_table,
    not_found,
    read_store,
)
from scheduler.contract.constants import OCCURRENCE_STATUSES
from scheduler.contract.storable import normalize_optional_key
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Event, Job, Occurrence

jobs_app = typer.Typer(help="Jobs (definitions and revisions).", no_args_is_help=True)
occurrences_app = typer.Typer(help="Occurrences (the scheduled runs of jobs).", no_args_is_help=True)

# The choices, spelled out for the type checker (tests/test_cli.py checks them against the constants).
OccurrenceStatusName = Literal["queued", "running", "retry_wait", "succeeded", "dead_letter"]

JobFilter = Annotated[str | None, typer.Option("--job", help="Only this job's rows.")]
StatusFilter = Annotated[
    OccurrenceStatusName | None,
    typer.Option("--status", help=f"Only occurrences in this status ({', '.join(OCCURRENCE_STATUSES)})."),
]


def key_option(value: str | None, field: str, max_length: int = 256) -> str | None:
    """An identifier option checked like the store checks it, before the database is opened: a
    bad value is ``SCHEDULER_INVALID_ARGUMENT`` (exit 2) whatever the state of the database."""
    return normalize_optional_key(value, field, max_length)


def jobs_table(jobs: Sequence[Job]) -> Table:
    table = new_table("id", "kind", "enabled", "rev", "max attempts", "principal", "updated", title="jobs")
    for job in jobs:
        principal = job.authority["principal"]
        table.add_row(
            job.id,
            job.kind,
            "yes" if job.enabled else "no",
            str(job.revision),
            str(job.max_attempts),
            f"{principal['type']}:{principal['id']}",
            fmt_ms(job.updated_at),
        )
    return table


def occurrences_table(
    occurrences: Sequence[Occurrence], short: ids.Short, title: str = "occurrences"
) -> Table:
    table = new_table(
        "id", "job", "trigger", "status", "attempt", "fence", "available", "last error", title=title
    )
    for occurrence in occurrences:
        table.add_row(
            short(occurrence.id),
            occurrence.job_id,
            occurrence.trigger_key,
            occurrence.status,
            f"{occurrence.attempt}/{occurrence.max_attempts}",
            str(occurrence.fence),
            fmt_ms(occurrence.available_at),
            "-" if occurrence.last_error is None else compact(occurrence.last_error, 40),
        )
    return table


def events_table(events: Sequence[Event], short: ids.Short, title: str = "history") -> Table:
    table = new_table("#", "at", "type", "occurrence", "owner", "fence", "data", title=title)
    for event in events:
        table.add_row(
            str(event.event_id),
            fmt_ms(event.occurred_at),
            event.type,
            short(event.occurrence_id),
            event.owner_id or "-",
            "-" if event.fence is None else str(event.fence),
            compact(event.data),
        )
    return table


@jobs_app.command("list")
@command
def jobs_list(
    kind: Annotated[str | None, typer.Option("--kind", help="Only jobs of this kind.")] = None,
    limit: LimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List jobs by id."""
    kind = key_option(kind, "kind", 128)
    with read_store(db) as store:
        jobs = queries.list_jobs(store.connection, kind=kind, limit=limit)
    emit_listing("jobs", jobs, limit=limit, as_json=as_json, table=lambda: jobs_table(jobs))


@jobs_app.command("show")
@command
def jobs_show(job_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Show one job and how many of its occurrences are in each status."""
    key_option(job_id, "jobId")
    with read_store(db) as store:
        job_id = ids.resolve(store.connection, ids.JOB, job_id)
        job = store.get_job(job_id)
        if job is None:
            raise not_found("job", job_id)
        counts = queries.occurrence_status_counts(store.connection, job_id=job.id)
    if as_json:
        emit_json({"job": job.to_dict(), "occurrences": counts})
        return
    out = console()
    out.print(jobs_table([job]))
    out.print("trigger: " + compact(job.trigger, 200), markup=False)
    out.print("payload: " + compact(job.payload, 200), markup=False)
    out.print("authority: " + compact(job.authority, 200), markup=False)
    out.print("occurrences: " + ", ".join(f"{status} {count}" for status, count in counts.items()))


@occurrences_app.command("list")
@command
def occurrences_list(
    status: StatusFilter = None,
    job: JobFilter = None,
    limit: LimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List occurrences, most recently updated first."""
    job = key_option(job, "jobId")
    with read_store(db) as store:
        job = ids.resolve_optional(store.connection, ids.JOB, job)
        found = queries.list_occurrences(store.connection, status=status, job_id=job, limit=limit)
        short = _short_occurrences(store, as_json, (occurrence.id for occurrence in found))
    emit_listing(
        "occurrences", found, limit=limit, as_json=as_json, table=lambda: occurrences_table(found, short)
    )


@occurrences_app.command("show")
@command
def occurrences_show(occurrence_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Show one occurrence with its runtime control, authority reservation and adjudication."""
    key_option(occurrence_id, "occurrenceId")
    with read_store(db) as store:
        occurrence_id = ids.resolve(store.connection, ids.OCCURRENCE, occurrence_id)
        occurrence = store.get_occurrence(occurrence_id)
        if occurrence is None:
            raise not_found("occurrence", occurrence_id)
        short = _short_occurrences(store, as_json, [occurrence.id])
        control = store.get_occurrence_control(occurrence.id)
        reservation = store.get_authority_reservation(occurrence.id)
        adjudication = store.get_occurrence_adjudication(occurrence.id)
    result: dict[str, Any] = {
        "occurrence": occurrence.to_dict(),
        "control": None if control is None else control.to_dict(),
        "reservation": None if reservation is None else reservation.to_dict(),
        "adjudication": None if adjudication is None else adjudication.to_dict(),
    }
    if as_json:
        emit_json(result)
        return
    out = console()
    out.print(occurrences_table([occurrence], short, title="occurrence"))
    for key in ("payload", "result", "lastError"):
        out.print(f"{key}: {compact(result['occurrence'][key], 200)}", markup=False)
    for key in ("control", "reservation", "adjudication"):
        out.print(f"{key}: {'-' if result[key] is None else compact(result[key], 200)}", markup=False)


@command
def history_command(
    job: JobFilter = None,
    occurrence: Annotated[
        str | None, typer.Option("--occurrence", help="Only this occurrence's events.")
    ] = None,
    limit: StoreLimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The event history, newest first."""
    key_option(job, "jobId")
    key_option(occurrence, "occurrenceId")
    with read_store(db) as store:
        job = ids.resolve_optional(store.connection, ids.JOB, job)
        occurrence = ids.resolve_optional(store.connection, ids.OCCURRENCE, occurrence)
        events = store.history(job_id=job, occurrence_id=occurrence, limit=limit)
        short = _short_occurrences(store, as_json, (event.occurrence_id for event in events))
    emit_listing("events", events, limit=limit, as_json=as_json, table=lambda: events_table(events, short))


@command
def dead_letters_command(
    job: JobFilter = None, limit: StoreLimitOption = 50, db: DbOption = None, as_json: JsonOption = False
) -> None:
    """Dead-lettered occurrences, most recently settled first."""
    key_option(job, "jobId")
    with read_store(db) as store:
        job = ids.resolve_optional(store.connection, ids.JOB, job)
        dead = store.list_dead_letters(job_id=job, limit=limit)
        short = _short_occurrences(store, as_json, (occurrence.id for occurrence in dead))
    emit_listing(
        "deadLetters",
        dead,
        limit=limit,
        as_json=as_json,
        table=lambda: occurrences_table(dead, short, title="dead letters"),
    )


def short_ids(
    store: SchedulerStore, space: ids.IdSpace, as_json: bool, values: Iterable[str | None]
) -> ids.Short:
    """The short ids a table of this read snapshot shows (none computed for ``--json``)."""
    return ids.whole if as_json else ids.shortener(store.connection, space, values)


def _short_occurrences(store: SchedulerStore, as_json: bool, values: Iterable[str | None]) -> ids.Short:
    return short_ids(store, ids.OCCURRENCE, as_json, values)
