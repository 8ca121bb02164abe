"""``init``, ``upgrade``, ``verify`` and ``info``: the database as a whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import Connection, create_engine, make_url, select
from sqlalchemy.pool import NullPool

import scheduler
from scheduler.cli import pg_target, queries
from scheduler.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliFailure,
    DbOption,
    JsonOption,
    command,
    console,
    database_file,
    emit_json,
    existing_file,
    file_is_shared,
    fmt_ms,
    new_table,
    readonly_connection,
    refuse_stray_file,
    resolve_schema,
    resolve_target,
    sqlite_schema,
    target_is_shared,
)
from scheduler.cli.readonly import stored_journal_mode
from scheduler.cli.verification import Verification, verify_database, verify_postgresql
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import catalog, ddl, offline, tables
from scheduler.schema.target import SchemaTarget, schema_target
from scheduler.schema.upgrade import (
    LATEST_VERSION,
    UPGRADE_STEPS,
    UpgradeStep,
    inspect_database,
    wall_clock_ms,
)
from scheduler.store import open_store

DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Show which steps would run; write nothing.")]
SqlOption = Annotated[
    bool,
    typer.Option(
        "--sql",
        help="Print a guarded sqlite3/psql script of the pending steps (refused where a step needs "
        "data an offline script cannot compute); write nothing.",
    ),
]
SharedOption = Annotated[
    bool, typer.Option("--shared", help="With --sql: the SQLite file is shared with an application.")
]
SchemaNameOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="The global --schema, also accepted here (this one wins): the PostgreSQL schema "
        "(default scheduler); with --sql on SQLite the attached database the script addresses.",
        show_default=False,
    ),
]


def _current_version(path: Path, shared: bool) -> int:
    """The version an upgrade would start from (0 = new or empty), after the store's refusal checks."""
    if not path.exists():
        return 0
    with readonly_connection(str(path)) as (_, connection):
        return inspect_database(connection, exclusive=not shared)


def _step_dict(step: UpgradeStep) -> dict[str, Any]:
    return {"version": step.version, "name": step.name, "checksum": step.checksum}


def _backfill_has_work(connection: Connection, from_version: int, target: SchemaTarget) -> bool:
    """Whether a v1 database holds rows the v2 backfill would rewrite (not scriptable)."""
    if from_version != 1:
        return False
    return any(
        connection.execute(select(table.c[0]).limit(1), execution_options=_options(target)).first()
        is not None
        for table in (tables.jobs, tables.occurrences)
    )


def _options(target: SchemaTarget) -> dict[str, Any]:
    mapping = target.translate_map
    return {} if mapping is None else {"schema_translate_map": mapping}


def _inspect_for_script(
    db_target: str, must_exist: bool, shared: bool, schema: str | None
) -> tuple[SchemaTarget, str, int, bool]:
    """(layout, database label, version the script starts from, backfill has work); read-only."""
    if pg_target.has_own_schema(db_target):
        url = make_url(db_target)
        if "+" not in url.drivername:  # no driver named: psycopg, as postgresql_url takes it
            url = url.set(drivername=f"{url.drivername}+psycopg")
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as connection, connection.begin():
                target = schema_target(connection, schema)
                version = inspect_database(connection, schema=target.schema)
                work = _backfill_has_work(connection, version, target)
                connection.rollback()
        finally:
            engine.dispose()
        return (
            offline.offline_target(target.dialect, target.schema),
            pg_target.label(url, target.schema),
            version,
            work,
        )
    path = existing_file(db_target) if must_exist else database_file(db_target)
    target = offline.offline_target("sqlite", schema, exclusive=not shared)
    if not path.exists():
        return target, str(path), 0, False
    with readonly_connection(str(path)) as (_, connection):
        version = inspect_database(connection, exclusive=not shared)
        return target, str(path), version, _backfill_has_work(connection, version, target)


