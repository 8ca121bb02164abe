"""Writes a call keeps for later (``Tx.write_later``, ``scheduler.store.plumbing.write_batch``) and claims
that restart instead of taking a savepoint (``CallMode.may_run_again``).

On PostgreSQL a one-row settle or claim ``UPDATE`` is sent with the call's event rows as one
statement (data-modifying ``WITH``), and the claim reads may run before a kept settlement when
the settled row is neither claimable nor due before or after it (on SQLite every write runs when
asked for). Here: the statements sent, on the real server. The results, the same on both
backends: ``tests/conformance/test_settle_and_claim.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from lifecycle_support import expect_error
from sqlalchemy import Connection, Engine, create_engine, text
from test_fastpath_postgresql import recording_cursor
from test_postgresql_claims import AUTHORITY, LEASE, T0, _row_lock_free, _wait_event, enqueue

from scheduler import open_store
from scheduler.backends.postgresql import (
    claim_locks,
    claim_statement,
    cycle_statement,
    queries,
    settle_statement,
)
from scheduler.store.capabilities import settlement
from scheduler.store.plumbing.session import OwnedRunner
from scheduler.store.plumbing.statement_plans import Prepared

CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint", "before_execute"]}


# ------------------------------------------------------------------ PostgreSQL: the statements


def _recorded(
    url: Any, schema: str, seen: list[tuple[str, Any]], *, named: bool = True
) -> tuple[Engine, Any]:
    connect_args: dict[str, Any] = {"cursor_factory": recording_cursor(seen)}
    if not named:
        connect_args["prepare_threshold"] = None  # no prepared statements (PgBouncer's transaction pooling)
    engine = create_engine(url, connect_args=connect_args)
    return engine, open_store(engine, schema=schema)  # the server clock (clock=None)


def named_statement(store: Any, sent: str) -> str:
    """The SQL of the named statement ``sent`` executes, read in autocommit (psycopg's
    ``rollback()`` would ``DEALLOCATE ALL``)."""
    name = sent.split("EXECUTE ", 1)[1].split("(", 1)[0]
    driver = store.connection.connection.driver_connection
    driver.autocommit = True
    try:
        row = driver.execute(
            "SELECT statement FROM pg_prepared_statements WHERE name = %(name)s",
            {"name": name},
            prepare=False,
        ).fetchone()
    finally:
        driver.autocommit = False
    assert row is not None, name
    return " ".join(str(row[0]).split())


def _recorded_cycle(store: Any, held: Any, seen: list[tuple[str, Any]]) -> tuple[Any, list[str]]:
    """One ``settle_and_claim`` of ``held`` (it claims the next, first fence) and the statements
    it sent, white space folded."""
    seen.clear()
    cycle = store.settle_and_claim(
        occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=LEASE
    )
    assert cycle.claimed is not None and cycle.claimed.fence == 1
    return cycle, [" ".join(sql.split()) for sql, _ in seen]


def _warmed_cycles(store: Any, count: int = 2) -> Any:
    """Five occurrences of a new job ``j``, the first claimed by ``w``, then ``count`` cycles (a
    statement is named when the connection is idle after its first run); the occurrence then held."""
    store.create_job(id="j", kind="k", authority=AUTHORITY)
    for n in range(5):
        store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key=f"t{n}")
    held = store.claim_next(owner_id="w", lease_ms=LEASE)
    for _ in range(count):
        assert held is not None
        held = store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=LEASE
        ).claimed
    assert held is not None
    return held


@pytest.mark.postgresql
def test_a_quiet_cycle_is_one_round_trip(postgres_server: Any, pg_schema: str) -> None:
    """A quiet ``settle_and_claim`` that succeeds: one statement (``cycle_statement``) locks the
    settled row, reads the server clock after that lock and the queue's heads with it, locks the
    head, settles and claims, and writes both events; it is ``EXECUTE`` of a statement the store
    named on its connection, sent with the transaction's ``BEGIN`` and ``COMMIT``."""
    seen: list[tuple[str, Any]] = []
    engine, store = _recorded(postgres_server.url, pg_schema, seen)
    try:
        held = _warmed_cycles(store)
        _cycle, sent = _recorded_cycle(store, held, seen)
        assert len(sent) == 1, sent
        assert sent[0].startswith("BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE scheduler_")
        assert sent[0].endswith("; COMMIT")
        lead, cycle_text = sent[0].rsplit("; EXECUTE ", 1)
        assert "FOR UPDATE" in named_statement(store, lead)  # the settled row, locked first
        statement = named_statement(store, "EXECUTE " + cycle_text)
        assert (
            "locked_current AS MATERIALIZED ( SELECT" in statement
            and "cycle_clock AS MATERIALIZED" in statement
        )
        assert "FOR UPDATE OF o SKIP LOCKED" in statement
        assert "settled AS ( UPDATE" in statement and "claimed AS ( UPDATE" in statement
        assert "ev AS ( INSERT INTO" in statement
        history = [event.type for event in store.history(job_id="j")]
        assert history.count("occurrence_succeeded") == 3 and history.count("occurrence_claimed") == 4
    finally:
        store.close()
        engine.dispose()


