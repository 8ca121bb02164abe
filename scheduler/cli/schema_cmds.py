"""``init``, ``upgrade``, ``verify`` and ``info``: the database as a whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated, Any

import typer

import scheduler
from scheduler.cli import queries
from scheduler.cli.common import (
    EXIT_FAILURE,
    DbOption,
    JsonOption,
    command,
    console,
    database_file,
    emit_json,
    existing_file,
    fmt_ms,
    new_table,
    readonly_connection,
    resolve_target,
    stored_journal_mode,
)
from scheduler.cli.verification import Verification, verify_database
from scheduler.schema import catalog, ddl
from scheduler.schema.upgrade import LATEST_VERSION, UPGRADE_STEPS, UpgradeStep, inspect_database
from scheduler.store import open_store

DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Show which steps would run; write nothing.")]
SqlOption = Annotated[bool, typer.Option("--sql", help="Print the SQL of the pending steps; write nothing.")]


def _current_version(path: Path) -> int:
    """The version an upgrade would start from (0 = new or empty), after the store's refusal checks."""
    if not path.exists():
        return 0
    with readonly_connection(str(path)) as (_, connection):
        return inspect_database(connection)


def _step_dict(step: UpgradeStep) -> dict[str, Any]:
    return {"version": step.version, "name": step.name, "checksum": step.checksum}


def _step_sql(step: UpgradeStep) -> str:
    lines = [
        f"-- v{step.version}: {step.name} (checksum {step.checksum})",
        ddl.MIGRATION_SQL[step.version].strip(),
    ]
    if step.version == 1:
        lines.append(f"PRAGMA application_id = {ddl.SCHEDULER_APPLICATION_ID};")
    if step.version == 2:
        lines.append(
            "-- then the authority backfill (scheduler.schema.upgrade.migrate_authority_v2): a policy per"
        )
        lines.append("-- principal of every job and live occurrence, and their authority bound to it")
    lines.append(f"-- INSERT INTO migrations (version {step.version}, applied_at = now)")
    lines.append(f"PRAGMA user_version = {step.version};")
    return "\n".join(lines)


def _print_sql(steps: list[UpgradeStep], as_json: bool) -> None:
    if as_json:
        emit_json({"steps": [{**_step_dict(step), "sql": _step_sql(step)} for step in steps]})
        return
    typer.echo("BEGIN IMMEDIATE;")
    for step in steps:
        typer.echo(_step_sql(step) + "\n")
    typer.echo("COMMIT;")


