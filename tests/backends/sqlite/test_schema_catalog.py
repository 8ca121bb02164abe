"""Catalog verification, refusal checks and the upgrade steps on real SQLite files."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from backends import sqlite_engine
from backends import sqlite_transaction as connected
from dump import diff, dump
from recorded import REFERENCE_DBS, T0, UPGRADE_NOW, VERSIONS, copy_reference
from schema_support import file_digest, raw
from sqlalchemy import Connection

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import (
    MIGRATION_CHECKSUMS,
    MIGRATION_NAMES,
    MIGRATION_SQL,
    SCHEDULER_APPLICATION_ID,
    SCHEMA_FINGERPRINTS,
    SCHEMA_V6_FINGERPRINT,
    UPGRADE_STEPS,
    apply_step,
    apply_upgrade,
    expected_columns,
    expected_indexes,
    expected_tables,
    inspect_database,
    list_user_tables,
    schema_fingerprint,
    verify_schema,
)
from scheduler.schema.upgrade import ddl_statements


@pytest.fixture
def fresh_v6(tmp_path: Path) -> Path:
    path = tmp_path / "fresh.sqlite"
    with connected(path) as connection:
        apply_upgrade(connection, 0, T0)
    return path


def expect_error(path: Path, code: str, check: Callable[[Connection], object] = verify_schema) -> Any:
    """Run ``check`` in a write transaction; the error must escape it (so it rolls back)."""
    with pytest.raises(SchedulerKernelError) as caught, connected(path) as connection:
        check(connection)
    assert caught.value.code == code, caught.value
    return caught.value


# ----------------------------------------------------------------- derived expectations


def test_ddl_statements_cover_each_text() -> None:
    for version, sql in MIGRATION_SQL.items():
        statements = ddl_statements(sql)
        assert len(statements) == sql.count(";"), version
        assert "".join((";".join(statements) + ";").split()) == "".join(sql.split())


def test_upgrade_steps_are_one_ordered_list() -> None:
    assert [step.version for step in UPGRADE_STEPS] == list(VERSIONS)
    assert [step.name for step in UPGRADE_STEPS] == [MIGRATION_NAMES[v] for v in VERSIONS]
    assert [step.checksum for step in UPGRADE_STEPS] == [MIGRATION_CHECKSUMS[v] for v in VERSIONS]


def test_expectations_match_the_seed_lists() -> None:
    v2 = [
        "events",
        "jobs",
        "migrations",
        "occurrences",
        "scheduler_authority_policies",
        "scheduler_authority_reservations",
        "scheduler_authority_usage",
    ]
    v45 = [
        *v2,
        "scheduler_domain_migration_entries",
        "scheduler_domain_migrations",
        "scheduler_occurrence_adjudications",
    ]
    assert expected_tables(1) == v2[:4]
    assert expected_tables(2) == v2
    assert expected_tables(3) == [*v2, "scheduler_occurrence_adjudications"]
    assert expected_tables(4) == expected_tables(5) == v45
    assert expected_tables(6) == [*v45, "scheduler_occurrence_controls", "scheduler_occurrence_retries"]
    assert len(expected_indexes(6)) == 15
    assert expected_indexes(5) == [
        n for n in expected_indexes(6) if "occurrence_controls" not in n and "occurrence_retries" not in n
    ]
    entries = expected_columns("scheduler_domain_migration_entries", 6)
    assert entries[-1] == ("source_locator_json", "TEXT", 0, 0)
    assert expected_columns("scheduler_domain_migration_entries", 4) == entries[:-1]
    assert expected_columns("events", 6)[0] == ("event_id", "INTEGER", 0, 1)
    assert expected_columns("scheduler_occurrence_retries", 6)[:2] == [
        ("occurrence_id", "TEXT", 1, 1),
        ("request_id", "TEXT", 1, 2),
    ]


# ----------------------------------------------------------------- reference databases


@pytest.mark.parametrize("version", VERSIONS)
def test_reference_database_verifies_as_its_version(tmp_path: Path, version: int) -> None:
    path = copy_reference(tmp_path, version)
    with connected(path) as connection:
        verify_schema(connection, version)
        assert schema_fingerprint(connection) == SCHEMA_FINGERPRINTS[version]
        assert inspect_database(connection) == version
        if version < 6:
            with pytest.raises(SchedulerKernelError) as caught:
                verify_schema(connection, version + 1)
            assert caught.value.code == "SCHEDULER_SCHEMA_UNKNOWN"


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_upgrade_reproduces_the_recorded_upgrade(tmp_path: Path, version: int) -> None:
    path = copy_reference(tmp_path, version)
    with connected(path) as connection:
        start = inspect_database(connection)
        apply_upgrade(connection, start, UPGRADE_NOW)
        verify_schema(connection)
    expected = json.loads((REFERENCE_DBS / f"v{version}.upgraded.json").read_text(encoding="utf-8"))
    actual = dump(path)
    assert diff(expected, actual) == []
    if version == 1:
        assert policy_rowid_order(path) == first_seen_principals(REFERENCE_DBS / "v1.sqlite")


def policy_rowid_order(path: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(path)
    try:
        sql = "SELECT principal_type, principal_id FROM scheduler_authority_policies ORDER BY rowid"
        return [tuple(row) for row in con.execute(sql)]
    finally:
        con.close()


def first_seen_principals(path: Path) -> list[tuple[str, str]]:
    """The seed's Map insertion order: jobs by job_id, then live occurrences by occurrence_id."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT authority_json FROM jobs ORDER BY job_id").fetchall()
        rows += con.execute(
            "SELECT authority_json FROM occurrences WHERE status NOT IN ('succeeded', 'dead_letter') "
            "ORDER BY occurrence_id"
        ).fetchall()
    finally:
        con.close()
    order: list[tuple[str, str]] = []
    for (encoded,) in rows:
        principal = json.loads(encoded)["principal"]
        key = (principal["type"], principal["id"])
        if key not in order:
            order.append(key)
    return order


