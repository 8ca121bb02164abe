"""Write transactions: one transaction per write (BEGIN IMMEDIATE on SQLite), store.transaction(),
and the caller-owned transaction of SchedulerStore.on_connection (transactional outbox), on both
backends (``place``). On PostgreSQL the application's table lives in a schema of its own.

API §5 Transactions and embedding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from backends import SQLITE, unique_name
from lifecycle_support import AUTHORITY, T0, Env, env_at, expect_error
from sqlalchemy import Connection, Engine, create_engine, event, text
from store_places import PostgresSchemaPlace, StorePlace, in_transaction

from scheduler import SchedulerStore


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as environment:
        environment.job("agenda-a")
        yield environment


def statements_of(connection: Connection, call: Any) -> list[str]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()).upper())

    event.listen(connection, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(connection, "before_cursor_execute", record)
    return seen


def test_every_lifecycle_write_is_one_transaction(env: Env) -> None:
    """One COMMIT per write; on SQLite one BEGIN IMMEDIATE and no savepoint, and reads a plain BEGIN."""
    store = env.store
    connection = store.connection
    commits: list[int] = []
    event.listen(connection, "commit", lambda conn: commits.append(1))
    occurrence = env.enqueue(trigger_key="w")
    calls = [
        lambda: store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="x"),
        lambda: store.enqueue_occurrence_once_per_trigger(
            job_id="agenda-a", scheduled_for=T0, trigger_key="y"
        ),
        lambda: store.enqueue_many([{"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "z"}]),
        lambda: store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=60_000),
        lambda: store.renew(occurrence_id=occurrence.id, owner_id="w", fence=1, lease_ms=60_000),
        lambda: store.settle(occurrence_id=occurrence.id, owner_id="w", fence=1, outcome="failed"),
        lambda: store.claim_next(owner_id="w", lease_ms=60_000),
        lambda: store.claim_batch(owner_id="w", lease_ms=60_000, limit=5),
    ]
    on_sqlite = env.place.backend == SQLITE
    for call in calls:
        commits.clear()
        seen = statements_of(connection, call)
        if on_sqlite:  # PostgreSQL's BEGIN is the driver's, not a statement
            assert seen[0] == "BEGIN IMMEDIATE"
            assert seen.count("BEGIN IMMEDIATE") == 1
        # PostgreSQL claims lock candidates in savepoints rolled back when a row was taken
        # (docs/design/postgresql-concurrency.md, "Claims among concurrent workers"): still one transaction
        inner = ("BEGIN", "COMMIT", "SAVEPOINT") if on_sqlite else ("BEGIN", "COMMIT")
        assert not any(s.startswith(inner) for s in seen[1:])
        assert commits == [1]
    if not on_sqlite:
        return
    for read in (
        lambda: store.history(),
        lambda: store.list_dead_letters(),
        lambda: store.get_occurrence(occurrence.id),
        lambda: store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="x"),
    ):
        seen = statements_of(connection, read)
        assert seen[0] == "BEGIN" and "BEGIN IMMEDIATE" not in seen


def test_a_failed_write_leaves_nothing_behind(env: Env) -> None:
    occurrence = env.running()
    env.adjudication(occurrence, "adj-1")
    before = env.dump()
    # the mismatch is detected after the claim bookkeeping was read: nothing may survive
    expect_error(
        "SCHEDULER_ADJUDICATION_SETTLEMENT_CONFLICT",
        lambda: env.store.settle(
            occurrence_id=occurrence.id,
            owner_id="w1",
            fence=1,
            outcome="succeeded",
            adjudication_request_id="x",
        ),
    )
    assert env.dump() == before
    assert not in_transaction(env.store.connection)


def test_store_transaction_commits_together(env: Env) -> None:
    env.tick()
    with env.store.transaction() as tx:
        first = tx.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="a")
        claimed = tx.claim_next(owner_id="w", lease_ms=60_000)
        assert claimed is not None and claimed.id == first.id
        assert env.sql("SELECT count(*) FROM occurrences") == [(0,)]  # not visible outside yet
    assert env.store.get_occurrence(first.id).status == "running"  # type: ignore[union-attr]
    assert env.sql("SELECT count(*) FROM occurrences") == [(1,)]


def test_store_transaction_rolls_back_together(env: Env) -> None:
    before = env.dump()
    with pytest.raises(RuntimeError), env.store.transaction() as tx:
        tx.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="a")
        tx.claim_next(owner_id="w", lease_ms=60_000)
        raise RuntimeError("application failure")
    assert env.dump() == before
    # the store is usable afterwards
    assert env.enqueue(trigger_key="after").deduplicated is False


def test_failed_call_inside_store_transaction_keeps_earlier_calls(env: Env) -> None:
    with env.store.transaction() as tx:
        kept = tx.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="kept")
        expect_error(
            "SCHEDULER_NOT_FOUND",
            lambda: tx.enqueue_occurrence(job_id="nope", scheduled_for=T0, trigger_key="x"),
        )
    assert env.store.get_occurrence(kept.id) is not None
    assert len(env.rows("occurrences")) == 1


@dataclass(frozen=True)
class Outbox:
    """The scheduler's tables in ``place`` and the application's ``orders`` table next to them
    (SQLite: the same file; PostgreSQL: the same database, another schema), and an engine on
    that database for the application's own transactions."""

    place: StorePlace
    engine: Engine
    orders: str

    def count(self, table: str) -> int:
        """Rows of a scheduler table, read on a second connection."""
        return int(self.place.sql(f"SELECT count(*) FROM {table}")[0][0])

    def orders_count(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(text(f"SELECT count(*) FROM {self.orders}")).scalar_one())

    def store_on(self, connection: Connection) -> SchedulerStore:
        schema = self.place.schema if isinstance(self.place, PostgresSchemaPlace) else "main"
        return SchedulerStore.on_connection(connection, schema=schema, clock=lambda: T0 + 5)


