"""``open_store`` on the real PostgreSQL server (API §8): targets, schema, create/verify, clock.

A PostgreSQL store is opened from a ``postgresql://`` or ``postgresql+psycopg://`` URL or a
psycopg Engine; another driver is refused. Opening an empty schema creates v6 in one
transaction, every open verifies the catalog, and two processes opening an empty database at
once both succeed. ``clock=None`` is the server's ``clock_timestamp()``; an injected clock wins.
``busy_timeout_ms`` is the store connection's ``lock_timeout``; the connection also plans without bitmap
scans or JIT (``opening_postgresql.PLANNER_SQL``); all are reset when the store closes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from backends import PostgresServer, unique_name
from psycopg import _queries as psycopg_queries
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.pool import QueuePool

from scheduler import SchedulerKernelError, open_store
from scheduler.backends.postgresql import backend as postgresql
from scheduler.schema import SCHEMA_V6_PG_FINGERPRINT, schema_fingerprint
from scheduler.schema.target import quote_identifier
from scheduler.testing import dump_tables

REPO = Path(__file__).resolve().parents[3]
T0 = 1767225600000
AUTHORITY = {"principal": {"type": "user", "id": "u"}, "workspaceId": "ws", "requestedCapabilities": ["a"]}


def url_text(url: URL, drivername: str = "postgresql+psycopg") -> str:
    return url.set(drivername=drivername).render_as_string(hide_password=False)


def server_ms(engine: Engine) -> int:
    with engine.connect() as connection:
        now = connection.exec_driver_sql("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)")
        return int(now.scalar_one())


@pytest.mark.parametrize("drivername", ["postgresql", "postgresql+psycopg"])
def test_urls_open_a_store_in_the_default_schema(pg_database: URL, drivername: str) -> None:
    with open_store(url_text(pg_database, drivername), clock=lambda: T0) as store:
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        assert store.schema_info().schema_version == 6
        assert store.schema_info().migration.applied_at == T0  # type: ignore[union-attr]
    engine = create_engine(pg_database)
    try:
        with engine.connect() as connection:
            assert schema_fingerprint(connection, schema="scheduler") == SCHEMA_V6_PG_FINGERPRINT
            rows = connection.exec_driver_sql("SELECT job_id FROM scheduler.jobs").all()
            assert [tuple(row) for row in rows] == [("job-1",)]
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "query", ["connect_timeout=abc", "no_such_option=1"], ids=["bad-value", "unknown-option"]
)
def test_connection_parameters_the_driver_refuses_are_invalid_arguments(
    pg_engine: Engine, pg_schema: str, query: str
) -> None:
    """psycopg refuses them before it contacts the server (``ProgrammingError``, no SQLSTATE):
    an argument error, not a storage failure or a corrupt catalog; nothing is created."""
    bad = f"{url_text(pg_engine.url)}?{query}"
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(bad, schema=pg_schema)
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT", caught.value
    with pg_engine.connect() as connection:
        found = connection.exec_driver_sql(
            "SELECT 1 FROM pg_namespace WHERE nspname = %(n)s", {"n": pg_schema}
        )
        assert found.first() is None


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg://postgres@127.0.0.1:abc/db", "postgresql+psycopg://::::", "postgresql://u@[::1/x"],
)
def test_a_malformed_url_is_an_invalid_argument(url: str) -> None:
    """SQLAlchemy's URL parser raises a bare ``ValueError`` for a port that is no number."""
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(url)
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"


def test_an_engine_and_any_schema_name(pg_engine: Engine, pg_schema: str) -> None:
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0) as store:
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0 + 1) as store:  # verified, reused
        assert [row["job_id"] for row in dump_tables(store)["jobs"]] == ["job-1"]


def test_schema_names_with_percent_signs_and_placeholders(postgres_server: PostgresServer) -> None:
    """psycopg reads ``%`` in raw SQL as a placeholder: ``CREATE SCHEMA "%s"`` once created
    ``"$1"`` and the open failed SCHEMA_CORRUPT. Every name is created exactly, then reused."""
    names = [unique_name(prefix) for prefix in ("%s", "%(x)s", "50%", "$1", ":x", 'q"q')]
    try:
        for name in names:
            with open_store(postgres_server.engine, schema=name, clock=lambda: T0) as store:
                store.create_job(id="job-1", kind="email", authority=AUTHORITY)
            with open_store(postgres_server.engine, schema=name, clock=lambda: T0 + 1) as store:
                assert [row["job_id"] for row in dump_tables(store)["jobs"]] == ["job-1"]
            with postgres_server.engine.connect() as connection:
                assert schema_fingerprint(connection, schema=name) == SCHEMA_V6_PG_FINGERPRINT
        with postgres_server.engine.connect() as connection:
            rows = connection.exec_driver_sql("SELECT nspname FROM pg_namespace").scalars().all()
        assert set(names) <= set(rows)  # each created under its own name
    finally:
        for name in names:
            postgres_server.drop_schema(name)


