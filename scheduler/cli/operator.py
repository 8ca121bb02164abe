"""``adjudication``, ``migrations`` and ``controls``: the operator's queues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from scheduler.cli import ids
from scheduler.cli.common import (
    DbOption,
    JsonOption,
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
    require_database,
    write_store,
)
from scheduler.cli.reads import key_option, short_ids
from scheduler.contract.constants import RUNTIME_CONTROL_OCCURRENCE_STATUSES
from scheduler.contract.digests import (
    scheduler_adjudication_operator_digest,
    scheduler_adjudication_reason_digest,
)
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.scalars import normalize_sha256_digest
from scheduler.store.capabilities.runtime_reads import normalize_runtime_control_enumeration
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import AdjudicationCase, DomainMigration, RuntimeControlOccurrence

adjudication_app = typer.Typer(
    help="Outcome-unknown dead letters awaiting an operator decision.", no_args_is_help=True
)
migrations_app = typer.Typer(
    help="The domain migration journal (legacy sources moved into jobs).", no_args_is_help=True
)
controls_app = typer.Typer(
    help="Runtime control (pause / resume) of running occurrences.", no_args_is_help=True
)

# The choices, spelled out for the type checker (tests/test_cli.py checks them against the constants).
DecisionName = Literal["confirmed_applied", "confirmed_not_applied"]
MigrationStateName = Literal[
    "prepared", "applied", "verified", "retiring", "retired", "rolling_back", "rolled_back"
]
RuntimeStatusName = Literal["running", "pause_requested", "paused"]


def cases_table(cases: Sequence[AdjudicationCase], short: ids.Short) -> Table:
    table = new_table(
        "occurrence", "job", "status", "error", "attempt", "fence", "eligible", "evidence", "decision"
    )
    for case in cases:
        table.add_row(
            short(case.occurrence_id),
            case.job_id,
            case.status,
            case.error_code or "-",
            f"{case.attempt}/{case.max_attempts}",
            str(case.fence),
            "yes" if case.eligible else "no",
            case.evidence_digest or "-",
            "-"
            if case.adjudication is None
            else f"{case.adjudication.decision} ({case.adjudication.status})",
        )
    return table


def migrations_table(migrations: Sequence[DomainMigration], short: ids.Short) -> Table:
    table = new_table(
        "id", "state", "entries", "created", "updated", "completed", "last error", title="domain migrations"
    )
    for migration in migrations:
        table.add_row(
            short(migration.id),
            migration.state,
            str(migration.entry_count),
            fmt_ms(migration.created_at),
            fmt_ms(migration.updated_at),
            fmt_ms(migration.completed_at),
            "-" if migration.last_error is None else compact(migration.last_error, 40),
        )
    return table


def controls_table(occurrences: Sequence[RuntimeControlOccurrence], short: ids.Short) -> Table:
    table = new_table(
        "occurrence", "job", "kind", "runtime", "attempt", "fence", "control", "updated", title="controls"
    )
    for item in occurrences:
        control = item.control
        table.add_row(
            short(item.id),
            item.job_id,
            item.job_kind,
            item.runtime_status,
            f"{item.attempt}/{item.max_attempts}",
            str(item.fence),
            "-" if control is None else f"{control.state} r{control.revision}",
            fmt_ms(item.updated_at),
        )
    return table


@adjudication_app.command("list")
@command
def adjudication_list(limit: StoreLimitOption = 50, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Dead letters whose outcome is unknown and that may be adjudicated."""
    with read_store(db) as store:
        cases = store.list_adjudication_cases(limit=limit)
        short = short_ids(store, ids.OCCURRENCE, as_json, (case.occurrence_id for case in cases))
    emit_listing("cases", cases, limit=limit, as_json=as_json, table=lambda: cases_table(cases, short))


