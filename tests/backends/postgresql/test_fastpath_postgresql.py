"""The compile-once fast path on PostgreSQL (psycopg): the same statements, parameters and results
as SQLAlchemy's own execution, on the real server.

The SQLite side is ``tests/backends/sqlite/test_fastpath.py``; its ``workload`` (every lifecycle
path, ``fastpath_support.py``) runs here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import psycopg
import pytest
from backends import PostgresServer, unique_name
from cycle_support import claim_and_settle_statements_off
from fastpath_support import AUTHORITY, T0, Clock, workload
from sqlalchemy import Engine, bindparam, create_engine, event, literal_column, select
from sqlalchemy.engine import URL

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.backends.postgresql import enqueue_statement
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.records import Occurrence
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
Recorded = list[tuple[str, Any]]


def recording_cursor(seen: Recorded) -> type[psycopg.Cursor[Any]]:
    """A psycopg cursor class that records every statement and its parameters."""

    class Cursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            # (SQLAlchemy's exec_driver_sql passes ``{}`` where the fast path passes nothing.)
            seen.append((str(query), dict(params) if params else None))
            return super().execute(query, params, **kwargs)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            rows = [dict(params) for params in params_seq]
            seen.append((str(query), rows))
            return super().executemany(query, rows, **kwargs)

    return Cursor


@contextmanager
def recorded_store(
    url: URL, schema: str, *, fast: bool, named: bool = False
) -> Iterator[tuple[SchedulerStore, Recorded, Clock]]:
    """A store whose psycopg statements are recorded; ``named``: with the store's named
    server-side statements (``scheduler.backends.postgresql.server_statements``), else psycopg's unnamed ones
    (``prepare_threshold=None``), so the fast path's SQL and parameters can be compared with
    SQLAlchemy's."""
    seen: Recorded = []
    clock = Clock()
    connect_args: dict[str, Any] = {"cursor_factory": recording_cursor(seen)}
    if not named:
        connect_args["prepare_threshold"] = None
    engine = create_engine(url, connect_args=connect_args)
    store = open_store(engine, schema=schema, clock=clock, uuid_factory=clock.uuid)
    if not fast:
        event.listen(store.connection, "before_cursor_execute", lambda *args: None)
    seen.clear()
    try:
        yield store, seen, clock
    finally:
        store.close()
        engine.dispose()


def cycles(store: SchedulerStore, count: int) -> Occurrence | None:
    """Claim, then ``count`` times settle the held occurrence and claim the next in one call."""
    held = store.claim_next(owner_id="w", lease_ms=60_000)
    for _ in range(count):
        assert held is not None
        held = store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
        ).claimed
    return held


def run(
    server: PostgresServer, schema: str, *, fast: bool, named: bool = False
) -> tuple[list[Any], Recorded, Any]:
    server.drop_schema(schema)
    with recorded_store(server.url, schema, fast=fast, named=named) as (store, seen, clock):
        results = workload(store, clock)
        return results, list(seen), dump_tables(store)


def test_the_fast_path_sends_psycopg_exactly_what_sqlalchemy_sends(postgres_server: PostgresServer) -> None:
    """Statement by statement; the calls the fast path alone sends as one statement
    (``claim_statement``, ``settle_statement``) are turned off (their results and tables:
    ``test_named_statements_give_the_same_results_and_tables_as_sqlalchemy``)."""
    schema = unique_name("t_fast")
    try:
        # An enqueue left whole to one statement is a tactic of the fast path's own, not another
        # execution of the same statements (test_postgresql_enqueue_statement.py compares it).
        with (
            patch.object(enqueue_statement, "enqueue_in_one_statement", lambda *_args: None),
            claim_and_settle_statements_off(),
        ):
            fast_results, fast_seen, fast_tables = run(postgres_server, schema, fast=True)
        slow_results, slow_seen, slow_tables = run(postgres_server, schema, fast=False)
    finally:
        postgres_server.drop_schema(schema)
    assert fast_results == slow_results
    assert fast_tables == slow_tables
    assert len(fast_seen) == len(slow_seen)
    for index, (fast, slow) in enumerate(zip(fast_seen, slow_seen, strict=True)):
        assert fast == slow, f"statement {index} differs"