@pytest.mark.parametrize(
    "target",
    [
        "postgresql+psycopg2://u@h/db",
        "postgresql+asyncpg://u@h/db",
        "postgresql+pg8000://u@h/db",
        "mysql://u@h/db",
    ],
)
def test_other_drivers_and_databases_are_refused(target: str) -> None:
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(target)
    assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"


def test_an_engine_with_another_postgresql_driver_is_refused(pg_engine: Engine) -> None:
    other = create_engine(url_text(pg_engine.url, "postgresql+pg8000"), module=psycopg)  # never connected
    asynchronous = create_engine(url_text(pg_engine.url, "postgresql+psycopg_async"))
    for engine in (other, asynchronous):
        with pytest.raises(SchedulerKernelError) as caught:
            open_store(engine)
        assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
        assert "psycopg 3" in caught.value.message
        engine.dispose()


def test_every_open_verifies_the_catalog(pg_engine: Engine, pg_schema: str) -> None:
    open_store(pg_engine, schema=pg_schema, clock=lambda: T0).close()
    with pg_engine.begin() as connection:
        connection.exec_driver_sql(f"ALTER TABLE {quote_identifier(pg_schema)}.jobs ADD COLUMN note text")
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(pg_engine, schema=pg_schema, clock=lambda: T0)
    assert caught.value.code == "SCHEDULER_SCHEMA_CORRUPT"


def test_psycopg_keeps_the_parsed_form_of_every_hot_statement(private_engine: Engine, pg_schema: str) -> None:
    """The claim statement (~10 KB) is longer than psycopg's default 4 KB parsed-query cache
    limit; opening a store raises the limit so that every statement of a claim + settle cycle
    is parsed once, even under a 63-byte schema name."""
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = private_engine  # listened to below: not the shared one
    with open_store(engine, schema=pg_schema, clock=lambda: T0) as store:
        assert psycopg_queries.MAX_CACHED_STATEMENT_LENGTH == postgresql.CACHED_STATEMENT_LENGTH
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        store.enqueue_many(
            [{"job_id": "job-1", "scheduled_for": T0 - i, "trigger_key": f"k{i}"} for i in (1, 2)]
        )
        event.listen(engine, "before_cursor_execute", seen)
        try:
            held = store.claim_next(owner_id="w", lease_ms=60_000)
            assert held is not None
            store.settle_and_claim(
                occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
            )
        finally:
            event.remove(engine, "before_cursor_execute", seen)
    longest = max(len(text) + text.count(pg_schema) * (63 - len(pg_schema)) for text in statements)
    assert 4096 < longest <= postgresql.CACHED_STATEMENT_LENGTH


def test_clock_none_is_the_server_clock_and_an_injected_clock_wins(pg_engine: Engine, pg_schema: str) -> None:
    before = server_ms(pg_engine)
    with open_store(pg_engine, schema=pg_schema) as store:
        job = store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        after = server_ms(pg_engine)
        assert before <= job.created_at <= after
        assert before <= store.schema_info().migration.applied_at <= after  # type: ignore[union-attr]
        assert job.created_at <= store.clock() <= server_ms(pg_engine)
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0) as store:
        assert store.create_job(id="job-2", kind="email", authority=AUTHORITY).created_at == T0
        assert store.clock() == T0


def stamp_after_a_held_row(
    engine: Engine, lock_sql: str, call: Callable[[], int | None]
) -> tuple[int | None, int]:
    """Run ``call`` (in a thread) while another transaction holds a row (``lock_sql``) for 0.5 s;
    returns what ``call`` returned (a time it stamped) and the server time the row was released."""
    holder = engine.connect()
    holder.exec_driver_sql(lock_sql)
    stamped: list[int | None] = []
    worker = threading.Thread(target=lambda: stamped.append(call()))
    started = server_ms(engine)
    worker.start()
    time.sleep(0.5)
    released = server_ms(engine)
    holder.close()
    worker.join(30)
    assert released - started >= 400 and stamped
    return stamped[0], released


def test_the_server_clock_is_read_after_the_rows_are_locked(pg_engine: Engine, pg_schema: str) -> None:
    """update_job waits for the job row another transaction holds; its time is read after."""
    with open_store(pg_engine, schema=pg_schema) as store:
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        updated_at, released = stamp_after_a_held_row(
            pg_engine,
            f"SELECT 1 FROM {quote_identifier(pg_schema)}.jobs WHERE job_id = 'job-1' FOR UPDATE",
            lambda: store.update_job("job-1", 1, payload=1).updated_at,
        )
        assert updated_at is not None and updated_at >= released