def _report(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    database, before, after, dry_run = (
        result[key] for key in ("database", "fromVersion", "toVersion", "dryRun")
    )
    if before == after:
        typer.echo(f"{database}: already at v{after}")
    else:
        verb = "create" if before == 0 else "upgrade"
        typer.echo(f"{database}: {f'would {verb}' if dry_run else f'{verb}d'} v{before} -> v{after}")
    for step in result["steps"]:
        typer.echo(f"  v{step['version']} {step['name']}")
    if result["fingerprint"]:
        typer.echo(f"fingerprint: {result['fingerprint']}")


def _upgrade(db: str | None, *, must_exist: bool, dry_run: bool, sql: bool, as_json: bool) -> None:
    target = resolve_target(db)
    path = existing_file(target) if must_exist else database_file(target)
    from_version = _current_version(path)
    steps = list(UPGRADE_STEPS[from_version:])
    if sql:
        _print_sql(steps, as_json)
        return
    fingerprint = None
    if not dry_run:
        # Verify, then create or upgrade in one BEGIN IMMEDIATE transaction; the fingerprint is
        # read on the store's own connection, so that closing it (the last connection) leaves
        # only the checkpointed main file behind.
        with open_store(target) as store:
            fingerprint = catalog.schema_fingerprint(store.connection)
    _report(
        {
            "database": str(path),
            "fromVersion": from_version,
            "toVersion": LATEST_VERSION,
            "steps": [_step_dict(step) for step in steps],
            "dryRun": dry_run,
            "fingerprint": fingerprint,
        },
        as_json,
    )


@command
def init_command(
    db: DbOption = None, dry_run: DryRunOption = False, sql: SqlOption = False, as_json: JsonOption = False
) -> None:
    """Create the database (or upgrade an existing one) at the current schema version."""
    _upgrade(db, must_exist=False, dry_run=dry_run, sql=sql, as_json=as_json)


@command
def upgrade_command(
    db: DbOption = None, dry_run: DryRunOption = False, sql: SqlOption = False, as_json: JsonOption = False
) -> None:
    """Upgrade an existing database to the current schema version (one transaction)."""
    _upgrade(db, must_exist=True, dry_run=dry_run, sql=sql, as_json=as_json)


def _print_verification(path: Path, verification: Verification) -> None:
    out = console()
    out.print(f"{path}: schema v{verification.version}", markup=False)
    for finding in verification.findings:
        out.print(f"{finding.check}: {finding.code}: {finding.message}", style="red", markup=False)
        if finding.details is not None:
            out.print(f"    details: {finding.details}", markup=False)
    for check in verification.to_dict()["checks"]:
        out.print(f"  {'ok  ' if check['ok'] else 'FAIL'} {check['name']}", markup=False)
    if not verification.ok:
        count = len(verification.findings)
        out.print(f"verification FAILED ({count} finding{'' if count == 1 else 's'})")
        return
    if verification.version < LATEST_VERSION:
        out.print(f"an upgrade to v{LATEST_VERSION} is pending (run `scheduler upgrade`)", markup=False)
    out.print("verified: ok")


@command
def verify_command(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Check integrity, catalog, migration history and foreign keys. Read-only; exit 1 on drift."""
    with readonly_connection(resolve_target(db)) as (path, connection):
        verification = verify_database(connection)
    if as_json:
        emit_json({"database": str(path), **verification.to_dict()})
    else:
        _print_verification(path, verification)
    if not verification.ok:
        raise typer.Exit(EXIT_FAILURE)


def _info(path: Path) -> dict[str, Any]:
    with readonly_connection(str(path)) as (_, connection):
        version = catalog.read_pragma_int(connection, "user_version")
        tables = queries.table_row_counts(connection)
        fingerprint = catalog.schema_fingerprint(connection)
        return {
            "database": str(path),
            "files": queries.file_sizes(path),
            "journalMode": stored_journal_mode(path, queries.pragma_text(connection, "journal_mode")),
            "versions": {
                "package": scheduler.__version__,
                "sqlite": sqlite3.sqlite_version,
                "schema": version,
                "latestSchema": LATEST_VERSION,
                "applicationId": catalog.read_pragma_int(connection, "application_id"),
            },
            "fingerprint": {
                "actual": fingerprint,
                "expected": ddl.SCHEMA_FINGERPRINTS.get(version),
                "matches": fingerprint == ddl.SCHEMA_FINGERPRINTS.get(version),
            },
            "migrations": [row.to_dict() for row in queries.migration_rows(connection)]
            if "migrations" in tables
            else [],
            "tables": tables,
            "occurrences": queries.occurrence_status_counts(connection) if "occurrences" in tables else {},
        }


def _print_info(info: dict[str, Any]) -> None:
    out = console()
    versions, fingerprint = info["versions"], info["fingerprint"]
    out.print(f"database: {info['database']} (journal mode {info['journalMode']})")
    out.print("files: " + ", ".join(f"{name} {size} B" for name, size in info["files"].items()))
    out.print(
        f"schema v{versions['schema']} (latest v{versions['latestSchema']}), application id "
        f"{versions['applicationId']:#x}, package {versions['package']}, SQLite {versions['sqlite']}"
    )
    out.print(f"fingerprint: {fingerprint['actual']} ({'matches' if fingerprint['matches'] else 'DRIFT'})")
    for migration in info["migrations"]:
        out.print(f"  v{migration['version']} {migration['name']} applied {fmt_ms(migration['appliedAt'])}")
    counts = new_table("table", "rows", title="rows per table")
    for name, count in info["tables"].items():
        counts.add_row(name, str(count))
    out.print(counts)
    if info["occurrences"]:
        statuses = new_table("status", "occurrences", title="occurrences per status")
        for status, count in info["occurrences"].items():
            statuses.add_row(status, str(count))
        out.print(statuses)


@command
def info_command(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Versions, fingerprint, row counts, occurrences per status, file sizes, journal mode."""
    info = _info(existing_file(resolve_target(db)))
    if as_json:
        emit_json(info)
    else:
        _print_info(info)
