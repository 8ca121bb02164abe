"""A successful ``settle_and_claim`` among workers runs as one statement claiming from the window.

Among workers that hold the first candidates (``ClaimContention``), the one-statement cycle
(``store/cycle_statement.py``) reads the window of heads and locks its first free candidate
(``_window_and_lock``) instead of the head. Each scenario runs with the statement and without it
(the cycle's first statement with the window, the first free candidate locked by a statement of its
own, then the writes statement), as in ``test_postgresql_cycle_statement.py``; results and tables
must be equal. The cases the window cannot decide (a claimable row that is not plain, an arm that
may hold unread rows ahead of the next candidate) make the statement miss, and the call runs again
the usual way: each is built so that a statement deciding it anyway would claim another row. The
randomized comparison with the full candidate list is in ``test_postgresql_window_claims.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from backends import PostgresServer
from cycle_support import slowed_statement
from test_postgresql_claims import LEASE, held
from test_postgresql_cycle_statement import T0, Run, both_ways, cycle, wait_event

from scheduler import open_store
from scheduler.backends.postgresql import queries
from scheduler.store.capabilities import claim_query

pytestmark = pytest.mark.postgresql
ERROR = {"code": "E_BROKEN", "message": "broken"}


def positions(run: Run) -> list[int | None]:
    """For each one-statement cycle tried: the window position of the row it claimed (1: the
    first), ``0`` where it claimed nothing, ``None`` where it missed and the call ran again."""
    found: list[int | None] = []
    for pending in run.pending:
        if pending.result is None:
            found.append(None)
        else:
            found.append(0 if pending.result.claimed is None else pending.position)
    return found


def compared(server: PostgresServer, count: int, scenario: Any) -> tuple[Any, Any, list[int | None]]:
    """``scenario`` among workers with the statement and without. It returns what both runs must
    agree on and what is its run's own; the first parts and the tables must be equal. Returns the
    first run's two parts and the statement's positions."""
    (with_statement, _, tables), (without, none, tables_without) = both_ways(
        server, count, lambda run: (*scenario(run), positions(run)), contended=True
    )
    assert with_statement[0] == without[0] and tables == tables_without
    assert none == 0 and without[2] == []
    shared, own, found = with_statement
    return shared, own, found


def test_a_contended_cycle_claims_the_first_free_window_row_in_one_round_trip(
    postgres_server: PostgresServer,
) -> None:
    def scenario(run: Run) -> Any:
        warm = [cycle(run.store, run.made[0], 1), cycle(run.store, run.made[1], 1)]  # named on reuse
        before = run.sent()
        with held(postgres_server.engine, run.schema, run.made[3:5]):
            done = cycle(run.store, run.made[2], 1)
        return (run.made, warm, done), run.sent() - before

    (made, warm, (settled, claimed)), sent, found = compared(postgres_server, 8, scenario)
    assert [done[1].id for done in warm] == made[1:3]
    assert settled.status == "succeeded" and claimed is not None and claimed.id == made[5]
    assert found == [1, 1, 3] and sent == 1  # made[3], made[4] held: made[5] is the third candidate


def test_a_claimable_row_that_is_not_plain_stops_the_statement(postgres_server: PostgresServer) -> None:
    """A requeued dead letter (its claim keeps its attempt: not plain) lies between a held row and a
    free plain one: the statement must not pass over it; it misses, and the call claims it."""

    def scenario(run: Run) -> Any:
        other = run.store.claim_next(owner_id="v", lease_ms=LEASE)
        assert other is not None and other.id == run.made[1]
        run.store.settle(
            occurrence_id=other.id, owner_id="v", fence=1, outcome="failed", retryable=False, error=ERROR
        )
        requeued = run.store.requeue_dead_letter(
            occurrence_id=other.id, expected_fence=1, expected_error_code=ERROR["code"], request_id="rq-1"
        )
        later = run.store.enqueue_many([{"job_id": "job-1", "scheduled_for": T0 + 1, "trigger_key": "later"}])
        run.clock.now = T0 + 1
        with held(postgres_server.engine, run.schema, run.made[2:3]):
            done = cycle(run.store, run.made[0], 1)
        return (run.made, requeued.occurrence.available_at, later[0].id, done), None

    (made, requeued_at, later, (settled, claimed)), _, found = compared(postgres_server, 3, scenario)
    assert requeued_at == T0 and settled.status == "succeeded" and found == [None]
    assert claimed is not None and claimed.id == made[1] != later and claimed.attempt == 1


@pytest.mark.parametrize("held_rows", [claim_query.HEAD_WINDOW, claim_query.HEAD_WINDOW - 1])
def test_the_window_claims_up_to_the_last_row_of_a_full_arm_and_not_past_it(
    postgres_server: PostgresServer, held_rows: int
) -> None:
    """The queued arm returns ``HEAD_WINDOW`` rows; a due retry is later than all of them. With the
    arm's rows all held, queued rows beyond the window come before the retry: the statement misses
    and the call claims the first of them, not the retry. With the arm's last row free, that row
    is the next in the seed's order whatever lies beyond, and the statement claims it."""
    window = claim_query.HEAD_WINDOW

    def scenario(run: Run) -> Any:
        other = run.store.claim_next(owner_id="v", lease_ms=LEASE)
        assert other is not None and other.id == run.made[1]
        run.store.settle(occurrence_id=other.id, owner_id="v", fence=1, outcome="failed", retry_at=T0 + 5)
        run.clock.now = T0 + 5
        with held(postgres_server.engine, run.schema, run.made[2 : 2 + held_rows]):
            done = cycle(run.store, run.made[0], 1)
        return (run.made, done), None

    (made, (settled, claimed)), _, found = compared(postgres_server, window + 4, scenario)
    assert settled.status == "succeeded" and claimed is not None
    assert claimed.id == made[2 + held_rows]  # the row after the held ones, never the retry
    assert found == ([None] if held_rows == window else [window])