@pytest.mark.parametrize("call", ["settle", "settle_and_claim"])
def test_a_settlement_reads_the_server_clock_after_the_settled_row_is_locked(
    pg_engine: Engine, pg_schema: str, call: str
) -> None:
    """The settlement waits for the occurrence row another transaction holds; its time (the
    settlement's ``settled_at`` and event) is read after the wait, not when the call began."""
    with open_store(pg_engine, schema=pg_schema) as store:
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        queued = store.enqueue_occurrence(job_id="job-1", scheduled_for=0, trigger_key="k")
        held = store.claim_next(owner_id="w", lease_ms=60_000)
        assert held is not None and held.id == queued.id
        settle = {"occurrence_id": held.id, "owner_id": "w", "fence": held.fence, "outcome": "succeeded"}

        def run() -> int | None:
            if call == "settle":
                return store.settle(**settle).settled_at
            return store.settle_and_claim(**settle, lease_ms=60_000).settled.settled_at

        settled_at, released = stamp_after_a_held_row(
            pg_engine,
            f"SELECT 1 FROM {quote_identifier(pg_schema)}.occurrences "
            f"WHERE occurrence_id = '{held.id}' FOR UPDATE",
            run,
        )
        assert settled_at is not None and settled_at >= released


def test_busy_timeout_and_planner_setting_of_the_store_connection(pg_engine: Engine, pg_schema: str) -> None:
    engine = create_engine(pg_engine.url, poolclass=QueuePool, pool_size=1, max_overflow=0)
    try:
        store = open_store(engine, schema=pg_schema, busy_timeout_ms=1234, clock=lambda: T0)
        assert store.connection.exec_driver_sql("SHOW lock_timeout").scalar_one() == "1234ms"
        assert store.connection.exec_driver_sql("SHOW enable_bitmapscan").scalar_one() == "off"
        assert store.connection.exec_driver_sql("SHOW jit").scalar_one() == "off"
        store.connection.rollback()
        store.close()
        with engine.connect() as connection:  # the same pooled connection, as it came
            assert connection.exec_driver_sql("SHOW lock_timeout").scalar_one() == "0"
            assert connection.exec_driver_sql("SHOW enable_bitmapscan").scalar_one() == "on"
            assert connection.exec_driver_sql("SHOW jit").scalar_one() == "on"
        with open_store(engine, schema=pg_schema, busy_timeout_ms=0, clock=lambda: T0) as store:
            assert store.connection.exec_driver_sql("SHOW lock_timeout").scalar_one() == "1ms"
            store.connection.rollback()
    finally:
        engine.dispose()


def test_a_connection_whose_settings_could_not_be_reset_is_not_pooled_again(
    pg_engine: Engine, pg_schema: str
) -> None:
    """``enable_sort = off`` is the store's own choice; if resetting it fails when the store
    closes, the connection is discarded rather than handed to the application's next checkout
    with the setting still on it."""
    engine = create_engine(pg_engine.url, poolclass=QueuePool, pool_size=1, max_overflow=0)

    def refuse_reset(conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        if statement == "RESET enable_sort":
            raise RuntimeError("reset refused")

    try:
        store = open_store(engine, schema=pg_schema, clock=lambda: T0)
        store_backend = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        assert store.connection.exec_driver_sql("SHOW enable_sort").scalar_one() == "off"
        store.connection.rollback()
        event.listen(engine, "before_cursor_execute", refuse_reset)
        store.close()
        event.remove(engine, "before_cursor_execute", refuse_reset)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SHOW enable_sort").scalar_one() == "on"
            assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != store_backend
    finally:
        engine.dispose()


_OPENER = """
import sys
from scheduler import open_store
with open_store(sys.argv[1], schema=sys.argv[2]) as store:
    print(store.schema_info().schema_version)
"""


def test_two_processes_opening_an_empty_database_both_succeed(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    schema = unique_name("t_open")
    try:
        started = [
            subprocess.Popen(
                [sys.executable, "-c", _OPENER, url_text(url), schema],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        deadline = time.monotonic() + 120
        outputs = [process.communicate(timeout=max(1.0, deadline - time.monotonic())) for process in started]
        assert [process.returncode for process in started] == [0, 0], outputs
        assert [out.strip() for out, _ in outputs] == ["6", "6"]
        with open_store(url_text(url), schema=schema, clock=lambda: T0) as store:
            assert len(dump_tables(store)["migrations"]) == 6
    finally:
        postgres_server.drop_database(url)
