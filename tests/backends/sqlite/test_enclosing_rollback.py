"""SQLITE_FULL inside a caller-owned transaction: SQLite discards the whole enclosing transaction.

The store must say so truthfully (nothing committed) and must not silently start a new
transaction for later calls on the same binding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text

from scheduler import SchedulerKernelError, SchedulerStore, open_store

T0 = 1767225600000
AUTHORITY = {"principal": {"type": "user", "id": "u"}}


def _engine(path: Path):  # type: ignore[no-untyped-def]
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _cap_pages(conn, extra: int) -> None:  # type: ignore[no-untyped-def]
    pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
    conn.exec_driver_sql(f"PRAGMA max_page_count = {pages + extra}")


def test_full_disk_inside_on_connection_reports_the_lost_enclosing_transaction(tmp_path: Path) -> None:
    db = tmp_path / "kernel.sqlite"
    with open_store(db, clock=lambda: T0) as store:
        store.create_job(id="j", kind="routine", authority=AUTHORITY)
    engine = _engine(db)
    big = "x" * 200_000
    with engine.connect() as conn:
        _cap_pages(conn, 8)
        conn.commit()
        conn.begin()
        store = SchedulerStore.on_connection(conn, clock=lambda: T0)
        store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="small", payload={"n": 1})
        with pytest.raises(SchedulerKernelError) as raised:
            for index in range(50):
                store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key=f"k{index}", payload=big)
        error = raised.value
        assert error.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert error.details["storageCode"] == "SQLITE_FULL"
        assert error.details["commitState"] == "not_committed"
        assert "enclosing transaction" in error.message
        assert not conn.connection.dbapi_connection.in_transaction  # SQLite discarded it all
        with pytest.raises(SchedulerKernelError) as later:
            store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="after", payload={"n": 2})
        assert later.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert "enclosing transaction" in later.value.message
        conn.rollback()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM occurrences")).scalar() == 0
    engine.dispose()


def test_transaction_block_on_a_connection_store_is_a_savepoint(tmp_path: Path) -> None:
    db = tmp_path / "kernel.sqlite"
    with open_store(db, clock=lambda: T0) as store:
        store.create_job(id="j", kind="routine", authority=AUTHORITY)
    engine = _engine(db)
    with engine.begin() as conn:
        store = SchedulerStore.on_connection(conn, clock=lambda: T0)
        store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="kept")
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="block-1")
            tx.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="block-2")
            raise RuntimeError("application failure inside the block")
        with store.transaction() as tx:
            tx.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="block-3")
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT trigger_key FROM occurrences ORDER BY trigger_key")).scalars().all()
    assert keys == ["block-3", "kept"]
    engine.dispose()


def test_swallowed_full_disk_inside_store_transaction_is_not_reported_as_committed(tmp_path: Path) -> None:
    db = tmp_path / "kernel.sqlite"
    with open_store(db, clock=lambda: T0) as store:
        store.create_job(id="j", kind="routine", authority=AUTHORITY)
        conn = store.connection
        _cap_pages(conn, 8)
        conn.commit()
        with pytest.raises(SchedulerKernelError) as raised, store.transaction() as tx:
            tx.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="first")
            try:
                for index in range(50):
                    tx.enqueue_occurrence(
                        job_id="j", scheduled_for=T0, trigger_key=f"k{index}", payload="x" * 200_000
                    )
            except SchedulerKernelError as swallowed:
                assert swallowed.details["commitState"] == "not_committed"
        assert raised.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert raised.value.details["commitState"] == "not_committed"
        assert store.list_occurrences_by_trigger(job_id="j", trigger_key="first") == []
