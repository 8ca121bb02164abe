"""Named server-side statements on the store's own PostgreSQL connection
(``scheduler.backends.postgresql.server_statements``): a transaction's ``BEGIN`` goes with its first statement
and its ``COMMIT`` with its last writes, each as ``EXECUTE scheduler_<n>(<literals>)``.

What is checked here, on the real server: values written as literals come back exactly; a
compare-and-set that misses in the statement carrying the ``COMMIT`` commits nothing; a
statement name the session lost is named again; a failure in that statement and a connection
lost around its ``COMMIT`` are classified as API §8 rules (``commitState``, ``retryable``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from lifecycle_support import expect_error
from pg_proxy import PgProxy, wait_until, xact_status
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from test_fastpath_postgresql import recording_cursor
from test_postgresql_failures import AUTHORITY, T0, hold_job_row, retryable, storage_error

from scheduler import SchedulerStore, open_store
from scheduler.backends.postgresql import cycle_statement
from scheduler.store.capabilities import settlement
from scheduler.store.capabilities.worker_groups import CommittedGroup, commit_group, group_claims
from scheduler.store.records import Occurrence
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
LEASE = 60_000


@pytest.fixture
def engine(postgres_server: Any) -> Iterator[Engine]:
    """An engine of the test's own: another test may have instrumented the shared one (an engine
    event turns the fast path, and with it the named statements, off)."""
    made = create_engine(postgres_server.url)
    yield made
    made.dispose()


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
            # The enqueue: its BEGIN, the identity's lock, its statement and its COMMIT in one query.
            enqueued = [sql for sql in sent if sql.startswith("BEGIN ") and "'hostile'" in sql]
            assert any("; EXECUTE scheduler_" in sql for sql in enqueued), sent
            # The cycle: its BEGIN, its statements and its COMMIT in one query.
            assert any("; EXECUTE scheduler_" in sql and sql.endswith("; COMMIT") for sql in sent), sent
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


def test_statements_the_session_lost_are_named_again(engine: Engine, pg_schema: str) -> None:
    with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
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


def test_statements_lost_inside_a_transaction_block_are_classified_and_nothing_is_written(
    engine: Engine, pg_schema: str
) -> None:
    """A block cannot be run again by the store: the lost name (SQLSTATE 26000) surfaces as
    ``SCHEDULER_STORAGE_UNAVAILABLE`` (not retryable inside a ``transaction()`` block, API §8),
    nothing of the block is written, and the next calls name the statements again."""
    with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
        held = warmed(store)
        driver = store.connection.connection.driver_connection
        before = dump_tables(store)

        def block() -> None:
            with store.transaction() as tx:
                driver.execute("DEALLOCATE ALL", prepare=False)
                tx.renew(occurrence_id=held.id, owner_id="w", fence=held.fence, lease_ms=2 * LEASE)
                tx.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")

        assert storage_error(block) == {**retryable("26000"), "retryable": False}
        assert dump_tables(store) == before
        for _ in range(3):
            settled = cycle(store, held)
            assert settled.settled.status == "succeeded" and settled.claimed is not None
            held = settled.claimed
        assert prepared_names(store)


def test_a_failure_in_the_statement_sent_with_the_commit_is_not_committed(
    engine: Engine, pg_engine: Engine, pg_schema: str
) -> None:
    """Another transaction holds the job row: the event rows' foreign-key check in the writes
    sent with the ``COMMIT`` times out (55P03), so the ``COMMIT`` was never run."""
    with open_store(engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=50) as store:
        held = warmed(store)
        before = dump_tables(store)
        holder = hold_job_row(pg_engine, pg_schema)
        try:
            details = storage_error(lambda: cycle(store, held))
        finally:
            holder.rollback()
            holder.close()
        assert details == retryable("55P03")
        assert dump_tables(store) == before
        assert cycle(store, held).claimed is not None


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize(
    ("fault", "outcome"),
    [
        ("lose_during_commit", "committed"),
        ("lose_before_commit", "aborted"),
        ("terminate_before_commit", "aborted"),
    ],
)
def test_a_connection_lost_around_the_commit_sent_with_the_writes_is_unknown(
    proxy: PgProxy,
    pg_engine: Engine,
    pg_schema: str,
    fault: str,
    outcome: str,
    whole: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``whole``: the quiet cycle in one statement, one query from its ``BEGIN`` to its ``COMMIT``
    (the transaction has no id before it is sent: the outcome is read in the tables); else the
    cycle's second query carries the ``COMMIT`` (its transaction id is read before it is sent,
    and its fate with ``pg_xact_status``)."""
    if not whole:
        monkeypatch.setattr(cycle_statement, "cycle_in_one_statement", lambda *_args: None)
    with open_store(proxy.url(), schema=pg_schema, clock=lambda: T0) as store:
        held = warmed(store)
        proxy.arm(fault)
        details = storage_error(lambda: cycle(store, held))
        assert details["storageCode"] in ("CONNECTION_LOST", "57P01")
        assert details["commitState"] == "unknown" and details["retryable"] is False
        assert proxy.acted.is_set()
        if whole:
            assert not proxy.xids
        else:
            assert proxy.xids
            wait_until(lambda: xact_status(pg_engine, proxy.xids[-1]) == outcome)
        expected = {"succeeded" if outcome == "committed" else "running"}
        if whole and outcome == "committed":
            # The one statement settles only when its row lock came within MAX_WAIT_US; on a loaded
            # machine it can miss and COMMIT nothing (the store would run the cycle again), so a
            # committed transaction may leave the run as it was. The client cannot tell either way.
            expected.add("running")
        wait_until(lambda: status_of(pg_engine, pg_schema, held.id) in expected)
        settled = store.get_occurrence(held.id)  # reconnected
        assert settled is not None and settled.status == status_of(pg_engine, pg_schema, held.id)


