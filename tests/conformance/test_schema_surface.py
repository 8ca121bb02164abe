"""The store's schema surface on every backend (API §5 ``schema_info()`` and ``close()``, API §8
``verify_schema`` / ``schema_fingerprint`` and ``scheduler.testing.dump_tables``).

A new store is at schema v6 with the scheduler's application id and its last migration; the
catalog verifies at v6 (and is refused at another version) and fingerprints to the backend's
``SCHEMA_V6…_FINGERPRINT``; ``dump_tables`` gives the 12 tables (plus ``sqlite_sequence`` on
SQLite only) with the rows the store wrote; a closed store refuses every call, ``close()`` again
included without error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backends import Backend
from lifecycle_support import expect_error
from recorded import T0

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.schema import (
    SCHEMA_V6_FINGERPRINT,
    SCHEMA_V6_PG_FINGERPRINT,
    metadata,
    schema_fingerprint,
    verify_schema,
)
from scheduler.testing import dump_tables

AUTHORITY = {"principal": {"type": "service", "id": "surface"}}


@pytest.fixture
def store(backend: Backend) -> Iterator[SchedulerStore]:
    opened = open_store(backend.engine, schema=backend.schema, clock=lambda: T0)
    yield opened
    opened.close()


def test_a_new_store_reports_schema_v6_and_its_last_migration(store: SchedulerStore) -> None:
    info = store.schema_info()
    assert info.schema_version == 6
    assert info.migration is not None and info.migration.version == 6
    assert info.application_id == store.schema_info().application_id != 0


def test_the_catalog_verifies_at_v6_and_fingerprints_to_the_backends_constant(
    backend: Backend, store: SchedulerStore
) -> None:
    expected = SCHEMA_V6_PG_FINGERPRINT if backend.is_postgresql else SCHEMA_V6_FINGERPRINT
    with backend.engine.connect() as connection:
        verify_schema(connection, 6, schema=backend.schema)
        assert schema_fingerprint(connection, schema=backend.schema) == expected
        with pytest.raises(SchedulerKernelError) as refused:
            verify_schema(connection, 5, schema=backend.schema)
    assert refused.value.code in ("SCHEDULER_SCHEMA_UNKNOWN", "SCHEDULER_SCHEMA_CORRUPT")


def test_dump_tables_gives_every_table_with_the_rows_written(backend: Backend, store: SchedulerStore) -> None:
    store.create_job(id="j", kind="k", authority=AUTHORITY)
    occurrence = store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key="t")
    tables = dump_tables(store)
    own = {"sqlite_sequence"} if not backend.is_postgresql else set()
    assert set(tables) == {*metadata.tables, *own}
    assert [row["job_id"] for row in tables["jobs"]] == ["j"]
    assert [row["occurrence_id"] for row in tables["occurrences"]] == [occurrence.id]
    assert [row["event_type"] for row in tables["events"]] == ["job_created", "occurrence_enqueued"]


def test_a_closed_store_refuses_every_call(store: SchedulerStore) -> None:
    store.close()
    store.close()  # again: no error
    expect_error("SCHEDULER_STORE_CLOSED", store.schema_info)
    expect_error("SCHEDULER_STORE_CLOSED", lambda: store.get_job("j"))
    expect_error("SCHEDULER_STORE_CLOSED", lambda: store.create_job(id="j", kind="k", authority=AUTHORITY))
    expect_error("SCHEDULER_STORE_CLOSED", lambda: dump_tables(store))
