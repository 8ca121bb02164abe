"""The compile-once fast path (scheduler.store.plumbing.fastpath) executes exactly what SQLAlchemy would.

Every comparison runs the same workload twice on real SQLite files: once on the fast path, once
with it disabled (a ``before_cursor_execute`` listener makes the store use SQLAlchemy's own
execution), and compares what the driver received, what the API returned and the final bytes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastpath_support import AUTHORITY, T0, Clock, workload
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Boolean, create_engine, event, literal, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from scheduler import (
    SchedulerKernelError,
    SchedulerStore,
    open_store,
)
from scheduler.contract.canonical import canonical_json
from scheduler.schema import tables as t
from scheduler.store.capabilities.occurrence_rows import event_data_json
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx

Recorded = list[tuple[str, Any]]


def recording_driver(seen: Recorded) -> type[sqlite3.Connection]:
    """A ``sqlite3.Connection`` class that records every statement, its parameters and commits."""

    class Cursor(sqlite3.Cursor):
        def execute(self, sql: str, parameters: Any = (), /) -> Any:
            seen.append((sql, tuple(parameters)))
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> Any:
            rows = [tuple(row) for row in parameters]
            seen.append((sql, tuple(rows)))
            return super().executemany(sql, rows)

    class Connection(sqlite3.Connection):
        def cursor(self, factory: Any = Cursor) -> Any:
            return super().cursor(factory)

        def execute(self, sql: str, parameters: Any = (), /) -> Any:
            return self.cursor().execute(sql, parameters)

        def commit(self) -> None:
            seen.append(("<commit>", ()))
            super().commit()

        def rollback(self) -> None:
            seen.append(("<rollback>", ()))
            super().rollback()

    return Connection


@contextmanager
def recorded_store(path: Path, *, fast: bool) -> Iterator[tuple[SchedulerStore, Recorded, Clock]]:
    """A store on ``path`` whose driver records everything from the first operation on."""
    seen: Recorded = []
    clock = Clock()
    engine: Engine = create_engine(f"sqlite:///{path}", connect_args={"factory": recording_driver(seen)})
    store = open_store(engine, clock=clock, uuid_factory=clock.uuid)
    if not fast:
        event.listen(store.connection, "before_cursor_execute", lambda *args: None)
    seen.clear()
    try:
        yield store, seen, clock
    finally:
        store.close()
        engine.dispose()


def _dump(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def run(path: Path, *, fast: bool) -> tuple[list[Any], Recorded]:
    with recorded_store(path, fast=fast) as (store, seen, clock):
        results = workload(store, clock)
        return results, list(seen)


def test_the_fast_path_sends_the_driver_exactly_what_sqlalchemy_sends(tmp_path: Path) -> None:
    fast_results, fast_seen = run(tmp_path / "fast.sqlite", fast=True)
    slow_results, slow_seen = run(tmp_path / "slow.sqlite", fast=False)
    assert fast_results == slow_results
    assert len(fast_seen) == len(slow_seen)
    for index, (fast, slow) in enumerate(zip(fast_seen, slow_seen, strict=True)):
        assert fast == slow, f"statement {index} differs"
    assert _dump(tmp_path / "fast.sqlite") == _dump(tmp_path / "slow.sqlite")


def test_the_hot_paths_run_on_one_reused_cursor(tmp_path: Path) -> None:
    cursors: list[int] = []

    class Connection(sqlite3.Connection):
        def cursor(self, factory: Any = sqlite3.Cursor) -> Any:
            cursor = super().cursor(factory)
            cursors.append(id(cursor))
            return cursor

    engine = create_engine(f"sqlite:///{tmp_path / 'k.sqlite'}", connect_args={"factory": Connection})
    store = open_store(engine, clock=lambda: T0)
    try:
        store.create_job(id="a", kind="agenda", authority=AUTHORITY)
        for n in range(5):
            store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key=f"k{n}")
        cursors.clear()
        for _ in range(5):
            claimed = store.claim_next(owner_id="w", lease_ms=1000)
            assert claimed is not None
            store.settle(occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded")
        assert cursors == []  # 50 statements, not one new cursor
    finally:
        store.close()
        engine.dispose()


def test_an_instrumented_connection_sees_every_statement(tmp_path: Path) -> None:
    store = open_store(tmp_path / "k.sqlite", clock=lambda: T0)
    seen: list[str] = []
    try:
        store.create_job(id="a", kind="agenda", authority=AUTHORITY)
        store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key="k")
        event.listen(store.connection, "before_cursor_execute", lambda c, cur, sql, *rest: seen.append(sql))
        claimed = store.claim_next(owner_id="w", lease_ms=1000)
        assert claimed is not None
        store.settle(occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded")
    finally:
        store.close()
    verbs = [" ".join(sql.split()[:2]) for sql in seen]
    assert verbs == [
        "BEGIN IMMEDIATE",
        "SELECT head_queued.arm,",  # the head probe decides a plain queue
        "UPDATE occurrences",
        "INSERT INTO",
        "BEGIN IMMEDIATE",
        "SELECT occurrences.occurrence_id,",
        "UPDATE occurrences",
        "INSERT INTO",
    ]


def _execute(store: SchedulerStore, operation: Callable[[Tx], Any]) -> Any:
    return store._runner.write(operation)


_BAD_EVENT = Prepared(t.events.insert())


@pytest.mark.parametrize("fast", [True, False])
def test_driver_errors_surface_as_sqlalchemy_wraps_them(tmp_path: Path, fast: bool) -> None:
    store = open_store(tmp_path / "k.sqlite", clock=lambda: T0)
    if not fast:
        event.listen(store.connection, "before_cursor_execute", lambda *args: None)
    row = {
        "job_id": "no-such-job",
        "occurrence_id": None,
        "event_type": "x",
        "occurred_at": T0,
        "owner_id": None,
        "fence": None,
        "data_json": "{}",
    }
    try:
        with pytest.raises(IntegrityError) as caught:
            _execute(store, lambda tx: tx.changes(_BAD_EVENT, row))
        assert isinstance(caught.value.orig, sqlite3.IntegrityError)
        assert str(caught.value.orig) == "FOREIGN KEY constraint failed"
        assert "INSERT INTO events" in str(caught.value)
        # the store recovers: the transaction was rolled back and a new cursor is used
        store.create_job(id="a", kind="agenda", authority=AUTHORITY)
        assert store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key="k").deduplicated is False
    finally:
        store.close()


def test_lock_contention_on_the_fast_path_is_a_retryable_storage_failure(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    store = open_store(path, clock=lambda: T0, busy_timeout_ms=0)
    store.create_job(id="a", kind="agenda", authority=AUTHORITY)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(SchedulerKernelError) as caught:
            store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key="k")
        assert caught.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
        assert caught.value.details == {
            "phase": "write",
            "storageCode": "SQLITE_BUSY",
            "commitState": "not_committed",
            "retryable": True,
        }
        blocker.execute("ROLLBACK")
        assert store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key="k").deduplicated is False
    finally:
        blocker.close()
        store.close()


def test_statements_it_cannot_reproduce_run_through_sqlalchemy(tmp_path: Path) -> None:
    store = open_store(tmp_path / "k.sqlite", clock=lambda: T0)
    fast = FastPath.for_connection(store.connection)
    assert fast is not None
    flag = Prepared(select(literal(True, Boolean).label("flag")))  # Boolean has a bind processor
    try:
        assert _execute(store, lambda tx: fast.run(tx.conn, flag, {})) is None
        rows = _execute(store, lambda tx: tx.all(flag))
        assert [row.flag for row in rows] == [True]
    finally:
        store.close()


def test_fast_rows_read_like_sqlalchemy_rows(tmp_path: Path) -> None:
    store = open_store(tmp_path / "k.sqlite", clock=lambda: T0)
    query = Prepared(select(t.jobs.c.job_id, t.jobs.c.revision).where(t.jobs.c.kind == "agenda"))
    try:
        store.create_job(id="a", kind="agenda", authority=AUTHORITY)
        fast = _execute(store, lambda tx: tx.all(query))
        event.listen(store.connection, "before_cursor_execute", lambda *args: None)
        slow = _execute(store, lambda tx: tx.all(query))
        assert [(r.job_id, r.revision, r[0], tuple(r), dict(r._mapping)) for r in fast] == [
            (r.job_id, r.revision, r[0], tuple(r), dict(r._mapping)) for r in slow
        ]
    finally:
        store.close()


_KEYS = st.one_of(
    st.sampled_from(["attempt", "maxAttempts", "retryAt", "_x", "B", "a1", "1", "01", "a-b", "é", ""]),
    st.text(max_size=6),
)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.text(max_size=12),
    st.floats(allow_nan=False),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=6))
def test_event_data_is_encoded_canonically(data: dict[str, Any]) -> None:
    try:
        expected = canonical_json(data, "event.data")
    except SchedulerKernelError as error:
        with pytest.raises(SchedulerKernelError) as caught:
            event_data_json(data)
        assert (caught.value.code, str(caught.value)) == (error.code, str(error))
        return
    assert event_data_json(data) == expected


def test_event_data_with_lone_surrogates_is_encoded_canonically() -> None:
    data = {"owner": "a\ud800b", "pair": "\ud83d\ude00", "big": 2**53 - 1}
    assert event_data_json(data) == canonical_json(data, "event.data")


def test_a_connection_schema_translate_map_is_followed_by_every_statement(tmp_path: Path) -> None:
    """A store in SQLite's ``main`` on a connection whose ``schema_translate_map`` sends the
    scheduler's tables to an attached database: every statement of an operation goes there (the
    fast path, whose plans name no schema, steps aside), none to ``main``."""
    main, aux = tmp_path / "main.sqlite", tmp_path / "aux.sqlite"
    for path in (main, aux):
        with open_store(path, clock=lambda: T0) as seeded:
            seeded.create_job(id="j0", kind="k", authority=AUTHORITY)
    engine = create_engine(f"sqlite:///{main}")
    event.listen(engine, "connect", lambda dbapi, _record: dbapi.execute(f"ATTACH DATABASE '{aux}' AS aux"))
    try:
        with engine.connect() as conn:
            routed = conn.execution_options(schema_translate_map={None: "aux"})
            store = SchedulerStore.on_connection(routed, clock=lambda: T0)
            assert store.update_job("j0", 1, kind="k2").revision == 2
            rows = {
                db: (
                    conn.exec_driver_sql(f"SELECT kind, revision FROM {db}.jobs").all(),
                    [row[0] for row in conn.exec_driver_sql(f"SELECT event_type FROM {db}.events")],
                )
                for db in ("main", "aux")
            }
            conn.commit()
    finally:
        engine.dispose()
    assert rows["aux"] == ([("k2", 2)], ["job_created", "job_updated"])
    assert rows["main"] == ([("k", 1)], ["job_created"])