def test_named_statements_give_the_same_results_and_tables_as_sqlalchemy(
    postgres_server: PostgresServer,
) -> None:
    """The store's own connection sends its hot statements as ``EXECUTE scheduler_<n>(…)`` with
    the transaction's ``BEGIN`` or ``COMMIT`` (each named once per connection, after its first
    run on psycopg's path): every lifecycle path returns what SQLAlchemy's own execution returns
    and leaves the same tables."""
    schema = unique_name("t_named")
    try:
        named_results, named_seen, named_tables = run(postgres_server, schema, fast=True, named=True)
        slow_results, _slow_seen, slow_tables = run(postgres_server, schema, fast=False)
    finally:
        postgres_server.drop_schema(schema)
    assert named_results == slow_results
    assert named_tables == slow_tables
    sent = [sql for sql, _ in named_seen]
    executed = [sql for sql in sent if "EXECUTE scheduler_" in sql]
    assert any(sql.startswith("BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE scheduler_") for sql in executed)
    assert any(sql.endswith("; COMMIT") for sql in executed)
    prepared = {sql.split()[1] for sql in sent if sql.startswith("PREPARE scheduler_")}
    used = {sql.split("EXECUTE ", 1)[1].split("(", 1)[0].split(";", 1)[0] for sql in executed}
    assert len(prepared & used) >= 10, (prepared, used)


