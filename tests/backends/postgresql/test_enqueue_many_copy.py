"""``enqueue_many`` on PostgreSQL: a batch's new occurrences and events go as ``COPY``, after a
read of its identities that the server plans for each call's values."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from test_postgresql_claims import AUTHORITY, T0
from test_postgresql_failures import storage_error

from scheduler import open_store
from scheduler.schema.target import quote_identifier
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql


def _batch(first: int, count: int) -> list[dict[str, Any]]:
    return [{"job_id": "j", "scheduled_for": T0, "trigger_key": f"t{n}"} for n in range(first, first + count)]


def test_a_batch_is_copied_after_a_read_planned_per_call(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied: list[tuple[str, int]] = []
    real_copy = FastPath.copy_rows

    def counted(self: FastPath, conn: Any, table: Any, columns: Any, rows: Any) -> bool:
        done = real_copy(self, conn, table, columns, rows)
        copied.append((table.name, len(rows)))
        return done

    monkeypatch.setattr(FastPath, "copy_rows", counted)
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        store.create_job(id="j", kind="k", authority=AUTHORITY)
        for first in (0, 100, 200):
            assert all(not item.deduplicated for item in store.enqueue_many(_batch(first, 100)))
        again = store.enqueue_many(_batch(250, 100))  # 50 stored, 50 new
        assert [item.deduplicated for item in again] == [True] * 50 + [False] * 50
        store.enqueue_many(_batch(400, 5))  # below COPY_AT_LEAST: multi-row inserts
        assert copied == [("occurrences", 100), ("events", 100)] * 3 + [
            ("occurrences", 50)
        ]  # 50 events: inserts
        tables = dump_tables(store)
        assert len(tables["occurrences"]) == 355
        assert [
            row["occurrence_id"] for row in tables["events"] if row["event_type"] == "occurrence_enqueued"
        ] == [
            row["occurrence_id"]
            for row in sorted(tables["occurrences"], key=lambda row: int(row["trigger_key"][1:]))
        ]
        driver = store.connection.connection.driver_connection
        named = [
            row[0] for row in driver.execute("SELECT statement FROM pg_prepared_statements", prepare=False)
        ]
        driver.rollback()
        assert named, "the store names its statements on this connection"
        # The read of a batch's identities is never named: its generic plan, made while the table
        # was small, would scan the table as it grows (no statistics change to replan it).
        assert not [
            statement for statement in named if "unnest" in statement and "idempotency_key" in statement
        ]
    finally:
        store.close()


def test_a_copy_that_waits_on_a_lock_fails_retryably_and_writes_nothing(
    pg_engine: Engine, pg_schema: str
) -> None:
    """The events' COPY checks each row's job (a key-share lock of its row): while another
    transaction holds that row it waits, until the store's lock timeout classifies the failure."""
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=200) as store:
        store.create_job(id="j", kind="k", authority=AUTHORITY)
        holder = pg_engine.connect()
        try:
            holder.exec_driver_sql(
                f"SELECT 1 FROM {quote_identifier(pg_schema)}.jobs WHERE job_id = 'j' FOR UPDATE"
            )
            details = storage_error(lambda: store.enqueue_many(_batch(0, 100)))
        finally:
            holder.rollback()
            holder.close()
        assert details["storageCode"] == "55P03" and details["retryable"] is True
        assert details["commitState"] == "not_committed"
        assert dump_tables(store)["occurrences"] == []
        assert len(store.enqueue_many(_batch(0, 100))) == 100  # the same connection, at once
        assert len(dump_tables(store)["occurrences"]) == 100