@pytest.mark.postgresql
def test_a_cycle_is_two_round_trips_without_its_statement(
    postgres_server: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the one statement does not serve (a failure, an adjudication request, events logged
    or counted; here turned off): one statement locks and reads the settled row, reads the
    server clock after that lock and the queue's heads with it, and locks the head
    (``cycle_read``); it goes with the transaction's ``BEGIN``. Then both writes and both events
    as one statement, with the ``COMMIT``. Each is ``EXECUTE`` of a statement the store named on
    its connection. No savepoint (the store-owned call restarts instead, below). A plain
    ``settle`` (its one statement, ``settle_statement``, turned off too): its locked read with the
    clock, then its ``UPDATE`` and its event together."""
    monkeypatch.setattr(cycle_statement, "cycle_in_one_statement", lambda *_args: None)
    monkeypatch.setattr(settle_statement, "settle_in_one_statement", lambda *_args: None)
    seen: list[tuple[str, Any]] = []
    engine, store = _recorded(postgres_server.url, pg_schema, seen)
    try:
        held = _warmed_cycles(store)
        cycle, sent = _recorded_cycle(store, held, seen)
        assert len(sent) == 2, sent
        assert sent[0].startswith("BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE scheduler_")
        assert sent[1].startswith("EXECUTE scheduler_") and sent[1].endswith("; COMMIT")
        first, writes = named_statement(store, sent[0]), named_statement(store, sent[1])
        assert "locked_current AS MATERIALIZED ( SELECT" in first
        assert "cycle_clock AS MATERIALIZED" in first and "probe AS MATERIALIZED" in first
        assert "FOR UPDATE OF o SKIP LOCKED" in first
        assert "WITH w0 AS (UPDATE" in writes and "w1 AS (UPDATE" in writes and "w2 AS (INSERT INTO" in writes
        history = [event.type for event in store.history(job_id="j")]
        assert {"occurrence_succeeded", "occurrence_claimed"} <= set(history)
        claimed = cycle.claimed
        store.settle(occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded")
        claimed = store.claim_next(owner_id="w", lease_ms=LEASE)  # its statements' first run
        assert claimed is not None
        seen.clear()
        store.settle(occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded")
        sent = [sql for sql, _ in seen]
        assert len(sent) == 2 and sent[0].startswith("BEGIN") and sent[1].endswith("; COMMIT"), sent
    finally:
        store.close()
        engine.dispose()


@pytest.mark.postgresql
def test_without_prepared_statements_a_cycle_is_one_statement_and_a_commit(
    postgres_server: Any, pg_schema: str
) -> None:
    """A connection made with ``prepare_threshold=None`` (behind PgBouncer's transaction pooling)
    gets no named statements: psycopg sends ``BEGIN`` and ``COMMIT`` itself around the cycle's
    statement (after the settled row's lock, ``cycle_statement``), unnamed statements with bound
    parameters."""
    seen: list[tuple[str, Any]] = []
    engine, store = _recorded(postgres_server.url, pg_schema, seen, named=False)
    try:
        store.create_job(id="j", kind="k", authority=AUTHORITY)
        for n in range(3):
            store.enqueue_occurrence(job_id="j", scheduled_for=T0, trigger_key=f"t{n}")
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held is not None
        _cycle, sent = _recorded_cycle(store, held, seen)
        assert len(sent) == 2, sent
        assert sent[0].startswith("SELECT") and sent[0].endswith("FOR UPDATE")  # the settled row first
        assert sent[1].startswith("WITH cycle_started AS MATERIALIZED ( SELECT")
        assert "FOR UPDATE OF o SKIP LOCKED" in sent[1] and "claimed AS ( UPDATE" in sent[1]
        driver = store.connection.connection.driver_connection
        rows = driver.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False).fetchone()
        driver.rollback()
        assert rows is not None and rows[0] == 0
    finally:
        store.close()
        engine.dispose()


def _slowed(statement: Prepared) -> Prepared:
    """``statement`` sleeping 1 s after its snapshot is taken, before it locks a row (long enough
    for the test to commit its change meanwhile on a loaded machine: 0.2 s was missed once in a
    full parallel run, and the lock then came first)."""
    slow: Any = statement.statement
    return Prepared(slow.where(text("EXISTS (SELECT FROM pg_sleep(1))")), passes_kept_writes=True)


@contextmanager
def _attempts_of(monkeypatch: pytest.MonkeyPatch, store: Any = None) -> Iterator[list[bool]]:
    """The ``CallMode.may_run_again`` of every transaction attempt a store-owned runner makes (only
    ``store``'s, if given)."""
    attempts: list[bool] = []
    real_attempt = OwnedRunner._attempt

    def attempt(self: Any, operation: Any, begin: str, sample_clock: bool, **kwargs: Any) -> Any:
        if store is None or self is store._runner:
            attempts.append(kwargs["call"].may_run_again)
        return real_attempt(self, operation, begin, sample_clock, **kwargs)

    monkeypatch.setattr(OwnedRunner, "_attempt", attempt)
    yield attempts


def _started_until_it_waits(
    engine: Engine, pid: int, call: Callable[[], Any], results: list[Any]
) -> threading.Thread:
    """``call`` running in a thread (its result appended to ``results``), once the store's
    backend ``pid`` waits for a row lock."""
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    while _wait_event(engine, pid) not in ("tuple", "transactionid"):
        assert thread.is_alive(), results
    return thread


def _slow_the_lock(monkeypatch: pytest.MonkeyPatch, store: Any, path: str) -> None:
    """Slow the statement that locks a claim's candidate on ``path`` (``head``: the quiet path's
    heads read and locked at once; ``list``: the contended path's lock, the store set to it), the
    claim taken the usual way (its one statement, ``claim_statement``, turned off)."""
    monkeypatch.setattr(claim_statement, "claim_in_one_statement", lambda *_args: None)
    if path == "head":
        locking = "WHERE head.plain FOR UPDATE OF o SKIP LOCKED"
        sql = queries.SQL["claim_head"]
        assert sql.count(locking) == 1
        slowed = sql.replace(
            locking, "WHERE head.plain AND EXISTS (SELECT FROM pg_sleep(1)) FOR UPDATE OF o SKIP LOCKED"
        )
        monkeypatch.setattr(queries, "CLAIM_HEAD", queries.prepared("claim_head", slowed))
    else:
        monkeypatch.setattr(claim_locks, "LOCK_CANDIDATE_ROWS", _slowed(claim_locks.LOCK_CANDIDATE_ROWS))
        store._claims.took_first(False)  # as after a head another worker held


def _claim_while(store: Any, engine: Engine, change: Callable[[Connection], None]) -> Any:
    """``claim_next`` on ``store``, with ``change`` committed by another connection while the
    claim's (slowed) lock statement sleeps."""
    pid = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    store.connection.rollback()
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(store.claim_next(owner_id="w", lease_ms=LEASE)))
    thread.start()
    while _wait_event(engine, pid) != "PgSleep":
        assert thread.is_alive(), results
    with engine.begin() as other:
        change(other)
    thread.join(30)
    assert len(results) == 1
    return results[0]


@pytest.mark.postgresql
@pytest.mark.parametrize("path", ["head", "list"])
def test_a_claim_that_meets_a_row_changed_under_its_lock_runs_again_with_savepoints(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The store-owned claim takes no savepoint. When its lock statement returns a candidate that
    another worker changed and committed while the statement ran (slowed with ``pg_sleep`` so the
    commit lands in between), the claim cannot release that one lock: the whole call is rolled
    back and run again, that time with savepoints, and claims as the seed would on the new rows.
    ``head``: the quiet path (heads read and locked in one statement); ``list``: the path among
    contending workers (the candidate list, then ``LOCK_CANDIDATE_ROWS``)."""
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        first, second = enqueue(store, 2)
        _slow_the_lock(monkeypatch, store, path)
        with _attempts_of(monkeypatch) as attempts:
            claimed = _claim_while(
                store,
                pg_engine,
                lambda other: other.exec_driver_sql(
                    f'UPDATE "{pg_schema}".occurrences SET fence = 1 WHERE occurrence_id = %(id)s',
                    {"id": first},
                ),
            )
        assert attempts == [True, False]
        assert claimed is not None and (claimed.id, claimed.fence) == (first, 2)  # the head, as it is now
        assert _row_lock_free(pg_engine, pg_schema, second)  # nothing else stayed locked
    finally:
        store.close()


@pytest.mark.postgresql
@pytest.mark.parametrize("path", ["head", "list"])
def test_a_candidate_claimed_on_its_read_facts_is_decided_again_when_they_changed(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A single store-owned claim takes the locked candidate on its job, control and requeue facts
    as its read found them (not read again after the lock); its ``UPDATE`` checks them again. A
    job disabled between the read's snapshot and the lock: the ``UPDATE`` writes nothing, the call
    runs again and finds nothing claimable. ``head``/``list``: as above."""
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        first, second = enqueue(store, 2)
        _slow_the_lock(monkeypatch, store, path)
        with _attempts_of(monkeypatch) as attempts:
            claimed = _claim_while(
                store,
                pg_engine,
                lambda other: other.exec_driver_sql(f'UPDATE "{pg_schema}".jobs SET enabled = 0'),
            )
        assert attempts == [True, False]
        assert claimed is None
        assert [store.get_occurrence(key).status for key in (first, second)] == ["queued", "queued"]
        assert _row_lock_free(pg_engine, pg_schema, first)
    finally:
        store.close()


@pytest.mark.postgresql
def test_a_rolled_back_call_keeps_the_prepared_statements(pg_engine: Engine, pg_schema: str) -> None:
    """psycopg's ``rollback()`` forgets every statement it prepared; the store rolls its own
    transactions back past that cache (a restart, or a refused call), so the hot statements stay
    prepared instead of being planned again on their next five runs."""
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        enqueue(store, 12)
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        for _ in range(8):  # psycopg prepares a statement on its sixth execution
            assert held is not None
            held = store.settle_and_claim(
                occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=LEASE
            ).claimed
        assert held is not None
        for _ in range(2):  # a lost lease's statements (its one statement, then the usual way), named
            expect_error(
                "SCHEDULER_LEASE_LOST",
                lambda: store.settle(
                    occurrence_id=held.id, owner_id="w", fence=held.fence + 1, outcome="succeeded"
                ),
            )
        before = _prepared_names(store)
        assert len(before) >= 3
        expect_error(
            "SCHEDULER_LEASE_LOST",
            lambda: store.settle(
                occurrence_id=held.id, owner_id="w", fence=held.fence + 1, outcome="succeeded"
            ),
        )
        assert _prepared_names(store) == before
        cycle = store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=LEASE
        )
        assert cycle.claimed is not None and _prepared_names(store) == before
    finally:
        store.close()


def _prepared_names(store: Any) -> set[str]:
    """The names of the store connection's prepared statements (read past psycopg's cache)."""
    driver = store.connection.connection.driver_connection
    rows = driver.execute("SELECT name FROM pg_prepared_statements", prepare=False).fetchall()
    return {name for (name,) in rows}


@pytest.mark.postgresql
@pytest.mark.parametrize("retry_at", [None, 1])
def test_a_retry_due_at_once_with_the_server_clock_is_claimed_again(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch, retry_at: int | None
) -> None:
    """A retry due at once would be one of the heads, so it must be written before they are read.
    Without ``retry_at`` the cycle reads them after the settlement (the usual way, no restart);
    with a ``retry_at`` already past the cycle's first statement has read them, and the call runs
    again the usual way. Either way it claims the same occurrence again."""
    store = open_store(pg_engine, schema=pg_schema)  # the server clock
    try:
        (only,) = enqueue(store, 1)
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held is not None and held.id == only
        with _attempts_of(monkeypatch, store) as attempts:
            cycle = store.settle_and_claim(
                occurrence_id=only,
                owner_id="w",
                fence=held.fence,
                outcome="failed",
                retry_at=retry_at,
                lease_ms=LEASE,
            )
        assert attempts == ([True] if retry_at is None else [True, False])
        assert cycle.settled.status == "retry_wait"
        assert cycle.claimed is not None and (cycle.claimed.id, cycle.claimed.fence) == (only, 2)
    finally:
        store.close()


@pytest.mark.postgresql
@pytest.mark.parametrize("call", ["settle", "settle_and_claim", "settle_many", "in_a_block"])
def test_a_settlement_that_waited_behind_a_pause_request_sees_it(
    pg_engine: Engine, pg_schema: str, call: str
) -> None:
    """A settle's read locks the occurrence and reads its control in one statement, on the
    snapshot taken before it waited for that lock: a pause request committed meanwhile (its
    writer holds the occurrence row) was missed, leaving ``pause_requested`` on a finished
    occurrence. A store-owned single settle's ``UPDATE`` checks there is still no control row
    (one appeared: the call runs again); ``settle_many`` and a settle inside a ``transaction()``
    block lock the rows before they read them. Either way the settle sees the request and
    terminalizes it, as in the serial order pause, then settle."""
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    pauser = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        first, second = enqueue(store, 2)
        held, other = store.claim_batch(owner_id="w", lease_ms=LEASE, limit=2)
        assert (held.id, other.id) == (first, second)
        pid = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        store.connection.rollback()
        results: list[Any] = []
        settle = {"occurrence_id": first, "owner_id": "w", "fence": held.fence, "outcome": "succeeded"}
        also = {**settle, "occurrence_id": second, "fence": other.fence}
        with pauser.transaction() as tx:
            tx.request_occurrence_pause(
                occurrence_id=first, expected_fence=held.fence, request_id="pause-1", capability=CAPABILITY
            )

            def run() -> Any:
                if call == "settle":
                    return store.settle(**settle)
                if call == "settle_and_claim":
                    return store.settle_and_claim(**settle, lease_ms=LEASE)
                if call == "settle_many":
                    return store.settle_many([settle, also])
                with store.transaction() as block:
                    return block.settle(**settle)

            thread = _started_until_it_waits(pg_engine, pid, run, results)
        thread.join(30)
        assert len(results) == 1
        control = store.get_occurrence_control(first)
        assert control is not None and control.state == "terminal"
        events = [event.to_dict() for event in store.history(occurrence_id=first)]
        settled = [event for event in events if event["type"] == "occurrence_succeeded"]
        assert [event["data"].get("runtimeControlTerminalized") for event in settled] == [True]
    finally:
        pauser.close()
        store.close()


@pytest.mark.postgresql
def test_a_cycle_that_loses_its_lease_holds_no_head(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle's first statement locks the head only for a settlement that holds its lease, so a
    call that ends in ``SCHEDULER_LEASE_LOST`` never keeps another worker from the head, even for
    the moment before it rolls back (checked from another connection while the lease is judged)."""
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        made = enqueue(store, 3)
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held is not None and held.id == made[0]
        free_while_judged: list[bool] = []
        real_lease_held = settlement._lease_held

        def lease_held(row: Any, request: Any, now: int) -> bool:
            free_while_judged.append(_row_lock_free(pg_engine, pg_schema, made[1]))
            return bool(real_lease_held(row, request, now))

        monkeypatch.setattr(settlement, "_lease_held", lease_held)
        expect_error(
            "SCHEDULER_LEASE_LOST",
            lambda: store.settle_and_claim(
                occurrence_id=held.id, owner_id="w", fence=held.fence + 1, outcome="succeeded", lease_ms=LEASE
            ),
        )
        assert free_while_judged == [True]
    finally:
        store.close()


def _whole_cycles(monkeypatch: pytest.MonkeyPatch, whole: bool) -> None:
    """Keep (``whole``) or turn off the quiet cycle in one statement (``cycle_statement``)."""
    if not whole:
        monkeypatch.setattr(cycle_statement, "cycle_in_one_statement", lambda *_args: None)


@pytest.mark.postgresql
@pytest.mark.parametrize("whole", [True, False])
def test_a_cycle_that_waited_for_its_settled_row_reads_the_heads_again(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    """The heads of the cycle's first statement are read on the snapshot taken before the settled
    row's lock: when that lock waited (another transaction held the row), rows committed meanwhile
    would be missed, so the call runs again the usual way. Here an occurrence due earlier than
    every other is enqueued and committed while the cycle waits: it is the one claimed. The
    cycle in one statement (``whole``) waits in its lead lock, before its statement's snapshot:
    it sees the occurrence at once."""
    _whole_cycles(monkeypatch, whole)
    store = open_store(pg_engine, schema=pg_schema)  # the server clock
    try:
        made = enqueue(store, 3)
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held is not None and held.id == made[0]
        pid = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        store.connection.rollback()
        with pg_engine.connect() as blocker, _attempts_of(monkeypatch, store) as attempts:
            with blocker.begin():
                blocker.exec_driver_sql(
                    f'SELECT 1 FROM "{pg_schema}".occurrences WHERE occurrence_id = %(id)s FOR UPDATE',
                    {"id": held.id},
                )
                results: list[Any] = []
                settle = {"occurrence_id": held.id, "owner_id": "w", "fence": held.fence}
                thread = _started_until_it_waits(
                    pg_engine,
                    pid,
                    lambda: store.settle_and_claim(**settle, outcome="succeeded", lease_ms=LEASE),
                    results,
                )
                other = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
                try:
                    early = other.enqueue_occurrence(
                        job_id="job-1", scheduled_for=T0 - 1000, trigger_key="early"
                    )
                finally:
                    other.close()
            thread.join(30)
        assert attempts == ([True] if whole else [True, False])
        assert results[0].claimed is not None and results[0].claimed.id == early.id
    finally:
        store.close()


@pytest.mark.postgresql
@pytest.mark.parametrize("whole", [True, False])
def test_a_cycle_whose_settled_row_changed_while_it_waited_reads_the_heads_again(
    pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    """However short the wait: when the transaction holding the settled row updated it (the cycle
    sees that newer version) and also enqueued an earlier occurrence, a claim on the older
    snapshot's heads would miss that occurrence, and no serial order explains both. The locked
    row's version (``xmin``) differs from the snapshot's, so the call runs again and claims it.
    (The wait-time test is switched off here, so only the version can tell.) The cycle in one
    statement (``whole``) waits in its lead lock: its statement's snapshot sees both at once."""
    from scheduler.backends.postgresql import cycle_read

    _whole_cycles(monkeypatch, whole)
    monkeypatch.setattr(cycle_read, "MAX_WAIT_US", 10**12)
    store = open_store(pg_engine, schema=pg_schema)  # the server clock
    other = open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    try:
        enqueue(store, 3)
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held is not None
        pid = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        store.connection.rollback()
        results: list[Any] = []
        with _attempts_of(monkeypatch, store) as attempts:
            with other.transaction() as tx:
                tx.renew(occurrence_id=held.id, owner_id="w", fence=held.fence, lease_ms=LEASE)
                settle = {"occurrence_id": held.id, "owner_id": "w", "fence": held.fence}
                thread = _started_until_it_waits(
                    pg_engine,
                    pid,
                    lambda: store.settle_and_claim(**settle, outcome="succeeded", lease_ms=LEASE),
                    results,
                )
                early = tx.enqueue_occurrence(job_id="job-1", scheduled_for=T0 - 1000, trigger_key="early")
            thread.join(30)
        assert attempts == ([True] if whole else [True, False])
        assert results[0].claimed is not None and results[0].claimed.id == early.id
    finally:
        other.close()
        store.close()