def test_a_due_retry_within_the_window_is_claimed_in_its_place(postgres_server: PostgresServer) -> None:
    """A retry due between queued rows (the two arms merged in the seed's order), every row before
    it held: the statement claims the retry."""

    def scenario(run: Run) -> Any:
        other = run.store.claim_next(owner_id="v", lease_ms=LEASE)
        assert other is not None and other.id == run.made[1]
        run.store.settle(occurrence_id=other.id, owner_id="v", fence=1, outcome="failed", retry_at=T0 + 15)
        later = run.store.enqueue_many(
            [{"job_id": "job-1", "scheduled_for": T0 + at, "trigger_key": f"at{at}"} for at in (10, 20)]
        )
        run.clock.now = T0 + 20
        with held(postgres_server.engine, run.schema, [*run.made[2:], later[0].id]):
            done = cycle(run.store, run.made[0], 1)
        return (run.made, done), None

    # made[2:] and the row due at T0 + 10 held; made[1]'s retry at T0 + 15 is the 6th candidate.
    (made, (settled, claimed)), _, found = compared(postgres_server, 6, scenario)
    assert settled.status == "succeeded" and claimed is not None
    assert claimed.id == made[1] and claimed.attempt == 2 and found == [6]


def test_a_window_row_claimed_after_the_statement_began_is_passed_over(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker claims the first window row and commits while the statement runs (slowed
    here: 2 s after its snapshot, before its first lock). The statement's snapshot still reads
    that row as queued; locked, its newest version fails the version check (PostgreSQL checks the
    ``WHERE`` clause again on the row it locked) and the next row is claimed, as when the other
    worker's claim came first."""
    slowed = slowed_statement("cycle_window")

    def scenario(run: Run) -> Any:
        other = open_store(postgres_server.engine, schema=run.schema, clock=run.clock)
        taken: list[Any] = []

        def claim_first() -> None:
            taken.append(other.claim_occurrence(occurrence_id=run.made[1], owner_id="o", lease_ms=LEASE))

        try:
            pid = run.store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            run.store.connection.rollback()
            results: list[Any] = []
            with postgres_server.engine.connect() as watcher, monkeypatch.context() as patched:
                patched.setattr(queries, "CYCLE_WINDOW", slowed)
                thread = threading.Thread(target=lambda: results.append(cycle(run.store, run.made[0], 1)))
                if run.one_statement:
                    thread.start()
                    while wait_event(watcher, pid) != "PgSleep":
                        assert thread.is_alive(), results
                    claim_first()
                else:  # the serial order the statement's outcome must equal
                    claim_first()
                    thread.start()
                thread.join(30)
            return (run.made, taken[0].lease_owner, results[0]), None
        finally:
            other.close()

    (made, owner, (settled, claimed)), _, found = compared(postgres_server, 4, scenario)
    assert owner == "o" and settled.status == "succeeded"
    assert claimed is not None and claimed.id == made[2] and found == [2]