@adjudication_app.command("show")
@command
def adjudication_show(occurrence_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """One occurrence's adjudication case: the evidence a decision must quote."""
    key_option(occurrence_id, "occurrenceId")
    with read_store(db) as store:
        occurrence_id = ids.resolve(store.connection, ids.OCCURRENCE, occurrence_id)
        case = store.get_adjudication_case(occurrence_id)
        short = short_ids(store, ids.OCCURRENCE, as_json, [occurrence_id])
    if case is None:
        raise not_found("occurrence", occurrence_id)
    if as_json:
        emit_json({"case": case.to_dict()})
        return
    out = console()
    out.print(cases_table([case], short))
    if case.eligible:
        out.print(
            f"decide with: scheduler adjudication decide {short(case.occurrence_id)} --decision <decision> "
            f"--evidence-digest {case.evidence_digest} --attempt {case.attempt} --fence {case.fence} "
            "--reason <text> --operator <identity>",
            markup=False,
        )


@adjudication_app.command("decide")
@command
def adjudication_decide(
    occurrence_id: str,
    decision: Annotated[DecisionName, typer.Option("--decision", help="What the operator confirmed.")],
    evidence_digest: Annotated[str, typer.Option("--evidence-digest", help="The case's evidence digest.")],
    attempt: Annotated[int, typer.Option("--attempt", min=1, help="The case's attempt (>= 1).")],
    fence: Annotated[int, typer.Option("--fence", min=1, help="The case's fence (>= 1).")],
    reason: Annotated[str, typer.Option("--reason", help="Why (stored as its sha256 digest).")],
    operator: Annotated[str, typer.Option("--operator", help="Who decides (stored as its sha256 digest).")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record a decision for an outcome-unknown dead letter (compare-and-set on the evidence)."""
    key_option(occurrence_id, "occurrenceId")  # checked before the database is opened
    normalize_sha256_digest(evidence_digest, "expectedEvidenceDigest")
    reason_digest = scheduler_adjudication_reason_digest(reason)
    operator_digest = scheduler_adjudication_operator_digest(operator)
    require_database(db)  # a decision needs the database it decides about: never create one
    resolved = ids.resolve_before_write(db, ids.OCCURRENCE, occurrence_id)
    occurrence_id = resolved.id
    decided = {
        "decision": decision,
        "evidence_digest": evidence_digest,
        "expected_attempt": attempt,
        "expected_fence": fence,
        "reason_digest": reason_digest,
        "operator_digest": operator_digest,
    }
    with write_store(db) as store:
        try:
            case = store.adjudicate_occurrence(
                occurrence_id=occurrence_id,
                decision=decision,
                expected_evidence_digest=evidence_digest,
                expected_attempt=attempt,
                expected_fence=fence,
                reason_digest=reason_digest,
                operator_digest=operator_digest,
            )
            already = False
        except SchedulerKernelError as error:
            case, already = _the_same_decision(store, occurrence_id, decided, error), True
    if as_json:
        emit_json({"case": case.to_dict(), "deduplicated": already})
    else:
        console().print(cases_table([case], lambda _: resolved.short))
        if already:
            console().print("this decision was already recorded", markup=False)


def _the_same_decision(
    store: SchedulerStore, occurrence_id: str, decided: dict[str, Any], refusal: SchedulerKernelError
) -> AdjudicationCase:
    """The case when the store refused a second decision and the one recorded is this very one
    (the command run again, or losing to the identical command run at the same moment): it is
    reported, not refused. Any other refusal, or a different decision, is raised (exit 1)."""
    if refusal.code != "SCHEDULER_ADJUDICATION_ALREADY_RECORDED":
        raise refusal
    case = store.get_adjudication_case(occurrence_id)
    recorded = None if case is None else case.adjudication
    if case is None or recorded is None or any(getattr(recorded, k) != v for k, v in decided.items()):
        raise refusal
    return case


@migrations_app.command("list")
@command
def migrations_list(
    state: Annotated[
        MigrationStateName | None, typer.Option("--state", help="Only migrations in this state.")
    ] = None,
    limit: StoreLimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Domain migrations, newest first."""
    with read_store(db) as store:
        found = store.list_domain_migrations(state=state, limit=limit)
        short = short_ids(store, ids.MIGRATION, as_json, (migration.id for migration in found))
    emit_listing(
        "migrations", found, limit=limit, as_json=as_json, table=lambda: migrations_table(found, short)
    )


@migrations_app.command("show")
@command
def migrations_show(migration_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """One domain migration with its entries."""
    key_option(migration_id, "migrationId")
    with read_store(db) as store:
        migration_id = ids.resolve(store.connection, ids.MIGRATION, migration_id)
        migration = store.get_domain_migration(migration_id)
        short = short_ids(store, ids.MIGRATION, as_json, [migration_id])
    if migration is None:
        raise not_found("domain migration", migration_id)
    if as_json:
        emit_json({"migration": migration.to_dict()})
        return
    out = console()
    out.print(migrations_table([migration], short))
    entries = new_table(
        "entry", "domain", "source", "target job", "strategy", "state", "action", title="entries"
    )
    for entry in migration.entries or ():
        entries.add_row(
            entry.entry_id,
            entry.domain,
            entry.source_id,
            entry.target_job_id,
            entry.rollback_strategy,
            entry.state,
            entry.target_action or "-",
        )
    out.print(entries)


@controls_app.command("list")
@command
def controls_list(
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help=f"Runtime status to include, repeatable ({', '.join(RUNTIME_CONTROL_OCCURRENCE_STATUSES)}).",
        ),
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option("--kind", help="Job kind to include, repeatable (default: every kind)."),
    ] = None,
    limit: StoreLimitOption = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Running, pause-requested and paused occurrences, of every job kind unless --kind is given."""
    # Checked like the store checks them, before the database is opened (a bad value exits 2).
    statuses = normalize_runtime_control_enumeration(
        status or RUNTIME_CONTROL_OCCURRENCE_STATUSES, RUNTIME_CONTROL_OCCURRENCE_STATUSES, "statuses"
    )
    kinds = [key_option(value, "jobKinds[]", 128) or "" for value in kind] if kind else None
    with read_store(db) as store:
        found = store.list_controllable_occurrences(statuses=statuses, job_kinds=kinds, limit=limit)
        short = short_ids(store, ids.OCCURRENCE, as_json, (item.id for item in found))
    emit_listing(
        "occurrences", found, limit=limit, as_json=as_json, table=lambda: controls_table(found, short)
    )
