"""A single worker on PostgreSQL claims exactly what the SQLite store claims.

The randomized states of ``test_claim_equivalence`` (disabled jobs, kinds, workspaces, runtime
controls, requeue requests, pending adjudications, exhausted attempts, ties on every sort key)
are built in a SQLite file, copied row for row into a PostgreSQL schema, and the same call runs
on both stores (the SQLite store itself is checked against the seed there). The results and
every table afterwards must be equal; this covers the PostgreSQL claim path's locking, fresh
re-read and read-again steps, which run on every claim there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
from backends import PostgresServer, unique_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError
from test_claim_equivalence import (
    FILTERS,
    LEASE,
    NOW,
    OWNER,
    SMALL_BOUNDS,
    build_state,
    ids,
    raw,
    states_strategy,
)
from test_postgresql_claims import as_among_workers

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.schema import tables as t
from scheduler.store.capabilities import claim_query

COPIED = (
    t.jobs,
    t.occurrences,
    t.occurrence_controls,
    t.occurrence_retries,
    t.adjudications,
    t.authority_reservations,
)
COMPARED = (*COPIED, t.events)  # parents first
PG_EQUIVALENCE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Pair:
    """A SQLite store and a PostgreSQL store that start every example from the same rows."""

    def __init__(
        self,
        sqlite_store: SchedulerStore,
        db: sqlite3.Connection,
        pg: SchedulerStore,
        server: PostgresServer,
        schema: str,
    ) -> None:
        self.sqlite_store, self.db, self.pg, self.server, self.schema = sqlite_store, db, pg, server, schema
        self.options = {"schema_translate_map": {None: schema}}

    def build(self, state: Any) -> list[str]:
        made = build_state(self.db, *state)
        self.db.row_factory = sqlite3.Row
        with self.server.engine.begin() as connection:
            for table in reversed(COMPARED):  # children first
                connection.execute(delete(table), execution_options=self.options)
            for table in COPIED:
                rows = [dict(row) for row in self.db.execute(f"SELECT * FROM {table.name}")]
                if rows:
                    connection.execute(insert(table), rows, execution_options=self.options)
        return made

    def sqlite_tables(self) -> dict[str, list[dict[str, Any]]]:
        return renumbered(
            {
                table.name: [
                    dict(row)
                    for row in self.db.execute(
                        f"SELECT * FROM {table.name} ORDER BY {', '.join(c.name for c in table.primary_key)}"
                    )
                ]
                for table in COMPARED
            }
        )

    def pg_tables(self) -> dict[str, list[dict[str, Any]]]:
        with self.server.engine.connect() as connection:
            return renumbered(
                {
                    table.name: [
                        dict(row)
                        for row in connection.execute(
                            select(table).order_by(*table.primary_key), execution_options=self.options
                        ).mappings()
                    ]
                    for table in COMPARED
                }
            )

    def both(self, call: Any) -> None:
        """``call(store)`` on each store; the outcomes and the tables afterwards must be equal."""
        expected = outcome(lambda: call(self.sqlite_store)), self.sqlite_tables()
        actual = outcome(lambda: call(self.pg)), self.pg_tables()
        assert actual == expected


def renumbered(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Event ids renumbered densely in order (PostgreSQL's may have gaps, API §8)."""
    events = [{**row, "event_id": index} for index, row in enumerate(tables["events"], 1)]
    return {**tables, "events": events}


def outcome(run: Any) -> Any:
    try:
        return ids(run())
    except SchedulerKernelError as error:
        return ("error", error.code)
    except IntegrityError:  # a seed state the store refuses to write (both backends must agree)
        return ("error", "constraint")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer) -> Iterator[Pair]:
    yield from paired_stores(tmp_path_factory, postgres_server)


def paired_stores(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer
) -> Iterator[Pair]:
    """A :class:`Pair` on a fresh SQLite file and a fresh schema, closed and dropped after."""
    path = tmp_path_factory.mktemp("pg_equivalence") / "claims.sqlite"
    schema = unique_name("t_claims_eq")
    sqlite_store = open_store(path, clock=lambda: NOW)
    pg = open_store(postgres_server.engine, schema=schema, clock=lambda: NOW)
    db = raw(path)
    try:
        yield Pair(sqlite_store, db, pg, postgres_server, schema)
    finally:
        db.close()
        sqlite_store.close()
        pg.close()
        postgres_server.drop_schema(schema)