def test_failed_backfill_rolls_everything_back(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 1)
    raw(
        path,
        'UPDATE jobs SET authority_json = \'{"not":"an envelope"}\' WHERE rowid = '
        "(SELECT max(rowid) FROM jobs)",
    )
    before = dump(path)
    error = expect_error(path, "SCHEDULER_DATA_CORRUPT", lambda c: apply_upgrade(c, 1, UPGRADE_NOW))
    assert "does not match authority envelope v1" in error.message
    assert diff(before, dump(path)) == []
    assert dump(path)["user_version"] == 1


def test_terminal_occurrences_are_validated_too(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 1)
    raw(
        path,
        "UPDATE occurrences SET authority_json = '[1]' WHERE occurrence_id = "
        "(SELECT min(occurrence_id) FROM occurrences WHERE status IN ('succeeded', 'dead_letter'))",
    )
    error = expect_error(path, "SCHEDULER_DATA_CORRUPT", lambda c: apply_upgrade(c, 1, UPGRADE_NOW))
    assert error.message.startswith("Stored occurrence ")


# ----------------------------------------------------------------- creating from empty


def test_fresh_database_is_exactly_v6(fresh_v6: Path) -> None:
    with connected(fresh_v6) as connection:
        verify_schema(connection)
        assert schema_fingerprint(connection) == SCHEMA_V6_FINGERPRINT
        rows = connection.exec_driver_sql("SELECT version, name, checksum, applied_at FROM migrations").all()
        assert [tuple(r) for r in rows] == [
            (v, MIGRATION_NAMES[v], MIGRATION_CHECKSUMS[v], T0) for v in VERSIONS
        ]
        assert connection.exec_driver_sql("PRAGMA application_id").scalar() == SCHEDULER_APPLICATION_ID
        assert connection.exec_driver_sql("PRAGMA user_version").scalar() == 6
        assert inspect_database(connection) == 6


@pytest.mark.parametrize("target", VERSIONS)
def test_every_intermediate_version_is_valid(tmp_path: Path, target: int) -> None:
    path = tmp_path / "partial.sqlite"
    with connected(path) as connection:
        apply_upgrade(connection, 0, T0, to_version=target)
        verify_schema(connection, target)
    with connected(path) as connection:
        start = inspect_database(connection)
        assert start == target
        apply_upgrade(connection, start, UPGRADE_NOW)
        verify_schema(connection)
        applied = connection.exec_driver_sql("SELECT applied_at FROM migrations ORDER BY version").scalars()
        assert list(applied) == [T0] * target + [UPGRADE_NOW] * (6 - target)


def test_empty_database_inspects_as_zero(tmp_path: Path) -> None:
    with connected(tmp_path / "empty.sqlite") as connection:
        assert inspect_database(connection) == 0
        assert list_user_tables(connection) == []


def test_upgrade_refuses_to_run_without_a_transaction(tmp_path: Path) -> None:
    engine = sqlite_engine(tmp_path / "x.sqlite")
    with engine.connect() as connection, pytest.raises(SchedulerKernelError) as caught:
        apply_upgrade(connection, 0, T0)
    engine.dispose()
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert list_tables_raw(tmp_path / "x.sqlite") == []


