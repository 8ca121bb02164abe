"""The schema layer on SQLite's other layouts: an attached database and a file shared with an app.

An attached database is addressed as ``"<name>".table`` / ``PRAGMA "<name>".x``; its file is the
scheduler's own (exclusive) and its catalog is exactly the canonical one. A shared file
(``exclusive=False``) holds the application's objects too: only the scheduler's rows are
fingerprinted, the version comes from ``migrations``, integrity is checked per scheduler table,
and nothing of the application's is read as the scheduler's or changed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from backends import sqlite_engine
from backends import sqlite_transaction as shared
from schema_support import T0, UPGRADE_NOW, file_digest, raw, seed_v1_rows, table_rows
from sqlalchemy import Connection, event

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import (
    SCHEMA_FINGERPRINTS,
    SCHEMA_V6_FINGERPRINT,
    apply_upgrade,
    initialize_or_upgrade,
    inspect_database,
    schema_fingerprint,
    schema_target,
    verify_schema,
)

APP_SCHEMA = (
    "CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT NOT NULL)",
    "CREATE INDEX orders_note ON orders(note)",
    "CREATE VIEW order_notes AS SELECT note FROM orders",
    "CREATE TRIGGER orders_touch AFTER INSERT ON orders BEGIN SELECT 1; END",
    "INSERT INTO orders (note) VALUES ('first')",
    "PRAGMA user_version = 42",
    "PRAGMA application_id = 7",
)


def pragmas(path: Path) -> tuple[int, int]:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA user_version").fetchone()[0], con.execute(
            "PRAGMA application_id"
        ).fetchone()[0]
    finally:
        con.close()


@contextmanager
def attached(app: Path, kernel: Path, name: str = "kernel") -> Iterator[Connection]:
    """A write transaction on ``app`` with ``kernel`` attached as ``name`` (committed on success)."""
    engine = sqlite_engine(app)

    @event.listens_for(engine, "connect")
    def _attach(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"ATTACH DATABASE '{kernel}' AS \"{name}\"")

    try:
        with engine.connect() as connection, connection.begin():
            yield connection
    finally:
        engine.dispose()


def refused_untouched(path: Path, check: Callable[[Connection], object], code: str) -> SchedulerKernelError:
    before = file_digest(path)
    with pytest.raises(SchedulerKernelError) as caught, shared(path) as connection:
        check(connection)
    assert caught.value.code == code, caught.value
    assert file_digest(path) == before
    return caught.value


# ----------------------------------------------------------------- attached database


def test_attached_database_holds_the_canonical_catalog(tmp_path: Path) -> None:
    app, kernel = tmp_path / "app.sqlite", tmp_path / "kernel.sqlite"
    raw(app, *APP_SCHEMA, "CREATE TABLE jobs (app_column TEXT)", "CREATE TABLE migrations (v INTEGER)")
    app_before = file_digest(app)
    with attached(app, kernel, "Kernel") as connection:
        assert initialize_or_upgrade(connection, now=T0, schema="Kernel") == 0
        verify_schema(connection, schema="kernel")  # attached names are case-insensitive
    assert file_digest(app) == app_before
    con = sqlite3.connect(kernel)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 6
        assert con.execute("PRAGMA application_id").fetchone()[0] == 0x4343534B
    finally:
        con.close()
    with shared(kernel) as connection:  # the file on its own is an ordinary scheduler database
        assert schema_fingerprint(connection) == SCHEMA_V6_FINGERPRINT
        verify_schema(connection)


def test_attached_database_upgrades_step_by_step(tmp_path: Path) -> None:
    app, kernel = tmp_path / "app.sqlite", tmp_path / "kernel.sqlite"
    with attached(app, kernel) as connection:
        apply_upgrade(connection, 0, T0, to_version=1, schema="kernel")
        seed_v1_rows(connection, schema_target(connection, "kernel"))
    for version in range(2, 7):
        with attached(app, kernel) as connection:
            assert inspect_database(connection, schema="kernel") == version - 1
            apply_upgrade(connection, version - 1, UPGRADE_NOW, to_version=version, schema="kernel")
            assert schema_fingerprint(connection, schema="kernel") == SCHEMA_FINGERPRINTS[version]
    plain = tmp_path / "plain.sqlite"
    with shared(plain) as connection:
        apply_upgrade(connection, 0, T0, to_version=1)
        seed_v1_rows(connection, schema_target(connection))
    with shared(plain) as connection:
        apply_upgrade(connection, 1, UPGRADE_NOW)
        expected = table_rows(connection, schema_target(connection), "jobs", "scheduler_authority_policies")
    with attached(app, kernel) as connection:
        target = schema_target(connection, "kernel")
        assert table_rows(connection, target, "jobs", "scheduler_authority_policies") == expected


def test_unknown_attached_name_is_an_invalid_argument(tmp_path: Path) -> None:
    with shared(tmp_path / "x.sqlite") as connection:
        for name in ("kernel", "temp", ""):
            with pytest.raises(SchedulerKernelError) as caught:
                inspect_database(connection, schema=name)
            assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"


# ----------------------------------------------------------------- shared file


@pytest.fixture
def shared_v6(tmp_path: Path) -> Path:
    path = tmp_path / "shared.sqlite"
    raw(path, *APP_SCHEMA)
    with shared(path) as connection:
        assert initialize_or_upgrade(connection, now=T0, exclusive=False) == 0
    return path


def test_shared_file_keeps_the_application_and_fingerprints_only_the_scheduler(shared_v6: Path) -> None:
    assert pragmas(shared_v6) == (42, 7)  # user_version, application_id: the application's
    with shared(shared_v6) as connection:
        assert schema_fingerprint(connection, exclusive=False) == SCHEMA_V6_FINGERPRINT
        verify_schema(connection, exclusive=False)
        assert inspect_database(connection, exclusive=False) == 6
        assert connection.exec_driver_sql("SELECT note FROM order_notes").scalars().all() == ["first"]
        with pytest.raises(SchedulerKernelError) as caught:  # as an exclusive file it is not ours
            verify_schema(connection)
        assert caught.value.code == "SCHEDULER_SCHEMA_UNKNOWN"


def test_shared_file_upgrades_from_every_version(tmp_path: Path) -> None:
    for start in range(1, 6):
        path = tmp_path / f"shared-v{start}.sqlite"
        raw(path, *APP_SCHEMA)
        with shared(path) as connection:
            apply_upgrade(connection, 0, T0, to_version=start, exclusive=False)
        with shared(path) as connection:
            assert initialize_or_upgrade(connection, now=UPGRADE_NOW, exclusive=False) == start
        assert pragmas(path) == (42, 7)
        with shared(path) as connection:
            verify_schema(connection, exclusive=False)


SHARED_DRIFT: list[tuple[str, str, str]] = [
    ("index on a scheduler table", "CREATE INDEX app_jobs_kind ON jobs(kind)", "catalog does not match v6"),
    (
        "trigger on a scheduler table",
        "CREATE TRIGGER app_jobs AFTER INSERT ON jobs BEGIN SELECT 1; END",
        "catalog does not match v6",
    ),
    (
        "application index named like the scheduler's",
        "CREATE INDEX scheduler_events_job ON orders(note)",
        "collide",
    ),
    ("application view named like a scheduler table", "CREATE VIEW jobs_v AS SELECT 1", ""),
]


@pytest.mark.parametrize(("label", "statement", "fragment"), SHARED_DRIFT, ids=[d[0] for d in SHARED_DRIFT])
def test_shared_file_drift_is_refused_untouched(
    shared_v6: Path, label: str, statement: str, fragment: str
) -> None:
    if label.startswith("application index named"):
        raw(shared_v6, "DROP INDEX scheduler_events_job")
    raw(shared_v6, statement)
    if not fragment:  # an unrelated application object: allowed
        with shared(shared_v6) as connection:
            verify_schema(connection, exclusive=False)
        return
    for check in (
        lambda c: verify_schema(c, exclusive=False),
        lambda c: initialize_or_upgrade(c, now=UPGRADE_NOW, exclusive=False),
    ):
        error = refused_untouched(shared_v6, check, "SCHEDULER_SCHEMA_CORRUPT")
        assert fragment in error.message


@pytest.mark.parametrize(
    "statements",
    [
        ("CREATE TABLE jobs (id INTEGER)",),
        ("CREATE TABLE notes (id INTEGER)", "CREATE INDEX scheduler_occurrences_claim ON notes(id)"),
    ],
    ids=["table", "index"],
)
def test_shared_file_name_collision_is_refused_untouched(tmp_path: Path, statements: tuple[str, ...]) -> None:
    path = tmp_path / "app.sqlite"
    raw(path, *APP_SCHEMA, *statements)
    error = refused_untouched(
        path, lambda c: initialize_or_upgrade(c, now=T0, exclusive=False), "SCHEDULER_SCHEMA_CORRUPT"
    )
    assert "collide" in error.message


def test_future_scheduler_table_name_collides(tmp_path: Path) -> None:
    path = tmp_path / "v5.sqlite"
    raw(path, *APP_SCHEMA)
    with shared(path) as connection:
        apply_upgrade(connection, 0, T0, to_version=5, exclusive=False)
    raw(path, "CREATE TABLE scheduler_occurrence_retries (app TEXT)")
    error = refused_untouched(
        path, lambda c: initialize_or_upgrade(c, now=T0, exclusive=False), "SCHEDULER_SCHEMA_CORRUPT"
    )
    assert error.details == {"collisions": ["scheduler_occurrence_retries"]}


def test_shared_file_version_comes_from_migrations(shared_v6: Path) -> None:
    raw(shared_v6, "INSERT INTO migrations VALUES (7, 'x', 'y', 0)")
    error = refused_untouched(
        shared_v6, lambda c: inspect_database(c, exclusive=False), "SCHEDULER_SCHEMA_UNKNOWN"
    )
    assert error.message == "Scheduler migration history is unknown"


def _break_not_null(path: Path, table: str, column_sql: str, loose_sql: str, row: str) -> None:
    """Store a row that violates a NOT NULL constraint (quick_check reports it), via writable_schema."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        original = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        con.execute("PRAGMA writable_schema = ON")
        con.execute(
            "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?", (column_sql, loose_sql, table)
        )
    finally:
        con.close()
    raw(path, row)
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA writable_schema = ON")
        con.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (original, table))
    finally:
        con.close()


def test_shared_integrity_is_checked_per_scheduler_table(shared_v6: Path) -> None:
    _break_not_null(
        shared_v6, "orders", "note TEXT NOT NULL", "note TEXT", "INSERT INTO orders (note) VALUES (NULL)"
    )
    with shared(shared_v6) as connection:  # the application's table is not the scheduler's concern
        verify_schema(connection, exclusive=False)
    _break_not_null(
        shared_v6,
        "migrations",
        "checksum    TEXT NOT NULL",
        "checksum TEXT",
        "INSERT INTO migrations VALUES (9, 'x', NULL, 0)",
    )
    error = refused_untouched(
        shared_v6, lambda c: verify_schema(c, exclusive=False), "SCHEDULER_SCHEMA_CORRUPT"
    )
    assert error.details == {"result": [{"quick_check": "NULL value in migrations.checksum"}]}
