"""``open_store`` in the application's own SQLite database: a shared file (``exclusive=False``) and
an attached database (``schema=``), API §8.

Nothing of the application's changes: its rows, its tables named like the scheduler's, its file
mode, ``journal_mode``, ``application_id``, ``user_version``, ``trusted_schema`` and the
``busy_timeout`` of its pooled connection; a collision or a connection with ``foreign_keys`` off
is refused with every file byte-for-byte and mode-for-mode as it was.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from scheduler import SchedulerKernelError, SchedulerStore, mark_writer, open_store, sqlite_engine
from scheduler.schema import SCHEMA_V6_FINGERPRINT, schema_fingerprint

T0 = 1_767_225_600_000
AUTHORITY = {"principal": {"type": "service", "id": "shop"}, "requestedCapabilities": ["email.send"]}


def make_app_file(path: Path, *tables: str) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode = DELETE")
    con.execute("PRAGMA user_version = 42")
    con.execute("PRAGMA application_id = 7")
    con.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
    con.execute("INSERT INTO orders VALUES ('o-0', 1)")
    for table in tables:
        con.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, note TEXT)")
        con.execute(f"INSERT INTO {table} (note) VALUES ('the application''s own {table}')")
    con.close()
    path.chmod(0o644)


def header(path: Path) -> dict[str, Any]:
    con = sqlite3.connect(path)
    try:
        return {
            name: con.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("journal_mode", "user_version", "application_id")
        } | {"mode": path.stat().st_mode & 0o777}
    finally:
        con.close()


def rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
    finally:
        con.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def round_trip(store: SchedulerStore) -> None:
    store.create_job(id="send-receipt", kind="email", authority=AUTHORITY)
    store.enqueue_occurrence(job_id="send-receipt", scheduled_for=0, trigger_key="order:o-1")
    claimed = store.claim_next(owner_id="w", lease_ms=60_000)
    assert claimed is not None
    store.settle(occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded")


# ----------------------------------------------------------------- shared file


def test_shared_file_leaves_everything_of_the_application_alone(tmp_path: Path) -> None:
    app = tmp_path / "app.sqlite"
    make_app_file(app, "shop_events")
    before = header(app)
    with open_store(app, exclusive=False, clock=lambda: T0) as store:
        round_trip(store)
    with open_store(app, exclusive=False) as store:  # reopened: verified, nothing to do
        assert store.get_job("send-receipt") is not None
    assert header(app) == before
    assert rows(app, "orders") == [("o-0", 1)]
    assert rows(app, "shop_events") == [(1, "the application's own shop_events")]
    con = sqlite3.connect(app)
    try:
        assert [r[0] for r in con.execute("SELECT version FROM migrations ORDER BY version")] == list(
            range(1, 7)
        )
    finally:
        con.close()
    engine = create_engine(f"sqlite:///{app}")
    try:
        with engine.connect() as connection:
            assert schema_fingerprint(connection, exclusive=False) == SCHEMA_V6_FINGERPRINT
    finally:
        engine.dispose()


def test_shared_file_outbox_in_the_applications_transaction(tmp_path: Path) -> None:
    app = tmp_path / "app.sqlite"
    make_app_file(app)
    with open_store(app, exclusive=False) as store:
        store.create_job(id="send-receipt", kind="email", authority=AUTHORITY)
    engine = sqlite_engine(app, journal_mode=None)
    try:
        with engine.begin() as connection:
            mark_writer(connection)
            connection.execute(text("INSERT INTO orders VALUES ('o-1', 5)"))
            SchedulerStore.on_connection(connection).enqueue_occurrence(
                job_id="send-receipt", scheduled_for=0, trigger_key="order:o-1"
            )
    finally:
        engine.dispose()
    assert rows(app, "orders") == [("o-0", 1), ("o-1", 5)]
    assert header(app)["journal_mode"] == "delete"
    with open_store(app, exclusive=False) as store:
        assert len(store.list_occurrences_by_trigger(job_id="send-receipt", trigger_key="order:o-1")) == 1


@pytest.mark.parametrize(
    ("tables", "exclusive", "code"),
    [
        (("events",), False, "SCHEDULER_SCHEMA_CORRUPT"),  # the application's events collides
        (("jobs", "migrations"), False, "SCHEDULER_SCHEMA_CORRUPT"),
        ((), True, "SCHEDULER_SCHEMA_UNKNOWN"),  # a shared file opened as a dedicated one
    ],
)
def test_refused_shared_file_is_untouched(
    tmp_path: Path, tables: tuple[str, ...], exclusive: bool, code: str
) -> None:
    app = tmp_path / "app.sqlite"
    make_app_file(app, *tables)
    before, content = header(app), digest(app)
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(app, exclusive=exclusive)
    assert caught.value.code == code
    assert header(app) == before
    assert digest(app) == content


def test_exclusive_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(tmp_path / "x.sqlite", exclusive="no")  # type: ignore[arg-type]
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert not (tmp_path / "x.sqlite").exists()


# ----------------------------------------------------------------- attached database


def test_attached_database_beside_tables_named_like_the_schedulers(tmp_path: Path) -> None:
    app, kernel = tmp_path / "app.sqlite", tmp_path / "kernel.sqlite"
    make_app_file(app, "events", "jobs", "occurrences", "migrations")
    before = header(app)
    engine = sqlite_engine(app, attach={"kernel": kernel}, journal_mode=None, busy_timeout_ms=1234)
    try:
        with open_store(engine, schema="kernel", clock=lambda: T0) as store:
            round_trip(store)
        with engine.begin() as connection:
            mark_writer(connection)
            connection.execute(text("INSERT INTO orders VALUES ('o-2', 7)"))
            outbox = SchedulerStore.on_connection(connection, schema="kernel")
            outbox.enqueue_occurrence(job_id="send-receipt", scheduled_for=0, trigger_key="order:o-2")
            assert len(outbox.history(job_id="send-receipt")) >= 4
        with engine.connect() as connection:  # the pooled connection as the application left it
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 1234
            assert connection.exec_driver_sql("PRAGMA main.journal_mode").scalar_one() == "delete"
            assert connection.exec_driver_sql("PRAGMA trusted_schema").scalar_one() == 1
    finally:
        engine.dispose()
    assert header(app) == before
    for table in ("events", "jobs", "occurrences", "migrations"):
        assert rows(app, table) == [(1, f"the application's own {table}")]
    assert rows(app, "orders") == [("o-0", 1), ("o-2", 7)]
    with open_store(kernel) as store:  # the kernel is a dedicated file: a worker opens it directly
        assert len(store.list_occurrences_by_trigger(job_id="send-receipt", trigger_key="order:o-2")) == 1
    kernel_header = header(kernel)
    assert (kernel_header["user_version"], kernel_header["application_id"]) == (6, 0x4343534B)


def test_a_worker_on_an_attached_kernel_file_keeps_its_rollback_journal(tmp_path: Path) -> None:
    """docs/embedding.md: the attached layout is atomic only while the files keep a rollback
    journal, so workers open the kernel file with ``exclusive=False`` (a plain open switches a
    dedicated file to WAL) and the application keeps connecting beside them."""
    app, kernel = tmp_path / "app.sqlite", tmp_path / "kernel.sqlite"
    make_app_file(app)
    engine = sqlite_engine(app, attach={"kernel": kernel}, journal_mode="delete")
    try:
        creating = sqlite_engine(app, attach={"kernel": kernel}, journal_mode="delete")
        with open_store(creating, schema="kernel"):
            pass
        creating.dispose()
        with open_store(kernel, exclusive=False, clock=lambda: T0) as worker:
            round_trip(worker)
            with engine.connect() as connection:
                assert connection.exec_driver_sql("PRAGMA kernel.journal_mode").scalar_one() == "delete"
    finally:
        engine.dispose()
    with sqlite3.connect(kernel) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)


def test_attached_on_a_connection_without_foreign_keys_is_refused(tmp_path: Path) -> None:
    app, kernel = tmp_path / "app.sqlite", tmp_path / "kernel.sqlite"
    make_app_file(app)
    engine = create_engine(f"sqlite:///{app}")

    @event.listens_for(engine, "connect")
    def _attach(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"ATTACH DATABASE '{kernel}' AS kernel")

    before, content = header(app), digest(app)
    try:
        with pytest.raises(SchedulerKernelError) as caught:
            open_store(engine, schema="kernel")
    finally:
        engine.dispose()
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT" and "foreign_keys" in caught.value.message
    assert header(app) == before and digest(app) == content
    assert not kernel.exists() or kernel.stat().st_size == 0