def list_tables_raw(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    finally:
        con.close()


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ((0, -1), "SCHEDULER_INVALID_ARGUMENT"),
        ((0, 2**53), "SCHEDULER_INVALID_ARGUMENT"),
        ((0, True), "SCHEDULER_INVALID_ARGUMENT"),
        ((7, T0), "SCHEDULER_INVALID_ARGUMENT"),
        ((3, T0), "SCHEDULER_SCHEMA_UNKNOWN"),
    ],
)
def test_apply_upgrade_validates_its_arguments(tmp_path: Path, args: tuple[Any, Any], code: str) -> None:
    expect_error(tmp_path / "x.sqlite", code, lambda c: apply_upgrade(c, *args))


def test_apply_step_refuses_out_of_order_and_non_empty(fresh_v6: Path, tmp_path: Path) -> None:
    expect_error(fresh_v6, "SCHEDULER_SCHEMA_UNKNOWN", lambda c: apply_step(c, 3, T0))
    other = tmp_path / "other.sqlite"
    raw(other, "CREATE TABLE foreign_data (x)")
    error = expect_error(other, "SCHEDULER_SCHEMA_UNKNOWN", lambda c: apply_step(c, 1, T0))
    assert error.details == {"tables": ["foreign_data"]}


# ----------------------------------------------------------------- refusals and tampering


def test_non_empty_database_without_history_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign.sqlite"
    raw(path, "CREATE TABLE notes (body TEXT)", "CREATE TABLE jobs (x)")
    digest = file_digest(path)
    error = expect_error(path, "SCHEDULER_SCHEMA_UNKNOWN", inspect_database)
    assert error.details == {"tables": ["jobs", "notes"]}
    assert file_digest(path) == digest


