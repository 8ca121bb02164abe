"""Claim order (API §5 claims, §7): every backend's claims choose exactly what the seed's v6
``claimNext`` chooses, ``settle_and_claim`` equals ``settle`` then ``claim_next``, and
``settle_many_and_claim`` equals ``settle_many`` then ``claim_batch``.

A literal port of the seed's SQL (``claim_seed.py``: sweep, candidate SELECT, claim UPDATE and
its bookkeeping) runs on a SQLite file in a transaction that is rolled back; then the backend's
store runs the same call on the same rows (on SQLite: that file; on PostgreSQL: the rows copied
into a schema). The outcomes and every table afterwards must be identical (on PostgreSQL with
event ids renumbered densely, API §8), on hypothesis-randomized states with disabled jobs, kinds,
workspaces, runtime controls, requeue requests, pending adjudications, exhausted attempts and
ties on every sort key.

A backend with more than one claim path runs each of them: PostgreSQL's quiet path and its path
among workers (the window of heads, once other workers held the first candidates), for
``claim_next`` and ``settle_and_claim``. Small claim windows and probe budgets force every read
path of ``claim_batch``. (SQLite's query plans: ``tests/backends/sqlite/test_claim_plans.py``.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, replace
from typing import Any
from unittest.mock import patch

import pytest
from backends import BACKENDS, POSTGRESQL, SQLITE, PostgresServer, unique_name
from claim_seed import (
    EQUIVALENCE,
    FILTERS,
    LEASE,
    NOW,
    OWNER,
    SMALL_BOUNDS,
    JobSpec,
    OccurrenceSpec,
    PgCopy,
    Snapshot,
    among_workers,
    backlog_state,
    build_state,
    classify,
    comparable,
    outcome,
    raw,
    seed_claim_batch,
    seed_claim_next,
    seed_claim_occurrence,
    seed_result,
    snapshot,
    states_strategy,
)
from hypothesis import event as note
from hypothesis import given, settings
from hypothesis import strategies as st
from lifecycle_support import T0
from store_places import PG_EXAMPLES_DIVISOR

from scheduler import (
    SchedulerKernelError,
    SchedulerStore,
    SettledAndClaimed,
    SettledManyAndClaimed,
    open_store,
)
from scheduler.store.capabilities import claim_query

ClaimPath = Callable[[], AbstractContextManager[Any]]


@dataclass(frozen=True)
class ClaimHarness:
    """One backend's store on the rows of the seed's SQLite file ``db``.

    ``reference`` is a SQLite store on ``db`` itself (``store`` on SQLite); ``copy`` is where a
    PostgreSQL store's rows live (``None`` on SQLite, where the store works on ``db``).
    """

    backend: str
    db: sqlite3.Connection
    store: SchedulerStore
    reference: SchedulerStore
    copy: PgCopy | None

    def build(self, state: Any) -> list[str]:
        """Write ``state`` into ``db`` (and copy it into the backend's database)."""
        made = build_state(self.db, *state)
        if self.copy is not None:
            self.copy.load(self.db)
        return made

    def tables(self) -> Snapshot:
        """The backend's tables now, in the layout :meth:`expected` gives."""
        return snapshot(self.db) if self.copy is None else self.copy.tables()

    def expected(self, result: tuple[Any, Snapshot]) -> tuple[Any, Snapshot]:
        """What the backend must return and leave, from a result read on ``db``."""
        returned, tables = result
        return returned, tables if self.copy is None else comparable(tables)

    def run(self, call: Callable[[SchedulerStore], Any]) -> tuple[Any, Snapshot]:
        return outcome(lambda: call(self.store)), self.tables()

    def claim_paths(self) -> list[tuple[str, ClaimPath]]:
        """Every way the backend's single claims can go."""
        if self.copy is None:
            return [("one writer", nullcontext)]
        return [("quiet", nullcontext), ("among workers", lambda: among_workers(self.store))]

    def settings(self) -> settings:
        if self.backend == SQLITE:
            return EQUIVALENCE
        return settings(EQUIVALENCE, max_examples=EQUIVALENCE.max_examples // PG_EXAMPLES_DIVISOR)


@pytest.fixture(scope="module", params=BACKENDS)
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClaimHarness]:
    path = tmp_path_factory.mktemp("equivalence") / "claims.sqlite"
    reference = open_store(path, clock=lambda: NOW)
    db = raw(path)
    try:
        if request.param == SQLITE:
            yield ClaimHarness(SQLITE, db, reference, reference, None)
            return
        server: PostgresServer = request.getfixturevalue("postgres_server")
        schema = unique_name("t_claims_eq")
        store = open_store(server.engine, schema=schema, clock=lambda: NOW)
        try:
            yield ClaimHarness(POSTGRESQL, db, store, reference, PgCopy(server, schema))
        finally:
            store.close()
            server.drop_schema(schema)
    finally:
        db.close()
        reference.close()


def test_claim_next_matches_the_seed(harness: ClaimHarness) -> None:
    @harness.settings()
    @given(state=states_strategy, filters=FILTERS)
    def check(state: Any, filters: tuple[Any, str | None]) -> None:
        job_kind, workspace_id = filters
        for name, path in harness.claim_paths():
            harness.build(state)
            expected = seed_result(harness.db, lambda c: seed_claim_next(c, job_kind, workspace_id))
            with path():
                actual = harness.run(
                    lambda store: store.claim_next(
                        owner_id=OWNER, lease_ms=LEASE, job_kind=job_kind, workspace_id=workspace_id
                    )
                )
            classify(*expected)
            assert actual == harness.expected(expected), name

    check()


def test_claim_batch_matches_successive_seed_claims(harness: ClaimHarness) -> None:
    @harness.settings()
    @given(state=states_strategy, filters=FILTERS, limit=st.integers(1, 6))
    def check(state: Any, filters: tuple[Any, str | None], limit: int) -> None:
        harness.build(state)
        job_kind, workspace_id = filters
        expected = seed_result(harness.db, lambda c: seed_claim_batch(c, limit, job_kind, workspace_id))
        actual = harness.run(
            lambda store: store.claim_batch(
                owner_id=OWNER, lease_ms=LEASE, limit=limit, job_kind=job_kind, workspace_id=workspace_id
            )
        )
        classify(expected[0] if expected[0] != [] else None, expected[1])
        assert actual == harness.expected(expected)

    check()


def small_bounds(bounds: tuple[int, int, int]) -> AbstractContextManager[Any]:
    """The claim's window, job probe budget and first walk page shrunk to ``bounds``."""
    window, budget, page = bounds
    note(f"window {window}, budget {budget}, page {page}")
    stack = ExitStack()
    for name, value in (("WINDOW", window), ("JOB_PROBE_BUDGET", budget), ("WALK_PAGE", page)):
        stack.enter_context(patch.object(claim_query, name, value))
    return stack


def test_claims_beyond_small_windows_match_successive_seed_claims(harness: ClaimHarness) -> None:
    @harness.settings()
    @given(state=states_strategy, filters=FILTERS, limit=st.integers(1, 6), bounds=SMALL_BOUNDS)
    def check(state: Any, filters: tuple[Any, str | None], limit: int, bounds: tuple[int, int, int]) -> None:
        harness.build(state)
        job_kind, workspace_id = filters
        expected = seed_result(harness.db, lambda c: seed_claim_batch(c, limit, job_kind, workspace_id))
        with small_bounds(bounds):
            actual = harness.run(
                lambda store: store.claim_batch(
                    owner_id=OWNER, lease_ms=LEASE, limit=limit, job_kind=job_kind, workspace_id=workspace_id
                )
            )
        assert actual == harness.expected(expected)

    check()


def test_claims_behind_a_backlog_match_the_seed(harness: ClaimHarness) -> None:
    """A backlog of one job's due rows at one ``available_at`` (a paused job's, or a kind or
    workspace the filter leaves out) ahead of and among other work: ``claim_next`` on every claim
    path and ``claim_batch`` take what the seed takes, with the window, budget and pages shrunk
    so the backlog fills several pages and every round beyond the window runs (half the examples
    of the other tests: each state is several times larger)."""

    @settings(harness.settings(), max_examples=max(1, harness.settings().max_examples // 2))
    @given(state=backlog_state(), filters=FILTERS, limit=st.integers(1, 4), bounds=SMALL_BOUNDS)
    def check(state: Any, filters: tuple[Any, str | None], limit: int, bounds: tuple[int, int, int]) -> None:
        job_kind, workspace_id = filters
        arguments = {"owner_id": OWNER, "lease_ms": LEASE, "job_kind": job_kind, "workspace_id": workspace_id}
        for name, path in harness.claim_paths():
            harness.build(state)
            expected = seed_result(harness.db, lambda c: seed_claim_next(c, job_kind, workspace_id))
            with path(), small_bounds(bounds):
                actual = harness.run(lambda store: store.claim_next(**arguments))
            classify(*expected)
            assert actual == harness.expected(expected), name
        harness.build(state)
        expected = seed_result(harness.db, lambda c: seed_claim_batch(c, limit, job_kind, workspace_id))
        with small_bounds(bounds):
            actual = harness.run(lambda store: store.claim_batch(limit=limit, **arguments))
        assert actual == harness.expected(expected)

    check()


def test_claim_occurrence_matches_the_seed(harness: ClaimHarness) -> None:
    @harness.settings()
    @given(state=states_strategy, pick=st.integers(0, 20))
    def check(state: Any, pick: int) -> None:
        made = harness.build(state)
        target = made[pick % len(made)] if made and pick < 18 else "occ_missing"
        expected = seed_result(harness.db, lambda c: seed_claim_occurrence(c, target))
        actual = harness.run(
            lambda store: store.claim_occurrence(occurrence_id=target, owner_id=OWNER, lease_ms=LEASE)
        )
        classify(*expected)
        assert actual == harness.expected(expected)

    check()


def test_equivalence_harness_sees_interesting_states(harness: ClaimHarness) -> None:
    """A fixed state exercising the sweep, a reclaim, a control, a requeue and filters."""
    jobs = [JobSpec("", "agenda", True, "ws-a"), JobSpec("", "routine", True, None)]
    spec = dict(
        scheduled_for=T0,
        control=None,
        control_fence_offset=0,
        retry=None,
        retry_fence_offset=0,
        adjudication=False,
        reservation=False,
        max_attempts=2,
        attempt=1,
        fence=1,
        job=0,
    )
    occurrences = [
        OccurrenceSpec(
            occurrence_id="occ_sweep",
            status="running",
            available_at=NOW,
            lease_expires_at=NOW - 2000,
            **{**spec, "attempt": 2, "fence": 2, "adjudication": True, "reservation": True},
        ),
        OccurrenceSpec(
            occurrence_id="occ_reclaim",
            status="running",
            available_at=NOW,
            lease_expires_at=NOW - 1000,
            **spec,
        ),
        OccurrenceSpec(
            occurrence_id="occ_requeued",
            status="retry_wait",
            available_at=NOW - 2000,
            lease_expires_at=NOW,
            **{**spec, "attempt": 2, "retry": "unclaimed", "job": 1},
        ),
        OccurrenceSpec(
            occurrence_id="occ_paused",
            status="retry_wait",
            available_at=NOW - 2000,
            lease_expires_at=NOW,
            **{**spec, "control": "paused"},
        ),
    ]
    harness.build((jobs, occurrences))
    expected = seed_result(harness.db, lambda c: [seed_claim_next(c, None, None) for _ in range(4)])
    assert expected[0] == ["occ_requeued", "occ_reclaim", None, None]
    actual = harness.run(lambda store: store.claim_batch(owner_id=OWNER, lease_ms=LEASE, limit=4))
    assert actual == harness.expected((expected[0][:2], expected[1]))


# ------------------------------------------------------------------ one cycle = the two calls

SETTLEMENTS = st.fixed_dictionaries(
    {
        "outcome": st.sampled_from(["succeeded", "failed"]),
        "retryable": st.booleans(),
        "retry_at": st.sampled_from([None, NOW - 5, NOW + 500]),
        "owner_id": st.sampled_from(["w-old", "w-old", "w-other"]),
        "fence_offset": st.sampled_from([0, 0, 0, 1]),
        "held": st.sampled_from([True, True, True, False]),
        "spare": st.booleans(),
    }
)


def test_settle_and_claim_equals_settle_then_claim_next(harness: ClaimHarness) -> None:
    """One ``settle_and_claim`` leaves exactly the database (and returns exactly the records) that
    ``settle`` then ``claim_next`` leave inside one ``transaction()`` block of the SQLite store,
    including when either half fails (then nothing at all is written)."""

    @harness.settings()
    @given(state=states_strategy, filters=FILTERS, pick=st.integers(0, 20), settlement=SETTLEMENTS)
    def check(state: Any, filters: tuple[Any, str | None], pick: int, settlement: dict[str, Any]) -> None:
        jobs, occurrences = state
        index = pick % len(occurrences)
        target = occurrences[index]
        if settlement["held"]:  # make the target a live lease of "w-old" (the states' lease owner)
            target = replace(
                target, status="running", lease_expires_at=NOW + 1000, attempt=max(1, target.attempt)
            )
            occurrences = [*occurrences[:index], target, *occurrences[index + 1 :]]
        if settlement["spare"]:  # a plainly claimable occurrence, so the claim half often has work
            spare = replace(
                target, occurrence_id="occ_spare", status="queued", available_at=NOW - 1000, attempt=0
            )
            occurrences = [*occurrences, replace(spare, control=None, retry=None, job=0)]
        job_kind, workspace_id = filters
        settle_arguments = {
            "occurrence_id": target.occurrence_id,
            "owner_id": settlement["owner_id"],
            "fence": target.fence + settlement["fence_offset"],
            "outcome": settlement["outcome"],
            "retryable": settlement["retryable"],
            "retry_at": settlement["retry_at"],
        }
        claim_arguments = {"lease_ms": LEASE, "job_kind": job_kind, "workspace_id": workspace_id}

        def two_calls() -> Any:
            with harness.reference.transaction() as tx:
                settled = tx.settle(**settle_arguments)
                claimed = tx.claim_next(owner_id=settlement["owner_id"], **claim_arguments)
            return SettledAndClaimed(settled=settled, claimed=claimed)

        harness.build((jobs, occurrences))
        expected = harness.expected((outcome(two_calls), snapshot(harness.db)))
        for name, path in harness.claim_paths():
            harness.build((jobs, occurrences))
            with path():
                actual = harness.run(
                    lambda store: store.settle_and_claim(**settle_arguments, **claim_arguments)
                )
            note(
                "error" if isinstance(expected[0], tuple) else "claimed" if expected[0].claimed else "settled"
            )
            assert actual == expected, name

    check()


MOSTLY_LIVE = st.fixed_dictionaries(
    {
        "outcome": st.sampled_from(["succeeded", "failed"]),
        "retryable": st.booleans(),
        "retry_at": st.sampled_from([None, NOW - 5, NOW + 500]),
        "owner_id": st.sampled_from(["w-old"] * 7 + ["w-other"]),
        "fence_offset": st.sampled_from([0] * 7 + [1]),
        "held": st.sampled_from([True] * 7 + [False]),
        "repeat": st.sampled_from([False] * 7 + [True]),
    }
)
"""``SETTLEMENTS`` of a group: one of several failing fails the call, so each fails less often (and
an occurrence is settled twice only with ``repeat``)."""


def test_settle_many_and_claim_equals_settle_many_then_claim_batch(harness: ClaimHarness) -> None:
    """One ``settle_many_and_claim`` leaves exactly the database (and returns exactly the records,
    or the error with the same ``details``) that ``settle_many`` then ``claim_batch`` leave inside
    one ``transaction()`` block of the SQLite store: several settlements (live, stale and repeated
    leases) and 0..6 claims of another owner."""

    @harness.settings()
    @given(
        state=states_strategy,
        filters=FILTERS,
        picks=st.lists(st.tuples(st.integers(0, 20), MOSTLY_LIVE), max_size=4),
        limit=st.integers(0, 6),
        spare=st.booleans(),
    )
    def check(
        state: Any,
        filters: tuple[Any, str | None],
        picks: list[tuple[int, dict[str, Any]]],
        limit: int,
        spare: bool,
    ) -> None:
        jobs, occurrences = state
        settlements: list[dict[str, Any]] = []
        picked: set[int] = set()
        for pick, settlement in picks:
            index = pick % len(occurrences)
            if index in picked and not settlement["repeat"]:
                continue
            picked.add(index)
            target = occurrences[index]
            if settlement["held"]:
                target = replace(
                    target, status="running", lease_expires_at=NOW + 1000, attempt=max(1, target.attempt)
                )
                occurrences = [*occurrences[:index], target, *occurrences[index + 1 :]]
            settlements.append(
                {
                    "occurrence_id": target.occurrence_id,
                    "owner_id": settlement["owner_id"],
                    "fence": target.fence + settlement["fence_offset"],
                    "outcome": settlement["outcome"],
                    "retryable": settlement["retryable"],
                    "retry_at": settlement["retry_at"],
                }
            )
        if spare:  # a plainly claimable occurrence, so the claims often have work
            extra = replace(
                occurrences[0], occurrence_id="occ_spare", status="queued", available_at=NOW - 1000
            )
            occurrences = [*occurrences, replace(extra, attempt=0, control=None, retry=None, job=0)]
        job_kind, workspace_id = filters
        claims = {"owner_id": OWNER, "lease_ms": LEASE, "job_kind": job_kind, "workspace_id": workspace_id}

        def two_calls() -> Any:
            with harness.reference.transaction() as tx:
                settled = tx.settle_many(settlements)
                claimed = tx.claim_batch(**claims, limit=limit) if limit else []
            return SettledManyAndClaimed(settled=settled, claimed=claimed)

        harness.build((jobs, occurrences))
        expected = harness.expected((with_details(two_calls), snapshot(harness.db)))
        harness.build((jobs, occurrences))
        actual = with_details(lambda: harness.store.settle_many_and_claim(settlements, **claims, limit=limit))
        assert (actual, harness.tables()) == expected
        note("error" if isinstance(actual, tuple) else "claimed" if actual.claimed else "settled only")

    check()


def with_details(run: Callable[[], Any]) -> Any:
    """``outcome``, with an error's ``details`` (a failed settlement's index)."""
    try:
        return run()
    except SchedulerKernelError as error:
        return ("error", error.code, error.details)
