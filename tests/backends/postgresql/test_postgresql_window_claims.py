"""Claims among workers (the window of heads) choose what the full candidate list chooses.

Once other workers held its first candidates, a single claim on PostgreSQL reads the first
``claim_query.HEAD_WINDOW`` due rows of each waiting status and claims from them, up to the
first row it cannot decide on (``claim_plan.window_plan``, docs/design/postgresql-concurrency.md).
Here randomized states dense enough for a status to fill the window (disabled jobs, kind and
workspace filters, runtime controls, requeue requests, exhausted attempts, ties on the sort keys)
are claimed while another transaction holds some of their rows, once through the window and once
through the full list (the window path turned off), from the same rows; the results and the tables
afterwards must be equal. The full list itself is checked against SQLite in
``tests/conformance/test_claim_equivalence.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from unittest.mock import patch

import pytest
from backends import PostgresServer
from claim_seed import (
    FILTERS,
    LEASE,
    NOW,
    OWNER,
    T0,
    OccurrenceSpec,
    Pair,
    among_workers,
    as_among_workers,
    jobs_strategy,
    outcome,
    paired_stores,
)
from cycle_support import one_statement_off
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from test_postgresql_claims import enqueue, held
from test_postgresql_races import AUTHORITY

from scheduler import SchedulerStore, open_store
from scheduler.backends.postgresql import claim_tactics, cycle_statement
from scheduler.store.capabilities import claim_query

TIMES = [NOW - 2000, NOW - 1000, NOW - 500, NOW]
FAR = 9_000_000_000_000
# 30 random states per property in CI, 60 with SCHEDULER_RELIABILITY_SCALE=full.
WINDOW_CLAIMS = settings(
    max_examples=60 if os.environ.get("SCHEDULER_RELIABILITY_SCALE") == "full" else 30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@st.composite
def waiting_occurrence(draw: st.DrawFn, plain: int = 1) -> OccurrenceSpec:
    """Mostly due queued and retry_wait rows (running ones under a live lease: with an expired
    lease to act on, the window is not used); ``plain`` times fewer exhausted attempts, runtime
    controls and requeue requests among them than by default."""
    max_attempts = draw(st.integers(1, 3))
    attempt = draw(st.sampled_from([0] * 12 * plain + [max_attempts]))
    return OccurrenceSpec(
        occurrence_id="occ_" + draw(st.text("abcdefgh", min_size=2, max_size=3)),
        job=draw(st.integers(0, 2)),
        status=draw(st.sampled_from(["queued"] * 5 + ["retry_wait"] * 4 + ["running"])),
        available_at=draw(st.sampled_from(TIMES)),
        scheduled_for=draw(st.sampled_from([T0, T0 + 1, T0 + 2])),
        lease_expires_at=FAR,
        max_attempts=max_attempts,
        attempt=attempt,
        fence=draw(st.integers(max(attempt, 1), 4)),
        control=draw(st.sampled_from([None] * 20 * plain + ["pause_requested", "paused", "resumed"])),
        control_fence_offset=0,
        retry=draw(st.sampled_from([None] * 12 * plain + ["unclaimed"])),
        retry_fence_offset=0,
        adjudication=False,
        reservation=False,
    )


def waiting_states(plain: int = 1) -> st.SearchStrategy[Any]:
    """Jobs and enough :func:`waiting_occurrence` rows for a status to fill the window."""
    return st.tuples(
        jobs_strategy,
        st.lists(
            waiting_occurrence(plain),
            min_size=claim_query.HEAD_WINDOW,
            max_size=40,
            unique_by=lambda spec: spec.occurrence_id,
        ),
    )


dense_states = waiting_states()
plain_states = waiting_states(plain=4)
held_picks = st.lists(st.integers(0, 39), max_size=25)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer) -> Iterator[Pair]:
    yield from paired_stores(tmp_path_factory, postgres_server)


@contextmanager
def full_list_only() -> Iterator[None]:
    """The window path turned off: claims among workers read the full candidate list."""
    off = patch.object(claim_tactics, "_claim_from_window", lambda *_args, **_kwargs: False)
    with off, one_statement_off():
        yield


def run_among_workers(store: SchedulerStore, call: Callable[[Any], Any], in_transaction: bool) -> Any:
    """``call(store)``, or ``call(view)`` inside ``store.transaction()``, as among workers."""
    with among_workers(store):
        if not in_transaction:
            return outcome(lambda: call(store))

        def in_block() -> Any:
            with store.transaction() as view:
                as_among_workers(view)
                return call(view)

        return outcome(in_block)


def held_rows(made: list[str], picks: list[int], *, besides: str | None = None) -> list[str]:
    return sorted({made[index] for index in picks if index < len(made)} - {besides})


@WINDOW_CLAIMS
@given(state=dense_states, filters=FILTERS, picks=held_picks, in_transaction=st.booleans())
def test_claim_next_through_the_window_equals_the_full_list(
    pair: Pair, state: Any, filters: tuple[Any, str | None], picks: list[int], in_transaction: bool
) -> None:
    job_kind, workspace_id = filters

    def claim(store: Any) -> Any:
        return store.claim_next(owner_id=OWNER, lease_ms=LEASE, job_kind=job_kind, workspace_id=workspace_id)

    results = []
    for window in (True, False):
        made = pair.build(state)
        with held(pair.server.engine, pair.schema, held_rows(made, picks)):
            if window:
                claimed = run_among_workers(pair.pg, claim, in_transaction)
            else:
                with full_list_only():
                    claimed = run_among_workers(pair.pg, claim, in_transaction)
        results.append((claimed, pair.pg_tables()))
    assert results[0] == results[1]


@WINDOW_CLAIMS
@given(
    state=dense_states,
    picks=held_picks,
    settlement=st.sampled_from(["succeeded", "dead_letter", "retry_later"]),
    server_clock=st.booleans(),
)
def test_settle_and_claim_through_the_window_equals_the_full_list(
    pair: Pair, state: Any, picks: list[int], settlement: str, server_clock: bool
) -> None:
    """A success as one statement claiming from the window (``cycle_statement``), the cycle's
    first statement with the window (its first free candidate locked by ``LOCK_CANDIDATE_ROWS``),
    and the full list, on an injected clock and on the server's; on the injected one the tables
    afterwards must be equal too (event rows byte for byte)."""
    arguments: dict[str, Any] = {"owner_id": OWNER, "lease_ms": LEASE}
    if settlement == "succeeded":
        arguments["outcome"] = "succeeded"
    elif settlement == "dead_letter":
        arguments.update(outcome="failed", retryable=False)
    else:
        arguments.update(outcome="failed", retry_at=FAR)
    results = []
    for way in (nullcontext, one_statement_off, full_list_only):
        made = pair.build(state)
        settled = own_one_running(pair)
        if settled is None:
            return
        with held(pair.server.engine, pair.schema, held_rows(made, picks, besides=settled[0])), way():
            done = settle_and_claim(pair, settled, arguments, server_clock)
        # On the server's clock the rows carry two different instants; the claim is then
        # compared by its result alone.
        results.append((done, None if server_clock else pair.pg_tables()))
    assert results[0] == results[1] == results[2]


def test_a_success_in_one_statement_past_held_heads_equals_the_full_list(pair: Pair) -> None:
    """The one-statement cycle among workers (``cycle_statement``, claiming from the window) with
    the first ``heads_held`` due rows in the seed's order held by another transaction, and some
    others: the row it claims, or its miss and the call run again, end as with the full list.
    Across the examples the statement itself must have claimed rows, past held ones too."""
    claimed_at: list[int] = []
    resolve = cycle_statement.PendingCycle.resolve

    def counted(self: cycle_statement.PendingCycle, row: Any) -> None:
        resolve(self, row)
        if self.position is not None:
            claimed_at.append(self.position)

    @settings(WINDOW_CLAIMS, derandomize=True)  # the same examples every run: the count below is theirs
    @given(
        state=plain_states,
        heads_held=st.integers(0, claim_query.HEAD_WINDOW + 2),
        picks=held_picks,
        server_clock=st.booleans(),
    )
    def examples(state: Any, heads_held: int, picks: list[int], server_clock: bool) -> None:
        arguments: dict[str, Any] = {"owner_id": OWNER, "lease_ms": LEASE, "outcome": "succeeded"}
        results = []

        def statement() -> Any:
            return patch.object(cycle_statement.PendingCycle, "resolve", counted)

        for way in (statement, full_list_only):
            made = pair.build(state)
            settled = own_one_running(pair)
            if settled is None:
                return
            holding = {*due_in_order(pair)[:heads_held], *held_rows(made, picks)} - {settled[0]}
            with held(pair.server.engine, pair.schema, sorted(holding)), way():
                done = settle_and_claim(pair, settled, arguments, server_clock)
            results.append((done, None if server_clock else pair.pg_tables()))
        assert results[0] == results[1]

    examples()
    assert len(claimed_at) >= 5 and max(claimed_at) > 1, claimed_at


def due_in_order(pair: Pair) -> list[str]:
    """The due waiting occurrences in the seed's claim order."""
    with pair.server.engine.connect() as connection:
        rows = connection.execute(
            text(
                f'SELECT occurrence_id FROM "{pair.schema}".occurrences'
                " WHERE status IN ('queued', 'retry_wait') AND available_at <= :now"
                " ORDER BY available_at, scheduled_for, occurrence_id"
            ),
            {"now": NOW},
        )
        return [str(row[0]) for row in rows]