def _print_sql(db_target: str, *, must_exist: bool, shared: bool, schema: str | None, as_json: bool) -> None:
    """Print the guarded offline script (``scheduler.schema.offline``) or refuse, printing nothing."""
    target, database, from_version, backfill_work = _inspect_for_script(db_target, must_exist, shared, schema)
    if backfill_work:
        raise CliFailure(
            f"{database} is at v1 and holds jobs or occurrences: the v2 authority backfill rewrites "
            "them with canonical encodings an SQL script cannot compute. No script was printed; "
            "upgrade it online (`scheduler upgrade` or `alembic upgrade head`).",
            code="SCHEDULER_OFFLINE_UNSUPPORTED",
        )
    now = wall_clock_ms()
    steps = UPGRADE_STEPS[from_version:]
    if as_json:
        emit_json(
            {
                "database": database,
                "fromVersion": from_version,
                "toVersion": LATEST_VERSION,
                "steps": [
                    {
                        **_step_dict(step),
                        "sql": ";\n".join(offline.step_statements(step.version, now, target)) + ";",
                    }
                    for step in steps
                ],
                "script": offline.offline_script(target, from_version, now) if steps else "",
            }
        )
        return
    if not steps:
        typer.echo(f"-- {database} is already at v{LATEST_VERSION}: nothing to do")
        return
    typer.echo(offline.offline_script(target, from_version, now), nl=False)


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


def _upgrade(
    db: str | None,
    *,
    must_exist: bool,
    dry_run: bool,
    sql: bool,
    as_json: bool,
    shared: bool = False,
    schema: str | None = None,
) -> None:
    target, schema = resolve_target(db), resolve_schema(schema)
    if not pg_target.has_own_schema(target):
        shared = shared or target_is_shared(target)
    if sql:
        _print_sql(target, must_exist=must_exist, shared=shared, schema=schema, as_json=as_json)
        return
    if pg_target.has_own_schema(target):
        _upgrade_postgresql(target, schema, must_exist=must_exist, dry_run=dry_run, as_json=as_json)
        return
    if schema not in (None, "main"):
        raise CliFailure(
            "--schema names a PostgreSQL schema (on SQLite it applies only to --sql scripts)",
            exit_code=EXIT_USAGE,
            code="CLI_USAGE",
        )
    path = existing_file(target) if must_exist else database_file(target)
    try:
        from_version = _current_version(path, shared)
    except SchedulerKernelError as error:
        if not shared and error.code == catalog.SCHEMA_UNKNOWN and "tables" in (error.details or {}):
            error.message += (
                " (an application's file: `scheduler init --shared` creates the scheduler's tables "
                "beside its own)"
            )
            error.args = (error.message,)
        raise
    steps = list(UPGRADE_STEPS[from_version:])
    fingerprint = None
    if not dry_run:
        # Verify, then create or upgrade in one BEGIN IMMEDIATE transaction; the fingerprint is
        # read on the store's own connection, so that closing it (the last connection) leaves
        # only the checkpointed main file behind.
        with open_store(target, exclusive=not shared) as store:
            fingerprint = catalog.schema_fingerprint(store.connection, exclusive=not shared)
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


def _upgrade_postgresql(
    target: str, schema: str | None, *, must_exist: bool, dry_run: bool, as_json: bool
) -> None:
    """``init``/``upgrade`` of a PostgreSQL schema: the refusal checks read-only, then
    ``open_store`` (empty → v6 or vN → v6 in one transaction) unless ``dry_run``."""
    with pg_target.readonly_connection(target, schema) as (name, connection, where):
        from_version = inspect_database(connection, schema=where.schema)
    if must_exist and from_version == 0:
        raise CliFailure(f"no scheduler tables in {name} (run `scheduler init`)", code="SCHEDULER_NOT_FOUND")
    fingerprint = None
    if not dry_run:
        with open_store(target, schema=where.schema) as store:
            fingerprint = catalog.schema_fingerprint(store.connection, schema=where.schema)
    _report(
        {
            "database": name,
            "fromVersion": from_version,
            "toVersion": LATEST_VERSION,
            "steps": [_step_dict(step) for step in UPGRADE_STEPS[from_version:]],
            "dryRun": dry_run,
            "fingerprint": fingerprint,
        },
        as_json,
    )


