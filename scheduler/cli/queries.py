"""Read queries the store has no method for (listings and counts), as Core selects.

Every listing is bounded by a limit; rows are mapped with the store's own row mappers, so a
stored value that does not validate is reported as ``SCHEDULER_DATA_CORRUPT`` like everywhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, func, select, table

from scheduler.backends.sqlite.files import storage_files
from scheduler.contract.constants import OCCURRENCE_STATUSES
from scheduler.schema import tables as t
from scheduler.schema.catalog import list_user_tables
from scheduler.store.plumbing.rows import map_job, map_occurrence
from scheduler.store.records import Job, MigrationRecord, Occurrence


def list_jobs(connection: Connection, *, kind: str | None, limit: int) -> list[Job]:
    """Jobs ordered by id, optionally of one kind."""
    query = select(t.jobs).order_by(t.jobs.c.job_id).limit(limit)
    if kind is not None:
        query = query.where(t.jobs.c.kind == kind)
    return [job for job in map(map_job, connection.execute(query)) if job is not None]


def list_occurrences(
    connection: Connection, *, status: str | None, job_id: str | None, limit: int
) -> list[Occurrence]:
    """Occurrences, most recently updated first, optionally filtered by status and job."""
    columns = t.occurrences.c
    query = select(t.occurrences).order_by(columns.updated_at.desc(), columns.occurrence_id).limit(limit)
    if status is not None:
        query = query.where(columns.status == status)
    if job_id is not None:
        query = query.where(columns.job_id == job_id)
    mapped = (map_occurrence(row) for row in connection.execute(query))
    return [occurrence for occurrence in mapped if occurrence is not None]


def occurrence_status_counts(connection: Connection, *, job_id: str | None = None) -> dict[str, int]:
    """Occurrences per status (every known status listed, unknown ones appended)."""
    columns = t.occurrences.c
    query = select(columns.status, func.count()).group_by(columns.status).order_by(columns.status)
    if job_id is not None:
        query = query.where(columns.job_id == job_id)
    counts = {status: 0 for status in OCCURRENCE_STATUSES}
    for status, count in connection.execute(query):
        counts[str(status)] = int(count)
    return counts


def table_row_counts(connection: Connection, *, exclusive: bool = True) -> dict[str, int]:
    """Rows per table for every user table present (``sqlite_master``; a shared file: the
    scheduler's tables only; PostgreSQL: the tables of the schema the connection's
    ``schema_translate_map`` sends statements to), by name."""
    mapping = connection.get_execution_options().get("schema_translate_map") or {}
    schema = mapping.get(None)
    counts: dict[str, int] = {}
    for name in list_user_tables(connection, schema, exclusive):
        count = select(func.count()).select_from(table(name, schema=schema))
        counts[name] = int(connection.execute(count).scalar_one())
    return counts


def migration_rows(connection: Connection) -> list[MigrationRecord]:
    """The schema ``migrations`` history, oldest first."""
    query = select(t.migrations).order_by(t.migrations.c.version)
    return [
        MigrationRecord(version=row.version, name=row.name, checksum=row.checksum, applied_at=row.applied_at)
        for row in connection.execute(query)
    ]


def file_sizes(path: Path) -> dict[str, int]:
    """Size in bytes of the database file and each sidecar that exists, keyed by file name."""
    return {
        candidate.name: candidate.stat().st_size for candidate in storage_files(path) if candidate.exists()
    }


def pragma_text(connection: Connection, name: str) -> str:
    """A read-only PRAGMA's text value (``journal_mode``)."""
    value: Any = connection.exec_driver_sql(f"PRAGMA {name}").scalar()
    return str(value)
