"""The transactional outbox in an application's own transactions: hygiene and load.

* A read through ``SchedulerStore.on_connection`` leaves no transaction it did not find, so
  other processes' writes never meet a lock it forgot.
* ``scheduler.sqlite_engine`` + ``mark_writer``: a writer takes the write lock at BEGIN (waiting
  ``busy_timeout``), readers stay deferred.
* Load: 8 request threads enqueue inside their own ORM transactions (every tenth rolls back)
  while 2 worker processes claim and settle: 1,200 requests, zero failures, every committed
  order has exactly one occurrence and every rolled-back one none. On SQLite (the scheduler in
  an attached database) and on PostgreSQL (the shop in ``public``, the scheduler in a schema).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from outbox_support import (
    AUTHORITY,
    JOB_ID,
    Base,
    Order,
    Request,
    committed_orders,
    occurrences_by_order,
    run_outbox_load,
    start_workers,
    stop_workers,
)
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from scheduler import SchedulerKernelError, SchedulerStore, mark_writer, open_store, sqlite_engine

THREADS = 8
REQUESTS = 1_200


def other_process_can_write(path: Path) -> bool:
    """An independent connection takes the write lock without waiting (busy_timeout 0)."""
    con = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    path = tmp_path / "kernel.sqlite"
    with open_store(path) as store:
        store.create_job(id=JOB_ID, kind="email", authority=AUTHORITY)
    return path


def begin_recipe_engine(path: Path) -> Engine:
    """SQLAlchemy's documented pysqlite recipe: the driver's own transaction handling off, BEGIN
    emitted from the engine's "begin" event."""
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA foreign_keys = ON")

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine


ENGINES: dict[str, Callable[[Path], Engine]] = {
    "plain": lambda path: create_engine(f"sqlite:///{path}"),
    "sqlite_engine": sqlite_engine,
    "begin_recipe": begin_recipe_engine,
}


@pytest.mark.parametrize("engine_kind", sorted(ENGINES))
def test_a_read_on_a_fresh_connection_leaves_no_transaction(kernel: Path, engine_kind: str) -> None:
    engine = ENGINES[engine_kind](kernel)
    try:
        with engine.connect() as connection:
            store = SchedulerStore.on_connection(connection)
            assert store.get_job(JOB_ID) is not None
            assert store.history(job_id=JOB_ID) != []
            assert not connection.in_transaction()
            assert not connection.connection.dbapi_connection.in_transaction  # type: ignore[union-attr]
            assert other_process_can_write(kernel)
    finally:
        engine.dispose()


@pytest.mark.parametrize("engine_kind", sorted(ENGINES))
def test_a_write_on_a_fresh_connection_is_the_callers_to_commit(kernel: Path, engine_kind: str) -> None:
    """A write autobegins the caller's transaction (as any SQLAlchemy statement would), whatever
    the engine's BEGIN handling; it is durable once the caller commits, gone if it rolls back."""
    engine = ENGINES[engine_kind](kernel)
    try:
        for commit in (False, True):
            with engine.connect() as connection:
                store = SchedulerStore.on_connection(connection)
                store.enqueue_occurrence(job_id=JOB_ID, scheduled_for=1, trigger_key=f"w-{commit}")
                assert connection.in_transaction()
                connection.commit() if commit else connection.rollback()
        with sqlite3.connect(kernel) as check:
            keys = [row[0] for row in check.execute("SELECT trigger_key FROM occurrences ORDER BY 1")]
        assert keys == ["w-True"]
    finally:
        engine.dispose()


def test_a_read_inside_a_begun_transaction_keeps_the_callers_transaction(kernel: Path) -> None:
    engine = sqlite_engine(kernel)
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            store = SchedulerStore.on_connection(connection)
            assert store.get_job(JOB_ID) is not None  # no statement of the caller's yet
            assert connection.in_transaction()
            assert other_process_can_write(kernel)  # the read's snapshot is over
            store.enqueue_occurrence(job_id=JOB_ID, scheduled_for=0, trigger_key="after-read")
            assert not other_process_can_write(kernel)  # the write joined the caller's transaction
            transaction.rollback()
        with open_store(kernel) as check:
            assert check.list_occurrences_by_trigger(job_id=JOB_ID, trigger_key="after-read") == []
    finally:
        engine.dispose()