def settle_and_claim(
    pair: Pair, settled: tuple[str, int], arguments: dict[str, Any], server_clock: bool
) -> Any:
    """One ``settle_and_claim`` of ``settled`` (id, fence) by a fresh store as among workers."""
    store = open_store(pair.server.engine, schema=pair.schema, clock=None if server_clock else lambda: NOW)
    try:
        as_among_workers(store)

        def cycle() -> Any:
            done = store.settle_and_claim(occurrence_id=settled[0], fence=settled[1], **arguments)
            claimed = None if done.claimed is None else done.claimed.id
            return done.settled.id, done.settled.status, claimed

        return outcome(cycle)
    finally:
        store.close()


def own_one_running(pair: Pair) -> tuple[str, int] | None:
    """The first running occurrence, now held by ``OWNER`` (its lease is far off), or ``None``."""
    occurrences = f'"{pair.schema}".occurrences'
    with pair.server.engine.begin() as connection:
        row = connection.execute(
            text(f"SELECT occurrence_id, fence FROM {occurrences} WHERE status = 'running' ORDER BY 1")
        ).first()
        if row is None:
            return None
        connection.execute(
            text(f"UPDATE {occurrences} SET lease_owner = :owner WHERE occurrence_id = :id"),
            {"owner": OWNER, "id": row[0]},
        )
    return str(row[0]), int(row[1])


def test_past_held_rows_and_a_row_it_cannot_decide_on_the_window_reads_the_full_list(
    pg_engine: Engine, pg_schema: str
) -> None:
    """The window's first two rows are held and its third belongs to a disabled job: the window
    stops at that row (``window_plan``: truncated) and, its candidates passed over, does not
    conclude that nothing is claimable; the full list finds the free row after it."""
    store = open_store(pg_engine, schema=pg_schema, clock=lambda: T0 + 10)
    try:
        store.create_job(id="off", kind="agenda", authority=AUTHORITY)
        first = enqueue(store, 2)
        (off,) = [
            occurrence.id
            for occurrence in store.enqueue_many(
                [{"job_id": "off", "scheduled_for": T0, "trigger_key": "off"}]
            )
        ]
        later = store.enqueue_many([{"job_id": "job-1", "scheduled_for": T0 + 1, "trigger_key": "later"}])
        store.update_job("off", 1, enabled=False)
        as_among_workers(store)
        with held(pg_engine, pg_schema, first):
            claimed = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert claimed is not None and claimed.id == later[0].id != off
    finally:
        store.close()
