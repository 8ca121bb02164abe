"""``scheduler.testing.dump_tables`` (API.md §8 Helpers): every table's rows in the fixtures' layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dump import dump
from recorded import T0, UPGRADE_NOW, VERSIONS, copy_reference, reference_dump
from sqlalchemy import create_engine, event

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.schema import metadata
from scheduler.testing import dump_tables

AUTHORITY = {"principal": {"type": "service", "id": "dumper"}, "requestedCapabilities": ["run"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_an_upgraded_reference_database_dumps_exactly_as_recorded(version: int, tmp_path: Path) -> None:
    """Same tables, same rows, same values and the same primary-key order as ``vN.upgraded.json``."""
    with open_store(copy_reference(tmp_path, version), clock=lambda: UPGRADE_NOW) as store:
        assert dump_tables(store) == reference_dump(version, upgraded=True)["tables"]


def test_a_new_store_has_every_scheduler_table_and_sqlite_sequence(tmp_path: Path) -> None:
    with open_store(tmp_path / "kernel.sqlite", clock=lambda: T0) as store:
        tables = dump_tables(store)
    assert set(tables) == {*metadata.tables, "sqlite_sequence"}
    assert [row["version"] for row in tables["migrations"]] == [1, 2, 3, 4, 5, 6]
    assert [name for name, rows in tables.items() if rows] == ["migrations"]


def test_rows_are_in_code_point_order_of_the_key_and_agree_with_an_independent_reader(tmp_path: Path) -> None:
    path = tmp_path / "kernel.sqlite"
    ids = ["job-\U0001f600", "job-\uffff", "job-b", "job-a", "Job-z", "job-\u00e9"]
    with open_store(path, clock=lambda: T0) as store:
        for job_id in ids:
            store.create_job(id=job_id, kind="k", authority=AUTHORITY)
        tables = dump_tables(store)
    assert [row["job_id"] for row in tables["jobs"]] == sorted(ids)
    assert [row["event_id"] for row in tables["events"]] == list(range(1, len(ids) + 1))
    assert tables["sqlite_sequence"] == [{"name": "events", "seq": len(ids)}]
    assert tables == dump(path)["tables"]


def test_inside_a_transaction_and_on_a_caller_connection_it_sees_the_uncommitted_rows(tmp_path: Path) -> None:
    path = tmp_path / "kernel.sqlite"
    open_store(path, clock=lambda: T0).close()
    with open_store(path, clock=lambda: T0) as store, store.transaction() as tx:
        tx.create_job(id="in-tx", kind="k", authority=AUTHORITY)
        assert [row["job_id"] for row in dump_tables(tx)["jobs"]] == ["in-tx"]
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            bound = SchedulerStore.on_connection(connection, clock=lambda: T0)
            bound.create_job(id="outbox", kind="k", authority=AUTHORITY)
            assert [row["job_id"] for row in dump_tables(bound)["jobs"]] == ["in-tx", "outbox"]
            connection.rollback()
    finally:
        engine.dispose()


def test_tables_are_addressed_through_the_connections_schema_translation(tmp_path: Path) -> None:
    """An attached scheduler database read through ``schema_translate_map`` dumps like the file itself."""
    path = tmp_path / "kernel.sqlite"
    with open_store(path, clock=lambda: T0) as store:
        store.create_job(id="attached", kind="k", authority=AUTHORITY)
        expected = dump_tables(store)
    engine = create_engine("sqlite://")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"ATTACH DATABASE '{path}' AS kernel")
            translated = connection.execution_options(schema_translate_map={None: "kernel"})
            assert dump_tables(SchedulerStore.on_connection(translated, clock=lambda: T0)) == expected
    finally:
        engine.dispose()


def test_a_store_in_an_attached_database_dumps_its_own_tables(tmp_path: Path) -> None:
    """``open_store(engine, schema="kernel")``: the attached database's rows, sqlite_sequence included."""
    engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")

    @event.listens_for(engine, "connect")
    def _attach(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"ATTACH DATABASE '{tmp_path / 'kernel.sqlite'}' AS kernel")
        dbapi_connection.execute("PRAGMA foreign_keys = ON")  # open_store refuses an app connection without

    with engine.begin() as connection:  # the application's own counter, in its main database
        connection.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT)")
        connection.exec_driver_sql("INSERT INTO orders DEFAULT VALUES")
    try:
        with open_store(engine, schema="kernel", clock=lambda: T0) as store:
            store.create_job(id="attached", kind="k", authority=AUTHORITY)
            tables = dump_tables(store)
        assert tables["sqlite_sequence"] == [{"name": "events", "seq": 1}]
        assert [row["job_id"] for row in tables["jobs"]] == ["attached"]
        assert tables == dump(tmp_path / "kernel.sqlite")["tables"]
    finally:
        engine.dispose()


def test_a_closed_store_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "kernel.sqlite", clock=lambda: T0)
    store.close()
    with pytest.raises(SchedulerKernelError) as raised:
        dump_tables(store)
    assert raised.value.code == "SCHEDULER_STORE_CLOSED"