TAMPERS: list[tuple[str, tuple[str, ...], str, str]] = [
    (
        "trigger",
        ("CREATE TRIGGER t_jobs AFTER INSERT ON jobs BEGIN SELECT 1; END",),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
    (
        "view",
        ("CREATE VIEW v_jobs AS SELECT job_id FROM jobs",),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
    (
        "index",
        ("CREATE INDEX extra_jobs_kind ON jobs(kind)",),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
    (
        "scheduler index",
        ("CREATE INDEX scheduler_jobs_kind ON jobs(kind)",),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
    (
        "dropped index",
        ("DROP INDEX scheduler_events_job",),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
    ("table", ("CREATE TABLE extra (x)",), "SCHEDULER_SCHEMA_UNKNOWN", "unknown or missing tables"),
    (
        "dropped table",
        ("DROP TABLE scheduler_occurrence_retries",),
        "SCHEDULER_SCHEMA_UNKNOWN",
        "unknown or missing tables",
    ),
    (
        "added column",
        ("ALTER TABLE events ADD COLUMN extra TEXT",),
        "SCHEDULER_SCHEMA_CORRUPT",
        "table shape is invalid: events",
    ),
    ("application id", ("PRAGMA application_id = 1234",), "SCHEDULER_SCHEMA_UNKNOWN", "application identity"),
    ("user version", ("PRAGMA user_version = 7",), "SCHEDULER_SCHEMA_UNKNOWN", "application identity"),
    (
        "checksum",
        ("UPDATE migrations SET checksum = 'x' WHERE version = 4",),
        "SCHEDULER_SCHEMA_UNKNOWN",
        "migration history is unknown",
    ),
    (
        "name",
        ("UPDATE migrations SET name = 'other' WHERE version = 6",),
        "SCHEDULER_SCHEMA_UNKNOWN",
        "migration history is unknown",
    ),
    (
        "missing row",
        ("DELETE FROM migrations WHERE version = 2",),
        "SCHEDULER_SCHEMA_UNKNOWN",
        "migration history is unknown",
    ),
    (
        "extra row",
        ("INSERT INTO migrations VALUES (7, 'x', 'y', 0)",),
        "SCHEDULER_SCHEMA_UNKNOWN",
        "migration history is unknown",
    ),
    (
        "broken foreign key",
        (
            "PRAGMA foreign_keys = OFF",
            "INSERT INTO events (job_id, event_type, occurred_at, data_json) VALUES ('ghost', 'x', 0, '{}')",
        ),
        "SCHEDULER_SCHEMA_CORRUPT",
        "broken foreign keys",
    ),
    (
        "changed check (writable_schema)",
        (
            "PRAGMA writable_schema = ON",
            "UPDATE sqlite_master SET sql = replace(sql, 'BETWEEN 1 AND 32', 'BETWEEN 1 AND 33') "
            "WHERE name = 'jobs'",
        ),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
    (
        "changed check (rebuild)",
        (
            "PRAGMA foreign_keys = OFF",
            "CREATE TABLE jobs_new (job_id TEXT PRIMARY KEY NOT NULL, kind TEXT NOT NULL, "
            "trigger_json TEXT NOT NULL, payload_json TEXT NOT NULL, authority_json TEXT NOT NULL, "
            "enabled INTEGER NOT NULL, revision INTEGER NOT NULL, max_attempts INTEGER NOT NULL, "
            "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)",
            "INSERT INTO jobs_new SELECT * FROM jobs",
            "DROP TABLE jobs",
            "ALTER TABLE jobs_new RENAME TO jobs",
        ),
        "SCHEDULER_SCHEMA_CORRUPT",
        "catalog does not match v6",
    ),
]


@pytest.mark.parametrize(("label", "statements", "code", "fragment"), TAMPERS, ids=[t[0] for t in TAMPERS])
def test_tampering_is_detected(
    fresh_v6: Path, label: str, statements: tuple[str, ...], code: str, fragment: str
) -> None:
    raw(fresh_v6, *statements)
    digest = file_digest(fresh_v6)
    error = expect_error(fresh_v6, code)
    assert fragment in error.message
    if code == "SCHEDULER_SCHEMA_UNKNOWN" and "application identity" not in fragment:
        assert error.details is not None
    if label == "broken foreign key":
        assert error.details == {"count": 1}
    if label == "checksum":
        assert [row["version"] for row in error.details["migrations"]] == list(VERSIONS)
    assert file_digest(fresh_v6) == digest


@pytest.mark.parametrize("user_version", [0, 7, 99])
def test_inspect_refuses_unknown_user_version(fresh_v6: Path, user_version: int) -> None:
    raw(fresh_v6, f"PRAGMA user_version = {user_version}")
    error = expect_error(fresh_v6, "SCHEDULER_SCHEMA_UNKNOWN", inspect_database)
    assert error.details == {"applicationId": SCHEDULER_APPLICATION_ID, "userVersion": user_version}


def test_inspect_verifies_older_versions_exactly(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 3)
    raw(path, "CREATE INDEX scheduler_extra ON jobs(kind)")
    error = expect_error(path, "SCHEDULER_SCHEMA_CORRUPT", inspect_database)
    assert error.message == "Scheduler sqlite_master catalog does not match v3"


def test_foreign_application_id_details(fresh_v6: Path) -> None:
    raw(fresh_v6, "PRAGMA application_id = 42")
    error = expect_error(fresh_v6, "SCHEDULER_SCHEMA_UNKNOWN")
    assert error.details == {"applicationId": 42, "userVersion": 6}


def test_quick_check_failure_is_corrupt(fresh_v6: Path) -> None:
    con = sqlite3.connect(fresh_v6, isolation_level=None)
    original = con.execute("SELECT sql FROM sqlite_master WHERE name = 'migrations'").fetchone()[0]
    con.execute("PRAGMA writable_schema = ON")
    con.execute(
        "UPDATE sqlite_master SET sql = replace(sql, 'checksum    TEXT NOT NULL', 'checksum TEXT') "
        "WHERE name = 'migrations'"
    )
    con.close()
    raw(fresh_v6, "INSERT INTO migrations VALUES (9, 'x', NULL, 0)")
    con = sqlite3.connect(fresh_v6, isolation_level=None)
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'migrations'", (original,))
    con.close()
    error = expect_error(fresh_v6, "SCHEDULER_SCHEMA_CORRUPT")
    assert error.message == "Scheduler database failed SQLite quick_check"
    assert error.details == {"result": [{"quick_check": "NULL value in migrations.checksum"}]}
    expect_error(fresh_v6, "SCHEDULER_SCHEMA_CORRUPT", inspect_database)


def test_verify_schema_rejects_a_bad_version_argument(fresh_v6: Path) -> None:
    for bad in (0, 7, True, "6"):
        expect_error(fresh_v6, "SCHEDULER_INVALID_ARGUMENT", lambda c, v=bad: verify_schema(c, v))


def test_fingerprint_folds_whitespace_like_javascript() -> None:
    from scheduler.schema.catalog import _fold_js_whitespace

    # JS \s folds U+FEFF and U+3000 but not U+001C or U+0085 (Python's \s differs on all four).
    assert _fold_js_whitespace("\ufeff CREATE\u3000\n\tTABLE x\x1c\x85 ") == "CREATE TABLE x\x1c\x85"


def test_empty_database_with_a_foreign_header_is_created(tmp_path: Path) -> None:
    """As the seed: no tables means "create", whatever user_version/application_id say."""
    path = tmp_path / "header.sqlite"
    raw(path, "PRAGMA user_version = 5", "PRAGMA application_id = 7")
    with connected(path) as connection:
        assert inspect_database(connection) == 0
        apply_upgrade(connection, 0, T0)
    with connected(path) as connection:
        verify_schema(connection)