@command
def init_command(
    db: DbOption = None,
    dry_run: DryRunOption = False,
    sql: SqlOption = False,
    shared: SharedOption = False,
    schema: SchemaNameOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create the database (or upgrade an existing one) at the current schema version."""
    _upgrade(db, must_exist=False, dry_run=dry_run, sql=sql, as_json=as_json, shared=shared, schema=schema)


@command
def upgrade_command(
    db: DbOption = None,
    dry_run: DryRunOption = False,
    sql: SqlOption = False,
    shared: SharedOption = False,
    schema: SchemaNameOption = None,
    as_json: JsonOption = False,
) -> None:
    """Upgrade an existing database to the current schema version (one transaction)."""
    _upgrade(db, must_exist=True, dry_run=dry_run, sql=sql, as_json=as_json, shared=shared, schema=schema)


def _print_verification(path: Path | str, verification: Verification) -> None:
    out = console()
    out.print(f"{path}: {verification.describe()}", markup=False)
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
    if verification.schema_version is not None and verification.schema_version < LATEST_VERSION:
        out.print(f"an upgrade to v{LATEST_VERSION} is pending (run `scheduler upgrade`)", markup=False)
    out.print("verified: ok")


@command
def verify_command(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Check integrity, catalog, migration history and foreign keys. Read-only; exit 1 on drift."""
    target = resolve_target(db)
    path: Path | str
    if pg_target.has_own_schema(target):
        with pg_target.readonly_connection(target, resolve_schema()) as (path, connection, where):
            verification = verify_postgresql(connection, where)
    else:
        sqlite_schema(resolve_schema())
        with readonly_connection(target) as (path, connection):
            verification = verify_database(connection, exclusive=not file_is_shared(connection))
    if as_json:
        emit_json({"database": str(path), **verification.to_dict()})
    else:
        _print_verification(path, verification)
    if not verification.ok:
        raise typer.Exit(EXIT_FAILURE)


def _integrity(connection: Connection, *, exclusive: bool = True) -> dict[str, Any]:
    """``PRAGMA quick_check`` as ``{ok}`` or ``{ok: false, code, message, details}`` (a shared
    file: of the scheduler's tables)."""
    try:
        catalog.assert_database_integrity(connection, exclusive=exclusive)
    except SchedulerKernelError as error:
        return {"ok": False, "code": error.code, "message": error.message, "details": error.details}
    return {"ok": True}


def _catalog_report(
    connection: Connection, fingerprint: str, expected: str | None, tables: dict[str, int]
) -> dict[str, Any]:
    """The part of ``info`` both backends share: fingerprint, migrations, row and status counts."""
    return {
        "fingerprint": {"actual": fingerprint, "expected": expected, "matches": fingerprint == expected},
        "migrations": [row.to_dict() for row in queries.migration_rows(connection)]
        if "migrations" in tables
        else [],
        "tables": tables,
        "occurrences": queries.occurrence_status_counts(connection) if "occurrences" in tables else {},
    }


def _info(path: Path) -> dict[str, Any]:
    refuse_stray_file(path)
    with readonly_connection(str(path)) as (_, connection):
        shared = file_is_shared(connection)
        integrity = _integrity(connection, exclusive=not shared)
        # A shared file's version is its migrations history (user_version is the application's).
        version = (
            _shared_version(connection) if shared else catalog.read_pragma_int(connection, "user_version")
        )
        # Row counts read every page of every table: on a damaged file they are not attempted.
        tables = queries.table_row_counts(connection, exclusive=not shared) if integrity["ok"] else {}
        fingerprint = catalog.schema_fingerprint(connection, exclusive=not shared)
        return {
            **({"layout": "shared"} if shared else {}),
            "integrity": integrity,
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
            **_catalog_report(connection, fingerprint, ddl.SCHEMA_FINGERPRINTS.get(version), tables),
        }


def _shared_version(connection: Connection) -> int:
    """A shared file's schema version as its ``migrations`` history records it (0: unreadable)."""
    try:
        return catalog.read_shared_version(connection, schema_target(connection, None, exclusive=False))
    except SchedulerKernelError:
        return 0


def _info_postgresql(target: str, schema: str | None) -> dict[str, Any]:
    """``info`` of a PostgreSQL schema (the keys of :func:`_info`; no files or journal mode, the
    server's version, and no ``quick_check``: the server keeps its own integrity)."""
    with pg_target.readonly_connection(target, schema) as (name, connection, where):
        version = pg_target.recorded_version(connection, where)
        tables = queries.table_row_counts(connection)
        fingerprint = catalog.schema_fingerprint(connection, schema=where.schema)
        return {
            "integrity": {"ok": True, "checked": False},
            "database": name,
            "schema": where.schema,
            "files": {},
            "journalMode": None,
            "versions": {
                "package": scheduler.__version__,
                "postgresql": pg_target.server_version(connection),
                "schema": version,
                "latestSchema": LATEST_VERSION,
                "applicationId": None,
            },
            **_catalog_report(connection, fingerprint, ddl.PG_SCHEMA_FINGERPRINTS.get(version), tables),
        }


def _print_integrity(integrity: dict[str, Any]) -> None:
    out = console()
    if integrity.get("checked") is False:
        out.print("integrity: kept by the PostgreSQL server (no quick_check)")
        return
    if integrity["ok"]:
        out.print("integrity: ok (quick_check)")
        return
    out.print(f"integrity: FAILED: {integrity['code']}: {integrity['message']}", style="red", markup=False)
    if integrity["details"] is not None:
        out.print(f"    details: {integrity['details']}", markup=False)
    out.print(
        "the file is damaged: run `scheduler verify`, then restore a backup that verifies", markup=False
    )


def _print_info(info: dict[str, Any]) -> None:
    out = console()
    versions, fingerprint = info["versions"], info["fingerprint"]
    if "postgresql" in versions:
        out.print(f"database: {info['database']}", markup=False)
        out.print(
            f"schema v{versions['schema']} (latest v{versions['latestSchema']}), package "
            f"{versions['package']}, PostgreSQL {versions['postgresql']}",
            markup=False,
        )
    else:
        shared = ", shared with an application" if info.get("layout") == "shared" else ""
        out.print(f"database: {info['database']} (journal mode {info['journalMode']}{shared})")
        out.print("files: " + ", ".join(f"{name} {size} B" for name, size in info["files"].items()))
        out.print(
            f"schema v{versions['schema']} (latest v{versions['latestSchema']}), application id "
            f"{versions['applicationId']:#x}, package {versions['package']}, SQLite {versions['sqlite']}"
        )
    out.print(f"fingerprint: {fingerprint['actual']} ({'matches' if fingerprint['matches'] else 'DRIFT'})")
    _print_integrity(info["integrity"])
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
    """Versions, integrity, fingerprint, row counts, occurrences per status, file sizes, journal mode.

    Exit 1 when the file is damaged (``quick_check`` fails); row counts are then not read.
    """
    target = resolve_target(db)
    if pg_target.has_own_schema(target):
        info = _info_postgresql(target, resolve_schema())
    else:
        sqlite_schema(resolve_schema())
        info = _info(existing_file(target))
    if as_json:
        emit_json(info)
    else:
        _print_info(info)
    if not info["integrity"]["ok"]:
        raise typer.Exit(EXIT_FAILURE)