@PG_EQUIVALENCE
@given(state=states_strategy, filters=FILTERS)
def test_claim_next_on_postgresql_matches_sqlite(
    pair: Pair, state: Any, filters: tuple[Any, str | None]
) -> None:
    pair.build(state)
    job_kind, workspace_id = filters
    pair.both(
        lambda store: store.claim_next(
            owner_id=OWNER, lease_ms=LEASE, job_kind=job_kind, workspace_id=workspace_id
        )
    )


@PG_EQUIVALENCE
@given(state=states_strategy, filters=FILTERS)
def test_claim_next_among_workers_on_postgresql_matches_sqlite(
    pair: Pair, state: Any, filters: tuple[Any, str | None]
) -> None:
    """The window of heads (the first ``HEAD_WINDOW`` due rows of each status, claimed from up
    to the first row it cannot decide on) chooses what the full statement would."""
    pair.build(state)
    job_kind, workspace_id = filters
    with among_workers(pair.pg):
        pair.both(
            lambda store: store.claim_next(
                owner_id=OWNER, lease_ms=LEASE, job_kind=job_kind, workspace_id=workspace_id
            )
        )


@PG_EQUIVALENCE
@given(state=states_strategy, filters=FILTERS, succeeded=st.booleans())
def test_settle_and_claim_among_workers_on_postgresql_matches_sqlite(
    pair: Pair, state: Any, filters: tuple[Any, str | None], succeeded: bool
) -> None:
    """The cycle's first statement with the window of heads: the settlement and the next claim
    equal SQLite's."""
    pair.build(state)
    job_kind, workspace_id = filters
    pair.both(lambda store: store.claim_next(owner_id=OWNER, lease_ms=LEASE))
    held = pair.db.execute(
        "SELECT occurrence_id, fence FROM occurrences WHERE status = 'running' AND lease_owner = ?"
        " ORDER BY occurrence_id LIMIT 1",
        (OWNER,),
    ).fetchone()
    if held is None:
        return
    with among_workers(pair.pg):
        pair.both(
            lambda store: store.settle_and_claim(
                occurrence_id=held[0],
                owner_id=OWNER,
                fence=held[1],
                outcome="succeeded" if succeeded else "failed",
                lease_ms=LEASE,
                job_kind=job_kind,
                workspace_id=workspace_id,
            )
        )


@contextmanager
def among_workers(store: SchedulerStore) -> Iterator[None]:
    """``store``'s single claims on the path among workers for the block, then quiet again."""
    quiet = store._claims.quiet
    as_among_workers(store)
    try:
        yield
    finally:
        store._claims.quiet = quiet


@PG_EQUIVALENCE
@given(state=states_strategy, filters=FILTERS, limit=st.integers(1, 6), bounds=SMALL_BOUNDS)
def test_claim_batch_on_postgresql_matches_sqlite(
    pair: Pair, state: Any, filters: tuple[Any, str | None], limit: int, bounds: tuple[int, int]
) -> None:
    """Small windows and budgets too, so every read path (and PostgreSQL's read again) runs."""
    pair.build(state)
    job_kind, workspace_id = filters
    window, budget = bounds
    with patch.object(claim_query, "WINDOW", window), patch.object(claim_query, "JOB_PROBE_BUDGET", budget):
        pair.both(
            lambda store: store.claim_batch(
                owner_id=OWNER, lease_ms=LEASE, limit=limit, job_kind=job_kind, workspace_id=workspace_id
            )
        )


@PG_EQUIVALENCE
@given(state=states_strategy, pick=st.integers(0, 20))
def test_claim_occurrence_on_postgresql_matches_sqlite(pair: Pair, state: Any, pick: int) -> None:
    made = pair.build(state)
    target = made[pick % len(made)] if made and pick < 18 else "occ_missing"
    pair.both(lambda store: store.claim_occurrence(occurrence_id=target, owner_id=OWNER, lease_ms=LEASE))