def test_mark_writer_takes_the_write_lock_up_front_and_readers_stay_deferred(kernel: Path) -> None:
    engine = sqlite_engine(kernel, busy_timeout_ms=0)
    try:
        with engine.begin() as reader:
            reader.execute(text("SELECT count(*) FROM jobs")).scalar_one()
            assert other_process_can_write(kernel)  # deferred: a shared read lock only
        with engine.begin() as writer:
            mark_writer(writer)
            writer.execute(text("SELECT count(*) FROM jobs")).scalar_one()
            assert not other_process_can_write(kernel)
        assert other_process_can_write(kernel)
        with Session(engine) as session, session.begin():
            mark_writer(session)
            session.execute(text("SELECT 1"))
            assert not other_process_can_write(kernel)
        writers = engine.execution_options(scheduler_writer=True)
        with writers.begin() as connection:
            connection.execute(text("SELECT 1"))
            assert not other_process_can_write(kernel)
        with engine.begin() as late, pytest.raises(SchedulerKernelError) as caught:
            late.execute(text("SELECT 1"))
            mark_writer(late)
        assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
    finally:
        engine.dispose()


def test_sqlite_engine_refuses_bad_arguments(tmp_path: Path) -> None:
    for arguments in (
        {"path": ":memory:"},
        {"path": tmp_path / "a.sqlite", "busy_timeout_ms": -1},
        {"path": tmp_path / "a.sqlite", "journal_mode": "bogus"},
        {"path": tmp_path / "a.sqlite", "attach": {"main": tmp_path / "b.sqlite"}},
    ):
        with pytest.raises(SchedulerKernelError) as caught:
            sqlite_engine(**arguments)  # type: ignore[arg-type]
        assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"


def check_outbox_under_load(
    request: Request, kernel: dict[str, Any], app_engine: Engine, stop: Path
) -> None:
    """Run the load (``THREADS`` request threads, 2 worker processes on ``kernel``, the arguments
    of ``open_store``) and check every request's outcome in both the shop and the scheduler."""
    workers = start_workers(2, kernel, stop)
    started = time.monotonic()
    try:
        result = run_outbox_load(request, threads=THREADS, requests=REQUESTS)
    finally:
        elapsed = time.monotonic() - started
        reports = stop_workers(workers, stop)
    print(f"outbox load: {REQUESTS} requests in {elapsed:.1f} s ({REQUESTS / elapsed:.0f}/s)")
    assert result.failures == []
    assert len(result.committed) + len(result.rolled_back) == REQUESTS
    with Session(app_engine) as session:
        assert committed_orders(session) == result.committed
    arguments = dict(kernel)
    with open_store(arguments.pop("target"), **arguments) as store:
        counts = occurrences_by_order(store, result.committed | result.rolled_back)
    assert {order for order, n in counts.items() if n == 1} == result.committed
    assert {order for order, n in counts.items() if n == 0} == result.rolled_back
    assert [report["failures"] for report in reports] == [[], []]
    assert sum(report["settled"] for report in reports) == len(result.committed)
    assert Order.__tablename__ == "orders"


def test_outbox_under_load_attached_sqlite(tmp_path: Path, kernel: Path) -> None:
    app = tmp_path / "app.sqlite"
    engine = sqlite_engine(app, attach={"kernel": kernel}, busy_timeout_ms=60_000)
    Base.metadata.create_all(engine)

    @contextmanager
    def request() -> Iterator[tuple[Session, SchedulerStore]]:
        with Session(engine) as session, session.begin():
            mark_writer(session)
            yield session, SchedulerStore.on_connection(session.connection())

    try:
        check_outbox_under_load(request, {"target": str(kernel)}, engine, tmp_path / "stop")
    finally:
        engine.dispose()


def test_outbox_under_load_postgresql(tmp_path: Path, pg_database: URL) -> None:
    """The shop's tables in ``public``, the scheduler in its own schema of the same database."""
    url = pg_database.render_as_string(hide_password=False)
    kernel = {"target": url, "schema": "kernel"}
    with open_store(url, schema="kernel") as store:
        store.create_job(id=JOB_ID, kind="email", authority=AUTHORITY)
    engine = create_engine(pg_database, pool_size=THREADS)
    Base.metadata.create_all(engine)

    @contextmanager
    def request() -> Iterator[tuple[Session, SchedulerStore]]:
        with Session(engine) as session, session.begin():
            yield session, SchedulerStore.on_connection(session.connection(), schema="kernel")

    try:
        check_outbox_under_load(request, kernel, engine, tmp_path / "stop")
    finally:
        engine.dispose()
