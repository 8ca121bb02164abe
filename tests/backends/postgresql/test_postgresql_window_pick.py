"""A contended ``settle_and_claim`` claims inside its writes statement (``store/window_pick.py``).

Among workers that hold the first candidates, the cycle's first statement reads the window of
heads and its second one settles, locks the first free window row (``SKIP LOCKED``), claims it,
writes both events and commits. Each test runs a scenario twice, in two fresh schemas: once so
and once the way the store claimed before (the first free row locked by a statement of its own,
``claim_tactics._pick_later`` turned off), and the tables and results must be equal; the differential
tests against the full candidate list are in ``test_postgresql_window_claims.py``. A success
among workers is first tried as one statement (``test_postgresql_cycle_window.py``); this path
serves where that statement misses or does not apply, so it is turned off here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from unittest.mock import patch

import pytest
from backends import PostgresServer, unique_name
from claim_seed import as_among_workers
from sqlalchemy import create_engine
from test_fastpath_postgresql import Recorded, recording_cursor
from test_postgresql_claims import LEASE, enqueue, held

from scheduler import SchedulerStore, open_store
from scheduler.backends.postgresql import claim_tactics, cycle_statement, window_pick
from scheduler.store.capabilities import claim_query, claim_writes
from scheduler.store.plumbing import tx
from scheduler.store.plumbing.telemetry import EVENTS_LOGGER
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
NOW = 1_800_000_000_000
Scenario = Callable[["Run"], Any]


class Run:
    """One run of a scenario: the store (on the path among workers), its schema, the due
    occurrences in the order they are claimed (the first one claimed by ``w``), the count of
    statements the store sent so far, and whether claims may be left to the writes statement."""

    def __init__(
        self, store: SchedulerStore, schema: str, made: list[str], seen: Recorded, pick: bool
    ) -> None:
        self.store, self.schema, self.made, self._seen, self.pick = store, schema, made, seen, pick

    def sent(self) -> int:
        return len(self._seen)


@contextmanager
def contended_store(server: PostgresServer, schema: str) -> Iterator[tuple[SchedulerStore, Recorded]]:
    """A store on ``schema`` (injected clock) whose psycopg statements are recorded, its single
    claims kept on the path among workers."""
    seen: Recorded = []
    engine = create_engine(server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=schema, clock=lambda: NOW)
    try:
        as_among_workers(store)
        yield store, seen
    finally:
        store.close()
        engine.dispose()


def cycle(store: SchedulerStore, held_id: str, fence: int) -> Any:
    done = store.settle_and_claim(
        occurrence_id=held_id, owner_id="w", fence=fence, outcome="succeeded", lease_ms=LEASE
    )
    return (
        done.settled.id,
        done.settled.status,
        None if done.claimed is None else (done.claimed.id, done.claimed.fence),
    )


@contextmanager
def one_statement_off() -> Iterator[None]:
    """A ``settle_and_claim`` that succeeds is not tried as one statement (``cycle_statement``):
    it runs the two-statement way, its first statement reading the heads or the window."""
    with patch.object(cycle_statement, "cycle_in_one_statement", lambda *_args: None):
        yield


def both_ways(server: PostgresServer, count: int, scenario: Scenario) -> list[tuple[Any, dict[str, Any]]]:
    """``scenario`` on ``count`` due occurrences, the first claimed by ``w``: with the claim in the
    writes statement, then without; each run's result and tables."""
    runs = []
    for pick in (True, False):
        schema = unique_name("t_pick")
        try:
            with contended_store(server, schema) as (store, seen):
                made = enqueue(store, count)
                first = store.claim_next(owner_id="w", lease_ms=LEASE)
                assert first is not None and first.id == made[0]
                with (
                    one_statement_off(),
                    nullcontext() if pick else patch.object(claim_tactics, "_pick_later", lambda *_a: False),
                ):
                    result = scenario(Run(store, schema, made, seen, pick))
                runs.append((result, densely_numbered(dump_tables(store))))
        finally:
            server.drop_schema(schema)
    return runs


def densely_numbered(tables: dict[str, Any]) -> dict[str, Any]:
    """``tables`` with event ids renumbered 1, 2, … in id order (a call run again leaves a gap
    where its first attempt's event rows were rolled back, API §8)."""
    events = sorted(tables["events"], key=lambda row: row["event_id"])
    return {**tables, "events": [{**row, "event_id": rank} for rank, row in enumerate(events, start=1)]}


@contextmanager
def picks_left_to_the_writes() -> Iterator[list[int]]:
    """The candidate counts of the claims left to the writes statement (``Tx.pick_later``) in
    the block."""
    pick_later = tx.Tx.pick_later
    made: list[int] = []

    def counted(self: tx.Tx, pick: Any) -> None:
        made.append(len(pick.candidates))
        pick_later(self, pick)

    with patch.object(tx.Tx, "pick_later", counted):
        yield made


def test_a_contended_cycle_claims_the_first_free_window_row_in_two_statements(
    postgres_server: PostgresServer,
) -> None:
    def scenario(run: Run) -> Any:
        # The statements' first runs (they are named on their second): two cycles alike.
        warm = [cycle(run.store, run.made[0], 1), cycle(run.store, run.made[1], 1)]
        before = run.sent()
        with held(postgres_server.engine, run.schema, run.made[3:5]):
            result = cycle(run.store, run.made[2], 1)
        return run.made, warm, result, run.sent() - before

    with_pick, without = both_ways(postgres_server, 20, scenario)
    (made, warm, result, statements), tables = with_pick
    assert [done[2] for done in warm] == [(made[1], 1), (made[2], 1)]
    assert result == (made[2], "succeeded", (made[5], 1))
    assert statements == 2  # BEGIN + the first statement; the writes + COMMIT
    assert without[0][:3] == (made, warm, result) and without[0][3] == 3
    assert without[1] == tables
    claim = tables["events"][-1]
    assert (claim["event_type"], claim["occurrence_id"], claim["owner_id"], claim["fence"]) == (
        "occurrence_claimed",
        made[5],
        "w",
        1,
    )
    assert claim["data_json"] == '{"attempt":1,"previousOwner":null,"previousStatus":"queued"}'
    assert tables["events"][-2]["event_type"] == "occurrence_succeeded"


