"""No cliffs (API §5 claims and listings): a claim or a dead-letter listing costs the same however
many rows lie in its way that it is not asked for.

Each adversarial state of ``scheduler bench --adversarial`` (``scheduler/bench/adversarial_states.py``:
a disabled job's due backlog at one ``available_at`` ahead of other work, another kind's or
workspace's, dead letters, a dead fleet's expired leases) is built through the public API twice,
with :data:`SMALL` and with :data:`LARGE` rows, and every case of the bench on it runs on both.
What each call does is counted, not timed: on SQLite the virtual machine instructions of every
statement (a progress handler on the store's own connection), on PostgreSQL the index entries
and table rows its statements read (``pg_stat_user_indexes.idx_tup_read`` +
``pg_stat_user_tables.seq_tup_read`` of the store's schema, flushed after the call). A walk over
the rows in the way reads five times as many of them at :data:`LARGE`; a bounded one the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from backends import SQLITE
from store_places import PostgresSchemaPlace, StorePlace

from scheduler import SchedulerStore
from scheduler.bench import adversarial, adversarial_states
from scheduler.store.capabilities import dead_letters

SMALL, LARGE = 500, 2500
CALLS = 3
GROWTH_ALLOWED = 1.25
"""How much more a call may do at ``LARGE`` than at ``SMALL`` (a bounded one does as much)."""
SLACK = 400
"""Work a call may differ by at any size (what a few rows more in a page or a batch cost)."""


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The states' dead letters fail in batches of 100 (one ``settled_at`` each, as one
    ``settle_many`` gives them), so both sizes end with the same burst."""
    monkeypatch.setattr(adversarial_states, "BATCH", 100)


READ_IN_SCHEMA = (
    "SELECT (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE schemaname = %(s)s)"
    " + (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables WHERE schemaname = %(s)s)"
)
"""The index entries and table rows read in a schema so far (PostgreSQL's statistics)."""


def counter(place: StorePlace, store: SchedulerStore) -> Callable[[Callable[[], Any]], int]:
    """``measure(call)``: what ``call`` made the store's database do (see the module docstring)."""
    if place.backend == SQLITE:
        dbapi: Any = store.connection.connection.dbapi_connection

        def on_sqlite(call: Callable[[], Any]) -> int:
            steps = [0]

            def step() -> int:
                steps[0] += 1
                return 0

            dbapi.set_progress_handler(step, 10)
            try:
                call()
            finally:
                dbapi.set_progress_handler(None, 10)
            return steps[0] * 10

        return on_sqlite
    assert isinstance(place, PostgresSchemaPlace)
    server, schema = place.server, place.schema

    def flushed() -> int:
        store.connection.exec_driver_sql("SELECT pg_stat_force_next_flush()")
        store.connection.rollback()  # idle: the session's counters reach the shared statistics
        with server.engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            read = connection.exec_driver_sql(READ_IN_SCHEMA, {"s": schema}).scalar_one()
        return int(read)

    def on_postgresql(call: Callable[[], Any]) -> int:
        before = flushed()
        call()
        return flushed() - before

    return on_postgresql


Built = tuple[StorePlace, SchedulerStore]


@pytest.fixture
def built(place: StorePlace) -> Iterator[Callable[[str, int], Built]]:
    """``build(state, rows)``: a fresh place holding that state, and a store on it."""
    stores: list[SchedulerStore] = []

    def build(state: str, rows: int, analyzed: bool = False) -> Built:
        sibling = place.sibling(f"adv_{state}_{rows}")
        store = sibling.open()
        stores.append(store)
        adversarial_states.build(store, state, rows, adversarial.work_for(CALLS))
        if analyzed:  # what autovacuum (or a DBA) gives a database soon after
            for table in ("jobs", "occurrences", "events", "scheduler_occurrence_controls"):
                sibling.sql(f"ANALYZE {table}")
        return sibling, store

    try:
        yield build
    finally:
        for store in stores:
            store.close()


def case_costs(built: Built, state: str) -> dict[str, int]:
    """Per case of ``state``: the least one of :data:`CALLS` calls did, after two warm-up calls (a
    walk of the rows in the way would be in each of them; on PostgreSQL, an index entry left
    dead by the build may be read again until a scan can mark it dead for every snapshot)."""
    place, store = built
    measure = counter(place, store)
    costs = {}
    for case in adversarial.CASES:
        if case.state != state:
            continue
        timer = case.start(store)
        try:
            timer.call()
            timer.call()
            costs[case.key] = min(measure(timer.call) for _ in range(CALLS))
        finally:
            timer.finish()
    return costs


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
@pytest.mark.parametrize("state", adversarial.STATES)
def test_the_calls_cost_as_much_behind_five_times_the_rows(
    built: Callable[..., Built], state: str, analyzed: bool
) -> None:
    """Before and after the tables are analyzed: with statistics PostgreSQL once estimated a
    job's rows as the average job's and read every row of a disabled job's backlog to find the
    few of the enabled one (``Backend.rows_of_jobs``)."""
    small = case_costs(built(state, SMALL, analyzed), state)
    large = case_costs(built(state, LARGE, analyzed), state)
    assert small and set(small) == set(large)
    grown = {
        key: (small[key], large[key]) for key in small if large[key] > small[key] * GROWTH_ALLOWED + SLACK
    }
    assert not grown, f"work at {SMALL:,} and {LARGE:,} rows: {grown}"


TRAFFIC = 200
"""Cycles of other work after the dead letters: 600 newer events, more than the walk reads
before it first weighs the seed's sort (patched to :data:`FIRST_EVENTS`)."""
FIRST_EVENTS, FIRST_SORT = 128, 64


def traffic(store: SchedulerStore, cycles: int) -> None:
    """``cycles`` occurrences of a new job enqueued, claimed and settled: newer events only."""
    store.create_job(id="adv-live", kind="live", authority={"principal": {"type": "service", "id": "live"}})
    adversarial_states.add_work(store, "adv-live", cycles)
    claimed = store.claim_batch(owner_id="live", lease_ms=60_000, limit=cycles, job_kind="live")
    store.settle_many(
        [
            {"occurrence_id": o.id, "owner_id": "live", "fence": o.fence, "outcome": "succeeded"}
            for o in claimed
        ]
    )


def test_dead_letters_behind_newer_events_cost_as_much_behind_five_times_the_rows(
    built: Callable[[str, int], Built], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead letters followed by more events than the walk reads before it first weighs the
    seed's sort: the listing walks on (the newer events) rather than sort every dead letter."""
    monkeypatch.setattr(dead_letters, "EVENT_SCAN_BUDGET", FIRST_EVENTS)
    monkeypatch.setattr(dead_letters, "SORT_BUDGET", FIRST_SORT)
    costs = []
    for rows in (SMALL, LARGE):
        place, store = built("dead", rows)
        traffic(store, TRAFFIC)
        costs.append(case_costs((place, store), "dead"))
    small, large = costs
    grown = {
        key: (small[key], large[key]) for key in small if large[key] > small[key] * GROWTH_ALLOWED + SLACK
    }
    assert not grown, f"work at {SMALL:,} and {LARGE:,} dead letters behind newer events: {grown}"