def status_of(engine: Engine, schema: str, occurrence_id: str) -> str:
    with engine.connect() as connection:
        return str(
            connection.exec_driver_sql(
                f'SELECT status FROM "{schema}".occurrences WHERE occurrence_id = %(id)s',
                {"id": occurrence_id},
            ).scalar_one()
        )


CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}


def pause(store: SchedulerStore, held: Occurrence, request_id: str) -> Any:
    return store.request_occurrence_pause(
        occurrence_id=held.id, expected_fence=held.fence, request_id=request_id, capability=CAPABILITY
    )


def test_inspecting_the_store_connection_keeps_its_named_statements(
    engine: Engine, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """psycopg prepared statements of its own while the store opened; its ``rollback()`` (here
    after a read through ``store.connection``) sent ``DEALLOCATE ALL``, and the next call's
    telemetry read (state-change records on) failed on a lost name inside a swallowed error: the
    call returned a pause request that was rolled back. The store empties psycopg's cache when it
    names statements, so the names stay, and every call persists what it returns."""
    caplog.set_level(logging.INFO, logger="scheduler.events")
    with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
        held = warmed(store)
        names = prepared_names(store)
        store.connection.execute(text("SELECT 1")).all()
        store.connection.rollback()
        assert prepared_names(store) == names
        control = pause(store, held, "pause-1")
        assert store.get_occurrence_control(held.id) == replace(control, deduplicated=None)
        with store.transaction() as block:
            assert block.claim_next(owner_id="w", lease_ms=LEASE) is not None


def test_a_call_whose_commit_went_with_its_writes_leaves_no_transaction_open(
    engine: Engine, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A call that ran a statement through SQLAlchemy (its record of a transaction began) and sent
    its ``COMMIT`` with its last writes: SQLAlchemy's record is closed too, so the next
    ``store.transaction()`` block begins (it raised ``InvalidRequestError``)."""
    caplog.set_level(logging.INFO, logger="scheduler.events")
    with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
        warmed(store)
        for n in range(3):  # the pause request's statements are named from its second run
            held = store.claim_next(owner_id="w", lease_ms=LEASE)
            assert held is not None
            pause(store, held, f"pause-{n}")
            assert not store.connection.in_transaction()
            assert store.connection.connection.driver_connection.info.transaction_status == 0
        with store.transaction() as block:
            block.enqueue_occurrence(job_id="job-1", scheduled_for=T0, trigger_key="in-block")
        assert store.list_occurrences_by_trigger(job_id="job-1", trigger_key="in-block")


def test_an_aborted_transaction_is_never_committed(engine: Engine, pg_schema: str) -> None:
    """A statement failed inside a store-owned transaction and the error was caught: ``COMMIT``
    would roll it back and report no error, so the call fails instead, nothing written."""
    with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
        warmed(store)
        before = dump_tables(store)

        def swallowing(tx: Any) -> None:
            tx.execute(text(f'UPDATE "{pg_schema}".jobs SET revision = revision + 1'))
            with contextlib.suppress(DBAPIError):
                tx.execute(text("SELECT 1 / 0"))

        details = storage_error(lambda: store._runner.write(swallowing))
        assert details == {
            "phase": "write",
            "storageCode": "25P02",
            "commitState": "not_committed",
            "retryable": False,
        }
        assert dump_tables(store) == before


def test_a_second_store_on_a_pooled_connection_names_its_statements_and_gives_the_threshold_back(
    postgres_server: Any, pg_schema: str
) -> None:
    seen: list[tuple[str, Any]] = []
    engine = create_engine(
        postgres_server.url,
        pool_size=1,
        max_overflow=0,
        connect_args={"cursor_factory": recording_cursor(seen)},
    )
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as first:
            warmed(first)
            assert prepared_names(first)
        with engine.connect() as connection:  # the same pooled connection, the application's again
            assert connection.connection.driver_connection.prepare_threshold == 5  # psycopg's default
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as second:
            held = second.claim_next(owner_id="w", lease_ms=LEASE)
            assert held is not None
            for _ in range(2):
                held = cycle(second, held).claimed
                assert held is not None
            seen.clear()
            cycle(second, held)
            sent = [sql for sql, _ in seen]
            assert len(sent) == 1 and sent[0].startswith("BEGIN") and sent[0].endswith("; COMMIT"), sent
    finally:
        engine.dispose()


def test_a_statement_a_lock_kept_from_being_named_is_named_later(
    postgres_server: Any, pg_schema: str
) -> None:
    """``PREPARE`` waits for the locks of the tables it reads: under another transaction's
    ``ACCESS EXCLUSIVE`` lock it times out, and the statement is named at a later idle moment
    (only a statement PostgreSQL cannot prepare at all stays unnamed)."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(postgres_server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=50) as store:
            store.create_job(id="job-1", kind="email", authority=AUTHORITY)
            for n in range(4):
                store.enqueue_occurrence(job_id="job-1", scheduled_for=T0, trigger_key=f"t{n}")
            held = store.claim_next(owner_id="w", lease_ms=LEASE)  # the claim's statements' first run
            assert held is not None
            with postgres_server.engine.connect() as locker:
                locker.exec_driver_sql(f'LOCK TABLE "{pg_schema}".occurrences IN ACCESS EXCLUSIVE MODE')
                storage_error(lambda: store.get_occurrence(held.id))  # PREPARE, then the read, time out
                locker.rollback()
            store.get_occurrence(held.id)  # the next idle moment names them
            seen.clear()
            assert store.claim_next(owner_id="w", lease_ms=LEASE) is not None
            assert seen[0][0].startswith("BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE scheduler_"), seen
    finally:
        engine.dispose()


def test_a_read_of_one_statement_goes_alone_without_a_transaction(pg_engine: Engine, pg_schema: str) -> None:
    """``get_occurrence_runtime`` (one statement): sent alone in autocommit, no ``BEGIN`` or
    ``COMMIT`` of its own, the connection idle after it; the same result as inside a block."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(pg_engine.url, connect_args={"cursor_factory": recording_cursor(seen)})
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
            held = warmed(store)
            for _ in range(2):  # named from its second run
                store.get_occurrence_runtime(held.id)
            seen.clear()
            runtime = store.get_occurrence_runtime(held.id)
            sent = [sql for sql, _ in seen]
            assert len(sent) == 1 and sent[0].startswith("EXECUTE scheduler_"), sent
            assert store.connection.connection.driver_connection.info.transaction_status == 0
            with store.transaction() as block:
                assert block.get_occurrence_runtime(held.id) == runtime
            assert runtime is not None and runtime.job_kind == "email"
            assert store.get_occurrence_runtime("occ_missing") is None
    finally:
        engine.dispose()


def test_a_worker_group_is_one_transaction_without_savepoints(pg_engine: Engine, pg_schema: str) -> None:
    """A batched worker's group (``commit_group``) on the named statements: its ``BEGIN`` goes
    with its first statement and its ``COMMIT`` with its last writes, and no ``SAVEPOINT`` is sent."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(pg_engine.url, connect_args={"cursor_factory": recording_cursor(seen)})
    steps = group_claims("w", LEASE, [("email", None)])
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
            store.create_job(id="job-1", kind="email", authority=AUTHORITY)
            for n in range(40):
                store.enqueue_occurrence(job_id="job-1", scheduled_for=T0, trigger_key=f"t{n}")
            done = commit_group(store, [], steps, 8)
            assert isinstance(done, CommittedGroup)
            held = done.claimed
            for _ in range(3):  # the group's statements are named from their second run
                seen.clear()
                settlements = [
                    {"occurrence_id": one.id, "owner_id": "w", "fence": one.fence, "outcome": "succeeded"}
                    for one in held
                ]
                done = commit_group(store, settlements, steps, 8)
                assert isinstance(done, CommittedGroup) and len(done.claimed) == 8
                held = done.claimed
            sent = [sql for sql, _ in seen]
            assert not [sql for sql in sent if "SAVEPOINT" in sql.upper()], sent
            assert sum(sql.startswith("BEGIN") for sql in sent) == 1, sent
            assert sum(sql.endswith("COMMIT") for sql in sent) == 1 and sent[-1].endswith("; COMMIT"), sent
            assert len(sent) <= 10, sent  # BEGIN with the lock, reads, writes, runtimes, events with COMMIT
    finally:
        engine.dispose()


def test_a_cycle_filtered_by_job_kinds_is_one_named_statement(pg_engine: Engine, pg_schema: str) -> None:
    """A worker claims only the kinds it has handlers for: the kinds are one ``text[]`` value,
    written as an ``ARRAY[...]`` literal, so the cycle stays a named statement (planned once)
    instead of being parsed and planned again on every call, and odd kinds filter exactly."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(pg_engine.url, connect_args={"cursor_factory": recording_cursor(seen)})
    odd = "it's, {a}\"b\\"
    try:
        with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
            held = warmed(store, count=16)
            kinds = ["email", "sms"]
            for _ in range(3):  # the first calls name the statement; the later ones execute it
                held = cycle(store, held, job_kind=kinds).claimed
                assert held is not None
            seen.clear()
            for _ in range(3):
                held = cycle(store, held, job_kind=kinds).claimed
                assert held is not None
            sent = [sql for sql, _ in seen]
            assert len(sent) == 3, sent  # BEGIN, the lead, the cycle and COMMIT: one query each
            assert all(sql.startswith("BEGIN ") and sql.endswith("; COMMIT") for sql in sent), sent
            assert all("ARRAY['email','sms']::text[]" in sql for sql in sent), sent
            store.create_job(id="job-odd", kind=odd, authority=AUTHORITY)
            store.enqueue_occurrence(job_id="job-odd", scheduled_for=T0 - 1, trigger_key="odd")
            assert store.claim_next(owner_id="w", lease_ms=LEASE, job_kind=["nothing-here"]) is None
            odd_claim = store.claim_next(owner_id="w", lease_ms=LEASE, job_kind=[odd, "x"])
            assert odd_claim is not None and odd_claim.job_id == "job-odd"
    finally:
        engine.dispose()