def counted_cursors(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every psycopg cursor opened from now on (by any connection of the process)."""
    cursors: list[int] = []
    opened = psycopg.Connection.cursor

    def cursor(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = opened(self, *args, **kwargs)
        cursors.append(id(made))
        return made

    monkeypatch.setattr(psycopg.Connection, "cursor", cursor)
    return cursors


def queued_store(engine: Engine, schema: str, count: int) -> SchedulerStore:
    """A store on ``engine`` (clock ``T0``) with job ``a`` and ``count`` occurrences due at ``T0``."""
    store = open_store(engine, schema=schema, clock=lambda: T0)
    store.create_job(id="a", kind="agenda", authority=AUTHORITY)
    for n in range(count):
        store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key=f"k{n}")
    return store


def test_the_hot_paths_run_on_one_reused_cursor(
    postgres_server: PostgresServer, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cursors = counted_cursors(monkeypatch)
    engine = create_engine(postgres_server.url)
    store = queued_store(engine, pg_schema, 5)
    try:
        cursors.clear()
        held = cycles(store, 4)
        assert held is not None
        store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")
        assert cursors == []  # ~50 statements, not one new cursor
    finally:
        store.close()
        engine.dispose()


def test_a_cycle_run_again_rolls_back_on_the_reused_cursor(
    postgres_server: PostgresServer, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement cycle misses when another transaction holds the head it would claim (a
    machine busy enough to delay its lock past ``cycle_read.MAX_WAIT_US`` misses it too): the
    call's transaction is rolled back past psycopg's prepared statements
    (``FastPath.rollback_keeping_prepared``) and the call runs again, still on the one cursor."""
    cursors = counted_cursors(monkeypatch)
    rollbacks: list[bool] = []
    rollback = FastPath.rollback_keeping_prepared

    def counted(self: FastPath, conn: Any) -> bool:
        rollbacks.append(rollback(self, conn))
        return rollbacks[-1]

    monkeypatch.setattr(FastPath, "rollback_keeping_prepared", counted)
    engine = create_engine(postgres_server.url)
    store = queued_store(engine, pg_schema, 8)
    try:
        held = cycles(store, 3)
        assert held is not None
        with postgres_server.engine.connect() as other:
            head = other.exec_driver_sql(
                f"SELECT occurrence_id FROM \"{pg_schema}\".occurrences WHERE status = 'queued' "
                "ORDER BY available_at, scheduled_for, occurrence_id LIMIT 1 FOR UPDATE"
            ).scalar_one()
            cursors.clear()
            rollbacks.clear()
            done = store.settle_and_claim(
                occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
            )
            assert done.claimed is not None and done.claimed.id != head
            assert rollbacks == [True]
            assert cursors == []
            other.rollback()
    finally:
        store.close()
        engine.dispose()


def test_a_psycopg_store_runs_on_the_fast_path(postgres_server: PostgresServer, pg_schema: str) -> None:
    engine = create_engine(postgres_server.url)  # its own: another test may instrument the shared one
    store = open_store(engine, schema=pg_schema, clock=lambda: T0)
    try:
        fast = FastPath.for_connection(store.connection)
        assert fast is not None and fast.usable(store.connection)
    finally:
        store.close()
        engine.dispose()


def test_a_driver_error_on_the_fast_path_is_classified_and_writes_nothing(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    """A lock timeout raised by psycopg under the fast path: SQLAlchemy's wrapping, then the
    store's classification (55P03, retryable, not committed); the claim wrote nothing."""
    store = open_store(postgres_server.engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=50)
    store.create_job(id="a", kind="agenda", authority=AUTHORITY)
    store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key="k")
    blocker = postgres_server.engine.connect()
    try:
        blocker.exec_driver_sql(f'LOCK TABLE "{pg_schema}".occurrences IN ACCESS EXCLUSIVE MODE')
        with pytest.raises(SchedulerKernelError) as caught:
            store.claim_next(owner_id="w", lease_ms=1000)
        assert caught.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert caught.value.details["storageCode"] == "55P03"
        assert caught.value.details["commitState"] == "not_committed"
        assert caught.value.details["retryable"] is True
        blocker.rollback()
        claimed = store.claim_next(owner_id="w", lease_ms=1000)
        assert claimed is not None and claimed.fence == 1
    finally:
        blocker.close()
        store.close()


def test_every_pg_hot_statement_compiles_for_the_fast_path(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    """No hot statement silently falls back to SQLAlchemy's execution on psycopg (a fallback
    costs ~60–100 µs of client CPU per statement)."""
    rejected: list[str] = []
    from scheduler.store.plumbing import statement_plans

    original = statement_plans.compile_plan

    def compile_and_note(prepared: Any, *args: Any, **kwargs: Any) -> Any:
        plan = original(prepared, *args, **kwargs)
        if plan is None:
            rejected.append(str(prepared.statement)[:80])
        return plan

    clock = Clock()
    store = open_store(postgres_server.engine, schema=pg_schema, clock=clock, uuid_factory=clock.uuid)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(statement_plans, "compile_plan", compile_and_note)
            workload(store, clock)
    finally:
        store.close()
    assert rejected == []


def test_a_read_on_a_callers_connection_leaves_no_transaction_open(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    """The fast path runs a read's statements on psycopg, which opens the server transaction by
    itself: the read still ends it, so the caller's next read sees newer commits (REPEATABLE READ
    would otherwise keep the old snapshot) and no lock is left behind."""
    from psycopg.pq import TransactionStatus

    owner = open_store(postgres_server.engine, schema=pg_schema, clock=lambda: T0)
    app = create_engine(postgres_server.url, isolation_level="REPEATABLE READ")
    try:
        owner.create_job(id="j1", kind="k", authority=AUTHORITY)
        with app.connect() as conn:
            reader = SchedulerStore.on_connection(conn, schema=pg_schema)
            assert reader.get_job("j1").revision == 1
            assert conn.connection.dbapi_connection.info.transaction_status == TransactionStatus.IDLE
            assert not conn.in_transaction()
            owner.update_job("j1", 1, kind="k2")
            assert reader.get_job("j1").revision == 2
    finally:
        owner.close()
        app.dispose()


def test_a_savepoint_rollback_keeps_the_prepared_statements(postgres_server: PostgresServer) -> None:
    """psycopg forgets (and deallocates) every statement it prepared when a statement it has not
    seen before reports ``ROLLBACK``, as ``ROLLBACK TO SAVEPOINT`` does; the fast path runs its
    savepoint statements past that cache, so a claim's rare lock-round rollback does not make
    every hot statement be planned again."""
    engine = create_engine(postgres_server.url)
    try:
        with engine.connect() as connection:
            fast = FastPath.for_connection(connection)
            assert fast is not None and fast.usable(connection)
            statement = Prepared(select(literal_column("1").label("one")).where(bindparam("p") > 0))
            for _ in range(6):  # psycopg prepares a statement on its sixth execution
                assert fast.run(connection, statement, {"p": 1}) == ([(1,)], 1)
            before = _prepared(connection)
            assert len(before) == 1
            fast.run_driver_sql(connection, "SAVEPOINT s")
            fast.run_driver_sql(connection, "ROLLBACK TO SAVEPOINT s")
            assert fast.run(connection, statement, {"p": 2}) == ([(1,)], 1)
            assert [name for name, _ in _prepared(connection)] == [name for name, _ in before]
            assert _prepared(connection)[0][1] > before[0][1]  # the same statement, run again
            connection.rollback()
    finally:
        engine.dispose()


def _prepared(connection: Any) -> list[tuple[str, int]]:
    """(name, executions) of the session's prepared statements (read past psycopg's cache)."""
    dbapi = connection.connection.dbapi_connection
    rows = dbapi.execute(
        "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements ORDER BY name", prepare=False
    ).fetchall()
    return [(str(name), int(count)) for name, count in rows]