@pytest.fixture
def outbox(place: StorePlace) -> Iterator[Outbox]:
    with place.open(clock=lambda: T0) as opened:
        opened.create_job(id="agenda-a", kind="agenda", authority=AUTHORITY)
    if isinstance(place, PostgresSchemaPlace):
        app = unique_name("t_app")
        engine, orders = place.server.engine, f'"{app}".app_orders'
        with engine.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{app}"'))
            connection.execute(text(f"CREATE TABLE {orders} (id SERIAL PRIMARY KEY, note TEXT NOT NULL)"))
        yield Outbox(place, engine, orders)
        place.server.drop_schema(app)
        return
    engine = create_engine(f"sqlite:///{place.path}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE app_orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)"))
    try:
        yield Outbox(place, engine, "app_orders")
    finally:
        engine.dispose()


def test_on_connection_commits_with_the_callers_transaction(outbox: Outbox) -> None:
    with outbox.engine.begin() as connection:
        connection.execute(text(f"INSERT INTO {outbox.orders} (note) VALUES ('paid')"))
        store = outbox.store_on(connection)
        occurrence = store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="order-1")
        claimed = store.claim_next(owner_id="w", lease_ms=1000)
        assert claimed is not None and claimed.id == occurrence.id
        assert outbox.count("occurrences") == 0  # the store did not commit the caller's transaction
        assert connection.in_transaction()
    assert outbox.orders_count() == 1
    assert outbox.count("occurrences") == 1
    assert outbox.count("events") == 3  # job_created, occurrence_enqueued, occurrence_claimed


def test_on_connection_rolls_back_with_the_callers_transaction(outbox: Outbox) -> None:
    with pytest.raises(RuntimeError), outbox.engine.begin() as connection:
        connection.execute(text(f"INSERT INTO {outbox.orders} (note) VALUES ('paid')"))
        store = outbox.store_on(connection)
        store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="order-1")
        raise RuntimeError("the application changed its mind")
    assert outbox.orders_count() == 0
    assert outbox.count("occurrences") == 0
    assert outbox.count("events") == 1


def test_on_connection_failed_call_leaves_the_callers_work_intact(outbox: Outbox) -> None:
    with outbox.engine.begin() as connection:
        connection.execute(text(f"INSERT INTO {outbox.orders} (note) VALUES ('paid')"))
        store = outbox.store_on(connection)
        store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="order-1", payload={"v": 1})
        expect_error(
            "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH",
            lambda: store.enqueue_many(
                [
                    {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "order-2"},
                    {
                        "job_id": "agenda-a",
                        "scheduled_for": T0,
                        "trigger_key": "order-1",
                        "payload": {"v": 2},
                    },
                ]
            ),
        )
        connection.execute(text(f"INSERT INTO {outbox.orders} (note) VALUES ('second')"))
    assert outbox.orders_count() == 2
    assert outbox.count("occurrences") == 1  # order-2 was rolled back with its batch