def test_a_window_row_another_worker_claimed_after_the_window_was_read_is_passed_over(
    postgres_server: PostgresServer,
) -> None:
    """Another worker claims the first window row and commits between the cycle's two
    statements: the writes statement finds it changed (its version on the statement's snapshot)
    and claims the next one, leaving the other worker's claim as it is, as when the other
    worker's claim came first."""

    def scenario(run: Run) -> Any:
        other = open_store(postgres_server.engine, schema=run.schema, clock=lambda: NOW)
        flush = tx.Tx.flush_writes
        taken: list[Any] = []

        def other_worker() -> None:
            taken.append(other.claim_occurrence(occurrence_id=run.made[1], owner_id="other", lease_ms=LEASE))

        started: list[bool] = []

        def claim_first_then_flush(self: tx.Tx, *args: Any, **kwargs: Any) -> None:
            if not started:  # its own thread and connection: it claims and commits meanwhile
                started.append(True)
                worker = threading.Thread(target=other_worker)
                worker.start()
                worker.join()
            flush(self, *args, **kwargs)

        try:
            if not run.pick:  # the other way locks the row before the writes: the serial order
                other_worker()
                started.append(True)
            with (
                patch.object(tx.Tx, "flush_writes", claim_first_then_flush),
                picks_left_to_the_writes() as picks,
            ):
                result = cycle(run.store, run.made[0], 1)
        finally:
            other.close()
        assert taken[0] is not None and taken[0].lease_owner == "other"
        return run.made, result, picks

    with_pick, without = both_ways(postgres_server, 6, scenario)
    (made, result, picks), tables = with_pick
    assert result == (made[0], "succeeded", (made[2], 1))
    assert picks == [5] and without == ((made, result, []), tables)
    leased = {row["occurrence_id"]: row["lease_owner"] for row in tables["occurrences"] if row["lease_owner"]}
    assert leased == {made[1]: "other", made[2]: "w"}


def test_with_every_window_row_held_and_none_beyond_it_the_cycle_settles_and_claims_nothing(
    postgres_server: PostgresServer,
) -> None:
    def scenario(run: Run) -> Any:
        with held(postgres_server.engine, run.schema, run.made[1:]), picks_left_to_the_writes() as picks:
            return cycle(run.store, run.made[0], 1), picks

    with_pick, without = both_ways(postgres_server, 3, scenario)
    (result, picks), tables = with_pick
    assert result[1:] == ("succeeded", None)
    assert picks == [2] and without == ((result, []), tables)
    assert tables["events"][-1]["event_type"] == "occurrence_succeeded"


def test_with_every_window_row_held_and_more_beyond_it_the_call_runs_again_and_claims_past_them(
    postgres_server: PostgresServer,
) -> None:
    """The window's rows are all held and it could not see past them: the writes statement fails
    (nothing written) and the call runs again its own way, which reads the full list."""
    window = claim_query.HEAD_WINDOW

    def scenario(run: Run) -> Any:
        holding = held(postgres_server.engine, run.schema, run.made[1 : window + 1])
        with holding, picks_left_to_the_writes() as picks:
            return run.made, cycle(run.store, run.made[0], 1), picks

    with_pick, without = both_ways(postgres_server, window + 3, scenario)
    (made, result, picks), tables = with_pick
    assert result == (made[0], "succeeded", (made[window + 1], 1))
    assert picks == [window]  # the first attempt's; the second claims its own way
    assert without == ((made, result, []), tables)


def test_with_claims_logged_the_claim_keeps_its_own_lock_statement(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The call's state changes are collected before its writes are sent; a claim whose event is
    logged is therefore decided before them, and logged."""
    caplog.set_level(logging.INFO, logger=EVENTS_LOGGER)

    def scenario(run: Run) -> Any:
        with picks_left_to_the_writes() as picks:
            return cycle(run.store, run.made[0], 1), picks

    with_pick, without = both_ways(postgres_server, 4, scenario)
    assert with_pick == without
    (result, picks), _tables = with_pick
    assert picks == [] and result[2] is not None
    claimed = [record for record in caplog.records if getattr(record, "state", None) == "claimed"]
    assert any(getattr(record, "occurrence", None) == result[2][0] for record in claimed)


def test_the_writes_statement_is_built_after_the_shared_claim_statement_was_used(
    postgres_server: PostgresServer,
) -> None:
    """The writes statement is built the first time a process needs it, often after other claims
    used the shared claim ``UPDATE`` (whose column collections SQLAlchemy then memoizes; a
    statement copied from it with a ``RETURNING`` lacked those columns: ``AttributeError:
    job_id``, seen with 8 workers). It is built from a new copy of that statement."""
    assert claim_writes.CLAIM_GUARDED.statement.exported_columns is not None  # memoized, as by a use
    window_pick._statement.cache_clear()

    def scenario(run: Run) -> Any:
        with picks_left_to_the_writes() as picks:
            return run.made, cycle(run.store, run.made[0], 1), picks

    with_pick, without = both_ways(postgres_server, 4, scenario)
    (made, result, picks), tables = with_pick
    assert result == (made[0], "succeeded", (made[1], 1)) and picks == [3]
    assert without == ((made, result, []), tables)
