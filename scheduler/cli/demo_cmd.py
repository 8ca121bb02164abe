"""``scheduler demo``: run the demo worker (``scheduler.demo``) and print its history."""

from __future__ import annotations

import typer
from rich.table import Table

from scheduler.cli.common import (
    DbOption,
    JsonOption,
    cli_invocation,
    command,
    compact,
    console,
    describe_target,
    emit_json,
    fmt_ms,
    new_table,
    resolve_target,
    write_store,
)
from scheduler.demo import DemoReport, run_demo


def _clock_time(value: int) -> str:
    """The time of day part of an ISO timestamp (``12:19:18.885``)."""
    return fmt_ms(value)[11:-1]


def history_table(report: DemoReport) -> Table:
    """The demo's history with task names instead of occurrence ids."""
    tasks = {occurrence.id: occurrence.trigger_key for occurrence in report.occurrences}
    table = new_table(
        "#", "time (UTC)", "task", "event", "attempt", "fence", title=f"history of {report.job.id}"
    )
    for event in report.events:
        data = event.data if isinstance(event.data, dict) else {}
        event_name = event.type.removeprefix("occurrence_")
        if "retryAt" in data:
            event_name += f" (retry at {_clock_time(data['retryAt'])})"
        table.add_row(
            str(event.event_id),
            _clock_time(event.occurred_at),
            tasks.get(event.occurrence_id or "", "-"),
            event_name,
            str(data.get("attempt", "-")),
            "-" if event.fence is None else str(event.fence),
        )
    return table


def outcome_table(report: DemoReport) -> Table:
    table = new_table("task", "status", "attempts", "result / last error", title="final occurrences")
    for occurrence in report.occurrences:
        outcome = occurrence.result if occurrence.status == "succeeded" else occurrence.last_error
        table.add_row(
            occurrence.trigger_key,
            occurrence.status,
            f"{occurrence.attempt}/{occurrence.max_attempts}",
            compact(outcome, 70),
        )
    return table


@command
def demo_command(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Create a demo job, run a small worker over four occurrences, print the history.

    One occurrence succeeds, one fails once and succeeds on its retry, one fails every attempt
    and is dead-lettered, one more succeeds. Each run uses a new job id.
    """
    target = resolve_target(db)
    with write_store(target) as store:
        report = run_demo(store)
    if as_json:
        emit_json({"database": describe_target(target), **report.to_dict()})
        return
    out = console()
    out.print(f"database: {describe_target(target)}", markup=False)
    out.print(
        f"job: {report.job.id} (kind {report.job.kind}, max attempts {report.job.max_attempts})", markup=False
    )
    out.print(history_table(report))
    out.print(outcome_table(report))
    out.print(
        f"see also: {cli_invocation(target)} history --job {report.job.id}", markup=False, soft_wrap=True
    )
    if not report.complete:
        typer.echo("warning: some occurrences did not reach a terminal status", err=True)
