"""A contended ``settle_and_claim`` the usual way claims the first free window row in the seed's order.

Among workers that hold the first candidates, a cycle not sent as one statement (a failure, or
the statement missed; here ``cycle_statement`` is turned off) reads the window of heads in its
first statement, locks the first free candidate with a statement of its own
(``claim_locks.lock_candidates``: ``LOCK_CANDIDATE_ROWS`` on a fresh snapshot) and sends its
writes with the ``COMMIT``: three statements. The row claimed is the one the seed's order gives
past the rows other transactions hold or claimed meanwhile. The randomized comparison with the
full candidate list is in ``test_postgresql_window_claims.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from backends import PostgresServer, unique_name
from claim_seed import as_among_workers
from cycle_support import one_statement_off
from sqlalchemy import create_engine
from test_fastpath_postgresql import Recorded, recording_cursor
from test_postgresql_claims import LEASE, enqueue, held

from scheduler import SchedulerStore, open_store
from scheduler.backends.postgresql import claim_tactics
from scheduler.store.capabilities import claim_query

pytestmark = pytest.mark.postgresql
NOW = 1_800_000_000_000


@contextmanager
def contended(
    server: PostgresServer, count: int
) -> Iterator[tuple[SchedulerStore, str, list[str], Recorded]]:
    """A store (injected clock) on a fresh schema with ``count`` due occurrences, the first one
    claimed by ``w``; its single claims kept on the path among workers, cycles never sent as one
    statement, and its psycopg statements recorded."""
    schema = unique_name("t_contended")
    seen: Recorded = []
    engine = create_engine(server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=schema, clock=lambda: NOW)
    try:
        made = enqueue(store, count)
        first = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert first is not None and first.id == made[0]
        as_among_workers(store)
        with one_statement_off():
            yield store, schema, made, seen
    finally:
        store.close()
        engine.dispose()
        server.drop_schema(schema)


def cycle(store: SchedulerStore, held_id: str, fence: int) -> Any:
    done = store.settle_and_claim(
        occurrence_id=held_id, owner_id="w", fence=fence, outcome="succeeded", lease_ms=LEASE
    )
    return (
        done.settled.id,
        done.settled.status,
        None if done.claimed is None else (done.claimed.id, done.claimed.fence),
    )


def test_a_contended_cycle_claims_the_first_free_window_row_in_three_statements(
    postgres_server: PostgresServer,
) -> None:
    with contended(postgres_server, 20) as (store, schema, made, seen):
        # The statements' first runs (they are named on their second): two cycles alike.
        warm = [cycle(store, made[0], 1), cycle(store, made[1], 1)]
        before = len(seen)
        with held(postgres_server.engine, schema, made[3:5]):
            result = cycle(store, made[2], 1)
        statements = len(seen) - before
        claimed = store.get_occurrence(made[5])
    assert [done[2] for done in warm] == [(made[1], 1), (made[2], 1)]
    assert result == (made[2], "succeeded", (made[5], 1))  # made[3], made[4] held
    assert statements == 3  # BEGIN + the first statement; the lock; the writes + COMMIT
    assert claimed is not None and (claimed.status, claimed.lease_owner) == ("running", "w")


def test_a_window_row_another_worker_claimed_after_the_window_was_read_is_passed_over(
    postgres_server: PostgresServer,
) -> None:
    """Another worker claims the first window row and commits between the cycle's first statement
    and its lock statement: the lock passes over the changed row and claims the next one, leaving
    the other worker's claim as it is."""
    lock_candidates = claim_tactics.lock_candidates
    with contended(postgres_server, 6) as (store, schema, made, _seen):
        other = open_store(postgres_server.engine, schema=schema, clock=lambda: NOW)
        taken: list[Any] = []

        def other_worker() -> None:
            taken.append(other.claim_occurrence(occurrence_id=made[1], owner_id="other", lease_ms=LEASE))

        def claim_first_then_lock(*args: Any) -> Any:
            if not taken:  # its own thread and connection: it claims and commits meanwhile
                worker = threading.Thread(target=other_worker)
                worker.start()
                worker.join()
            return lock_candidates(*args)

        try:
            with pytest.MonkeyPatch.context() as patched:
                patched.setattr(claim_tactics, "lock_candidates", claim_first_then_lock)
                result = cycle(store, made[0], 1)
        finally:
            other.close()
        leased = {
            occurrence_id: store.get_occurrence(occurrence_id).lease_owner  # type: ignore[union-attr]
            for occurrence_id in made[1:]
        }
    assert taken[0] is not None and taken[0].lease_owner == "other"
    assert result == (made[0], "succeeded", (made[2], 1))
    assert leased == {made[1]: "other", made[2]: "w", made[3]: None, made[4]: None, made[5]: None}


def test_with_every_window_row_held_and_none_beyond_it_the_cycle_settles_and_claims_nothing(
    postgres_server: PostgresServer,
) -> None:
    with contended(postgres_server, 3) as (store, schema, made, _seen):
        with held(postgres_server.engine, schema, made[1:]):
            result = cycle(store, made[0], 1)
        newest = store.history(job_id="job-1")[0]
        statuses = [store.get_occurrence(occurrence_id).status for occurrence_id in made[1:]]  # type: ignore[union-attr]
    assert result == (made[0], "succeeded", None)
    assert (newest.type, newest.occurrence_id) == ("occurrence_succeeded", made[0])
    assert statuses == ["queued", "queued"]


def test_with_every_window_row_held_and_more_beyond_it_the_cycle_claims_past_them(
    postgres_server: PostgresServer,
) -> None:
    """The window's rows are all held and it cannot see past them: the claim reads the full
    candidate list and takes the first row beyond the window."""
    window = claim_query.HEAD_WINDOW
    with (
        contended(postgres_server, window + 3) as (store, schema, made, _seen),
        held(postgres_server.engine, schema, made[1 : window + 1]),
    ):
        result = cycle(store, made[0], 1)
    assert result == (made[0], "succeeded", (made[window + 1], 1))
