"""Named server-side statements on the store's own PostgreSQL connection
(``scheduler.store.server_statements``): a transaction's ``BEGIN`` goes with its first statement
and its ``COMMIT`` with its last writes, each as ``EXECUTE scheduler_<n>(<literals>)``.

What is checked here, on the real server: values written as literals come back exactly; a
compare-and-set that misses in the statement carrying the ``COMMIT`` commits nothing; a
statement name the session lost is named again; a failure in that statement and a connection
lost around its ``COMMIT`` are classified as API §8 rules (``commitState``, ``retryable``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lifecycle_support import expect_error
from pg_proxy import PgProxy, wait_until, xact_status
from sqlalchemy import Engine, create_engine
from test_fastpath_postgresql import recording_cursor
from test_postgresql_failures import AUTHORITY, T0, hold_job_row, storage_error

from scheduler import SchedulerStore, open_store
from scheduler.store import settlement
from scheduler.store.records import Occurrence
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
LEASE = 60_000


@pytest.fixture
def proxy(pg_engine: Engine) -> Iterator[PgProxy]:
    running = PgProxy(pg_engine)
    yield running
    running.close()


def warmed(store: SchedulerStore, count: int = 8) -> Occurrence:
    """A job, ``count`` queued occurrences and two cycles, so the cycle's statements are named."""
    store.create_job(id="job-1", kind="email", authority=AUTHORITY)
    for n in range(count):
        store.enqueue_occurrence(job_id="job-1", scheduled_for=T0, trigger_key=f"t{n}")
    held = store.claim_next(owner_id="w", lease_ms=LEASE)
    for _ in range(2):
        assert held is not None
        held = cycle(store, held).claimed
    assert held is not None
    return held


def cycle(store: SchedulerStore, held: Occurrence, **settle: Any) -> Any:
    arguments = {"occurrence_id": held.id, "owner_id": "w", "fence": held.fence, "outcome": "succeeded"}
    return store.settle_and_claim(**{**arguments, **settle}, lease_ms=LEASE)


def prepared_names(store: SchedulerStore) -> set[str]:
    """The store connection's named statements, read in autocommit (psycopg's ``rollback()``
    would ``DEALLOCATE ALL``)."""
    driver = store.connection.connection.driver_connection
    driver.autocommit = True
    try:
        rows = driver.execute("SELECT name FROM pg_prepared_statements", prepare=False).fetchall()
    finally:
        driver.autocommit = False
    return {name for (name,) in rows if name.startswith("scheduler_")}


HOSTILE = [
    "it's",
    "''; DROP TABLE jobs; --",
    "back\\slash \\' \\\\",
    "$1 $$ %s %(x)s %% ?",
    "ünïcødé ✓ 𝄞",
    "semi; colon) EXECUTE scheduler_1(",
    "E'x' U&'\\0041'",
    "\n\t\r",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_values_written_as_literals_come_back_exactly(pg_engine: Engine, pg_schema: str, text: str) -> None:
    seen: list[tuple[str, Any]] = []
    engine = create_engine(pg_engine.url, connect_args={"cursor_factory": recording_cursor(seen)})
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
            held = warmed(store)
            seen.clear()
            made = store.enqueue_occurrence(
                job_id="job-1",
                scheduled_for=T0 + 1,
                trigger_key="hostile",
                payload={"text": text, text: [text]},
            )
            done = cycle(store, held, result={"echo": text})
            sent = [sql for sql, _ in seen]
            assert any(sql.startswith("EXECUTE scheduler_") and "'hostile'" in sql for sql in sent), sent
            assert any(sql.startswith("EXECUTE scheduler_") and sql.endswith("; COMMIT") for sql in sent), (
                sent
            )
            again = store.get_occurrence(made.id)
            assert again is not None and again.payload == {"text": text, text: [text]}
            assert done.settled.result == {"echo": text}
            assert store.get_occurrence(held.id).result == {"echo": text}
    finally:
        engine.dispose()


def test_a_compare_and_set_that_misses_commits_nothing(pg_engine: Engine, pg_schema: str) -> None:
    """The settle ``UPDATE`` matches no row (its lease check skipped, the fence wrong): the
    statement sent with the ``COMMIT`` refuses it, nothing is written, and the call run again
    reports ``SCHEDULER_LEASE_LOST`` as on SQLite."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(pg_engine.url, connect_args={"cursor_factory": recording_cursor(seen)})
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
            held = warmed(store)
            before = dump_tables(store)
            seen.clear()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(settlement, "_lease_held", lambda *_args: True)
                expect_error("SCHEDULER_LEASE_LOST", lambda: cycle(store, held, fence=held.fence + 7))
            assert any(sql.endswith("; COMMIT") for sql, _ in seen)  # the COMMIT was sent with it
            assert dump_tables(store) == before
            assert cycle(store, held).settled.status == "succeeded"
    finally:
        engine.dispose()


def test_statements_the_session_lost_are_named_again(pg_engine: Engine, pg_schema: str) -> None:
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0) as store:
        held = warmed(store)
        assert prepared_names(store)
        driver = store.connection.connection.driver_connection
        driver.autocommit = True
        driver.execute("DEALLOCATE ALL", prepare=False)
        driver.autocommit = False
        assert prepared_names(store) == set()
        for _ in range(3):
            held = cycle(store, held).claimed
            assert held is not None
        assert prepared_names(store)
        assert store.get_occurrence(held.id).status == "running"


def test_a_failure_in_the_statement_sent_with_the_commit_is_not_committed(
    pg_engine: Engine, pg_schema: str
) -> None:
    """Another transaction holds the job row: the event rows' foreign-key check in the writes
    sent with the ``COMMIT`` times out (55P03), so the ``COMMIT`` was never run."""
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=50) as store:
        held = warmed(store)
        before = dump_tables(store)
        holder = hold_job_row(pg_engine, pg_schema)
        try:
            details = storage_error(lambda: cycle(store, held))
        finally:
            holder.rollback()
            holder.close()
        assert details == {
            "phase": "write",
            "storageCode": "55P03",
            "commitState": "not_committed",
            "retryable": True,
        }
        assert dump_tables(store) == before
        assert cycle(store, held).claimed is not None


@pytest.mark.parametrize(
    ("fault", "outcome"),
    [
        ("lose_during_commit", "committed"),
        ("lose_before_commit", "aborted"),
        ("terminate_before_commit", "aborted"),
    ],
)
def test_a_connection_lost_around_the_commit_sent_with_the_writes_is_unknown(
    proxy: PgProxy, pg_engine: Engine, pg_schema: str, fault: str, outcome: str
) -> None:
    with open_store(proxy.url(), schema=pg_schema, clock=lambda: T0) as store:
        held = warmed(store)
        proxy.arm(fault)
        details = storage_error(lambda: cycle(store, held))
        assert details["storageCode"] in ("CONNECTION_LOST", "57P01")
        assert details["commitState"] == "unknown" and details["retryable"] is False
        assert proxy.xids
        wait_until(lambda: xact_status(pg_engine, proxy.xids[-1]) == outcome)
        settled = store.get_occurrence(held.id)  # reconnected
        assert settled is not None
        assert settled.status == ("succeeded" if outcome == "committed" else "running")
